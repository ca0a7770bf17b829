"""The Kafka probe against an unreachable cluster and a real broker: its verdicts, its quiet,
and that no client outlives a probe."""

from __future__ import annotations

import os
import re

import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import kafka_probe
from kafka_group_operator.specs import errors
from tests.support import topics

pytestmark = [pytest.mark.kube]

UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1


def _threads() -> int:
    """Threads of this process, librdkafka's native ones included."""
    return len(os.listdir("/proc/self/task"))


def test_an_unreachable_cluster_is_reported_quietly_and_the_client_is_gone(
    capfd: pytest.CaptureFixture[str],
) -> None:
    before = _threads()
    with pytest.raises(errors.KafkaUnreachable) as caught:
        kafka_probe.topic_partitions(UNREACHABLE, {}, timeout=2.0)
    assert UNREACHABLE in caught.value.message
    # The error is kept (as kopf keeps a handler's error) and still no client runs on.
    assert _threads() <= before
    # librdkafka would print a line per failed connect on stderr. Only lines naming this
    # address count: clients of brokers that earlier tests in this process stopped may still
    # be reconnecting on the same stderr.
    assert not re.search(rf"{re.escape(UNREACHABLE)}\b", capfd.readouterr().err)


@pytest.mark.broker
async def test_partition_counts_and_unknown_topics(broker: embedded.EmbeddedBroker) -> None:
    topic = topics.create_topic(broker.bootstrap, 3)
    counts = await kafka_probe.partition_counts(broker.bootstrap, {}, 10.0)
    assert counts[topic] == 3
    await kafka_probe.check_topics(broker.bootstrap, {}, [topic], 10.0)
    with pytest.raises(errors.UnknownTopic, match="no-such-topic"):
        await kafka_probe.check_topics(broker.bootstrap, {}, [topic, "no-such-topic"], 10.0)
