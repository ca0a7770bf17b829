"""Real processes on partition Leases: three ``kgo coordinator --lease-namespace`` processes
share one state topic on the embedded broker, with the Kubernetes test double holding the
Leases (6 s, so that a loaded machine does not make them churn). The coordinator of a group
is killed (SIGKILL) while its two member processes consume and commit: the survivors take
its partitions over, the members follow the NOT_COORDINATOR hints there, keep every
partition, and no commit they saw acknowledged is lost. Nothing is restarted.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kmock._internal import apps

from kafka_group_operator.commands import demo
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.kube import client, leases
from kafka_group_records import partitioning
from tests.support import kube
from tests.support import processes as processes_support

pytestmark = [pytest.mark.slow, pytest.mark.broker]

STATE_PARTITIONS = 6
REPLICAS = 3
MEMBERS = {"member-0", "member-1"}
NAMESPACE = "kgo-failover"
PREFIX = "kgo-partition"


class LeaseServer:
    """The Kubernetes test double on a port of its own, in a thread with its own loop (the
    coordinator processes call it while this test blocks)."""

    def __init__(self) -> None:
        self.port = embedded.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            async with kube.ApiServer() as server, apps.Server(server, port=self.port):
                self._ready.set()
                while not self._stop.is_set():
                    # kmock matches each request against all it kept: keep it short.
                    server._requests.clear()
                    await asyncio.sleep(0.05)

        self._loop.run_until_complete(serve())

    def __enter__(self) -> LeaseServer:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def holders(self) -> dict[int, str | None]:
        async def read() -> dict[int, str | None]:
            api = client.KubeClient(client.Credentials(server=self.url))
            try:
                found = {}
                for p in range(STATE_PARTITIONS):
                    lease = await leases.read(api, NAMESPACE, leases.lease_name(PREFIX, p))
                    found[p] = None if lease is None else lease.holder
                return found
            finally:
                await api.close()

        return asyncio.run(read())


def _start(
    broker: embedded.EmbeddedBroker,
    directory: Path,
    state_topic: str,
    urls: list[str],
    index: int,
    api_url: str,
) -> subprocess.Popen[bytes]:
    log = (directory / f"coordinator-{index}.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable, "-m", "kafka_group_operator", "coordinator",
            "--bootstrap", broker.bootstrap, "--port", urls[index].rsplit(":", 1)[1],
            "--topic", state_topic, "--state-partitions", str(STATE_PARTITIONS),
            "--advertised-url", urls[index], "--lease-namespace", NAMESPACE,
            "--lease-replicas", ",".join(urls), "--lease-prefix", PREFIX,
            "--lease-duration", "6", "--kube-server", api_url,
            "--groups", str(directory / "groups.json"),
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _wait_spread(server: LeaseServer, urls: list[str], timeout: float = 90) -> dict[int, str]:
    """Until every partition has a holder and every replica its share."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holders = server.holders()
        counts = [list(holders.values()).count(url) for url in urls]
        if None not in holders.values() and counts == [STATE_PARTITIONS // REPLICAS] * REPLICAS:
            return {p: h for p, h in holders.items() if h is not None}
        time.sleep(0.3)
    raise TimeoutError(f"the leases did not spread: {server.holders()}")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    processes_support.stop_all(started)


def test_a_killed_replica_s_groups_move_without_losing_partitions_or_commits(
    broker: embedded.EmbeddedBroker,
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    urls = [f"http://127.0.0.1:{embedded.free_port()}" for _ in range(REPLICAS)]
    state_topic = f"failover-state-{uuid.uuid4().hex[:8]}"
    # One candidate group per state partition; the one replica 1 ends up coordinating is used.
    suffix = uuid.uuid4().hex[:6]
    candidates: dict[int, str] = {}
    number = 0
    while len(candidates) < STATE_PARTITIONS:
        name = f"g{number}-{suffix}"
        candidates.setdefault(partitioning.partition_for(name, STATE_PARTITIONS), name)
        number += 1
    topic = f"failover-orders-{suffix}"
    settings = {
        name: {"sessionTimeoutMs": 30_000, "heartbeatIntervalMs": 200, "topics": [topic]}
        for name in candidates.values()
    }
    (tmp_path / "groups.json").write_text(json.dumps(settings))
    with LeaseServer() as server:
        for index in range(REPLICAS):
            processes.append(_start(broker, tmp_path, state_topic, urls, index, server.url))
        holders = _wait_spread(server, urls)
        # Its members are given replica 0's URL (standing for the Service), and find their
        # coordinator through the hints.
        group = next(g for p, g in candidates.items() if holders[p] == urls[1])
        local = demo.LocalGroup(
            group=group,
            topic=topic,
            partitions=4,
            session_timeout_ms=30_000,
            heartbeat_interval_ms=200,
            directory=tmp_path / "group",
            broker=broker,
            coordinator_url=urls[0],
        )
        local.directory.mkdir()
        local.create_topic(local.topic, local.partitions)
        producer = demo.Producer(broker.bootstrap, local.topic, local.partitions, rate=80)
        producer.start()
        try:
            for instance in sorted(MEMBERS):
                local.start_member(instance, env={"KGO_COORDINATOR_URL": urls[0]})
            local.wait_settled(MEMBERS, timeout=90)
            _wait_commits(local, time.time(), timeout=60)
            time.sleep(1.0)
            killed_at = time.time()
            processes[1].send_signal(signal.SIGKILL)
            processes[1].wait()
            acknowledged = _acknowledged(local, killed_at)
            assert acknowledged.keys() == {(local.topic, p) for p in range(local.partitions)}
            # Commits resume at the new coordinator on every partition.
            _wait_commits(local, killed_at + 0.5, timeout=60)
            committed = _fetch(local)
            for tp, offset in acknowledged.items():
                assert committed[tp] >= offset, f"{tp}: acknowledged {offset}, now {committed[tp]}"
            # The members kept their partitions all along (well within the session timeout).
            lost = [
                instance
                for instance in MEMBERS
                for at, _ in demo.Journal.read(local.journal_path(instance)).changes("lost")
                if at >= killed_at
            ]
            assert lost == []
            new_holder = server.holders()[partitioning.partition_for(local.group, STATE_PARTITIONS)]
            assert new_holder in (urls[0], urls[2])
        finally:
            producer.stop()
            local.stop()


def _acknowledged(local: demo.LocalGroup, until: float) -> dict[tuple[str, int], int]:
    highest: dict[tuple[str, int], int] = {}
    for instance in MEMBERS:
        for tp, offset, at in demo.Journal.read(local.journal_path(instance)).acknowledged():
            if at <= until:
                highest[tp] = max(highest.get(tp, -1), offset)
    return highest


def _wait_commits(local: demo.LocalGroup, since: float, timeout: float) -> None:
    """Until every partition has a commit acknowledged after ``since``."""
    deadline = time.monotonic() + timeout
    after: set[tuple[str, int]] = set()
    while time.monotonic() < deadline:
        after = {
            tp
            for instance in MEMBERS
            for tp, _, at in demo.Journal.read(local.journal_path(instance)).acknowledged()
            if at > since
        }
        if len(after) == local.partitions:
            return
        time.sleep(0.2)
    raise AssertionError(f"commits acknowledged on {sorted(after)} only")


def _fetch(local: demo.LocalGroup) -> dict[tuple[str, int], int]:
    deadline = time.monotonic() + 30
    while True:
        coordinator = local.client()
        try:
            return coordinator.fetch()
        except errors.CoordinatorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            coordinator.close()
