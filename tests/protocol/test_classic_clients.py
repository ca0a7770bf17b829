"""Unmodified classic-protocol clients through the gateway, against the embedded broker and
the coordinator listener: kafka-python (classic), confluent-kafka classic with ``range``
(eager) and with ``cooperative-sticky``. Each joins, consumes every record from where the
group committed, and commits to the coordinator."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer
from kafka import KafkaConsumer

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.test_kip848 import topic_id
from tests.support import topics

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

PARTITIONS, PER_PARTITION = 3, 5


@pytest.fixture(scope="module")
def classic_topic(broker: embedded.EmbeddedBroker) -> str:
    return topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION)


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def open_gateway(
    broker: embedded.EmbeddedBroker, open_listener: protocol_listener.Listener
) -> AsyncIterator[protocol_gateway.Gateway]:
    """A gateway in front of the listener without tokens: any group id joins."""
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=protocol_gateway.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", open_listener.port),
            port=0,
        )
    )
    await served.start()
    yield served
    await served.stop()


def expected_records(committed: dict[int, int]) -> list[tuple[int, int, bytes]]:
    return sorted(
        (partition, offset, f"m{offset}".encode())
        for partition in range(PARTITIONS)
        for offset in range(committed.get(partition, 0), PER_PARTITION)
    )


def consume_kafka_python(port: int, group: str, topic: str, expected: int) -> list[Any]:
    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}",
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=10_000,
        heartbeat_interval_ms=500,
    )
    records: list[tuple[int, int, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records) < expected:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend((m.partition, m.offset, m.value) for m in batch)
        end = time.monotonic() + 1
        while time.monotonic() < end:
            for batch in consumer.poll(timeout_ms=100).values():
                records.extend((m.partition, m.offset, m.value) for m in batch)
        consumer.commit()
    finally:
        consumer.close()
    return records


def consume_confluent_classic(
    port: int, group: str, topic: str, expected: int, strategy: str
) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": group,
            "group.protocol": "classic",
            "partition.assignment.strategy": strategy,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    records: list[tuple[Any, ...]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records) < expected:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.partition(), message.offset(), message.value()))
        end = time.monotonic() + 1
        while time.monotonic() < end:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                records.append((message.partition(), message.offset(), message.value()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return records


async def committed(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, topic: str
) -> dict[int, int]:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return {p: c.offset for (t, p), c in fetched.offsets.items() if t == topic}


@pytest.mark.parametrize(
    "client",
    ["kafka-python", "confluent-range", "confluent-cooperative-sticky"],
)
async def test_classic_client_joins_consumes_from_committed_and_commits(
    client: str,
    open_gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    classic_topic: str,
) -> None:
    await topic_id(runtime, classic_topic)
    group = f"classic-{client}-{uuid.uuid4().hex[:6]}"
    # Partition 1 resumes after its committed offset; the others start from the earliest.
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=group,
            member_id="",
            member_epoch=-1,
            offsets={(classic_topic, 1): messages.CommitOffset(3)},
        )
    )
    expected = expected_records({1: 3})
    if client == "kafka-python":
        records = await asyncio.to_thread(
            consume_kafka_python, open_gateway.port, group, classic_topic, len(expected)
        )
    else:
        strategy = client.removeprefix("confluent-")
        records = await asyncio.to_thread(
            consume_confluent_classic,
            open_gateway.port,
            group,
            classic_topic,
            len(expected),
            strategy,
        )
    assert sorted(records) == expected
    # The commit reached the coordinator, and the member left on close.
    assert await committed(runtime, group, classic_topic) == dict.fromkeys(
        range(PARTITIONS), PER_PARTITION
    )
    described = await runtime.describe_group(group)
    assert described.members == ()
