"""Lag in seconds from a partition's log-end history, as kafka-lag-exporter's ``LookupTable``
(src/main/scala/com/lightbend/kafkalagexporter/LookupTable.scala) estimates it."""

from __future__ import annotations

import math

import pytest

from kafka_group_operator.runtime import metrics


def _history(*points: tuple[int, float], limit: int = 60) -> metrics.LogEndHistory:
    history = metrics.LogEndHistory(limit)
    for offset, at in points:
        history.add(offset, at)
    return history


def test_interpolates_between_the_two_points_around_the_offset() -> None:
    # The log end was 100 at t=10 s and 200 at t=20 s: offset 150 was the end at t=15 s.
    history = _history((100, 10.0), (200, 20.0), (300, 40.0))
    assert history.lag_seconds(150, now_s=50.0) == pytest.approx(35.0)
    # 250 lies between (200, 20) and (300, 40): the end at t=30 s.
    assert history.lag_seconds(250, now_s=50.0) == pytest.approx(20.0)


def test_extrapolates_from_the_first_and_last_points_when_older_than_the_table() -> None:
    # Slope 10 offsets/s from (100, 10) to (300, 30): offset 0 was the end at t=0.
    history = _history((100, 10.0), (300, 30.0))
    assert history.lag_seconds(0, now_s=30.0) == pytest.approx(30.0)


def test_caught_up_is_zero_and_too_few_points_or_a_flat_line_is_unknown() -> None:
    assert _history((100, 10.0)).lag_seconds(100, now_s=99.0) == 0.0
    assert math.isnan(_history((100, 10.0)).lag_seconds(50, now_s=99.0))
    assert math.isnan(_history().lag_seconds(0, now_s=1.0))
    assert math.isnan(_history((100, 10.0), (100, 20.0)).lag_seconds(50, now_s=30.0))


def test_flat_lines_take_one_segment_and_bad_points_are_ignored() -> None:
    history = _history((200, 1.0), (200, 2.0), (200, 3.0), (200, 4.0))
    # Table.addPoint: a third point of a flat line moves its right end.
    assert list(history.points) == [(200, 1.0), (200, 4.0)]
    history.add(150, 5.0)  # decreasing: not part of a monotonic table
    history.add(300, 4.0)  # out of order
    assert list(history.points) == [(200, 1.0), (200, 4.0)]


def test_the_table_keeps_only_its_newest_points() -> None:
    history = _history(*((offset, float(offset)) for offset in range(10)), limit=3)
    assert list(history.points) == [(7, 7.0), (8, 8.0), (9, 9.0)]
