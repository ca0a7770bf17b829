"""What the state topic's readers rely on from the brokers' transactions, on both brokers.

A ``read_committed`` reader (a coordinator's load, the jobs' readers) reads to the last
stable offset: the first offset of the oldest transaction still open on the partition. A
transaction whose producer went away without ending it holds every such reader back until
the brokers end it, which Apache Kafka does once ``transaction.timeout.ms`` has passed (its
transaction coordinator aborts it: ``TransactionStateManager``'s timed-out transactions,
checked every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s).
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_group_operator.embedded import broker as embedded
from tests.support import topics

pytestmark = pytest.mark.broker

# Kafka aborts a timed-out transaction at its next check, at most 10 s (the default
# interval) after the timeout; a loaded machine gets twice as much again.
_ABORTED_WITHIN_S = 30.0


def _last_stable_offset(bootstrap: str, topic: str) -> int:
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"lso-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
        }
    )
    try:
        return int(reader.get_watermark_offsets(TopicPartition(topic, 0), 10, cached=False)[1])
    finally:
        reader.close()


def _committed_then_open(bootstrap: str, topic: str, timeout_ms: int) -> Producer:
    """One producer's 5 committed records and their marker (offsets 0-5), then another's
    transaction with 3 records left open (6-8); the second producer, still running."""
    committed = Producer({"bootstrap.servers": bootstrap, "transactional.id": uuid.uuid4().hex})
    committed.init_transactions(30)
    committed.begin_transaction()
    for _ in range(5):
        committed.produce(topic, b"committed", partition=0)
    committed.commit_transaction(30)
    left_open = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": uuid.uuid4().hex,
            "transaction.timeout.ms": timeout_ms,
        }
    )
    left_open.init_transactions(30)
    left_open.begin_transaction()
    for _ in range(3):
        left_open.produce(topic, b"open", partition=0)
    assert left_open.flush(30) == 0
    return left_open


@pytest.mark.tansu_deviation(
    "while any transaction is open its last stable offset is 0, not the open transaction's "
    "first offset"
)
def test_the_last_stable_offset_is_where_the_open_transaction_began(
    broker: embedded.Broker,
) -> None:
    topic = topics.create_topic(broker.bootstrap, 1)
    left_open = _committed_then_open(broker.bootstrap, topic, 60_000)
    try:
        assert _last_stable_offset(broker.bootstrap, topic) == 6
        left_open.commit_transaction(30)
        assert _last_stable_offset(broker.bootstrap, topic) == 10
    finally:
        del left_open


@pytest.mark.tansu_deviation(
    "it never aborts a transaction past its transaction.timeout.ms: read_committed readers "
    "wait on it for good (a coordinator's load among them)"
)
def test_a_transaction_left_open_past_its_timeout_is_aborted(broker: embedded.Broker) -> None:
    topic = topics.create_topic(broker.bootstrap, 1)
    left_open = _committed_then_open(broker.bootstrap, topic, 1000)
    try:
        # The producer stays, silent: nothing but the brokers' timeout ends its transaction.
        deadline = time.monotonic() + _ABORTED_WITHIN_S
        stable = _last_stable_offset(broker.bootstrap, topic)
        while stable < 9 and time.monotonic() < deadline:
            time.sleep(0.5)
            stable = _last_stable_offset(broker.bootstrap, topic)
        # Aborted: its 3 records and the abort marker are all stable, none readable.
        assert stable == 10
    finally:
        del left_open
