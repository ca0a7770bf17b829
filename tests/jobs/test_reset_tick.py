"""One tick of an online reset when the group's coordinator refuses: a retriable refusal (the
coordinator moving or loading) leaves the reset where it was; any other fails it."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_group_operator.coordinator import errors
from kafka_group_operator.jobs import online_reset, reset_machine
from kafka_group_operator.manifests import offset_jobs
from kafka_group_operator.specs import consumer_group as specs

RESET = {"to": "offset", "offset": 3, "dryRun": False}


class Refusing:
    """The group's coordinator, refusing every describe with ``error``."""

    def __init__(self, error: errors.CoordinatorError) -> None:
        self.error = error
        self.describes = 0

    async def describe_group(self, group_id: str) -> Any:
        self.describes += 1
        raise self.error


async def tick_while_pausing(coordinator: Refusing) -> tuple[dict[str, Any], list[bool]]:
    paused: list[bool] = []

    async def set_paused(value: bool) -> None:
        paused.append(value)

    async def partition_counts() -> dict[str, int]:
        return {"orders": 2}

    world = online_reset.ResetWorld(
        coordinator=coordinator,  # type: ignore[arg-type]
        kube=None,  # type: ignore[arg-type]
        memo=None,
        set_paused=set_paused,
        partition_counts=partition_counts,
        bootstrap="127.0.0.1:1",
        state_topic="state",
        coordinator_url=None,
        token=None,
        results_uri=None,
    )
    spec = {
        "topics": ["orders"],
        "kafka": {"bootstrapServers": "127.0.0.1:1"},
        "template": {"spec": {"containers": [{"name": "c", "image": "c:1"}]}},
        "offsetReset": RESET,
    }
    body = {"metadata": {"name": "orders", "namespace": "ns", "generation": 2}, "spec": spec}
    group = specs.parse_consumer_group("orders", "ns", spec)
    pausing = {
        "fingerprint": offset_jobs.reset_fingerprint(RESET),
        **reset_machine.status_of(reset_machine.State.PAUSING),
    }
    status = await online_reset.tick(world, body, group, RESET, {"lastReset": pausing})
    return status, paused


@pytest.mark.parametrize(
    "error",
    [
        errors.NotCoordinator("state partition 3 moved"),
        errors.CoordinatorLoadInProgress("state partition 3 is loading"),
        errors.CoordinatorNotAvailable("no answer"),
    ],
)
async def test_a_retriable_refusal_leaves_the_reset_for_the_next_tick(
    error: errors.CoordinatorError,
) -> None:
    coordinator = Refusing(error)
    status, paused = await tick_while_pausing(coordinator)
    assert coordinator.describes == 1
    assert status == {}  # nothing recorded: still pausing, the group still paused
    assert paused == []


async def test_any_other_refusal_fails_the_reset_and_resumes_the_group() -> None:
    coordinator = Refusing(errors.InvalidRequest("bad group"))
    status, paused = await tick_while_pausing(coordinator)
    assert status["lastReset"]["phase"] == "Failed"
    assert "bad group" in status["lastReset"]["message"]
    assert paused == [False]
