"""Kafka I/O of the jobs through confluent-kafka: reading only (log ends, offset bounds, ranges).

Jobs read and plan; only the coordinator writes the state topic. So nothing here produces:
a job that needs a fixed end of the state partitions (a read fence) gets it from ``fence``,
which asks the coordinator (it appends load markers) or, with no coordinator, takes the
partitions' last stable offsets from ``stable_ends``. The state topic is written in
transactions, so a range may end with a transaction's commit marker, which no consumer
hands out: ``read_range`` knows it has reached its end from the consumer's position.

The data topics' bounds (``earliest``/``latest``) come from ``get_watermark_offsets``: there
the high watermark is the only standard answer. On tansu it is exact only for unbatched
produces, which the tests use; the jobs warn when a committed offset lies past it.

**librdkafka's own log.** A client that cannot reach its broker logs every failed connection
attempt (hundreds of lines in a few seconds). Every client here logs into ``CLIENT_LOG``
instead of stderr; a failure names the last line and how many there were, in its one message.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, not in __all__
    AdminClient,
    OffsetSpec,
)

from kafka_group_jobs import errors

DEFAULT_KAFKA_PORT = 9092
# ``read_range``: the most messages one call hands over, and how long it waits for the first.
READ_BATCH = 10_000
READ_WAIT_S = 0.5


class TopicError(errors.JobError):
    """A Kafka call of a job failed (the original error is chained)."""


class ClientLog(logging.Handler):
    """Counts librdkafka's log lines and keeps the last one, instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines = 0
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += 1
        # "FAIL [rdkafka#consumer-1] [thrd:host:9/bootstrap]: host:9/bootstrap: Connect..."
        self.last = record.getMessage().rpartition("]: ")[2]

    def reset(self) -> None:
        self.lines, self.last = 0, ""

    def summary(self) -> str:
        """``" (the Kafka client logged N lines; the last: ...)"``, or ``""``."""
        if not self.lines:
            return ""
        return f" (the Kafka client logged {self.lines} lines; the last: {self.last})"


CLIENT_LOG = ClientLog()
_client_logger = logging.getLogger("kafka_group_jobs.kafka_client")
_client_logger.addHandler(CLIENT_LOG)
_client_logger.setLevel(logging.DEBUG)
_client_logger.propagate = False


def client_config(bootstrap: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _client_logger}
    config.update(extra or {})
    return config


def failure(message: str, error: BaseException, consumer: Consumer) -> TopicError:
    """A one-line ``TopicError``: what failed, why, and the client's last log line.

    A consumer hands its queued log lines to the logger only when polled: one poll first.
    """
    with contextlib.suppress(Exception):
        consumer.poll(0)
    return TopicError(f"{message}: {_reason(error)}{CLIENT_LOG.summary()}")


def _reason(error: BaseException) -> str:
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return str(error.args[0].str())
    return str(error)


