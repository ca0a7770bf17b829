"""Snapshot job: one group's committed offsets, now or as of a past time, to Parquet + manifest.

``python -m kafka_group_jobs.snapshot --bootstrap B --group G --output URI [--as-of ISO]``
(or the same arguments to ``spark-submit``). Reads the group's state partition up to a fresh
load marker, keeps the newest commit per partition (as of ``--as-of`` from the commit history
when given), joins the data topics' log-end offsets for lag, and writes:

* ``URI/offsets.parquet``: topic, partition, offset, leader_epoch, metadata,
  commit_timestamp, log_end_offset, lag;
* ``URI/manifest.json``: group, takenAt, asOf, records, partitions per topic, the state-topic
  offsets covered, and a checksum of the offsets (``storage.offsets_checksum``).

``as of`` reads the commit history, so it reaches back as far as the state topic still holds
superseded commits: on a compacted topic, to the last compaction.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from kafka_group_jobs import arguments, session, storage, topics, transforms
from kafka_group_records import partitioning

OFFSETS_FILE = "offsets.parquet"
MANIFEST_FILE = "manifest.json"


def take(
    spark: SparkSession,
    bootstrap: str,
    state_topic: str,
    group_id: str,
    output: str,
    as_of_ms: int | None = None,
    config: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Takes the snapshot and returns its manifest."""
    config = config or {}
    taken_at = topics.now_ms()
    state_partition = partitioning.partition_for(
        group_id, topics.partition_count(bootstrap, state_topic, config)
    )
    state, ends = arguments.read_state(spark, bootstrap, state_topic, config, [state_partition])
    # Materialized once: the state topic is read exactly once, whatever follows.
    offsets = transforms.group_offsets(state, group_id, as_of_ms).localCheckpoint()
    committed = [(row.topic, row.partition, row.offset) for row in offsets.collect()]
    snapshot = transforms.with_lag(offsets, log_ends(spark, bootstrap, committed, config))
    snapshot.orderBy(*transforms.TOPIC_PARTITION).coalesce(1).write.mode("overwrite").parquet(
        storage.spark_path(storage.join(output, OFFSETS_FILE))
    )
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, partition, _ in sorted(committed):
        by_topic[topic].append(partition)
    manifest = {
        "kind": "OffsetSnapshot",
        "version": 1,
        "group": group_id,
        "takenAt": arguments.iso_time(taken_at),
        "asOf": None if as_of_ms is None else arguments.iso_time(as_of_ms),
        "location": output,
        "data": OFFSETS_FILE,
        "records": len(committed),
        "partitions": dict(by_topic),
        "stateTopic": {"topic": state_topic, "endOffsets": {str(p): e for p, e in ends.items()}},
        "checksum": storage.offsets_checksum(committed),
    }
    storage.write_json(spark, storage.join(output, MANIFEST_FILE), manifest)
    return manifest


def log_ends(
    spark: SparkSession,
    bootstrap: str,
    committed: list[tuple[str, int, int]],
    config: dict[str, str],
) -> DataFrame:
    """``(topic, partition, log_end_offset)`` of every committed partition still in Kafka.

    Partitions of deleted topics are left out, so their lag stays unknown (null).
    """
    wanted = {(t, p) for t, p, _ in committed}
    live = topics.topic_partitions(bootstrap, sorted({t for t, _ in wanted}), config)
    marks = topics.watermarks(bootstrap, [tp for tp in live if tp in wanted], config)
    return spark.createDataFrame(
        [(t, p, high) for (t, p), (_, high) in marks.items()],
        "topic STRING, partition INT, log_end_offset BIGINT",
    )


def read(spark: SparkSession, location: str) -> tuple[dict[str, Any], DataFrame]:
    """A written snapshot: its manifest and its offsets frame."""
    manifest: dict[str, Any] = storage.read_json(spark, storage.join(location, MANIFEST_FILE))
    data = spark.read.parquet(storage.spark_path(storage.join(location, manifest["data"])))
    return manifest, data


def main(argv: list[str] | None = None) -> int:
    parser = arguments.parser("Snapshot one consumer group's committed offsets.")
    parser.add_argument("--group", required=True)
    parser.add_argument("--output", required=True, help="storage URI of this snapshot")
    parser.add_argument("--as-of", help="ISO-8601 time: offsets as they stood then")
    args = parser.parse_args(argv)
    with session.job_session("kafka-group-snapshot", args.master) as spark:
        manifest = take(
            spark,
            args.bootstrap,
            args.topic,
            args.group,
            args.output,
            None if args.as_of is None else arguments.parse_time_ms(args.as_of),
            arguments.kafka_config(args),
        )
    arguments.emit_result(manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
