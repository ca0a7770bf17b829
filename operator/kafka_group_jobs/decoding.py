"""Raw state-topic messages to rows of ``columns.STATE_RECORD_DDL``, through the shared codec.

Runs wherever messages are read: in the Spark tasks that read the state topic and in the
single-process benchmark peer, so both pay exactly the same decoding cost.
"""

from __future__ import annotations

from kafka_group_jobs import columns
from kafka_group_records import codec, records


def decode_row(
    partition: int, offset: int, timestamp: int, key: bytes, value: bytes | None
) -> columns.Row:
    """One state-topic message as a row of ``STATE_RECORD_DDL``.

    A key of a type this version does not know (a newer Kafka record, say) is kept as
    ``unknown`` with its bytes, so that compaction carries it through untouched.
    """
    try:
        record = codec.decode_record(key, value)
    except codec.UnknownRecordType:
        return (partition, offset, timestamp, key, value, columns.UNKNOWN) + (None,) * 9
    record_key, record_value = record.key, record.value
    group_id = records.group_of(record_key)
    topic = topic_partition = committed = epoch = metadata = committed_at = None
    retention = empty_since = None
    if isinstance(record_key, records.OffsetCommitKey):
        topic, topic_partition = record_key.topic, record_key.partition
        if isinstance(record_value, records.OffsetCommitValue):
            committed, epoch = record_value.offset, record_value.leader_epoch
            metadata, committed_at = record_value.metadata, record_value.commit_timestamp
    elif isinstance(record_value, records.GroupConfigValue):
        retention = record_value.offsets_retention_ms
    elif isinstance(record_value, records.GroupLifecycleValue):
        empty_since = record_value.empty_since_ms
    return (
        partition,
        offset,
        timestamp,
        key,
        value,
        columns.RECORD_TYPES.get(type(record_key), columns.UNKNOWN),
        group_id,
        topic,
        topic_partition,
        committed,
        epoch,
        metadata,
        committed_at,
        retention,
        empty_since,
    )
