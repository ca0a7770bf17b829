"""``RangeReader.read_range`` with a group's commits asked for (``source.read(commits_of=)``),
on messages as confluent-kafka hands them over; no broker, no Spark."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from kafka_group_jobs import source, topics
from kafka_group_records import codec, records


class _Message:
    def __init__(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        self._offset, self._key, self._value = offset, key, value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class _Consumer:
    def __init__(self, config: dict[str, Any]) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _commit(group: str, partition: int, offset: int) -> tuple[bytes, bytes | None]:
    return codec.encode_record(
        records.Record(
            records.OffsetCommitKey(group, "orders", partition),
            records.OffsetCommitValue(offset=offset, commit_timestamp=1),
        )
    )


def _read(monkeypatch: pytest.MonkeyPatch, batches: list[list[_Message]], group: str) -> list[Any]:
    def read_range(*_: Any) -> Iterable[list[_Message]]:
        return iter(batches)

    monkeypatch.setattr(topics, "read_range", read_range)
    monkeypatch.setattr("confluent_kafka.Consumer", _Consumer)
    reader = source.RangeReader(
        "127.0.0.1:1", "state", {}, (), codec.offset_commit_key_prefixes(group)
    )
    found: Iterator[Any] = reader.read_range(source.OffsetRange(0, 0, 10))
    return list(found)


def test_a_first_batch_of_other_groups_only_hands_nothing_over_and_reading_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing of the group in a batch is no empty Arrow batch (which cannot be built), and
    the group's first commit after it still goes over at once. Another group's record this
    version cannot read (a value version from the future) is passed over, not a failure."""
    other_key, other_value = _commit("payments2", 0, 7)
    unreadable = b"\x7f\x7f" + (other_value or b"")[2:]
    ours_key, ours_value = _commit("payments", 1, 5)
    batches = [
        [_Message(0, other_key, other_value), _Message(1, other_key, unreadable)],
        [_Message(2, None, b"keyless"), _Message(3, ours_key, ours_value)],
        [_Message(4, ours_key, None)],
    ]
    handed = _read(monkeypatch, batches, "payments")
    assert [batch.num_rows for batch in handed] == [1, 1]
    table = pa.Table.from_batches(handed)
    assert table.column("offset").to_pylist() == [3, 4]
    assert table.column("group_id").to_pylist() == ["payments", "payments"]
    assert table.column("committed_offset").to_pylist() == [5, None]


def test_a_range_without_the_group_hands_nothing_over(monkeypatch: pytest.MonkeyPatch) -> None:
    key, value = _commit("payments2", 0, 7)
    assert (
        _read(monkeypatch, [[_Message(0, key, value)], [_Message(1, key, None)]], "payments") == []
    )
