"""The state topic's settings: create it when missing, refuse it when it is set up wrongly.

Kafka's ``__consumer_offsets`` is compacted and its partition count must never change,
because a group's partition is derived from that count. A topic with another partition
count, a delete policy or weaker durability would silently lose or misplace state, so it is
reported (``StateTopicMisconfigured``) and never used. Blocking calls: run in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    try:
        topic = admin.list_topics(timeout=timeout_s).topics[settings.name]
        resource = ConfigResource(ResourceType.TOPIC, settings.name)
        configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
    except KafkaException as error:
        raise errors.StateTopicUnavailable(
            f"cannot describe state topic {settings.name!r}: {error}"
        ) from error
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
