"""Rebalance benchmarks: our coordinator against a native Kafka group on the same broker.

* **join latency**: a fourth member joins a settled group of three on a 12-partition topic;
  from the newcomer's first heartbeat (ours) or ``subscribe`` (native) until every partition
  is owned again and the newcomer has consumed from each partition it got. The peer is a
  confluent-kafka group with ``partition.assignment.strategy=cooperative-sticky``.
* **rolling restart** of 6 members, one after the other (SIGTERM, start again): partitions
  that changed owner, and partition-seconds during which a partition was not consumed
  (gaps longer than ``PAUSE_THRESHOLD_S`` between two consumed messages). Peers: the native
  group without and with ``group.instance.id``; on tansu the static native group never
  settles, which is reported as its result, bounded by ``NATIVE_SETTLE_TIMEOUT_S``.
* **heartbeat capacity** of one coordinator process: steady-state heartbeats per second
  from many simulated members over keep-alive connections.

Writes ``bench/results/rebalance.json``. ``--quick`` runs fewer rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from kafka_group_operator.commands import demo
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import GroupMember, MemberConfig

RESULTS = Path(__file__).parent / "results" / "rebalance.json"
PARTITIONS = 12
PRODUCE_RATE = 240.0  # 20 messages/s per partition: a gap of 50 ms is normal
PAUSE_THRESHOLD_S = 0.5
NATIVE_SETTLE_TIMEOUT_S = 45.0
TopicPartition = tuple[str, int]


# ----------------------------------------------------------------------- native peer group


@dataclass
class NativeMember:
    """One confluent-kafka consumer in a broker-side group, polled on its own thread."""

    bootstrap: str
    group: str
    topic: str
    instance_id: str | None = None
    consumed: list[tuple[int, float]] = field(default_factory=list)  # (partition, time)
    assignment: frozenset[int] = frozenset()
    assigned_log: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    subscribed_at: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
        }
        if self.instance_id is not None:
            settings["group.instance.id"] = self.instance_id
        consumer = Consumer(settings)

        def assigned(consumer: Any, partitions: list[Any]) -> None:
            added = frozenset(tp.partition for tp in partitions)
            if added:
                self.assigned_log.append((time.time(), added))
            self.assignment = self.assignment | added

        def revoked(consumer: Any, partitions: list[Any]) -> None:
            self.assignment = self.assignment - {tp.partition for tp in partitions}

        self.subscribed_at = time.time()
        consumer.subscribe([self.topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)
        while not self._stop.is_set():
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                self.consumed.append((message.partition() or 0, time.time()))
        consumer.close()
        self.assignment = frozenset()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


@dataclass
class NativeGroup:
    bootstrap: str
    topic: str
    static: bool = False
    group: str = field(default_factory=lambda: f"native-{uuid.uuid4().hex[:8]}")
    members: dict[str, NativeMember] = field(default_factory=dict)
    history: list[NativeMember] = field(default_factory=list)

    def start_member(self, name: str) -> NativeMember:
        member = NativeMember(
            self.bootstrap, self.group, self.topic, instance_id=name if self.static else None
        )
        self.members[name] = member
        self.history.append(member)
        member.start()
        return member

    def stop_member(self, name: str) -> None:
        self.members.pop(name).stop()

    def ownership(self) -> dict[str, frozenset[int]]:
        return {name: member.assignment for name, member in self.members.items()}

    def settled(self) -> bool:
        owned = [p for member in self.members.values() for p in member.assignment]
        return sorted(owned) == list(range(PARTITIONS)) and all(
            member.assignment for member in self.members.values()
        )

    def wait_settled(self, timeout: float) -> float | None:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.settled():
                return time.monotonic() - start
            time.sleep(0.02)
        return None

    def stop(self) -> None:
        for name in list(self.members):
            self.stop_member(name)


# ----------------------------------------------------------------------------- measures


def consumed_everywhere(
    consumed: Iterator[tuple[int, float]], partitions: frozenset[int], since: float
) -> float | None:
    """When the last of ``partitions`` first had a message consumed after ``since``."""
    first: dict[int, float] = {}
    for partition, at in consumed:
        if partition in partitions and at >= since and partition not in first:
            first[partition] = at
    return max(first.values()) if set(first) == set(partitions) else None


def paused_partition_seconds(consumed: list[tuple[int, float]], start: float, end: float) -> float:
    """Sum over partitions of consumption gaps longer than ``PAUSE_THRESHOLD_S``."""
    by_partition: dict[int, list[float]] = {p: [start] for p in range(PARTITIONS)}
    for partition, at in consumed:
        if start <= at <= end:
            by_partition[partition].append(at)
    paused = 0.0
    for times in by_partition.values():
        times = sorted([*times, end])
        paused += sum(b - a for a, b in itertools.pairwise(times) if b - a > PAUSE_THRESHOLD_S)
    return paused


def ours_owned(group: demo.LocalGroup) -> dict[str, frozenset[int]]:
    return {name: frozenset(p for _, p in owned) for name, owned in group.ownership().items()}


# ---------------------------------------------------------------------------- scenarios


def join_latency_ours(group: demo.LocalGroup, rounds: int) -> list[float]:
    base = {f"m{i}" for i in range(3)}
    for name in sorted(base):
        group.start_member(name)
    group.wait_settled(base, timeout=60)
    latencies = []
    for round_ in range(rounds):
        newcomer = f"join-{round_}"
        group.start_member(newcomer)
        group.wait_settled(base | {newcomer}, timeout=60)
        journal = demo.Journal.read(group.journal_path(newcomer))
        started = next(e["t"] for e in journal.events if e["e"] == "start")
        owned = ours_owned(group)[newcomer]
        deadline = time.monotonic() + 30
        done = None
        while done is None and time.monotonic() < deadline:
            time.sleep(0.1)
            done = consumed_everywhere(
                (
                    (tp[1], at)
                    for tp, _, at in demo.Journal.read(group.journal_path(newcomer)).processed()
                ),
                owned,
                started,
            )
        if done is None:
            raise RuntimeError("our newcomer never consumed all its partitions")
        latencies.append(done - started)
        group.stop_member(newcomer, permanent=True)
        group.wait_settled(base, timeout=30)
    for name in sorted(base):
        group.stop_member(name, permanent=True)
    return latencies


def join_latency_native(bootstrap: str, topic: str, rounds: int) -> list[float | None]:
    native = NativeGroup(bootstrap, topic)
    for i in range(3):
        native.start_member(f"m{i}")
    if native.wait_settled(NATIVE_SETTLE_TIMEOUT_S) is None:
        native.stop()
        return [None] * rounds
    latencies: list[float | None] = []
    for round_ in range(rounds):
        newcomer = native.start_member(f"join-{round_}")
        deadline = time.monotonic() + NATIVE_SETTLE_TIMEOUT_S
        done = None
        while done is None and time.monotonic() < deadline:
            time.sleep(0.05)
            if native.settled() and newcomer.assignment:
                done = consumed_everywhere(
                    iter(list(newcomer.consumed)), newcomer.assignment, newcomer.subscribed_at
                )
        latencies.append(None if done is None else done - newcomer.subscribed_at)
        native.stop_member(f"join-{round_}")
        native.wait_settled(NATIVE_SETTLE_TIMEOUT_S)
    native.stop()
    return latencies


@dataclass
class OurMember:
    """One ``GroupMember`` on its own thread: the same harness as ``NativeMember``."""

    group: demo.LocalGroup
    instance_id: str
    consumed: list[tuple[int, float]] = field(default_factory=list)
    assigned_log: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    member: GroupMember | None = None
    _thread: threading.Thread | None = None

    @property
    def assignment(self) -> frozenset[int]:
        return frozenset(p for _, p in self.member.assignment) if self.member else frozenset()

    def start(self) -> None:
        assert self.group.broker is not None
        self.member = GroupMember(
            MemberConfig(
                group_id=self.group.group,
                coordinator_url=self.group.coordinator_url,
                token=self.group.token,
                topics=(self.group.topic,),
                bootstrap_servers=self.group.broker.bootstrap,
                instance_id=self.instance_id,
                commit_interval_ms=1000,
                lost_after_ms=self.group.session_timeout_ms // 2,
            ),
            on_assigned=lambda added: self.assigned_log.append(
                (time.time(), frozenset(p for _, p in added))
            ),
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.member is not None
        for message in self.member:
            self.consumed.append((message.partition() or 0, time.time()))

    def stop(self, permanent: bool = False) -> None:
        """SIGTERM semantics: finish, commit, leave temporarily (or for good)."""
        assert self.member is not None
        assert self._thread is not None
        self.member.stop(permanent=permanent)
        self._thread.join(30)


def rolling_restart_ours(group: demo.LocalGroup) -> dict[str, Any]:
    """Each member in turn stops (SIGTERM semantics) and a successor with a new member id
    and the same instance id starts, as a StatefulSet rollout does."""
    names = [f"r{i}" for i in range(6)]
    members = {name: OurMember(group, name) for name in names}
    history = list(members.values())
    for member in members.values():
        member.start()
    group.wait_settled(set(names), timeout=60)
    time.sleep(1)
    start, moved_total = time.time(), 0
    for name in names:
        old = members[name].assignment
        restart_at = time.time()
        members[name].stop()
        successor = members[name] = OurMember(group, name)
        history.append(successor)
        successor.start()
        deadline = time.monotonic() + 60
        while not successor.assignment and time.monotonic() < deadline:
            time.sleep(0.01)
        group.wait_settled(set(names), timeout=60)
        settled_at = time.time()
        # Partitions handed to anyone else meanwhile, plus any the restarted one did not own.
        moved_total += len(
            {
                p
                for member in history
                if member is not successor
                for at, partitions in member.assigned_log
                if restart_at <= at <= settled_at
                for p in partitions
            }
        )
        moved_total += len(successor.assignment - old)
    time.sleep(1.5)
    end = time.time()
    paused = paused_partition_seconds(
        [entry for member in history for entry in member.consumed], start, end
    )
    for member in members.values():
        member.stop(permanent=True)
    return {
        "moved": moved_total,
        "paused_partition_seconds": round(paused, 2),
        "settled": True,
        "seconds": round(end - start, 1),
    }


def rolling_restart_native(bootstrap: str, topic: str, static: bool) -> dict[str, Any]:
    native = NativeGroup(bootstrap, topic, static=static)
    names = [f"r{i}" for i in range(6)]
    for name in names:
        native.start_member(name)
    if native.wait_settled(NATIVE_SETTLE_TIMEOUT_S) is None:
        native.stop()
        return {
            "settled": False,
            "moved": None,
            "paused_partition_seconds": None,
            "note": f"the initial group did not settle within {NATIVE_SETTLE_TIMEOUT_S:.0f}s",
        }
    time.sleep(1)
    start, moved_total, settled = time.time(), 0, True
    for name in names:
        old = native.members[name].assignment
        restart_at = time.time()
        native.stop_member(name)
        successor = native.start_member(name)
        if native.wait_settled(NATIVE_SETTLE_TIMEOUT_S) is None:
            settled = False
            break
        settled_at = time.time()
        # Partitions handed to anyone else meanwhile, plus any the restarted one did not own.
        moved_total += len(
            {
                p
                for member in native.history
                if member is not successor
                for at, partitions in member.assigned_log
                if restart_at <= at <= settled_at
                for p in partitions
            }
        )
        moved_total += len(successor.assignment - old)
    time.sleep(1.5)
    end = time.time()
    consumed = [entry for member in native.history for entry in member.consumed]
    paused = paused_partition_seconds(consumed, start, end)
    native.stop()
    result: dict[str, Any] = {
        "moved": moved_total,
        "paused_partition_seconds": round(paused, 2),
        "settled": settled,
        "seconds": round(end - start, 1),
    }
    if not settled:
        result["note"] = f"a restart did not settle within {NATIVE_SETTLE_TIMEOUT_S:.0f}s"
    return result


# -------------------------------------------------------------------- heartbeat capacity


def _heartbeat_load(
    url: str, group: str, token: str, topic: str, members: int, seconds: float, queue: Any
) -> None:
    """Runs in its own process: join ``members`` members, then heartbeat flat out.

    Each member has its own keep-alive connection and speaks minimal HTTP/1.1 over asyncio
    streams: the load generator shares the machine's cores with the coordinator, so the less
    CPU it burns per request, the closer the figure is to the coordinator's own capacity.
    """
    host, port = url.removeprefix("http://").split(":")
    path = f"/v1/groups/{group}/heartbeat"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode()
    warm_until = time.monotonic() + 3
    stop_at = warm_until + seconds

    async def member(index: int) -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        member_id = uuid.uuid4().hex
        join: dict[str, Any] = {
            "memberId": member_id,
            "memberEpoch": 0,
            "instanceId": f"load-{index}",
            "subscribedTopicNames": [topic],
            "rebalanceTimeoutMs": 60000,
            "ownedPartitions": {},
        }
        body, count = join, 0
        while time.monotonic() < stop_at:
            payload = json.dumps(body).encode()
            writer.write(head + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            headers = await reader.readuntil(b"\r\n\r\n")
            length = int(headers.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            answer = json.loads(await reader.readexactly(length))
            if not headers.startswith(b"HTTP/1.1 200"):
                body = join if answer.get("error") in REJOIN_ERRORS else body
                continue
            if time.monotonic() >= warm_until:
                count += 1
            body = {"memberId": member_id, "memberEpoch": answer["memberEpoch"]}
            if "assignment" in answer:
                body["ownedPartitions"] = answer["assignment"]
        writer.close()
        return count

    async def main() -> None:
        counts = await asyncio.gather(*(member(i) for i in range(members)))
        queue.put(sum(counts) / seconds)

    asyncio.run(main())


REJOIN_ERRORS = ("FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID")


def heartbeat_capacity(group: demo.LocalGroup, seconds: float) -> float:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(
        target=_heartbeat_load,
        args=(group.coordinator_url, group.group, group.token, group.topic, 64, seconds, queue),
    )
    process.start()
    rate = float(queue.get(timeout=seconds + 120))
    process.join(30)
    return rate


# --------------------------------------------------------------------------------- main


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    rounds = 2 if quick else 3
    results: dict[str, Any] = {"partitions": PARTITIONS, "produce_rate": PRODUCE_RATE}
    with embedded.running_broker() as broker:
        group = demo.LocalGroup(
            group="bench.orders",
            topic="bench-orders",
            partitions=PARTITIONS,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=300,
        )
        group.start(broker)
        producer = demo.Producer(broker.bootstrap, group.topic, PARTITIONS, rate=PRODUCE_RATE)
        producer.start()
        try:
            print("join latency: ours", flush=True)
            ours = join_latency_ours(group, rounds)
            print("join latency: native cooperative-sticky", flush=True)
            native = join_latency_native(broker.bootstrap, group.topic, rounds)
            ours_median, native_median = _median(list(ours)), _median(native)
            results["join_latency_s"] = {
                "ours": [round(v, 3) for v in ours],
                "native_cooperative_sticky": [None if v is None else round(v, 3) for v in native],
                "ours_median": ours_median,
                "native_median": native_median,
                "speedup": None
                if not (ours_median and native_median)
                else round(native_median / ours_median, 1),
                "target_speedup": 5,
            }
            print(json.dumps(results["join_latency_s"]), flush=True)
            print("rolling restart: ours", flush=True)
            restart: dict[str, Any] = {"ours": rolling_restart_ours(group)}
            print("rolling restart: native dynamic", flush=True)
            restart["native_dynamic"] = rolling_restart_native(broker.bootstrap, group.topic, False)
            print("rolling restart: native static", flush=True)
            restart["native_static"] = rolling_restart_native(broker.bootstrap, group.topic, True)
            restart["target_moved"] = 0
            results["rolling_restart_6"] = restart
            print(json.dumps(restart), flush=True)
        finally:
            producer.stop()
        print("heartbeat capacity", flush=True)
        rate = heartbeat_capacity(group, 5.0 if quick else 10.0)
        results["heartbeat_capacity_per_s"] = {"ours": round(rate), "target": 2000}
        print(json.dumps(results["heartbeat_capacity_per_s"]), flush=True)
        group.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
