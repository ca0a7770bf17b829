"""The fair-share Lease plan: replicas that each run it on their own view converge.

The property test plays a small world of Leases with compare-and-swap writes (a write names
the version it read, and fails when the Lease changed since, as the API server's
resourceVersion precondition does): replicas plan on a snapshot taken at the start of a round
and write in a random order, so they race for the same Leases. Replicas die (their Leases
expire) and join; once membership stops changing, every partition must end up held by exactly
one live replica, with shares differing by at most one, and at no point may a replica plan to
take a Lease that another live holder still held in what it read.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from kafka_group_operator.coordinator import lease_plan
from kafka_group_operator.coordinator.lease_plan import LeaseView

DURATION = 3.0  # Lease duration, in rounds of one time unit each


def _views(holders: dict[int, str | None], expiry: dict[int, float]) -> list[LeaseView]:
    return [LeaseView(p, holders[p], expiry[p]) for p in sorted(holders)]


def test_targets_sum_to_the_partitions_and_differ_by_at_most_one() -> None:
    assert lease_plan.targets(4, {"a", "b", "c"}) == {"a": 2, "b": 1, "c": 1}
    assert lease_plan.targets(6, {"c", "a", "b"}) == {"a": 2, "b": 2, "c": 2}
    assert lease_plan.targets(2, {"a", "b", "c"}) == {"a": 1, "b": 1, "c": 0}
    assert lease_plan.targets(5, set()) == {}


def test_a_lone_replica_takes_every_free_lease() -> None:
    views = [LeaseView(p, None, 0.0) for p in range(4)]
    assert lease_plan.plan("a", views, {"a"}, now=10.0) == lease_plan.Plan(
        take=(0, 1, 2, 3), give_up=(), target=4
    )


def test_a_live_holders_lease_is_never_taken_and_an_expired_one_is() -> None:
    views = [LeaseView(0, "b", 20.0), LeaseView(1, "c", 5.0), LeaseView(2, None, 0.0)]
    planned = lease_plan.plan("a", views, {"a"}, now=10.0)
    # b holds 0 until 20; c's lease expired at 5, so c counts as gone: a and b share 3.
    assert 0 not in planned.take
    assert planned.take == (1, 2)
    assert planned.target == 2


def test_a_newcomer_makes_the_others_give_up_their_extras() -> None:
    views = [LeaseView(p, "a", 100.0) for p in range(4)]
    assert lease_plan.plan("a", views, {"a", "b"}, now=0.0, held=range(4)).give_up == (2, 3)
    assert lease_plan.plan("b", views, {"a", "b"}, now=0.0).take == ()


def test_a_restarted_replica_takes_back_its_own_unexpired_leases() -> None:
    views = [LeaseView(0, "a", 100.0), LeaseView(1, "a", 100.0), LeaseView(2, "b", 100.0)]
    planned = lease_plan.plan("a", views, {"a", "b"}, now=0.0, held=())
    assert planned.take == (0, 1)
    assert planned.give_up == ()


def test_a_replica_keeps_what_it_serves_over_what_it_has_forgotten() -> None:
    views = [LeaseView(0, "a", 100.0), LeaseView(1, "a", 100.0), LeaseView(2, "b", 100.0)]
    planned = lease_plan.plan("a", views, {"a", "b", "c"}, now=0.0, held=[1])
    assert planned == lease_plan.Plan(take=(), give_up=(0,), target=1)


@dataclass
class World:
    """Leases with versions, and the replicas that write them."""

    holders: dict[int, str | None]
    expiry: dict[int, float]
    versions: dict[int, int]
    served: dict[str, set[int]]

    def write(self, partition: int, version: int, holder: str | None, expires: float) -> bool:
        if self.versions[partition] != version:
            return False  # 409: the Lease changed since it was read
        self.versions[partition] += 1
        self.holders[partition] = holder
        self.expiry[partition] = expires
        return True


def _round(world: World, live: list[str], order: list[str], now: float) -> None:
    snapshot = (dict(world.holders), dict(world.expiry), dict(world.versions))
    views = _views(snapshot[0], snapshot[1])
    for me in order:
        if me not in live:
            continue
        served = world.served.setdefault(me, set())
        # Renew what it serves; a failed renewal loses the partition at once.
        for partition in sorted(served):
            if world.holders[partition] != me or not world.write(
                partition, world.versions[partition], me, now + DURATION
            ):
                served.discard(partition)
        planned = lease_plan.plan(me, views, live, now, held=served)
        for partition in planned.take:
            holder = lease_plan.live_holder(views[partition], now)
            assert holder in (None, me), f"{me} planned to take {partition} held by {holder}"
            if world.write(partition, snapshot[2][partition], me, now + DURATION):
                served.add(partition)
        for partition in planned.give_up:
            served.discard(partition)
            world.write(partition, world.versions[partition], None, 0.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_replicas_converge_to_one_live_holder_per_partition_and_fair_shares(
    data: st.DataObject,
) -> None:
    partitions = data.draw(st.integers(1, 24), label="partitions")
    names = [f"r{i}" for i in range(6)]
    initial = data.draw(st.sets(st.sampled_from(names), min_size=1), label="initial")
    # Leases left over from replicas of an earlier life, some still unexpired.
    holders = {
        p: data.draw(st.none() | st.sampled_from(names), label=f"holder{p}")
        for p in range(partitions)
    }
    expiry = {p: data.draw(st.floats(0, DURATION), label=f"expiry{p}") for p in range(partitions)}
    world = World(holders, expiry, dict.fromkeys(range(partitions), 0), {})
    live = sorted(initial)
    changes = data.draw(
        st.lists(st.tuples(st.booleans(), st.sampled_from(names)), max_size=4), label="changes"
    )
    now = 0.0
    for join, name in [(True, ""), *changes]:
        if name:
            if join and name not in live:
                live = sorted({*live, name})
            elif not join and name in live and len(live) > 1:
                live = [n for n in live if n != name]
                world.served.pop(name, None)  # it dies: it renews nothing any more
        for _ in range(data.draw(st.integers(0, 3), label="rounds between changes")):
            now += 1.0
            _round(world, live, data.draw(st.permutations(live), label="order"), now)
    # Membership is stable now: the replicas converge within a bounded number of rounds.
    for _ in range(int(DURATION) + 2 * len(names) + 4):
        now += 1.0
        _round(world, live, data.draw(st.permutations(live), label="order"), now)
    held = {p: lease_plan.live_holder(view, now) for p, view in enumerate(_views(holders, expiry))}
    assert all(held[p] in live for p in range(partitions)), held
    for name in live:
        mine = {p for p in range(partitions) if held[p] == name}
        assert world.served.get(name, set()) == mine, (name, world.served, held)
    shares = [sum(1 for p in held if held[p] == name) for name in live]
    assert sum(shares) == partitions
    assert max(shares) - min(shares) <= 1, shares


def test_replicas_short_at_once_are_dealt_different_leases() -> None:
    """A replica stopped and released its two Leases: the two others, one short each, are
    dealt one each (the same deal on both), instead of racing for the same one."""
    views = [
        LeaseView(0, None, 0.0),
        LeaseView(1, None, 0.0),
        LeaseView(2, "a", 100.0),
        LeaseView(3, "a", 100.0),
        LeaseView(4, "c", 100.0),
        LeaseView(5, "c", 100.0),
    ]
    a = lease_plan.plan("a", views, {"a", "c"}, now=0.0, held=[2, 3])
    c = lease_plan.plan("c", views, {"a", "c"}, now=0.0, held=[4, 5])
    assert (a.take, c.take) == ((0,), (1,))
    # A Lease that expired goes back to its last holder when that one is alive and short.
    views[1] = LeaseView(1, "c", 0.0)
    a = lease_plan.plan("a", views, {"a", "c"}, now=10.0, held=[2, 3])
    c = lease_plan.plan("c", views, {"a", "c"}, now=10.0, held=[4, 5])
    assert (a.take, c.take) == ((0,), (1,))
    views[0] = LeaseView(0, "c", 0.0)
    views[1] = LeaseView(1, None, 0.0)
    a = lease_plan.plan("a", views, {"a", "c"}, now=10.0, held=[2, 3])
    c = lease_plan.plan("c", views, {"a", "c"}, now=10.0, held=[4, 5])
    assert (a.take, c.take) == ((1,), (0,))
