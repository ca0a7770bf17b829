"""Stock Kafka clients against the listener for coordinator-only work: a confluent-kafka
consumer with ``group.protocol=consumer`` (join, commit, committed, leave), confluent-kafka's
and kafka-python's admin clients (list, describe, offsets, delete), with and without SASL.

Fetch is the brokers' business (the gateway routes it there), so these clients are pointed at
the listener only for what a coordinator answers.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors

from kafka_group_operator.coordinator import messages
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.conftest import TOKENS
from tests.protocol.test_kip848 import topic_id

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]


def consume_assignment_and_commit(port: int, group: str, topic: str) -> dict[str, Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": group,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            # Offsets are looked up from the brokers, which this listener is not.
            "auto.offset.reset": "error",
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(consumer.assignment()) < 3:
            consumer.poll(0.2)
        assignment = sorted(tp.partition for tp in consumer.assignment())
        consumer.commit(offsets=[TopicPartition(topic, 1, 4)], asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, 1), TopicPartition(topic, 2)], 10)
        return {
            "assignment": assignment,
            "committed": {tp.partition: tp.offset for tp in committed},
        }
    finally:
        consumer.close()


async def test_confluent_kafka_consumer_protocol_member(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = f"ck-{uuid.uuid4().hex[:6]}"
    seen = await asyncio.to_thread(consume_assignment_and_commit, open_listener.port, group, topic)
    assert seen["assignment"] == [0, 1, 2]
    # -1001 is librdkafka's RD_KAFKA_OFFSET_INVALID: nothing committed.
    assert seen["committed"] == {1: 4, 2: -1001}
    # The commit went through the coordinator and close() left the group.
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    assert {tp: o.offset for tp, o in fetched.offsets.items()} == {(topic, 1): 4}
    assert (await runtime.describe_group(group)).members == ()


def confluent_admin_offsets(port: int, group: str) -> dict[tuple[str, int], int]:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    result = future.result(30)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}


async def committed_group(
    runtime: coordinator_runtime.CoordinatorRuntime, topic: str, offsets: dict[int, int]
) -> str:
    """A member-less group with ``offsets`` committed administratively."""
    group = f"admin-{uuid.uuid4().hex[:6]}"
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=group,
            member_id="",
            member_epoch=-1,
            offsets={(topic, p): messages.CommitOffset(o) for p, o in offsets.items()},
        )
    )
    return group


async def test_confluent_kafka_admin_reads_committed_offsets(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    group = await committed_group(runtime, topic, {0: 2, 2: 5})
    offsets = await asyncio.to_thread(confluent_admin_offsets, open_listener.port, group)
    assert offsets == {(topic, 0): 2, (topic, 2): 5}


def kafka_python_admin(port: int, **security: Any) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=30_000, **security
    )


def kafka_python_tour(port: int, group: str) -> dict[str, Any]:
    admin = kafka_python_admin(port)
    try:
        return {
            "listed": {entry["group_id"]: entry for entry in admin.list_groups()},
            "described": admin.describe_groups([group])[group],
            "offsets": {
                (tp.topic, tp.partition): meta.offset
                for tp, meta in admin.list_group_offsets({group: None})[group].items()
            },
            "deleted": dict(admin.delete_groups([group])),
        }
    finally:
        admin.close()


async def test_kafka_python_admin_lists_describes_reads_and_deletes(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = await committed_group(runtime, topic, {1: 3})
    member = await runtime.heartbeat(
        messages.HeartbeatRequest(
            group_id=group,
            member_id=uuid.uuid4().hex,
            member_epoch=0,
            rebalance_timeout_ms=30_000,
            subscribed_topic_names=(topic,),
            owned_partitions={},
            client_id="app-1",
        )
    )
    seen = await asyncio.to_thread(kafka_python_tour, open_listener.port, group)
    listed = seen["listed"][group]
    assert (listed["protocol_type"], listed["group_type"]) == ("consumer", "consumer")
    described = seen["described"]
    assert (described["group_state"], described["protocol_type"]) == ("Stable", "consumer")
    (described_member,) = described["members"]
    assert described_member["member_id"] == member.member_id
    assert described_member["client_id"] == "app-1"
    # kafka-python decoded our ConsumerProtocol bytes (subscription and assignment).
    assert list(described_member["member_metadata"]["topics"]) == [topic]
    assigned = described_member["member_assignment"]["assigned_partitions"]
    assert [(entry["topic"], sorted(entry["partitions"])) for entry in assigned] == [
        (topic, [0, 1, 2])
    ]
    assert seen["offsets"] == {(topic, 1): 3}
    # Kafka refuses to delete a group with members (NON_EMPTY_GROUP).
    assert "NonEmptyGroup" in str(seen["deleted"][group])

    await runtime.heartbeat(
        messages.HeartbeatRequest(group_id=group, member_id=member.member_id, member_epoch=-1)
    )
    again = await asyncio.to_thread(kafka_python_tour, open_listener.port, group)
    assert again["deleted"][group] == "OK"
    assert group not in await runtime.list_groups()


async def test_a_managed_group_is_not_deleted_over_the_wire(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    group = await committed_group(runtime, topic, {0: 1})
    await runtime.claim_group(
        messages.ClaimGroupRequest(group, messages.GroupOwner("shop", "orders", "uid-1"))
    )
    seen = await asyncio.to_thread(kafka_python_tour, open_listener.port, group)
    assert "GroupAuthorizationFailed" in str(seen["deleted"][group])
    assert group in await runtime.list_groups()
    assert seen["offsets"] == {(topic, 0): 1}


def kafka_python_with_token(port: int, username: str, password: str) -> dict[str, Any]:
    admin = kafka_python_admin(
        port,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=username,
        sasl_plain_password=password,
    )
    try:
        own = admin.list_group_offsets({username: None})[username]
        try:
            admin.list_group_offsets({"group-b": None})
            other = "allowed"
        except kafka_errors.GroupAuthorizationFailedError:
            other = "GROUP_AUTHORIZATION_FAILED"
        return {
            "own": {(tp.topic, tp.partition): o.offset for tp, o in own.items()},
            "other": other,
            "listed": {entry["group_id"] for entry in admin.list_groups()},
        }
    finally:
        admin.close()


async def test_kafka_python_admin_with_a_group_token(
    secured_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    for group in ("group-a", "group-b"):
        await runtime.commit_offsets(
            messages.OffsetCommitRequest(
                group_id=group,
                member_id="",
                member_epoch=-1,
                offsets={(topic, 0): messages.CommitOffset(7)},
            )
        )
    seen = await asyncio.to_thread(
        kafka_python_with_token, secured_listener.port, "group-a", TOKENS["group-a"]
    )
    assert seen["own"] == {(topic, 0): 7}
    assert seen["other"] == "GROUP_AUTHORIZATION_FAILED"
    # A connection sees the groups of its own token only.
    assert "group-b" not in seen["listed"]
    assert "group-a" in seen["listed"]
