"""Load on takeover: a coordinator taking over a state partition of 100,000 live keys.

Setup, on the embedded broker: a state topic of 50 partitions, of which one (the partition
under test) holds 100,000 live offset-commit keys (1,000 groups x 100 partitions), each
committed 10 times: 1,000,000 records written plainly, as a long-lived coordinator leaves
them before compaction. A compaction checkpoint of that log (its 100,000 survivors, in the
compaction job's format, written with ``runtime.checkpoints.write``) covers it; then the
first holder commits 10,000 more offsets through ``CoordinatorRuntime.commit_offsets`` (100
transactions of 100), the log tail past the checkpoint.

Measured: ``CoordinatorRuntime.acquire(partition)`` on a runtime that serves nothing of the
topic yet (what the elector calls when a Lease is acquired), until the runtime answers an
``OffsetFetch`` for a group of that partition (polled every 2 ms). That is the runtime's
whole takeover path: the 50 ms gathering of partitions taken together, a new writer whose
``init_transactions`` on the partition's ``transactional.id`` fences the previous holder, the
load marker, the checkpoint's rows (pyarrow) and decode, the tail read (``read_committed``)
to the marker, compaction, the replay into a new shard, and the shard's ``on_loaded``.
Takeovers alternate between two runtimes with the checkpoint, twice a round: once from a
holder still serving, which is fenced and gives the partition up only after the takeover
(its state still in this process meanwhile), once as a Lease handover, the holder giving the
partition up first (``release``, as on a lost Lease) and the other taking it after. The
figures are their medians. After the first, the new holder's first offset commit is timed
too (its first transaction).

The process's CPU time over each takeover (every thread) is reported beside its wall time:
what the takeover costs, whatever else the machine runs.

Peers in the same run, interleaved with the takeovers: a plain confluent-kafka consumer
reading the same partition's records end to end (``read_committed``, as the loader and
``bench state_topic`` read), and the same takeover by a runtime without the checkpoint
(the whole log read). Components, timed alone: ``checkpoints.newest`` (Parquet to the
survivors dict), and the decode and the replay of the 100,000 survivors into a fresh shard as
the runtime loads them (offset commits kept in their bytes, ``loader.Survivors``), with the
garbage collector on and off (its share), and the same with every survivor decoded into a
record (``loader.load``'s form).

Target (issue 13): takeover of a 100k-key partition with a checkpoint <= 1.5 s.
Writes ``bench/results/takeover.json``. ``--quick`` uses 10,000 keys and fewer rounds.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka_group_operator.coordinator import errors, messages, shard
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import checkpoints, coordinator_runtime, loader
from kafka_group_operator.runtime import topic as state_topic
from kafka_group_records import checkpoint, codec, partitioning, records

RESULTS = Path(__file__).parent / "results" / "takeover.json"
STATE_PARTITIONS = 50
PARTITION = 7
KEYS_PER_GROUP = 100
REWRITES = 10
TAIL_GROUPS = 100  # the first holder's commits after the checkpoint: 100 x 100 records
POLL_S = 0.002
TARGET_S = 1.5


def _groups_of(partition: int, count: int) -> list[str]:
    """``count`` group ids whose state lives in ``partition``."""
    found, index = [], 0
    while len(found) < count:
        group = f"takeover-group-{index}"
        if partitioning.partition_for(group, STATE_PARTITIONS) == partition:
            found.append(group)
        index += 1
    return found


def _fill(bootstrap: str, topic: str, groups: list[str]) -> int:
    """REWRITES commits of every key of ``groups``; the partition's end offset after it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(topic, STATE_PARTITIONS, 1, config={"cleanup.policy": "compact"})]
    )[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
        }
    )
    keys = [
        codec.encode_key(records.OffsetCommitKey(group, f"topic-{tp % 10}", tp // 10))
        for group in groups
        for tp in range(KEYS_PER_GROUP)
    ]
    # Recent commit times: older ones would rightly expire (retention) as soon as loaded.
    now_ms = time.time_ns() // 1_000_000
    for round_index in range(REWRITES):
        for index, key in enumerate(keys):
            value = codec.encode_value(
                records.OffsetCommitValue(round_index * len(keys) + index, 3, "", now_ms)
            )
            while True:
                try:
                    producer.produce(topic, value, key, partition=PARTITION)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0
    return _end_offset(bootstrap, topic)


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-takeover-ends"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, PARTITION), timeout=30)
    finally:
        consumer.close()
    return int(high)


def _read(
    bootstrap: str, topic: str, end: int, keep: bool = False
) -> tuple[float, list[tuple[int, bytes, bytes]]]:
    """The raw read (the peer): every record of the partition up to ``end``, key and value
    taken out of each message as the loader does; with ``keep``, also (offset, key, value)
    of each (untimed uses only)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-takeover-raw",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    rows: list[tuple[int, bytes, bytes]] = []
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, PARTITION, OFFSET_BEGINNING)])
    done = False
    while not done:
        for message in consumer.consume(10_000, 0.2):
            if message.error() is not None:
                continue
            offset = message.offset() or 0
            key, value = message.key(), message.value()
            if keep:
                rows.append((offset, key or b"", value or b""))
            done = offset >= end - 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed, rows


def _write_checkpoint(directory: Path, topic: str, rows: list[tuple[int, bytes, bytes]]) -> int:
    """A checkpoint of the partition's log as the compaction job leaves one: newest record
    per key, in offset order, covering every offset read."""
    newest: dict[bytes, tuple[int, bytes]] = {}
    for offset, key, value in rows:
        if key != loader.MARKER_KEY:
            newest[key] = (offset, value)
    end = rows[-1][0] + 1
    ends = dict.fromkeys(range(STATE_PARTITIONS), 0)
    ends[PARTITION] = end
    manifest = checkpoint.CheckpointManifest(
        topic, ends, len(newest), time.time_ns() // 1_000_000, "last-stable-offset"
    )
    checkpoints.write(
        directory,
        manifest,
        ((PARTITION, offset, key, value) for key, (offset, value) in newest.items()),
    )
    return len(newest)


def _runtime(bootstrap: str, topic: str, uri: str | None) -> coordinator_runtime.CoordinatorRuntime:
    return coordinator_runtime.CoordinatorRuntime(
        coordinator_runtime.RuntimeConfig(
            bootstrap,
            topic=topic,
            partitions=STATE_PARTITIONS,
            served_partitions=frozenset(),
            checkpoint_uri=uri,
        )
    )


CPU: list[float] = []  # the process's CPU seconds of each takeover, in order


async def _take(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, timeout_s: float = 300
) -> float:
    """``acquire`` until the partition answers an OffsetFetch; seconds. The process's CPU
    time over the same span (every thread: the loader's, librdkafka's, the event loop's) is
    appended to ``CPU``: what the takeover costs whatever else the machine runs."""
    started, cpu = time.perf_counter(), time.process_time()
    runtime.acquire(PARTITION)
    request = messages.OffsetFetchRequest(group)
    while time.perf_counter() - started < timeout_s:
        try:
            await runtime.fetch_offsets(request)
            CPU.append(time.process_time() - cpu)
            return time.perf_counter() - started
        except errors.CoordinatorLoadInProgress:
            await asyncio.sleep(POLL_S)
    raise TimeoutError(f"partition {PARTITION} not served {timeout_s}s after acquire")


async def _commit(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, offset: int
) -> float:
    offsets = {
        (f"topic-{tp % 10}", tp // 10): messages.CommitOffset(offset)
        for tp in range(KEYS_PER_GROUP)
    }
    started = time.perf_counter()
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(group, "", messages.LEAVE_EPOCH, offsets)
    )
    return time.perf_counter() - started


def _replay_alone(survivors: dict[bytes, bytes | None], collect: bool) -> tuple[float, float]:
    """Decode and replay of the compacted records alone: (decode s, replay s); with
    ``collect`` False, with the garbage collector off (its share of the two)."""
    if not collect:
        gc.disable()
    try:
        return _decode_and_replay(survivors)
    finally:
        gc.enable()


def _decode_and_replay(survivors: dict[bytes, bytes | None]) -> tuple[float, float]:
    """As the runtime's load does it: offset commits left in their bytes (``Survivors``)."""
    started = time.perf_counter()
    decoded = loader.decode_split(survivors, PARTITION)
    decoded_at = time.perf_counter()
    fresh = shard.CoordinatorShard(None)
    for record in decoded.records:
        fresh.replay(record)
    fresh.replay_encoded_offset_commits(decoded.offset_commits)
    fresh.on_loaded(coordinator_runtime.wall_clock_ms())
    return decoded_at - started, time.perf_counter() - decoded_at


def _decode_records_and_replay(survivors: dict[bytes, bytes | None]) -> float:
    """Every survivor decoded into a record and replayed (``loader.load``'s form, the
    runtime's before offset commits were kept in their bytes), garbage collector on."""
    started = time.perf_counter()
    fresh = shard.CoordinatorShard(None)
    for record in loader.decode_survivors(survivors, PARTITION):
        fresh.replay(record)
    fresh.on_loaded(coordinator_runtime.wall_clock_ms())
    return time.perf_counter() - started


def _checkpoint_read(uri: str, topic: str) -> float:
    started = time.perf_counter()
    found = checkpoints.newest(
        uri,
        topic,
        STATE_PARTITIONS,
        [PARTITION],
        now_ms=coordinator_runtime.wall_clock_ms(),
        delete_retention_ms=state_topic.DELETE_RETENTION_MS,
    )
    assert found is not None, "the checkpoint must be usable"
    return time.perf_counter() - started


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(samples), 3),
        "min_s": round(min(samples), 3),
        "max_s": round(max(samples), 3),
        "runs_s": [round(s, 3) for s in samples],
    }


async def run(quick: bool) -> dict[str, Any]:
    groups_count = 100 if quick else 1000
    rounds = 3 if quick else 6
    topic = "bench-takeover-state"
    work = Path(tempfile.mkdtemp(prefix="kgo-takeover-"))
    uri = str(work / "checkpoint")
    try:
        with embedded.running_broker() as broker:
            bootstrap = broker.bootstrap
            groups = _groups_of(PARTITION, groups_count)
            started = time.perf_counter()
            covered = await asyncio.to_thread(_fill, bootstrap, topic, groups)
            print(f"  filled {covered:,} records in {time.perf_counter() - started:.1f}s")
            _, rows = await asyncio.to_thread(_read, bootstrap, topic, covered, True)
            live = _write_checkpoint(Path(uri), topic, rows)
            # A million tuples kept alive would make every full garbage collection of the
            # takeovers below walk them: the coordinator process holds nothing like it.
            del rows
            print(f"  checkpoint: {live:,} live keys covering offsets [0, {covered:,})")

            holders = [_runtime(bootstrap, topic, uri), _runtime(bootstrap, topic, uri)]
            peer = _runtime(bootstrap, topic, None)
            for runtime in (*holders, peer):
                await runtime.start()
            try:
                # The first holder: loads, then writes the tail past the checkpoint.
                first_load = await _take(holders[0], groups[0])
                tail_groups = groups[: min(TAIL_GROUPS, len(groups))]
                offset = REWRITES * len(groups) * KEYS_PER_GROUP
                for group in tail_groups:
                    offset += 1
                    await _commit(holders[0], group, offset)
                holder = holders[0]
                end = await asyncio.to_thread(_end_offset, bootstrap, topic)
                print(f"  first load {first_load:.2f}s; log now ends at {end:,}", flush=True)

                ours: list[float] = []
                first_commit: list[float] = []
                without: list[float] = []
                raw: list[float] = []
                ours_cpu: list[float] = []
                handover: list[float] = []
                handover_cpu: list[float] = []
                without_cpu: list[float] = []
                for round_index in range(rounds):
                    end = await asyncio.to_thread(_end_offset, bootstrap, topic)
                    elapsed, _ = await asyncio.to_thread(_read, bootstrap, topic, end)
                    raw.append(elapsed)
                    taker = holders[1] if holder is holders[0] else holders[0]
                    ours.append(await _take(taker, groups[-1]))
                    ours_cpu.append(CPU[-1])
                    holder.release(PARTITION, "taken over (benchmark)")
                    holder = taker
                    offset += 1
                    first_commit.append(await _commit(holder, groups[-1], offset))
                    print(
                        f"  round {round_index}: takeover {ours[-1]:.3f}s, CPU "
                        f"{ours_cpu[-1]:.3f}s (first commit "
                        f"{first_commit[-1] * 1000:.0f} ms), raw read {raw[-1]:.2f}s",
                        flush=True,
                    )
                    # A Lease handover: the holder gives the partition up first (its Lease
                    # was lost), and only then does the other take it, in this process
                    # without the previous holder's state beside its own.
                    other = holders[1] if holder is holders[0] else holders[0]
                    holder.release(PARTITION, "its Lease was lost (benchmark)")
                    handover.append(await _take(other, groups[-1]))
                    handover_cpu.append(CPU[-1])
                    holder = other
                    print(
                        f"  handover {handover[-1]:.3f}s, CPU {handover_cpu[-1]:.3f}s",
                        flush=True,
                    )
                    if round_index % 2 == 1 or quick:
                        without.append(await _take(peer, groups[-1]))
                        without_cpu.append(CPU[-1])
                        holder.release(PARTITION, "taken over (benchmark)")
                        holder = peer
                        print(f"  takeover without checkpoint {without[-1]:.2f}s", flush=True)
                        # Back to a checkpoint holder, untimed: the next round's previous
                        # holder is one of them.
                        back = holders[0]
                        await _take(back, groups[-1])
                        holder.release(PARTITION, "taken over (benchmark)")
                        holder = back
                live_loaded = sum(
                    len(offsets)
                    for state in holder.canonical_state().values()
                    for offsets in state["offsets"].values()
                )
            finally:
                for runtime in (*holders, peer):
                    await runtime.stop()
            end = await asyncio.to_thread(_end_offset, bootstrap, topic)
            _, rows = await asyncio.to_thread(_read, bootstrap, topic, end, True)
            survivors = loader.compact((key, value) for _, key, value in rows)
            del rows
    finally:
        checkpoint_s = [_checkpoint_read(uri, topic) for _ in range(3)]
        shutil.rmtree(work, ignore_errors=True)
    replays = [_replay_alone(survivors, True) for _ in range(3)]
    uncollected = [_replay_alone(survivors, False) for _ in range(3)]
    as_records = [_decode_records_and_replay(survivors) for _ in range(3)]
    assert live_loaded == live, f"the holder serves {live_loaded} keys, expected {live}"
    median = statistics.median(ours)
    return {
        "benchmark": "takeover",
        "quick": quick,
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "broker": "tansu (embedded, in-memory storage)",
        "state_partitions": STATE_PARTITIONS,
        "live_keys": live,
        "records_covered_by_checkpoint": covered,
        "tail_records_at_end": end - covered,
        "takeover_with_checkpoint": _summary(ours),
        "takeover_with_checkpoint_cpu_s": _summary(ours_cpu),
        "handover_with_checkpoint": _summary(handover),
        "handover_with_checkpoint_cpu_s": _summary(handover_cpu),
        "peer_takeover_without_checkpoint_cpu_s": _summary(without_cpu),
        "first_commit_after_takeover_ms": [round(s * 1000, 1) for s in first_commit],
        "peer_takeover_without_checkpoint": _summary(without),
        "peer_raw_read_of_the_partition": _summary(raw),
        "takeover_vs_raw_read": round(median / statistics.median(raw), 3),
        "takeover_vs_without_checkpoint": round(median / statistics.median(without), 3),
        "components": {
            "checkpoint_read_s": round(min(checkpoint_s), 3),
            "decode_survivors_s": round(min(d for d, _ in replays), 3),
            "replay_into_shard_s": round(min(r for _, r in replays), 3),
            "decode_survivors_gc_off_s": round(min(d for d, _ in uncollected), 3),
            "replay_into_shard_gc_off_s": round(min(r for _, r in uncollected), 3),
            "decode_and_replay_as_records_s": round(min(as_records), 3),
        },
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "target": {"takeover_s": f"<= {TARGET_S}", "measured_median_s": round(median, 3)},
    }


def main(argv: list[str]) -> int:
    load_before = [round(x, 2) for x in os.getloadavg()]
    result = asyncio.run(run("--quick" in argv))
    result["load_average_start"] = load_before
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
