"""The columnar shape of state-topic records, shared by the reader, the jobs and tests.

One row is one record of the coordinator's state topic: where it sits in the log
(``partition``, ``offset``, ``timestamp``), its raw bytes (``key`` identifies it for
compaction, ``value`` is null for a tombstone) and the decoded fields the jobs need, flattened
into nullable columns. Only offset commits, group settings and the group's empty-since time
are spelled out; every other record type travels as its bytes, which is all compaction needs.

``decoding`` fills these rows from raw messages. This module imports neither Spark nor a Kafka
client, nor the codec, so transforms and their tests depend on the shape alone.
"""

from __future__ import annotations

from typing import Any

from kafka_group_records import records

# The targets of a restore (its ``--to``), as ``transforms.requested_offsets`` computes them.
RESET_KINDS = ("earliest", "latest", "offset", "datetime", "duration", "shift-by", "snapshot")

# Spark DDL of a decoded state-topic record; the order matches ``decode_row``.
STATE_RECORD_DDL = ", ".join(
    (
        "partition INT",
        "offset BIGINT",
        "timestamp BIGINT",
        "key BINARY",
        "value BINARY",
        "record_type STRING",
        "group_id STRING",
        "topic STRING",
        "topic_partition INT",
        "committed_offset BIGINT",
        "leader_epoch INT",
        "metadata STRING",
        "commit_timestamp BIGINT",
        "offsets_retention_ms BIGINT",
        "empty_since_ms BIGINT",
    )
)
STATE_RECORD_COLUMNS = tuple(field.split()[0] for field in STATE_RECORD_DDL.split(", "))
# Where the reader finds the fields it looks at in a row.
TIMESTAMP = STATE_RECORD_COLUMNS.index("timestamp")
RECORD_TYPE = STATE_RECORD_COLUMNS.index("record_type")
TOPIC = STATE_RECORD_COLUMNS.index("topic")
TOPIC_PARTITION = STATE_RECORD_COLUMNS.index("topic_partition")

OFFSET_COMMIT = "offset_commit"
GROUP_CONFIG = "group_config"
GROUP_LIFECYCLE = "group_lifecycle"
GROUP_OWNER = "group_owner"
LOAD_MARKER = "load_marker"
UNKNOWN = "unknown"

# Record type names by key class: stable strings, because snapshots persist them.
RECORD_TYPES: dict[type[Any], str] = {
    records.OffsetCommitKey: OFFSET_COMMIT,
    records.GroupMetadataKey: "classic_group",
    records.ConsumerGroupMetadataKey: "group_metadata",
    records.ConsumerGroupPartitionMetadataKey: "partition_metadata",
    records.ConsumerGroupMemberMetadataKey: "member_metadata",
    records.ConsumerGroupTargetAssignmentMetadataKey: "target_assignment_metadata",
    records.ConsumerGroupTargetAssignmentMemberKey: "target_assignment_member",
    records.ConsumerGroupCurrentMemberAssignmentKey: "current_assignment",
    records.GroupConfigKey: GROUP_CONFIG,
    records.GroupLifecycleKey: GROUP_LIFECYCLE,
    records.GroupOwnerKey: GROUP_OWNER,
    records.LoadMarkerKey: LOAD_MARKER,
}

Row = tuple[Any, ...]
