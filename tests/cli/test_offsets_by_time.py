"""Offsets by time as ``kgo groups reset-offsets --to-datetime`` plans them, on the shared
``broker`` fixture (every broker kind the suite runs on): Kafka's ``ListOffsets`` semantics,
whatever the broker answers.

Kafka answers the first offset whose record's timestamp is at or after the time, and none
(so the tool takes the log end) when no record is that new; the embedded broker answers 0
for every time. The plan must be the same on both.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_group_operator.commands import kafka_lookup
from kafka_group_operator.embedded import broker as embedded

pytestmark = pytest.mark.broker

RECORDS = 10


@pytest.fixture(scope="module")
def timed(broker: embedded.EmbeddedBroker) -> tuple[str, int]:
    """A topic of two partitions: ten records each, stamped one second apart from a base an
    hour ago (partition 1's a second later than partition 0's)."""
    name = f"timed-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(15)
    base = time.time_ns() // 1_000_000 - 3_600_000
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "batch.num.messages": 1, "enable.idempotence": True}
    )
    for partition in (0, 1):
        for index in range(RECORDS):
            producer.produce(
                name, b"m", partition=partition, timestamp=base + 1000 * (index + partition)
            )
    assert producer.flush(30) == 0
    return name, base


@pytest.mark.parametrize(
    ("after_ms", "expected"),
    [
        (-60_000, {0: 0, 1: 0}),  # before every record: the log start
        (0, {0: 0, 1: 0}),
        (4_500, {0: 5, 1: 4}),  # between two records: the later one
        (9_000, {0: 9, 1: 8}),  # exactly a record's time: that record
        (9_001, {0: None, 1: 9}),  # newer than partition 0's newest: the log end
        (3_000_000, {0: None, 1: None}),  # newer than every record, still in the past
        (7_200_000, {0: None, 1: None}),  # in the future: never asked, the log end
    ],
)
def test_the_offset_for_a_time_is_kafkas_whatever_the_broker_answers(
    broker: embedded.EmbeddedBroker,
    timed: tuple[str, int],
    after_ms: int,
    expected: dict[int, int | None],
) -> None:
    topic, base = timed
    with kafka_lookup.lookup(broker.bootstrap) as kafka:
        bounds = kafka.bounds([(topic, 0), (topic, 1)])
        assert bounds == {(topic, 0): (0, RECORDS), (topic, 1): (0, RECORDS)}
        found = kafka.offsets_for_time(bounds, base + after_ms)
    assert found == {(topic, p): offset for p, offset in expected.items()}
