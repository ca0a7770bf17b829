"""The state topic's settings: create it when missing, refuse it when it is set up wrongly.

Kafka's ``__consumer_offsets`` is compacted and its partition count must never change,
because a group's partition is derived from that count. A topic with another partition
count, a delete policy or weaker durability would silently lose or misplace state, so it is
reported (``StateTopicMisconfigured``) and never used. Blocking calls: run in a thread.

A topic that was just created, by this process or another starting at the same moment, is
not in every broker's metadata yet: Kafka acknowledges the creation once its controller has
it, and each broker applies it to the metadata it answers with a moment later. The check
waits for it (up to its time-out) instead of reading it as missing, or as a topic of no
partitions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, not in __all__
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from kafka_group_operator.runtime import errors

# Kafka's default delete.retention.ms: how long a cleaned tombstone stays readable.
KAFKA_DELETE_RETENTION_MS = 24 * 3600 * 1000
# The state topic's, when the operator creates it: a week, so that a checkpoint of the daily
# compaction is always younger than the tombstones after it (see checkpoints.usable_age_ms).
DELETE_RETENTION_MS = 7 * 24 * 3600 * 1000
# How long the check waits between two looks for a topic the brokers do not show yet.
VISIBLE_RETRY_S = 0.1


@dataclass(frozen=True, slots=True)
class TopicSettings:
    name: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int


def ensure_state_topic(admin: AdminClient, settings: TopicSettings, timeout_s: float) -> bool:
    """Create the topic if it is missing, else check it; True when this call created it."""
    # Metadata for all topics: asking for one by name makes some brokers auto-create it.
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise errors.StateTopicUnavailable(f"cannot reach the brokers: {error}") from error
    described = metadata.topics.get(settings.name)
    exists = described is not None and described.error is None
    if not exists:
        created = _create(admin, settings, timeout_s)
        if created:
            return True
    check_state_topic(admin, settings, timeout_s)
    return False


def _create(admin: AdminClient, settings: TopicSettings, timeout_s: float) -> bool:
    new_topic = NewTopic(
        settings.name,
        settings.partitions,
        settings.replication_factor,
        config={
            "cleanup.policy": "compact",
            "min.insync.replicas": str(settings.min_insync_replicas),
            "delete.retention.ms": str(DELETE_RETENTION_MS),
        },
    )
    future = admin.create_topics([new_topic], operation_timeout=timeout_s)[settings.name]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as error:
        kafka_error: KafkaError = error.args[0]
        if kafka_error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False  # another process created it meanwhile; check it like any other
        raise errors.StateTopicUnavailable(
            f"cannot create state topic {settings.name!r}: {kafka_error.str()}"
        ) from error
    return True


def check_state_topic(admin: AdminClient, settings: TopicSettings, timeout_s: float) -> None:
    """Raise ``StateTopicMisconfigured`` naming every setting that differs."""
    deadline = time.monotonic() + timeout_s
    topic = _visible_topic(admin, settings.name, deadline)
    configs = _topic_configs(admin, settings.name, deadline)
    problems = []
    if len(topic.partitions) != settings.partitions:
        problems.append(f"has {len(topic.partitions)} partitions, expected {settings.partitions}")
    replicas = {len(partition.replicas) for partition in topic.partitions.values()}
    if replicas != {settings.replication_factor}:
        problems.append(
            f"has replication factor {sorted(replicas)}, expected {settings.replication_factor}"
        )
    # A broker may leave out a config it holds at its default: Kafka's defaults are
    # cleanup.policy=delete and min.insync.replicas=1.
    policy = _config_value(configs, "cleanup.policy", "delete")
    if policy != "compact":
        problems.append(f"has cleanup.policy={policy}, expected compact")
    min_insync = _config_value(configs, "min.insync.replicas", "1")
    if min_insync != str(settings.min_insync_replicas):
        problems.append(
            f"has min.insync.replicas={min_insync}, expected {settings.min_insync_replicas}"
        )
    if problems:
        raise errors.StateTopicMisconfigured(
            f"state topic {settings.name!r} " + "; ".join(problems) + ": refusing to use it"
        )


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), VISIBLE_RETRY_S)


def _visible_topic(admin: AdminClient, name: str, deadline: float) -> Any:
    """The topic's metadata, once a broker shows it whole (no error); ``StateTopicUnavailable``
    if none does by ``deadline``."""
    while True:
        try:
            described = admin.list_topics(timeout=_remaining(deadline)).topics.get(name)
        except KafkaException as error:
            raise errors.StateTopicUnavailable(
                f"cannot describe state topic {name!r}: {error}"
            ) from error
        topic_error = None if described is None else described.error
        if described is not None and topic_error is None:
            return described
        if time.monotonic() >= deadline:
            why = "" if topic_error is None else f" ({topic_error.str()})"
            raise errors.StateTopicUnavailable(
                f"state topic {name!r} is not in the brokers' metadata yet{why}"
            )
        time.sleep(VISIBLE_RETRY_S)


def _topic_configs(admin: AdminClient, name: str, deadline: float) -> dict[str, Any]:
    """The topic's configs, asked again while the broker does not know the topic yet."""
    resource = ConfigResource(ResourceType.TOPIC, name)
    while True:
        try:
            configs: dict[str, Any] = admin.describe_configs([resource])[resource].result(
                timeout=_remaining(deadline)
            )
            return configs
        except KafkaException as error:
            code = error.args[0].code() if isinstance(error.args[0], KafkaError) else None
            if code != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() >= deadline:
                raise errors.StateTopicUnavailable(
                    f"cannot describe state topic {name!r}: {error}"
                ) from error
        time.sleep(VISIBLE_RETRY_S)


def _config_value(configs: dict[str, object], name: str, default: str) -> str:
    entry = configs.get(name)
    value = getattr(entry, "value", None)
    return default if value is None else str(value)


def delete_retention_ms(admin: AdminClient, name: str, timeout_s: float) -> int:
    """The topic's ``delete.retention.ms``: how long the cleaner keeps a tombstone once it
    has compacted the segment holding it (``StateTopicUnavailable`` when unreadable)."""
    resource = ConfigResource(ResourceType.TOPIC, name)
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
    except KafkaException as error:
        raise errors.StateTopicUnavailable(
            f"cannot describe state topic {name!r}: {error}"
        ) from error
    value = _config_value(configs, "delete.retention.ms", str(KAFKA_DELETE_RETENTION_MS))
    try:
        return int(value)
    except ValueError:
        raise errors.StateTopicUnavailable(
            f"state topic {name!r} has delete.retention.ms={value!r}"
        ) from None
