"""Named constructors for every record the coordinator writes (``GroupCoordinatorRecordHelpers``).

Handlers build records only through these functions, and tests assert exact record lists
with the same helpers, so the shape of each record (field order, canonical sorting of
partitions) is decided in one place. The dataclasses themselves live in
``kafka_group_records.records``; this module only fills them in.

Assignments are ``{topic_id: frozenset(partitions)}`` inside the coordinator; in records they
become ``TopicPartitions`` sorted by topic id, partitions ascending, empty topics dropped, so
equal assignments always give equal records.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from kafka_group_operator.coordinator import messages
from kafka_group_records import records as schema

# topic id -> partitions; the coordinator's internal form of an assignment
TopicIdAssignment = Mapping[uuid.UUID, frozenset[int]]


def to_topic_partitions(assignment: TopicIdAssignment) -> tuple[schema.TopicPartitions, ...]:
    """The canonical record form of an assignment."""
    return tuple(
        schema.TopicPartitions(topic_id, tuple(sorted(partitions)))
        for topic_id, partitions in sorted(assignment.items())
        if partitions
    )


def from_topic_partitions(
    topic_partitions: Iterable[schema.TopicPartitions],
) -> dict[uuid.UUID, frozenset[int]]:
    return {tp.topic_id: frozenset(tp.partitions) for tp in topic_partitions if tp.partitions}


# ---------------------------------------------------------------------------------------
# Group-level records


def new_group_epoch_record(group_id: str, epoch: int) -> schema.Record:
    return schema.Record(
        schema.ConsumerGroupMetadataKey(group_id), schema.ConsumerGroupMetadataValue(epoch)
    )


def new_group_epoch_tombstone(group_id: str) -> schema.Record:
    return schema.Record(schema.ConsumerGroupMetadataKey(group_id), None)


def new_partition_metadata_record(
    group_id: str, topics: Iterable[schema.TopicMetadata]
) -> schema.Record:
    return schema.Record(
        schema.ConsumerGroupPartitionMetadataKey(group_id),
        schema.ConsumerGroupPartitionMetadataValue(
            tuple(sorted(topics, key=lambda topic: topic.topic_name))
        ),
    )


def new_partition_metadata_tombstone(group_id: str) -> schema.Record:
    return schema.Record(schema.ConsumerGroupPartitionMetadataKey(group_id), None)


def new_target_assignment_epoch_record(group_id: str, epoch: int) -> schema.Record:
    return schema.Record(
        schema.ConsumerGroupTargetAssignmentMetadataKey(group_id),
        schema.ConsumerGroupTargetAssignmentMetadataValue(epoch),
    )


def new_target_assignment_epoch_tombstone(group_id: str) -> schema.Record:
    return schema.Record(schema.ConsumerGroupTargetAssignmentMetadataKey(group_id), None)


def new_group_config_record(group_id: str, config: schema.GroupConfigValue) -> schema.Record:
    return schema.Record(schema.GroupConfigKey(group_id), config)


def new_group_config_tombstone(group_id: str) -> schema.Record:
    return schema.Record(schema.GroupConfigKey(group_id), None)


def new_group_lifecycle_record(group_id: str, empty_since_ms: int) -> schema.Record:
    return schema.Record(
        schema.GroupLifecycleKey(group_id), schema.GroupLifecycleValue(empty_since_ms)
    )


def new_group_lifecycle_tombstone(group_id: str) -> schema.Record:
    return schema.Record(schema.GroupLifecycleKey(group_id), None)


def group_config_from_settings(settings: messages.GroupSettings) -> schema.GroupConfigValue:
    return schema.GroupConfigValue(
        assignor=settings.assignor,
        session_timeout_ms=settings.session_timeout_ms,
        rebalance_timeout_ms=settings.rebalance_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        offsets_retention_ms=settings.offsets_retention_ms,
        assignment_paused=settings.assignment_paused,
        topics=tuple(settings.topics),
        client_assignment=settings.client_assignment,
    )


# ---------------------------------------------------------------------------------------
# Member records


def new_member_subscription_record(
    group_id: str, member_id: str, subscription: schema.ConsumerGroupMemberMetadataValue
) -> schema.Record:
    return schema.Record(schema.ConsumerGroupMemberMetadataKey(group_id, member_id), subscription)


def new_member_subscription_tombstone(group_id: str, member_id: str) -> schema.Record:
    return schema.Record(schema.ConsumerGroupMemberMetadataKey(group_id, member_id), None)


def new_target_assignment_record(
    group_id: str, member_id: str, assignment: TopicIdAssignment
) -> schema.Record:
    return schema.Record(
        schema.ConsumerGroupTargetAssignmentMemberKey(group_id, member_id),
        schema.ConsumerGroupTargetAssignmentMemberValue(to_topic_partitions(assignment)),
    )


def new_target_assignment_tombstone(group_id: str, member_id: str) -> schema.Record:
    return schema.Record(schema.ConsumerGroupTargetAssignmentMemberKey(group_id, member_id), None)


def new_current_assignment_record(
    group_id: str,
    member_id: str,
    *,
    member_epoch: int,
    previous_member_epoch: int,
    state: int,
    assigned: TopicIdAssignment,
    pending_revocation: TopicIdAssignment,
) -> schema.Record:
    return schema.Record(
        schema.ConsumerGroupCurrentMemberAssignmentKey(group_id, member_id),
        schema.ConsumerGroupCurrentMemberAssignmentValue(
            member_epoch=member_epoch,
            previous_member_epoch=previous_member_epoch,
            state=int(state),
            assigned_partitions=to_topic_partitions(assigned),
            partitions_pending_revocation=to_topic_partitions(pending_revocation),
        ),
    )


def new_current_assignment_tombstone(group_id: str, member_id: str) -> schema.Record:
    return schema.Record(schema.ConsumerGroupCurrentMemberAssignmentKey(group_id, member_id), None)


def new_member_tombstones(group_id: str, member_id: str) -> list[schema.Record]:
    """Everything a removed member leaves behind, in Kafka's order.

    The current assignment goes first so that its partitions are released before anything
    else happens; the subscription goes last because it is what makes the member exist.
    """
    return [
        new_current_assignment_tombstone(group_id, member_id),
        new_target_assignment_tombstone(group_id, member_id),
        new_member_subscription_tombstone(group_id, member_id),
    ]


# ---------------------------------------------------------------------------------------
# Offsets


def new_offset_commit_record(
    group_id: str,
    topic: str,
    partition: int,
    commit: messages.CommitOffset,
    commit_timestamp_ms: int,
) -> schema.Record:
    return schema.Record(
        schema.OffsetCommitKey(group_id, topic, partition),
        schema.OffsetCommitValue(
            offset=commit.offset,
            leader_epoch=commit.leader_epoch,
            metadata=commit.metadata,
            commit_timestamp=commit_timestamp_ms,
        ),
    )


def new_offset_commit_tombstone(group_id: str, topic: str, partition: int) -> schema.Record:
    return schema.Record(schema.OffsetCommitKey(group_id, topic, partition), None)


# ---------------------------------------------------------------------------------------
# Classic groups


def new_group_metadata_record(group_id: str, value: schema.GroupMetadataValue) -> schema.Record:
    return schema.Record(schema.GroupMetadataKey(group_id), value)


def new_group_metadata_tombstone(group_id: str) -> schema.Record:
    return schema.Record(schema.GroupMetadataKey(group_id), None)
