"""Compaction job: the state topic reduced to its newest live record per key, as a checkpoint.

``python -m kafka_group_jobs.compaction --bootstrap B --output URI [--coordinator-url U
--group G | --fenced-ends JSON]``. Reads every state partition up to a read fence (``fence``:
from the coordinator when one is named, or the ends it already fenced, which the operator
passes for the compaction it schedules; else the last stable offsets), keeps the newest record
per key, and writes the checkpoint described in ``kafka_group_records.checkpoint``, and
nothing else:

* ``URI/records.parquet``: partition, offset, key, value, sorted by partition then offset;
* ``URI/checkpoint.json``: the state-topic offsets the checkpoint covers, per partition, and
  the kind of fence they came from.

A loader replays the checkpoint's records, then the log from the covered offsets on; it
reaches the same state as replaying the whole log. The job judges no retention and appends no
tombstone: expiry (KIP-211) is the coordinator's, which applies it live and after every load,
so there is one retention rule, in one place, and the only writer of the state topic is the
coordinator.

Spark's own modules (``session``, ``transforms``, ``progress``) are imported by the functions
that run Spark, not at the top: importing pyspark alone takes a second or more, and a wrong
invocation must fail before that.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kafka_group_jobs import arguments, errors, fence, storage, topics
from kafka_group_records import checkpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def compact(
    spark: SparkSession,
    bootstrap: str,
    state_topic: str,
    output: str,
    config: dict[str, str] | None = None,
    fenced: fence.ReadFence | None = None,
    overwrite: bool = True,
) -> dict[str, Any]:
    """Writes the checkpoint (aside, then moved to ``output`` whole: ``storage.staged``);
    returns its manifest. Without ``overwrite``, an ``output`` that holds something already
    raises ``JobError``."""
    from kafka_group_jobs import progress, transforms

    config = config or {}
    state, fenced, ranges = arguments.read_state(
        spark, bootstrap, state_topic, config, fenced=fenced
    )
    # Materialized once: the state topic is read exactly once, whatever follows.
    latest = transforms.latest_per_key(state.select(*transforms.COMPACTION_COLUMNS))
    with progress.watching(spark, f"reading {state_topic}", ranges, len(fenced.end_offsets)):
        latest = latest.localCheckpoint()
    kept = transforms.checkpoint_records(latest)
    with storage.staged(spark, output, overwrite) as staging:
        records = storage.spark_path(storage.join(staging, checkpoint.RECORDS_FILE))
        kept.orderBy("partition", "offset").write.mode("overwrite").parquet(records)
        kept_count = spark.read.parquet(records).count()
        manifest = checkpoint.CheckpointManifest(
            topic=state_topic,
            end_offsets=dict(fenced.end_offsets),
            records=kept_count,
            created_at_ms=topics.now_ms(),
            fence=fenced.kind,
        )
        storage.write_json(
            spark,
            storage.join(staging, checkpoint.MANIFEST_FILE),
            checkpoint.manifest_document(manifest),
        )
    return checkpoint.manifest_document(manifest)


def report(output: str, manifest: dict[str, Any]) -> list[str]:
    """The checkpoint for people: where, how much, and what it covers."""
    ends = manifest.get("endOffsets") or {}
    covered = ", ".join(
        f"{partition}: below {end}" for partition, end in sorted(ends.items(), key=_numeric)
    )
    return [
        f"checkpoint of {manifest.get('topic')} written to {output}",
        f"  {manifest.get('records')} live records kept",
        f"  state-topic offsets covered, per partition: {covered or 'none'}"
        f" (read fence: {manifest.get('fence')})",
    ]


def _numeric(item: tuple[str, int]) -> int:
    return int(item[0])


def main(argv: Sequence[str] | None = None) -> int:
    return arguments.run("compaction", _main, argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = arguments.parser("compaction", "Compact the state topic into a loader checkpoint.")
    parser.add_argument("--output", required=True, help="storage URI of the checkpoint")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace what --output holds already"
    )
    parser.add_argument("--group", help="the group whose token authenticates the read fence")
    arguments.add_coordinator(parser, "asked for the read fence")
    parser.add_argument(
        "--fenced-ends",
        help="JSON {partition: end}: a read fence the coordinator already took (every partition)",
    )
    args = parser.parse_args(argv)
    coordinator = arguments.coordinator_of(args, args.group)
    if coordinator is not None and args.fenced_ends:
        raise errors.UsageError("--fenced-ends and --coordinator-url: give one read fence")
    config = arguments.kafka_config(args)
    storage.check_writable(args.output, args.overwrite)
    count = arguments.check_state_topic(args.bootstrap, args.topic, config)
    fenced = (
        arguments.given_fence(args.fenced_ends, count)
        if args.fenced_ends
        else arguments.take_fence(args.bootstrap, args.topic, config, coordinator)
    )
    from kafka_group_jobs import session  # only now: see the module docstring

    with session.job_session("kafka-group-compaction", args.master, args.spark_ui) as spark:
        result = compact(
            spark, args.bootstrap, args.topic, args.output, config, fenced, args.overwrite
        )
    if args.json:
        arguments.emit_result(result)
    else:
        arguments.say(*report(args.output, result))
    arguments.note_client_warnings()
    return 0


if __name__ == "__main__":
    sys.exit(main())
