"""The snapshot, compaction and restore jobs end to end: real broker, real local Spark.

The state topic is filled with records in the coordinator's real encoding (written through
the shared codec, with chosen append times so that ``asOf`` needs no sleeping), and the jobs
run on the shared session exactly as their ``main`` runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from kafka_group_jobs import (
    arguments,
    columns,
    compaction,
    fence,
    restore,
    snapshot,
    source,
    topics,
)
from kafka_group_operator.commands import demo
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import checkpoint, codec, partitioning, records, results
from tests.support import groups
from tests.support import topics as test_topics

pytestmark = [pytest.mark.spark, pytest.mark.broker]

STATE_PARTITIONS = 4
DATA_PARTITIONS = 3
MESSAGES_PER_PARTITION = 20
T0 = 1_700_000_000_000


def create_topics(bootstrap: str, state: tuple[str, int], *data: tuple[str, int]) -> None:
    """The state topic (compacted, as the coordinator creates it) and data topics (not:
    Apache Kafka refuses keyless records on a compacted topic)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(state[0], state[1], 1, config={"cleanup.policy": "compact"})]
        + [NewTopic(name, partitions, 1) for name, partitions in data]
    )
    for future in futures.values():
        future.result(15)
    for name, partitions in (state, *data):
        test_topics.wait_for_leaders(bootstrap, name, partitions)


def fill_data_topic(bootstrap: str, topic: str) -> None:
    # Unbatched, so that the test broker's high watermark (the log end for lag) is exact.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "batch.num.messages": 1,
            "linger.ms": 0,
            "enable.idempotence": True,
        }
    )
    failures: list[object] = []
    for partition in range(DATA_PARTITIONS):
        for index in range(MESSAGES_PER_PARTITION):
            producer.produce(
                topic,
                f"m{index}".encode(),
                partition=partition,
                on_delivery=lambda error, _: failures.append(error) if error else None,
            )
    assert producer.flush(30) == 0
    assert failures == [], failures


