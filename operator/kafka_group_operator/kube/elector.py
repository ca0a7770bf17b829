"""The Lease elector: holds this replica's fair share of the state-topic partitions' Leases.

Every ``retry_period`` it reads each partition's Lease, renews those it holds, and acts on
``coordinator.lease_plan``: releases the extras and takes free or expired Leases up to its
share. It reports through two callbacks, ``on_acquired(partition)`` when it starts holding a
partition and ``on_lost(partition, why, voluntary)`` when it stops; they must return at once
(schedule the load, flip a flag), as renewals wait for them.

Timing follows client-go's leaderelection (``tools/leaderelection/leaderelection.go``):

- Another replica judges a Lease expired ``lease_duration`` after *it saw* the record change,
  on its own clock (``observedTime``), never by the times written in the Lease.
- The holder gives a partition up ``renew_deadline`` after it *sent* its last successful
  renewal, and ``renew_deadline < lease_duration`` (client-go refuses
  ``leaseDuration must be greater than renewDeadline``). So the holder has stopped before
  anyone may take the Lease over, with ``lease_duration - renew_deadline`` to spare for a
  slow event loop. ``holds(partition)`` checks that deadline itself, so a caller that asks
  before acknowledging never acknowledges past it, whatever the loop's latency.
- Unlike client-go, which retries a failed renewal until the deadline, a renewal that fails
  loses the partition at once (and a Lease seen held by another is lost at once): a
  coordinator that may have lost its partition acknowledges nothing.

Rounds start every ``retry_period``, and sooner when a Lease may change hands: at the moment
another replica's Lease (a partition's, or a replica's own from ``member_expiries``) expires
by this replica's view, so a dead holder's partitions are taken as soon as they may be.
Between rounds, while a partition whose holder's Lease expired has not been taken yet (by
this replica's view), the elector reads just those Leases every fifth of a period
(``peek``), so that it learns within a fraction of a round who took them over: its
``holder`` names the new coordinator in ``NOT_COORDINATOR`` answers. Peeks stop after one
Lease duration (a partition nobody takes is not read five times a round for ever), and free
Leases (a first start, a release) are not peeked at: whole rounds take those, and a
Kubernetes API server is not asked more than a few reads a second per replica.

A watch on the namespace's Leases (``watch``, run beside the rounds) makes changes known
as they happen rather than at the next round, and keeps ``holder`` current, so that
``NOT_COORDINATOR`` hints name a new holder within milliseconds. A Lease released (a replica
stopping, or giving up a partition over its share), a replica's own Lease changing (one
joining or leaving) and an expiry are acted on at once from the watch's view
(``quick_round``: the plan's releases and takes, no reads, no renewals). The whole rounds go
on every retry period, reading every Lease and renewing, and a replica whose watch is
refused (RBAC) or broken elects as before, by rounds and peeks.

A replica that stops hands its partitions over (``hand_over``): it stops taking, releases its
own replica Lease (so that the others count it gone and their shares grow at once, instead of
when that Lease would expire), gives every partition up and releases its Lease, and waits
until another replica holds each (or none is left alive to): the others, woken by their
watches, take them and load, while this one still answers ``NOT_COORDINATOR`` naming them.
It does so on every stop, including a restart in place: the restart takes seconds (a process
start, the brokers' connections), two sub-second handovers (away, and back when it returns
and the others give up what is over their share) leave no group unserved that long.

Giving a partition up by choice (a handover, a share that shrank, a stop) is logged at INFO
and reported to ``on_lost`` as voluntary; losing one (a renewal that failed, a deadline
missed, a Lease written by another) at WARNING.

``held``, ``holds`` and ``holder`` may be called from another thread than the elector's (the
runtime's event loop, while the elector runs on a thread of its own): they only read the
maps, whose entries the elector replaces whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from kafka_group_operator.coordinator import lease_plan
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors, leases

log = logging.getLogger(__name__)

# client-go's leaderelection.JitterFactor: the renew deadline must exceed 1.2 retry periods.
JITTER_FACTOR = 1.2
# While a dead holder's partition waits for its next holder, it is read this many times
# per retry period.
QUICK_ROUNDS = 5
# A round meant to see a Lease expired starts this long after the expiry (the clock's grain).
EXPIRY_MARGIN_S = 0.01
# A watch asks the server to end it after this long (then it resumes from where it was).
WATCH_TIMEOUT_S = 300
# After a watch failed, the next try waits this long, doubling up to the maximum.
WATCH_BACKOFF_S = 1.0
WATCH_BACKOFF_MAX_S = 60.0
# While handing over, how often the Leases given up are read when no watch reports them.
HANDOVER_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class ElectorConfig:
    """Which Leases, who we are, and the timing (client-go's defaults: 15 s, 10 s, 2 s)."""

    namespace: str
    lease_prefix: str
    partitions: int
    identity: str
    lease_duration_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    def __post_init__(self) -> None:
        # The same checks as client-go's NewLeaderElector:
        #   if lec.LeaseDuration <= lec.RenewDeadline {
        #       return nil, fmt.Errorf("leaseDuration must be greater than renewDeadline") }
        #   if lec.RenewDeadline <= time.Duration(JitterFactor*float64(lec.RetryPeriod)) {
        #       return nil,
        #           fmt.Errorf("renewDeadline must be greater than retryPeriod*JitterFactor") }
        if not self.identity:
            raise ValueError("the elector needs an identity (the replica's name)")
        if self.partitions < 1:
            raise ValueError("partitions must be at least 1")
        if self.lease_duration_seconds <= self.renew_deadline_seconds:
            raise ValueError("lease_duration_seconds must be greater than renew_deadline_seconds")
        if self.renew_deadline_seconds <= JITTER_FACTOR * self.retry_period_seconds:
            raise ValueError(
                f"renew_deadline_seconds must be greater than retry_period_seconds*{JITTER_FACTOR}"
            )
        if self.retry_period_seconds <= 0:
            raise ValueError("retry_period_seconds must be positive")


@dataclass(slots=True)
class _Hold:
    lease: leases.Lease
    valid_until: float


@dataclass(slots=True)
class _Seen:
    resource_version: str
    at: float
    holder: str | None = None
    duration_seconds: int = 0


@dataclass
class LeaseElector:
    """Takes, renews and gives up partition Leases; see the module docstring.

    ``on_lost(partition, why, voluntary)``: ``voluntary`` when the partition was given up by
    choice, not lost.
    """

    api: kube_client.KubeClient
    config: ElectorConfig
    on_acquired: Callable[[int], None]
    on_lost: Callable[[int, str, bool], None]
    # The replicas known to be alive besides Lease holders: without it a replica holding
    # nothing yet is invisible, and nobody makes room for it. It must name only replicas able
    # to take Leases (e.g. the StatefulSet's ready pods, with ``healthy`` in their readiness):
    # the partitions of a replica named but unable to take them stay free.
    members: Callable[[], Awaitable[Collection[str]]] | None = None
    # When the other replicas' own Leases expire by this replica's view (those not expired
    # yet): a round then sees the replica gone, and its partitions up for taking.
    member_expiries: Callable[[], Collection[float]] | None = None
    # Another Lease of the namespace seen changing by the watch (a replica's own): whether
    # the replicas alive may have changed, so that a round should run now.
    on_other_lease: Callable[[str, leases.Lease | None, float], bool] | None = None
    # The replicas alive as last seen, without asking the API server (for ``quick_round``).
    members_seen: Callable[[], Collection[str]] | None = None
    # Whether a partition held may be given up over the share now: not while it is being
    # taken (a writer's fencing still in flight would fence the next holder's, and the
    # partition would bounce); it is given up a round later.
    settled: Callable[[int], bool] | None = None
    clock: Callable[[], float] = time.monotonic
    _held: dict[int, _Hold] = field(default_factory=dict, init=False)
    # Partitions last let go by choice (``given_up``); a Lease taken again clears it.
    _given_up: set[int] = field(default_factory=set, init=False)
    _seen: dict[int, _Seen] = field(default_factory=dict, init=False)
    # Each partition's Lease as last read or reported by the watch (not those held).
    _latest: dict[int, leases.Lease | None] = field(default_factory=dict, init=False)
    _last_round: float | None = field(default=None, init=False)
    # The partitions whose holder's Lease expired by this replica's view and that nobody
    # took yet (read between rounds), and since when there have been some.
    _handing_over: frozenset[int] = field(default=frozenset(), init=False)
    _handing_over_since: float | None = field(default=None, init=False)
    # Set (on the elector's loop) to start the next round now.
    _wake: asyncio.Event | None = field(default=None, init=False)
    # Whether the watch is following the Leases now.
    _watching: bool = field(default=False, init=False)
    # Stopping: takes nothing more (``hand_over``).
    _leaving: bool = field(default=False, init=False)

    @property
    def held(self) -> frozenset[int]:
        """The partitions this replica may coordinate right now."""
        now = self.clock()
        # A copy first: another thread may be asking while the elector changes the map.
        return frozenset(p for p, hold in list(self._held.items()) if now < hold.valid_until)

    def holds(self, partition: int) -> bool:
        """Whether this replica may still act as ``partition``'s coordinator (check before acks)."""
        hold = self._held.get(partition)
        return hold is not None and self.clock() < hold.valid_until

    def given_up(self, partition: int) -> bool:
        """Whether this replica last let ``partition`` go by choice (a handover, a
        rebalance, a shutdown) rather than losing its Lease."""
        return partition in self._given_up

    def holder(self, partition: int) -> str | None:
        """Who coordinates ``partition`` as far as this replica knows: itself while it holds
        the Lease, else the holder last read, unless that Lease has expired by this replica's
        clock (then nobody: it is up for taking)."""
        if self.holds(partition):
            return self.config.identity
        seen = self._seen.get(partition)
        if seen is None or seen.holder is None or seen.holder == self.config.identity:
            return None
        if self.clock() >= seen.at + seen.duration_seconds:
            return None
        return seen.holder

    @property
    def healthy(self) -> bool:
        """Whether a whole round (every Lease read, renewals sent) ended within the deadline."""
        return (
            self._last_round is not None
            and self.clock() - self._last_round < self.config.renew_deadline_seconds
        )

    async def run(self) -> None:
        """Elect until cancelled; then give every partition up (``on_lost`` first) and release."""
        watchdog = asyncio.create_task(self._watch_deadlines())
        try:
            period = self.config.retry_period_seconds
            due = self.clock()  # when the next whole round is due
            woken = False
            while True:
                started = self.clock()
                try:
                    if woken and self._watching:
                        # A change the watch reported: acted on from its view, at once,
                        # before a whole round (on a slow API server its reads take long).
                        await self.quick_round()
                        started = self.clock()
                    if started >= due or not (woken and self._watching):
                        await self.step()
                        # Rounds start every retry period, a slow round shortening the wait
                        # rather than adding to it (client-go waits a whole period after
                        # each): renewals go out as a round starts, so on a slow API server
                        # or a busy event loop this keeps them within the renew deadline. A
                        # tenth of a period at least, so that an overloaded API server is
                        # not asked back to back.
                        elapsed = self.clock() - started
                        due = self.clock() + max(period - elapsed, period / 10)
                except errors.KubeError as error:
                    log.warning("lease election round failed: %s", error)
                    due = max(due, self.clock() + period / 10)
                to_due = due - self.clock()
                to_change = max(self.until_change(), period / 10)
                pause = min(to_due, to_change)
                # Until the next round, peeks at the partitions changing hands, if any.
                # Counted down by the sleeps (and the peeks' own time), so that a clock
                # that stands still cannot hold it here. A wake cuts it short, and a round
                # for an expiry is acted on as a wake is (from the watch's view, if any).
                quick = period / QUICK_ROUNDS
                woken = False
                while pause > 0:
                    peeking = self.peeking()
                    if not peeking or pause < 1.5 * quick:
                        woken = await self._sleep(pause)
                        break
                    if await self._sleep(quick):
                        woken = True
                        break
                    peeked = self.clock()
                    await self.peek(peeking)
                    pause -= quick + max(self.clock() - peeked, 0.0)
                if not woken:
                    if to_change < to_due:
                        woken = True  # a Lease expired by now: act on it
                    else:
                        due = min(due, self.clock())  # a whole round now
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await asyncio.shield(self.release_all())

    async def quick_round(self) -> None:
        """A round from the Leases as last seen (the watch keeps them current): no reads, no
        renewals (the whole rounds send those), only the plan's releases and takes. Nothing
        when some Lease was never seen."""
        known: dict[int, leases.Lease | None] = {}
        for partition in range(self.config.partitions):
            hold = self._held.get(partition)
            if hold is not None:
                known[partition] = hold.lease
            elif partition in self._latest:
                known[partition] = self._latest[partition]
            else:
                return
        if self.members_seen is not None:
            alive = set(self.members_seen())
        else:
            alive = set(await self.members()) if self.members is not None else set()
        await self._act(known, alive, frozenset())

    def wake(self) -> None:
        """Start the next round now (call on the elector's loop)."""
        if self._wake is not None:
            self._wake.set()

    async def _sleep(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less when woken; whether woken."""
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._wake.is_set():
            self._wake.clear()
            return True
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            return False
        self._wake.clear()
        return True

    @property
    def watching(self) -> bool:
        """Whether the watch follows the Leases now."""
        return self._watching

    async def watch(self) -> None:
        """Follow the namespace's Leases until cancelled (see the module docstring): list,
        then watch from the list's version, and again after a failure (backing off)."""
        backoff = WATCH_BACKOFF_S
        refused = False
        while True:
            try:
                items, version = await self.api.list_versioned(
                    kube_client.LEASES, self.config.namespace
                )
                now = self.clock()
                for raw in items:
                    self._saw(leases.from_object(raw), now)
                self._watching, backoff, refused = True, WATCH_BACKOFF_S, False
                while True:
                    async for kind, raw in self.api.watch(
                        kube_client.LEASES, self.config.namespace, version, WATCH_TIMEOUT_S
                    ):
                        version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
                        if kind in ("ADDED", "MODIFIED"):
                            self._saw(leases.from_object(raw), self.clock())
                        elif kind == "DELETED":
                            name = str((raw.get("metadata") or {}).get("name") or "")
                            self._saw(leases.Lease(name, None, 0, 0, ""), self.clock())
            except errors.Expired:
                continue  # too old: list again
            except errors.Forbidden as error:
                if not refused:
                    log.info("not watching the leases (rounds alone notice changes): %s", error)
                refused = True
            except errors.KubeError as error:
                log.info("the lease watch ended (resumed in %.0fs): %s", backoff, error)
            finally:
                self._watching = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, WATCH_BACKOFF_MAX_S)

    def _partition_of(self, name: str) -> int:
        """The partition whose Lease is ``name``; -1 for any other Lease."""
        prefix = f"{self.config.lease_prefix}-"
        suffix = name[len(prefix) :] if name.startswith(prefix) else ""
        if suffix.isdigit() and int(suffix) < self.config.partitions and str(int(suffix)) == suffix:
            return int(suffix)
        return -1

    def _saw(self, lease: leases.Lease, at: float) -> None:
        """A Lease as the watch reports it (a free one with no version: deleted)."""
        partition = self._partition_of(lease.name)
        if partition < 0:
            if self.on_other_lease is not None and self.on_other_lease(lease.name, lease, at):
                self.wake()
            return
        me = self.config.identity
        if partition in self._held:
            # Ours: our renewals' answers say more (an event may predate our taking it).
            return
        before = self._seen.get(partition)
        self._observe(partition, None if not lease.resource_version else lease, at)
        if lease.holder is None and (before is None or before.holder is not None):
            self.wake()  # freed: to be taken
        elif lease.holder not in (None, me):
            self._handing_over = self._handing_over - {partition}

    def stop_taking(self) -> None:
        """Take no partition from now on (the first step of ``hand_over``)."""
        self._leaving = True

    async def hand_over(self, within_s: float) -> None:
        """Give every partition up for the others to take, and wait until they hold them
        (at most ``within_s``, and not at all once no other replica is alive): see the module
        docstring. Takes nothing afterwards."""
        self.stop_taking()
        holds = dict(self._held)
        for partition in sorted(holds):
            self._drop(partition, "handed over: this replica is stopping", voluntary=True)
        ordered = sorted(holds)
        released = await asyncio.gather(*(self._release(holds[p].lease) for p in ordered))
        now = self.clock()
        for partition, lease in zip(ordered, released, strict=True):
            if lease is not None:
                self._observe(partition, lease, now)
        if not holds:
            return
        deadline = now + within_s
        waiting = set(holds)
        while self.clock() < deadline:
            waiting = {p for p in waiting if self.holder(p) is None}
            if not waiting or (self.members is not None and not await self._others_alive()):
                break
            if not self._watching:
                await self.peek(waiting)
            await asyncio.sleep(HANDOVER_POLL_S)
        taken = len(holds) - len({p for p in waiting if self.holder(p) is None})
        log.info(
            "handed %d of %d partitions over in %.2fs",
            taken,
            len(holds),
            self.clock() - now,
        )

    async def _others_alive(self) -> bool:
        assert self.members is not None
        try:
            alive = await self.members()
        except errors.KubeError:
            return True
        return bool(set(alive) - {self.config.identity})

    def until_change(self) -> float:
        """How long until a round may find a Lease changing hands: until another replica's
        Lease (a partition's or, from ``member_expiries``, a replica's own) expires by this
        replica's view; infinite when none will."""
        now = self.clock()
        me = self.config.identity
        expiries = [
            seen.at + seen.duration_seconds
            for partition, seen in list(self._seen.items())
            if partition not in self._held and seen.holder not in (None, me)
        ]
        if self.member_expiries is not None:
            expiries.extend(self.member_expiries())
        upcoming = [at - now for at in expiries if at > now]
        return min(upcoming, default=math.inf) + EXPIRY_MARGIN_S

    def peeking(self) -> frozenset[int]:
        """The partitions to read between rounds: handed over by an expired holder and not
        taken yet, for at most one Lease duration."""
        since = self._handing_over_since
        if since is None or self.clock() - since >= self.config.lease_duration_seconds:
            return frozenset()
        return self._handing_over

    async def peek(self, partitions: Collection[int]) -> None:
        """Read ``partitions``' Leases (nothing else): who holds them now, for ``holder``."""
        ordered = sorted(partitions)
        reads = await asyncio.gather(
            *(
                leases.read(
                    self.api,
                    self.config.namespace,
                    leases.lease_name(self.config.lease_prefix, partition),
                )
                for partition in ordered
            ),
            return_exceptions=True,
        )
        read_at = self.clock()
        taken = set()
        for partition, result in zip(ordered, reads, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, errors.KubeError):
                    raise result
                continue
            if partition in self._held:
                continue  # ours since: our own renewals say more than this read
            self._observe(partition, result, read_at)
            seen = self._seen[partition]
            if seen.holder is not None and seen.resource_version and seen.at == read_at:
                taken.add(partition)  # changed since the round: someone took it over
        self._handing_over = self._handing_over - taken

    async def release_all(self) -> None:
        """Stop coordinating every partition, then release their Leases for others to take."""
        holds = dict(self._held)
        for partition in sorted(holds):
            self._drop(partition, "shutting down", voluntary=True)
        await asyncio.gather(*(self._release(hold.lease) for hold in holds.values()))

    async def step(self) -> None:
        """One round: renew ours while reading every other Lease, then release extras and
        take free ones."""
        names = [
            leases.lease_name(self.config.lease_prefix, p) for p in range(self.config.partitions)
        ]
        started = self.clock()
        before = set(self._held)
        # Ours are not read: each renewal is a write conditional on the version we hold, so
        # it fails (and the partition is lost) if anyone else wrote it, and its answer is
        # the Lease as it is now. One request fewer per partition held, each round.
        unread = frozenset(before)
        # Renewals go out with the reads, not after them: on a slow API server the reads
        # would otherwise push every renewal towards the deadline.
        renewals = asyncio.gather(*(self._renew(p) for p in sorted(self._held)))
        try:
            # Bounded: a stalled API server must not hold the round past the deadline.
            async with asyncio.timeout(self.config.renew_deadline_seconds):
                reads = await asyncio.gather(
                    *(
                        _nothing()
                        if partition in unread
                        else leases.read(self.api, self.config.namespace, name)
                        for partition, name in enumerate(names)
                    ),
                    return_exceptions=True,
                )
        except TimeoutError as error:
            await renewals
            message = "reading the leases took longer than the renew deadline"
            raise errors.Unreachable(message) from error
        except BaseException:
            renewals.cancel()
            raise
        read_at = self.clock()
        await renewals
        me = self.config.identity
        known: dict[int, leases.Lease | None] = {}
        for partition, result in enumerate(reads):
            if partition in unread:
                hold = self._held.get(partition)
                if hold is not None:  # renewed (else lost: the next round reads it)
                    known[partition] = hold.lease
                continue
            if isinstance(result, errors.KubeError):
                log.warning("cannot read lease %s: %s", names[partition], result)
                continue
            if isinstance(result, BaseException):
                raise result
            known[partition] = result
            # A renewal's own answer is newer than a read showing our own holding.
            if partition not in self._held or result is None or result.holder != me:
                self._observe(partition, result, read_at)
        for partition, lease in known.items():
            if partition in self._held and (lease is None or lease.holder != self.config.identity):
                self._drop(partition, "its lease is held by another replica")
        # Not taken back in the round that lost them: the next round reads them afresh.
        lost = before - self._held.keys()
        if len(known) < self.config.partitions:
            return  # plan only on a whole view: a missing Lease is not a free one
        self._last_round = started
        alive = set(await self.members()) if self.members is not None else set()
        await self._act(known, alive, lost)

    async def _act(
        self, known: Mapping[int, leases.Lease | None], alive: set[str], lost: Collection[int]
    ) -> None:
        """Plan on ``known`` (every partition's Lease) and ``alive``: give up and release
        the extras, take the free ones (but those lost this round)."""
        if self._leaving:
            return  # handing over: nothing to take, nothing left to give up
        views = [self._view(p, known[p]) for p in range(self.config.partitions)]
        now = self.clock()
        planned = lease_plan.plan(self.config.identity, views, alive, now, held=self._held.keys())
        given_up = []
        for partition in planned.give_up:
            if self.settled is not None and partition in self._held and not self.settled(partition):
                continue
            lease = self._held[partition].lease if partition in self._held else known[partition]
            self._drop(partition, "over its fair share: another replica takes it", voluntary=True)
            if lease is not None:
                given_up.append(lease)
        released = await asyncio.gather(*(self._release(lease) for lease in given_up))
        at = self.clock()
        for lease in released:
            if lease is not None:
                self._observe(self._partition_of(lease.name), lease, at)
        await asyncio.gather(*(self._take(p, known[p]) for p in planned.take if p not in lost))
        # Handed over: a holder's Lease expired and this replica did not take it; another
        # replica is about to, and peeks say who before the next round would.
        handing_over = frozenset(
            view.partition
            for view in views
            if view.holder is not None
            and lease_plan.live_holder(view, now) is None
            and view.partition not in self._held
        )
        if not handing_over:
            self._handing_over_since = None
        elif self._handing_over_since is None:
            self._handing_over_since = now
        self._handing_over = handing_over

    def _observe(self, partition: int, lease: leases.Lease | None, at: float) -> None:
        self._latest[partition] = lease
        version = "" if lease is None else lease.resource_version
        seen = self._seen.get(partition)
        if seen is None or seen.resource_version != version:
            self._seen[partition] = _seen_now(lease, at)

    def _view(self, partition: int, lease: leases.Lease | None) -> lease_plan.LeaseView:
        if lease is None or lease.holder is None:
            return lease_plan.LeaseView(partition, None, -math.inf)
        hold = self._held.get(partition)
        if hold is not None:
            return lease_plan.LeaseView(partition, lease.holder, hold.valid_until)
        seen = self._seen[partition]
        return lease_plan.LeaseView(partition, lease.holder, seen.at + lease.duration_seconds)

    async def _renew(self, partition: int) -> None:
        hold = self._held.get(partition)
        if hold is None:
            return
        sent_at = self.clock()
        try:
            async with asyncio.timeout(max(hold.valid_until - sent_at, 0.0)):
                renewed = await leases.renew(self.api, self.config.namespace, hold.lease)
        except (errors.KubeError, TimeoutError) as error:
            if self._held.get(partition) is hold:
                self._drop(partition, f"renewal failed: {str(error) or 'no answer in time'}")
            return
        if self._held.get(partition) is hold:  # not dropped meanwhile (deadline, lost)
            hold.lease = renewed
            hold.valid_until = sent_at + self.config.renew_deadline_seconds
            self._seen[partition] = _seen_now(renewed, sent_at)

    async def _take(self, partition: int, lease: leases.Lease | None) -> None:
        if self._leaving:
            return
        sent_at = self.clock()
        try:
            if lease is None:
                taken = await leases.create(
                    self.api,
                    self.config.namespace,
                    leases.lease_name(self.config.lease_prefix, partition),
                    self.config.identity,
                    self.config.lease_duration_seconds,
                )
            else:
                taken = await leases.take(
                    self.api,
                    self.config.namespace,
                    lease,
                    self.config.identity,
                    self.config.lease_duration_seconds,
                )
        except errors.Conflict:
            # Another replica wrote it first and won this one. Its Lease as it is now, for the
            # next plan (a quick round would otherwise act on the stale version again); a
            # round at once only if it is free again.
            try:
                current = await leases.read(
                    self.api,
                    self.config.namespace,
                    leases.lease_name(self.config.lease_prefix, partition),
                )
            except errors.KubeError:
                return
            if partition not in self._held:
                self._observe(partition, current, self.clock())
                if current is None or current.holder is None:
                    self.wake()
            return
        except errors.KubeError as error:
            log.warning("cannot take the lease of partition %d: %s", partition, error)
            return
        self._held[partition] = _Hold(taken, sent_at + self.config.renew_deadline_seconds)
        self._given_up.discard(partition)
        self._seen[partition] = _seen_now(taken, sent_at)
        log.info("holding partition %d", partition)
        self.on_acquired(partition)

    async def _release(self, lease: leases.Lease) -> leases.Lease | None:
        """Release ``lease``; the Lease as released, None when that failed.

        A renewal may still have been in flight when the partition was given up: its write
        makes ``lease``'s version stale, and the release a conflict. Then the Lease is read
        again and released if it still names this replica (a few times at most)."""
        for _ in range(3):
            try:
                return await leases.release(self.api, self.config.namespace, lease)
            except errors.Conflict:
                try:
                    current = await leases.read(self.api, self.config.namespace, lease.name)
                except errors.KubeError:
                    break
                if current is None or current.holder != self.config.identity:
                    return None  # someone else's now (or gone): nothing of ours to release
                lease = current
            except errors.KubeError as error:
                # It expires on its own; meanwhile nobody takes it, and we no longer serve it.
                log.warning("cannot release lease %s: %s", lease.name, error)
                return None
        log.warning("cannot release lease %s: it keeps changing (it expires)", lease.name)
        return None

    def _drop(self, partition: int, why: str, voluntary: bool = False) -> None:
        if self._held.pop(partition, None) is not None:
            if voluntary:
                self._given_up.add(partition)
                log.info("gave partition %d up: %s", partition, why)
            else:
                log.warning("lost partition %d: %s", partition, why)
            self.on_lost(partition, why, voluntary)

    async def _watch_deadlines(self) -> None:
        """Give up a partition when its renew deadline passes without a successful renewal."""
        while True:
            now = self.clock()
            for partition, hold in list(self._held.items()):
                if hold.valid_until <= now:
                    self._drop(partition, "no renewal within the renew deadline")
            upcoming = [hold.valid_until for hold in self._held.values()]
            delay = min(upcoming) - now if upcoming else self.config.retry_period_seconds
            await asyncio.sleep(min(max(delay, 0.0), self.config.retry_period_seconds))


async def _nothing() -> None:
    return None


def _seen_now(lease: leases.Lease | None, at: float) -> _Seen:
    if lease is None:
        return _Seen("", at)
    return _Seen(lease.resource_version, at, lease.holder, lease.duration_seconds)


@dataclass
class ReplicaLeases:
    """Which replicas are alive, from one Lease per replica that each keeps renewing.

    The elector needs to know the replicas that hold no partition yet (``members``). Each
    replica of a known list (the StatefulSet's pod names, or the standalone processes' URLs)
    keeps its own Lease, ``<prefix>-replica-<index>``, written every round; another replica
    counts it alive until ``duration_seconds`` after it *saw* that Lease change, on its own
    clock, as partition Leases are judged. So a killed replica drops out of everyone's view
    about when its partition Leases expire, and the survivors' shares grow to take them.
    """

    api: kube_client.KubeClient
    namespace: str
    prefix: str
    identity: str
    replicas: Sequence[str]
    duration_seconds: int
    clock: Callable[[], float] = time.monotonic
    _seen: dict[int, _Seen] = field(default_factory=dict, init=False)
    _own: leases.Lease | None = field(default=None, init=False)
    # Stopping: this replica's Lease is released and no longer renewed.
    _leaving: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.identity not in self.replicas:
            raise ValueError(f"{self.identity!r} is not among the replicas {list(self.replicas)}")

    def lease_name(self, index: int) -> str:
        return f"{self.prefix}-replica-{index}"

    async def release(self) -> None:
        """Stop renewing this replica's Lease and release it: the others count this replica
        gone at once (a stop, ``LeaseElector.hand_over``), not when the Lease expires."""
        self._leaving = True
        name = self.lease_name(self.replicas.index(self.identity))
        own = self._own
        # A renewal of a round still in flight may have changed it meanwhile: then it is
        # read again and released (a few times at most).
        for _ in range(3):
            try:
                if own is None or own.holder != self.identity:
                    own = await leases.read(self.api, self.namespace, name)
                if own is None or own.holder != self.identity:
                    return
                self._own = await leases.release(self.api, self.namespace, own)
                return
            except errors.Conflict:
                own = None
            except errors.KubeError as error:
                log.warning("cannot release this replica's lease (it expires): %s", error)
                return
        log.warning("cannot release this replica's lease (it keeps changing; it expires)")

    def saw(self, name: str, lease: leases.Lease | None, at: float) -> bool:
        """Another replica's Lease as the watch reports it (the elector's
        ``on_other_lease``); whether the replicas alive may have changed."""
        names = [self.lease_name(index) for index in range(len(self.replicas))]
        if name not in names:
            return False
        index = names.index(name)
        if self.replicas[index] == self.identity or lease is None:
            return False
        seen = self._seen.get(index)
        version = lease.resource_version
        if seen is not None and seen.resource_version == version:
            return False
        self._seen[index] = _Seen(version, at, lease.holder, lease.duration_seconds)
        # A renewal changes nothing of who is alive; a new holder or a release does.
        return seen is None or seen.holder != lease.holder

    def expiries(self) -> list[float]:
        """When each other replica counted alive stops counting, by this replica's clock,
        unless its Lease changes first (the elector's ``member_expiries``)."""
        me = self.replicas.index(self.identity)
        return [
            seen.at + seen.duration_seconds
            for index, seen in list(self._seen.items())
            if index != me and seen.holder == self.replicas[index]
        ]

    def alive_seen(self) -> Collection[str]:
        """The replicas alive by the Leases as last seen (read, or reported by the watch),
        without asking the API server (the elector's ``members_seen``)."""
        now = self.clock()
        alive = set() if self._leaving else {self.identity}
        for index, seen in list(self._seen.items()):
            name = self.replicas[index]
            if seen.holder == name and now < seen.at + seen.duration_seconds:
                alive.add(name)
        return alive

    async def alive(self) -> Collection[str]:
        """Renew this replica's Lease, read the others'; the replicas alive by this view."""
        me = self.replicas.index(self.identity)
        reads = await asyncio.gather(
            *(
                leases.read(self.api, self.namespace, self.lease_name(i))
                for i in range(len(self.replicas))
            ),
            return_exceptions=True,
        )
        now = self.clock()
        alive = set() if self._leaving else {self.identity}
        for index, result in enumerate(reads):
            if isinstance(result, errors.KubeError):
                log.warning("cannot read lease %s: %s", self.lease_name(index), result)
                continue
            if isinstance(result, BaseException):
                raise result
            if index == me:
                if not self._leaving:
                    await self._keep(result)
                continue
            seen = self._seen.get(index)
            version = "" if result is None else result.resource_version
            if seen is None or seen.resource_version != version:
                # First sight counts as a change, as for partition Leases: a replica whose
                # Lease is left from before counts as alive for one more duration.
                self._seen[index] = seen = _Seen(
                    version,
                    now,
                    None if result is None else result.holder,
                    0 if result is None else result.duration_seconds,
                )
            if seen.holder == self.replicas[index] and now < seen.at + seen.duration_seconds:
                alive.add(self.replicas[index])
        return alive

    async def _keep(self, lease: leases.Lease | None) -> None:
        try:
            if lease is None:
                self._own = await leases.create(
                    self.api,
                    self.namespace,
                    self.lease_name(self.replicas.index(self.identity)),
                    self.identity,
                    self.duration_seconds,
                )
            elif lease.holder != self.identity:
                self._own = await leases.take(
                    self.api, self.namespace, lease, self.identity, self.duration_seconds
                )
            else:
                self._own = await leases.renew(self.api, self.namespace, lease)
        except errors.KubeError as error:
            log.warning("cannot renew this replica's lease: %s", error)
