"""The brokers' own (native) consumer groups, read and written with Kafka's admin client."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

# The group coordinator is loading or moving: ask again.
_NOT_YET = {
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
}


def offsets(bootstrap: str, group_id: str) -> dict[tuple[str, int], int]:
    """The native group's committed offsets, as ``kafka-consumer-groups.sh`` would show."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # Described first: librdkafka's admin client (2.16) crashes the process when an
    # OffsetFetch answer says COORDINATOR_LOAD_IN_PROGRESS, as Apache Kafka's does while it
    # loads its groups after a restart; DescribeGroups raises that error instead.
    admin.describe_consumer_groups([group_id])[group_id].result(10)
    answer = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)])
    listed = answer[group_id].result(10)
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in listed.topic_partitions or ()
        if tp.offset >= 0 and tp.error is None
    }


def commit(bootstrap: str, group_id: str, wanted: Mapping[tuple[str, int], int]) -> None:
    """A member-less commit into the native group, as a stock tool resets offsets."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(
        group_id,
        [TopicPartition(topic, partition, offset) for (topic, partition), offset in wanted.items()],
    )
    answered = admin.alter_consumer_group_offsets([request])[group_id].result(10)
    failed = [tp for tp in answered.topic_partitions or () if tp.error is not None]
    assert not failed, failed


async def wait_for_offsets(
    bootstrap: str, group_id: str, expected: Mapping[tuple[str, int], int], within: float = 30.0
) -> None:
    """Until the native group carries exactly ``expected``."""
    deadline = time.monotonic() + within
    seen: dict[tuple[str, int], int] | str = {}
    while time.monotonic() < deadline:
        try:
            seen = await asyncio.to_thread(offsets, bootstrap, group_id)
        except KafkaException as error:
            # Apache Kafka answers COORDINATOR_LOAD_IN_PROGRESS while it loads its groups
            # (after a restart): retriable, as a tool would retry.
            if error.args[0].code() not in _NOT_YET:
                raise
            seen = error.args[0].str()
        if seen == dict(expected):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"native group {group_id} holds {seen}, not {dict(expected)}")


@contextlib.contextmanager
def active_member(
    bootstrap: str, group_id: str, topic: str, within: float = 60.0
) -> Iterator[None]:
    """A plain consumer of ``group_id`` subscribed to ``topic``, polling (so the brokers count
    it active) from the time it has an assignment until the block ends."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group_id, "enable.auto.commit": False}
    )
    stop = threading.Event()
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + within
        while not consumer.assignment():
            assert time.monotonic() < deadline, f"{group_id}: no assignment within {within} s"
            consumer.poll(0.2)

        def keep_polling() -> None:
            while not stop.is_set():
                consumer.poll(0.2)

        poller = threading.Thread(target=keep_polling, daemon=True)
        poller.start()
        try:
            yield
        finally:
            stop.set()
            poller.join(30)
    finally:
        consumer.close()
