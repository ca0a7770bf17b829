"""The Lease elector: holds this replica's fair share of the state-topic partitions' Leases.

Every ``retry_period`` it reads each partition's Lease, renews those it holds, and acts on
``coordinator.lease_plan``: releases the extras and takes free or expired Leases up to its
share. It reports through two callbacks, ``on_acquired(partition)`` when it starts holding a
partition and ``on_lost(partition)`` when it stops; they must return at once (schedule the
load, flip a flag), as renewals wait for them.

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
from collections.abc import Awaitable, Callable, Collection, Sequence
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
    """Takes, renews and gives up partition Leases; see the module docstring."""

    api: kube_client.KubeClient
    config: ElectorConfig
    on_acquired: Callable[[int], None]
    on_lost: Callable[[int], None]
    # The replicas known to be alive besides Lease holders: without it a replica holding
    # nothing yet is invisible, and nobody makes room for it. It must name only replicas able
    # to take Leases (e.g. the StatefulSet's ready pods, with ``healthy`` in their readiness):
    # the partitions of a replica named but unable to take them stay free.
    members: Callable[[], Awaitable[Collection[str]]] | None = None
    # When the other replicas' own Leases expire by this replica's view (those not expired
    # yet): a round then sees the replica gone, and its partitions up for taking.
    member_expiries: Callable[[], Collection[float]] | None = None
    clock: Callable[[], float] = time.monotonic
    _held: dict[int, _Hold] = field(default_factory=dict, init=False)
    _seen: dict[int, _Seen] = field(default_factory=dict, init=False)
    _last_round: float | None = field(default=None, init=False)
    # The partitions whose holder's Lease expired by this replica's view and that nobody
    # took yet (read between rounds), and since when there have been some.
    _handing_over: frozenset[int] = field(default=frozenset(), init=False)
    _handing_over_since: float | None = field(default=None, init=False)

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
            while True:
                started = self.clock()
                try:
                    await self.step()
                except errors.KubeError as error:
                    log.warning("lease election round failed: %s", error)
                # Rounds start every retry period, a slow round shortening the wait rather
                # than adding to it (client-go waits a whole period after each): renewals go
                # out as a round starts, so on a slow API server or a busy event loop this
                # keeps them within the renew deadline. A tenth of a period at least, so
                # that an overloaded API server is not asked back to back.
                elapsed = self.clock() - started
                wait = max(period - elapsed, period / 10)
                pause = min(wait, max(self.until_change(), period / 10))
                # Until the next round, peeks at the partitions changing hands, if any.
                # Counted down by the sleeps (and the peeks' own time), so that a clock
                # that stands still cannot hold it here.
                quick = period / QUICK_ROUNDS
                while pause > 0:
                    peeking = self.peeking()
                    if not peeking or pause < 1.5 * quick:
                        await asyncio.sleep(pause)
                        break
                    await asyncio.sleep(quick)
                    peeked = self.clock()
                    await self.peek(peeking)
                    pause -= quick + max(self.clock() - peeked, 0.0)
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await asyncio.shield(self.release_all())

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
            self._drop(partition, "shutting down")
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
            reads = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        _nothing()
                        if partition in unread
                        else leases.read(self.api, self.config.namespace, name)
                        for partition, name in enumerate(names)
                    ),
                    return_exceptions=True,
                ),
                timeout=self.config.renew_deadline_seconds,
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
        views = [self._view(p, known[p]) for p in range(self.config.partitions)]
        now = self.clock()
        planned = lease_plan.plan(self.config.identity, views, alive, now, held=self._held.keys())
        for partition in planned.give_up:
            lease = self._held[partition].lease if partition in self._held else known[partition]
            self._drop(partition, "over its fair share")
            if lease is not None:
                await self._release(lease)
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
            renewed = await asyncio.wait_for(
                leases.renew(self.api, self.config.namespace, hold.lease),
                timeout=max(hold.valid_until - sent_at, 0.0),
            )
        except (errors.KubeError, TimeoutError) as error:
            if self._held.get(partition) is hold:
                self._drop(partition, f"renewal failed: {error or 'no answer in time'}")
            return
        if self._held.get(partition) is hold:  # not dropped meanwhile (deadline, lost)
            hold.lease = renewed
            hold.valid_until = sent_at + self.config.renew_deadline_seconds
            self._seen[partition] = _seen_now(renewed, sent_at)

    async def _take(self, partition: int, lease: leases.Lease | None) -> None:
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
            return  # another replica wrote it first: it won this one
        except errors.KubeError as error:
            log.warning("cannot take the lease of partition %d: %s", partition, error)
            return
        self._held[partition] = _Hold(taken, sent_at + self.config.renew_deadline_seconds)
        self._seen[partition] = _seen_now(taken, sent_at)
        log.info("holding partition %d", partition)
        self.on_acquired(partition)

    async def _release(self, lease: leases.Lease) -> None:
        try:
            await leases.release(self.api, self.config.namespace, lease)
        except errors.KubeError as error:
            # It expires on its own; meanwhile nobody takes it, and we no longer serve it.
            log.warning("cannot release lease %s: %s", lease.name, error)

    def _drop(self, partition: int, why: str) -> None:
        if self._held.pop(partition, None) is not None:
            log.warning("stopped coordinating partition %d: %s", partition, why)
            self.on_lost(partition)

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

    def __post_init__(self) -> None:
        if self.identity not in self.replicas:
            raise ValueError(f"{self.identity!r} is not among the replicas {list(self.replicas)}")

    def lease_name(self, index: int) -> str:
        return f"{self.prefix}-replica-{index}"

    def expiries(self) -> list[float]:
        """When each other replica counted alive stops counting, by this replica's clock,
        unless its Lease changes first (the elector's ``member_expiries``)."""
        me = self.replicas.index(self.identity)
        return [
            seen.at + seen.duration_seconds
            for index, seen in list(self._seen.items())
            if index != me and seen.holder == self.replicas[index]
        ]

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
        alive = {self.identity}
        for index, result in enumerate(reads):
            if isinstance(result, errors.KubeError):
                log.warning("cannot read lease %s: %s", self.lease_name(index), result)
                continue
            if isinstance(result, BaseException):
                raise result
            if index == me:
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
