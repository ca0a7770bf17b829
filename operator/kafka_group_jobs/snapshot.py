"""Snapshot job: one group's committed offsets, now or as of a past time, to Parquet + manifest.

``python -m kafka_group_jobs.snapshot --bootstrap B --group G --output URI [--as-of ISO]``
(or the same arguments to ``spark-submit``). Reads the group's state partition up to a read
fence (``fence``: the coordinator's with ``--coordinator-url``, else the last stable offset),
keeps the newest commit per partition (as of ``--as-of`` from the commit history
when given), joins the data topics' log-end offsets for lag, and writes:

* ``URI/offsets.parquet``: topic, partition, offset, leader_epoch, metadata,
  commit_timestamp, log_end_offset, lag;
* ``URI/manifest.json``: group, takenAt, asOf, records, partitions per topic, the state-topic
  offsets covered and the kind of read fence they came from, and a checksum of the offsets
  (``storage.offsets_checksum``).

Both are written aside and moved to ``URI`` together (``storage.staged``): an interrupted or
failed job leaves nothing there. A ``URI`` that holds something already is refused, before
Spark starts on a file system, unless ``--overwrite``.

``as of`` reads the commit history, so it reaches back as far as the state topic still holds
superseded commits: on a compacted topic, to the last compaction.

A group with no committed offsets (often a misspelled group id) fails the job, and nothing is
written, unless ``--allow-empty`` is given. The job prints the snapshot as a table (``--json``:
the manifest as the ``KGO-RESULT`` line) and warns on every committed offset past the log end
the broker reports.

Spark's own modules (``session``, ``transforms``, ``progress``) are imported by the functions
that run Spark, not at the top: importing pyspark alone takes a second or more, and a wrong
invocation must fail before that.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kafka_group_jobs import arguments, errors, fence, storage, topics
from kafka_group_records import partitioning

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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
    allow_empty: bool = True,
    fenced: fence.ReadFence | None = None,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Takes the snapshot; returns its manifest plus ``logEndOffsets`` (one row per partition).

    Without ``allow_empty``, a group with no committed offsets raises ``JobError`` before
    anything is written. Without ``overwrite``, an ``output`` that holds something already
    raises ``JobError``; with it, the old snapshot is replaced once the new one is whole.
    """
    from kafka_group_jobs import progress, transforms

    config = config or {}
    taken_at = topics.now_ms()
    state_partition = partitioning.partition_for(
        group_id, topics.partition_count(bootstrap, state_topic, config)
    )
    state, fenced, ranges = arguments.read_state(
        spark,
        bootstrap,
        state_topic,
        config,
        [state_partition],
        fenced=fenced,
        commits_of=group_id,
        as_of_ms=as_of_ms,
    )
    ends = fenced.end_offsets
    # Materialized once: the state topic is read exactly once, whatever follows.
    with progress.watching(spark, f"reading {state_topic}", ranges, len(ends)):
        offsets = transforms.group_offsets(state, group_id, as_of_ms).localCheckpoint()
    committed = committed_offsets(offsets)
    if not committed and not allow_empty:
        when = "" if as_of_ms is None else f" as of {arguments.iso_time(as_of_ms)}"
        raise errors.JobError(
            f"group {group_id!r} has no committed offsets in {state_topic!r}{when}"
            " (is the group id right?); nothing written. --allow-empty writes an empty snapshot"
        )
    ends_by_partition = log_end_offsets(bootstrap, committed, config)
    snapshot = transforms.with_lag(offsets, log_end_frame(spark, ends_by_partition))
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
        "stateTopic": {
            "topic": state_topic,
            "endOffsets": {str(p): e for p, e in ends.items()},
            "fence": fenced.kind,
        },
        "checksum": storage.offsets_checksum(committed),
    }
    # Written aside and moved into place whole: nothing partial at ``output``, ever.
    with storage.staged(spark, output, overwrite) as staging:
        # One file, sorted within its one task: a global orderBy would first sample the rows
        # for range bounds (a Spark job of its own) and shuffle them into several tasks.
        snapshot.coalesce(1).sortWithinPartitions(*transforms.TOPIC_PARTITION).write.mode(
            "overwrite"
        ).parquet(storage.spark_path(storage.join(staging, OFFSETS_FILE)))
        storage.write_json(spark, storage.join(staging, MANIFEST_FILE), manifest)
    # Returned, not written (the Parquet has them): what the table and the warnings show.
    return {
        **manifest,
        "logEndOffsets": [
            {"topic": t, "partition": p, "offset": o, "logEndOffset": ends_by_partition.get((t, p))}
            for t, p, o in sorted(committed)
        ],
    }


def committed_offsets(offsets: DataFrame) -> list[tuple[str, int, int]]:
    """``(topic, partition, offset)`` of every committed offset, collected as Arrow columns:
    a million rows as Python ``Row`` objects take tens of seconds to cross from the JVM."""
    table = offsets.select("topic", "partition", "offset").toArrow()
    return list(
        zip(
            table.column("topic").to_pylist(),
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            strict=True,
        )
    )


