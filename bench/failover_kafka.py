"""Failover against Kafka's own group coordinator, on one Apache Kafka cluster of three nodes.

Both sides in the same run, on the same cluster (replication factor 3,
``min.insync.replicas=2``, a node fenced 6 s after its last heartbeat), each killed the
same way (SIGKILL of a node, as a crashed machine):

- **native**: a consumer group of Kafka's own (confluent-kafka, classic protocol, two
  members) consuming a topic of 6 partitions and committing synchronously every 50 ms per
  member. The node leading the group's ``__consumer_offsets`` partition (Kafka's coordinator
  of the group) is killed; measured: the time until the group's next acknowledged commit.
- **ours**: the coordinator runtime, its state topic replicated three ways, a committer
  committing the group's offsets every 50 ms. The node leading the group's state partition is
  killed; measured: the time until the next acknowledged commit.

Both count acknowledged commits lost (a committed offset read back after the failover below
the highest acknowledged: must be 0). ``--rounds=N`` (3) kills in turn; the killed node is
started again between rounds. Writes ``bench/results/failover-kafka.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import kafka
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning

RESULTS = Path(__file__).parent / "results" / "failover-kafka.json"
PARTITIONS = 6
STATE_PARTITIONS = 6
COMMIT_EVERY_S = 0.05
WAIT_S = 120.0


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), as Kafka partitions group ids."""
    value = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        value = (31 * value + int(unit, 16)) & 0xFFFFFFFF
    return value


