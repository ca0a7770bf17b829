"""A steady heartbeat does not wait behind other groups' writes, and never skips its own.

A heartbeat that writes nothing is answered from the shard at once when nothing of its group
(nor of the whole partition) is queued or being appended: the shard then holds only committed
records of the group. A heartbeat of a group with a write in flight waits for that write, as
every write does. The broker is frozen (SIGSTOP) to hold a transaction in flight.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from tests.runtime import logs
from tests.support import groups

pytestmark = pytest.mark.broker


def _config(bootstrap: str) -> coordinator_runtime.RuntimeConfig:
    return coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=logs.unique_topic("queue"),
        partitions=1,  # every group on the same partition, behind the same queue
        write_timeout_ms=30_000,
        metadata_interval_ms=500,
    )


@contextmanager
def _frozen(broker: embedded.EmbeddedBroker) -> Iterator[None]:
    assert broker.process is not None
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)


def _join(group: str, member: str) -> messages.HeartbeatRequest:
    """A member joining ``group`` subscribed to nothing."""
    return messages.HeartbeatRequest(
        group, member, 0, rebalance_timeout_ms=10_000, subscribed_topic_names=()
    )


async def _joined(runtime: coordinator_runtime.CoordinatorRuntime, group: str) -> int:
    """The epoch of member m1, joined to ``group``."""
    return (await runtime.heartbeat(_join(group, "m1"))).member_epoch


async def test_a_steady_heartbeat_is_answered_while_another_groups_commit_is_in_flight() -> None:
    with embedded.running_broker() as broker:
        async with groups.running(_config(broker.bootstrap)) as runtime:
            epoch = await _joined(runtime, "steady")
            with _frozen(broker):
                commit = asyncio.create_task(
                    runtime.commit_offsets(groups.admin_commit("committing", 5))
                )
                await asyncio.sleep(0.3)
                assert not commit.done()  # its transaction waits for the frozen broker
                answered = await asyncio.wait_for(
                    runtime.heartbeat(messages.HeartbeatRequest("steady", "m1", epoch)), 2
                )
                assert answered.member_epoch == epoch
                assert not commit.done()
            response = await asyncio.wait_for(commit, 60)
            assert not response.errors


async def test_a_heartbeat_waits_for_a_write_of_its_own_group() -> None:
    """Another member joining writes the group's new epoch: the steady member's heartbeat
    waits for it, and then sees the group it made."""
    with embedded.running_broker() as broker:
        async with groups.running(_config(broker.bootstrap)) as runtime:
            epoch = await _joined(runtime, "shared")
            with _frozen(broker):
                join = asyncio.create_task(runtime.heartbeat(_join("shared", "m2")))
                await asyncio.sleep(0.3)
                heartbeat = asyncio.create_task(
                    runtime.heartbeat(messages.HeartbeatRequest("shared", "m1", epoch))
                )
                await asyncio.sleep(1.0)
                assert not join.done()
                assert not heartbeat.done()  # behind its group's write, in the queue
            joined = await asyncio.wait_for(join, 60)
            steady = await asyncio.wait_for(heartbeat, 60)
            # Answered from the group after the join: m1 is moved to the new epoch.
            assert joined.member_epoch == steady.member_epoch == epoch + 1


async def test_a_heartbeat_that_writes_waits_for_the_writes_ahead_of_it() -> None:
    """A second member joining writes (a new group epoch): it takes its turn in the queue."""
    with embedded.running_broker() as broker:
        async with groups.running(_config(broker.bootstrap)) as runtime:
            await _joined(runtime, "growing")
            with _frozen(broker):
                commit = asyncio.create_task(
                    runtime.commit_offsets(groups.admin_commit("other", 5))
                )
                await asyncio.sleep(0.3)
                join = asyncio.create_task(runtime.heartbeat(_join("growing", "m2")))
                await asyncio.sleep(1.0)
                assert not join.done()
            assert not (await asyncio.wait_for(commit, 60)).errors
            joined = await asyncio.wait_for(join, 60)
            assert joined.member_epoch >= 1
            description = await runtime.describe_group("growing")
            assert {m.member_id for m in description.members} == {"m1", "m2"}


async def test_heartbeat_now_answers_only_what_needs_no_wait() -> None:
    """``heartbeat_now`` (the listener answers steady heartbeats with it from the callback that
    read them) answers what ``heartbeat`` would answer at once, and nothing else: ``None`` for
    a heartbeat of a group with a write in flight, and for one that writes; neither is
    counted. The runtime's ``heartbeat`` then serves them as before."""
    with embedded.running_broker() as broker:
        async with groups.running(_config(broker.bootstrap)) as runtime:
            epoch = await _joined(runtime, "now")
            other = await _joined(runtime, "other")
            counted = runtime.metrics.heartbeats.value
            steady = messages.HeartbeatRequest("now", "m1", epoch)
            answered = runtime.heartbeat_now(steady)
            assert answered is not None
            assert (answered.member_id, answered.member_epoch) == ("m1", epoch)
            assert runtime.metrics.heartbeats.value == counted + 1
            # A join writes: not answered now, nothing written, nothing counted.
            assert runtime.heartbeat_now(_join("now", "m2")) is None
            assert {m.member_id for m in (await runtime.describe_group("now")).members} == {"m1"}
            assert runtime.metrics.heartbeats.value == counted + 1
            with _frozen(broker):
                join = asyncio.create_task(runtime.heartbeat(_join("now", "m2")))
                await asyncio.sleep(0.3)
                assert not join.done()
                # Behind its group's write in flight: left to heartbeat().
                assert runtime.heartbeat_now(steady) is None
                assert runtime.metrics.heartbeats.value == counted + 1
                # Another group's steady heartbeat is answered meanwhile.
                assert runtime.heartbeat_now(messages.HeartbeatRequest("other", "m1", other))
            joined = await asyncio.wait_for(join, 60)
            assert joined.member_epoch == epoch + 1
