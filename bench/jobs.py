"""Spark job benchmarks: snapshot and compaction on local Spark against a single-process peer.

For each size (250k, 500k and 1M offset-commit records by default) a one-partition state topic
is filled with commits of one group: 10 commits per live key (so 1M records hold 100k live
keys), plus an expired group's records (the coordinator expires them after a load; the
checkpoint keeps them, as the log does). Then, on the same topic:

* **snapshot**: ``python -m kafka_group_jobs.snapshot --master local[2]`` as a subprocess, so
  the JVM start is included, against the **peer**: one Python process reading the partition
  with confluent-kafka, decoding with the same decoder, keeping the newest commit per partition
  and writing Parquet with pyarrow plus the same manifest; and against a **second peer**,
  ``python -m bench.spark_kafka``: the same job on the same local Spark reading through
  Spark's own Kafka source (``spark-sql-kafka-0-10``) instead of the jobs' reader. All three
  checksums must agree.
* **compaction**: ``python -m kafka_group_jobs.compaction`` against the same peer doing the
  newest-per-key and a sorted Parquet checkpoint. Record counts must agree. Neither writes the
  topic (expiry is the coordinator's), so every run sees the same topic.
* **warm**: the same two jobs in one Spark session that is already running, per size: the
  part of the cost that grows with the records, and how linearly it grows.
* **loader start-up** with and without the checkpoint, at the largest size: the runtime's own
  ``PartitionLoader`` (marker, read, compaction, decode, replay into a fresh shard) from the
  start of the log, against the same loader given the compaction job's checkpoint (its rows,
  then only the log after it). Best of two each, alternating; all states must be equal.

* **class archive**: the run's first job (a snapshot of a small topic) finds no JVM class
  archive and records one as it ends (``kafka_group_jobs.session``), into the run's work
  directory; every later job of the run starts from it, as every job after the first does in
  an environment. Its time is reported apart.
* **time to first record**: a fresh process (as a job starts) that opens the local Spark
  session and reads the state topic as the jobs do until it holds one record, with the time
  of each step (pyspark import, JVM and session, planning, first record) and the CPU time of
  the process and everything it started. Three runs; the median is the figure.
* **linear fit**: least squares of time against records over the sizes, cold job and peer: the
  slope (seconds per million records) and the fixed cost (the intercept), and from them the
  ratio the two lines give at 10M records.

``--loader-only`` runs just the last part at the largest size: fill, the compaction job (cold),
both loads; it replaces the ``loader`` figures of the largest run in the existing results.
``--no-loader`` leaves the loader part out (``--loader-only`` adds it later).
``--group-partitions=N`` runs only the snapshot and its two peers, on a group that commits N
partitions over and over (the default data is a group of a tenth of the records' partitions,
each committed 10 times), into ``results/jobs-group-partitions-N.json``.
``--first-record-only`` runs only the class archive and time-to-first-record parts and
replaces them.

``--spark-application-only``: the snapshot job as an OffsetSnapshot's SparkApplication runs it
(``bench.spark_application``: the application the operator builds, its driver's
``spark-submit`` in client mode, the image's JVM flags, on ``local[2]``), on Spark laid out
as the jobs image lays it out (without the distribution's Python zips) and as the
distribution does, each from a class archive recorded as the jobs image records it
(``python -m kafka_group_jobs.warmup``), against the jobs' local path (``python -m``, its own
archive), alternating, at 20k records and at each size (``--sizes``; 1M by default). A first
run of each layout with ``-Xshare:on`` in place of the image's ``-Xshare:auto`` shows that the
application's JVM maps the archive (it would refuse to start otherwise). Writes
``bench/results/jobs-spark-application.json``.

Writes ``bench/results/jobs.json``. ``--quick`` uses 50k/100k/200k records,
``--sizes=N,N,...`` any sizes; ``--no-warm`` leaves the warm runs out. ``--snapshot-only``
runs the snapshot job and its two peers only (plus the class archive and first-record parts);
``--merge`` keeps the existing results' runs of other sizes (each run states its load).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka_group_jobs import columns, decoding, topics
from kafka_group_jobs import session as job_session
from kafka_group_jobs import storage as job_storage
from kafka_group_operator.coordinator import shard
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import loader, writer
from kafka_group_records import checkpoint, codec, records, results

RESULTS = Path(__file__).parent / "results" / "jobs.json"
SIZES = (250_000, 500_000, 1_000_000)
QUICK_SIZES = (50_000, 100_000, 200_000)
COMMITS_PER_KEY = 10
TOPICS = 100
GROUP = "bench-group"
EXPIRED_GROUP = "bench-expired"
EXPIRED_KEYS = 1_000
NOW_MS = 1_800_000_000_000
DAY_MS = 24 * 3600 * 1000


# ----------------------------------------------------------------------------- the data


def fill(bootstrap: str, topic: str, size: int, live_keys: int | None = None) -> None:
    """``size`` records on partition 0: commits of GROUP, then an expired group's records.
    GROUP commits ``live_keys`` partitions over and over (a tenth of the records by default:
    10 commits each)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[
        topic
    ].result(30)
    commits = size - EXPIRED_KEYS - 1
    live = live_keys or commits // COMMITS_PER_KEY
    per_topic = max(live // TOPICS, 1)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000}
    )

    def send(record: records.Record) -> None:
        key, value = codec.encode_record(record)
        while True:
            try:
                producer.produce(topic, value, key, partition=0)
                return
            except BufferError:
                producer.poll(0.05)

    for round_ in range(commits // live):
        for index in range(live):
            send(
                records.Record(
                    records.OffsetCommitKey(GROUP, f"t{index // per_topic}", index % per_topic),
                    records.OffsetCommitValue(
                        offset=round_ * 10 + index % 7, commit_timestamp=NOW_MS
                    ),
                )
            )
    for index in range(EXPIRED_KEYS):
        send(
            records.Record(
                records.OffsetCommitKey(EXPIRED_GROUP, "t0", index),
                records.OffsetCommitValue(offset=1, commit_timestamp=NOW_MS - 30 * DAY_MS),
            )
        )
    # The last record in a batch of its own: the jobs read up to the last stable offset (no
    # coordinator runs here), which the embedded broker reports exactly only after a batch of
    # one record; after a larger batch it falls short of the batch's other records.
    if producer.flush(120):
        raise RuntimeError("the benchmark data was not fully written")
    send(
        records.Record(
            records.GroupLifecycleKey(EXPIRED_GROUP),
            records.GroupLifecycleValue(NOW_MS - 30 * DAY_MS),
        )
    )
    if producer.flush(120):
        raise RuntimeError("the benchmark data was not fully written")


def read_partition(bootstrap: str, topic: str, start: int, end: int) -> Iterator[Any]:
    consumer = Consumer(topics.reader_config(bootstrap, {"fetch.max.bytes": str(64 << 20)}))
    try:
        for batch in topics.read_range(consumer, topic, 0, start, end):
            yield from batch
    finally:
        consumer.close()


# ----------------------------------------------------------------------------- the peer


def peer_snapshot(bootstrap: str, topic: str, output: Path) -> dict[str, Any]:
    """The snapshot job's work in one process: read, decode, newest per partition, write."""
    ends = topics.stable_ends(bootstrap, topic, [0])
    latest: dict[tuple[str, int], columns.Row] = {}
    for message in read_partition(bootstrap, topic, 0, ends[0]):
        row = decoding.decode_row(
            0, message.offset(), message.timestamp()[1], message.key(), message.value()
        )
        if row[5] != columns.OFFSET_COMMIT or row[6] != GROUP:
            continue
        if row[4] is None:
            latest.pop((row[7], row[8]), None)
        else:
            latest[(row[7], row[8])] = row
    committed = sorted((t, p, row[9]) for (t, p), row in latest.items())
    live_topics = topics.topic_partitions(bootstrap, sorted({t for t, _, _ in committed}))
    marks = topics.watermarks(bootstrap, live_topics)
    table = pa.table(
        {
            "topic": [t for t, _, _ in committed],
            "partition": pa.array([p for _, p, _ in committed], pa.int32()),
            "offset": pa.array([o for _, _, o in committed], pa.int64()),
            "log_end_offset": pa.array(
                [marks.get((t, p), (None, None))[1] for t, p, _ in committed], pa.int64()
            ),
        }
    )
    output.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, output / "offsets.parquet")
    manifest = {
        "records": len(committed),
        "checksum": job_storage.offsets_checksum(committed),
        "stateTopic": {"topic": topic, "endOffsets": {"0": ends[0]}},
    }
    (output / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def peer_compaction(bootstrap: str, topic: str, output: Path) -> dict[str, Any]:
    """The compaction job's work in one process: newest per key, sorted checkpoint."""
    ends = topics.stable_ends(bootstrap, topic, [0])
    latest: dict[bytes, columns.Row] = {}
    for message in read_partition(bootstrap, topic, 0, ends[0]):
        row = decoding.decode_row(
            0, message.offset(), message.timestamp()[1], message.key(), message.value()
        )
        latest[row[3]] = row
    live = {key: row for key, row in latest.items() if row[4] is not None}
    kept = sorted(
        (row for row in live.values() if row[5] != columns.LOAD_MARKER),
        key=lambda row: (row[0], row[1]),
    )
    table = pa.table(
        {
            "partition": pa.array([row[0] for row in kept], pa.int32()),
            "offset": pa.array([row[1] for row in kept], pa.int64()),
            "key": pa.array([row[3] for row in kept], pa.binary()),
            "value": pa.array([row[4] for row in kept], pa.binary()),
        }
    )
    output.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, output / checkpoint.RECORDS_FILE)
    manifest = checkpoint.CheckpointManifest(topic, {0: ends[0]}, len(kept), NOW_MS)
    (output / checkpoint.MANIFEST_FILE).write_text(
        json.dumps(checkpoint.manifest_document(manifest))
    )
    return {"records": len(kept)}