def append(bootstrap: str, state_topic: str, entries: list[tuple[records.Record, int]]) -> None:
    """Appends records to their group's state partition with the given append times.

    Unbatched, so that the test broker's last stable offset (the end a job reads up to with no
    coordinator running) is exact: it reports a wrong one after batched produces.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "batch.num.messages": 1,
            "linger.ms": 0,
            # In order even when a produce is retried (a topic this new may not be led yet):
            # which record is the newest of its key is what the jobs judge.
            "enable.idempotence": True,
        }
    )
    for record, at in entries:
        group = records.group_of(record.key)
        assert group is not None
        key, value = codec.encode_record(record)
        partition = partitioning.partition_for(group, STATE_PARTITIONS)
        producer.produce(state_topic, value, key, partition=partition, timestamp=at)
    assert producer.flush(30) == 0


def commits(
    group: str, topic: str, offsets: dict[int, int], at: int
) -> list[tuple[records.Record, int]]:
    return [
        (
            records.Record(
                records.OffsetCommitKey(group, topic, partition),
                records.OffsetCommitValue(offset=offset, commit_timestamp=at),
            ),
            at,
        )
        for partition, offset in offsets.items()
    ]


def read_log(
    bootstrap: str, state_topic: str, starts: dict[int, int], ends: dict[int, int]
) -> list[tuple[int, bytes, bytes | None]]:
    consumer = Consumer(topics.reader_config(bootstrap))
    try:
        found = []
        for partition, end in ends.items():
            for batch in topics.read_range(
                consumer, state_topic, partition, starts.get(partition, 0), end
            ):
                found.extend((partition, m.key(), m.value()) for m in batch)
        return found
    finally:
        consumer.close()


def replay(
    state: dict[bytes, bytes], log: list[tuple[int, bytes, bytes | None]]
) -> dict[bytes, bytes]:
    """What a loader does with a log: newest value per key, tombstones delete; markers skipped."""
    for _, key, value in log:
        if isinstance(codec.decode_key(key), records.LoadMarkerKey):
            continue
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


@pytest.fixture
def names() -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return {"state": f"state-{suffix}", "data": f"orders-{suffix}", "group": f"payments-{suffix}"}


def topics_with_data(
    broker: embedded.EmbeddedBroker, names: dict[str, str]
) -> tuple[str, str, str, str]:
    """Bootstrap, state topic, data topic and group of ``names``, the topics created and the
    data topic filled (``fill_data_topic``)."""
    state_topic, data = names["state"], names["data"]
    create_topics(broker.bootstrap, (state_topic, STATE_PARTITIONS), (data, DATA_PARTITIONS))
    fill_data_topic(broker.bootstrap, data)
    return broker.bootstrap, state_topic, data, names["group"]


def offsets_of(spark: SparkSession, location: str) -> dict[tuple[str, int], int]:
    _, data = snapshot.read(spark, location)
    return {(row.topic, row.partition): row.offset for row in data.collect()}


def test_snapshot_change_restore_gives_back_the_snapshot(
    spark: SparkSession, broker: embedded.EmbeddedBroker, names: dict[str, str], tmp_path: Path
) -> None:
    bootstrap, state_topic, data, group = topics_with_data(broker, names)
    append(bootstrap, state_topic, commits(group, data, {0: 3, 1: 4, 2: 5}, T0))
    append(bootstrap, state_topic, commits(group, data, {0: 5, 1: 7, 2: 9}, T0 + 60_000))
    append(bootstrap, state_topic, commits("bystander", data, {0: 1}, T0 + 60_000))

    location = f"file://{tmp_path}/snap-1"
    manifest = snapshot.take(spark, bootstrap, state_topic, group, location)
    assert offsets_of(spark, location) == {(data, 0): 5, (data, 1): 7, (data, 2): 9}
    assert manifest["records"] == 3
    assert manifest["partitions"] == {data: [0, 1, 2]}
    assert (
        manifest["checksum"]
        == json.loads((tmp_path / "snap-1" / "manifest.json").read_text())["checksum"]
    )
    state_partition = str(partitioning.partition_for(group, STATE_PARTITIONS))
    assert list(manifest["stateTopic"]["endOffsets"]) == [state_partition]
    _, frame = snapshot.read(spark, location)
    lags = {row.partition: (row.log_end_offset, row.lag) for row in frame.collect()}
    assert lags == {0: (20, 15), 1: (20, 13), 2: (20, 11)}

    as_of = f"file://{tmp_path}/snap-as-of"
    earlier = snapshot.take(spark, bootstrap, state_topic, group, as_of, as_of_ms=T0 + 30_000)
    assert offsets_of(spark, as_of) == {(data, 0): 3, (data, 1): 4, (data, 2): 5}
    assert earlier["asOf"] == arguments.iso_time(T0 + 30_000)

    # The group moves on, then is restored to the snapshot.
    append(bootstrap, state_topic, commits(group, data, {0: 18, 1: 2, 2: 19}, T0 + 120_000))
    rows, missing, read_fence = restore.plan(
        spark, bootstrap, state_topic, group, "snapshot", snapshot_location=location
    )
    assert missing == []
    assert read_fence == fence.LAST_STABLE_OFFSET
    assert [(r["partition"], r["current_offset"], r["new_offset"], r["clamp"]) for r in rows] == [
        (0, 18, 5, None),
        (1, 2, 7, None),
        (2, 19, 9, None),
    ]
    # The coordinator applies the plan (here: its records, as it would append them).
    restored_at = T0 + 180_000
    append(
        bootstrap,
        state_topic,
        commits(group, data, {r["partition"]: r["new_offset"] for r in rows}, restored_at),
    )
    after = f"file://{tmp_path}/snap-2"
    restored = snapshot.take(spark, bootstrap, state_topic, group, after)
    assert offsets_of(spark, after) == offsets_of(spark, location)
    assert restored["checksum"] == manifest["checksum"]


def test_a_snapshot_reads_only_its_group_s_commits_of_a_shared_state_partition(
    spark: SparkSession, broker: embedded.EmbeddedBroker, names: dict[str, str], tmp_path: Path
) -> None:
    """Other groups' records on the group's state partition (one named with the group's
    name as its prefix among them) are passed over by their keys' first bytes: none reaches
    Spark, and the snapshot is the group's alone. Of the group's commits Spark gets the newest
    of each partition: a tombstone still counts, the commit it deletes does not go over."""
    bootstrap, state_topic, data, group = topics_with_data(broker, names)
    home = partitioning.partition_for(group, STATE_PARTITIONS)
    neighbours = [
        name
        for name in (f"{group}{index}" for index in range(200))
        if partitioning.partition_for(name, STATE_PARTITIONS) == home
    ][:2]
    assert len(neighbours) == 2
    append(bootstrap, state_topic, commits(group, data, {0: 3, 1: 4, 2: 5}, T0))
    for neighbour in neighbours:
        append(bootstrap, state_topic, commits(neighbour, data, {0: 9, 1: 9, 2: 9}, T0 + 1))
        append(
            bootstrap,
            state_topic,
            [(records.Record(records.GroupConfigKey(neighbour), None), T0 + 1)],
        )
    append(
        bootstrap,
        state_topic,
        [(records.Record(records.OffsetCommitKey(group, data, 2), None), T0 + 2)],
    )

    state, _, ranges = arguments.read_state(
        spark, bootstrap, state_topic, {}, [home], commits_of=group
    )
    assert sum(r.end - r.start for r in ranges) == 3 + 2 * 4 + 1
    kept = [(row.group_id, row.topic_partition, row.committed_offset) for row in state.collect()]
    assert sorted(kept, key=str) == sorted(
        [(group, 0, 3), (group, 1, 4), (group, 2, None)], key=str
    )
    location = f"file://{tmp_path}/snap"
    manifest = snapshot.take(spark, bootstrap, state_topic, group, location)
    assert offsets_of(spark, location) == {(data, 0): 3, (data, 1): 4}
    assert manifest["records"] == 2


def test_reset_plan_clamps_and_dry_run_writes_nothing(
    spark: SparkSession, broker: embedded.EmbeddedBroker, names: dict[str, str], tmp_path: Path
) -> None:
    bootstrap, state_topic, data, group = topics_with_data(broker, names)
    append(bootstrap, state_topic, commits(group, data, {0: 5, 1: 7}, T0))
    before = f"file://{tmp_path}/before"
    snapshot.take(spark, bootstrap, state_topic, group, before)

    rows, _, _ = restore.plan(spark, bootstrap, state_topic, group, "shift-by", value=-6)
    assert [(r["partition"], r["new_offset"], r["clamp"]) for r in rows] == [
        (0, 0, "earliest"),
        (1, 1, None),
    ]
    rows, _, _ = restore.plan(
        spark, bootstrap, state_topic, group, "offset", value=500, scope_topics=(data,)
    )
    assert [(r["partition"], r["current_offset"], r["new_offset"], r["clamp"]) for r in rows] == [
        (0, 5, 20, "latest"),
        (1, 7, 20, "latest"),
        (2, None, 20, "latest"),
    ]
    report = restore.audit(group, {"to": "offset", "value": 500}, rows, [], dry_run=True)
    assert report["clamped"] == 3
    assert report["partitions"][2] == {
        "topic": data,
        "partition": 2,
        "oldOffset": None,
        "newOffset": 20,
        "requestedOffset": 500,
        "clamp": "latest",
    }

    # The job's main with --dry-run prints the plan and leaves the offsets alone.
    assert restore.main([
        "--bootstrap", bootstrap, "--topic", state_topic, "--group", group,
        "--to", "earliest", "--dry-run", "--audit", f"file://{tmp_path}/audit.json",
    ]) == 0  # fmt: skip
    audit_file = json.loads((tmp_path / "audit.json").read_text())
    assert audit_file["dryRun"] is True
    assert [p["newOffset"] for p in audit_file["partitions"]] == [0, 0, 0]
    after = f"file://{tmp_path}/after"
    snapshot.take(spark, bootstrap, state_topic, group, after)
    assert offsets_of(spark, after) == {(data, 0): 5, (data, 1): 7}


def test_compaction_writes_a_checkpoint_and_nothing_else(
    spark: SparkSession,
    broker: embedded.EmbeddedBroker,
    names: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Jobs read and plan; only the coordinator writes. Compaction appends no tombstone and no
    marker and judges no retention: the expired group's records stay in the checkpoint, and
    the coordinator that loads it expires them by its own rule (KIP-211)."""
    bootstrap, state_topic, data = broker.bootstrap, names["state"], names["data"]
    create_topics(bootstrap, (state_topic, STATE_PARTITIONS))
    day = 24 * 3600 * 1000
    now = T0 + 30 * day
    live_group, old_group, gone_group = f"live-{data}", f"old-{data}", f"gone-{data}"
    entries: list[tuple[records.Record, int]] = []
    for round_ in range(5):  # superseded commits that compaction drops (a day old at ``now``)
        entries += commits(live_group, data, {0: round_, 1: 10 + round_}, now - day + round_)
    entries += commits(old_group, data, {0: 3}, T0)
    entries.append(
        (records.Record(records.GroupLifecycleKey(old_group), records.GroupLifecycleValue(T0)), T0)
    )
    entries.append(
        (records.Record(records.GroupLifecycleKey(live_group), records.GroupLifecycleValue(-1)), T0)
    )
    entries.append(
        (records.Record(records.GroupConfigKey(gone_group), records.GroupConfigValue()), T0)
    )
    entries += commits(gone_group, data, {0: 8}, T0)
    entries.append((records.Record(records.GroupConfigKey(gone_group), None), T0 + 1))
    append(bootstrap, state_topic, entries)
    every = range(STATE_PARTITIONS)
    before = topics.stable_ends(bootstrap, state_topic, every)

    location = tmp_path / "checkpoint"
    assert compaction.main([
        "--bootstrap", bootstrap, "--topic", state_topic, "--output", f"file://{location}",
    ]) == 0  # fmt: skip
    # Nothing was appended to the state topic: no tombstone, no marker.
    assert topics.stable_ends(bootstrap, state_topic, every) == before
    assert sum(before.values()) == len(entries)
    parsed = checkpoint.parse_manifest((location / checkpoint.MANIFEST_FILE).read_text())
    assert parsed.end_offsets == before
    assert parsed.fence == fence.LAST_STABLE_OFFSET
    out, err = capsys.readouterr()
    covered = ", ".join(f"{p}: below {end}" for p, end in sorted(before.items()))
    assert out.splitlines() == [
        f"checkpoint of {state_topic} written to file://{location}",
        "  6 live records kept",
        f"  state-topic offsets covered, per partition: {covered} (read fence: last-stable-offset)",
    ]
    # Three groups use at most three of the four partitions: the empty ones count as done.
    assert (
        f"reading {state_topic}: 4/4 partitions done, {len(entries)}/{len(entries)} records read"
        in err.splitlines()
    )
    table = pq.read_table(location / checkpoint.RECORDS_FILE).to_pylist()
    # live: two commits + lifecycle; old: commit + lifecycle; gone: the commit left behind.
    assert parsed.records == len(table) == 6
    assert [(r["partition"], r["offset"]) for r in table] == sorted(
        (r["partition"], r["offset"]) for r in table
    )
    kept_groups = {records.group_of(codec.decode_key(r["key"])) for r in table}
    assert kept_groups == {live_group, old_group, gone_group}

    # A loader on checkpoint + tail reaches the same state as one replaying the whole log.
    whole = replay({}, read_log(bootstrap, state_topic, {}, before))
    from_checkpoint = replay(
        {r["key"]: r["value"] for r in table},
        read_log(bootstrap, state_topic, {p: parsed.tail_start(p) for p in before}, before),
    )
    assert from_checkpoint == whole

    # The coordinator loading the checkpoint judges retention itself: the old group, empty
    # for 30 days with the default 7-day retention, expires; the live group, which committed
    # a day ago, stays. Its clock
    # starts at ``now`` and runs, so that its timers fire.
    started = time.monotonic()
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=state_topic,
        partitions=STATE_PARTITIONS,
        clock_ms=lambda: now + int((time.monotonic() - started) * 1000),
        timer_interval_ms=100,
        checkpoint_uri=f"file://{location}",
    )

    async def committers_after_expiry() -> set[str]:
        async with groups.running(config) as runtime:
            for _ in range(100):
                state = runtime.canonical_state()
                found = {group for shard in state.values() for group in shard["offsets"]}
                if old_group not in found:
                    return found
                await asyncio.sleep(0.1)
            return found

    committers = asyncio.run(committers_after_expiry())
    assert live_group in committers
    assert old_group not in committers


