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
    """Kafka's ``partitionsTransferringOwnership``: owned by one member, assigned to another."""
    owners = {claim: member for member, sub in spec.members.items() for claim in sub.owned}
    return {
        claim: member
        for member, partitions in target.items()
        for claim in partitions
        if owners.get(claim, member) != member
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
