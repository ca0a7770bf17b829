"""OffsetDelete on the wire: kafka-python's admin client deletes single partitions' committed
offsets, on the listener and through the gateway, with Kafka's errors (refused while a member
subscribes to the topic, unknown group, unknown topic, another group's token)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from kafka import TopicPartition as KafkaTopicPartition
from kafka import errors as kafka_errors
from kio.schema.errors import ErrorCode
from kio.schema.offset_delete.v0.request import (
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
)
from kio.static.primitive import i32

from kafka_group_operator.coordinator import messages
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.conftest import TOKENS
from tests.protocol.test_clients import committed_group, kafka_python_admin
from tests.protocol.test_gateway import GROUP as GATEWAY_GROUP
from tests.protocol.test_gateway import gateway, token_listener
from tests.protocol.test_kip848 import topic_id
from tests.protocol.test_listener import authenticated

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

__all__ = ["gateway", "token_listener"]  # the gateway test's fixtures, used here too


def delete_with_kafka_python(
    port: int, group: str, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], str] | str:
    """Each partition's outcome (kafka-python's error class name), or the group's error."""
    admin = kafka_python_admin(port)
    try:
        outcome = admin.delete_group_offsets(
            group, [KafkaTopicPartition(topic, partition) for topic, partition in partitions]
        )
    except kafka_errors.KafkaError as error:
        return type(error).__name__
    finally:
        admin.close()
    return {(tp.topic, tp.partition): error.__name__ for tp, error in outcome.items()}


async def offsets_of(runtime: coordinator_runtime.CoordinatorRuntime, group: str) -> Any:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return {tp: offset.offset for tp, offset in fetched.offsets.items()}


async def test_kafka_python_deletes_offsets_unless_a_member_subscribes(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = await committed_group(runtime, topic, {0: 2, 1: 3, 2: 4})
    port = open_listener.port
    deleted = await asyncio.to_thread(
        delete_with_kafka_python, port, group, [(topic, 0), (topic, 1)]
    )
    assert deleted == {(topic, 0): "NoError", (topic, 1): "NoError"}
    assert await offsets_of(runtime, group) == {(topic, 2): 4}

    member = await runtime.heartbeat(
        messages.HeartbeatRequest(
            group_id=group,
            member_id=uuid.uuid4().hex,
            member_epoch=0,
            rebalance_timeout_ms=30_000,
            subscribed_topic_names=(topic,),
            owned_partitions={},
        )
    )
    refused = await asyncio.to_thread(delete_with_kafka_python, port, group, [(topic, 2)])
    assert refused == {(topic, 2): "GroupSubscribedToTopicError"}
    assert await offsets_of(runtime, group) == {(topic, 2): 4}

    # Once the member has left, the topic is no longer subscribed.
    await runtime.heartbeat(
        messages.HeartbeatRequest(group_id=group, member_id=member.member_id, member_epoch=-1)
    )
    last = await asyncio.to_thread(delete_with_kafka_python, port, group, [(topic, 2)])
    assert last == {(topic, 2): "NoError"}
    assert await offsets_of(runtime, group) == {}

    unknown = await asyncio.to_thread(delete_with_kafka_python, port, "no-such-group", [(topic, 0)])
    assert unknown == "GroupIdNotFoundError"


def delete_request(group: str, topics: dict[str, tuple[int, ...]]) -> OffsetDeleteRequest:
    return OffsetDeleteRequest(
        group_id=group,
        topics=tuple(
            OffsetDeleteRequestTopic(
                name=name,
                partitions=tuple(OffsetDeleteRequestPartition(partition_index=i32(p)) for p in ps),
            )
            for name, ps in topics.items()
        ),
    )


async def test_unknown_topics_and_other_groups_are_refused(
    secured_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    for group in ("group-a", "group-b"):
        await runtime.commit_offsets(
            messages.OffsetCommitRequest(
                group_id=group,
                member_id="",
                member_epoch=-1,
                offsets={(topic, 1): messages.CommitOffset(9)},
            )
        )
    connection = await authenticated(secured_listener.port, "group-a", TOKENS["group-a"])
    try:
        # Kafka's broker answers a topic it does not have per partition, before the group.
        answer = await connection.call(
            delete_request("group-a", {"no-such-topic": (0, 1), topic: (1,)})
        )
        assert answer.error_code == ErrorCode.none
        assert [
            (t.name, [(int(p.partition_index), p.error_code) for p in t.partitions])
            for t in answer.topics
        ] == [
            (
                "no-such-topic",
                [
                    (0, ErrorCode.unknown_topic_or_partition),
                    (1, ErrorCode.unknown_topic_or_partition),
                ],
            ),
            (topic, [(1, ErrorCode.none)]),
        ]
        # Another group's offsets: a group-level error and no topics, as Kafka answers.
        other = await connection.call(delete_request("group-b", {topic: (1,)}))
        assert (other.error_code, other.topics) == (ErrorCode.group_authorization_failed, ())
    finally:
        await connection.close()
    # (The groups are shared with other tests of the package: only partition 1 is ours.)
    assert (topic, 1) not in await offsets_of(runtime, "group-a")
    assert (await offsets_of(runtime, "group-b"))[(topic, 1)] == 9


async def test_kafka_python_deletes_offsets_through_the_gateway(
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=GATEWAY_GROUP,
            member_id="",
            member_epoch=-1,
            offsets={(topic, 0): messages.CommitOffset(1), (topic, 2): messages.CommitOffset(2)},
        )
    )
    deleted = await asyncio.to_thread(
        delete_with_kafka_python, gateway.port, GATEWAY_GROUP, [(topic, 0)]
    )
    assert deleted == {(topic, 0): "NoError"}
    remaining = await offsets_of(runtime, GATEWAY_GROUP)
    assert (topic, 0) not in remaining
    assert remaining[(topic, 2)] == 2
