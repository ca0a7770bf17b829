"""Driving a group through a real ``CoordinatorRuntime`` the way members would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence

import pytest

from kafka_group_operator.coordinator import messages
from kafka_group_operator.runtime import coordinator_runtime, writer
from kafka_group_records import codec, partitioning

# Every record key starts with its version (int16): an offset commit's is Kafka's version 1.
_OFFSET_COMMIT_KEY = codec.OFFSET_COMMIT_KEY_V1.to_bytes(2, "big")


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
    """A started runtime (its load done), stopped on exit. The bound is generous: a loaded
    machine's embedded broker takes long over a state topic with many transactions."""
    runtime = coordinator_runtime.CoordinatorRuntime(config)
    await asyncio.wait_for(runtime.start(), 180)
    try:
        yield runtime
    finally:
        await runtime.stop()


def group_on(partition: int, partitions: int) -> str:
    """The first group id ``g<N>`` whose state lives in ``partition``."""
    index = 0
    while partitioning.partition_for(f"g{index}", partitions) != partition:
        index += 1
    return f"g{index}"


def admin_commit(group: str, offset: int) -> messages.OffsetCommitRequest:
    """A member-less commit of ``offset`` for ``t-0``, as Kafka's admin client sends."""
    return messages.OffsetCommitRequest(
        group_id=group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={("t", 0): messages.CommitOffset(offset, "")},
    )


async def committed(runtime: coordinator_runtime.CoordinatorRuntime, group: str) -> int | None:
    """The group's committed offset of ``t-0`` (None: none)."""
    offsets = (await runtime.fetch_offsets(messages.OffsetFetchRequest(group))).offsets
    found = offsets.get(("t", 0))
    return None if found is None else found.offset


def hold_commit_appends(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold every state-topic append carrying an offset commit between the first event, set
    when one arrives, and the second, which lets it go on (the brokers are slow)."""
    entered, opened = asyncio.Event(), asyncio.Event()
    original = writer.StateWriter.append

    async def held_append(
        state_writer: writer.StateWriter,
        partition: int,
        batch: Sequence[writer.EncodedRecord],
    ) -> int:
        if any(key[:2] == _OFFSET_COMMIT_KEY for key, _ in batch):
            entered.set()
            await opened.wait()
        return await original(state_writer, partition, batch)

    monkeypatch.setattr(writer.StateWriter, "append", held_append)
    return entered, opened
