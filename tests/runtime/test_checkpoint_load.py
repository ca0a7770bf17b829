"""Loading from a compaction checkpoint on a real broker: the same state as a full load.

One history is written once for the module: groups with members, commits and a deletion, then
a checkpoint of that log (taken as the compaction job takes it: up to fresh markers, newest
live record per key), then more commits, new groups, members leaving and a deletion of a
group the checkpoint holds. Every load below must reach the state of a full load of the log.
The runtimes run on a frozen clock, so no session or retention timer changes the state
between loads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka_group_jobs import fence, topics
from kafka_group_operator import cli
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config
from kafka_group_operator.runtime import checkpoints, coordinator_runtime, loader, topic
from kafka_group_records import checkpoint, codec, partitioning, records
from tests.runtime import logs
from tests.support import groups

pytestmark = pytest.mark.broker

PARTITIONS = 4
NOW_MS = 1_800_000_000_000
DATA_PARTITIONS = 6


@dataclasses.dataclass(frozen=True)
class History:
    config: coordinator_runtime.RuntimeConfig
    data_topic: str
    checkpoint: Path
    end_offsets: dict[int, int]
    full_state: dict[int, dict[str, Any]]


def commit(group: str, offsets: Mapping[tuple[str, int], int]) -> messages.OffsetCommitRequest:
    return messages.OffsetCommitRequest(
        group_id=group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={tp: messages.CommitOffset(offset) for tp, offset in offsets.items()},
    )


def take_checkpoint(bootstrap: str, topic: str, location: Path) -> dict[int, int]:
    """What the compaction job does, without Spark and with no coordinator running: read every
    partition up to its last stable offset, keep each key's newest record, leave out tombstoned
    keys and markers."""
    ends = topics.stable_ends(bootstrap, topic, range(PARTITIONS))
    rows: list[tuple[int, int, bytes, bytes]] = []
    consumer = Consumer(topics.reader_config(bootstrap))
    try:
        for partition, end in ends.items():
            newest: dict[bytes, tuple[int, bytes | None]] = {}
            for batch in topics.read_range(consumer, topic, partition, 0, end):
                for message in batch:
                    newest[message.key()] = (message.offset(), message.value())
            rows += [
                (partition, offset, key, value)
                for key, (offset, value) in newest.items()
                if value is not None and key != loader.MARKER_KEY
            ]
    finally:
        consumer.close()
    manifest = checkpoint.CheckpointManifest(
        topic, ends, len(rows), NOW_MS, fence.LAST_STABLE_OFFSET
    )
    checkpoints.write(location, manifest, rows)
    return ends


async def write_history(config: coordinator_runtime.RuntimeConfig, data: str, at: Path) -> None:
    async with groups.running(config) as runtime:
        for index in range(3):
            group = f"members-{index}"
            await runtime.configure_group(messages.GroupSettings(group, topics=(data,)))
            await groups.settle(runtime, group, [f"{group}-a", f"{group}-b"], data)
        for round_ in range(5):
            for index in range(12):
                await runtime.commit_offsets(
                    commit(f"offsets-{index}", {(data, p): round_ * 10 + p for p in range(3)})
                )
        await runtime.commit_offsets(commit("deleted-early", {(data, 0): 1}))
        await runtime.delete_group(messages.DeleteGroupRequest("deleted-early"))
    await asyncio.to_thread(take_checkpoint, config.bootstrap_servers, config.topic, at)
    async with groups.running(config) as runtime:
        for index in range(6, 18):  # half of them overwrite checkpointed keys, half are new
            await runtime.commit_offsets(commit(f"offsets-{index}", {(data, 0): 100 + index}))
        await runtime.remove_members(messages.RemoveMembersRequest("members-0", ("members-0-1",)))
        await groups.settle(
            runtime, "members-1", ["members-1-a", "members-1-b", "members-1-c"], data
        )
        # Tombstones after the checkpoint for keys the checkpoint holds.
        await runtime.delete_group(messages.DeleteGroupRequest("offsets-0"))
        await runtime.delete_group(messages.DeleteGroupRequest("members-2", force=True))


async def load_state(
    config: coordinator_runtime.RuntimeConfig,
) -> dict[int, dict[str, Any]]:
    async with groups.running(config) as runtime:
        return runtime.canonical_state()


@pytest.fixture(scope="module")
def history(broker: embedded.EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> History:
    data = logs.unique_topic("orders")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(data, DATA_PARTITIONS, 1)])[data].result(10)
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=broker.bootstrap,
        topic=logs.unique_topic(),
        partitions=PARTITIONS,
        metadata_interval_ms=300,
        clock_ms=lambda: NOW_MS,
    )
    location = tmp_path_factory.mktemp("checkpoints") / "checkpoint-20270115T000000Z"
    asyncio.run(write_history(config, data, location))
    ends = json.loads((location / checkpoint.MANIFEST_FILE).read_text())["endOffsets"]
    full_state = asyncio.run(load_state(config))
    return History(config, data, location, {int(p): o for p, o in ends.items()}, full_state)


def loaded_from_checkpoint(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "from compaction checkpoint" in r.message]


def warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_the_history_is_not_trivial(history: History) -> None:
    groups = {group for state in history.full_state.values() for group in state["groups"]}
    committers = {group for state in history.full_state.values() for group in state["offsets"]}
    assert {"members-0", "members-1"} <= groups
    assert {"offsets-1", "offsets-6", "offsets-17"} <= committers
    assert {"offsets-0", "members-2", "deleted-early"}.isdisjoint(groups | committers)
    assert all(end > 0 for end in history.end_offsets.values())


async def test_a_checkpoint_load_equals_a_full_load(
    history: History, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kafka_group_operator.runtime")
    config = dataclasses.replace(history.config, checkpoint_uri=f"file://{history.checkpoint}")
    assert await load_state(config) == history.full_state
    assert loaded_from_checkpoint(caplog) == [
        f"loading from compaction checkpoint {history.checkpoint}"
    ]
    # Each partition's log was read from the checkpoint's end, not from its start.
    for partition, end in history.end_offsets.items():
        assert any(
            f"state partition {partition} loaded" in m and f"log read from offset {end})" in m
            for m in caplog.messages
        )
    assert warnings(caplog) == ""


async def test_the_newest_of_the_scheduled_checkpoints_is_used(
    history: History, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory of scheduled runs: the newest, when complete and readable; a newer run
    without its manifest (still being written) is not a checkpoint yet."""
    caplog.set_level(logging.INFO, logger="kafka_group_operator.runtime")
    older = tmp_path / "checkpoint-20260101T000000Z"
    newest = tmp_path / "checkpoint-20270101T000000Z"
    for location in (older, newest):
        location.mkdir()
        for name in (checkpoint.RECORDS_FILE, checkpoint.MANIFEST_FILE):
            (location / name).write_bytes((history.checkpoint / name).read_bytes())
    (tmp_path / "checkpoint-20280101T000000Z").mkdir()
    config = dataclasses.replace(history.config, checkpoint_uri=str(tmp_path))
    assert await load_state(config) == history.full_state
    assert loaded_from_checkpoint(caplog) == [f"loading from compaction checkpoint {newest}"]


