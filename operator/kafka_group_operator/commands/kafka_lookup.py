"""Read-only Kafka lookups of the ``kgo`` commands: partitions, log bounds, offsets by time.

librdkafka logs every failed connection attempt on its own (hundreds of lines for an
unreachable bootstrap). Here its log goes to a ``logging`` logger that only counts, and a
failure becomes one ``CommandError`` line naming the bootstrap, the client's last error and
how many log lines were held back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from kafka_group_operator.commands import common

TopicPartition = tuple[str, int]

TIMEOUT_S = 10.0


def _text(error: object) -> str:
    """A librdkafka error's own words ("Local: Broker transport failure"), not its repr."""
    words = getattr(error, "str", None)
    return str(words()) if callable(words) else str(error)


class _HeldBack(logging.Handler):
    """Counts librdkafka's log lines and keeps the last one, printing none."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.last = record.getMessage()


class KafkaLookup:
    """One consumer (no group, never subscribes) for metadata and offset lookups."""

    def __init__(self, bootstrap: str, extra: Mapping[str, str] | None = None) -> None:
        from confluent_kafka import Consumer

        self.bootstrap = bootstrap
        self._held_back = _HeldBack()
        self._logger = logging.getLogger(f"kgo.librdkafka.{id(self)}")
        self._logger.propagate = False
        self._logger.addHandler(self._held_back)
        self._errors: list[str] = []
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": "kgo-cli",
            "enable.auto.commit": False,
            "logger": self._logger,
            "error_cb": lambda error: self._errors.append(_text(error)),
            "socket.connection.setup.timeout.ms": int(TIMEOUT_S * 1000),
            # Log ends are last stable offsets, as the coordinator's lag uses.
            "isolation.level": "read_committed",
        }
        config.update(extra or {})
        self._consumer = Consumer(config)

    def _failure(self, what: str, error: Exception) -> common.CommandError:
        last = self._errors[-1] if self._errors else _text(error.args[0] if error.args else error)
        held = self._held_back.count + max(len(self._errors) - 1, 0)
        suffix = f" ({held} more client messages held back)" if held else ""
        return common.CommandError(f"cannot {what} from Kafka at {self.bootstrap}: {last}{suffix}")

    def check_reachable(self) -> None:
        """Raise the one-line ``CommandError`` unless the brokers answer a metadata request."""
        from confluent_kafka import KafkaException

        try:
            self._consumer.list_topics(timeout=TIMEOUT_S)
        except KafkaException as error:
            raise self._failure("read metadata", error) from None

    def partitions(self, topics: Iterable[str]) -> dict[str, list[int]]:
        """Partition numbers of each topic; a topic that does not exist is an error."""
        from confluent_kafka import KafkaException

        try:
            # Metadata of every topic: asking for one by name makes some brokers create it.
            described = self._consumer.list_topics(timeout=TIMEOUT_S).topics
        except KafkaException as error:
            raise self._failure("read metadata", error) from None
        found: dict[str, list[int]] = {}
        for topic in topics:
            metadata = described.get(topic)
            if metadata is None or metadata.error is not None or not metadata.partitions:
                raise common.CommandError(f"topic {topic!r} does not exist")
            found[topic] = sorted(metadata.partitions)
        return found

    def bounds(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """``(earliest, latest)`` of each partition: log start and log end."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaPartition

        try:
            return {
                (topic, partition): self._consumer.get_watermark_offsets(
                    KafkaPartition(topic, partition), timeout=TIMEOUT_S, cached=False
                )
                for topic, partition in partitions
            }
        except KafkaException as error:
            raise self._failure("read log offsets", error) from None

    def offsets_for_time(
        self, partitions: Sequence[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """First offset at or after ``timestamp_ms`` (None when no message is that new)."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaPartition

        wanted = [KafkaPartition(topic, p, timestamp_ms) for topic, p in partitions]
        try:
            found = self._consumer.offsets_for_times(wanted, timeout=TIMEOUT_S) if wanted else []
        except KafkaException as error:
            raise self._failure("look offsets up by time", error) from None
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}

    def close(self) -> None:
        self._consumer.close()
        self._logger.removeHandler(self._held_back)


@contextmanager
def lookup(bootstrap: str) -> Iterator[KafkaLookup]:
    client = KafkaLookup(bootstrap)
    try:
        yield client
    finally:
        client.close()
