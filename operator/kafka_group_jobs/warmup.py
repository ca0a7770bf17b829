"""Records the JVM class archive of the jobs image while it is built: ``python -m
kafka_group_jobs.warmup PATH``.

A job in a SparkApplication starts its JVMs through ``spark-submit`` and the image's
entrypoint, never through ``session.job_session`` on a local master, so no job there ever
records the archive ``session`` describes. The image records one instead, at build time, with
this module: a local Spark runs the jobs' own read-to-checkpoint path on a few synthetic
state records (``mapInArrow`` over Arrow batches, the newest-per-key aggregation, the
snapshot's join and a Parquet write), which loads the classes a real job's JVM loads, and
its JVM writes them to ``PATH`` as it exits. The SparkApplications point their driver and
executors at that file (``manifests.spark_application``); a JVM whose class path differs
from the recording's ignores the archive and starts as it would without.

No Kafka is needed: the records are encoded and decoded with the shared codec in the Python
worker, as a reading task does.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kafka_group_jobs import columns, decoding, session, source
from kafka_group_records import codec, records

RECORDS = 2_000
GROUP = "warmup"


def synthetic_batches(indexes: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` function: each input index becomes ``RECORDS`` decoded offset commits."""
    import pyarrow as pa

    schema = source.arrow_schema(pa)
    for batch in indexes:
        for index in batch.column(0).to_pylist():
            rows = []
            for offset in range(RECORDS):
                key, value = codec.encode_record(
                    records.Record(
                        records.OffsetCommitKey(GROUP, f"topic-{offset % 7}", offset % 13),
                        records.OffsetCommitValue(offset=offset, commit_timestamp=offset),
                    )
                )
                rows.append(decoding.decode_row(index, offset, offset, key, value))
            yield source.to_batch(pa, schema, rows)


def exercise(spark: Any, work: Path) -> int:
    """The jobs' Spark path on synthetic records; returns the checkpoint's row count."""
    from pyspark.sql import functions as F

    from kafka_group_jobs import transforms

    state = spark.range(0, 2, 1, numPartitions=2).mapInArrow(
        synthetic_batches, columns.STATE_RECORD_DDL
    )
    latest = transforms.latest_per_key(state.select(*transforms.COMPACTION_COLUMNS))
    kept = transforms.checkpoint_records(latest.localCheckpoint())
    kept.orderBy("partition", "offset").write.mode("overwrite").parquet(str(work / "checkpoint"))
    offsets = transforms.group_offsets(state, GROUP)
    ends = offsets.select(*transforms.TOPIC_PARTITION).withColumn("log_end_offset", F.lit(10**6))
    snapshot = transforms.with_lag(offsets, ends).orderBy(*transforms.TOPIC_PARTITION)
    snapshot.coalesce(1).write.mode("overwrite").parquet(str(work / "snapshot"))
    return int(spark.read.parquet(str(work / "checkpoint")).count())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_group_jobs.warmup")
    parser.add_argument("archive", type=Path, help="where the JVM writes its class archive")
    parsed = parser.parse_args(argv)
    archive: Path = parsed.archive
    if archive.exists():
        print(f"error: {archive} exists; the JVM records only into a new file", file=sys.stderr)
        return 2
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        with (
            tempfile.TemporaryDirectory() as work,
            session.recorded_session("kafka-group-jobs-warmup", archive) as spark,
        ):
            kept = exercise(spark, Path(work))
    except OSError as error:  # a path that cannot be written: one line, not a traceback
        print(f"error: cannot record the class archive at {archive}: {error}", file=sys.stderr)
        return 1
    if not archive.is_file() or archive.stat().st_size == 0:
        print(f"error: the JVM wrote no class archive to {archive}", file=sys.stderr)
        return 1
    # Recorded as root, read by the image's Spark user (a temporary file starts owner-only).
    archive.chmod(0o644)
    print(f"class archive: {archive} ({archive.stat().st_size >> 20} MiB, {kept} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