async def test_covered_offsets_come_from_the_checkpoint_alone(
    history: History, tmp_path: Path
) -> None:
    """Proof that the covered part of the log is not read: a checkpoint that leaves a group
    out (no compaction does: it is made for this proof) loads without that group."""
    table = checkpoints.read(history.checkpoint, history.config.topic, PARTITIONS, range(4))
    dropped = "offsets-2"  # committed before the checkpoint only
    home = partitioning.partition_for(dropped, PARTITIONS)
    rows = [
        (partition, index, key, value)
        for partition, survivors in table.survivors.items()
        for index, (key, value) in enumerate(survivors.items())
        if value is not None and not (partition == home and dropped.encode() in key)
    ]
    manifest = dataclasses.replace(table.manifest, records=len(rows))
    checkpoints.write(tmp_path, manifest, rows)
    config = dataclasses.replace(history.config, checkpoint_uri=str(tmp_path))
    state = await load_state(config)
    assert dropped in history.full_state[home]["offsets"]
    assert dropped not in state[home]["offsets"]
    assert state[home]["offsets"] == {
        group: offsets
        for group, offsets in history.full_state[home]["offsets"].items()
        if group != dropped
    }
    assert state[home]["groups"] == history.full_state[home]["groups"]
    expected = {p: s for p, s in history.full_state.items() if p != home}
    assert {p: s for p, s in state.items() if p != home} == expected


