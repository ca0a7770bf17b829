"""What every job's ``main`` shares: the common arguments, reading the state topic, the result.

Arguments are the same under ``spark-submit`` (a SparkApplication's ``arguments``) and under
``python -m kafka_group_jobs.<job>``: ``--bootstrap``, ``--topic`` (the state topic), ``--group``,
a storage URI, ``--as-of``, plus librdkafka settings from ``--kafka-config`` (JSON) or
``--kafka-config-dir`` (a mounted Secret: one file per property; ``ca.crt``, ``tls.crt`` and
``tls.key`` become the ``ssl.*.location`` settings).

A job prints its outcome as one last line ``KGO-RESULT {json}`` on stdout; the operator reads
it when it runs the job as a local subprocess.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from kafka_group_jobs import topics

RESULT_PREFIX = "KGO-RESULT "
DEFAULT_STATE_TOPIC = "kafka-group-operator.group-state"
# Eight tasks per million records: enough to keep two local cores and a few executors busy.
RECORDS_PER_SPLIT = 125_000

_FILE_SETTINGS = {
    "ca.crt": "ssl.ca.location",
    "tls.crt": "ssl.certificate.location",
    "tls.key": "ssl.key.location",
}


def parser(description: str) -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(description=description)
    parsed.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parsed.add_argument("--topic", default=DEFAULT_STATE_TOPIC, help="the state topic")
    parsed.add_argument("--kafka-config", default="{}", help="extra librdkafka settings, JSON")
    parsed.add_argument("--kafka-config-dir", help="a directory of librdkafka settings")
    parsed.add_argument("--master", help="Spark master (spark-submit sets it; default local)")
    return parsed


def kafka_config(args: argparse.Namespace) -> dict[str, str]:
    config: dict[str, str] = dict(json.loads(args.kafka_config))
    if args.kafka_config_dir:
        for path in sorted(Path(args.kafka_config_dir).iterdir()):
            if path.is_file() and not path.name.startswith("."):
                if path.name in _FILE_SETTINGS:
                    config[_FILE_SETTINGS[path.name]] = str(path)
                else:
                    config[path.name] = path.read_text().strip()
    return config


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 time (UTC when it names no zone)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
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
) -> tuple[DataFrame, dict[int, int]]:
    """The state topic up to fresh load markers, and the exclusive end offset per partition.

    The ends are fixed here, once, so every action on the frame reads the same records.
    """
    ends = topics.mark_ends(bootstrap, topic, config, partitions)
    reader = (
        spark.read.format("kgo-state")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("kafkaConfig", json.dumps(config))
        .option("endOffsets", json.dumps(ends))
        .option("maxRecordsPerSplit", str(RECORDS_PER_SPLIT))
    )
    if starts is not None:
        reader = reader.option("startOffsets", json.dumps(starts))
    return reader.load(), ends


def emit_result(result: dict[str, Any]) -> None:
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def parse_result(output: str) -> dict[str, Any] | None:
    """The ``KGO-RESULT`` document of a job's stdout, if it printed one."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            parsed: dict[str, Any] = json.loads(line.removeprefix(RESULT_PREFIX))
            return parsed
    return None
