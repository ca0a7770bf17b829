"""The Java consumer (kafka-clients 4.4.0) through the gateway, for each way it can join.

Configurations: ``group.protocol=classic`` with each of Kafka's assignors, in a group whose
ConsumerGroup resource lets the clients assign (``spec.assignment: Client``: a classic group,
the leader's assignor) or has the coordinator assign (``Server``); and
``group.protocol=consumer`` (KIP-848) with ``group.remote.assignor`` uniform and range. Some
are static members (``group.instance.id``).

One scenario per configuration, each member a JVM of its own (``tests/clients/java``),
driven over stdin and reporting its ConsumerRebalanceListener calls and records on stdout:

1. a member joins and consumes exactly from the committed offsets (some partitions have
   commits, one has none: ``auto.offset.reset=earliest``);
2. a second member joins: partitions move, each revoked by its holder before the newcomer is
   given it; commitSync and commitAsync (in turn, after each poll, and on revocation) leave
   every consumed record committed;
3. ``seek`` replays a partition; ``pause``/``resume`` hold and release one;
4. static members: the first is killed (SIGKILL; a KIP-848 one closes, leaving with epoch
   -2) and restarted with the same ``group.instance.id``: it gets its partitions back and
   nothing moves;
5. the second is frozen (SIGSTOP) past its session timeout: its partitions move; thawed, it
   is told it lost them (``onPartitionsLost``) and joins again;
6. it is killed (SIGKILL): its partitions move once its session timeout has passed;
7. a dynamic member's ``close()`` leaves the group: its partitions move at once.

They run on Apache Kafka 4.4 (``tests.support.kafka_node``): kafka-clients 4.4 speaks
ApiVersions v5, which tansu cannot read. The coordinator's state topic lives there too.

The timings of each configuration (first assignment, rebalances, moves) are written to
``JAVA_MATRIX_REPORT`` when that variable names a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import messages
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from tests.protocol.test_kip848 import topic_id
from tests.support import groups, java, kafka_node, topics

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="package")]

PARTITIONS = 3
PER_PARTITION = 5
SESSION_MS = 6_000
WAIT_S = 60
ALL = set(range(PARTITIONS))
CLASSIC = "org.apache.kafka.clients.consumer."


@dataclass(frozen=True)
class Config:
    name: str
    protocol: str
    assignor: str
    # spec.assignment of the group's resource: Client or Server.
    assignment: str
    static: bool


CONFIGS = [
    Config("classic-range-client", "classic", CLASSIC + "RangeAssignor", "Client", False),
    Config("classic-roundrobin-client", "classic", CLASSIC + "RoundRobinAssignor", "Client", False),
    Config("classic-sticky-client", "classic", CLASSIC + "StickyAssignor", "Client", True),
    Config(
        "classic-cooperative-sticky-client",
        "classic",
        CLASSIC + "CooperativeStickyAssignor",
        "Client",
        True,
    ),
    Config("classic-range-server", "classic", CLASSIC + "RangeAssignor", "Server", True),
    Config(
        "classic-cooperative-sticky-server",
        "classic",
        CLASSIC + "CooperativeStickyAssignor",
        "Server",
        False,
    ),
    Config("consumer-uniform", "consumer", "uniform", "Server", True),
    Config("consumer-range", "consumer", "range", "Server", False),
]


class Member:
    """One JVM consumer: its events as they come, commands on its stdin."""

    def __init__(self, argv: list[str]) -> None:
        # JAVA_TEST_LOGS names a directory for the JVMs' logs (stderr), to debug a failure.
        logs = os.environ.get("JAVA_TEST_LOGS")
        stderr: Any = subprocess.DEVNULL
        if logs:
            stderr = open(  # noqa: SIM115 - the process owns it
                os.path.join(logs, f"{argv[argv.index('-cp') + 2]}-{uuid.uuid4().hex[:6]}.log"),
                "wb",
            )
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
        )
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(event)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()

    def owned(self) -> set[int]:
        held: set[int] = set()
        for event in self.snapshot():
            if event["event"] == "assigned":
                held |= set(event["partitions"])
            elif event["event"] in ("revoked", "lost"):
                held -= set(event["partitions"])
        return held

    def records(self, since: int = 0) -> list[tuple[int, int, str]]:
        return [
            (p, o, v)
            for event in self.snapshot()[since:]
            if event["event"] == "records"
            for p, o, v in event["records"]
        ]

    def kinds(self, since: int = 0) -> list[str]:
        return [event["event"] for event in self.snapshot()[since:]]

    def mark(self) -> int:
        return len(self.snapshot())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


def start(
    gateway: protocol_gateway.Gateway, group: str, topic: str, config: Config, instance: str
) -> Member:
    return Member(
        java.command(
            "JavaMember",
            f"127.0.0.1:{gateway.port}",
            group,
            topic,
            instance if config.static else "",
            config.protocol,
            config.assignor,
            str(SESSION_MS),
        )
    )


async def until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> float:
    """Wait for ``condition`` off the event loop's way; the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def split(*members: Member) -> bool:
    """Every partition owned by exactly one of ``members``, each owning some."""
    held = [m.owned() for m in members]
    return all(held) and sum(map(len, held)) == PARTITIONS and set().union(*held) == ALL