def test_snapshot_main_runs_under_python_m(
    broker: embedded.EmbeddedBroker, names: dict[str, str], tmp_path: Path, spark: SparkSession
) -> None:
    """``main`` as spark-submit or the operator's local mode calls it, result line included."""
    bootstrap, state_topic, data, group = (
        broker.bootstrap,
        names["state"],
        names["data"],
        names["group"],
    )
    create_topics(bootstrap, (state_topic, STATE_PARTITIONS))
    append(bootstrap, state_topic, commits(group, data, {0: 2}, T0))
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert snapshot.main([
            "--bootstrap", bootstrap, "--topic", state_topic, "--group", group,
            "--output", f"file://{tmp_path}/s", "--json",
        ]) == 0  # fmt: skip
    out: dict[str, Any] = results.parse_result(buffer.getvalue()) or {}
    assert out["records"] == 1
    assert out["partitions"] == {data: [0]}
    assert out["location"] == f"file://{tmp_path}/s"
    # The data topic does not exist (any more): the offset is kept, its lag is unknown.
    _, frame = snapshot.read(spark, out["location"])
    assert [(row.offset, row.lag) for row in frame.collect()] == [(2, None)]


def test_restore_commits_through_the_coordinators_http_api(
    spark: SparkSession, broker: embedded.EmbeddedBroker, names: dict[str, str], tmp_path: Path
) -> None:
    """``--coordinator-url``: one administrative commit, accepted because the group is empty."""
    local = demo.LocalGroup(
        group=names["group"],
        topic=names["data"],
        partitions=DATA_PARTITIONS,
        state_partitions=2,
        directory=tmp_path,
    )
    local.start(broker)
    try:
        fill_data_topic(broker.bootstrap, local.topic)
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert restore.main([
                "--bootstrap", broker.bootstrap, "--topic", f"{local.group}.group-state",
                "--group", local.group, "--to", "offset", "--value", "7", "--topics", local.topic,
                "--coordinator-url", local.coordinator_url, "--token", local.token, "--json",
                "--execute",
            ]) == 0  # fmt: skip
        audit = results.parse_result(buffer.getvalue())
        assert audit is not None
        # The commits were read up to the coordinator's own read fence.
        assert audit["fence"] == fence.COORDINATOR
        assert [(p["partition"], p["oldOffset"], p["newOffset"]) for p in audit["partitions"]] == [
            (partition, None, 7) for partition in range(DATA_PARTITIONS)
        ]
        assert local.client().fetch() == {(local.topic, p): 7 for p in range(DATA_PARTITIONS)}
    finally:
        local.stop()


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


