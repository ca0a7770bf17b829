"""Kafka's own sticky-assignor tests, ported with their assertions.

Source: apache/kafka ``clients/src/test/java/org/apache/kafka/clients/consumer/internals/
AbstractStickyAssignorTest.java`` (run by both ``StickyAssignorTest`` and
``CooperativeStickyAssignorTest``), for every ``RackConfig``: ``initializeRacks`` gives each
partition three replicas over three broker racks (so every partition is on racks a, b and
c) unless NO_BROKER_RACK, and consumer ``i`` the rack ``"abc"[i % 3]`` unless
NO_CONSUMER_RACK.

``CooperativeStickyAssignorTest`` overrides ``verifyValidityAndBalance`` to run further
rounds (owned = the last assignment) until nothing is revoked, and replaces the assignment
with the settled one, so the assertions after it check the settled assignment; here
``rounds.settle`` plays that part. Kafka's ``partitionsTransferringOwnership`` (a partition
given to a member other than the one that owned it) is computed from the owned and assigned
partitions; the cooperative assignor withholds exactly those in its first round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from kafka_group_operator import assignors
from kafka_group_operator.assignors import api, rounds
from tests.assignors.checks import check_balanced, check_valid

RACK_CONFIGS = ["NO_BROKER_RACK", "NO_CONSUMER_RACK", "BROKER_AND_CONSUMER_RACK"]
STICKY = ["sticky", "cooperative-sticky"]
GENERATION = 1  # AbstractStickyAssignorTest.generationId


def tp(topic: str, partition: int) -> api.TopicPartition:
    return (topic, partition)


class Group:
    """The test's ``subscriptions`` map and ``partitionsPerTopic`` for one rack config."""

    def __init__(self, rack_config: str, partitions: Mapping[str, int]) -> None:
        self.broker_racks = rack_config != "NO_BROKER_RACK"
        self.consumer_racks = rack_config != "NO_CONSUMER_RACK"
        self.partitions = dict(partitions)
        self.members: dict[str, api.MemberSubscription] = {}

    def subscribe(
        self,
        member: str,
        index: int,
        topics: Sequence[str],
        owned: Sequence[api.TopicPartition] = (),
        generation: int | None = None,
    ) -> None:
        """``subscription(topics, index)`` or ``buildSubscriptionV2Above(...)``."""
        rack = "abc"[index % 3] if self.consumer_racks else None
        self.members[member] = api.MemberSubscription(
            frozenset(topics), tuple(owned), generation, rack
        )

    def spec(self) -> api.GroupSpec:
        racks = (
            {topic: [frozenset("abc")] * count for topic, count in self.partitions.items()}
            if self.broker_racks
            else {}
        )
        return api.GroupSpec(self.members, self.partitions, racks)


def transferring(spec: api.GroupSpec, target: api.GroupAssignment) -> dict[api.TopicPartition, str]:
    """Kafka's ``partitionsTransferringOwnership``: a partition assigned to a member other
    than its previous owner (the claimant of the highest generation, a missing generation
    counting as -1), or one that several members claim at that generation."""
    best: dict[api.TopicPartition, tuple[int, set[str]]] = {}
    for member, sub in spec.members.items():
        generation = -1 if sub.generation is None else sub.generation
        for claim in sub.owned:
            top, owners = best.get(claim, (generation, set()))
            if generation > top:
                top, owners = generation, set()
            if generation == top:
                owners.add(member)
            best[claim] = (top, owners)
    return {
        claim: member
        for member, partitions in target.items()
        for claim in partitions
        if claim in best and best[claim][1] != {member}
    }


def assign(name: str, group: Group) -> tuple[api.GroupAssignment, dict[api.TopicPartition, str]]:
    """One ``assignPartitions`` call, then ``verifyValidityAndBalance``: the settled
    assignment and the partitions the first round transfers."""
    spec = group.spec()
    results = rounds.settle(assignors.get(name), spec)
    settled = results[-1]
    moves = transferring(spec, settled)
    if name == "cooperative-sticky":
        # The first round hands out everything but the transferring partitions.
        assert results[0] == {
            member: [claim for claim in partitions if claim not in moves]
            for member, partitions in settled.items()
        }
    else:
        assert len(results) <= 2  # eager: the target at once, confirmed by the next round
    check_valid(spec, settled, complete=True)
    check_balanced(spec, settled)
    return settled, moves


