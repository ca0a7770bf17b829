"""The Java consumer (kafka-clients 4.4.0) through the gateway, for each way it can join.

Configurations: ``group.protocol=classic`` with each of Kafka's assignors, in a group whose
ConsumerGroup resource lets the clients assign (``spec.assignment: Client``: a classic group,
the leader's assignor) or has the coordinator assign (``Server``); and
``group.protocol=consumer`` (KIP-848) with ``group.remote.assignor`` uniform and range. Some
are static members (``group.instance.id``).

One scenario per configuration (``tests.support.client_scenario``: join and consume from the
committed offsets, a second member, commits, seek, pause/resume, a static restart, a freeze
and a kill past the session timeout, a close), each member a JVM of its own
(``tests/clients/java``), driven over stdin and reporting its ConsumerRebalanceListener calls
and records on stdout.

They run on Apache Kafka 4.4 (``tests.support.kafka_node``): kafka-clients 4.4 speaks
ApiVersions v5, which tansu cannot read. The coordinator's state topic lives there too.

The timings of each configuration (first assignment, rebalances, moves) are written to
``JAVA_MATRIX_REPORT`` when that variable names a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio

from kafka_group_operator.embedded.broker import free_port
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.runtime import coordinator_runtime
from tests.support import client_scenario, java, kafka_node, topics

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="package")]

CLASSIC = "org.apache.kafka.clients.consumer."
PARTITIONS = client_scenario.PARTITIONS
WAIT_S = client_scenario.WAIT_S
Config = client_scenario.Config

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
# A frozen member's commits may fail once it is fenced; nothing else may.
ALLOWED_ERRORS = (
    "CommitFailedException",
    "RebalanceInProgressException",
    "FencedMemberEpochException",
    "UnknownMemberIdException",
)


def log_path(argv: list[str]) -> str | None:
    """JAVA_TEST_LOGS names a directory for the JVMs' logs (stderr), to debug a failure."""
    logs = os.environ.get("JAVA_TEST_LOGS")
    if not logs:
        return None
    return os.path.join(logs, f"{argv[argv.index('-cp') + 2]}-{uuid.uuid4().hex[:6]}.log")


def start(
    gateway: protocol_gateway.Gateway, group: str, topic: str, config: Config, instance: str
) -> client_scenario.Member:
    argv = java.command(
        "JavaMember",
        f"127.0.0.1:{gateway.port}",
        group,
        topic,
        instance if config.static else "",
        config.protocol,
        config.assignor,
        str(client_scenario.SESSION_MS),
    )
    return client_scenario.Member(argv, log_path(argv))


@pytest.fixture(scope="module")
def kafka() -> Iterator[str]:
    # The jars fetched and the programs compiled once (cached between runs) first.
    java.classpath()
    with kafka_node.running_kafka() as bootstrap:
        yield bootstrap


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def java_stack(kafka: str) -> AsyncIterator[client_scenario.Stack]:
    async with client_scenario.stack(kafka, "java") as running:
        yield running


@pytest.fixture(scope="module")
def kafka_runtime(java_stack: client_scenario.Stack) -> coordinator_runtime.CoordinatorRuntime:
    return java_stack.runtime


@pytest.fixture(scope="module")
def kafka_gateway(java_stack: client_scenario.Stack) -> protocol_gateway.Gateway:
    return java_stack.gateway


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
async def test_java_consumer_scenario(config: Config, java_stack: client_scenario.Stack) -> None:
    await client_scenario.run_case(
        config,
        java_stack,
        "java",
        lambda group, topic, instance: start(java_stack.gateway, group, topic, config, instance),
        ALLOWED_ERRORS,
        os.environ.get("JAVA_MATRIX_REPORT"),
    )


# ---------------------------------------------------------------------------------------
# Kafka Streams 4.4: a classic group whose leader's assignor ("stream") carries the task
# assignment in the assignment's user data, relayed by the coordinator as it is.


class Instance(client_scenario.Member):
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
            client_scenario.produce(kafka, words_in, index % PARTITIONS, [line])
            for word in line.split():
                expected[word] = expected.get(word, 0) + 1

    def instance(name: str) -> Instance:
        argv = java.command(
            "WordCount",
            f"127.0.0.1:{kafka_gateway.port}",
            app,
            words_in,
            counts_out,
            str(tmp_path / name),
            "at_least_once",
        )
        return Instance(argv, log_path(argv))

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

        report["both_running_s"] = await client_scenario.until(
            running_split, "both instances running"
        )
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
        await client_scenario.until(
            lambda: first.tasks()[0] == all_active, "every task at the survivor"
        )
        report["tasks_moved_after_kill_s"] = time.monotonic() - killed_at
        await asyncio.to_thread(produce_lines, ["the dog barks", "the fox runs"])
        await counted()

        # A restart resumes from the committed offsets: nothing counted twice.
        restarted = instance("b")
        instances.append(restarted)
        restarted_at = time.monotonic()
        await client_scenario.until(
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
        await asyncio.to_thread(
            client_scenario.append_report, os.environ.get("JAVA_MATRIX_REPORT"), report
        )


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
        ports.setdefault(name, free_port())
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
        await asyncio.to_thread(
            client_scenario.append_report, os.environ.get("JAVA_MATRIX_REPORT"), report
        )
