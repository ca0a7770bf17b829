"""What every job's ``main`` shares: the common arguments, reading the state topic, the result.

Arguments are the same under ``spark-submit`` (a SparkApplication's ``arguments``) and under
``python -m kafka_group_jobs.<job>``: ``--bootstrap``, ``--topic`` (the state topic), ``--group``,
a storage URI, ``--as-of``, plus librdkafka settings from ``--kafka-config`` (JSON) or
``--kafka-config-dir`` (a mounted Secret: one file per property; ``ca.crt``, ``tls.crt`` and
``tls.key`` become the ``ssl.*.location`` settings).

A job prints its outcome for people: tables and a summary on stdout, warnings on stderr as
``warning: ...`` lines. With ``--json`` it prints instead one last line ``KGO-RESULT {json}``
on stdout (``kafka_group_records.results`` writes and parses it); the operator, the demo and
the benchmarks pass ``--json`` and read that line when they run a job as a subprocess.

``run`` wraps a job's ``main``: a wrong invocation (``errors.UsageError``, and every
``argparse`` error) is one line on stderr and exit 2; a failure at run time
(``errors.JobError``, a Spark error) is one line and exit 1 (a Spark error names the JVM's
log file, ``session.spark_log``); Ctrl-C (SIGINT) cancels the Spark job and is one line and
exit 130, with nothing left at the job's output location (``storage.staged``). Jobs check
what they can (the arguments, the broker, the topic, the paths, the coordinator) before they
start Spark, and before they import it: this module and the jobs' ``main`` import no pyspark
until then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from kafka_group_jobs import errors, fence, topics
from kafka_group_records import codec, partitioning, results

if TYPE_CHECKING:  # pyspark is imported only once a job runs Spark (see ``run``)
    from pyspark.sql import DataFrame, SparkSession

    from kafka_group_jobs import source

DEFAULT_STATE_TOPIC = "kafka-group-operator.group-state"
# A reading task's share of the records: the read spread over the job's cores, so that every
# core reads and each task hands Spark as few newest commits as it can (``source.read``), within
# these bounds: a task that fails is read again whole, and progress counts whole tasks.
MIN_RECORDS_PER_SPLIT = 50_000
MAX_RECORDS_PER_SPLIT = 1_000_000

_FILE_SETTINGS = {
    "ca.crt": "ssl.ca.location",
    "tls.crt": "ssl.certificate.location",
    "tls.key": "ssl.key.location",
}


class JobParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``UsageError``s: one line, not the usage block."""

    def error(self, message: str) -> NoReturn:
        raise errors.UsageError(message)


def parser(job: str, description: str) -> argparse.ArgumentParser:
    parsed = JobParser(prog=f"kafka_group_jobs.{job}", description=description)
    parsed.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parsed.add_argument("--topic", default=DEFAULT_STATE_TOPIC, help="the state topic")
    parsed.add_argument("--kafka-config", default="{}", help="extra librdkafka settings, JSON")
    parsed.add_argument("--kafka-config-dir", help="a directory of librdkafka settings")
    parsed.add_argument(
        "--master",
        help="Spark master (spark-submit sets it; default local[2], tuned to start fast)",
    )
    parsed.add_argument(
        "--spark-ui",
        action="store_true",
        help="serve Spark's web UI (on 127.0.0.1 on a local master; off by default)",
    )
    parsed.add_argument(
        "--json", action="store_true", help="print only one KGO-RESULT {json} line on stdout"
    )
    return parsed


