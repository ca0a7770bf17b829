"""Compaction job: the state topic reduced to its newest live record per key, as a checkpoint.

``python -m kafka_group_jobs.compaction --bootstrap B --output URI [--now-ms N]``. Reads every
state partition up to fresh load markers, keeps the newest record per key, tombstones every
live record of groups that expired (empty longer than their offsets retention, KIP-211) or
were deleted, appends those tombstones to the topic (so that Kafka's own compaction drops the
keys), and writes the checkpoint described in ``kafka_group_records.checkpoint``:

* ``URI/records.parquet``: partition, offset, key, value, sorted by partition then offset;
* ``URI/checkpoint.json``: the state-topic offsets the checkpoint covers, per partition.

A loader replays the checkpoint's records, then the log from the covered offsets on; it
reaches the same state as replaying the whole log.

Spark's own modules (``session``, ``transforms``, ``progress``) are imported by the functions
that run Spark, not at the top: importing pyspark alone takes a second or more, and a wrong
invocation must fail before that.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kafka_group_jobs import arguments, errors, storage, topics
from kafka_group_records import checkpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000


def compact(
    spark: SparkSession,
    bootstrap: str,
    state_topic: str,
    output: str,
    now_ms: int | None = None,
    default_retention_ms: int = DEFAULT_RETENTION_MS,
    write_tombstones: bool = True,
    config: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Writes the checkpoint (and the tombstones); returns the checkpoint's manifest."""
    from kafka_group_jobs import progress, transforms

    config = config or {}
    now = topics.now_ms() if now_ms is None else now_ms
    state, ends, ranges = arguments.read_state(spark, bootstrap, state_topic, config)
    # Materialized once: the state topic is read exactly once, whatever follows.
    latest = transforms.latest_per_key(state.select(*transforms.COMPACTION_COLUMNS))
    with progress.watching(spark, f"reading {state_topic}", ranges, len(ends)):
        latest = latest.localCheckpoint()
    tombstones = transforms.compaction_tombstones(latest, now, default_retention_ms).cache()
    doomed = [(row.partition, bytes(row.key)) for row in tombstones.collect()]
    kept = transforms.checkpoint_records(latest, tombstones if write_tombstones else _none(spark))
    kept.orderBy("partition", "offset").write.mode("overwrite").parquet(
        storage.spark_path(storage.join(output, checkpoint.RECORDS_FILE))
    )
    kept_count = spark.read.parquet(
        storage.spark_path(storage.join(output, checkpoint.RECORDS_FILE))
    ).count()
    tombstones.unpersist()
    if write_tombstones and doomed:
        topics.produce(bootstrap, state_topic, ((p, key, None) for p, key in doomed), config)
    manifest = checkpoint.CheckpointManifest(
        topic=state_topic,
        end_offsets=dict(ends),
        records=kept_count,
        tombstones=len(doomed) if write_tombstones else 0,
        created_at_ms=now,
    )
    storage.write_json(
        spark,
        storage.join(output, checkpoint.MANIFEST_FILE),
        checkpoint.manifest_document(manifest),
    )
    return checkpoint.manifest_document(manifest)


def _none(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], "partition INT, key BINARY")


def report(output: str, manifest: dict[str, Any]) -> list[str]:
    """The checkpoint for people: where, how much, and what it covers."""
    ends = manifest.get("endOffsets") or {}
    covered = ", ".join(
        f"{partition}: below {end}" for partition, end in sorted(ends.items(), key=_numeric)
    )
    return [
        f"checkpoint of {manifest.get('topic')} written to {output}",
        f"  {manifest.get('records')} live records kept, {manifest.get('tombstones')} tombstones"
        " appended to the topic",
        f"  state-topic offsets covered, per partition: {covered or 'none'}",
    ]


def _numeric(item: tuple[str, int]) -> int:
    return int(item[0])


def main(argv: Sequence[str] | None = None) -> int:
    return arguments.run("compaction", _main, argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = arguments.parser("compaction", "Compact the state topic into a loader checkpoint.")
    parser.add_argument("--output", required=True, help="storage URI of the checkpoint")
    parser.add_argument("--now-ms", type=int, help="the time retention is judged at")
    parser.add_argument("--default-retention-ms", type=int, default=DEFAULT_RETENTION_MS)
    parser.add_argument(
        "--no-tombstones", action="store_true", help="do not append tombstones to the topic"
    )
    args = parser.parse_args(argv)
    if args.default_retention_ms < 0:
        raise errors.UsageError("--default-retention-ms must not be negative")
    config = arguments.kafka_config(args)
    storage.check_writable(args.output)
    arguments.check_state_topic(args.bootstrap, args.topic, config)
    from kafka_group_jobs import session  # only now: see the module docstring

    with session.job_session("kafka-group-compaction", args.master) as spark:
        result = compact(
            spark,
            args.bootstrap,
            args.topic,
            args.output,
            args.now_ms,
            args.default_retention_ms,
            not args.no_tombstones,
            config,
        )
    if args.json:
        arguments.emit_result(result)
    else:
        arguments.say(*report(args.output, result))
    arguments.note_client_warnings()
    return 0


if __name__ == "__main__":
    sys.exit(main())