def log_end_frame(spark: SparkSession, ends: dict[tuple[str, int], int]) -> DataFrame:
    """``(topic, partition, log_end_offset)`` rows, handed to the JVM as Arrow: rows from a
    Python list would each start a Python worker to be read."""
    import pyarrow as pa

    table = pa.table(
        {
            "topic": pa.array([topic for topic, _ in ends], pa.string()),
            "partition": pa.array([partition for _, partition in ends], pa.int32()),
            "log_end_offset": pa.array(list(ends.values()), pa.int64()),
        }
    )
    return spark.createDataFrame(table)


def log_end_offsets(
    bootstrap: str, committed: list[tuple[str, int, int]], config: dict[str, str]
) -> dict[tuple[str, int], int]:
    """The log end of every committed partition still in Kafka.

    Partitions of deleted topics are left out, so their lag stays unknown (null).
    """
    wanted = {(t, p) for t, p, _ in committed}
    live = topics.topic_partitions(bootstrap, sorted({t for t, _ in wanted}), config)
    marks = topics.watermarks(bootstrap, [tp for tp in live if tp in wanted], config)
    return {tp: high for tp, (_, high) in marks.items()}


def past_log_end_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """One warning per committed offset past the log end the broker reports."""
    return [
        f"{row['topic']}[{row['partition']}]: committed offset {row['offset']} is past the log"
        f" end {row['logEndOffset']} the broker reports; its lag shows as 0. Either the"
        " broker reports a wrong log end (some do after batched produces) or the partition"
        " lost records: check before restoring to this offset"
        for row in rows
        if row["logEndOffset"] is not None and row["offset"] > row["logEndOffset"]
    ]


def report(manifest: dict[str, Any]) -> list[str]:
    """The snapshot for people: where, what, and one table row per partition."""
    rows = manifest.get("logEndOffsets", [])
    as_of = f", as of {manifest['asOf']}" if manifest.get("asOf") else ""
    lines = [
        f"snapshot of group {manifest['group']} written to {manifest['location']}",
        f"  taken at {manifest['takenAt']}{as_of}: {manifest['records']} committed offsets,"
        f" checksum {manifest['checksum']}",
    ]
    if rows:
        lines += arguments.table(
            ("topic", "partition", "offset", "log end", "lag"),
            [
                (
                    row["topic"],
                    row["partition"],
                    row["offset"],
                    row["logEndOffset"],
                    None
                    if row["logEndOffset"] is None
                    else max(row["logEndOffset"] - row["offset"], 0),
                )
                for row in rows
            ],
        )
    return lines


def read(spark: SparkSession, location: str) -> tuple[dict[str, Any], DataFrame]:
    """A written snapshot: its manifest and its offsets frame."""
    manifest: dict[str, Any] = storage.read_json(spark, storage.join(location, MANIFEST_FILE))
    data = spark.read.parquet(storage.spark_path(storage.join(location, manifest["data"])))
    return manifest, data


def main(argv: Sequence[str] | None = None) -> int:
    return arguments.run("snapshot", _main, argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = arguments.parser("snapshot", "Snapshot one consumer group's committed offsets.")
    parser.add_argument("--group", required=True)
    parser.add_argument("--output", required=True, help="storage URI of this snapshot")
    parser.add_argument("--as-of", help="ISO-8601 time: offsets as they stood then")
    parser.add_argument(
        "--allow-empty", action="store_true", help="write a snapshot of a group with no offsets"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace what --output holds already"
    )
    arguments.add_coordinator(parser, "asked for the read fence")
    args = parser.parse_args(argv)
    arguments.check_group(args.group)
    coordinator = arguments.coordinator_of(args, args.group)
    as_of_ms = None if args.as_of is None else arguments.parse_time_ms(args.as_of)
    config = arguments.kafka_config(args)
    storage.check_writable(args.output, args.overwrite)
    arguments.check_state_topic(args.bootstrap, args.topic, config)
    fenced = arguments.take_fence(args.bootstrap, args.topic, config, coordinator, args.group)
    from kafka_group_jobs import session  # only now: see the module docstring

    with session.job_session("kafka-group-snapshot", args.master, args.spark_ui) as spark:
        manifest = take(
            spark,
            args.bootstrap,
            args.topic,
            args.group,
            args.output,
            as_of_ms,
            config,
            allow_empty=args.allow_empty,
            fenced=fenced,
            overwrite=args.overwrite,
        )
    if args.json:
        arguments.emit_result(manifest)
    else:
        arguments.say(*report(manifest))
    for warning in past_log_end_warnings(manifest["logEndOffsets"]):
        arguments.warn(warning)
    arguments.note_client_warnings()
    return 0


if __name__ == "__main__":
    sys.exit(main())