def bootstrap_servers(bootstrap: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a bootstrap list (``[v6]:port`` and a ``SCHEME://`` prefix too)."""
    servers = []
    for entry in bootstrap.split(","):
        address = entry.strip().rpartition("://")[2]
        if not address:
            continue
        host, colon, port = address.rpartition(":")
        if not colon or host.endswith(":") or not host:  # no port given (or a bare IPv6)
            host, port = address, str(DEFAULT_KAFKA_PORT)
        if not port.isdigit():
            raise errors.UsageError(f"--bootstrap: {entry.strip()!r} is not HOST:PORT")
        servers.append((host.strip("[]"), int(port)))
    if not servers:
        raise errors.UsageError("--bootstrap: no HOST:PORT given")
    return servers


def check_reachable(bootstrap: str, timeout_s: float = 1.5) -> None:
    """Raises ``TopicError`` unless one bootstrap server accepts a TCP connection.

    A plain connect, before any Kafka client starts: it fails in a second, where a client
    would retry (and log) until its own timeout.
    """
    reasons = []
    for host, port in bootstrap_servers(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as error:
            reasons.append(f"{host}:{port}: {error.strerror or error}")
    raise TopicError(f"cannot reach any Kafka bootstrap server ({'; '.join(reasons)})")


def reader_config(bootstrap: str, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A consumer that only ever ``assign``s: no group, no commits."""
    config = client_config(bootstrap, extra)
    config.update(
        {
            "group.id": "kafka-group-jobs",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
        }
    )
    return config


def partition_count(bootstrap: str, topic: str, extra: Mapping[str, str] | None = None) -> int:
    consumer = Consumer(reader_config(bootstrap, extra))
    try:
        metadata = consumer.list_topics(topic, timeout=10)
    except KafkaException as error:
        raise failure(f"cannot describe topic {topic!r}", error, consumer) from error
    finally:
        consumer.close()
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        raise TopicError(f"topic {topic!r} does not exist")
    return len(described.partitions)


def stable_ends(
    bootstrap: str, topic: str, partitions: Iterable[int], extra: Mapping[str, str] | None = None
) -> dict[int, int]:
    """The last stable offset of each partition: the end a ``read_committed`` reader reaches.

    Everything below it is committed (or aborted) for good, so a range ending there never
    changes, though the coordinator keeps appending after it.
    """
    admin = AdminClient(client_config(bootstrap, extra))
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    wanted = {TopicPartition(topic, partition): latest for partition in partitions}
    if not wanted:
        return {}
    try:
        futures = admin.list_offsets(
            wanted, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=10
        )
        return {tp.partition: future.result().offset for tp, future in futures.items()}
    except KafkaException as error:
        raise TopicError(
            f"cannot read the last stable offsets of {topic!r}: {_reason(error)}"
            + CLIENT_LOG.summary()
        ) from error


def earliest_offsets(
    bootstrap: str, topic: str, partitions: Iterable[int], extra: Mapping[str, str] | None = None
) -> dict[int, int]:
    bounds = watermarks(bootstrap, [(topic, p) for p in partitions], extra)
    return {partition: low for (_, partition), (low, _) in bounds.items()}


def watermarks(
    bootstrap: str,
    topic_partitions: Iterable[tuple[str, int]],
    extra: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], tuple[int, int]]:
    """``(earliest, latest)`` offsets of each partition."""
    consumer = Consumer(reader_config(bootstrap, extra))
    try:
        return {
            (topic, partition): consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10, cached=False
            )
            for topic, partition in topic_partitions
        }
    except KafkaException as error:
        raise failure("cannot read offsets", error, consumer) from error
    finally:
        consumer.close()


def topic_partitions(
    bootstrap: str, topics: Iterable[str], extra: Mapping[str, str] | None = None
) -> list[tuple[str, int]]:
    """Every partition of the given topics that exist (missing topics are left out)."""
    consumer = Consumer(reader_config(bootstrap, extra))
    try:
        found: list[tuple[str, int]] = []
        for topic in topics:
            described = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if described is None or described.error is not None:
                continue
            found.extend((topic, partition) for partition in sorted(described.partitions))
        return found
    except KafkaException as error:
        raise failure("cannot list partitions", error, consumer) from error
    finally:
        consumer.close()


def offsets_for_time(
    bootstrap: str,
    topic_partitions: Iterable[tuple[str, int]],
    timestamp_ms: int,
    extra: Mapping[str, str] | None = None,
) -> dict[tuple[str, int], int | None]:
    """First offset at or after ``timestamp_ms`` per partition (None when nothing is that new)."""
    consumer = Consumer(reader_config(bootstrap, extra))
    wanted = [TopicPartition(topic, p, timestamp_ms) for topic, p in topic_partitions]
    try:
        found = consumer.offsets_for_times(wanted, timeout=10) if wanted else []
    except KafkaException as error:
        raise failure("cannot look offsets up by time", error, consumer) from error
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}


def read_range(
    consumer: Consumer, topic: str, partition: int, start: int, end: int, stall_s: float = 30.0
) -> Iterable[list[Any]]:
    """Messages of ``[start, end)`` in batches, on an already created consumer.

    Raises ``TopicError`` when the broker hands out nothing for ``stall_s`` seconds before the
    end is reached: the range was promised by a read fence, so silence means trouble. The
    consumer's position moves past transaction markers, which are never handed out: it tells
    when a range ending with one is done.
    """
    consumer.assign([TopicPartition(topic, partition, start)])
    position = start
    quiet_since = time.monotonic()
    while position < end:
        # What is queued already, else the first message to arrive: ``consume`` returns early
        # only with a full batch, so a batch call with a timeout would wait it out whenever
        # fewer records were queued (the first fetches, a range's tail at the log end).
        batch = consumer.consume(num_messages=READ_BATCH, timeout=0) or consumer.consume(
            num_messages=1, timeout=READ_WAIT_S
        )
        wanted = []
        for message in batch:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise TopicError(f"reading {topic}[{partition}]: {error}")
            offset = message.offset()
            if offset is None:
                continue
            if start <= offset < end:
                wanted.append(message)
            position = max(position, offset + 1)
        if wanted:
            quiet_since = time.monotonic()
            yield wanted
        elif not batch:
            (reached,) = consumer.position([TopicPartition(topic, partition)])
            position = max(position, reached.offset)
        if not wanted and position < end and time.monotonic() - quiet_since > stall_s:
            raise TopicError(f"{topic}[{partition}] stalled at {position} before {end}")
    consumer.unassign()


def now_ms() -> int:
    return time.time_ns() // 1_000_000
