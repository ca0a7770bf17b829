"""Invariant checks and hypothesis strategies shared by the assignor tests.

Each check raises ``AssertionError`` with the offending partition or members, so that a
hypothesis failure reads as the rule it breaks.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st

from kafka_group_operator.assignors import api

TOPICS = ("t0", "t1", "t2", "t3")
RACKS = ("a", "b", "c")
# A topic members may subscribe to that has no metadata.
GHOST = "ghost"


def assignable(spec: api.GroupSpec, member: str) -> set[api.TopicPartition]:
    counts = spec.partitions_per_topic
    return {
        (topic, partition)
        for topic in spec.members[member].topics
        for partition in range(counts.get(topic, 0))
    }


def check_valid(spec: api.GroupSpec, assignment: api.GroupAssignment, complete: bool) -> None:
    """Only subscribers get partitions, each at most once; all of them when ``complete``."""
    assert set(assignment) == set(spec.members)
    seen: Counter[api.TopicPartition] = Counter()
    for member, partitions in assignment.items():
        assert partitions == sorted(partitions), f"{member}'s list is not sorted"
        extra = set(partitions) - assignable(spec, member)
        assert not extra, f"{member} got partitions it cannot take: {sorted(extra)}"
        seen.update(partitions)
    twice = [partition for partition, times in seen.items() if times > 1]
    assert not twice, f"assigned more than once: {twice}"
    if complete:
        wanted = set().union(*(assignable(spec, member) for member in spec.members))
        missing = wanted - set(seen)
        assert not missing, f"unassigned: {sorted(missing)}"


def check_balanced(spec: api.GroupSpec, assignment: api.GroupAssignment) -> None:
    """The javadoc rule: a member with 2+ fewer than another can take none of its partitions."""
    for big, big_partitions in assignment.items():
        for small, small_partitions in assignment.items():
            if len(big_partitions) >= len(small_partitions) + 2:
                takeable = set(big_partitions) & assignable(spec, small)
                assert not takeable, (
                    f"{small} ({len(small_partitions)}) could take {sorted(takeable)} "
                    f"from {big} ({len(big_partitions)})"
                )


def check_spread_per_topic(spec: api.GroupSpec, assignment: api.GroupAssignment) -> None:
    """Range's guarantee: per topic, its subscribers' counts differ by at most one."""
    for topic, count in spec.partitions_per_topic.items():
        subscribers = [m for m, s in spec.members.items() if topic in s.topics]
        if not subscribers or count == 0:
            continue
        held = [sum(1 for t, _ in assignment[m] if t == topic) for m in subscribers]
        assert max(held) - min(held) <= 1, f"{topic}: {dict(zip(subscribers, held, strict=True))}"


def revoked(spec: api.GroupSpec, assignment: api.GroupAssignment) -> set[api.TopicPartition]:
    lost: set[api.TopicPartition] = set()
    for member, subscription in spec.members.items():
        lost |= set(subscription.owned) - set(assignment[member])
    return lost


def check_cooperative(spec: api.GroupSpec, assignment: api.GroupAssignment) -> None:
    """Kafka's ``validateCooperativeAssignment``: nothing revoked is also added this round."""
    added: set[api.TopicPartition] = set()
    for member, subscription in spec.members.items():
        added |= set(assignment[member]) - set(subscription.owned)
    both = added & revoked(spec, assignment)
    assert not both, f"revoked and given away in the same round: {sorted(both)}"


def equal_subscriptions(spec: api.GroupSpec) -> bool:
    counts = spec.partitions_per_topic
    usable = {
        frozenset(t for t in member.topics if counts.get(t, 0) > 0)
        for member in spec.members.values()
    }
    return len(usable) <= 1


@st.composite
def groups(
    draw: st.DrawFn,
    *,
    equal: bool | None = None,
    owned: bool = True,
    racks: bool = True,
    ghost: bool = True,
    max_members: int = 6,
) -> api.GroupSpec:
    """A small group: up to four topics, some members static, claims that may conflict."""
    counts = {topic: draw(st.integers(0, 7)) for topic in TOPICS[: draw(st.integers(1, 4))]}
    topic_names = sorted(counts) + ([GHOST] if ghost else [])
    partition_racks: dict[str, list[frozenset[str]]] = {}
    if racks and draw(st.booleans()):
        for topic, count in counts.items():
            partition_racks[topic] = [
                frozenset(draw(st.sets(st.sampled_from(RACKS), min_size=1, max_size=2)))
                for _ in range(count)
            ]
    everything = [(t, p) for t, c in counts.items() for p in range(c)] + [(GHOST, 0), ("t0", 99)]
    member_ids = draw(
        st.lists(
            st.text("mnopq", min_size=1, max_size=3), min_size=1, max_size=max_members, unique=True
        )
    )
    instance_ids = draw(st.permutations([f"i{n}" for n in range(len(member_ids))]))
    same = draw(st.booleans()) if equal is None else equal
    shared = frozenset(draw(st.sets(st.sampled_from(topic_names), min_size=1)))
    members = {}
    for member, instance in zip(member_ids, instance_ids, strict=True):
        topics = shared if same else frozenset(draw(st.sets(st.sampled_from(topic_names))))
        claims = tuple(draw(st.lists(st.sampled_from(everything), max_size=8))) if owned else ()
        members[member] = api.MemberSubscription(
            topics=topics,
            owned=claims,
            generation=draw(st.none() | st.integers(-1, 3)),
            rack=draw(st.none() | st.sampled_from(RACKS)) if racks else None,
            instance_id=instance if draw(st.booleans()) else None,
        )
    return api.GroupSpec(
        members=members, partitions_per_topic=counts, partition_racks=partition_racks
    )
