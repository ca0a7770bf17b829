"""Partition Leases against the API server: conditional writes, races, restarts, lost renewals.

The electors here run against the test API server (``tests/support/kube.ApiServer``), which
refuses a replace whose resourceVersion is stale with 409, as the real one does. Most tests
drive the electors round by round on a shared clock they control, so that expiry needs no
waiting; the test of a failed renewal runs them for real, in time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection

import pytest

from kafka_group_operator.kube import client, elector, errors, leases
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.kmock(cls=kube.ApiServer)]

NS = "kgo-system"
PREFIX = "kgo-partition"
LEASES = "coordination.k8s.io/v1/leases"


@pytest.fixture
async def api(kmock: kube.ApiServer) -> AsyncIterator[client.KubeClient]:
    kube_client = client.KubeClient(client.Credentials(server=str(kmock.url)))
    yield kube_client
    await kube_client.close()


# The failover benchmark's Lease timing: 3 s Lease, 2 s renew deadline, rounds every 0.75 s.
BENCH_TIMING = {
    "lease_duration_seconds": 3,
    "renew_deadline_seconds": 2.0,
    "retry_period_seconds": 0.75,
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Replica:
    """An elector and what its callbacks told it."""

    def __init__(
        self,
        api: client.KubeClient,
        identity: str,
        partitions: int,
        clock: Callable[[], float] = time.monotonic,
        members: Collection[str] = (),
        **timing: float,
    ) -> None:
        self.serving: set[int] = set()
        self.events: list[tuple[str, int, float]] = []
        self.clock = clock

        async def alive() -> Collection[str]:
            return members

        config = elector.ElectorConfig(
            namespace=NS,
            lease_prefix=PREFIX,
            partitions=partitions,
            identity=identity,
            **timing,  # type: ignore[arg-type]
        )
        self.elector = elector.LeaseElector(
            api, config, self._acquired, self._lost, members=alive, clock=clock
        )

    def _acquired(self, partition: int) -> None:
        assert partition not in self.serving
        self.serving.add(partition)
        self.events.append(("acquired", partition, self.clock()))

    def _lost(self, partition: int, why: str, voluntary: bool) -> None:
        self.serving.remove(partition)
        self.events.append(("lost", partition, self.clock()))


def _holders(kmock: kube.ApiServer, partitions: int) -> dict[int, str | None]:
    found = {}
    for p in range(partitions):
        raw = kmock.get(LEASES, NS, leases.lease_name(PREFIX, p))
        found[p] = None if raw is None else raw["spec"].get("holderIdentity")
    return found


async def test_replace_is_conditional_on_the_resource_version(api: client.KubeClient) -> None:
    created = await leases.create(api, NS, "one", "a", 15)
    assert created.holder == "a"
    assert created.transitions == 0
    assert await leases.read(api, NS, "one") == created
    with pytest.raises(errors.Conflict):
        await leases.create(api, NS, "one", "b", 15)
    renewed = await leases.renew(api, NS, created)
    assert int(renewed.resource_version) > int(created.resource_version)
    # A write from the version read before the renewal is refused: someone wrote since.
    with pytest.raises(errors.Conflict):
        await leases.take(api, NS, created, "b", 15)
    released = await leases.release(api, NS, renewed)
    assert released.free
    assert released.duration_seconds == 1
    taken = await leases.take(api, NS, released, "b", 15)
    assert (taken.holder, taken.transitions, taken.duration_seconds) == ("b", 1, 15)
    assert taken.acquire_time != created.acquire_time or taken.transitions == 1
    with pytest.raises(errors.NotFound):
        await leases.take(api, NS, leases.Lease("absent", None, 1, 0, "1"), "b", 15)
    assert await leases.read(api, NS, "absent") is None


async def test_two_replicas_racing_for_one_partition_exactly_one_wins(
    kmock: kube.ApiServer, api: client.KubeClient
) -> None:
    # Both read the same free Lease; both write from that version: exactly one succeeds.
    free = await leases.release(api, NS, await leases.create(api, NS, "race", "old", 15))
    outcomes = await asyncio.gather(
        leases.take(api, NS, free, "a", 15),
        leases.take(api, NS, free, "b", 15),
        return_exceptions=True,
    )
    won = [o for o in outcomes if isinstance(o, leases.Lease)]
    assert len(won) == 1
    assert sum(isinstance(o, errors.Conflict) for o in outcomes) == 1
    assert (await leases.read(api, NS, "race")) == won[0]

    # Two electors starting together, on one partition whose Lease does not exist yet.
    clock = Clock()
    a = Replica(api, "a", 1, clock, members={"a", "b"})
    b = Replica(api, "b", 1, clock, members={"a", "b"})
    for _ in range(3):
        await asyncio.gather(a.elector.step(), b.elector.step())
        clock.now += 1
    winners = [r for r in (a, b) if r.serving == {0}]
    assert len(winners) == 1
    (winner,) = winners
    loser = b if winner is a else a
    assert loser.events == []
    assert _holders(kmock, 1) == {0: "a" if winner is a else "b"}
    assert winner.elector.holds(0)
    assert not loser.elector.holds(0)


async def test_a_replica_restarted_with_the_same_name_takes_back_its_leases(
    kmock: kube.ApiServer, api: client.KubeClient
) -> None:
    clock = Clock()
    members = {"r0", "r1"}
    before = Replica(api, "r0", 4, clock, members=members)
    other = Replica(api, "r1", 4, clock, members=members)
    for _ in range(2):
        await before.elector.step()
        await other.elector.step()
        clock.now += 1
    assert before.serving == {0, 1}
    assert other.serving == {2, 3}
    versions = {p: kmock.get(LEASES, NS, leases.lease_name(PREFIX, p)) for p in (0, 1)}
    # r0 dies without releasing anything and comes back at once under the same name.
    after = Replica(api, "r0", 4, clock, members=members)
    await after.elector.step()
    assert after.serving == {0, 1}
    assert sorted(event[:2] for event in after.events) == [("acquired", 0), ("acquired", 1)]
    for p, old in versions.items():
        assert old is not None
        new = kmock.get(LEASES, NS, leases.lease_name(PREFIX, p))
        assert new is not None
        assert new["spec"]["holderIdentity"] == "r0"
        # Taken back through a conditional write, as its own: no transition counted.
        assert new["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"]
        assert new["spec"]["leaseTransitions"] == old["spec"]["leaseTransitions"]
    # The other replica never took r0's Leases meanwhile, and keeps its own.
    await other.elector.step()
    assert other.serving == {2, 3}
    assert [e[0] for e in other.events] == ["acquired"] * 2


async def test_a_failed_renewal_loses_the_partition_before_another_can_take_it(
    kmock: kube.ApiServer, api: client.KubeClient
) -> None:
    timing = {"lease_duration_seconds": 3, "renew_deadline_seconds": 2.0}
    timing["retry_period_seconds"] = 0.5
    a = Replica(api, "a", 1, members={"a"}, **timing)
    # b's membership signal no longer names a (it fails): only a's Lease says a is alive.
    b = Replica(api, "b", 1, members={"b"}, **timing)
    await a.elector.step()
    assert a.serving == {0}
    renewed_at = time.monotonic()
    await a.elector.step()  # a renewal that succeeds
    refusal = kmock.reject(LEASES, 500, "etcd is unavailable", action="update")
    b_task = asyncio.create_task(b.elector.run())
    try:
        await a.elector.step()  # the renewal fails: lost at once
        assert a.serving == set()
        assert not a.elector.holds(0)
        assert a.events[-1][:2] == ("lost", 0)
        lost_at = a.events[-1][2]
        kmock.rejections.remove(refusal)
        deadline = time.monotonic() + 30
        while b.serving != {0}:
            assert time.monotonic() < deadline, "b never took the expired lease"
            await asyncio.sleep(0.05)
    finally:
        b_task.cancel()
        await asyncio.gather(b_task, return_exceptions=True)
    acquired_at = next(at for kind, p, at in b.events if kind == "acquired" and p == 0)
    assert lost_at < acquired_at
    # b waited a whole lease duration from when it saw a's last renewal.
    assert acquired_at - renewed_at >= 3
    assert a.events == [("acquired", 0, a.events[0][2]), ("lost", 0, lost_at)]


async def test_a_partition_is_given_up_at_the_renew_deadline_without_a_renewal(
    api: client.KubeClient,
) -> None:
    clock = Clock()
    a = Replica(api, "a", 1, clock, members={"a"})
    await a.elector.step()
    assert a.elector.holds(0)
    assert a.elector.held == {0}
    # No round runs (the loop is stalled): past the renew deadline, it may not act any more,
    # long before the Lease's duration lets anyone else take it.
    clock.now += 10.0
    assert not a.elector.holds(0)
    assert a.elector.held == frozenset()
    task = asyncio.create_task(a.elector.run())
    try:
        deadline = time.monotonic() + 10
        while len(a.events) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert a.events[1][:2] == ("lost", 0)


async def test_replicas_share_the_partitions_and_rebalance_as_they_come_and_go(
    kmock: kube.ApiServer, api: client.KubeClient
) -> None:
    clock = Clock()
    members = {"r0", "r1", "r2"}
    replicas = {name: Replica(api, name, 5, clock, members=members) for name in sorted(members)}

    async def rounds(live: list[Replica], count: int = 4) -> None:
        for _ in range(count):
            await asyncio.gather(*(r.elector.step() for r in live))
            clock.now += 2.0

    await rounds(list(replicas.values()))
    holders = _holders(kmock, 5)
    assert sorted(len(r.serving) for r in replicas.values()) == [1, 2, 2]
    assert all(p in replicas[h].serving for p, h in holders.items() if h is not None)
    # r2 dies (no release); the others see its Leases expire and share its partitions.
    dead = replicas.pop("r2")
    members.discard("r2")
    await rounds(list(replicas.values()), count=12)
    assert sorted(len(r.serving) for r in replicas.values()) == [2, 3]
    assert {p for r in replicas.values() for p in r.serving} == set(range(5))
    assert set(_holders(kmock, 5).values()) == {"r0", "r1"}
    assert dead.serving  # it never heard: it was dead, and its leases went to the others
    # A newcomer: the others give up their extras, and it takes them.
    members.add("r3")
    replicas["r3"] = Replica(api, "r3", 5, clock, members=members)
    await rounds(list(replicas.values()))
    assert sorted(len(r.serving) for r in replicas.values()) == [1, 2, 2]
    assert {p for r in replicas.values() for p in r.serving} == set(range(5))


async def test_a_replica_shutting_down_releases_its_leases_for_others_at_once(
    kmock: kube.ApiServer, api: client.KubeClient
) -> None:
    a = Replica(api, "a", 2, members={"a"})
    task = asyncio.create_task(a.elector.run())
    deadline = time.monotonic() + 30
    while a.serving != {0, 1}:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert a.serving == set()
    assert _holders(kmock, 2) == {0: None, 1: None}
    # Released, not left to expire: another replica takes them in its first round.
    b = Replica(api, "b", 2, members={"b"})
    await b.elector.step()
    assert b.serving == {0, 1}


async def test_a_stop_that_comes_with_a_wake_up_still_ends_the_elector(
    kmock: kube.ApiServer, api: client.KubeClient
) -> None:
    """Cancelled in the same moment a wake-up ends its sleep, the elector ends, releasing.

    On Python 3.11, ``asyncio.wait_for`` hands back its awaitable's result when that result
    and a cancellation arrive together, and the task goes on as if never cancelled: a
    replica's stop, which cancels its elector and waits for it, then waited for ever."""
    a = Replica(api, "a", 1, members={"a"})
    asleep = asyncio.Event()
    sleep = a.elector._sleep

    async def sleep_noted(seconds: float) -> bool:
        asleep.set()
        return await sleep(seconds)

    a.elector._sleep = sleep_noted  # type: ignore[method-assign]
    task = asyncio.create_task(a.elector.run())
    await asleep.wait()
    assert a.serving == {0}
    # Both before the elector's task runs again: its wake-up done, and the cancellation.
    a.elector.wake()
    task.cancel()
    async with asyncio.timeout(30):
        await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert a.serving == set()
    assert _holders(kmock, 1) == {0: None}


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ({"lease_duration_seconds": 10, "renew_deadline_seconds": 10.0}, "greater than renew"),
        ({"renew_deadline_seconds": 2.0, "retry_period_seconds": 2.0}, "retry_period_seconds"),
    ],
)
def test_timing_is_checked_as_client_go_does(timing: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        elector.ElectorConfig(
            namespace=NS,
            lease_prefix=PREFIX,
            partitions=1,
            identity="a",
            **timing,  # type: ignore[arg-type]
        )


async def test_a_stalled_api_server_loses_the_partition_before_another_can_take_it(
    api: client.KubeClient,
) -> None:
    # A server that accepts connections and never answers: renewals neither succeed nor fail.
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    stalled = client.KubeClient(client.Credentials(server=f"http://127.0.0.1:{port}"))
    timing = {"lease_duration_seconds": 3, "renew_deadline_seconds": 1.5}
    timing["retry_period_seconds"] = 0.5
    a = Replica(api, "a", 1, members={"a"}, **timing)
    b = Replica(api, "b", 1, members={"b"}, **timing)
    tasks = [asyncio.create_task(a.elector.run())]
    try:
        deadline = time.monotonic() + 30
        while a.serving != {0}:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        a.elector.api = stalled  # a's API server stops answering; b's still works
        tasks.append(asyncio.create_task(b.elector.run()))
        while b.serving != {0}:
            assert time.monotonic() < deadline, "b never took the expired lease"
            await asyncio.sleep(0.02)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await stalled.close()
        server.close()
    assert [event[:2] for event in a.events] == [("acquired", 0), ("lost", 0)]
    assert a.elector.healthy is False
    assert a.events[1][2] < b.events[0][2]


async def test_the_next_round_comes_when_a_lease_may_change_hands(api: client.KubeClient) -> None:
    clock = Clock()
    timing = dict(BENCH_TIMING)
    dead = Replica(api, "dead", 2, clock, members={"dead"}, **timing)
    await dead.elector.step()
    assert dead.serving == {0, 1}
    # Every partition held: rounds at the retry period, unless a Lease expires sooner.
    assert dead.elector.until_change() == float("inf")
    expiries = [clock.now + 2.5]
    survivor = Replica(api, "b", 2, clock, members={"b", "dead"}, **timing)
    survivor.elector.member_expiries = lambda: expiries
    await survivor.elector.step()
    assert survivor.serving == set()  # both held by "dead", which counts as alive
    # "dead" never renews again. The survivor's next round comes when the first of its
    # Leases (partitions' or the replica's own, whichever first) expires by its view.
    assert survivor.elector.until_change() == pytest.approx(2.5 + elector.EXPIRY_MARGIN_S)
    expiries.clear()
    assert survivor.elector.until_change() == pytest.approx(3 + elector.EXPIRY_MARGIN_S)
    clock.now += 3 + elector.EXPIRY_MARGIN_S
    survivor.elector.members = None  # "dead" no longer counts as alive
    await survivor.elector.step()
    assert survivor.serving == {0, 1}
    # Settled again: back to the retry period.
    assert survivor.elector.until_change() == float("inf")


async def test_a_handed_over_partition_is_peeked_at_until_someone_takes_it(
    api: client.KubeClient,
) -> None:
    clock = Clock()
    timing = dict(BENCH_TIMING)
    dead = Replica(api, "dead", 2, clock, members={"dead", "ghost"}, **timing)
    await dead.elector.step()
    assert len(dead.serving) == 1
    # A free Lease (never taken) is left to whole rounds: nothing to peek at.
    assert dead.elector.peeking() == frozenset()
    dead.elector.members = None
    await dead.elector.step()
    assert dead.serving == {0, 1}
    a = Replica(api, "a", 2, clock, members={"a", "b"}, **timing)
    b = Replica(api, "b", 2, clock, members={"a", "b"}, **timing)
    await asyncio.gather(a.elector.step(), b.elector.step())
    assert a.elector.peeking() == frozenset()  # held by a live holder
    # "dead" stops renewing. Once its Leases expire, "a" takes its share (one) and peeks at
    # the other until someone takes it.
    clock.now += 3 + elector.EXPIRY_MARGIN_S
    await a.elector.step()
    (mine,) = a.serving
    other = 1 - mine
    assert a.elector.peeking() == {other}
    assert a.elector.holder(other) is None  # expired: nobody to name yet
    await a.elector.peek(a.elector.peeking())
    assert a.elector.peeking() == {other}  # unchanged
    await b.elector.step()
    assert b.serving == {other}
    await a.elector.peek(a.elector.peeking())
    assert a.elector.peeking() == frozenset()
    assert a.elector.holder(other) == "b"


async def test_peeks_stop_after_a_lease_duration(api: client.KubeClient) -> None:
    clock = Clock()
    timing = dict(BENCH_TIMING)
    dead = Replica(api, "dead", 2, clock, members={"dead"}, **timing)
    await dead.elector.step()
    # "a" counts a replica alive that never comes ("ghost"): the share of "dead" that falls to
    # "ghost" stays expired. "a" peeks at it for one Lease duration, no longer.
    a = Replica(api, "a", 2, clock, members={"a", "ghost"}, **timing)
    await a.elector.step()
    clock.now += 3 + elector.EXPIRY_MARGIN_S
    await a.elector.step()
    assert len(a.serving) == 1
    assert len(a.elector.peeking()) == 1
    for _ in range(3):  # rounds renew a's own Lease meanwhile
        clock.now += 1
        await a.elector.step()
    assert len(a.serving) == 1
    assert a.elector.peeking() == frozenset()


async def test_a_replica_releasing_its_own_lease_retries_past_a_renewal(
    kmock: kube.ApiServer, api: client.KubeClient
) -> None:
    """A stopping replica releases its own Lease even when a renewal of a round still in
    flight changed it since it was last seen (a release from the stale version would be a
    conflict, and the others would count the replica alive until the Lease expires)."""
    replicas = elector.ReplicaLeases(api, NS, PREFIX, "a", ["a", "b"], 15)
    assert "a" in await replicas.alive()  # creates and holds its own Lease
    name = replicas.lease_name(0)
    current = await leases.read(api, NS, name)
    assert current is not None
    await leases.renew(api, NS, current)  # the round's renewal, behind its back
    await replicas.release()
    released = await leases.read(api, NS, name)
    assert released is not None
    assert released.holder is None
    # Stopping, it neither renews nor counts itself alive any more.
    assert "a" not in await replicas.alive()
    assert (await leases.read(api, NS, name)) == released
