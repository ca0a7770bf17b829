"""Test helpers for the state topic: write raw logs, compact them as Kafka's cleaner would."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterable, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kafka_group_records import codec, records

_names = itertools.count()


def unique_topic(prefix: str = "state") -> str:
    return f"{prefix}-{next(_names)}"


def encode(log: Iterable[records.Record]) -> list[tuple[bytes, bytes | None]]:
    return [codec.encode_record(record) for record in log]


def produce(
    bootstrap: str, topic: str, partition: int, log: Sequence[tuple[bytes, bytes | None]]
) -> None:
    """Produce ``log`` in order (in batches, as a real writer would) and wait for acks."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    failures: list[object] = []
    for key, value in log:
        producer.produce(
            topic,
            value,
            key,
            partition=partition,
            on_delivery=lambda error, _message: failures.append(error) if error else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []


def compact_like_kafka(
    log: Sequence[tuple[bytes, bytes | None]], *, keep_tombstones: bool
) -> list[tuple[bytes, bytes | None]]:
    """Kafka's cleaner: keep the last record of each key at its place in the log; tombstones
    survive until ``delete.retention.ms`` passes (``keep_tombstones``), then vanish."""
    last = {key: index for index, (key, _) in enumerate(log)}
    return [
        (key, value)
        for index, (key, value) in enumerate(log)
        if last[key] == index and (keep_tombstones or value is not None)
    ]


def read_partition(bootstrap: str, topic: str, partition: int) -> list[tuple[bytes, bytes | None]]:
    """Every record of the partition, in order, up to a marker this call appends first."""
    nonce = uuid.uuid4().hex
    marker = codec.encode_record(
        records.Record(records.LoadMarkerKey(), records.LoadMarkerValue(nonce, 0))
    )
    produce(bootstrap, topic, partition, [marker])
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    log: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.2):
                assert message.error() is None, message.error()
                pair = (message.key(), message.value())
                if pair == marker:
                    return log
                log.append(pair)  # type: ignore[arg-type]
    finally:
        consumer.close()
    raise AssertionError(f"marker never read back from {topic}[{partition}]")
