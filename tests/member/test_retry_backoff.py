"""The heartbeat's retry backoff: a moving, loading or unreachable coordinator is retried at
least once a second (Kafka's ``retry.backoff.max.ms``), other retriable errors back off to
five seconds, and every delay is jittered."""

from __future__ import annotations

import pytest

from kafka_group_operator.coordinator import errors
from kafka_group_operator.member import client, group_member


def _delays(error: errors.CoordinatorError, retries: int) -> list[float]:
    backoff, delays = group_member.BACKOFF_INITIAL_S, []
    for _ in range(retries):
        delays.append(group_member.retry_delay(backoff, error))
        backoff = min(backoff * 2, group_member.BACKOFF_MAX_S)
    return delays


@pytest.mark.parametrize(
    "error",
    [
        errors.NotCoordinator("moved"),
        errors.CoordinatorLoadInProgress("loading"),
        # Its pod restarting or gone: refused, or reset with the request maybe sent.
        client.CoordinatorUnreachable("connection refused", unsent=True),
        client.CoordinatorUnreachable("connection reset"),
    ],
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


@pytest.mark.parametrize(
    "error",
    # COORDINATOR_NOT_AVAILABLE answered by a coordinator that runs: its state partition's
    # brokers are down, which may last.
    [errors.CoordinatorNotAvailable("down"), errors.RequestTimedOut("slow")],
)
def test_other_retriable_errors_back_off_to_five_seconds(error: errors.CoordinatorError) -> None:
    delays = _delays(error, 12)
    assert max(delays) > 4
    assert all(delay <= 6 for delay in delays)


def test_retries_are_jittered() -> None:
    delays = {group_member.retry_delay(1.0, errors.NotCoordinator("x")) for _ in range(50)}
    assert len(delays) > 1
    assert all(0.8 <= delay <= 1.2 for delay in delays)