def per_topic(assignment: api.GroupAssignment, topic: str) -> dict[str, int]:
    return {
        member: sum(1 for claim in partitions if claim[0] == topic)
        for member, partitions in assignment.items()
    }


def fully_balanced(assignment: api.GroupAssignment) -> bool:
    sizes = [len(partitions) for partitions in assignment.values()]
    return max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("rack_config", RACK_CONFIGS)
@pytest.mark.parametrize("name", STICKY)
def test_topic_balance_after_reassignment(name: str, rack_config: str) -> None:
    """``testTopicBalanceAfterReassignment``: two topics of 12, consumers 1 -> 2 -> 4 -> 2;
    every consumer always holds an equal share of each topic."""
    topics = ["topic1", "topic2"]
    group = Group(rack_config, {"topic1": 12, "topic2": 12})
    group.subscribe("consumer1", 0, topics)
    assignment, moves = assign(name, group)
    for topic in topics:
        assert set(per_topic(assignment, topic).values()) == {12}
    assert moves == {}
    assert fully_balanced(assignment)

    # Add another consumer
    group.subscribe("consumer1", 0, topics, assignment["consumer1"], GENERATION)
    group.subscribe("consumer2", 1, topics, [], GENERATION)
    assignment, _ = assign(name, group)
    for topic in topics:
        assert set(per_topic(assignment, topic).values()) == {6}
    assert fully_balanced(assignment)

    # Add two more consumers
    group.subscribe("consumer1", 0, topics, assignment["consumer1"], GENERATION)
    group.subscribe("consumer2", 1, topics, assignment["consumer2"], GENERATION)
    group.subscribe("consumer3", 2, topics, [], GENERATION)
    group.subscribe("consumer4", 3, topics, [], GENERATION)
    assignment, _ = assign(name, group)
    for topic in topics:
        assert set(per_topic(assignment, topic).values()) == {3}
    assert fully_balanced(assignment)

    # remove 2 consumers
    del group.members["consumer1"], group.members["consumer2"]
    group.subscribe("consumer3", 2, topics, assignment["consumer3"], GENERATION)
    group.subscribe("consumer4", 3, topics, assignment["consumer4"], GENERATION)
    assignment, moves = assign(name, group)
    for topic in topics:
        assert set(per_topic(assignment, topic).values()) == {6}
    assert moves == {}
    assert fully_balanced(assignment)


@pytest.mark.parametrize("rack_config", RACK_CONFIGS)
@pytest.mark.parametrize("name", STICKY)
def test_add_remove_two_consumers_two_topics(name: str, rack_config: str) -> None:
    """``testAddRemoveTwoConsumersTwoTopics``: topic1 (3) and topic2 (4), consumers
    2 -> 4 -> 2, with Kafka's exact assignments and transfers."""
    topics = ["topic1", "topic2"]
    group = Group(rack_config, {"topic1": 3, "topic2": 4})
    group.subscribe("consumer1", 0, topics)
    group.subscribe("consumer2", 1, topics)
    assignment, moves = assign(name, group)
    assert assignment["consumer1"] == sorted(
        [tp("topic1", 0), tp("topic1", 2), tp("topic2", 1), tp("topic2", 3)]
    )
    assert assignment["consumer2"] == sorted([tp("topic1", 1), tp("topic2", 0), tp("topic2", 2)])
    assert moves == {}
    assert fully_balanced(assignment)

    # add 2 consumers
    group.subscribe("consumer1", 0, topics, assignment["consumer1"], GENERATION)
    group.subscribe("consumer2", 1, topics, assignment["consumer2"], GENERATION)
    group.subscribe("consumer3", 2, topics, [], GENERATION)
    group.subscribe("consumer4", 3, topics, [], GENERATION)
    assignment, moves = assign(name, group)
    assert moves == {
        tp("topic1", 2): "consumer3",
        tp("topic2", 3): "consumer3",
        tp("topic2", 2): "consumer4",
    }
    assert assignment["consumer1"] == sorted([tp("topic1", 0), tp("topic2", 1)])
    assert assignment["consumer2"] == sorted([tp("topic2", 0), tp("topic1", 1)])
    assert assignment["consumer3"] == sorted([tp("topic1", 2), tp("topic2", 3)])
    assert assignment["consumer4"] == sorted([tp("topic2", 2)])
    assert fully_balanced(assignment)

    # remove 2 consumers
    del group.members["consumer1"], group.members["consumer2"]
    group.subscribe("consumer3", 2, topics, assignment["consumer3"], GENERATION)
    group.subscribe("consumer4", 3, topics, assignment["consumer4"], GENERATION)
    assignment, moves = assign(name, group)
    assert assignment["consumer3"] == sorted(
        [tp("topic1", 2), tp("topic2", 3), tp("topic1", 0), tp("topic2", 1)]
    )
    assert assignment["consumer4"] == sorted([tp("topic2", 2), tp("topic1", 1), tp("topic2", 0)])
    assert moves == {}
    assert fully_balanced(assignment)


