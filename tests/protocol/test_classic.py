"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup and OffsetCommit from classic consumers, on the
wire against the real runtime: kio requests as a Kafka client sends them. These groups'
resources ask for server-side assignment (classic groups, where the leader assigns:
``test_classic_groups.py``)."""

from __future__ import annotations

import datetime
import io
import struct
import uuid
from typing import Any

import pytest
from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription as SubscriptionV1,
)
from kio.schema.consumer_protocol_subscription.v1.data import TopicPartition as OwnedV1
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v0.request import JoinGroupRequest as JoinV0
from kio.schema.join_group.v0.request import JoinGroupRequestProtocol as ProtocolV0
from kio.schema.join_group.v9.request import JoinGroupRequest as JoinV9
from kio.schema.join_group.v9.request import JoinGroupRequestProtocol as ProtocolV9
from kio.schema.leave_group.v0.request import LeaveGroupRequest as LeaveV0
from kio.schema.leave_group.v5.request import LeaveGroupRequest as LeaveV5
from kio.schema.leave_group.v5.request import MemberIdentity
from kio.schema.offset_commit.v8.request import OffsetCommitRequest as CommitV8
from kio.schema.offset_commit.v8.request import OffsetCommitRequestPartition as CommitPartition
from kio.schema.offset_commit.v8.request import OffsetCommitRequestTopic as CommitTopic
from kio.schema.sync_group.v5.request import SyncGroupRequest
from kio.schema.types import GroupId, TopicName
from kio.serial import entity_reader, entity_writer
from kio.serial.writers import write_int16
from kio.static.primitive import i16, i32, i32Timedelta, i64

from kafka_group_operator.coordinator import messages
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.test_kip848 import topic_id
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

# Kafka's Errors (org.apache.kafka.common.protocol.Errors): ILLEGAL_GENERATION(22),
# INCONSISTENT_GROUP_PROTOCOL(23), UNKNOWN_MEMBER_ID(25), REBALANCE_IN_PROGRESS(27),
# MEMBER_ID_REQUIRED(79), FENCED_INSTANCE_ID(82).
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82

SESSION = i32Timedelta.parse(datetime.timedelta(seconds=10))
REBALANCE = i32Timedelta.parse(datetime.timedelta(seconds=30))


def subscription(topic: str, owned: tuple[int, ...] = ()) -> bytes:
    """ConsumerProtocolSubscription v1 as a Java client writes it: int16 version, struct."""
    buffer = io.BytesIO()
    write_int16(buffer, i16(1))
    entity_writer(SubscriptionV1)(
        buffer,
        SubscriptionV1(
            topics=(TopicName(topic),),
            user_data=None,
            owned_partitions=(
                OwnedV1(topic=TopicName(topic), partitions=tuple(i32(p) for p in owned)),
            )
            if owned
            else (),
        ),
    )
    return buffer.getvalue()


def assignment(data: bytes) -> dict[str, tuple[int, ...]]:
    (version,) = struct.unpack_from(">h", data, 0)
    assert version == 0
    decoded, _ = entity_reader(ConsumerProtocolAssignment)(data, 2)
    return {tp.topic: tuple(tp.partitions) for tp in decoded.assigned_partitions}


def join(
    group: str,
    topic: str,
    member_id: str = "",
    *,
    instance_id: str | None = None,
    owned: tuple[int, ...] = (),
    protocol_type: str = "consumer",
    metadata: bytes | None = None,
) -> JoinV9:
    return JoinV9(
        group_id=GroupId(group),
        session_timeout=SESSION,
        rebalance_timeout=REBALANCE,
        member_id=member_id,
        group_instance_id=instance_id,
        protocol_type=protocol_type,
        protocols=(
            ProtocolV9(
                name="range", metadata=subscription(topic, owned) if metadata is None else metadata
            ),
        ),
    )


def sync(group: str, member_id: str, generation: int, instance_id: str | None = None) -> Any:
    return SyncGroupRequest(
        group_id=GroupId(group),
        generation_id=i32(generation),
        member_id=member_id,
        group_instance_id=instance_id,
        protocol_type="consumer",
        protocol_name="range",
        assignments=(),
    )


def beat(group: str, member_id: str, generation: int, instance_id: str | None = None) -> Any:
    return HeartbeatRequest(
        group_id=GroupId(group),
        generation_id=i32(generation),
        member_id=member_id,
        group_instance_id=instance_id,
    )


def commit(group: str, topic: str, member_id: str, generation: int) -> CommitV8:
    return CommitV8(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(generation),
        member_id=member_id,
        topics=(
            CommitTopic(
                name=TopicName(topic),
                partitions=(
                    CommitPartition(
                        partition_index=i32(0), committed_offset=i64(3), committed_metadata=None
                    ),
                ),
            ),
        ),
    )


async def server_assigned(runtime: coordinator_runtime.CoordinatorRuntime, topic: str) -> str:
    """A group whose ConsumerGroup resource asks the coordinator to assign (the default
    ``spec.assignment: Server``): its classic members join a consumer group."""
    group = f"classic-{uuid.uuid4().hex[:8]}"
    await runtime.configure_group(messages.GroupSettings(group, assignor="range", topics=(topic,)))
    return group


def commit_errors(response: Any) -> list[int]:
    return [p.error_code for t in response.topics for p in t.partitions]


async def test_dynamic_member_joins_syncs_heartbeats_and_commits(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = await server_assigned(runtime, topic)
    connection = await Connection.open(open_listener.port)
    try:
        # JoinGroup v4+: a dynamic member is first sent back for an id (KIP-394).
        first = await connection.call(join(group, topic))
        assert first.error_code == MEMBER_ID_REQUIRED
        member_id = first.member_id
        assert member_id
        joined = await connection.call(join(group, topic, member_id))
        assert joined.error_code == 0
        assert (joined.member_id, joined.generation_id) == (member_id, 1)
        assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
        # The coordinator assigns: no leader, no member list for a client-side assignor.
        assert (joined.leader, joined.members) == ("", ())

        synced = await connection.call(sync(group, member_id, 1))
        assert synced.error_code == 0
        assert assignment(synced.assignment) == {topic: (0, 1, 2)}
        assert (await connection.call(beat(group, member_id, 1))).error_code == 0
        assert commit_errors(await connection.call(commit(group, topic, member_id, 1))) == [0]
        stale = await connection.call(commit(group, topic, member_id, 0))
        assert commit_errors(stale) == [ILLEGAL_GENERATION]
        assert (await connection.call(beat(group, member_id, 7))).error_code == ILLEGAL_GENERATION
        assert (await connection.call(beat(group, "nobody", 1))).error_code == UNKNOWN_MEMBER_ID

        # ConsumerGroupDescribe v1 tells a classic member apart (member type 0).
        described = await connection.call(
            ConsumerGroupDescribeRequest(
                group_ids=(GroupId(group),), include_authorized_operations=False
            )
        )
        (member,) = described.groups[0].members
        assert (member.member_id, member.member_epoch, member.member_type) == (member_id, 1, 0)

        # LeaveGroup v0 (one member): gone, and its heartbeats are unknown.
        left = await connection.call(LeaveV0(group_id=GroupId(group), member_id=member_id))
        assert left.error_code == 0
        assert (await connection.call(beat(group, member_id, 1))).error_code == UNKNOWN_MEMBER_ID
    finally:
        await connection.close()


async def test_a_second_member_makes_the_first_rejoin_and_revoke(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = await server_assigned(runtime, topic)
    connection = await Connection.open(open_listener.port)
    try:
        # Static members need no MEMBER_ID_REQUIRED round.
        first = await connection.call(join(group, topic, instance_id="pod-0"))
        assert (first.error_code, first.generation_id) == (0, 1)
        a = first.member_id
        synced = await connection.call(sync(group, a, 1, "pod-0"))
        assert assignment(synced.assignment) == {topic: (0, 1, 2)}

        second = await connection.call(join(group, topic, instance_id="pod-1"))
        assert (second.error_code, second.generation_id) == (0, 2)
        b = second.member_id
        assert (await connection.call(beat(group, a, 1, "pod-0"))).error_code == (
            REBALANCE_IN_PROGRESS
        )
        # A cooperative client rejoins still owning everything; SyncGroup lists what it keeps.
        rejoined = await connection.call(
            join(group, topic, a, instance_id="pod-0", owned=(0, 1, 2))
        )
        assert (rejoined.error_code, rejoined.generation_id) == (0, 1)
        kept = assignment((await connection.call(sync(group, a, 1, "pod-0"))).assignment)[topic]
        assert 0 < len(kept) < 3
        rejoined = await connection.call(join(group, topic, a, instance_id="pod-0", owned=kept))
        assert (rejoined.error_code, rejoined.generation_id) == (0, 2)
        assert (await connection.call(beat(group, a, 2, "pod-0"))).error_code == 0

        assert (await connection.call(beat(group, b, 2, "pod-1"))).error_code == (
            REBALANCE_IN_PROGRESS
        )
        await connection.call(join(group, topic, b, instance_id="pod-1"))
        got = assignment((await connection.call(sync(group, b, 2, "pod-1"))).assignment)[topic]
        assert sorted(kept + got) == [0, 1, 2]

        # A zombie of pod-0 is fenced.
        fenced = await connection.call(beat(group, "zombie", 2, "pod-0"))
        assert fenced.error_code == FENCED_INSTANCE_ID
        # LeaveGroup v5: a batch by instance id, each member answered.
        left = await connection.call(
            LeaveV5(
                group_id=GroupId(group),
                members=(
                    MemberIdentity(member_id="", group_instance_id="pod-1"),
                    MemberIdentity(member_id="zombie", group_instance_id="pod-0"),
                    MemberIdentity(member_id="", group_instance_id="pod-9"),
                ),
            )
        )
        assert left.error_code == 0
        assert [m.error_code for m in left.members] == [0, FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID]
    finally:
        await connection.close()


async def test_protocol_checks_and_join_group_v0(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = await server_assigned(runtime, topic)
    connection = await Connection.open(open_listener.port)
    try:
        wrong_type = await connection.call(join(group, topic, protocol_type="connect"))
        assert wrong_type.error_code == INCONSISTENT_GROUP_PROTOCOL
        malformed = await connection.call(join(group, topic, metadata=b"\x00"))
        assert malformed.error_code == INCONSISTENT_GROUP_PROTOCOL
        # v0: no rebalance timeout and no MEMBER_ID_REQUIRED round.
        joined = await connection.call(
            JoinV0(
                group_id=GroupId(group),
                session_timeout=SESSION,
                member_id="",
                protocol_type="consumer",
                protocols=(ProtocolV0(name="range", metadata=subscription(topic)),),
            )
        )
        assert (joined.error_code, joined.generation_id) == (0, 1)
        assert joined.member_id
    finally:
        await connection.close()
