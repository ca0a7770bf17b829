"""Reads the coordinator's state topic into a Spark frame of ``columns.STATE_RECORD_DDL`` rows.

The frame is ``spark.range(n)`` cut into one Spark task per offset range (a state partition,
or a slice of a long one: ``split_ranges``), mapped by ``mapInArrow`` through a
``RangeReader``: each task reads its range with confluent-kafka, decodes it with the shared
codec and hands Arrow record batches over, so rows cross from Python to the JVM in columns
rather than one by one.

Not a Spark Python data source: one of those costs a job three more Python workers before its
first record (looking data sources up, creating the source, planning its partitions), each
started one after the other, where ``mapInArrow`` starts only the one that reads. The bounds
are fixed by the caller (a read fence), so there is nothing to plan on an executor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka_group_jobs import columns, decoding
from kafka_group_records import codec

if TYPE_CHECKING:  # this module is imported by every reading task: no pyspark there
    from pyspark.sql import DataFrame, SparkSession

ARROW_BATCH_ROWS = 50_000
# The most newest-commit rows a reading task holds before it hands them over (``read``'s
# ``commits_of``): about 100 MB at 0.5 kB a row, whatever its range's length.
NEWEST_HELD_ROWS = 200_000


@dataclass(frozen=True)
class OffsetRange:
    """One Spark task: offsets ``[start, end)`` of one state-topic partition."""

    partition: int
    start: int
    end: int


def split_ranges(
    starts: dict[int, int], ends: dict[int, int], max_records: int
) -> list[OffsetRange]:
    """Cuts each partition's ``[start, end)`` into ranges of at most ``max_records`` offsets."""
    ranges = []
    for partition in sorted(ends):
        start, end = starts.get(partition, 0), ends[partition]
        for low in range(start, end, max_records):
            ranges.append(OffsetRange(partition, low, min(low + max_records, end)))
    return ranges


def read(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    ranges: list[OffsetRange],
    kafka_config: Mapping[str, str] | None = None,
    commits_of: str | None = None,
    as_of_ms: int | None = None,
) -> DataFrame:
    """The records of ``ranges``, one Spark task per range (task ``i`` reads ``ranges[i]``).

    With ``commits_of``, only that group's newest offset commit (a tombstone included) of
    each topic-partition in each range, appended at or before ``as_of_ms`` when it is given:
    what ``transforms.group_offsets`` keeps of the range, which is all a snapshot or a restore
    needs, and it reaches the same answer from these rows as from every commit (the newest of
    the ranges' newest is the newest). The other groups' records are passed over by their
    key's first bytes, neither decoded nor handed to Spark, and another group's record this
    version cannot read (a newer value version, a key cut short) no longer fails the job;
    compaction, which reads every record, still fails on one. The superseded commits are
    decoded (the newest is known only by reading on) but not handed to Spark: each row
    Spark takes costs it more than the decoding did, and a real group commits the same few
    partitions over and over.

    Nothing is read until an action runs; every action reads the same ranges.
    """
    # Spark needs at least one partition, even for an empty topic.
    tasks = ranges or [OffsetRange(0, 0, 0)]
    prefixes = () if commits_of is None else codec.offset_commit_key_prefixes(commits_of)
    reader = RangeReader(
        bootstrap, topic, dict(kafka_config or {}), tuple(tasks), prefixes, as_of_ms
    )
    indexes = spark.range(0, len(tasks), 1, numPartitions=len(tasks))
    return indexes.mapInArrow(reader, columns.STATE_RECORD_DDL)


@dataclass(frozen=True)
class RangeReader:
    """The function ``mapInArrow`` runs in each task: its input is the range's index."""

    bootstrap: str
    topic: str
    kafka_config: dict[str, str]
    ranges: tuple[OffsetRange, ...]
    # Keys to keep by their first bytes (``read``'s ``commits_of``); empty: every record.
    # With prefixes, only the newest commit of each topic-partition is handed over.
    key_prefixes: tuple[bytes, ...] = ()
    as_of_ms: int | None = None

    def __call__(self, indexes: Iterator[Any]) -> Iterator[Any]:
        for batch in indexes:
            for index in batch.column(0).to_pylist():
                yield from self.read_range(self.ranges[index])

    def read_range(self, offsets: OffsetRange) -> Iterator[Any]:
        """Arrow record batches of ``STATE_RECORD_DDL`` holding the range's records."""
        # Imported here: only the tasks that read need them.
        import pyarrow as pa
        from confluent_kafka import Consumer

        from kafka_group_jobs import topics

        if offsets.end <= offsets.start:
            return
        schema = arrow_schema(pa)
        consumer = Consumer(topics.reader_config(self.bootstrap, self.kafka_config))
        decode = decoding.decode_row
        partition = offsets.partition
        prefixes = self.key_prefixes
        rows: list[columns.Row] = []
        # With prefixes: the newest commit row of each topic-partition so far, in the order
        # first seen (offsets only grow within the range, so the last one read is the newest).
        newest: dict[tuple[str | None, int | None], columns.Row] = {}
        as_of = self.as_of_ms
        # The first rows go over at once, so that Spark can start on them while the rest
        # is read; then batches of ARROW_BATCH_ROWS (a read of every record: with prefixes,
        # the newest commits go over when the range is read, or when too many are held).
        handed = 0
        try:
            for batch in topics.read_range(
                consumer, self.topic, partition, offsets.start, offsets.end
            ):
                for message in batch:
                    key = message.key()
                    if prefixes and not (key and key.startswith(prefixes)):
                        continue
                    row = decode(
                        partition, message.offset(), message.timestamp()[1], key, message.value()
                    )
                    if not prefixes or row[columns.RECORD_TYPE] != columns.OFFSET_COMMIT:
                        rows.append(row)
                    elif as_of is None or row[columns.TIMESTAMP] <= as_of:
                        newest[row[columns.TOPIC], row[columns.TOPIC_PARTITION]] = row
                if len(newest) >= NEWEST_HELD_ROWS:
                    # A group with this many partitions: hand over what is held, so that a
                    # task's memory stays bounded (Spark's aggregate still finds the newest).
                    rows.extend(newest.values())
                    newest.clear()
                if rows and (len(rows) >= ARROW_BATCH_ROWS or not handed):
                    yield to_batch(pa, schema, rows)
                    handed += len(rows)
                    rows = []
            rows.extend(newest.values())
            if rows:
                yield from (
                    to_batch(pa, schema, rows[start : start + ARROW_BATCH_ROWS])
                    for start in range(0, len(rows), ARROW_BATCH_ROWS)
                )
        finally:
            consumer.close()


def arrow_schema(pa: Any) -> Any:
    """``STATE_RECORD_DDL`` as an Arrow schema (``pa``: pyarrow, imported by the caller)."""
    types = {"INT": pa.int32(), "BIGINT": pa.int64(), "BINARY": pa.binary(), "STRING": pa.string()}
    return pa.schema(
        [
            pa.field(name, types[kind])
            for name, kind in (field.split() for field in columns.STATE_RECORD_DDL.split(", "))
        ]
    )


def to_batch(pa: Any, schema: Any, rows: list[columns.Row]) -> Any:
    """Rows of ``decode_row`` as one Arrow record batch of ``schema``."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array(values, type=field.type)
            for values, field in zip(zip(*rows, strict=True), schema, strict=True)
        ],
        schema=schema,
    )