def offsets_partition(group: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition of a group (``Utils.abs(hashCode) % n``)."""
    return (java_string_hash(group) & 0x7FFFFFFF) % partitions


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader)


class NativeMember(threading.Thread):
    """One member of a Kafka-coordinated group, committing every ``COMMIT_EVERY_S``."""

    def __init__(self, bootstrap: str, group: str, topic: str, index: int) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": f"native-{index}",
                "group.protocol": "classic",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 45_000,
                "log_level": 0,
            }
        )
        self.topic = topic
        self.stop = threading.Event()
        self.acked: list[tuple[float, dict[int, int]]] = []
        self.sequence = 0

    def run(self) -> None:
        self.consumer.subscribe([self.topic])
        while not self.stop.is_set():
            self.consumer.poll(0.01)
            owned = self.consumer.assignment()
            if not owned:
                continue
            self.sequence += 1
            wanted = {tp.partition: self.sequence for tp in owned}
            try:
                self.consumer.commit(
                    offsets=[TopicPartition(self.topic, p, o) for p, o in wanted.items()],
                    asynchronous=False,
                )
                self.acked.append((time.monotonic(), wanted))
            except KafkaException:
                pass
            time.sleep(COMMIT_EVERY_S)
        self.consumer.close()


def native_round(cluster: kafka.KafkaCluster, topic: str) -> dict[str, Any]:
    group = f"native-{uuid.uuid4().hex[:6]}"
    members = [NativeMember(cluster.bootstrap, group, topic, i) for i in range(2)]
    for member in members:
        member.start()
    deadline = time.monotonic() + WAIT_S
    while sum(len(m.acked) for m in members) < 20:
        assert time.monotonic() < deadline, "the native group never committed"
        time.sleep(0.1)
    victim = leader_of(cluster.bootstrap, "__consumer_offsets", offsets_partition(group, 6))
    cluster.kill_node(victim)
    killed_at = time.monotonic()
    deadline = killed_at + WAIT_S
    while not any(at > killed_at for m in members for at, _ in m.acked):
        assert time.monotonic() < deadline, "the native group never committed again"
        time.sleep(0.01)
    back = min(at for m in members for at, _ in m.acked if at > killed_at) - killed_at
    time.sleep(1)
    for member in members:
        member.stop.set()
    for member in members:
        member.join(30)
    highest: dict[int, int] = {}
    for member in members:
        for _, offsets in member.acked:
            for partition, offset in offsets.items():
                highest[partition] = max(highest.get(partition, 0), offset)
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    stored = reader.committed([TopicPartition(topic, p) for p in highest], timeout=30)
    reader.close()
    lost = sum(1 for tp in stored if tp.offset < highest[tp.partition])
    cluster.start_node(victim)
    return {"killed_node": victim, "commit_again_after_s": round(back, 3), "commits_lost": lost}


async def ours_round(cluster: kafka.KafkaCluster) -> dict[str, Any]:
    config = coordinator_runtime.RuntimeConfig(
        cluster.bootstrap,
        topic=f"failover-state-{uuid.uuid4().hex[:6]}",
        partitions=STATE_PARTITIONS,
        replication_factor=3,
        min_insync_replicas=2,
        write_timeout_ms=3000,
        metadata_interval_ms=300,
    )
    group = "ours"
    runtime = coordinator_runtime.CoordinatorRuntime(config)
    await asyncio.wait_for(runtime.start(), WAIT_S)
    acked: list[tuple[float, int]] = []
    stop = asyncio.Event()

    async def committer() -> None:
        sequence = 0
        while not stop.is_set():
            sequence += 1
            request = messages.OffsetCommitRequest(
                group, "", messages.LEAVE_EPOCH, {("t", 0): messages.CommitOffset(sequence)}
            )
            try:
                await runtime.commit_offsets(request)
                acked.append((time.monotonic(), sequence))
            except errors.CoordinatorError:
                pass
            await asyncio.sleep(COMMIT_EVERY_S)

    task = asyncio.create_task(committer())
    try:
        deadline = time.monotonic() + WAIT_S
        while len(acked) < 20:
            assert time.monotonic() < deadline, "ours never committed"
            await asyncio.sleep(0.1)
        partition = partitioning.partition_for(group, STATE_PARTITIONS)
        victim = await asyncio.to_thread(leader_of, cluster.bootstrap, config.topic, partition)
        await asyncio.to_thread(cluster.kill_node, victim)
        killed_at = time.monotonic()
        deadline = killed_at + WAIT_S
        while not any(at > killed_at for at, _ in acked):
            assert time.monotonic() < deadline, "ours never committed again"
            await asyncio.sleep(0.01)
        back = min(at for at, _ in acked if at > killed_at) - killed_at
        await asyncio.sleep(1)
    finally:
        stop.set()
        await task
        await runtime.stop()
    reloaded = coordinator_runtime.CoordinatorRuntime(config)
    await asyncio.wait_for(reloaded.start(), WAIT_S)
    try:
        fetched = await reloaded.fetch_offsets(messages.OffsetFetchRequest(group))
    finally:
        await reloaded.stop()
    lost = int(fetched.offsets[("t", 0)].offset < max(s for _, s in acked))
    await asyncio.to_thread(cluster.start_node, victim)
    return {"killed_node": victim, "commit_again_after_s": round(back, 3), "commits_lost": lost}


async def run(rounds: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    with kafka.running_kafka(3, fast=False, heap_mb=512) as cluster:
        topic = f"failover-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(30)
        native, ours = [], []
        for index in range(rounds):
            native.append(await asyncio.to_thread(native_round, cluster, topic))
            print(f"round {index}: native {json.dumps(native[-1])}", flush=True)
            ours.append(await ours_round(cluster))
            print(f"round {index}: ours {json.dumps(ours[-1])}", flush=True)
    native_s = [r["commit_again_after_s"] for r in native]
    ours_s = [r["commit_again_after_s"] for r in ours]
    return {
        "benchmark": "failover-kafka",
        "cluster": f"Apache Kafka {kafka.KAFKA_VERSION}, 3 KRaft nodes (broker and controller "
        "each), replication factor 3, min.insync.replicas 2, broker.session.timeout.ms 6000",
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "native_group_coordinator": {
            "rounds": native,
            "median_commit_again_after_s": statistics.median(native_s),
        },
        "ours_state_partition_leader_killed": {
            "rounds": ours,
            "median_commit_again_after_s": statistics.median(ours_s),
        },
        "ours_vs_native_median": round(statistics.median(ours_s) / statistics.median(native_s), 2),
        "acknowledged_commits_lost": sum(r["commits_lost"] for r in native + ours),
    }


def main(argv: list[str]) -> int:
    rounds = 3
    for arg in argv:
        if arg.startswith("--rounds="):
            rounds = int(arg.split("=", 1)[1])
    results = asyncio.run(run(rounds))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0 if results["acknowledged_commits_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
