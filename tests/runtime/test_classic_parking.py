"""Parked classic requests on a real runtime: the join and sync barriers hold their callers,
never the partition's queue, and answer them once what completes them is durable.

Every group lives on the one state partition here, so a parked JoinGroup would stall every
other request if it held the queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import records as schema
from tests.runtime import logs
from tests.support import groups

pytestmark = pytest.mark.broker

GROUP = "streams-app"
PROTOCOL = schema.ClassicProtocol("stream", b"subscription-bytes")


def _config(bootstrap: str, topic: str) -> coordinator_runtime.RuntimeConfig:
    return coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=topic,
        partitions=1,
        metadata_interval_ms=500,
        coordinator=coordinator_config.CoordinatorConfig(initial_rebalance_delay_ms=1_000),
    )


def _join(member_id: str = "", instance_id: str | None = None) -> messages.ClassicJoinRequest:
    return messages.ClassicJoinRequest(
        group_id=GROUP,
        member_id=member_id,
        instance_id=instance_id,
        protocol_type="consumer",
        protocols=(PROTOCOL,),
        session_timeout_ms=10_000,
        rebalance_timeout_ms=20_000,
        subscribed_topic_names=(),
        client_id="app",
    )


async def _pending(task: asyncio.Task[Any]) -> bool:
    await asyncio.sleep(0.05)
    return not task.done()


async def test_joins_and_syncs_are_parked_without_holding_the_queue(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = logs.unique_topic("parking")
    async with groups.running(_config(broker.bootstrap, topic)) as runtime:
        first = asyncio.create_task(runtime.classic_join(_join(instance_id="pod-0")))
        second = asyncio.create_task(runtime.classic_join(_join(instance_id="pod-1")))
        assert await _pending(first)
        assert await _pending(second)
        # Meanwhile the partition serves other groups: a commit is written and answered.
        committed = await asyncio.wait_for(
            runtime.commit_offsets(groups.admin_commit("other", 7)), 10
        )
        assert not committed.errors
        assert not first.done()
        assert not second.done()
        # The initial rebalance delay (1 s here) ends the barrier: both are answered.
        leader_join = await asyncio.wait_for(first, 20)
        follower_join = await asyncio.wait_for(second, 20)
        assert leader_join.generation_id == follower_join.generation_id == 1
        assert leader_join.leader == follower_join.leader == leader_join.member_id
        assert [m.member_id for m in leader_join.members] == [
            leader_join.member_id,
            follower_join.member_id,
        ]
        assert follower_join.members == ()
        # The follower's SyncGroup waits for the leader's assignment.
        follower_sync = asyncio.create_task(
            runtime.classic_sync(
                messages.ClassicSyncRequest(GROUP, follower_join.member_id, 1, "pod-1")
            )
        )
        assert await _pending(follower_sync)
        leader_sync = await asyncio.wait_for(
            runtime.classic_sync(
                messages.ClassicSyncRequest(
                    GROUP,
                    leader_join.member_id,
                    1,
                    "pod-0",
                    assignments=(
                        (leader_join.member_id, b"tasks 0_0 0_1"),
                        (follower_join.member_id, b"tasks 0_2"),
                    ),
                )
            ),
            10,
        )
        assert leader_sync.raw_assignment == b"tasks 0_0 0_1"
        assert (await asyncio.wait_for(follower_sync, 10)).raw_assignment == b"tasks 0_2"
        assert (await runtime.describe_group(GROUP)).state == "Stable"
    # What the leader's SyncGroup wrote is on the state topic: a new runtime loads the group
    # as it was, Stable, with the leader's bytes.
    async with groups.running(_config(broker.bootstrap, topic)) as reloaded:
        described = await reloaded.describe_group(GROUP)
        assert described.state == "Stable"
        assert described.group_type == "classic"
        assert [m.raw_assignment for m in described.members] == [b"tasks 0_0 0_1", b"tasks 0_2"]


async def test_a_parked_join_is_answered_when_the_partition_goes_and_a_gone_caller_leaves_nothing(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = logs.unique_topic("parking")
    async with groups.running(_config(broker.bootstrap, topic)) as runtime:
        gone = asyncio.create_task(runtime.classic_join(_join(instance_id="pod-0")))
        assert await _pending(gone)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert runtime._partitions[0].parked == {}
        # The same instance comes back: it replaces the member whose caller went away.
        parked = asyncio.create_task(runtime.classic_join(_join(instance_id="pod-0")))
        assert await _pending(parked)
        assert len(runtime._partitions[0].parked) == 1
        runtime.release(0, "test")
        with pytest.raises(errors.NotCoordinator):
            await asyncio.wait_for(parked, 5)
        assert runtime._partitions[0].parked == {}
