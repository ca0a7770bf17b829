"""The state topic under Apache Kafka's own log cleaner (tansu never compacts).

The topic rolls a segment every 100 ms, the cleaner runs on the slightest dirty ratio, and
tombstones go ``delete.retention.ms`` (1 s) after their first cleaning. A history of
overwritten offsets, deleted groups and expired offsets is written, a checkpoint taken in the
middle of it, and filler commits keep every partition rolling until the cleaner has dropped
the overwritten records and the tombstones themselves. Then a reload (from the log, and from
the checkpoint) equals the live state, and no deleted group or expired offset comes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import kafka
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import checkpoint, codec, records
from tests.runtime import logs
from tests.runtime.test_checkpoint_load import PARTITIONS, take_checkpoint
from tests.support import groups

pytestmark = pytest.mark.broker

TOMBSTONES_GONE_MS = 1_000
COMPACTING = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": str(TOMBSTONES_GONE_MS),
}
KEPT = [f"kept-{index}" for index in range(8)]
DELETED = [f"deleted-{index}" for index in range(4)]
IDLE = [f"idle-{index}" for index in range(4)]
ROUNDS = 12


def commit(group: str, offsets: Mapping[tuple[str, int], int]) -> messages.OffsetCommitRequest:
    return messages.OffsetCommitRequest(
        group_id=group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={tp: messages.CommitOffset(offset) for tp, offset in offsets.items()},
    )


async def offsets_of(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str
) -> dict[tuple[str, int], int]:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return {tp: committed.offset for tp, committed in fetched.offsets.items()}


def group_keys(log: list[tuple[bytes, bytes | None]], names: list[str]) -> list[bytes]:
    """The keys of ``log`` that belong to the groups ``names`` (offsets and group records)."""
    wanted = set(names)
    return [key for key, _value in log if records.group_of(codec.decode_key(key)) in wanted]


def compacted(bootstrap: str, topic: str) -> tuple[bool, str]:
    """Whether the cleaner has run its course: no key of a deleted group and no offset of an
    expired one left (not even a tombstone; the idle groups' settings stay, as they should),
    and each kept group's offsets down to a few records (of ROUNDS)."""
    kept = gone = 0
    for partition in range(PARTITIONS):
        log = logs.read_partition(bootstrap, topic, partition)
        kept += len(group_keys(log, KEPT))
        gone += len(group_keys(log, DELETED))
        gone += sum(
            isinstance(codec.decode_key(key), records.OffsetCommitKey)
            for key in group_keys(log, IDLE)
        )
    # 8 groups x 2 offsets: ROUNDS records each before, at most two (one in the active
    # segment) after.
    done = gone == 0 and kept <= 2 * 2 * len(KEPT)
    return done, f"{kept} kept-group records, {gone} of deleted groups or expired offsets"


def differences(got: object, wanted: object, path: str = "") -> list[str]:
    """Where two canonical states differ, as paths (``partition/groups/<id>/...``)."""
    if isinstance(got, dict) and isinstance(wanted, dict):
        found = []
        for key in sorted(set(got) | set(wanted), key=str):
            if key not in got or key not in wanted:
                found.append(f"{path}/{key}: only in {'wanted' if key in wanted else 'got'}")
            else:
                found += differences(got[key], wanted[key], f"{path}/{key}")
        return found
    return [] if got == wanted else [f"{path}: {got!r} != {wanted!r}"]


def checkpoint_now(config: coordinator_runtime.RuntimeConfig, location: Path) -> None:
    """A checkpoint as the compaction job takes it, stamped with the time it was read."""
    taken_at = coordinator_runtime.wall_clock_ms()
    take_checkpoint(config.bootstrap_servers, config.topic, location)
    manifest = json.loads((location / checkpoint.MANIFEST_FILE).read_text())
    manifest["createdAtMs"] = taken_at
    (location / checkpoint.MANIFEST_FILE).write_text(json.dumps(manifest))


async def write_history(
    config: coordinator_runtime.RuntimeConfig, checkpoint_at: Path
) -> dict[int, dict[str, object]]:
    async with groups.running(config) as runtime:
        for group in IDLE:
            await runtime.configure_group(
                messages.GroupSettings(group, topics=("t",), offsets_retention_ms=300)
            )
        for round_ in range(ROUNDS // 2):
            for group in KEPT + DELETED + IDLE:
                await runtime.commit_offsets(commit(group, {("t", 0): round_, ("t", 1): round_}))
    # A checkpoint that holds every group, before any is deleted or expires.
    await asyncio.to_thread(checkpoint_now, config, checkpoint_at)
    async with groups.running(config) as runtime:
        for round_ in range(ROUNDS // 2, ROUNDS):
            for group in KEPT:
                await runtime.commit_offsets(commit(group, {("t", 0): round_, ("t", 1): round_}))
        for group in DELETED:
            await runtime.delete_group(messages.DeleteGroupRequest(group))
        for _ in range(100):
            remaining = [group for group in IDLE if await offsets_of(runtime, group)]
            if not remaining:
                break
            await asyncio.sleep(0.1)
        assert remaining == [], f"offsets never expired: {remaining}"
        # Every partition keeps rolling segments until the cleaner has had its way.
        fillers = [groups.group_on(partition, PARTITIONS) for partition in range(PARTITIONS)]
        deadline = time.monotonic() + 180
        sequence = 0
        while True:
            sequence += 1
            for filler in fillers:
                await runtime.commit_offsets(commit(filler, {("t", 0): sequence}))
            done, seen = await asyncio.to_thread(compacted, config.bootstrap_servers, config.topic)
            if done:
                break
            assert time.monotonic() < deadline, f"the cleaner never finished: {seen}"
            await asyncio.sleep(0.3)
        return runtime.canonical_state()


async def test_reload_after_real_compaction_equals_the_live_state(
    kafka_broker: kafka.KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kafka_group_operator.runtime")
    name = logs.unique_topic("compacted")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1, config=COMPACTING)])[name].result(10)
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=kafka_broker.bootstrap,
        topic=name,
        partitions=PARTITIONS,
        metadata_interval_ms=300,
        timer_interval_ms=100,
    )
    checkpoint_at = tmp_path / "checkpoint"
    live = await write_history(config, checkpoint_at)
    live_groups = {g for state in live.values() for g in state["groups"]}  # type: ignore[attr-defined]
    live_offsets = {g for state in live.values() for g in state["offsets"]}  # type: ignore[attr-defined]
    assert set(KEPT) <= live_offsets
    assert (live_groups | live_offsets).isdisjoint(DELETED)
    assert live_offsets.isdisjoint(IDLE)

    async with groups.running(config) as reloaded:
        assert reloaded.canonical_state() == live
        for group in KEPT:
            assert await offsets_of(reloaded, group) == {
                ("t", 0): ROUNDS - 1,
                ("t", 1): ROUNDS - 1,
            }
        for group in DELETED + IDLE:
            assert await offsets_of(reloaded, group) == {}, group
            if group in DELETED:
                assert group not in await reloaded.list_groups()

    # The checkpoint holds the deleted and expired groups; their tombstones, written after
    # it, are gone from the log now: it is older than the topic keeps tombstones, and not used.
    caplog.clear()
    from_checkpoint = dataclasses.replace(config, checkpoint_uri=f"file://{checkpoint_at}")
    async with groups.running(from_checkpoint) as reloaded:
        assert reloaded.canonical_state() == live, (
            differences(reloaded.canonical_state(), live),
            [m for m in caplog.messages if "checkpoint" in m],
        )
        for group in DELETED + IDLE:
            assert await offsets_of(reloaded, group) == {}, group
    assert any(
        f"compaction checkpoint {checkpoint_at} not used: taken" in message
        and "delete.retention.ms" in message
        for message in caplog.messages
    ), caplog.messages

    # A checkpoint of the compacted log, young enough for the topic's tombstones (kept an
    # hour from now on): used, and the same state again.
    resource = ConfigResource(
        ResourceType.TOPIC, name, set_config={**COMPACTING, "delete.retention.ms": "3600000"}
    )
    admin.alter_configs([resource])[resource].result(10)
    caplog.clear()
    fresh_at = tmp_path / "fresh-checkpoint"
    await asyncio.to_thread(checkpoint_now, config, fresh_at)
    from_fresh = dataclasses.replace(config, checkpoint_uri=f"file://{fresh_at}")
    async with groups.running(from_fresh) as reloaded:
        assert reloaded.canonical_state() == live
    assert f"loading from compaction checkpoint {fresh_at}" in caplog.messages


def test_the_history_keys_are_group_keys() -> None:
    key = codec.encode_key(records.OffsetCommitKey("kept-0", "t", 0))
    assert group_keys([(key, b"x")], KEPT) == [key]
    assert group_keys([(key, b"x")], DELETED) == []
