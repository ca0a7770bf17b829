"""Which group a member joins, and conversions between classic and consumer groups (Kafka 4).

Routing as ``GroupMetadataManager`` routes by group type, with the ConsumerGroup resource's
say (``spec.assignment``); conversions as its ``convertToConsumerGroup`` (a KIP-848 member
joins a classic group) and ``convertToClassicGroup`` (the last KIP-848 member leaves).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import (
    consumer_protocol,
    errors,
    group_state,
    messages,
    records,
    result,
)
from kafka_group_records import records as schema
from tests.coordinator.harness import GROUP, TOPIC, TOPIC_ID, Harness

SUBSCRIPTION_V1 = (
    b"\x00\x01"  # version 1
    + b"\x00\x00\x00\x01\x00\x06"
    + TOPIC.encode()
    + b"\xff\xff\xff\xff"  # no user data
    + b"\x00\x00\x00\x00"  # owns nothing
)
RANGE = schema.ClassicProtocol("range", SUBSCRIPTION_V1)


def harness(
    policy: coordinator_config.MigrationPolicy = coordinator_config.MigrationPolicy.BIDIRECTIONAL,
) -> Harness:
    counter = itertools.count()
    h = Harness(
        settings=coordinator_config.CoordinatorConfig(
            initial_rebalance_delay_ms=0, migration_policy=policy
        ),
        new_uuid=lambda: f"uuid{next(counter)}",
    )
    h.topics({TOPIC: 4})
    return h


def classic_join(
    h: Harness,
    member_id: str = "",
    *,
    protocol_type: str = "consumer",
    protocols: tuple[schema.ClassicProtocol, ...] = (RANGE,),
) -> result.Result[Any]:
    request = messages.ClassicJoinRequest(
        group_id=GROUP,
        member_id=member_id,
        instance_id=None,
        protocol_type=protocol_type,
        protocols=protocols,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=(TOPIC,),
        client_id="c",
    )
    return h.apply(h.shard.classic_join(request, h.now_ms))


def described(h: Harness) -> messages.GroupDescription:
    return h.shard.describe_group(GROUP)


def settle_classic_pair(h: Harness) -> tuple[str, str]:
    """Two classic members of a classic group, Stable; the leader gave t-0,1 and t-2,3."""
    first = classic_join(h).response.key.member_id
    second = classic_join(h).response.key.member_id
    for _ in range(3):
        if described(h).state != "PreparingRebalance":
            break
        h.tick(0)
    assert described(h).state == "CompletingRebalance"
    assignments = {
        first: consumer_protocol.encode_assignment({TOPIC: frozenset({0, 1})}),
        second: consumer_protocol.encode_assignment({TOPIC: frozenset({2, 3})}),
    }
    h.apply(h.shard.classic_sync(messages.ClassicSyncRequest(GROUP, second, 1), h.now_ms))
    h.apply(
        h.shard.classic_sync(
            messages.ClassicSyncRequest(GROUP, first, 1, assignments=tuple(assignments.items())),
            h.now_ms,
        )
    )
    assert described(h).state == "Stable"
    return first, second


# ---------------------------------------------------------------------------------------
# Routing


def test_a_group_without_a_resource_follows_its_clients_a_classic_join_makes_a_classic_group() -> (
    None
):
    h = harness()
    joined = classic_join(h)
    assert isinstance(joined.response, result.Deferred)
    assert described(h).group_type == "classic"


def test_a_server_mode_resource_keeps_classic_members_in_a_consumer_group() -> None:
    h = harness()
    h.configure()  # spec.assignment defaults to Server
    joined = classic_join(h).response
    # The coordinator assigns: no leader, no member list, answered at once.
    assert isinstance(joined, messages.ClassicJoinResponse)
    assert joined.leader == ""
    assert joined.members == ()
    assert described(h).group_type == "consumer"
    # A Connect worker cannot be assigned server-side.
    with pytest.raises(errors.InconsistentGroupProtocol):
        classic_join(h, protocol_type="connect", protocols=(schema.ClassicProtocol("s", b""),))


def test_a_client_mode_resource_makes_a_classic_group_and_keeps_its_config() -> None:
    h = harness()
    h.configure(client_assignment=True, offsets_retention_ms=60_000)
    first, second = settle_classic_pair(h)
    assert described(h).group_type == "classic"
    assert h.shard._classic_retention_ms(GROUP) == 60_000
    # The leader's bytes are relayed: a Connect-style protocol type works too.
    assert [m.raw_assignment for m in described(h).members] == [
        consumer_protocol.encode_assignment({TOPIC: frozenset({0, 1})}),
        consumer_protocol.encode_assignment({TOPIC: frozenset({2, 3})}),
    ]
    # Deleting the resource's group removes the classic group and the config.
    h.apply(
        h.shard.classic_leave(
            messages.ClassicLeaveRequest(
                GROUP, (messages.ClassicLeavingMember(first), messages.ClassicLeavingMember(second))
            ),
            h.now_ms,
        )
    )
    deleted = h.apply(h.shard.delete_group(messages.DeleteGroupRequest(GROUP), h.now_ms))
    assert records.new_group_metadata_tombstone(GROUP) in deleted.records
    assert records.new_group_config_tombstone(GROUP) in deleted.records
    assert h.shard.list_groups() == []


def test_a_classic_join_replaces_an_empty_consumer_group_as_kafka_does() -> None:
    h = harness()
    h.heartbeat("kip848", 0)
    h.heartbeat("kip848", messages.LEAVE_EPOCH)
    assert described(h).state == "Empty"
    joined = classic_join(h)
    # The empty consumer group's records are tombstoned first, then the classic group lives.
    kinds = [type(record.key).__name__ for record in joined.records]
    assert kinds[-1] == "GroupMetadataKey"
    assert "ConsumerGroupMetadataKey" in kinds
    assert all(record.value is None for record in joined.records[:-1])
    assert described(h).group_type == "classic"


def test_a_classic_join_to_a_consumer_group_with_members_joins_it() -> None:
    h = harness()
    h.heartbeat("kip848", 0)
    joined = classic_join(h).response
    assert isinstance(joined, messages.ClassicJoinResponse)
    assert joined.leader == ""
    assert described(h).group_type == "consumer"


# ---------------------------------------------------------------------------------------
# Upgrade: a KIP-848 member joins a classic group


def test_a_kip848_member_converts_a_classic_group_keeping_every_assignment() -> None:
    h = harness()
    first, second = settle_classic_pair(h)
    # A classic member is parked in a SyncGroup? No: Stable. Park a join of the leader.
    parked = classic_join(h, first)
    assert isinstance(parked.response, result.Deferred)
    upgraded = h.heartbeat("kip848", 0)
    kinds = [(type(r.key).__name__, r.value is None) for r in upgraded.records]
    # The classic group goes, the consumer group comes with its members at the generation.
    assert kinds[:3] == [
        ("GroupMetadataKey", True),
        ("ConsumerGroupMetadataKey", False),
        ("ConsumerGroupPartitionMetadataKey", False),
    ]
    assert upgraded.records[1].value == schema.ConsumerGroupMetadataValue(1)
    # The parked join is told to join again.
    assert isinstance(h.completed[result.join_key(GROUP, first)].error, errors.RebalanceInProgress)
    group = described(h)
    assert group.group_type == "consumer"
    members = {m.member_id: m for m in group.members}
    # Each classic member keeps what the leader gave it until the assignor moves it.
    assert members[second].classic
    assert set(members) == {first, second, "kip848"}
    target = {m: d.target_assignment for m, d in members.items()}
    assert sum(len(t.get(TOPIC, ())) for t in target.values()) == 4
    # The classic members go on heartbeating as classic members of a consumer group.
    beat = h.apply(
        h.shard.classic_heartbeat(messages.ClassicHeartbeatRequest(GROUP, second, 1), h.now_ms)
    )
    assert beat.response.rebalance_in_progress is True
    assert GROUP not in h.shard._classic_groups
    # A load of the log gives the same consumer group (the tombstone removed the classic).
    assert h.replayed().canonical_state()["groups"] == h.shard.canonical_state()["groups"]


def test_the_upgrade_drops_partitions_the_leader_gave_twice() -> None:
    h = harness()
    first = classic_join(h).response.key.member_id
    second = classic_join(h).response.key.member_id
    h.tick(0)
    h.tick(0)
    both = consumer_protocol.encode_assignment({TOPIC: frozenset({0, 1})})
    h.apply(h.shard.classic_sync(messages.ClassicSyncRequest(GROUP, second, 1), h.now_ms))
    h.apply(
        h.shard.classic_sync(
            messages.ClassicSyncRequest(
                GROUP,
                first,
                1,
                assignments=(
                    (first, both),
                    (second, consumer_protocol.encode_assignment({TOPIC: frozenset({1, 2})})),
                ),
            ),
            h.now_ms,
        )
    )
    upgraded = h.heartbeat("kip848", 0)
    currents = {
        r.key.member_id: r.value
        for r in upgraded.records
        if isinstance(r.key, schema.ConsumerGroupCurrentMemberAssignmentKey)
        and r.value is not None
        and r.value.member_epoch == 1
    }
    assert currents[first].assigned_partitions == (schema.TopicPartitions(TOPIC_ID, (0,)),)
    assert currents[second].assigned_partitions == (schema.TopicPartitions(TOPIC_ID, (2,)),)


@pytest.mark.parametrize(
    "policy",
    [coordinator_config.MigrationPolicy.DISABLED, coordinator_config.MigrationPolicy.DOWNGRADE],
)
def test_no_upgrade_when_the_policy_forbids_it(policy: coordinator_config.MigrationPolicy) -> None:
    h = harness(policy)
    settle_classic_pair(h)
    with pytest.raises(errors.GroupIdNotFound):
        h.heartbeat("kip848", 0)
    assert described(h).group_type == "classic"


def test_a_connect_group_is_never_upgraded() -> None:
    h = harness()
    classic_join(h, protocol_type="connect", protocols=(schema.ClassicProtocol("sessioned", b"w"),))
    with pytest.raises(errors.GroupIdNotFound):
        h.heartbeat("kip848", 0)


def test_a_kip848_member_replaces_an_empty_classic_group() -> None:
    h = harness()
    first, second = settle_classic_pair(h)
    h.apply(
        h.shard.classic_leave(
            messages.ClassicLeaveRequest(
                GROUP, (messages.ClassicLeavingMember(first), messages.ClassicLeavingMember(second))
            ),
            h.now_ms,
        )
    )
    h.apply(
        h.shard.commit_offsets(
            messages.OffsetCommitRequest(GROUP, "", -1, {(TOPIC, 0): messages.CommitOffset(3)}),
            h.now_ms,
        )
    )
    assert described(h).state == "Empty"
    joined = h.heartbeat("kip848", 0)
    assert joined.records[0] == records.new_group_metadata_tombstone(GROUP)
    assert described(h).group_type == "consumer"
    # The offsets stay with the group id.
    assert h.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP)).offsets[(TOPIC, 0)].offset == 3


# ---------------------------------------------------------------------------------------
# Downgrade: the last KIP-848 member leaves


def mixed(h: Harness) -> list[str]:
    """A consumer group: one KIP-848 member, then two classic members joined to it."""
    h.heartbeat("kip848", 0)
    members = []
    for _ in range(2):
        joined = classic_join(h).response
        assert isinstance(joined, messages.ClassicJoinResponse)
        members.append(joined.member_id)
    return members


def test_the_last_kip848_member_leaving_makes_the_classic_members_a_classic_group() -> None:
    h = harness()
    classic_ids = mixed(h)
    group_epoch = described(h).group_epoch
    leavers_target = next(
        m.target_assignment for m in described(h).members if m.member_id == "kip848"
    ).get(TOPIC, frozenset())
    left = h.heartbeat("kip848", messages.LEAVE_EPOCH)
    assert left.response.member_epoch == messages.LEAVE_EPOCH
    written = [r for r in left.records if isinstance(r.key, schema.GroupMetadataKey)]
    assert len(written) == 1
    value = written[0].value
    assert isinstance(value, schema.GroupMetadataValue)
    assert value.protocol_type == "consumer"
    assert value.generation == group_epoch
    assert value.protocol == "range"
    assert [m.member_id for m in value.members] == classic_ids
    # Each member's target, as a ConsumerProtocolAssignment at its subscription's version.
    for member in value.members:
        assert consumer_protocol.version_of(member.assignment) == 1
    owned = [consumer_protocol.decode_assignment(m.assignment) for m in value.members]
    # The leaver's partitions wait for the rebalance (Kafka writes the remaining targets).
    assert sorted(p for o in owned for p in o.get(TOPIC, ())) == sorted(
        {0, 1, 2, 3} - leavers_target
    )
    # Then it rebalances: the classic members join again, and the leader assigns.
    assert described(h).group_type == "classic"
    assert described(h).state == "PreparingRebalance"
    assert GROUP not in h.shard._groups
    beat = h.apply(
        h.shard.classic_heartbeat(
            messages.ClassicHeartbeatRequest(GROUP, classic_ids[0], group_epoch), h.now_ms
        )
    )
    assert beat.response.rebalance_in_progress is True
    classic_join(h, classic_ids[0])
    last = classic_join(h, classic_ids[1]).response
    assert described(h).state == "CompletingRebalance"
    # The first to join waited for the second; the second's join completed the barrier.
    first = h.completed[result.join_key(GROUP, classic_ids[0])].response
    assert first.generation_id == last.generation_id == group_epoch + 1
    assert first.leader == last.leader == classic_ids[0]
    # The log loads to the same classic group's record.
    loaded = h.replayed().canonical_state()["classic_groups"][GROUP]
    assert loaded["generation"] == group_epoch


def test_a_server_mode_resource_is_never_downgraded() -> None:
    h = harness()
    h.configure()
    mixed(h)
    h.heartbeat("kip848", messages.LEAVE_EPOCH)
    assert described(h).group_type == "consumer"


def test_no_downgrade_when_the_policy_forbids_it() -> None:
    h = harness(coordinator_config.MigrationPolicy.UPGRADE)
    mixed(h)
    h.heartbeat("kip848", messages.LEAVE_EPOCH)
    assert described(h).group_type == "consumer"


def test_a_fenced_kip848_member_downgrades_the_group_too() -> None:
    h = harness()
    # A resource letting clients assign; KIP-848 members' session 6 s.
    h.configure(client_assignment=True, session_timeout_ms=6_000)
    classic_ids = mixed(h)
    # The classic members heartbeat; the KIP-848 member falls silent past its session.
    for _ in range(10):
        h.now_ms += 1_000
        for member_id in classic_ids:
            h.apply(
                h.shard.classic_heartbeat(
                    messages.ClassicHeartbeatRequest(
                        GROUP,
                        member_id,
                        next(
                            m.member_epoch for m in described(h).members if m.member_id == member_id
                        ),
                    ),
                    h.now_ms,
                )
            )
        h.tick(0)
        if described(h).group_type == "classic":
            break
    assert described(h).group_type == "classic"
    assert group_state.ClassicGroupState(described(h).state) is (
        group_state.ClassicGroupState.PREPARING_REBALANCE
    )
