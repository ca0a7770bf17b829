"""Why the coordinator computes a cooperative-sticky target with the eager sticky engine.

A target is reached by reconciliation, which revokes before it assigns, so the coordinator
runs ``sticky`` once where the client-side protocol runs ``cooperative-sticky`` until it
settles. These properties show the one call loses nothing: over random groups (unequal
subscriptions, racks, an owned target from the previous epoch) the eager target is valid
and as balanced, and with equal subscriptions and no racks it keeps at least as many owned
partitions as the settled cooperative rounds. With unequal subscriptions (a greedy
heuristic, like Kafka's ``GeneralAssignmentBuilder``) or racks (alignment ranks above
stickiness) the rounds can end up keeping one more claim than the one call: for example,
members on {c, a, b} owning c5-c9 and b0 with single-topic members on a, b and c; or a
claim on another rack that the cooperative round withholds and the next round hands back
to its holder because the aligned member is full by then.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from kafka_group_operator import assignors
from kafka_group_operator.assignors import api, rounds
from tests.coordinator.harness import GROUP, TOPIC, Harness

TOPICS = ("a", "b", "c")
RACKS = ("r0", "r1")


@st.composite
def groups(draw: st.DrawFn) -> api.GroupSpec:
    partitions_per_topic = {
        topic: draw(st.integers(1, 12)) for topic in TOPICS[: draw(st.integers(1, 3))]
    }
    names = sorted(partitions_per_topic)
    member_ids = [f"m{index}" for index in range(draw(st.integers(1, 7)))]
    subscriptions = {
        member_id: frozenset(draw(st.sets(st.sampled_from(names), min_size=1)))
        for member_id in member_ids
    }
    # The previous target: each partition with at most one of its subscribers.
    owned: dict[str, list[api.TopicPartition]] = {member_id: [] for member_id in member_ids}
    for topic, count in partitions_per_topic.items():
        subscribers = [m for m in member_ids if topic in subscriptions[m]]
        for partition in range(count):
            holder = draw(st.sampled_from([None, *subscribers]))
            if holder is not None:
                owned[holder].append((topic, partition))
    members = {
        member_id: api.MemberSubscription(
            topics=subscriptions[member_id],
            owned=tuple(owned[member_id]),
            generation=1,
            rack=draw(st.sampled_from((None, *RACKS))),
            instance_id=f"i-{member_id}" if draw(st.booleans()) else None,
        )
        for member_id in member_ids
    }
    racks = {
        topic: [frozenset({RACKS[p % 2]}) for p in range(count)]
        for topic, count in partitions_per_topic.items()
        if draw(st.booleans())
    }
    return api.GroupSpec(members, partitions_per_topic, racks)


def kept(spec: api.GroupSpec, assignment: api.GroupAssignment) -> int:
    return sum(
        len(set(member.owned) & set(assignment[member_id]))
        for member_id, member in spec.members.items()
    )


@settings(max_examples=150, deadline=None)
@given(spec=groups())
def test_the_eager_target_is_the_settled_cooperative_one_at_least(spec: api.GroupSpec) -> None:
    eager = assignors.ASSIGNORS["sticky"].assign(spec)
    settled = rounds.settle(assignors.ASSIGNORS["cooperative-sticky"], spec)[-1]

    # Valid: every partition exactly once, to a subscriber.
    given_out = [(member_id, tp) for member_id, tps in eager.items() for tp in tps]
    subscribed = set().union(*(member.topics for member in spec.members.values()))
    assert sorted(tp for _, tp in given_out) == sorted(
        (topic, p) for topic in subscribed for p in range(spec.partitions_per_topic[topic])
    )
    assert all(tp[0] in spec.members[member_id].topics for member_id, tp in given_out)
    # As balanced and at least as sticky as the cooperative protocol after it settles.
    loads = sorted(len(tps) for tps in eager.values())
    settled_loads = sorted(len(tps) for tps in settled.values())
    if len({member.topics for member in spec.members.values()}) == 1:
        assert loads[-1] - loads[0] <= 1
        assert loads == settled_loads
        if not spec.partition_racks:
            assert kept(spec, eager) >= kept(spec, settled)


class Consumers:
    """Members that heartbeat with what their last response gave them, until all settle."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.state: dict[str, tuple[int, dict[str, frozenset[int]]]] = {}

    def join(self, member_id: str) -> None:
        response = self.harness.heartbeat(member_id, 0, instance_id=f"g-{member_id}").response
        self.state[member_id] = (response.member_epoch, dict(response.assignment or {}))

    def settle(self) -> None:
        for _ in range(6):
            for member_id, (epoch, owned) in sorted(self.state.items()):
                response = self.harness.heartbeat(
                    member_id, epoch, owned=owned, instance_id=f"g-{member_id}"
                ).response
                if response.assignment is not None:
                    owned = dict(response.assignment)
                self.state[member_id] = (response.member_epoch, owned)
        assert self.harness.shard.describe_group(GROUP).state == "Stable"


def test_a_join_into_a_cooperative_sticky_group_moves_only_the_newcomers_share() -> None:
    harness = Harness()
    harness.topics({TOPIC: 12})
    harness.configure()  # cooperative-sticky
    consumers = Consumers(harness)
    for index in range(3):
        consumers.join(f"m{index}")
        consumers.settle()
    before = {member_id: owned[TOPIC] for member_id, (_, owned) in consumers.state.items()}
    assert sorted(len(owned) for owned in before.values()) == [4, 4, 4]

    log_before = len(harness.log)
    consumers.join("m3")
    description = harness.shard.describe_group(GROUP)
    target = {m.member_id: m.target_assignment.get(TOPIC, frozenset()) for m in description.members}
    # One target computation, complete at once: each member gives up exactly one partition
    # and the newcomer's target is those three (it receives them after their revocation).
    assert description.assignment_epoch == description.group_epoch
    for member_id, owned in before.items():
        assert target[member_id] < owned
        assert len(target[member_id]) == 3
    assert target["m3"] == frozenset(range(12)) - set().union(*(target[m] for m in before))
    assert consumers.state["m3"][1] == {}
    consumers.settle()
    assert {m: owned[TOPIC] for m, (_, owned) in consumers.state.items()} == target
    # No later rebalance: the join wrote the only target.
    epochs = [
        record.value
        for record in harness.log[log_before:]
        if type(record.key).__name__ == "ConsumerGroupTargetAssignmentMetadataKey"
    ]
    assert len(epochs) == 1
