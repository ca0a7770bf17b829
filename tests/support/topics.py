"""Data topics for tests on the embedded broker, optionally filled with messages."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_group_operator.runtime import coordinator_runtime


def create_topic(bootstrap: str, partitions: int, messages_per_partition: int = 0) -> str:
    """A new uniquely named topic; message ``i`` of every partition is ``b"m<i>"``."""
    name = f"orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    wait_for_leaders(bootstrap, name, partitions)
    if messages_per_partition:
        produce(bootstrap, name, range(partitions), messages_per_partition)
    return name


def wait_for_leaders(bootstrap: str, topic: str, partitions: int, within: float = 30.0) -> None:
    """Until every partition of a topic just created has a leader: Apache Kafka answers
    CreateTopics before its brokers know the topic, and a first produce may fail meanwhile."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + within
    while True:
        described = admin.list_topics(topic, timeout=10).topics.get(topic)
        leaders = [] if described is None or described.error else described.partitions.values()
        if len(leaders) == partitions and all(p.leader >= 0 for p in leaders):
            return
        assert time.monotonic() < deadline, f"{topic} has no leader for every partition"
        time.sleep(0.05)


def produce(
    bootstrap: str, topic: str, partitions: Iterable[int], count: int, first: int = 0
) -> None:
    """Messages ``first`` to ``first + count - 1`` (``b"m<i>"``) to each of ``partitions``."""
    # One record per batch: the broker's high watermark is only right for those. Idempotent,
    # so that a record retried (a topic just created may not have its leader yet on Apache
    # Kafka) keeps its place: message i is at offset i.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "batch.num.messages": 1, "enable.idempotence": True}
    )
    for partition in partitions:
        for index in range(first, first + count):
            producer.produce(topic, f"m{index}".encode(), partition=partition)
    assert producer.flush(30) == 0


async def topic_id(runtime: coordinator_runtime.CoordinatorRuntime, topic: str) -> uuid.UUID:
    """The topic's id, once the coordinator's metadata knows it."""
    for _ in range(100):
        info = runtime.known_topics().get(topic)
        if info is not None and info.topic_id:
            return uuid.UUID(info.topic_id)
        await asyncio.sleep(0.1)
    raise AssertionError(f"no topic id for {topic}")
