"""Checks a ConsumerGroup's Kafka side before its consumers are started.

Answers "are the bootstrap servers reachable, and do the subscribed topics exist?" with one
metadata request, so that a group that cannot work gets a clear Ready=False reason
(``KafkaUnreachable``, ``UnknownTopic``) instead of pods that crash-loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kafka_group_operator.specs import errors


def _missing_topics(
    bootstrap_servers: str, kafka_config: Mapping[str, str], topics: Iterable[str], timeout: float
) -> list[str]:
    admin = AdminClient(
        {**kafka_config, "bootstrap.servers": bootstrap_servers, "socket.timeout.ms": 5000}
    )
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as error:
        raise errors.KafkaUnreachable(
            f"cannot reach Kafka at {bootstrap_servers}: {error.args[0]}"
        ) from error
    known = {name for name, topic in metadata.topics.items() if topic.error is None}
    return [topic for topic in topics if topic not in known]


async def check_topics(
    bootstrap_servers: str,
    kafka_config: Mapping[str, str],
    topics: Iterable[str],
    wait_seconds: float = 10.0,
) -> None:
    """Raise ``KafkaUnreachable`` or ``UnknownTopic`` when the group cannot consume."""
    missing = await asyncio.to_thread(
        _missing_topics, bootstrap_servers, kafka_config, list(topics), wait_seconds
    )
    if missing:
        raise errors.UnknownTopic(
            f"topic(s) {', '.join(sorted(missing))} do not exist on {bootstrap_servers}"
        )