def _rewrite_manifest(source: Path, target: Path, **changes: Any) -> None:
    target.mkdir(parents=True, exist_ok=True)
    (target / checkpoint.RECORDS_FILE).write_bytes((source / checkpoint.RECORDS_FILE).read_bytes())
    document = json.loads((source / checkpoint.MANIFEST_FILE).read_text())
    document.update(changes)
    (target / checkpoint.MANIFEST_FILE).write_text(json.dumps(document))


@pytest.mark.parametrize(
    ("broken", "warning"),
    [
        ("missing", "no usable compaction checkpoint"),
        ("corrupt parquet", "unreadable checkpoint"),
        ("manifest not text", "unreadable checkpoint"),
        ("manifest of another format", "unsupported checkpoint format 2"),
        ("other topic", "checkpoint of topic 'another-topic'"),
        ("other partition count", "not exactly the 4 of the topic"),
        ("unsupported storage", "local directories only"),
    ],
)
async def test_an_unusable_checkpoint_falls_back_to_a_full_load(
    history: History,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    broken: str,
    warning: str,
) -> None:
    caplog.set_level(logging.INFO, logger="kafka_group_operator.runtime")
    location = tmp_path / "checkpoint"
    uri = f"file://{location}"
    if broken == "corrupt parquet":
        _rewrite_manifest(history.checkpoint, location)
        (location / checkpoint.RECORDS_FILE).write_bytes(b"PAR1 not really parquet")
    elif broken == "manifest not text":
        _rewrite_manifest(history.checkpoint, location)
        (location / checkpoint.MANIFEST_FILE).write_bytes(b"\xff\xfe{")
    elif broken == "manifest of another format":
        _rewrite_manifest(history.checkpoint, location, format=2)
    elif broken == "other topic":
        _rewrite_manifest(history.checkpoint, location, topic="another-topic")
    elif broken == "other partition count":
        ends = {str(p): o for p, o in history.end_offsets.items() if p < 2}
        _rewrite_manifest(history.checkpoint, location, endOffsets=ends)
    elif broken == "unsupported storage":
        uri = "s3://bucket/checkpoints"
    config = dataclasses.replace(history.config, checkpoint_uri=uri)
    assert await load_state(config) == history.full_state
    assert loaded_from_checkpoint(caplog) == []
    assert warning in warnings(caplog)


@pytest.mark.parametrize(
    ("end", "warning"),
    [
        (-1, "the end offset of partition 3 is -1, not an integer from 0"),
        (2**63, "the end offset of partition 3 is 9223372036854775808, not an integer from 0"),
        (12.0, "the end offset of partition 3 is 12.0, not an integer from 0"),
        ("12", "the end offset of partition 3 is '12', not an integer from 0"),
    ],
)
async def test_a_manifest_end_that_is_no_kafka_offset_means_a_full_load(
    history: History, tmp_path: Path, caplog: pytest.LogCaptureFixture, end: object, warning: str
) -> None:
    """A partition the checkpoint holds no rows of, whose end is no INT64 offset: a negative
    start would be a logical offset to the consumer (-1 is the log's end, so the partition's
    log would be skipped), a larger one fails the consumer; a full load instead."""
    caplog.set_level(logging.INFO, logger="kafka_group_operator.runtime")
    found = checkpoints.read(history.checkpoint, history.config.topic, PARTITIONS, range(4))
    rows = [
        (partition, index, key, value)
        for partition, survivors in found.survivors.items()
        if partition != 3
        for index, (key, value) in enumerate(survivors.items())
        if value is not None
    ]
    checkpoints.write(tmp_path, dataclasses.replace(found.manifest, records=len(rows)), rows)
    document = json.loads((tmp_path / checkpoint.MANIFEST_FILE).read_text())
    document["endOffsets"]["3"] = end
    (tmp_path / checkpoint.MANIFEST_FILE).write_text(json.dumps(document))
    config = dataclasses.replace(history.config, checkpoint_uri=str(tmp_path))
    assert await load_state(config) == history.full_state
    assert loaded_from_checkpoint(caplog) == []
    assert warning in warnings(caplog)