Claim = tuple[str, int, Sequence[str], Sequence[api.TopicPartition], int | None]


def group_of(rack_config: str, partitions: Mapping[str, int], members: Sequence[Claim]) -> Group:
    group = Group(rack_config, partitions)
    for member, index, topics, owned, generation in members:
        group.subscribe(member, index, topics, owned, generation)
    return group


T, T1, T2, T3 = "topic", "topic1", "topic2", "topic3"
C1, C2, C3, C4 = "consumer1", "consumer2", "consumer3", "consumer4"
G = GENERATION

# (Kafka test, partitions per topic, members (id, rack index, topics, owned, generation),
#  the assignment Kafka asserts (as sets; members it does not assert are left out), and
#  its partitionsTransferringOwnership).
KAFKA_CASES = [
    (
        "testTwoConsumersTwoTopicsSixPartitions",
        {T1: 3, T2: 3},
        [(C1, 0, [T1, T2], [], None), (C2, 1, [T1, T2], [], None)],
        {C1: {(T1, 0), (T1, 2), (T2, 1)}, C2: {(T1, 1), (T2, 0), (T2, 2)}},
        {},
    ),
    (
        "testConsumerOwningMinQuotaExpectedMaxQuota",
        {T1: 2, T2: 3},
        [(C1, 0, [T1, T2], [(T1, 0), (T2, 1)], G), (C2, 1, [T1, T2], [(T1, 1), (T2, 2)], G)],
        {C1: {(T1, 0), (T2, 1), (T2, 0)}, C2: {(T1, 1), (T2, 2)}},
        {},
    ),
    (
        "testAllConsumersAreUnderMinQuota",
        {T1: 2, T2: 3},
        [
            (C1, 0, [T1, T2], [(T1, 0)], G),
            (C2, 1, [T1, T2], [(T1, 1)], G),
            (C3, 2, [T1, T2], [], G),
        ],
        {C1: {(T1, 0), (T2, 1)}, C2: {(T1, 1), (T2, 2)}, C3: {(T2, 0)}},
        {},
    ),
    (
        "testAddRemoveConsumerOneTopic (second step)",
        {T: 3},
        [(C1, 0, [T], [(T, 0), (T, 1), (T, 2)], G), (C2, 1, [T], [], G)],
        {C1: {(T, 0), (T, 1)}, C2: {(T, 2)}},
        {(T, 2): C2},
    ),
    (
        "testAllConsumersReachExpectedQuotaAndAreConsideredFilled",
        {T: 4},
        [(C1, 0, [T], [(T, 0), (T, 1)], G), (C2, 1, [T], [(T, 2)], G), (C3, 2, [T], [], G)],
        {C1: {(T, 0), (T, 1)}, C2: {(T, 2)}, C3: {(T, 3)}},
        {},
    ),
    (
        "testOwnedPartitionsAreInvalidatedForConsumerWithStaleGeneration",
        {T: 3, T2: 3},
        [
            (C1, 0, [T, T2], [(T, 0), (T, 2), (T2, 1)], 10),
            (C2, 1, [T, T2], [(T, 0), (T, 2), (T2, 1)], 9),
        ],
        {C1: {(T, 0), (T, 2), (T2, 1)}, C2: {(T, 1), (T2, 0), (T2, 2)}},
        {},
    ),
    (
        "testOwnedPartitionsAreInvalidatedForConsumerWithNoGeneration",
        {T: 3, T2: 3},
        [
            (C1, 0, [T, T2], [(T, 0), (T, 2), (T2, 1)], 10),
            (C2, 1, [T, T2], [(T, 0), (T, 2), (T2, 1)], None),
        ],
        {C1: {(T, 0), (T, 2), (T2, 1)}, C2: {(T, 1), (T2, 0), (T2, 2)}},
        {},
    ),
    (
        "testPartitionsTransferringOwnershipIncludeThePartitionClaimedByMultipleConsumers"
        "InSameGeneration",
        {T: 3},
        [(C1, 0, [T], [(T, 0), (T, 1)], G), (C2, 1, [T], [(T, 0), (T, 2)], G), (C3, 2, [T], [], G)],
        {C1: {(T, 1)}, C2: {(T, 2)}, C3: {(T, 0)}},
        {(T, 0): C3},
    ),
    (
        "testEnsurePartitionsAssignedToHighestGeneration",
        {T: 3, T2: 3, T3: 3},
        [
            (C1, 0, [T, T2, T3], [(T, 0), (T2, 0), (T3, 0)], 10),
            (C2, 1, [T, T2, T3], [(T, 1), (T2, 1), (T3, 1)], 9),
            (C3, 1, [T, T2, T3], [(T2, 1), (T3, 0), (T3, 2)], 8),
        ],
        {
            C1: {(T, 0), (T2, 0), (T3, 0)},
            C2: {(T, 1), (T2, 1), (T3, 1)},
            C3: {(T, 2), (T2, 2), (T3, 2)},
        },
        {},
    ),
    (
        "testNoReassignmentOnCurrentMembers",
        {T: 3, T1: 3, T2: 3, T3: 3},
        [
            (C1, 0, [T, T2, T3, T1], [], None),
            (C2, 1, [T, T2, T3, T1], [(T, 0), (T2, 0), (T1, 0)], 9),
            (C3, 2, [T, T2, T3, T1], [(T3, 2), (T2, 2), (T1, 1)], 8),
            (C4, 3, [T, T2, T3, T1], [(T3, 1), (T, 1), (T, 2)], 7),
        ],
        {C1: {(T1, 2), (T2, 1), (T3, 0)}},
        {},
    ),
    (
        "testOwnedPartitionsAreInvalidatedForConsumerWithMultipleGeneration",
        {T: 3, T2: 3},
        [
            (C1, 0, [T, T2], [(T, 0), (T2, 1), (T, 1)], 10),
            (C2, 1, [T, T2], [(T, 0), (T2, 1), (T2, 2)], 8),
        ],
        {C1: {(T, 0), (T2, 1), (T, 1)}, C2: {(T, 2), (T2, 2), (T2, 0)}},
        {},
    ),
]


@pytest.mark.parametrize("rack_config", RACK_CONFIGS)
@pytest.mark.parametrize("name", STICKY)
@pytest.mark.parametrize(
    ("partitions", "members", "expected", "moves"),
    [pytest.param(*case[1:], id=case[0]) for case in KAFKA_CASES],
)
def test_kafka_cases(
    name: str,
    rack_config: str,
    partitions: dict[str, int],
    members: list[Claim],
    expected: dict[str, set[api.TopicPartition]],
    moves: dict[api.TopicPartition, str],
) -> None:
    """One ``assignPartitions`` call of each test, with the assertions Kafka makes."""
    assignment, transfers = assign(name, group_of(rack_config, partitions, members))
    assert {member: set(assignment[member]) for member in expected} == expected
    assert transfers == moves
    assert fully_balanced(assignment)
