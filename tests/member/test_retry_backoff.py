"""The heartbeat's retry backoff: a moving or loading coordinator is retried at least once a
second (Kafka's ``retry.backoff.max.ms``), other retriable errors back off to five seconds,
and every delay is jittered."""

from __future__ import annotations

import pytest

from kafka_group_operator.coordinator import errors
from kafka_group_operator.member import group_member


def _delays(error: errors.CoordinatorError, retries: int) -> list[float]:
    backoff, delays = group_member.BACKOFF_INITIAL_S, []
    for _ in range(retries):
        delays.append(group_member.retry_delay(backoff, error))
        backoff = min(backoff * 2, group_member.BACKOFF_MAX_S)
    return delays


@pytest.mark.parametrize(
    "error", [errors.NotCoordinator("moved"), errors.CoordinatorLoadInProgress("loading")]
)
def test_a_moving_coordinator_is_retried_at_least_once_a_second(
    error: errors.CoordinatorError,
) -> None:
    delays = _delays(error, 12)
    assert 0.08 <= delays[0] <= 0.12
    assert all(delay <= 1.2 for delay in delays)
    assert max(delays) >= 0.8
    # Eight retries span at most 6.6 s (0.1 + 0.2 + 0.4 + 0.8 + 4 x 1, jittered), where
    # doubling to five seconds would span at least 20 s.
    assert sum(delays[:8]) <= 1.2 * 5.5


def test_other_retriable_errors_back_off_to_five_seconds() -> None:
    delays = _delays(errors.CoordinatorNotAvailable("down"), 12)
    assert max(delays) > 4
    assert all(delay <= 6 for delay in delays)


def test_retries_are_jittered() -> None:
    delays = {group_member.retry_delay(1.0, errors.NotCoordinator("x")) for _ in range(50)}
    assert len(delays) > 1
    assert all(0.8 <= delay <= 1.2 for delay in delays)
