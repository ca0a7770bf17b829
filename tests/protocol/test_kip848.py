"""ConsumerGroupHeartbeat and ConsumerGroupDescribe on the wire, against the real runtime:
the same epochs, fencing and static membership as the member API, with topic ids."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_heartbeat.v0.request import (
    ConsumerGroupHeartbeatRequest as HeartbeatV0,
)
from kio.schema.consumer_group_heartbeat.v1.request import (
    ConsumerGroupHeartbeatRequest as HeartbeatV1,
)
from kio.schema.consumer_group_heartbeat.v1.request import TopicPartitions
from kio.static.primitive import i32Timedelta

from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.conftest import TOKENS
from tests.protocol.test_listener import GROUP_AUTHORIZATION_FAILED, INVALID_REQUEST, authenticated
from tests.protocol.wire import Connection
from tests.support.topics import topic_id

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

# Kafka's Errors: UNKNOWN_MEMBER_ID(25), FENCED_INSTANCE_ID(82), FENCED_MEMBER_EPOCH(110),
# UNRELEASED_INSTANCE_ID(111), UNSUPPORTED_ASSIGNOR(112).
UNKNOWN_MEMBER_ID = 25
FENCED_INSTANCE_ID = 82
FENCED_MEMBER_EPOCH = 110
UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112

REBALANCE_TIMEOUT = i32Timedelta.parse(datetime.timedelta(seconds=30))


def owned(response: Any) -> dict[uuid.UUID, tuple[int, ...]]:
    assert response.assignment is not None
    return {tp.topic_id: tuple(tp.partitions) for tp in response.assignment.topic_partitions}


def heartbeat(
    group: str,
    member_id: str,
    epoch: int,
    *,
    topic: str | None = None,
    owned_partitions: dict[uuid.UUID, tuple[int, ...]] | None = None,
    instance_id: str | None = None,
    assignor: str | None = None,
) -> HeartbeatV1:
    return HeartbeatV1(
        group_id=group,
        member_id=member_id,
        member_epoch=epoch,
        instance_id=instance_id,
        rebalance_timeout=REBALANCE_TIMEOUT,
        subscribed_topic_names=(topic,) if topic else None,
        server_assignor=assignor,
        topic_partitions=None
        if owned_partitions is None
        else tuple(
            TopicPartitions(topic_id=tid, partitions=parts)
            for tid, parts in owned_partitions.items()
        ),
    )


async def test_join_and_cooperative_handover_with_topic_ids(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    tid = await topic_id(runtime, topic)
    group = f"kip848-{uuid.uuid4().hex[:6]}"
    connection = await Connection.open(open_listener.port)
    try:
        first_id, second_id = uuid.uuid4().hex, uuid.uuid4().hex
        first = await connection.call(
            heartbeat(group, first_id, 0, topic=topic, owned_partitions={})
        )
        assert first.error_code == 0, first
        assert first.member_id == first_id
        assert owned(first) == {tid: (0, 1, 2)}
        assert first.heartbeat_interval == datetime.timedelta(seconds=3)

        second = await connection.call(
            heartbeat(group, second_id, 0, topic=topic, owned_partitions={})
        )
        assert second.error_code == 0
        # Nothing is handed to the second member before the first revoked it.
        assert second.assignment is None or sum(len(p) for p in owned(second).values()) == 0
        revoked = await connection.call(
            heartbeat(group, first_id, first.member_epoch, owned_partitions={tid: (0, 1, 2)})
        )
        assert revoked.error_code == 0
        kept = owned(revoked)[tid]
        assert 0 < len(kept) < 3
        confirmed = await connection.call(
            heartbeat(group, first_id, revoked.member_epoch, owned_partitions={tid: kept})
        )
        assert confirmed.error_code == 0
        given = await connection.call(
            heartbeat(group, second_id, second.member_epoch, owned_partitions={})
        )
        assert given.error_code == 0
        assert sorted(owned(given)[tid] + kept) == [0, 1, 2]

        described = await connection.call(
            ConsumerGroupDescribeRequest(
                group_ids=(group, "no-such-group"), include_authorized_operations=False
            )
        )
        found, missing = described.groups
        assert found.error_code == 0
        assert found.group_epoch == 2
        members = {m.member_id: m for m in found.members}
        assert set(members) == {first_id, second_id}
        assignment = members[first_id].target_assignment.topic_partitions
        assert [(tp.topic_id, tp.topic_name, tuple(tp.partitions)) for tp in assignment] == [
            (tid, topic, kept)
        ]
        assert members[first_id].client_id == "tests"
        assert members[first_id].member_type == 1
        assert missing.error_code == 69  # GROUP_ID_NOT_FOUND
    finally:
        await connection.close()


async def test_fencing_and_errors(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = f"kip848-{uuid.uuid4().hex[:6]}"
    connection = await Connection.open(open_listener.port)
    try:
        member = uuid.uuid4().hex
        joined = await connection.call(
            heartbeat(group, member, 0, topic=topic, owned_partitions={})
        )
        assert joined.error_code == 0
        ahead = await connection.call(heartbeat(group, member, joined.member_epoch + 5))
        assert ahead.error_code == FENCED_MEMBER_EPOCH
        unknown = await connection.call(heartbeat(group, uuid.uuid4().hex, 3))
        assert unknown.error_code == UNKNOWN_MEMBER_ID
        assignor = await connection.call(
            heartbeat(group, uuid.uuid4().hex, 0, topic=topic, owned_partitions={}, assignor="nope")
        )
        assert assignor.error_code == UNSUPPORTED_ASSIGNOR
        # v1 clients choose their member id (KIP-1082); an empty one is refused.
        empty = await connection.call(heartbeat(group, "", 0, topic=topic, owned_partitions={}))
        assert empty.error_code == INVALID_REQUEST
        # v0 clients leave it to the coordinator.
        v0 = await connection.call(
            HeartbeatV0(
                group_id=group,
                member_id="",
                member_epoch=0,
                rebalance_timeout=REBALANCE_TIMEOUT,
                subscribed_topic_names=(topic,),
                topic_partitions=(),
            )
        )
        assert v0.error_code == 0
        assert len(v0.member_id) == 22  # a Kafka Uuid's base64 form
    finally:
        await connection.close()


async def test_static_membership(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    tid = await topic_id(runtime, topic)
    group = f"kip848-{uuid.uuid4().hex[:6]}"
    connection = await Connection.open(open_listener.port)
    try:
        first = uuid.uuid4().hex
        joined = await connection.call(
            heartbeat(group, first, 0, topic=topic, owned_partitions={}, instance_id="pod-0")
        )
        assert owned(joined) == {tid: (0, 1, 2)}
        # A second live member with the same instance id is refused.
        twin = await connection.call(
            heartbeat(
                group, uuid.uuid4().hex, 0, topic=topic, owned_partitions={}, instance_id="pod-0"
            )
        )
        assert twin.error_code == UNRELEASED_INSTANCE_ID
        # A temporary leave (-2), then the restarted pod gets its partitions back at once.
        left = await connection.call(heartbeat(group, first, -2, instance_id="pod-0"))
        assert left.error_code == 0
        restarted = uuid.uuid4().hex
        back = await connection.call(
            heartbeat(group, restarted, 0, topic=topic, owned_partitions={}, instance_id="pod-0")
        )
        assert back.error_code == 0
        assert owned(back) == {tid: (0, 1, 2)}
        # The replaced member is fenced.
        old = await connection.call(
            heartbeat(group, first, joined.member_epoch, instance_id="pod-0")
        )
        assert old.error_code in (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID)
    finally:
        await connection.close()


async def test_a_group_token_works_for_its_group_only(
    secured_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    connection = await authenticated(secured_listener.port, "group-a", TOKENS["group-a"])
    try:
        mine = await connection.call(
            heartbeat("group-a", uuid.uuid4().hex, 0, topic=topic, owned_partitions={})
        )
        assert mine.error_code == 0
        theirs = await connection.call(
            heartbeat("group-b", uuid.uuid4().hex, 0, topic=topic, owned_partitions={})
        )
        assert theirs.error_code == GROUP_AUTHORIZATION_FAILED
        described = await connection.call(
            ConsumerGroupDescribeRequest(
                group_ids=("group-b",), include_authorized_operations=False
            )
        )
        assert described.groups[0].error_code == GROUP_AUTHORIZATION_FAILED
        left = await connection.call(heartbeat("group-a", mine.member_id, -1))
        assert left.error_code == 0
    finally:
        await connection.close()
