"""Driving a group through a real ``CoordinatorRuntime`` the way members would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from kafka_group_operator.coordinator import messages
from kafka_group_operator.runtime import coordinator_runtime


async def settle(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, member_ids: list[str], topic: str
) -> None:
    """Heartbeat every member, reporting what it owns, until the group is Stable."""
    epochs = dict.fromkeys(member_ids, 0)
    owned: dict[str, Mapping[str, frozenset[int]]] = {m: {} for m in member_ids}
    for _ in range(40):
        for index, member_id in enumerate(member_ids):
            response = await runtime.heartbeat(
                messages.HeartbeatRequest(
                    group_id=group,
                    member_id=member_id,
                    member_epoch=epochs[member_id],
                    instance_id=f"{group}-{index}",
                    rebalance_timeout_ms=30_000,
                    subscribed_topic_names=(topic,),
                    owned_partitions=owned[member_id],
                )
            )
            epochs[member_id] = response.member_epoch
            if response.assignment is not None:
                owned[member_id] = response.assignment
        if (await runtime.describe_group(group)).state == "Stable":
            return
    raise AssertionError(f"group {group} never settled: {await runtime.describe_group(group)}")


@contextlib.asynccontextmanager
async def running(
    config: coordinator_runtime.RuntimeConfig,
) -> AsyncIterator[coordinator_runtime.CoordinatorRuntime]:
    """A started runtime (its load done), stopped on exit."""
    runtime = coordinator_runtime.CoordinatorRuntime(config)
    await asyncio.wait_for(runtime.start(), 60)
    try:
        yield runtime
    finally:
        await runtime.stop()
