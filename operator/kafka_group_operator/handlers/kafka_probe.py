"""Checks a ConsumerGroup's Kafka side before its consumers are started or its offsets reset.

Answers "are the bootstrap servers reachable, and do the subscribed topics exist?" (and "how
many partitions has each topic?") with one metadata request, so that a group that cannot work
gets a clear Ready=False reason (``KafkaUnreachable``, ``UnknownTopic``) instead of pods that
crash-loop.

Each probe has its own short-lived admin client, destroyed when the probe ends. librdkafka's
own log is off: it would repeat, per reconnect attempt and on stderr, the failure the probe
already reports in the condition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kafka_group_operator.specs import errors

# librdkafka's syslog level: 0 logs nothing (the default, 6, logs every failed connect).
_QUIET = {"log_level": 0, "log.connection.close": False}


def topic_partitions(
    bootstrap_servers: str, kafka_config: Mapping[str, str], timeout: float
) -> dict[str, int]:
    """Every readable topic of the cluster and its number of partitions (blocking)."""
    admin = AdminClient(
        {
            **kafka_config,
            **_QUIET,
            "bootstrap.servers": bootstrap_servers,
            "socket.timeout.ms": 5000,
        }
    )
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as error:
        failure: str | None = str(error.args[0])
    else:
        failure = None
    # AdminClient has no close(): dropping its only reference destroys it (threads,
    # connections) now. The error is raised only after that, and without the client's error
    # chained to it: its traceback would hold the client, reconnecting, for as long as kopf
    # keeps the error.
    del admin
    if failure is not None:
        raise errors.KafkaUnreachable(f"cannot reach Kafka at {bootstrap_servers}: {failure}")
    return {
        name: len(topic.partitions)
        for name, topic in metadata.topics.items()
        if topic.error is None
    }


async def partition_counts(
    bootstrap_servers: str, kafka_config: Mapping[str, str], wait_seconds: float = 10.0
) -> dict[str, int]:
    """``topic -> partitions`` of the cluster; ``KafkaUnreachable`` when it does not answer."""
    return await asyncio.to_thread(topic_partitions, bootstrap_servers, kafka_config, wait_seconds)


async def check_topics(
    bootstrap_servers: str,
    kafka_config: Mapping[str, str],
    topics: Iterable[str],
    wait_seconds: float = 10.0,
) -> None:
    """Raise ``KafkaUnreachable`` or ``UnknownTopic`` when the group cannot consume."""
    known = await partition_counts(bootstrap_servers, kafka_config, wait_seconds)
    missing = [topic for topic in topics if topic not in known]
    if missing:
        raise errors.UnknownTopic(
            f"topic(s) {', '.join(sorted(missing))} do not exist on {bootstrap_servers}"
        )