def test_jobs_print_tables_and_warn_on_clamps_and_offsets_past_the_log_end(
    spark: SparkSession,
    broker: embedded.EmbeddedBroker,
    names: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20 messages per partition
    bootstrap, state_topic, data, group = topics_with_data(broker, names)
    # 57 lies past the log end of 20, as when the broker reports a wrong log end.
    append(bootstrap, state_topic, commits(group, data, {0: 5, 1: 57}, T0))
    # One offset range per record: the read runs as two tasks, and progress counts both.
    monkeypatch.setattr(arguments, "MAX_RECORDS_PER_SPLIT", 1)
    common = ["--bootstrap", bootstrap, "--topic", state_topic, "--group", group]

    assert snapshot.main([*common, "--output", (tmp_path / "s").as_uri()]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"snapshot of group {group} written to {(tmp_path / 's').as_uri()}"
    assert lines[2:] == [
        f"  topic{' ' * 10}  partition  offset  log end  lag",
        f"  {data}          0       5       20   15",
        f"  {data}          1      57       20    0",
    ]
    assert f"reading {state_topic}: 1/1 partitions done, 2/2 records read" in err.splitlines()
    assert warnings_of(err) == [
        f"warning: {data}[1]: committed offset 57 is past the log end 20 the broker reports; its"
        " lag shows as 0. Either the broker reports a wrong log end (some do after batched"
        " produces) or the partition lost records: check before restoring to this offset"
    ]

    assert (
        restore.main([*common, "--to", "offset", "--value", "500", "--topics", data, "--dry-run"])
        == 0
    )
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"restore plan for group {group}: to offset 500",
        f"  topic{' ' * 10}  partition  old  requested  new  clamp",
        f"  {data}          0    5        500   20  latest",
        f"  {data}          1   57        500   20  latest",
        f"  {data}          2    -        500   20  latest",
        "3 partitions, 3 clamped; dry run: nothing written; add --execute to write 3 offset(s)",
    ]
    past_end = (
        " the broker reports: clamped to 20. If the partition does hold that offset, the broker"
        " reports a wrong log end: check before applying"
    )
    assert warnings_of(err) == [
        f"warning: {data}[0]: requested offset 500 is past the log end 20{past_end}",
        f"warning: {data}[1]: committed offset 57 is past the log end 20 the broker reports:"
        " either the broker reports a wrong log end (some do after batched produces) or the"
        " partition lost records",
        f"warning: {data}[1]: requested offset 500 is past the log end 20{past_end}",
        f"warning: {data}[2]: requested offset 500 is past the log end 20{past_end}",
    ]

    # --json: the machine-readable line alone on stdout, the warnings still on stderr.
    assert restore.main([*common, "--to", "shift-by", "--value", "-10", "--dry-run", "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1
    audit = results.parse_result(out)
    assert audit is not None
    assert [(p["partition"], p["newOffset"], p["clamp"]) for p in audit["partitions"]] == [
        (0, 0, "earliest"),
        (1, 20, "latest"),
    ]
    assert warnings_of(err) == [f"warning: {line}" for line in audit["warnings"]]
    assert audit["warnings"][0] == (
        f"{data}[0]: requested offset -5 is before the log start 0 (deleted by retention):"
        " clamped to 0"
    )


def test_a_snapshot_of_a_group_without_offsets_fails_unless_allowed(
    spark: SparkSession,
    broker: embedded.EmbeddedBroker,
    names: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bootstrap, state_topic, data, group = (
        broker.bootstrap,
        names["state"],
        names["data"],
        names["group"],
    )
    create_topics(bootstrap, (state_topic, STATE_PARTITIONS))
    append(bootstrap, state_topic, commits(group, data, {0: 2}, T0))
    output = (tmp_path / "s").as_uri()
    misspelled = ["--bootstrap", bootstrap, "--topic", state_topic, "--group", group + "x"]
    assert snapshot.main([*misspelled, "--output", output]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[-1] == (
        f"kafka_group_jobs.snapshot: error: group {group + 'x'!r} has no committed offsets in"
        f" {state_topic!r} (is the group id right?); nothing written. --allow-empty writes an"
        " empty snapshot"
    )
    assert not (tmp_path / "s").exists()

    assert snapshot.main([*misspelled, "--output", output, "--allow-empty", "--json"]) == 0
    manifest = results.parse_result(capsys.readouterr().out)
    assert manifest is not None
    assert (manifest["records"], manifest["partitions"]) == (0, {})
    assert (tmp_path / "s" / snapshot.MANIFEST_FILE).exists()


def test_the_reader_runs_one_task_per_offset_range(spark: SparkSession) -> None:
    """Task ``i`` reads range ``i``: planning the frame reads nothing (nothing listens on
    port 1), and empty ranges are read without asking the broker."""
    ranges = source.split_ranges({0: 0, 1: 5}, {0: 3, 1: 5, 2: 0}, 1)
    assert ranges == [
        source.OffsetRange(0, 0, 1),
        source.OffsetRange(0, 1, 2),
        source.OffsetRange(0, 2, 3),
    ]
    frame = source.read(spark, "127.0.0.1:1", "state", ranges, {"client.id": "reader"})
    assert frame.rdd.getNumPartitions() == 3
    assert frame.columns == list(columns.STATE_RECORD_COLUMNS)
    empty = source.read(spark, "127.0.0.1:1", "state", [source.OffsetRange(1, 5, 5)])
    assert empty.count() == 0
    assert source.read(spark, "127.0.0.1:1", "state", []).rdd.getNumPartitions() == 1


def test_a_spark_failure_is_one_line_with_exit_code_1(
    spark: SparkSession,
    broker: embedded.EmbeddedBroker,
    names: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Object stores are only checked by Spark (here: no S3 connector in the local Spark): its
    error is one line, not the JVM's stack."""
    create_topics(broker.bootstrap, (names["state"], STATE_PARTITIONS))
    assert restore.main([
        "--bootstrap", broker.bootstrap, "--topic", names["state"], "--group", names["group"],
        "--to", "snapshot", "--snapshot", "s3a://bucket/nightly", "--dry-run",
    ]) == 1  # fmt: skip
    out, err = capsys.readouterr()
    assert out == ""
    errors = [line for line in err.splitlines() if line.startswith("kafka_group_jobs.")]
    assert errors == [
        "kafka_group_jobs.restore: error: java.lang.RuntimeException:"
        " java.lang.ClassNotFoundException: Class org.apache.hadoop.fs.s3a.S3AFileSystem not found"
    ]
    assert "\tat " not in err
