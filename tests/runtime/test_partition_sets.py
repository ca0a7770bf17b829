"""Coordinators that split one state topic: each runtime loads and writes only its set of
partitions, answers NOT_COORDINATOR for the groups of the others, and is fenced per partition.
On the embedded broker, with real runtimes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning
from tests.runtime import logs
from tests.support import groups

pytestmark = pytest.mark.broker

PARTITIONS = 4
State = coordinator_runtime.PartitionState


def _config(
    bootstrap: str, name: str, served: set[int] | None, **overrides: Any
) -> coordinator_runtime.RuntimeConfig:
    return coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=name,
        partitions=PARTITIONS,
        write_timeout_ms=5000,
        metadata_interval_ms=500,
        served_partitions=None if served is None else frozenset(served),
        **overrides,
    )


def _commit(group: str, offsets: Mapping[tuple[str, int], int]) -> messages.OffsetCommitRequest:
    """An administrative commit (no member), as Kafka's admin client sends."""
    return messages.OffsetCommitRequest(
        group_id=group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={tp: messages.CommitOffset(offset, "") for tp, offset in offsets.items()},
    )


async def _fetch(runtime: coordinator_runtime.CoordinatorRuntime, group: str) -> int:
    response = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return response.offsets[("t", 0)].offset


def _one_group_per_partition() -> dict[int, str]:
    found: dict[int, str] = {}
    index = 0
    while len(found) < PARTITIONS:
        found.setdefault(partitioning.partition_for(f"g{index}", PARTITIONS), f"g{index}")
        index += 1
    return found


def test_a_set_outside_the_topic_is_refused() -> None:
    with pytest.raises(ValueError, match=r"state partitions \[4, 7\] are outside the topic's 0-3"):
        coordinator_runtime.CoordinatorRuntime(_config("127.0.0.1:1", "s", {0, 4, 7}))


async def test_two_runtimes_with_disjoint_sets_split_the_topic(
    broker: embedded.EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    name = logs.unique_topic()
    group_of = _one_group_per_partition()
    owner_of = {0: "a", 1: "a", 2: "b", 3: "b"}
    acknowledged: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, "kafka_group_operator.runtime"):
        async with (
            groups.running(_config(broker.bootstrap, name, {0, 1})) as a,
            groups.running(_config(broker.bootstrap, name, {2, 3})) as b,
        ):
            runtimes = {"a": a, "b": b}
            assert a.served_partitions == [0, 1]
            assert b.served_partitions == [2, 3]
            # b started after a was loaded: had it initialised a's partitions' producers, a
            # would now be fenced there. Both write their own partitions, in turns.
            for offset in (1, 2, 3):
                for partition, group in group_of.items():
                    owner = runtimes[owner_of[partition]]
                    await owner.commit_offsets(_commit(group, {("t", 0): offset}))
                    acknowledged[group] = offset
            for partition, group in group_of.items():
                owner = runtimes[owner_of[partition]]
                other = runtimes["b" if owner_of[partition] == "a" else "a"]
                assert owner.partition_state(group) is State.ACTIVE
                assert other.partition_state(group) is State.NOT_SERVED
                assert await _fetch(owner, group) == 3
                # The other answers NOT_COORDINATOR for reads and writes alike.
                with pytest.raises(errors.NotCoordinator, match="not in this coordinator's"):
                    await other.commit_offsets(_commit(group, {("t", 0): 99}))
                with pytest.raises(errors.NotCoordinator):
                    await other.fetch_offsets(messages.OffsetFetchRequest(group))
                with pytest.raises(errors.NotCoordinator):
                    await other.describe_group(group)
                # A job's read fence too: only the partition's coordinator may write it.
                with pytest.raises(errors.NotCoordinator):
                    await other.read_fence(group)
                with pytest.raises(errors.NotCoordinator):
                    await owner.read_fence(group, all_partitions=True)
                assert list(await owner.read_fence(group)) == [partition]
            # A partition outside the set is neither failed nor unhealthy.
            assert a.unhealthy_partitions() == b.unhealthy_partitions() == []
            assert await a.list_groups() == sorted(group_of[p] for p in (0, 1))
            assert await b.list_groups() == sorted(group_of[p] for p in (2, 3))
    assert not [r for r in caplog.records if "taken over by another" in r.getMessage()]
    # Every acknowledged commit is in the log: a runtime of the whole topic loads them all.
    async with groups.running(_config(broker.bootstrap, name, None)) as whole:
        for group, offset in acknowledged.items():
            assert await _fetch(whole, group) == offset


async def test_a_runtime_taking_one_partition_fences_only_that_one(
    broker: embedded.EmbeddedBroker,
) -> None:
    name = logs.unique_topic()
    group_of = _one_group_per_partition()
    async with groups.running(_config(broker.bootstrap, name, {0, 1})) as first:
        for group in (group_of[0], group_of[1]):
            await first.commit_offsets(_commit(group, {("t", 0): 1}))
        async with groups.running(_config(broker.bootstrap, name, {1})) as second:
            # The second loaded partition 1 and sees what the first acknowledged there.
            assert await _fetch(second, group_of[1]) == 1
            with pytest.raises(errors.NotCoordinator, match="fenced"):
                await first.commit_offsets(_commit(group_of[1], {("t", 0): 2}))
            assert first.partition_state(group_of[1]) is State.FENCED
            # Partition 0 is still the first's: it writes on, and nobody else may.
            await first.commit_offsets(_commit(group_of[0], {("t", 0): 2}))
            assert await _fetch(first, group_of[0]) == 2
            await second.commit_offsets(_commit(group_of[1], {("t", 0): 3}))
            with pytest.raises(errors.NotCoordinator, match="not in this coordinator's"):
                await second.commit_offsets(_commit(group_of[0], {("t", 0): 9}))
    async with groups.running(_config(broker.bootstrap, name, None)) as whole:
        assert await _fetch(whole, group_of[0]) == 2
        assert await _fetch(whole, group_of[1]) == 3


async def test_an_empty_set_serves_nothing_and_is_loaded_at_once(
    broker: embedded.EmbeddedBroker,
) -> None:
    name = logs.unique_topic()
    async with groups.running(_config(broker.bootstrap, name, set())) as idle:
        assert idle.served_partitions == []
        for group in _one_group_per_partition().values():
            with pytest.raises(errors.NotCoordinator):
                await idle.heartbeat(
                    messages.HeartbeatRequest(group_id=group, member_id="m", member_epoch=0)
                )
        await asyncio.wait_for(idle.wait_until_loaded(), 5)