def first_assigned_at(member: Member, partition: int, since: int = 0) -> float | None:
    for event in member.snapshot()[since:]:
        if event["event"] == "assigned" and partition in event["partitions"]:
            return float(event["t"])
    return None


def last_released_at(member: Member, partition: int) -> float | None:
    released = None
    for event in member.snapshot():
        if event["event"] in ("revoked", "lost") and partition in event["partitions"]:
            released = float(event["t"])
    return released


async def committed(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, topic: str
) -> dict[int, int]:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return {p: c.offset for (t, p), c in fetched.offsets.items() if t == topic}


def produce(bootstrap: str, topic: str, partition: int, values: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1})
    for value in values:
        producer.produce(topic, value.encode(), partition=partition)
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def kafka() -> Iterator[str]:
    # The jars fetched and the programs compiled once (cached between runs) first.
    java.classpath()
    with kafka_node.running_kafka() as bootstrap:
        yield bootstrap


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def kafka_runtime(kafka: str) -> AsyncIterator[coordinator_runtime.CoordinatorRuntime]:
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=kafka,
        topic=f"java-state-{uuid.uuid4().hex[:8]}",
        partitions=2,
        metadata_interval_ms=500,
        coordinator=coordinator_config.CoordinatorConfig(initial_rebalance_delay_ms=0),
    )
    async with groups.running(config) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def kafka_gateway(
    kafka: str, kafka_runtime: coordinator_runtime.CoordinatorRuntime
) -> AsyncIterator[protocol_gateway.Gateway]:
    listener = protocol_listener.Listener(
        kafka_runtime, None, protocol_listener.ListenerConfig(port=0)
    )
    await listener.start()
    gateway = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(kafka),
            coordinator=("127.0.0.1", listener.port),
            port=0,
        )
    )
    await gateway.start()
    yield gateway
    await gateway.stop()
    await listener.stop()


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
async def test_java_consumer_scenario(
    config: Config,
    kafka: str,
    kafka_gateway: protocol_gateway.Gateway,
    kafka_runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    runtime, open_gateway = kafka_runtime, kafka_gateway
    topic = topics.create_topic(kafka, PARTITIONS, messages_per_partition=PER_PARTITION)
    await topic_id(runtime, topic)
    group = f"java-{config.name}-{uuid.uuid4().hex[:6]}"
    await runtime.configure_group(
        messages.GroupSettings(
            group,
            assignor="range" if config.protocol == "consumer" else "cooperative-sticky",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=300,
            topics=(topic,),
            client_assignment=config.assignment == "Client",
        )
    )
    # Committed before anyone joins (an empty group takes an administrative commit).
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group,
            "",
            messages.LEAVE_EPOCH,
            {(topic, 0): messages.CommitOffset(2), (topic, 2): messages.CommitOffset(3)},
        )
    )
    report: dict[str, Any] = {"config": config.name}
    members: list[Member] = []
    started = time.monotonic()
    try:
        # 1. Join; consume exactly from the committed offsets.
        first = start(open_gateway, group, topic, config, "pod-a")
        members.append(first)
        report["first_assignment_s"] = await until(lambda: first.owned() == ALL, "a's assignment")
        expected = {(0, o) for o in range(2, 5)} | {(1, o) for o in range(5)} | {(2, 3), (2, 4)}
        await until(lambda: len(first.records()) >= len(expected), "a's records")
        await asyncio.sleep(0.5)  # nothing more comes
        consumed = first.records()
        assert sorted((p, o) for p, o, _ in consumed) == sorted(expected)

        # 2. A second member: partitions move, revoked before they are given.
        before = first.owned()
        second = start(open_gateway, group, topic, config, "pod-b")
        members.append(second)
        report["rebalance_s"] = await until(lambda: split(first, second), "a split")
        moved = before - first.owned()
        report["moved_on_join"] = len(moved)
        assert moved == second.owned()
        for partition in moved:
            released, given = (
                last_released_at(first, partition),
                first_assigned_at(second, partition),
            )
            assert released is not None
            assert given is not None
            assert released <= given, f"p{partition} given to b before a revoked it"
        for member in (first, second):
            kinds = member.kinds()
            assert "error" not in kinds, member.snapshot()
        await until(lambda: "committed" in first.kinds(), "a's commits")

        async def all_committed() -> bool:
            return await committed(runtime, group, topic) == dict.fromkeys(ALL, PER_PARTITION)

        deadline = time.monotonic() + WAIT_S
        while not await all_committed():
            assert time.monotonic() < deadline, await committed(runtime, group, topic)
            await asyncio.sleep(0.1)

        # New records reach their partition's owner once each.
        owner = {p: (first if p in first.owned() else second) for p in ALL}
        marks = {id(m): m.mark() for m in (first, second)}
        for partition in ALL:
            await asyncio.to_thread(produce, kafka, topic, partition, ["n5", "n6"])

        def new_records() -> list[tuple[int, int]]:
            return sorted((p, o) for m in (first, second) for p, o, _ in m.records(marks[id(m)]))

        await until(lambda: len(new_records()) >= 2 * PARTITIONS, "the new records")
        assert new_records() == sorted((p, o) for p in ALL for o in (5, 6))
        for member in (first, second):
            assert {p for p, _, _ in member.records(marks[id(member)])} <= member.owned()

        # 3. seek replays; pause holds and resume releases.
        replay = owner[0]
        mark = replay.mark()
        replay.send("seek 0 1")
        await until(lambda: len([r for r in replay.records(mark) if r[0] == 0]) >= 6, "the replay")
        assert [o for p, o, _ in replay.records(mark) if p == 0][:6] == [1, 2, 3, 4, 5, 6]
        holder = owner[1]
        mark = holder.mark()
        holder.send("pause 1")
        await until(lambda: "paused" in holder.kinds(mark), "the pause")
        await asyncio.to_thread(produce, kafka, topic, 1, ["held"])
        await asyncio.sleep(1.0)
        assert [r for r in holder.records(mark) if r[0] == 1] == []
        holder.send("resume 1")
        await until(lambda: (1, 7, "held") in holder.records(mark), "the resumed record")

        # 4. A static member restarts in place: nothing moves.
        if config.static:
            kept = first.owned()
            mark_b = second.mark()
            if config.protocol == "consumer":
                # A KIP-848 static member closing leaves with epoch -2: its partitions wait
                # for it (killed, its instance id would stay taken until its session ends).
                first.send("close")
                await asyncio.to_thread(first.process.wait, 30)
            else:
                # A classic static member never leaves: a kill is a restart like any other.
                first.stop()
            restarted_at = time.monotonic()
            first = start(open_gateway, group, topic, config, "pod-a")
            members.append(first)
            await until(lambda: first.owned() == kept, "a's partitions back")
            report["static_restart_s"] = time.monotonic() - restarted_at
            await asyncio.sleep(0.5)
            assert second.kinds(mark_b).count("revoked") == 0, second.snapshot()[mark_b:]
            assert second.kinds(mark_b).count("lost") == 0
            assert first.owned() == kept
            report["moved_on_static_restart"] = 0

        # 5. b frozen past its session: its partitions move; thawed, it lost them.
        mark_b = second.mark()
        lost = second.owned()
        os.kill(second.process.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            await until(
                lambda: first.owned() == ALL, "b's partitions at a", SESSION_MS / 1000 + WAIT_S
            )
            report["moved_after_freeze_s"] = time.monotonic() - frozen_at
        finally:
            os.kill(second.process.pid, signal.SIGCONT)
        assert time.monotonic() - frozen_at >= SESSION_MS / 1000 - 0.5
        await until(lambda: "lost" in second.kinds(mark_b), "b's lost partitions")
        lost_event = next(e for e in second.snapshot()[mark_b:] if e["event"] == "lost")
        assert set(lost_event["partitions"]) == lost
        await until(lambda: split(first, second), "b back in the group")

        # 6. kill -9: b's partitions move after its session timeout.
        second.stop()
        killed_at = time.monotonic()
        await until(lambda: first.owned() == ALL, "b's partitions after the kill")
        report["moved_after_kill_s"] = time.monotonic() - killed_at
        assert report["moved_after_kill_s"] >= SESSION_MS / 1000 - 0.5

        # 7. A dynamic member's close leaves the group: its partitions move at once.
        if not config.static:
            leaver = start(open_gateway, group, topic, config, "pod-c")
            members.append(leaver)
            await until(lambda: split(first, leaver), "c joined")
            leaver.send("close")
            closed_at = time.monotonic()
            await until(lambda: "closed" in leaver.kinds(), "c's close")
            await until(lambda: first.owned() == ALL, "c's partitions after its close")
            report["moved_after_close_s"] = time.monotonic() - closed_at
            assert report["moved_after_close_s"] < SESSION_MS / 1000
        report["total_s"] = time.monotonic() - started
        errors_seen = [e for m in members for e in m.snapshot() if e["event"] == "error"]
        # A frozen member's commits may fail once it is fenced; nothing else may.
        assert all(
            e["type"]
            in (
                "CommitFailedException",
                "RebalanceInProgressException",
                "FencedMemberEpochException",
                "UnknownMemberIdException",
            )
            for e in errors_seen
        ), errors_seen
    finally:
        for member in members:
            member.stop()
        path = os.environ.get("JAVA_MATRIX_REPORT")
        if path:
            await asyncio.to_thread(_append, path, json.dumps(report) + "\n")


def _append(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line)


# ---------------------------------------------------------------------------------------
# Kafka Streams 4.4: a classic group whose leader's assignor ("stream") carries the task
# assignment in the assignment's user data, relayed by the coordinator as it is.


class Instance(Member):
    def state(self) -> str | None:
        states = [e["state"] for e in self.snapshot() if e["event"] == "state"]
        return states[-1] if states else None

    def tasks(self) -> tuple[set[str], set[str]]:
        reports = [e for e in self.snapshot() if e["event"] == "tasks"]
        if not reports:
            return set(), set()
        return set(reports[-1]["active"]), set(reports[-1]["standby"])


def word_counts(bootstrap: str, topic: str) -> dict[str, int]:
    """The latest count of each word in the output topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        counts: dict[str, int] = {}
        idle = 0
        while idle < 3:
            message = consumer.poll(0.3)
            if message is None:
                idle += 1
                continue
            if message.error() is None and message.key() is not None:
                counts[message.key().decode()] = int(message.value().decode())
        return counts
    finally:
        consumer.close()


async def test_kafka_streams_word_count_at_least_once(
    kafka: str,
    kafka_gateway: protocol_gateway.Gateway,
    kafka_runtime: coordinator_runtime.CoordinatorRuntime,
    tmp_path: Any,
) -> None:
    words_in = topics.create_topic(kafka, PARTITIONS, messages_per_partition=0)
    counts_out = topics.create_topic(kafka, PARTITIONS, messages_per_partition=0)
    app = f"wordcount-{uuid.uuid4().hex[:6]}"
    expected: dict[str, int] = {}

    def produce_lines(lines: list[str]) -> None:
        for index, line in enumerate(lines):
            produce(kafka, words_in, index % PARTITIONS, [line])
            for word in line.split():
                expected[word] = expected.get(word, 0) + 1

    def instance(name: str) -> Instance:
        return Instance(
            java.command(
                "WordCount",
                f"127.0.0.1:{kafka_gateway.port}",
                app,
                words_in,
                counts_out,
                str(tmp_path / name),
                "at_least_once",
            )
        )

    async def counted() -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            seen = await asyncio.to_thread(word_counts, kafka, counts_out)
            if seen == expected:
                return
            assert time.monotonic() < deadline, (seen, expected)
            await asyncio.sleep(0.5)

    report: dict[str, Any] = {"config": "kafka-streams-at-least-once"}
    instances: list[Instance] = []
    try:
        first, second = instance("a"), instance("b")
        instances += [first, second]
        started = time.monotonic()
        await asyncio.to_thread(produce_lines, ["the quick brown fox", "jumps over the lazy dog"])

        def running_split() -> bool:
            (a_active, _), (b_active, _) = first.tasks(), second.tasks()
            return (
                first.state() == "RUNNING"
                and second.state() == "RUNNING"
                and bool(a_active)
                and bool(b_active)
                and not a_active & b_active
            )

        report["both_running_s"] = await until(running_split, "both instances running")
        await counted()
        report["first_counts_s"] = time.monotonic() - started
        # Standby replicas: each instance keeps a copy of some task the other runs.
        (a_active, a_standby), (b_active, b_standby) = first.tasks(), second.tasks()
        assert a_standby or b_standby
        assert not a_standby & a_active
        assert not b_standby & b_active
        # The group is a classic group of the "stream" protocol, relayed as the leader sent.
        described = await kafka_runtime.describe_group(app)
        assert (described.group_type, described.protocol_type) == ("classic", "consumer")
        assert described.assignor == "stream"

        # kill -9: the survivor takes every task once the session timeout passed.
        all_active = a_active | b_active
        await asyncio.sleep(1.0)  # a commit interval or more: nothing left uncommitted
        second.stop()
        killed_at = time.monotonic()
        await until(lambda: first.tasks()[0] == all_active, "every task at the survivor")
        report["tasks_moved_after_kill_s"] = time.monotonic() - killed_at
        await asyncio.to_thread(produce_lines, ["the dog barks", "the fox runs"])
        await counted()

        # A restart resumes from the committed offsets: nothing counted twice.
        restarted = instance("b")
        instances.append(restarted)
        restarted_at = time.monotonic()
        await until(
            lambda: restarted.state() == "RUNNING" and bool(restarted.tasks()[0]),
            "the restarted instance running",
        )
        report["restart_running_s"] = time.monotonic() - restarted_at
        await asyncio.to_thread(produce_lines, ["quick quick dog"])
        await counted()
        report["total_s"] = time.monotonic() - started
    finally:
        for each in instances:
            each.stop()
        path = os.environ.get("JAVA_MATRIX_REPORT")
        if path:
            await asyncio.to_thread(_append, path, json.dumps(report) + "\n")


# ---------------------------------------------------------------------------------------
# Kafka Connect 4.4: a distributed worker pair, whose worker group has protocol type
# "connect" (a classic group: the leader worker assigns connectors and tasks), running a
# file source and a file sink (tests/clients/java/LinesConnectors.java).


def _http(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_kafka_connect_worker_pair(
    kafka: str,
    kafka_gateway: protocol_gateway.Gateway,
    kafka_runtime: coordinator_runtime.CoordinatorRuntime,
    tmp_path: Any,
) -> None:
    cluster = f"connect-{uuid.uuid4().hex[:6]}"
    topic = topics.create_topic(kafka, 1, messages_per_partition=0)
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("")
    ports: dict[str, int] = {}

    def worker(name: str) -> subprocess.Popen[bytes]:
        ports.setdefault(name, _free_port())
        settings = {
            "bootstrap.servers": f"127.0.0.1:{kafka_gateway.port}",
            "group.id": cluster,
            "config.storage.topic": f"{cluster}-configs",
            "offset.storage.topic": f"{cluster}-offsets",
            "status.storage.topic": f"{cluster}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "listeners": f"http://127.0.0.1:{ports[name]}",
            "rest.advertised.host.name": "127.0.0.1",
            "offset.flush.interval.ms": "500",
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "500",
            # A lost worker's connectors and tasks move as soon as it is gone.
            "scheduled.rebalance.max.delay.ms": "0",
            "consumer.session.timeout.ms": "6000",
            "consumer.heartbeat.interval.ms": "500",
        }
        path = tmp_path / f"{name}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        logs = os.environ.get("JAVA_TEST_LOGS")
        out: Any = open(os.path.join(logs, f"connect-{name}.log"), "ab") if logs else None  # noqa: SIM115
        return subprocess.Popen(
            java.command("org.apache.kafka.connect.cli.ConnectDistributed", str(path), heap_mb=384),
            stdout=out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if out else subprocess.DEVNULL,
        )

    def url(name: str, path: str) -> str:
        return f"http://127.0.0.1:{ports[name]}{path}"

    async def rest(name: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return await asyncio.to_thread(_http, method, url(name, path), body)

    async def answers(name: str) -> bool:
        try:
            await rest(name, "GET", "/connectors")
        except Exception:
            return False
        return True

    async def wait_async(condition: Callable[[], Any], what: str) -> float:
        started = time.monotonic()
        while not await condition():
            assert time.monotonic() - started < WAIT_S * 2, f"timed out waiting for {what}"
            await asyncio.sleep(0.3)
        return time.monotonic() - started

    def sunk() -> list[str]:
        return sink.read_text().splitlines() if sink.exists() else []

    written: list[str] = []

    def write(lines: list[str]) -> None:
        written.extend(lines)
        with source.open("a") as out:
            out.write("".join(line + "\n" for line in lines))

    report: dict[str, Any] = {"config": "kafka-connect"}
    workers = {"w1": worker("w1"), "w2": worker("w2")}
    try:
        started = time.monotonic()
        for name in workers:
            await wait_async(lambda name=name: answers(name), f"worker {name}'s REST API")
        report["workers_up_s"] = time.monotonic() - started
        await rest(
            "w1",
            "POST",
            "/connectors",
            {
                "name": "lines-in",
                "config": {
                    "connector.class": "LinesConnectors$Source",
                    "tasks.max": "1",
                    "file": str(source),
                    "topic": topic,
                },
            },
        )
        await rest(
            "w1",
            "POST",
            "/connectors",
            {
                "name": "lines-out",
                "config": {
                    "connector.class": "LinesConnectors$Sink",
                    "tasks.max": "1",
                    "file": str(sink),
                    "topics": topic,
                },
            },
        )
        write([f"line-{i}" for i in range(5)])

        async def all_sunk() -> bool:
            return set(sunk()) >= set(written)

        report["first_lines_s"] = await wait_async(all_sunk, "the first lines in the sink")
        # The worker group is a classic group of protocol type "connect".
        described = await kafka_runtime.describe_group(cluster)
        assert (described.group_type, described.protocol_type) == ("classic", "connect")
        assert len(described.members) == 2
        # The sink's consumer group works as any consumer group would.
        sink_group = await kafka_runtime.describe_group("connect-lines-out")
        assert sink_group.state == "Stable"

        async def placement() -> dict[str, str]:
            where: dict[str, str] = {}
            for connector in ("lines-in", "lines-out"):
                status = await rest(
                    "w1" if workers["w1"].poll() is None else "w2",
                    "GET",
                    f"/connectors/{connector}/status",
                )
                for task in status.get("tasks", []):
                    if task.get("state") == "RUNNING":
                        where[connector] = task["worker_id"]
            return where

        before = await placement()
        # kill -9 the worker running the sink's task: its tasks move to the other.
        victim = next(n for n in workers if f":{ports[n]}" in before["lines-out"])
        survivor = next(n for n in workers if n != victim)
        workers[victim].kill()
        workers[victim].wait(30)
        killed_at = time.monotonic()

        async def moved() -> bool:
            try:
                where = await placement()
            except Exception:
                return False
            return len(where) == 2 and all(f":{ports[survivor]}" in w for w in where.values())

        report["tasks_moved_after_kill_s"] = await wait_async(moved, "the tasks at the survivor")
        assert time.monotonic() - killed_at >= 6 - 0.5
        write([f"after-kill-{i}" for i in range(3)])
        await wait_async(all_sunk, "lines written after the kill")
        # The killed worker comes back and the group rebalances; nothing is lost.
        workers[victim] = worker(victim)
        await wait_async(lambda: answers(victim), "the restarted worker")

        async def two_members() -> bool:
            return len((await kafka_runtime.describe_group(cluster)).members) == 2

        await wait_async(two_members, "the restarted worker in the group")
        write([f"after-restart-{i}" for i in range(3)])
        await wait_async(all_sunk, "lines written after the restart")
        report["total_s"] = time.monotonic() - started
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.kill()
            process.wait(30)
        path = os.environ.get("JAVA_MATRIX_REPORT")
        if path:
            await asyncio.to_thread(_append, path, json.dumps(report) + "\n")
