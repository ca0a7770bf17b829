"""Read-only Kafka lookups of the ``kgo`` commands: partitions, log bounds, offsets by time.

Offsets by time follow Kafka's ``ListOffsets`` semantics (the first offset whose record's
timestamp is at or after the time; none, so the log end, when no record is that new), and
are not taken on the broker's word alone: some Kafka-protocol brokers answer every time with
offset 0. A time in the future plans the log end without asking (nothing is that new, as
Kafka answers); any other answer is checked against the timestamps of the records it points
at, and when they contradict it the offset is found from the records themselves (a binary
search, which assumes timestamps that do not go back), with a warning.

librdkafka logs every failed connection attempt on its own (hundreds of lines for an
unreachable bootstrap). Here its log goes to a ``logging`` logger that only counts, and a
failure becomes one ``CommandError`` line naming the bootstrap, the client's last error and
how many log lines were held back.
"""

from __future__ import annotations

import logging
import sys
import time
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

    def __init__(
        self,
        bootstrap: str,
        extra: Mapping[str, str] | None = None,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        from confluent_kafka import Consumer

        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
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
            "socket.connection.setup.timeout.ms": max(int(timeout_s * 1000), 1000),
            # Records are read one at a time (``record_at``), each already in the log: the
            # broker need not hold a fetch back for more (librdkafka's default is 500 ms).
            "fetch.wait.max.ms": 10,
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
            self._consumer.list_topics(timeout=self.timeout_s)
        except KafkaException as error:
            raise self._failure("read metadata", error) from None

    def partitions(self, topics: Iterable[str]) -> dict[str, list[int]]:
        """Partition numbers of each topic; a topic that does not exist is an error."""
        from confluent_kafka import KafkaException

        try:
            # Metadata of every topic: asking for one by name makes some brokers create it.
            described = self._consumer.list_topics(timeout=self.timeout_s).topics
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
                    KafkaPartition(topic, partition), timeout=self.timeout_s, cached=False
                )
                for topic, partition in partitions
            }
        except KafkaException as error:
            raise self._failure("read log offsets", error) from None

    def offsets_for_time(
        self,
        bounds: Mapping[TopicPartition, tuple[int, int]],
        timestamp_ms: int,
        now_ms: int | None = None,
    ) -> dict[TopicPartition, int | None]:
        """The first offset at or after ``timestamp_ms`` of each partition of ``bounds``
        (``(earliest, latest)``); None when no record is that new (the plan takes the log end,
        as Kafka's tool does). See the module docstring for why the broker's answer is
        checked."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaPartition

        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        if timestamp_ms > now or not bounds:
            return dict.fromkeys(bounds)
        wanted = [KafkaPartition(topic, p, timestamp_ms) for topic, p in sorted(bounds)]
        try:
            found = self._consumer.offsets_for_times(wanted, timeout=self.timeout_s)
        except KafkaException as error:
            raise self._failure("look offsets up by time", error) from None
        answers = {
            (tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found
        }
        checked: dict[TopicPartition, int | None] = {}
        for tp, (earliest, latest) in sorted(bounds.items()):
            answer = answers.get(tp)
            if self._answer_holds(tp, answer, timestamp_ms, earliest, latest):
                checked[tp] = answer
                continue
            searched = self._search(tp, timestamp_ms, earliest, latest)
            sys.stderr.write(
                f"warning: {tp[0]}:{tp[1]}: the broker answered offset {answer} for that time, "
                "which its records' timestamps contradict; planned from the records instead "
                f"({'the log end' if searched is None else f'offset {searched}'})\n"
            )
            checked[tp] = searched
        return checked

    def _answer_holds(
        self, tp: TopicPartition, answer: int | None, at_ms: int, earliest: int, latest: int
    ) -> bool:
        """Whether ``answer`` is the first offset whose record is at least ``at_ms`` old."""
        if answer is None or answer >= latest:
            return True  # nothing that new: the log end (Kafka's own fallback)
        if answer < earliest:
            return False
        record = self.record_at(tp, answer, latest)
        if record is None or record[1] < at_ms:
            return False
        if answer == earliest:
            return True
        before = self.record_at(tp, answer - 1, latest)
        return before is not None and (before[0] >= answer or before[1] < at_ms)

    def _search(self, tp: TopicPartition, at_ms: int, earliest: int, latest: int) -> int | None:
        """The first offset in ``[earliest, latest)`` whose record is at or after ``at_ms``,
        by bisection over the records' timestamps; None when none is."""
        low, high, best = earliest, latest, None
        while low < high:
            middle = (low + high) // 2
            record = self.record_at(tp, middle, latest)
            if record is None:
                high = middle
            elif record[1] >= at_ms:
                best, high = record[0], middle
            else:
                low = record[0] + 1
        return best

    def record_at(self, tp: TopicPartition, offset: int, latest: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record at or after ``offset`` and before
        ``latest``; None when there is none."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaPartition

        try:
            self._consumer.assign([KafkaPartition(tp[0], tp[1], offset)])
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                message = self._consumer.poll(min(1.0, self.timeout_s))
                if message is None:
                    continue
                if message.error() is not None:
                    raise KafkaException(message.error())
                found = message.offset()
                if found is None or found >= latest:
                    return None
                return found, message.timestamp()[1]
        except KafkaException as error:
            raise self._failure("read a record", error) from None
        finally:
            self._consumer.unassign()
        raise common.CommandError(
            f"cannot read {tp[0]}:{tp[1]} at offset {offset} from Kafka at {self.bootstrap}: "
            f"no record within {self.timeout_s:g} s"
        )

    def close(self) -> None:
        self._consumer.close()
        self._logger.removeHandler(self._held_back)


@contextmanager
def lookup(bootstrap: str, timeout_s: float = TIMEOUT_S) -> Iterator[KafkaLookup]:
    client = KafkaLookup(bootstrap, timeout_s=timeout_s)
    try:
        yield client
    finally:
        client.close()
