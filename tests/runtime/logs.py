"""Test helpers for the state topic: write raw logs, compact them as Kafka's cleaner would."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from confluent_kafka import Producer

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
