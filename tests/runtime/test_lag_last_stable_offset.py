"""Lag against the last stable offset: a transaction still open is not lag yet.

A partition holds 5 committed transactional records, a commit marker, then 3 records of a
transaction still open: its high watermark is 9, its last stable offset 6 (what a
``read_committed`` consumer reaches). The coordinator's lag (status, metrics, lag verdicts)
and ``kgo groups describe``'s log end both count to the last stable offset; once the
transaction commits, to the new end after its marker.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_group_operator.commands import kafka_lookup
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from tests.runtime import logs
from tests.support import groups, topics

pytestmark = pytest.mark.broker


async def _lag(runtime: coordinator_runtime.CoordinatorRuntime, group: str, wanted: int) -> int:
    """The group's lag on partition 0 once the background refresh shows ``wanted``."""
    lag: dict[tuple[str, int], int] = {}
    for _ in range(200):
        lag = (await runtime.group_lag_report(group)).lag
        if list(lag.values()) == [wanted]:
            return wanted
        await asyncio.sleep(0.1)
    raise AssertionError(f"lag of {group} is {lag}, not {wanted}")


@pytest.mark.tansu_deviation(
    "its high watermark is wrong after a multi-record batch (7, not 9, after the open "
    "transaction's 3 records)"
)
async def test_lag_counts_to_the_last_stable_offset(broker: embedded.Broker) -> None:
    topic = topics.create_topic(broker.bootstrap, 1)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": f"lag-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(5):
        producer.produce(topic, b"committed", partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for _ in range(3):
        producer.produce(topic, b"open", partition=0)
    assert producer.flush(30) == 0
    # The brokers' view: high watermark 9, last stable offset 6.
    reader = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "lag-reader",
            "isolation.level": "read_uncommitted",
        }
    )
    assert reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1] == 9
    reader.close()

    config = coordinator_runtime.RuntimeConfig(
        broker.bootstrap,
        topic=logs.unique_topic("lag-state"),
        partitions=1,
        metadata_interval_ms=200,
    )
    async with groups.running(config) as runtime:
        await runtime.commit_offsets(
            messages.OffsetCommitRequest(
                "lagging", "", messages.LEAVE_EPOCH, {(topic, 0): messages.CommitOffset(2)}
            )
        )
        assert await _lag(runtime, "lagging", 6 - 2)
        with kafka_lookup.lookup(broker.bootstrap) as lookup:
            assert lookup.bounds([(topic, 0)])[(topic, 0)][1] == 6
        producer.commit_transaction(30)
        # Committed: 5 + marker + 3 + marker.
        assert await _lag(runtime, "lagging", 10 - 2)
        with kafka_lookup.lookup(broker.bootstrap) as lookup:
            assert lookup.bounds([(topic, 0)])[(topic, 0)][1] == 10
