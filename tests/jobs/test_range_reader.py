"""``RangeReader.read_range`` with a group's commits asked for (``source.read(commits_of=)``),
on messages as confluent-kafka hands them over; no broker, no Spark.

The reader hands over only the newest commit of each topic-partition of its range; what
Spark then computes of the rows (``transforms.group_offsets``: the newest per partition, at
or before a time, tombstones dropping the partition) must be what it computes of them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_group_jobs import arguments, source, topics
from kafka_group_records import codec, records

T0 = 1_700_000_000_000


class _Message:
    def __init__(
        self, offset: int, key: bytes | None, value: bytes | None, timestamp: int = T0
    ) -> None:
        self._offset, self._key, self._value, self._timestamp = offset, key, value, timestamp

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)

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


def _read(
    monkeypatch: pytest.MonkeyPatch,
    batches: list[list[_Message]],
    group: str,
    as_of_ms: int | None = None,
) -> list[Any]:
    def read_range(*_: Any) -> Iterable[list[_Message]]:
        return iter(batches)

    monkeypatch.setattr(topics, "read_range", read_range)
    monkeypatch.setattr("confluent_kafka.Consumer", _Consumer)
    reader = source.RangeReader(
        "127.0.0.1:1", "state", {}, (), codec.offset_commit_key_prefixes(group), as_of_ms
    )
    found: Iterator[Any] = reader.read_range(source.OffsetRange(0, 0, 10))
    return list(found)


def _group_offsets(rows: Iterable[dict[str, Any]], as_of_ms: int | None) -> dict[Any, Any]:
    """``transforms.group_offsets`` of the group's commit rows, in Python: the newest commit
    (by offset) of each topic-partition at or before ``as_of_ms``, unless it is a tombstone."""
    newest: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        if as_of_ms is not None and row["timestamp"] > as_of_ms:
            continue
        place = (row["topic"], row["topic_partition"])
        if place not in newest or newest[place]["offset"] < row["offset"]:
            newest[place] = row
    return {
        place: (row["committed_offset"], row["commit_timestamp"])
        for place, row in newest.items()
        if row["value"] is not None
    }


def test_other_groups_pass_over_and_each_partition_s_newest_commit_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another group's record this version cannot read (a value version from the future) and
    a keyless one are passed over, not a failure. Of the group's commits, the newest of each
    partition goes over, a tombstone among them, in one batch at the range's end."""
    other_key, other_value = _commit("payments2", 0, 7)
    unreadable = b"\x7f\x7f" + (other_value or b"")[2:]
    first_key, first_value = _commit("payments", 1, 5)
    second_key, second_value = _commit("payments", 2, 9)
    batches = [
        [_Message(0, other_key, other_value), _Message(1, other_key, unreadable)],
        [_Message(2, None, b"keyless"), _Message(3, first_key, first_value)],
        [_Message(4, first_key, None), _Message(5, second_key, second_value)],
    ]
    handed = _read(monkeypatch, batches, "payments")
    assert [batch.num_rows for batch in handed] == [2]
    table = pa.Table.from_batches(handed)
    assert table.column("offset").to_pylist() == [4, 5]
    assert table.column("group_id").to_pylist() == ["payments", "payments"]
    assert table.column("committed_offset").to_pylist() == [None, 9]


def test_commits_after_the_as_of_time_are_not_the_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key, _ = _commit("payments", 0, 0)
    batches = [
        [
            _Message(offset, key, _commit("payments", 0, offset * 10)[1], T0 + offset)
            for offset in range(4)
        ]
    ]
    handed = _read(monkeypatch, batches, "payments", as_of_ms=T0 + 1)
    table = pa.Table.from_batches(handed)
    assert table.column("committed_offset").to_pylist() == [10]


def test_a_range_without_the_group_hands_nothing_over(monkeypatch: pytest.MonkeyPatch) -> None:
    key, value = _commit("payments2", 0, 7)
    assert (
        _read(monkeypatch, [[_Message(0, key, value)], [_Message(1, key, None)]], "payments") == []
    )


# A group's commits, as appended: (topic-partition number, committed offset or None for a
# tombstone, append time offset), over few partitions so that they repeat.
COMMITS = st.lists(
    st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 99)), st.integers(0, 9)),
    max_size=60,
)


@given(
    COMMITS,
    st.one_of(st.none(), st.integers(0, 9)),
    st.integers(1, 8),
    st.integers(1, 7),
)
def test_what_spark_computes_of_the_handed_rows_is_what_it_computes_of_all(
    commits: list[tuple[int, int | None, int]],
    as_of: int | None,
    held: int,
    per_batch: int,
) -> None:
    """Whatever the commits, the time, the batches and the bound on the rows a task holds."""
    messages = []
    for offset, (partition, committed, at) in enumerate(commits):
        key, value = _commit("payments", partition, committed or 0)
        messages.append(_Message(offset, key, None if committed is None else value, T0 + at))
    batches = [messages[i : i + per_batch] for i in range(0, len(messages), per_batch)]
    as_of_ms = None if as_of is None else T0 + as_of
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(source, "NEWEST_HELD_ROWS", held)
        handed = _read(monkeypatch, batches, "payments", as_of_ms)
    rows = [row for batch in handed for row in batch.to_pylist()]
    every = [
        {
            "offset": offset,
            "timestamp": T0 + at,
            "topic": "orders",
            "topic_partition": partition,
            "value": committed,
            "committed_offset": committed,
            "commit_timestamp": 1,
        }
        for offset, (partition, committed, at) in enumerate(commits)
    ]
    assert _group_offsets(rows, as_of_ms) == _group_offsets(every, as_of_ms)
    if held > len({partition for partition, _, _ in commits}):
        # Never let go of what it held: exactly one row per partition committed by then.
        in_time = {p for p, _, at in commits if as_of_ms is None or T0 + at <= as_of_ms}
        assert sorted(row["topic_partition"] for row in rows) == sorted(in_time)


@pytest.mark.parametrize(
    ("records", "cores", "per_task"),
    [
        (1_000_000, 2, 500_000),  # one task per core
        (1_000_000, 8, 125_000),
        (10_000_000, 2, 1_000_000),  # no task longer than the upper bound
        (20_000, 2, 50_000),  # nor shorter than the lower one: one task
        (0, 2, 50_000),
        (1_000_000, 0, 1_000_000),  # no cores known: the bound
    ],
)
def test_a_read_is_shared_over_the_cores_within_bounds(
    records: int, cores: int, per_task: int
) -> None:
    assert arguments.records_per_split(records, cores) == per_task
