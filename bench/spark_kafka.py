"""Second peer of the snapshot job: the same snapshot read through Spark's own Kafka source.

``python -m bench.spark_kafka --bootstrap B --topic T --group G --output URI`` does what
``python -m kafka_group_jobs.snapshot`` does, on the same local Spark (``session``: the same
master, JVM flags and class archive), except that the state topic is read by Spark's
``spark-sql-kafka-0-10`` source (``format("kafka")``, ``assign`` with ``startingOffsets`` and
``endingOffsets`` JSON per partition, ``read_committed``) instead of the jobs' confluent-kafka
reader. Its ``key``/``value``/``offset``/``timestamp`` columns are decoded with the same codec
(``decoding.decode_row``, in ``mapInArrow``) into the same ``STATE_RECORD_DDL`` rows, then the
same transforms run (newest commit per partition, lag against the log ends, one sorted Parquet
file). It prints the offsets' checksum as the job's ``KGO-RESULT`` line does, so the benchmark
checks both agree.

The source splits the range into as many Spark tasks as the jobs' reader does
(``minPartitions``: one per ``arguments.records_per_split`` records), so both read with the same
parallelism.

The connector's jars (it, its token provider, ``kafka-clients``, ``commons-pool2``: the rest
of its dependencies ship with PySpark) come from Maven Central once and are kept in the
user's cache directory, keyed by version. The connector is taken at PySpark's own version;
when Maven Central has no such release (PySpark can be released before its Maven artifacts),
the newest release of the same major version is taken, and the result says which.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

MAVEN = "https://repo1.maven.org/maven2"
CONNECTOR = "org/apache/spark/spark-sql-kafka-0-10_2.13"
# What the connector needs beyond PySpark's own jars, by connector version (its pom's
# compile dependencies; the others, scala-parallel-collections and jsr305, ship with PySpark).
DEPENDENCIES = {
    "4": (
        ("org/apache/spark/spark-token-provider-kafka-0-10_2.13", None),
        ("org/apache/kafka/kafka-clients", "3.9.2"),
        ("org/apache/commons/commons-pool2", "2.13.1"),
    ),
}


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kafka-group-operator"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        data: bytes = response.read()
    return data


def connector_version(pyspark_version: str) -> str:
    """PySpark's version if Maven Central has the connector at it, else the newest release of
    the same major version there."""
    metadata = _get(f"{MAVEN}/{CONNECTOR}/maven-metadata.xml").decode()
    versions = re.findall(r"<version>([^<]+)</version>", metadata)
    if pyspark_version in versions:
        return pyspark_version
    major = pyspark_version.split(".")[0]
    releases = [v for v in versions if re.fullmatch(rf"{major}\.\d+\.\d+", v)]
    if not releases:
        raise RuntimeError(f"Maven Central has no spark-sql-kafka release {major}.x")
    newest: str = max(releases, key=lambda v: tuple(int(part) for part in v.split(".")))
    return newest


def jars(pyspark_version: str) -> tuple[str, list[Path]]:
    """The connector's version and its jars, fetched into the cache once (SHA-1 checked)."""
    marker = cache_dir() / f"spark-sql-kafka-for-pyspark-{pyspark_version}"
    if marker.is_file():
        version = marker.read_text().strip()
    else:
        version = connector_version(pyspark_version)
    folder = cache_dir() / f"spark-sql-kafka-{version}"
    wanted = [(CONNECTOR, version)] + [
        (path, pinned or version) for path, pinned in DEPENDENCIES[version.split(".")[0]]
    ]
    found = []
    for path, at in wanted:
        name = f"{path.rsplit('/', 1)[1]}-{at}.jar"
        jar = folder / name
        if not jar.is_file():
            url = f"{MAVEN}/{path}/{at}/{name}"
            data = _get(url)
            expected = _get(url + ".sha1").decode().split()[0]
            if hashlib.sha1(data).hexdigest() != expected:
                raise RuntimeError(f"{url}: SHA-1 mismatch")
            folder.mkdir(parents=True, exist_ok=True)
            partial = jar.with_suffix(".part")
            partial.write_bytes(data)
            partial.replace(jar)
        found.append(jar)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(version)
    return version, found