async def test_a_checkpoint_beyond_the_log_end_is_dropped_for_that_partition(
    history: History, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recreated topic, shorter than the checkpoint says: that partition's marker lands
    before the checkpoint's end, so the partition is read from its start without the
    checkpoint's rows (here one of a group the log never had); the others still use it."""
    caplog.set_level(logging.INFO, logger="kafka_group_operator.runtime")
    found = checkpoints.read(history.checkpoint, history.config.topic, PARTITIONS, range(4))
    ghost = next(
        name
        for name in (f"ghost-{index}" for index in range(1000))
        if partitioning.partition_for(name, PARTITIONS) == 1
    )
    key, value = codec.encode_record(
        records.Record(
            records.OffsetCommitKey(ghost, history.data_topic, 0),
            records.OffsetCommitValue(offset=7, commit_timestamp=NOW_MS),
        )
    )
    assert value is not None
    rows = [
        (partition, index, row_key, row_value)
        for partition, survivors in found.survivors.items()
        for index, (row_key, row_value) in enumerate(survivors.items())
        if row_value is not None
    ]
    rows.append((1, len(found.survivors[1]), key, value))
    beyond = {**history.end_offsets, 1: history.end_offsets[1] + 1_000_000}
    checkpoints.write(
        tmp_path,
        checkpoint.CheckpointManifest(history.config.topic, beyond, len(rows), NOW_MS),
        rows,
    )
    config = dataclasses.replace(history.config, checkpoint_uri=str(tmp_path))
    assert await load_state(config) == history.full_state
    assert "state partition 1 ends at offset" in warnings(caplog)
    assert len(loaded_from_checkpoint(caplog)) == 1


def test_the_operator_and_kgo_coordinator_take_a_checkpoint_location() -> None:
    env = {"KGO_BOOTSTRAP_SERVERS": "kafka:9092"}
    assert config.OperatorConfig.from_env(env).checkpoint_uri is None
    # Scheduled compaction's storage is where the checkpoints are, unless set apart.
    env["KGO_COMPACTION_STORAGE_URI"] = "file:///compactions"
    assert config.OperatorConfig.from_env(env).checkpoint_uri == "file:///compactions"
    env["KGO_CHECKPOINT_URI"] = "/mnt/checkpoints"
    assert config.OperatorConfig.from_env(env).checkpoint_uri == "/mnt/checkpoints"
    argv = ["coordinator", "--bootstrap", "kafka:9092", "--checkpoint", "file:///c"]
    assert cli.build_parser(argv).parse_args(argv).checkpoint == "file:///c"


async def test_a_checkpoint_older_than_the_topic_keeps_tombstones_is_not_used(
    history: History, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka's cleaner drops a tombstone ``delete.retention.ms`` after compacting it: a
    checkpoint older than that (a week on the topic the coordinator creates) may hold groups
    whose deletion left no trace in the log after it. A full load instead."""
    caplog.set_level(logging.INFO, logger="kafka_group_operator.runtime")
    old = tmp_path / "checkpoint-20260101T000000Z"
    old.mkdir()
    (old / checkpoint.RECORDS_FILE).write_bytes(
        (history.checkpoint / checkpoint.RECORDS_FILE).read_bytes()
    )
    manifest = json.loads((history.checkpoint / checkpoint.MANIFEST_FILE).read_text())
    manifest["createdAtMs"] = NOW_MS - topic.DELETE_RETENTION_MS
    (old / checkpoint.MANIFEST_FILE).write_text(json.dumps(manifest))
    config = dataclasses.replace(history.config, checkpoint_uri=str(tmp_path))
    assert await load_state(config) == history.full_state
    assert loaded_from_checkpoint(caplog) == []
    assert f"compaction checkpoint {old} not used: taken 604800 s ago" in warnings(caplog)
    # A day younger, it is used.
    manifest["createdAtMs"] = NOW_MS - topic.DELETE_RETENTION_MS + 24 * 3600 * 1000
    (old / checkpoint.MANIFEST_FILE).write_text(json.dumps(manifest))
    caplog.clear()
    assert await load_state(config) == history.full_state
    assert loaded_from_checkpoint(caplog) == [f"loading from compaction checkpoint {old}"]