# ----------------------------------------------------------------------------- the jobs


def timed_process(
    command: list[str], what: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``command``'s wall time and its output; ``RuntimeError`` naming ``what`` if it failed."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, cwd=cwd)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        # Under spark-submit a Python job's stderr is merged into its stdout.
        raise RuntimeError(f"{what} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return elapsed, done


def run_job(job: str, arguments: list[str]) -> tuple[float, dict[str, Any]]:
    elapsed, done = timed_process(
        [
            sys.executable,
            "-m",
            f"kafka_group_jobs.{job}",
            *arguments,
            "--master",
            "local[2]",
            "--json",
        ],
        job,
    )
    result = results.parse_result(done.stdout)
    if result is None:
        raise RuntimeError(f"{job} printed no result line:\n{done.stdout[-3000:]}")
    return elapsed, result


def run_spark_kafka(arguments: list[str]) -> tuple[float, dict[str, Any]]:
    """The second peer (``bench.spark_kafka``) in a fresh process, as the jobs run; its jars
    are fetched before the clock starts."""
    import pyspark

    from bench import spark_kafka

    spark_kafka.jars(pyspark.__version__)
    elapsed, done = timed_process(
        [sys.executable, "-m", "bench.spark_kafka", *arguments],
        "the Spark Kafka source peer",
        cwd=Path(__file__).parent.parent,
    )
    result = results.parse_result(done.stdout)
    if result is None:
        raise RuntimeError(f"the Spark Kafka source peer printed no result:\n{done.stdout[-3000:]}")
    return elapsed, result


def timed(function: Any, *arguments: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = function(*arguments)
    return time.perf_counter() - started, result


# ----------------------------------------------------------------------------- the loader


def runtime_load(bootstrap: str, topic: str, checkpoint_uri: str | None) -> shard.CoordinatorShard:
    """Partition 0 loaded by the runtime's loader into a shard, as at start-up (the state
    writer's start included: the load's markers go through it)."""

    async def load() -> shard.CoordinatorShard:
        state_writer = writer.StateWriter(bootstrap, topic, timeout_ms=30_000, kafka_config={})
        state_writer.start()
        partition_loader = loader.PartitionLoader(
            bootstrap_servers=bootstrap,
            topic=topic,
            state_writer=state_writer,
            kafka_config={},
            clock_ms=lambda: NOW_MS,
            partition_count=1,
            checkpoint_uri=checkpoint_uri,
        )
        outcomes: dict[int, shard.CoordinatorShard | BaseException] = {}

        def build(_: int, replayed: list[records.Record]) -> shard.CoordinatorShard:
            fresh = shard.CoordinatorShard()
            for record in replayed:
                fresh.replay(record)
            return fresh

        try:
            await partition_loader.load([0], build, outcomes.__setitem__)
            await asyncio.sleep(0)  # the hand-over is scheduled on the loop
        finally:
            state_writer.stop()
        outcome = outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        outcome.on_loaded(NOW_MS)
        return outcome

    return asyncio.run(load())


def measure_loader(bootstrap: str, topic: str, location: Path) -> dict[str, Any]:
    """Best of two loads each way, alternating; every load must reach the same state. Only
    a digest of each state is kept, so that no loaded shard weighs on the next load's GC."""
    times: dict[str | None, list[float]] = {None: [], f"file://{location}": []}
    digests = set()
    committed = 0
    for _ in range(2):
        for checkpoint_uri, taken in times.items():
            gc.collect()
            elapsed, loaded = timed(runtime_load, bootstrap, topic, checkpoint_uri)
            taken.append(elapsed)
            state = loaded.canonical_state()
            digests.add(hashlib.sha256(repr(state).encode()).hexdigest())
            committed = sum(len(offsets) for offsets in state["offsets"].values())
            del loaded, state
    if len(digests) != 1:
        raise RuntimeError("the loader's states with and without the checkpoint differ")
    without_s, with_s = (min(taken) for taken in times.values())
    return {
        "without_checkpoint_s": round(without_s, 2),
        "with_checkpoint_s": round(with_s, 2),
        "speedup": round(without_s / with_s, 1),
        "committed_offsets": committed,
    }


# ----------------------------------------------------------------------------- first record

# What a job does before its first record, step by step, in a fresh process; one JSON line of
# {step: seconds since the process began} on stdout, plus the CPU time of the process and of
# everything it started (the JVM, Python workers) up to the first record: on a shared machine
# wall time mostly measures the load, CPU time the work.
_FIRST_RECORD = """
import json, os, sys, time
started = time.perf_counter()
marks = {"interpreter_start": round(time.time() - float(sys.argv[3]), 2)}
def mark(step):
    marks[step] = round(time.perf_counter() - started, 2)
def tree_cpu_s():
    tick, parents, used = os.sysconf("SC_CLK_TCK"), {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(pid)] = int(fields[1])
        used[int(pid)] = sum(int(f) for f in fields[11:15]) / tick
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0.0)
        todo += [child for child, parent in parents.items() if parent == pid]
    return round(total, 1)
import pyspark.sql
mark("import_pyspark")
from kafka_group_jobs import arguments, session
spark = session.build_session("kafka-group-first-record", "local[2]")
mark("session")
frame, _, _ = arguments.read_state(spark, sys.argv[1], sys.argv[2], {}, [0])
mark("planned")
rows = frame.limit(1).collect()
mark("first_record")
marks["cpu_s"] = tree_cpu_s()
assert len(rows) == 1
print(json.dumps(marks), flush=True)
spark.stop()
"""


def first_record(bootstrap: str, topic: str, runs: int = 3) -> dict[str, Any]:
    """Median time from a fresh process to its first record, with the steps of that run."""
    measured = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", _FIRST_RECORD, bootstrap, topic, repr(time.time())],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the first-record probe failed:\n{done.stderr[-3000:]}")
        marks = json.loads(done.stdout.strip().splitlines()[-1])
        # From the launch of the process: the interpreter's own start before the probe's clock
        # began, included.
        marks["first_record_from_launch"] = round(
            marks["interpreter_start"] + marks["first_record"], 2
        )
        marks["load_average_1m"] = round(os.getloadavg()[0], 2)
        measured.append(marks)
        print(json.dumps(marks), flush=True)
    measured.sort(key=lambda marks: marks["first_record_from_launch"])
    median = measured[len(measured) // 2]
    return {
        "runs": measured,
        "median_first_record_s": median["first_record_from_launch"],
        "median_cpu_s": sorted(marks["cpu_s"] for marks in measured)[len(measured) // 2],
        "target_s": 8.0,
    }


def record_class_archive(bootstrap: str, topic: str, work: Path) -> dict[str, Any]:
    """The first job in an environment: it records the JVM's class archive (``session``) that
    every later local job starts from. Timed, then checked to be there."""
    archive = job_session.class_archive()
    if archive is None or archive.exists():
        raise RuntimeError(f"expected no class archive yet at {archive}")
    elapsed, _ = run_job(
        "snapshot",
        [
            *("--bootstrap", bootstrap, "--topic", topic, "--group", GROUP),
            *("--output", f"file://{work}/first-snap"),
        ],
    )
    if not archive.is_file():
        raise RuntimeError("the first job recorded no class archive")
    figures = {
        "first_job_s": round(elapsed, 2),
        "archive_mib": round(archive.stat().st_size / 2**20),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figures), flush=True)
    return figures


@contextlib.contextmanager
def fresh_class_archive(work: Path) -> Iterator[None]:
    """Every job of this run (and the probes) use one class archive in ``work``, recorded by
    the run's first job, not one an earlier run left."""
    previous = os.environ.get(job_session.ARCHIVE_ENV)
    os.environ[job_session.ARCHIVE_ENV] = str(work / "spark-classes.jsa")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(job_session.ARCHIVE_ENV, None)
        else:
            os.environ[job_session.ARCHIVE_ENV] = previous


def linear_fit(points: list[tuple[int, float]]) -> dict[str, float]:
    """Least squares ``seconds = fixed + slope * records``; slope per million, r²."""
    n = len(points)
    xs = [records / 1e6 for records, _ in points]
    ys = [seconds for _, seconds in points]
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    fixed = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for y in ys)
    residual = sum((y - fixed - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return {
        "fixed_s": round(fixed, 2),
        "slope_s_per_million": round(slope, 2),
        "r_squared": round(1 - residual / total, 3) if total else 1.0,
    }


def fits(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The linear fit of each job and its peers (over the runs that have the job), and the
    ratio the fits give at 10M records."""
    found: dict[str, Any] = {}

    def at(fit: dict[str, float], millions: float) -> float:
        return fit["fixed_s"] + fit["slope_s_per_million"] * millions

    for job in ("snapshot", "compaction"):
        having = [run for run in runs if job in run and not run[job].get("from_an_earlier_run")]
        if len({run["records"] for run in having}) < 2:
            continue
        spark = linear_fit([(run["records"], run[job]["spark_s"]) for run in having])
        peer = linear_fit([(run["records"], run[job]["peer_s"]) for run in having])
        found[job] = {
            "spark": spark,
            "peer": peer,
            "ratio_at_10m_from_fits": round(at(spark, 10) / at(peer, 10), 2),
        }
        kafka_source = [run for run in having if "spark_kafka_source_s" in run[job]]
        if len({run["records"] for run in kafka_source}) >= 2:
            fit = linear_fit(
                [(run["records"], run[job]["spark_kafka_source_s"]) for run in kafka_source]
            )
            found[job]["spark_kafka_source"] = fit
            found[job]["ratio_to_spark_kafka_source_at_10m_from_fits"] = round(
                at(spark, 10) / at(fit, 10), 2
            )
    return found


# ----------------------------------------------------------------------------- main


def measure_compaction(bootstrap: str, topic: str, size: int, work: Path) -> dict[str, Any]:
    spark_compaction_s, spark_compaction = run_job(
        "compaction",
        ["--bootstrap", bootstrap, "--topic", topic, "--output", f"file://{work}/ckpt-{size}"],
    )
    peer_compaction_s, peer_compact = timed(
        peer_compaction, bootstrap, topic, work / f"peer-ckpt-{size}"
    )
    if spark_compaction["records"] != peer_compact["records"]:
        raise RuntimeError("the compaction job and its peer disagree")
    return {
        "spark_s": round(spark_compaction_s, 2),
        "peer_s": round(peer_compaction_s, 2),
        "spark_records_per_s": round(size / spark_compaction_s),
        "peer_records_per_s": round(size / peer_compaction_s),
        "ratio": round(spark_compaction_s / peer_compaction_s, 2),
        "checkpoint_records": spark_compaction["records"],
    }


def measure(
    bootstrap: str,
    size: int,
    work: Path,
    with_loader: bool,
    with_compaction: bool = True,
    live_keys: int | None = None,
) -> dict[str, Any]:
    topic = f"bench-jobs-{size}" if live_keys is None else f"bench-jobs-{size}-{live_keys}"
    fill(bootstrap, topic, size, live_keys)
    common = ["--bootstrap", bootstrap, "--topic", topic]
    spark_snapshot_s, spark_snapshot = run_job(
        "snapshot", [*common, "--group", GROUP, "--output", f"file://{work}/snap-{size}"]
    )
    peer_snapshot_s, peer_snap = timed(peer_snapshot, bootstrap, topic, work / f"peer-snap-{size}")
    if spark_snapshot["checksum"] != peer_snap["checksum"]:
        raise RuntimeError("the snapshot job and its peer disagree")
    kafka_source_s, kafka_source = run_spark_kafka(
        [*common, "--group", GROUP, "--output", f"file://{work}/spark-kafka-snap-{size}"]
    )
    if kafka_source["checksum"] != spark_snapshot["checksum"]:
        raise RuntimeError("the snapshot job and Spark's Kafka source disagree")
    result: dict[str, Any] = {
        "records": size,
        "live_keys": spark_snapshot["records"],
        "snapshot": {
            "spark_s": round(spark_snapshot_s, 2),
            "peer_s": round(peer_snapshot_s, 2),
            "spark_records_per_s": round(size / spark_snapshot_s),
            "peer_records_per_s": round(size / peer_snapshot_s),
            "ratio": round(spark_snapshot_s / peer_snapshot_s, 2),
            # The second peer: the same snapshot read through Spark's own Kafka source.
            "spark_kafka_source_s": round(kafka_source_s, 2),
            "spark_kafka_source_records_per_s": round(size / kafka_source_s),
            "ratio_to_spark_kafka_source": round(spark_snapshot_s / kafka_source_s, 2),
            "spark_kafka_connector": kafka_source["connector_version"],
        },
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if with_compaction:
        result["compaction"] = measure_compaction(bootstrap, topic, size, work)
    if with_loader:
        result["loader"] = measure_loader(bootstrap, topic, work / f"ckpt-{size}")
    print(json.dumps(result), flush=True)
    return result


def measure_warm(bootstrap: str, sizes: tuple[int, ...], work: Path) -> list[dict[str, Any]]:
    """The same jobs in one already started session: the cost that grows with the records."""
    from kafka_group_jobs import compaction, session, snapshot

    spark = session.build_session("kafka-group-jobs-bench", "local[2]")
    try:
        warm = []
        for size in sizes:
            topic = f"bench-jobs-{size}"
            snapshot_s, _ = timed(
                snapshot.take, spark, bootstrap, topic, GROUP, f"file://{work}/warm-snap-{size}"
            )
            compaction_s, _ = timed(
                compaction.compact,
                spark,
                bootstrap,
                topic,
                f"file://{work}/warm-ckpt-{size}",
            )
            warm.append(
                {
                    "records": size,
                    "snapshot_s": round(snapshot_s, 2),
                    "snapshot_records_per_s": round(size / snapshot_s),
                    "compaction_s": round(compaction_s, 2),
                    "compaction_records_per_s": round(size / compaction_s),
                }
            )
            print(json.dumps(warm[-1]), flush=True)
        return warm
    finally:
        spark.stop()


def loader_only(size: int) -> int:
    """Only the loader figures of the largest run, replaced in the existing results."""
    with embedded.running_broker() as broker, tempfile.TemporaryDirectory() as work:
        topic = f"bench-jobs-{size}"
        fill(broker.bootstrap, topic, size)
        run_job(
            "compaction",
            [
                *("--bootstrap", broker.bootstrap, "--topic", topic),
                *("--output", f"file://{work}/ckpt"),
            ],
        )
        figures = measure_loader(broker.bootstrap, topic, Path(work) / "ckpt")
    print(json.dumps(figures), flush=True)
    summary = json.loads(RESULTS.read_text())
    largest = max(summary["runs"], key=lambda run: run["records"])
    if largest["records"] != size:
        raise RuntimeError(f"the results' largest run has {largest['records']} records")
    largest["loader"] = figures
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def group_partitions_only(sizes: tuple[int, ...], live_keys: int) -> int:
    """Only the snapshot and its two peers, on a group that commits ``live_keys`` partitions
    over and over; into a results file of their own."""
    runs = []
    with (
        embedded.running_broker() as broker,
        tempfile.TemporaryDirectory() as work,
        fresh_class_archive(Path(work)),
    ):
        fill(broker.bootstrap, "bench-jobs-first-record", 20_000)
        record_class_archive(broker.bootstrap, "bench-jobs-first-record", Path(work))
        for size in sizes:
            runs.append(measure(broker.bootstrap, size, Path(work), False, False, live_keys))
    results = RESULTS.with_name(f"jobs-group-partitions-{live_keys}.json")
    summary = {
        "benchmark": "jobs",
        "master": "local[2]",
        "group_partitions": live_keys,
        "runs": runs,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    results.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {results}")
    return 0


def first_record_only() -> int:
    """Only the time-to-first-record figures, replaced in the existing results."""
    with (
        embedded.running_broker() as broker,
        tempfile.TemporaryDirectory() as work,
        fresh_class_archive(Path(work)),
    ):
        topic = "bench-jobs-first-record"
        fill(broker.bootstrap, topic, 20_000)
        archive = record_class_archive(broker.bootstrap, topic, Path(work))
        figures = first_record(broker.bootstrap, topic)
    summary = json.loads(RESULTS.read_text())
    summary["first_record"] = figures
    summary["class_archive"] = archive
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


SPARK_APPLICATION_RESULTS = RESULTS.with_name("jobs-spark-application.json")


def run_spark_application(
    bootstrap: str,
    topic: str,
    output: str,
    archive: Path,
    home: Path,
    jvm_share: str = "-Xshare:auto",
) -> tuple[float, dict[str, Any]]:
    """The snapshot of ``topic`` as its OffsetSnapshot's SparkApplication runs it, on the
    Spark at ``home``; the manifest it leaves at ``output`` is its result."""
    from bench import spark_application
    from kafka_group_operator.jobs import runner, runs
    from kafka_group_operator.manifests import spark_application as spark_manifests

    owner = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "OffsetSnapshot",
        "metadata": {"name": "bench", "namespace": "bench", "uid": output},
        "spec": {"consumerGroupRef": {"name": GROUP}, "storage": {"uri": output}},
    }
    run = runs.snapshot_run(owner, 1, bootstrap, topic, GROUP)
    application = runner.build_application(
        run, spark_manifests.SparkSettings(image="kafka-group-jobs")
    )
    command = spark_application.submit_command(application, class_archive=archive, home=home)
    command = [part.replace("-Xshare:auto", jvm_share) for part in command]
    elapsed, done = timed_process(
        command,
        "the SparkApplication run",
        env=spark_application.driver_environment(application, {}, home=home),
    )
    manifest = runner.read_result(run.result_uri)
    if manifest is None:
        raise RuntimeError(f"the SparkApplication run left no manifest:\n{done.stdout[-3000:]}")
    return elapsed, manifest


def record_image_archive(home: Path, archive: Path) -> float:
    """The class archive of the Spark at ``home``, recorded as the image's build records it
    (Dockerfile: ``python -m kafka_group_jobs.warmup``); how long that took."""
    elapsed, _ = timed_process(
        [sys.executable, "-m", "kafka_group_jobs.warmup", str(archive)],
        "the warm-up",
        env={**os.environ, "SPARK_HOME": str(home)},
    )
    if not archive.is_file():
        raise RuntimeError("the warm-up recorded no class archive")
    return elapsed


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def spark_application_only(sizes: tuple[int, ...], rounds: int = 3) -> int:
    """The snapshot as a SparkApplication's driver runs it, on Spark as the image lays it out
    and as the distribution does, against the local path."""
    from bench import spark_application

    with (
        embedded.running_broker() as broker,
        tempfile.TemporaryDirectory() as work_dir,
        fresh_class_archive(Path(work_dir)),
    ):
        work = Path(work_dir)
        # Each layout has its own archive: the JVM maps one only for the class path it was
        # recorded with.
        layouts = {
            "image": spark_application.image_spark_home(work),
            "distribution": spark_application.spark_home(),
        }
        archives = {name: work / f"{name}-spark-classes.jsa" for name in layouts}
        warmup_s = {name: record_image_archive(layouts[name], archives[name]) for name in layouts}
        fill(broker.bootstrap, "bench-jobs-first-record", 20_000)
        record_class_archive(broker.bootstrap, "bench-jobs-first-record", work)
        for name, home in layouts.items():
            # Refused to start unless the application's JVM maps the archive.
            run_spark_application(
                broker.bootstrap,
                "bench-jobs-first-record",
                (work / f"share-on-{name}").as_uri(),
                archives[name],
                home,
                "-Xshare:on",
            )
        measured = []
        for size in (20_000, *sizes):
            topic = "bench-jobs-first-record" if size == 20_000 else f"bench-jobs-{size}"
            if size != 20_000:
                fill(broker.bootstrap, topic, size)
            times: dict[str, list[float]] = {"local_path": [], "image": [], "distribution": []}
            live_keys = set()
            for turn in range(rounds):
                elapsed, result = run_job(
                    "snapshot",
                    [
                        *("--bootstrap", broker.bootstrap, "--topic", topic),
                        *("--group", GROUP, "--output", f"file://{work}/l-{size}-{turn}"),
                    ],
                )
                times["local_path"].append(elapsed)
                live_keys.add(result["records"])
                for name, home in layouts.items():
                    elapsed, manifest = run_spark_application(
                        broker.bootstrap,
                        topic,
                        (work / f"{name}-{size}-{turn}").as_uri(),
                        archives[name],
                        home,
                    )
                    times[name].append(elapsed)
                    live_keys.add(manifest["records"])
            if len(live_keys) != 1:
                raise RuntimeError(f"the runs disagree on the live keys: {live_keys}")
            figures = {
                "records": size,
                "live_keys": live_keys.pop(),
                "local_path_s": [round(s, 2) for s in times["local_path"]],
                "spark_application_image_layout_s": [round(s, 2) for s in times["image"]],
                "spark_application_distribution_layout_s": [
                    round(s, 2) for s in times["distribution"]
                ],
                "image_layout_vs_local_path": round(
                    median(times["image"]) / median(times["local_path"]), 2
                ),
                "distribution_layout_vs_local_path": round(
                    median(times["distribution"]) / median(times["local_path"]), 2
                ),
                "load_average_1m": round(os.getloadavg()[0], 2),
            }
            print(json.dumps(figures), flush=True)
            measured.append(figures)
    summary = {
        "benchmark": "jobs --spark-application-only",
        "master": "local[2]",
        "warmup_s": {name: round(seconds, 2) for name, seconds in warmup_s.items()},
        "archive_mapped_with_xshare_on": True,
        "runs": measured,
        "cpus": os.cpu_count(),
    }
    SPARK_APPLICATION_RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def chosen_sizes(argv: list[str]) -> tuple[int, ...]:
    for arg in argv:
        if arg.startswith("--sizes="):
            return tuple(int(size) for size in arg.removeprefix("--sizes=").split(","))
    return QUICK_SIZES if "--quick" in argv else SIZES


def main(argv: list[str]) -> int:
    sizes = chosen_sizes(argv)
    if "--loader-only" in argv:
        return loader_only(sizes[-1])
    if "--first-record-only" in argv:
        return first_record_only()
    for arg in argv:
        if arg.startswith("--group-partitions="):
            return group_partitions_only(sizes, int(arg.split("=", 1)[1]))
    if "--spark-application-only" in argv:
        explicit = any(arg.startswith("--sizes=") for arg in argv)
        return spark_application_only(sizes if explicit else (1_000_000,))
    snapshot_only = "--snapshot-only" in argv
    merge = "--merge" in argv
    runs = []
    warm: list[dict[str, Any]] = []
    with (
        embedded.running_broker() as broker,
        tempfile.TemporaryDirectory() as work,
        fresh_class_archive(Path(work)),
    ):
        started = time.perf_counter()
        fill(broker.bootstrap, "bench-jobs-first-record", 20_000)
        archive = record_class_archive(broker.bootstrap, "bench-jobs-first-record", Path(work))
        figures = first_record(broker.bootstrap, "bench-jobs-first-record")
        for size in sizes:
            with_loader = size == sizes[-1] and "--no-loader" not in argv and not snapshot_only
            runs.append(measure(broker.bootstrap, size, Path(work), with_loader, not snapshot_only))
        if "--no-warm" not in argv and not snapshot_only:
            warm = measure_warm(broker.bootstrap, sizes, Path(work))
        print(f"bench jobs: {time.perf_counter() - started:.0f} s", flush=True)
    summary: dict[str, Any] = {}
    measured = list(runs)  # this run's: the only ones fitted
    if merge and RESULTS.exists():
        # Runs of other sizes are kept (each says its own load); these sizes are replaced.
        # A snapshot-only run keeps the earlier run's compaction and loader figures of its
        # size, marked as such.
        summary = json.loads(RESULTS.read_text())
        earlier = {run["records"]: run for run in summary.get("runs", [])}
        for run in runs:
            for part in ("compaction", "loader"):
                if part not in run and part in earlier.get(run["records"], {}):
                    run[part] = earlier[run["records"]][part] | {"from_an_earlier_run": True}
        runs = sorted(
            [run for size, run in earlier.items() if size not in sizes] + runs,
            key=lambda run: run["records"],
        )
    largest = measured[-1]
    first = measured[0]
    growth = largest["records"] / first["records"]
    scaling = {
        job: round((largest[job]["spark_s"] / first[job]["spark_s"]) / growth, 2)
        for job in ("snapshot", "compaction")
        if job in largest and job in first
    }
    warm_scaling = {
        job: round((warm[-1][f"{job}_s"] / warm[0][f"{job}_s"]) / growth, 2)
        for job in ("snapshot", "compaction")
        if warm
    }
    summary |= {
        "benchmark": "jobs",
        "master": "local[2]",
        "runs": runs,
        "targets": {
            "ratio_max": 1.5,
            "ratio_max_at_1m": 2.0,
            "fixed_cost_max_s": 15.0,
            "loader_speedup_min": 5.0,
            "first_record_max_s": 8.0,
        },
        # time(largest)/time(smallest) divided by records(largest)/records(smallest): 1.0 is
        # linear; below 1 the fixed JVM start is still a large share of the smallest run.
        "scaling_vs_linear": scaling,
        # seconds = fixed + slope * records, per job and peer (cold: JVM start included).
        "linear_fit": fits(measured) if len(measured) > 1 else None,
        "first_record": figures,
        # The run's first job, which recorded the JVM class archive the others start from.
        "class_archive": archive,
        # The machine is shared: the load average says how contended the two cores were.
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    if not snapshot_only:
        # The same jobs in a session already running (no JVM start): the part that grows.
        summary["warm_runs"] = warm
        summary["warm_scaling_vs_linear"] = warm_scaling
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["scaling_vs_linear"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