def decode_batches(batches: Any) -> Any:
    """``mapInArrow``: the source's (partition, offset, timestamp, key, value) batches as
    ``STATE_RECORD_DDL`` batches, decoded by the jobs' codec."""
    import pyarrow as pa

    from kafka_group_jobs import decoding, source

    schema = source.arrow_schema(pa)
    for batch in batches:
        columns = [batch.column(i).to_pylist() for i in range(5)]
        rows = [decoding.decode_row(*row) for row in zip(*columns, strict=True)]
        if rows:
            yield source.to_batch(pa, schema, rows)


def read_state(
    spark: Any, bootstrap: str, topic: str, starts: dict[int, int], ends: dict[int, int]
) -> Any:
    """The state topic's ``[starts, ends)`` through Spark's Kafka source, decoded."""
    from pyspark.sql import functions as F

    from kafka_group_jobs import arguments, columns

    records = sum(max(ends[p] - starts.get(p, 0), 0) for p in ends)
    per_task = arguments.records_per_split(records, spark.sparkContext.defaultParallelism)
    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("kafka.isolation.level", "read_committed")
        .option("assign", json.dumps({topic: sorted(ends)}))
        .option("startingOffsets", json.dumps({topic: {str(p): starts.get(p, 0) for p in ends}}))
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
        .option("minPartitions", str(max(math.ceil(records / per_task), 1)))
        .load()
    )
    return frame.select(
        "partition", "offset", F.unix_millis("timestamp").alias("timestamp"), "key", "value"
    ).mapInArrow(decode_batches, columns.STATE_RECORD_DDL)


def take(spark: Any, bootstrap: str, topic: str, group: str, output: str) -> dict[str, Any]:
    """The snapshot job's steps (``snapshot.take``) on the frame ``read_state`` gives."""
    from kafka_group_jobs import arguments, snapshot, storage, topics, transforms

    fenced = arguments.take_fence(bootstrap, topic, {}, None, group)
    ends = fenced.end_offsets
    starts = topics.earliest_offsets(bootstrap, topic, ends, {})
    state = read_state(spark, bootstrap, topic, starts, ends)
    offsets = transforms.group_offsets(state, group).localCheckpoint()
    committed = snapshot.committed_offsets(offsets)
    log_ends = snapshot.log_end_offsets(bootstrap, committed, {})
    frame = transforms.with_lag(offsets, snapshot.log_end_frame(spark, log_ends))
    frame.coalesce(1).sortWithinPartitions(*transforms.TOPIC_PARTITION).write.mode(
        "overwrite"
    ).parquet(storage.spark_path(storage.join(output, snapshot.OFFSETS_FILE)))
    return {"records": len(committed), "checksum": storage.offsets_checksum(committed)}


def main(argv: list[str]) -> int:
    import argparse

    import pyspark

    from kafka_group_jobs import session
    from kafka_group_records import results

    parser = argparse.ArgumentParser(prog="python -m bench.spark_kafka")
    for option in ("--bootstrap", "--topic", "--group", "--output"):
        parser.add_argument(option, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    version, found = jars(pyspark.__version__)
    fetched_s = time.perf_counter() - started
    # The jars on the driver's and executors' class path, as ``--jars`` would put them.
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(map(str, found))} pyspark-shell"
    with session.job_session("kafka-group-snapshot-spark-kafka", "local[2]") as spark:
        result = take(spark, args.bootstrap, args.topic, args.group, args.output)
    result |= {"connector_version": version, "jars_s": round(fetched_s, 2)}
    sys.stdout.write(results.result_line(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
