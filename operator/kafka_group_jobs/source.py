"""A PySpark Python data source over the coordinator's state topic: ``format("kgo-state")``.

One input partition per state-topic partition and offset range, read in parallel by the
executors through confluent-kafka and decoded with the shared codec into the rows of
``columns.STATE_RECORD_DDL``. The reader yields Arrow record batches, so rows cross from
Python to the JVM in columns rather than one by one.

Options (all strings, as Spark passes them):

* ``bootstrap`` and ``topic`` (required); ``kafkaConfig``: JSON of extra librdkafka settings.
* ``endOffsets``: JSON ``{partition: end}``, exclusive. Jobs take a read fence once
  (``fence``) and pass its ends in, so that every action on the frame reads the same range;
  without it the reader reads up to the partitions' last stable offsets at planning time. The
  source only reads: it never appends a marker.
* ``startOffsets``: JSON ``{partition: start}`` (default: each partition's earliest), used to
  read only the tail after a compaction checkpoint.
* ``maxRecordsPerSplit``: split long partitions into ranges of at most this many offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from kafka_group_jobs import columns, decoding

DEFAULT_RECORDS_PER_SPLIT = 1_000_000
ARROW_BATCH_ROWS = 50_000


@dataclass(frozen=True)
class OffsetRange(InputPartition):
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


class StateTopicDataSource(DataSource):
    """Registered with ``spark.dataSource.register``; read with ``format("kgo-state")``."""

    @classmethod
    def name(cls) -> str:
        return "kgo-state"

    def schema(self) -> str:
        return columns.STATE_RECORD_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return StateTopicReader(dict(self.options))


class StateTopicReader(DataSourceReader):
    def __init__(self, given: Mapping[str, str]) -> None:
        # Spark hands data-source options over with lower-cased names (they are
        # case-insensitive): look every option up by its lower-cased name.
        options = {name.lower(): value for name, value in given.items()}
        if "bootstrap" not in options or "topic" not in options:
            raise ValueError("the kgo-state source needs the 'bootstrap' and 'topic' options")
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.kafka_config: dict[str, str] = json.loads(options.get("kafkaconfig", "{}"))
        self.end_offsets = _partition_offsets(options.get("endoffsets"))
        self.start_offsets = _partition_offsets(options.get("startoffsets"))
        self.max_records = int(options.get("maxrecordspersplit", DEFAULT_RECORDS_PER_SPLIT))

    def partitions(self) -> Sequence[InputPartition]:
        # Imported here: the executors that only read need no admin client.
        from kafka_group_jobs import topics

        ends = self.end_offsets
        if ends is None:
            count = topics.partition_count(self.bootstrap, self.topic, self.kafka_config)
            ends = topics.stable_ends(self.bootstrap, self.topic, range(count), self.kafka_config)
        starts = self.start_offsets
        if starts is None:
            starts = topics.earliest_offsets(self.bootstrap, self.topic, ends, self.kafka_config)
        ranges = split_ranges(starts, ends, self.max_records)
        # Spark needs at least one partition, even for an empty topic.
        return ranges or [OffsetRange(0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa
        from confluent_kafka import Consumer

        from kafka_group_jobs import topics

        assert isinstance(partition, OffsetRange)
        if partition.end <= partition.start:
            return
        arrow_schema = _arrow_schema(pa)
        consumer = Consumer(topics.reader_config(self.bootstrap, self.kafka_config))
        decode = decoding.decode_row
        rows: list[columns.Row] = []
        try:
            for batch in topics.read_range(
                consumer, self.topic, partition.partition, partition.start, partition.end
            ):
                for message in batch:
                    rows.append(
                        decode(
                            partition.partition,
                            message.offset(),
                            message.timestamp()[1],
                            message.key(),
                            message.value(),
                        )
                    )
                if len(rows) >= ARROW_BATCH_ROWS:
                    yield _to_batch(pa, arrow_schema, rows)
                    rows = []
            if rows:
                yield _to_batch(pa, arrow_schema, rows)
        finally:
            consumer.close()


def _partition_offsets(text: str | None) -> dict[int, int] | None:
    if text is None:
        return None
    return {int(partition): int(offset) for partition, offset in json.loads(text).items()}


def _arrow_schema(pa: Any) -> Any:
    types = {"INT": pa.int32(), "BIGINT": pa.int64(), "BINARY": pa.binary(), "STRING": pa.string()}
    return pa.schema(
        [
            pa.field(name, types[kind])
            for name, kind in (field.split() for field in columns.STATE_RECORD_DDL.split(", "))
        ]
    )


def _to_batch(pa: Any, arrow_schema: Any, rows: list[columns.Row]) -> Any:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(values, type=field.type)
            for values, field in zip(zip(*rows, strict=True), arrow_schema, strict=True)
        ],
        schema=arrow_schema,
    )