def run(job: str, main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """``main(argv)``, with every expected failure turned into one stderr line and an exit code."""
    # The client log counts for one job: a run starts from nothing (several jobs may run in one
    # process, as they do in tests).
    topics.CLIENT_LOG.reset()
    try:
        return main(argv)
    except errors.UsageError as error:
        return _fail(job, str(error), errors.USAGE_EXIT)
    except errors.JobError as error:
        return _fail(job, str(error), errors.RUNTIME_EXIT)
    except (Exception, KeyboardInterrupt) as error:
        # Whatever a Spark call stopped by Ctrl-C fails with is the echo of the interrupt.
        if isinstance(error, KeyboardInterrupt) or _spark_interrupted():
            return _fail(job, INTERRUPTED, INTERRUPTED_EXIT)
        # Spark's errors carry the JVM's stack in their text; their first line is the reason.
        if type(error).__module__.startswith(("pyspark", "py4j")):
            return _fail(job, spark_reason(error) + _log_note(), errors.RUNTIME_EXIT)
        raise


# As a shell reports a command ended by SIGINT.
INTERRUPTED_EXIT = 130
INTERRUPTED = "interrupted: the job stopped, leaving nothing half-written"


def _spark_interrupted() -> bool:
    session = sys.modules.get("kafka_group_jobs.session")
    return session is not None and bool(session.interrupted())


def _log_note() -> str:
    """Where the JVM's own log is, when this process started the JVM."""
    session = sys.modules.get("kafka_group_jobs.session")
    log = session.spark_log() if session is not None else None
    return f" (Spark's log: {log})" if log is not None else ""


def _fail(job: str, message: str, code: int) -> int:
    sys.stdout.flush()
    sys.stderr.write(f"kafka_group_jobs.{job}: error: {' '.join(message.split())}\n")
    sys.stderr.flush()
    return code


def spark_reason(error: BaseException) -> str:
    """The first line of a Spark error: the Java exception's own message when there is one."""
    java = getattr(error, "java_exception", None)
    text = str(java.toString()) if java is not None else str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def kafka_config(args: argparse.Namespace) -> dict[str, str]:
    """The librdkafka settings of ``--kafka-config`` and ``--kafka-config-dir``."""
    try:
        parsed = json.loads(args.kafka_config)
    except ValueError as error:
        raise errors.UsageError(f"--kafka-config is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise errors.UsageError("--kafka-config must be a JSON object of librdkafka settings")
    config = {str(key): str(value) for key, value in parsed.items()}
    if args.kafka_config_dir:
        directory = Path(args.kafka_config_dir)
        if not directory.is_dir():
            raise errors.UsageError(f"--kafka-config-dir: no directory {directory}")
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                if path.name in _FILE_SETTINGS:
                    config[_FILE_SETTINGS[path.name]] = str(path)
                else:
                    config[path.name] = path.read_text().strip()
    return config


def check_state_topic(bootstrap: str, topic: str, config: dict[str, str]) -> int:
    """Before Spark: the broker answers and the state topic exists; its partition count."""
    topics.check_reachable(bootstrap)
    return topics.partition_count(bootstrap, topic, config)


def check_group(group: str) -> None:
    """``UsageError`` unless Kafka could name a group ``group`` (not empty, UTF-8 of at most
    32,767 bytes)."""
    if not group:
        raise errors.UsageError("--group must not be empty")
    try:
        codec.offset_commit_key_prefixes(group)
    except codec.CodecError as error:
        raise errors.UsageError(f"--group is not a Kafka group id: {error}") from None


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 time (UTC when it names no zone)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise errors.UsageError(f"not an ISO-8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def iso_time(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def read_state(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    config: dict[str, str],
    partitions: list[int] | None = None,
    starts: dict[int, int] | None = None,
    fenced: fence.ReadFence | None = None,
    commits_of: str | None = None,
    as_of_ms: int | None = None,
) -> tuple[DataFrame, fence.ReadFence, list[source.OffsetRange]]:
    """The state topic up to a read fence (``fenced``, taken before Spark started; else the
    last stable offsets of ``partitions``, all by default), the fence, and the offset ranges
    the frame's reading tasks cover (in task order, for ``progress``). With ``commits_of``,
    the frame holds that group's newest offset commits (at or before ``as_of_ms``) only
    (``source.read``).

    The bounds are fixed here, once, so every action on the frame reads the same records.
    """
    from kafka_group_jobs import source

    if fenced is None:
        chosen = (
            list(range(topics.partition_count(bootstrap, topic, config)))
            if partitions is None
            else partitions
        )
        fenced = fence.obtain(bootstrap, topic, chosen, config)
    ends = fenced.end_offsets
    if starts is None:
        starts = topics.earliest_offsets(bootstrap, topic, ends, config)
    records = sum(max(end - starts.get(partition, 0), 0) for partition, end in ends.items())
    per_task = records_per_split(records, spark.sparkContext.defaultParallelism)
    ranges = source.split_ranges(starts, ends, per_task)
    frame = source.read(spark, bootstrap, topic, ranges, config, commits_of, as_of_ms)
    return frame, fenced, ranges


def records_per_split(records: int, cores: int) -> int:
    """How many records each reading task reads: ``records`` shared over ``cores``, between
    ``MIN_RECORDS_PER_SPLIT`` and ``MAX_RECORDS_PER_SPLIT`` (at least one)."""
    share = -(-records // max(cores, 1))
    return max(1, min(MAX_RECORDS_PER_SPLIT, max(MIN_RECORDS_PER_SPLIT, share)))


def take_fence(
    bootstrap: str,
    topic: str,
    config: dict[str, str],
    coordinator: fence.Coordinator | None,
    group: str | None = None,
) -> fence.ReadFence:
    """Before Spark: the read fence over ``group``'s state partition (every partition when
    ``group`` is None), so that a coordinator that refuses is one line before Spark starts."""
    count = topics.partition_count(bootstrap, topic, config)
    chosen = list(range(count)) if group is None else [partitioning.partition_for(group, count)]
    return fence.obtain(bootstrap, topic, chosen, config, coordinator, group is None)


def given_fence(text: str, partition_count: int) -> fence.ReadFence:
    """A read fence the coordinator already took (``--fenced-ends``: JSON ``{partition: end}``
    over every state partition): the operator takes one for the compaction it runs, from each
    partition's coordinator through its internal API, which no group's token could ask for."""
    try:
        parsed = json.loads(text)
        ends = {int(partition): int(end) for partition, end in parsed.items()}
    except (ValueError, TypeError, AttributeError):
        raise errors.UsageError(
            f"--fenced-ends must be a JSON object {{partition: end offset}}, not {text!r}"
        ) from None
    missing = sorted(set(range(partition_count)) - set(ends))
    if missing or any(end < 0 for end in ends.values()):
        raise errors.UsageError(
            f"--fenced-ends must give an end offset of at least 0 for each of the state"
            f" topic's {partition_count} partitions (missing: {missing or 'none'})"
        )
    return fence.ReadFence(
        fence.COORDINATOR, {p: end for p, end in ends.items() if p < partition_count}
    )


def add_coordinator(parsed: argparse.ArgumentParser, what: str) -> None:
    """``--coordinator-url`` and ``--token``: the coordinator to ask (``what`` it is for)."""
    parsed.add_argument("--coordinator-url", help=f"the coordinator's HTTP API, {what}")
    parsed.add_argument(
        "--token",
        default=os.environ.get("KGO_GROUP_TOKEN"),
        help="the group's bearer token (default: $KGO_GROUP_TOKEN)",
    )


def coordinator_of(args: argparse.Namespace, group: str | None) -> fence.Coordinator | None:
    """The coordinator of ``group`` that ``--coordinator-url`` (checked to be http(s)) leads
    to, or None."""
    url = args.coordinator_url
    if not url:
        return None
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise errors.UsageError(f"--coordinator-url: not an http(s) URL: {url}")
    if not group:
        raise errors.UsageError("--coordinator-url needs --group: its token authenticates")
    # The URL may be any coordinator's (a Service before several replicas): ask it whose.
    return fence.locate(fence.Coordinator(url, group, args.token))


def emit_result(result: dict[str, Any]) -> None:
    """The ``--json`` output: the one result line the operator reads (``results``)."""
    sys.stdout.write(results.result_line(result) + "\n")
    sys.stdout.flush()


def say(*lines: str) -> None:
    """Lines for people, on stdout."""
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def warn(message: str) -> None:
    """One ``warning:`` line on stderr."""
    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()


def note_client_warnings() -> None:
    """One line for what librdkafka logged during a job that still succeeded, if anything."""
    summary = topics.CLIENT_LOG.summary()
    if summary:
        warn(summary.strip(" ()"))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Left-aligned text columns, numbers right-aligned, ``None`` shown as ``-``."""
    cells = [["-" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [
        max([len(header)] + [len(row[index]) for row in cells])
        for index, header in enumerate(headers)
    ]
    numeric = [
        all(isinstance(row[index], int) or row[index] is None for row in rows) and bool(rows)
        for index in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return (
            "  "
            + "  ".join(
                value.rjust(width) if right else value.ljust(width)
                for value, width, right in zip(values, widths, numeric, strict=True)
            ).rstrip()
        )

    return [line(list(headers)), *(line(row) for row in cells)]
