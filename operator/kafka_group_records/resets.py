"""Offset resets as ``kafka-consumer-groups.sh --reset-offsets`` plans them, in plain Python.

Pure functions shared by ``kgo groups reset-offsets`` and ``import`` (and usable by the Spark
restore job, whose DataFrame plan in ``kafka_group_jobs.transforms`` follows the same rules):

* targets: ``earliest`` (log start), ``latest`` (log end), ``current`` (the committed offset,
  the log end for a partition without one, as Kafka's ``--to-current``), ``offset`` N,
  ``shift-by`` ±N from the committed offset (refused for a partition without one, as Kafka's
  tool), ``datetime`` and ``duration`` (the first offset at or after a time, the log end when
  nothing is that new), and ``file`` (offsets given per partition);
* a time must name its zone: ``kafka-consumer-groups.sh`` reads one without a zone as UTC,
  which a reader of the command line cannot tell from local time, so it is refused here with
  the two ways to write it;
* every requested offset outside ``[earliest, latest]`` is clamped into it and the clamp is
  reported, as Kafka's tool warns "New offset (...) is higher than latest offset";
* the CSV of ``kafka-consumer-groups.sh --export`` for one group: ``topic,partition,offset``
  per line, no header (Kafka's ``CsvUtils.CsvRecordNoGroup``; with several groups Kafka
  writes ``group,topic,partition,offset``, ``CsvRecordWithGroup``, also read here).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

TopicPartition = tuple[str, int]

RESET_KINDS = (
    "earliest",
    "latest",
    "current",
    "offset",
    "shift-by",
    "datetime",
    "duration",
    "file",
)

_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def parse_duration_ms(text: str) -> int:
    """Milliseconds of an ISO-8601 duration with days, hours, minutes and seconds."""
    match = _DURATION.match(text)
    if match is None or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"not an ISO-8601 duration (PnDTnHnMnS): {text!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 time that names its zone (``Z`` or
    ``±hh:mm``); one without a zone is refused (see the module docstring)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not an ISO-8601 time (e.g. 2026-11-21T12:00:00Z): {text!r}") from None
    if moment.tzinfo is None:
        raise ValueError(
            f"the time {text!r} names no zone: write {text}Z for UTC or {text}+01:00 for an "
            "offset from it (kafka-consumer-groups.sh would read it as UTC, not local time)"
        )
    return int(moment.timestamp() * 1000)


def parse_topic_scope(spec: str) -> tuple[str, tuple[int, ...] | None]:
    """``"t"`` -> ``("t", None)`` (every partition); ``"t:0,2"`` -> ``("t", (0, 2))``."""
    topic, separator, numbers = spec.rpartition(":")
    if not separator:
        topic, numbers = spec, ""
    if not topic:
        raise ValueError(f"expected TOPIC or TOPIC:P[,P...], got {spec!r}")
    if not separator:
        return topic, None
    try:
        partitions = tuple(int(number) for number in numbers.split(","))
    except ValueError:
        raise ValueError(f"expected TOPIC:P[,P...] with partition numbers, got {spec!r}") from None
    if any(partition < 0 for partition in partitions):
        raise ValueError(f"partition numbers must not be negative: {spec!r}")
    return topic, partitions


@dataclass(frozen=True, slots=True)
class PlannedOffset:
    """One partition's reset: the committed offset (None: none), asked for, and written."""

    topic: str
    partition: int
    current: int | None
    requested: int
    new: int
    clamp: str | None  # "earliest" or "latest" when ``requested`` was out of range


def clamp(requested: int, earliest: int, latest: int) -> tuple[int, str | None]:
    """``requested`` moved into ``[earliest, latest]``, and which bound it hit, if any."""
    if requested < earliest:
        return earliest, "earliest"
    if requested > latest:
        return latest, "latest"
    return requested, None


def plan_reset(
    kind: str,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    committed: Mapping[TopicPartition, int],
    value: int | None = None,
    time_offsets: Mapping[TopicPartition, int | None] | None = None,
    file_offsets: Mapping[TopicPartition, int] | None = None,
) -> list[PlannedOffset]:
    """The reset of every partition in ``bounds`` (``(earliest, latest)`` each), sorted.

    ``value`` is the offset (``offset``) or the shift (``shift-by``); ``time_offsets`` the
    first offset at or after the time (``datetime``, ``duration``); ``file_offsets`` the
    offsets of ``file``, which also narrow the plan to its partitions.
    """
    if kind not in RESET_KINDS:
        raise ValueError(f"unknown reset kind {kind!r}; expected one of {', '.join(RESET_KINDS)}")
    if kind in ("offset", "shift-by") and value is None:
        raise ValueError(f"a {kind} reset needs a value")
    planned = []
    for (topic, partition), (earliest, latest) in sorted(bounds.items()):
        current = committed.get((topic, partition))
        if kind == "earliest":
            requested = earliest
        elif kind == "latest":
            requested = latest
        elif kind == "current":
            requested = latest if current is None else current
        elif kind == "offset":
            assert value is not None
            requested = value
        elif kind == "shift-by":
            if current is None:
                # Kafka's words (ConsumerGroupCommand.resetByShiftBy); a TopicPartition
                # prints as topic-partition.
                raise ValueError(
                    f"Cannot shift offset for partition {topic}-{partition} since there is "
                    "no current committed offset"
                )
            assert value is not None
            requested = current + value
        elif kind == "file":
            if file_offsets is None or (topic, partition) not in file_offsets:
                continue
            requested = file_offsets[(topic, partition)]
        else:  # datetime, duration
            found = (time_offsets or {}).get((topic, partition))
            requested = latest if found is None else found
        if kind == "current":
            # Kafka checks no range here: the group stays exactly where it is.
            new, clamped = requested, None
        else:
            new, clamped = clamp(requested, earliest, latest)
        planned.append(PlannedOffset(topic, partition, current, requested, new, clamped))
    return planned


def format_csv(offsets: Mapping[TopicPartition, int]) -> str:
    """One group's offsets as ``kafka-consumer-groups.sh --export`` writes them."""
    return "".join(
        f"{topic},{partition},{offset}\n" for (topic, partition), offset in sorted(offsets.items())
    )


def parse_csv(lines: Iterable[str], group_id: str) -> dict[TopicPartition, int]:
    """Offsets of ``group_id`` from an export: ``topic,partition,offset`` rows, or Kafka's
    ``group,topic,partition,offset`` rows (rows of other groups are skipped)."""
    offsets: dict[TopicPartition, int] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        fields = line.split(",")
        if len(fields) == 4:
            group, *fields = fields
            if group != group_id:
                continue
        if len(fields) != 3:
            raise ValueError(
                f"line {number}: expected topic,partition,offset (or group,topic,partition,"
                f"offset), got {line!r}"
            )
        topic, partition_text, offset_text = fields
        try:
            partition, offset = int(partition_text), int(offset_text)
        except ValueError:
            raise ValueError(
                f"line {number}: partition and offset must be numbers: {line!r}"
            ) from None
        if not topic or partition < 0 or offset < 0:
            raise ValueError(f"line {number}: a topic, and partition and offset >= 0: {line!r}")
        if (topic, partition) in offsets:
            raise ValueError(f"line {number}: {topic}:{partition} appears twice")
        offsets[(topic, partition)] = offset
    return offsets
