"""Property tests over every registered assignor: validity, balance, stickiness, the
cooperative rule and convergence of repeated rounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_group_operator import assignors
from kafka_group_operator.assignors import api, common, rounds
from tests.assignors import checks

NAMES = sorted(assignors.ASSIGNORS)
STICKY = ("sticky", "cooperative-sticky", "uniform")
EXAMPLES = settings(max_examples=100, deadline=None)


def usable(spec: api.GroupSpec, name: str) -> bool:
    """Uniform refuses topics without metadata; the others skip them."""
    return name != "uniform" or not common.missing_topics(spec.members, spec.partitions_per_topic)


@pytest.mark.parametrize("name", NAMES)
@EXAMPLES
@given(spec=checks.groups())
def test_one_round_is_valid(name: str, spec: api.GroupSpec) -> None:
    """Each partition once, to a subscriber; balanced at once unless cooperative, where a
    round may withhold what changes hands but never gives away what it revokes."""
    assignor = assignors.get(name)
    if not usable(spec, name):
        with pytest.raises(api.AssignorError, match=checks.GHOST):
            assignor.assign(spec)
        return
    assignment = assignor.assign(spec)
    cooperative = name == "cooperative-sticky"
    checks.check_valid(spec, assignment, complete=not cooperative)
    if cooperative:
        checks.check_cooperative(spec, assignment)
    elif name in STICKY:
        checks.check_balanced(spec, assignment)


@pytest.mark.parametrize("name", NAMES)
@EXAMPLES
@given(spec=checks.groups(ghost=False))
def test_rounds_settle_valid_stable_and_balanced(name: str, spec: api.GroupSpec) -> None:
    assignor = assignors.get(name)
    results = rounds.settle(assignor, spec, limit=3)
    final = results[-1]
    checks.check_valid(spec, final, complete=True)
    # The settled assignment is a fixed point: one more round changes nothing.
    previous = spec
    for result in results[:-1]:
        previous = rounds.next_spec(previous, result)
    assert assignor.assign(rounds.next_spec(previous, final)) == final
    if name in STICKY:
        checks.check_balanced(spec, final)
    elif name == "range":
        checks.check_spread_per_topic(spec, final)
    elif checks.equal_subscriptions(spec):
        counts = [len(partitions) for partitions in final.values()]
        assert max(counts) - min(counts) <= 1


@st.composite
def settled_then_changed(draw: st.DrawFn, name: str) -> tuple[api.GroupSpec, api.GroupSpec]:
    """A settled group, then the same group with members joining and leaving."""
    spec = draw(checks.groups(ghost=False, equal=True, owned=False, racks=False))
    settled = rounds.settle(assignors.get(name), spec)[-1]
    after = rounds.next_spec(spec, settled)
    members = dict(after.members)
    leaving = draw(st.sets(st.sampled_from(sorted(members)), max_size=len(members) - 1))
    for member in leaving:
        del members[member]
    topics = next(iter(members.values())).topics
    for number in range(draw(st.integers(0, 3))):
        members[f"new{number}"] = api.MemberSubscription(topics=topics)
    return spec, api.GroupSpec(members=members, partitions_per_topic=spec.partitions_per_topic)


@pytest.mark.parametrize("name", STICKY)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_equal_subscriptions_revoke_only_what_balance_needs(name: str, data: st.DataObject) -> None:
    _, spec = data.draw(settled_then_changed(name))
    assignment = assignors.get(name).assign(spec)
    total = sum(spec.partitions_per_topic[t] for t in next(iter(spec.members.values())).topics)
    low, extra = divmod(total, len(spec.members))
    # The fewest possible revocations: the ``extra`` largest holders keep low + 1.
    held = sorted((len(s.owned) for s in spec.members.values()), reverse=True)
    least = sum(max(0, n - low - (1 if rank < extra else 0)) for rank, n in enumerate(held))
    assert len(checks.revoked(spec, assignment)) == least


@pytest.mark.parametrize("name", ["range", "roundrobin", "sticky", "uniform"])
@settings(max_examples=60, deadline=None)
@given(spec=checks.groups(ghost=False, owned=False))
def test_static_members_are_placed_by_instance_id(name: str, spec: api.GroupSpec) -> None:
    """Renaming members keeps the result when static ones keep their instance ids."""
    assignor = assignors.get(name)
    before = assignor.assign(spec)
    renamed = {
        (f"x-{member}" if subscription.instance_id else member): member
        for member, subscription in spec.members.items()
    }
    members = {new: spec.members[old] for new, old in renamed.items()}
    after = assignor.assign(api.GroupSpec(members, spec.partitions_per_topic, spec.partition_racks))
    assert {renamed[new]: partitions for new, partitions in after.items()} == before


@st.composite
def settled_then_reshaped(draw: st.DrawFn, name: str) -> api.GroupSpec:
    """A settled group with any subscriptions, then members leave and others join."""
    spec = draw(checks.groups(ghost=False, owned=False, racks=False, max_members=8))
    settled = rounds.settle(assignors.get(name), spec)[-1]
    members = dict(rounds.next_spec(spec, settled).members)
    for member in draw(st.sets(st.sampled_from(sorted(members)), max_size=len(members) - 1)):
        del members[member]
    topics = sorted(spec.partitions_per_topic)
    for number in range(draw(st.integers(0, 2))):
        members[f"new{number}"] = api.MemberSubscription(
            frozenset(draw(st.sets(st.sampled_from(topics))))
        )
    return api.GroupSpec(members=members, partitions_per_topic=spec.partitions_per_topic)


@pytest.mark.parametrize("name", STICKY)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_no_partition_moves_where_moving_it_back_would_balance_better(
    name: str, data: st.DataObject
) -> None:
    """Whatever the subscriptions: a partition leaves its owner only for a member that ends
    with at most one more, so handing it back could not make the group more balanced."""
    spec = data.draw(settled_then_reshaped(name))
    final = rounds.settle(assignors.get(name), spec)[-1]
    holder = {partition: member for member, partitions in final.items() for partition in partitions}
    for member, subscription in spec.members.items():
        for partition in subscription.owned:
            taker = holder.get(partition)
            if taker is not None and taker != member:
                assert len(final[taker]) <= len(final[member]) + 1, (partition, member, taker)
