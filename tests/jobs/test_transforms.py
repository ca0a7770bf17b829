"""The jobs' pure transforms on small inline frames, compared with ``assertDataFrameEqual``."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from kafka_group_jobs import columns, transforms

pytestmark = pytest.mark.spark

DAY_MS = 24 * 3600 * 1000


def state(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """A frame of decoded state records; unnamed columns are null."""
    full = [tuple(row.get(name) for name in columns.STATE_RECORD_COLUMNS) for row in rows]
    return spark.createDataFrame(full, columns.STATE_RECORD_DDL)


def commit(
    group: str, topic: str, partition: int, offset: int | None, at: int, log_offset: int
) -> dict[str, Any]:
    """An offset commit (a tombstone when ``offset`` is None) appended at time ``at``."""
    return {
        "partition": 0,
        "offset": log_offset,
        "timestamp": at,
        "key": f"{group}/{topic}/{partition}".encode(),
        "value": None if offset is None else f"{offset}".encode(),
        "record_type": columns.OFFSET_COMMIT,
        "group_id": group,
        "topic": topic,
        "topic_partition": partition,
        "committed_offset": offset,
        "leader_epoch": None if offset is None else -1,
        "metadata": None if offset is None else "",
        "commit_timestamp": None if offset is None else at,
    }


def group_record(
    kind: str, group: str, log_offset: int, tombstone: bool = False, **fields: Any
) -> dict[str, Any]:
    return {
        "partition": 0,
        "offset": log_offset,
        "timestamp": 0,
        "key": f"{kind}/{group}".encode(),
        "value": None if tombstone else b"v",
        "record_type": kind,
        "group_id": group,
        **fields,
    }


def test_latest_per_key_keeps_the_newest_record_and_tombstones(spark: SparkSession) -> None:
    records = state(
        spark,
        [
            commit("g", "t", 0, 5, 100, 0),
            commit("g", "t", 0, 9, 200, 1),
            commit("g", "t", 1, 3, 100, 2),
            commit("g", "t", 1, None, 300, 3),
        ],
    )
    expected = state(spark, [commit("g", "t", 0, 9, 200, 1), commit("g", "t", 1, None, 300, 3)])
    assertDataFrameEqual(transforms.latest_per_key(records), expected)


def test_group_offsets_now_and_as_of_a_past_time(spark: SparkSession) -> None:
    records = state(
        spark,
        [
            commit("g", "t", 0, 5, 100, 0),
            commit("other", "t", 0, 7, 100, 1),
            commit("g", "t", 1, 3, 150, 2),
            commit("g", "t", 0, 9, 200, 3),
            commit("g", "t", 1, None, 300, 4),
        ],
    )
    now = transforms.group_offsets(records, "g")
    assertDataFrameEqual(
        now,
        spark.createDataFrame(
            [("t", 0, 9, -1, "", 200)],
            "topic STRING, partition INT, offset BIGINT, leader_epoch INT, metadata STRING,"
            " commit_timestamp BIGINT",
        ),
    )
    then = transforms.group_offsets(records, "g", as_of_ms=160).select(
        "topic", "partition", "offset"
    )
    assertDataFrameEqual(
        then,
        spark.createDataFrame(
            [("t", 0, 5), ("t", 1, 3)], "topic STRING, partition INT, offset BIGINT"
        ),
    )


def test_with_lag_joins_log_ends_and_never_goes_negative(spark: SparkSession) -> None:
    offsets = spark.createDataFrame(
        [("t", 0, 5), ("t", 1, 12), ("u", 0, 1)], "topic STRING, partition INT, offset BIGINT"
    )
    ends = spark.createDataFrame(
        [("t", 0, 8), ("t", 1, 10)], "topic STRING, partition INT, log_end_offset BIGINT"
    )
    expected = spark.createDataFrame(
        [("t", 0, 5, 8, 3), ("t", 1, 12, 10, 0), ("u", 0, 1, None, None)],
        "topic STRING, partition INT, offset BIGINT, log_end_offset BIGINT, lag BIGINT",
    )
    assertDataFrameEqual(transforms.with_lag(offsets, ends), expected)


def test_checkpoint_records_keep_every_live_record_and_judge_no_retention(
    spark: SparkSession,
) -> None:
    """Expiry is the coordinator's alone: an expired group's records stay in the checkpoint,
    as they stay in the log; tombstoned keys and load markers are left out."""
    latest = state(
        spark,
        [
            # "old": empty for 8 days with the default retention of 7: the coordinator's call.
            group_record(columns.GROUP_LIFECYCLE, "old", 0, empty_since_ms=2 * DAY_MS),
            commit("old", "t", 0, 4, 0, 1),
            # "gone": settings tombstoned (left out), one commit left behind (kept, as in the log).
            group_record(columns.GROUP_CONFIG, "gone", 7, tombstone=True),
            commit("gone", "t", 0, 2, 0, 8),
            group_record(columns.GROUP_OWNER, "old", 10),
            {
                "partition": 0,
                "offset": 9,
                "timestamp": 0,
                "key": b"m",
                "value": b"m",
                "record_type": columns.LOAD_MARKER,
            },
        ],
    )
    kept = transforms.checkpoint_records(latest).select("offset")
    assertDataFrameEqual(kept, spark.createDataFrame([(0,), (1,), (8,), (10,)], "offset BIGINT"))


BOUNDS_DDL = (
    "topic STRING, partition INT, earliest_offset BIGINT, latest_offset BIGINT, time_offset BIGINT"
)
PLAN_COLUMNS = ["topic", "partition", "current_offset", "new_offset", "clamp"]
PLAN_DDL = "topic STRING, partition INT, current_offset BIGINT, new_offset BIGINT, clamp STRING"


@pytest.fixture
def bounds(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [("t", 0, 10, 100, 40), ("t", 1, 0, 50, None), ("u", 0, 0, 5, 2)], BOUNDS_DDL
    )


@pytest.fixture
def committed(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [("t", 0, 20), ("u", 0, 4)], "topic STRING, partition INT, offset BIGINT"
    )


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("earliest", None, [("t", 0, 20, 10, None), ("t", 1, None, 0, None), ("u", 0, 4, 0, None)]),
        ("latest", None, [("t", 0, 20, 100, None), ("t", 1, None, 50, None), ("u", 0, 4, 5, None)]),
        (
            "offset",
            30,
            [("t", 0, 20, 30, None), ("t", 1, None, 30, None), ("u", 0, 4, 5, "latest")],
        ),
        ("shift-by", -15, [("t", 0, 20, 10, "earliest"), ("u", 0, 4, 0, "earliest")]),
        (
            "datetime",
            None,
            [("t", 0, 20, 40, None), ("t", 1, None, 50, None), ("u", 0, 4, 2, None)],
        ),
    ],
)
def test_plan_reset_requests_and_clamps(
    spark: SparkSession,
    bounds: DataFrame,
    committed: DataFrame,
    kind: str,
    value: int | None,
    expected: list[tuple[Any, ...]],
) -> None:
    plan = transforms.plan_reset(bounds, committed, kind, value)
    assertDataFrameEqual(plan.select(*PLAN_COLUMNS), spark.createDataFrame(expected, PLAN_DDL))


def test_plan_reset_to_a_snapshot_in_scope(
    spark: SparkSession, bounds: DataFrame, committed: DataFrame
) -> None:
    snapshot = spark.createDataFrame(
        [("t", 0, 120), ("t", 1, 7), ("u", 0, 3), ("gone", 0, 9)],
        "topic STRING, partition INT, offset BIGINT",
    )
    plan = transforms.plan_reset(
        bounds, committed, "snapshot", snapshot=snapshot, topics=("t",), partitions={"t": (0,)}
    )
    assertDataFrameEqual(
        plan.select(*PLAN_COLUMNS),
        spark.createDataFrame([("t", 0, 20, 100, "latest")], PLAN_DDL),
    )
    assertDataFrameEqual(
        transforms.missing_partitions(snapshot, bounds),
        spark.createDataFrame([("gone", 0, 9)], "topic STRING, partition INT, offset BIGINT"),
    )


def test_plan_reset_rejects_unknown_kinds_and_missing_values(
    bounds: DataFrame, committed: DataFrame
) -> None:
    with pytest.raises(ValueError, match="unknown reset kind"):
        transforms.plan_reset(bounds, committed, "sideways")
    with pytest.raises(ValueError, match="needs a value"):
        transforms.plan_reset(bounds, committed, "offset")
