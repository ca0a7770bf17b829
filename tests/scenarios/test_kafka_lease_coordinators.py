"""Real processes: two ``kgo coordinator --lease-namespace`` processes split a state topic by
Leases (the Kubernetes test double) and serve it on the Kafka protocol, each told every
replica's Kafka listener (``--lease-kafka-replicas``).

Either listener's FindCoordinator names the listener of the group's Lease holder, as the
Lease says; when that process stops (SIGTERM: it releases its Leases), the other takes the
partition and names itself. A wrong ``--lease-kafka-replicas`` is one line.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.static.primitive import i8

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.kube import client, leases
from kafka_group_operator.protocol import peers
from kafka_group_records import partitioning
from tests.protocol.wire import Connection
from tests.scenarios.test_failover import LeaseServer
from tests.support import processes as processes_support

pytestmark = [pytest.mark.slow, pytest.mark.broker]

STATE_PARTITIONS = 2
NAMESPACE = "kgo-kafka-lease"
PREFIX = "kgo-partition"


def _group_on(partition: int) -> str:
    index = 0
    while partitioning.partition_for(f"g-{index}", STATE_PARTITIONS) != partition:
        index += 1
    return f"g-{index}"


def _holders(server: LeaseServer) -> dict[int, str | None]:
    async def read() -> dict[int, str | None]:
        api = client.KubeClient(client.Credentials(server=server.url))
        try:
            found: dict[int, str | None] = {}
            for p in range(STATE_PARTITIONS):
                lease = await leases.read(api, NAMESPACE, leases.lease_name(PREFIX, p))
                found[p] = None if lease is None else lease.holder
            return found
        finally:
            await api.close()

    return asyncio.run(read())


def _find(port: int, groups: list[str]) -> list[tuple[ErrorCode, tuple[int, str, int]]] | None:
    """FindCoordinator's (error, node) per group at the listener on ``port`` (None: down)."""

    async def call() -> list[tuple[ErrorCode, tuple[int, str, int]]] | None:
        try:
            connection = await Connection.open(port)
        except OSError:
            return None
        try:
            found = await connection.call(
                FindCoordinatorRequest(key_type=i8(0), coordinator_keys=tuple(groups))
            )
        finally:
            await connection.close()
        return [
            (ErrorCode(c.error_code), (int(c.node_id), c.host, int(c.port)))
            for c in found.coordinators
        ]

    return asyncio.run(call())


def _node(port: int) -> tuple[int, str, int]:
    return (peers.node_id_for(("127.0.0.1", port)), "127.0.0.1", port)


def _command(
    broker: embedded.EmbeddedBroker,
    api_url: str,
    topic: str,
    urls: list[str],
    kafka: list[int],
    index: int,
    replicas: str | None = None,
) -> list[str]:
    return [
        sys.executable, "-m", "kafka_group_operator", "coordinator",
        "--bootstrap", broker.bootstrap, "--port", urls[index].rsplit(":", 1)[1],
        "--kafka-port", str(kafka[index]),
        "--topic", topic, "--state-partitions", str(STATE_PARTITIONS),
        "--advertised-url", urls[index], "--lease-namespace", NAMESPACE,
        "--lease-replicas", ",".join(urls), "--lease-prefix", PREFIX,
        "--lease-duration", "6", "--kube-server", api_url,
        "--lease-kafka-replicas",
        replicas if replicas is not None else ",".join(f"127.0.0.1:{k}" for k in kafka),
    ]  # fmt: skip


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    processes_support.stop_all(started)


def test_find_coordinator_names_the_lease_holder_across_processes(
    broker: embedded.EmbeddedBroker,
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    urls = [f"http://127.0.0.1:{embedded.free_port()}" for _ in range(2)]
    kafka = [embedded.free_port() for _ in range(2)]
    topic = f"kafka-lease-{uuid.uuid4().hex[:8]}"
    groups = [_group_on(0), _group_on(1)]
    with LeaseServer() as server:
        for index in range(2):
            log = (tmp_path / f"coordinator-{index}.log").open("ab")
            processes.append(
                subprocess.Popen(
                    _command(broker, server.url, topic, urls, kafka, index),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        # Until each partition has its own holder and both listeners name them alike.
        deadline = time.monotonic() + 90
        while True:
            assert all(p.poll() is None for p in processes), "a coordinator exited"
            holders = _holders(server)
            answers = [_find(port, groups) for port in kafka]
            if None not in holders.values() and len(set(holders.values())) == 2:
                expected = [
                    (ErrorCode.none, _node(kafka[urls.index(str(holders[p]))])) for p in (0, 1)
                ]
                if answers == [expected, expected]:
                    break
            assert time.monotonic() < deadline, f"holders {holders}, answers {answers}"
            time.sleep(0.3)

        # The holder of partition 1 stops and releases its Lease: the other names itself.
        leaving = urls.index(str(holders[1]))
        staying = 1 - leaving
        processes[leaving].send_signal(signal.SIGTERM)
        assert processes[leaving].wait(30) == 0
        deadline = time.monotonic() + 60
        while True:
            answer = _find(kafka[staying], groups)
            if answer == [(ErrorCode.none, _node(kafka[staying]))] * 2:
                break
            assert answer is not None
            assert time.monotonic() < deadline, f"no handover: {answer}"
            time.sleep(0.3)
        assert _holders(server)[1] == urls[staying]


def test_a_bad_lease_kafka_replicas_option_is_one_line(broker: embedded.EmbeddedBroker) -> None:
    urls = ["http://127.0.0.1:18080", "http://127.0.0.1:18081"]
    for replicas, message in (
        ("127.0.0.1:19092", "names 1 listener(s) for 2 --lease-replicas"),
        ("127.0.0.1:19092,nowhere", "is not host:port"),
        ("127.0.0.1:19092,127.0.0.1:19092", "names one listener twice"),
    ):
        done = subprocess.run(
            _command(broker, "http://127.0.0.1:1", "t", urls, [19092, 19093], 0, replicas),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert "--lease-kafka-replicas" in lines[0]
        assert message in lines[0]
    without_leases = [
        sys.executable, "-m", "kafka_group_operator", "coordinator",
        "--bootstrap", broker.bootstrap, "--kafka-port", "0",
        "--lease-kafka-replicas", "127.0.0.1:19092",
    ]  # fmt: skip
    done = subprocess.run(without_leases, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--lease-kafka-replicas goes with --lease-namespace" in done.stderr
