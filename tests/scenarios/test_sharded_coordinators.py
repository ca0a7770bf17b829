"""Real processes: three ``kgo coordinator`` processes split one state topic on the embedded
broker, each serving a set of its partitions and knowing the others from a peers map.

Every member process is configured with the first coordinator's URL only; it follows the
NOT_COORDINATOR hints to its group's coordinator, consumes and commits there. Then the
coordinator of one group is killed (SIGKILL) and a replacement serving the same partitions is
started: that group resumes, no commit any member saw acknowledged is lost, and the groups of
the other coordinators never notice.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kafka_group_operator.commands import demo
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import client
from kafka_group_records import partitioning

pytestmark = [pytest.mark.slow, pytest.mark.broker]

STATE_PARTITIONS = 6
# Coordinator i serves these state partitions.
SETS = ["0-1", "2-3", "4-5"]
MEMBERS = {"member-0", "member-1"}


def _group_served_by(index: int, suffix: str) -> str:
    first, last = (int(n) for n in SETS[index].split("-"))
    number = 0
    while not first <= partitioning.partition_for(f"g{number}-{suffix}", STATE_PARTITIONS) <= last:
        number += 1
    return f"g{number}-{suffix}"


@dataclass
class Shards:
    broker: embedded.EmbeddedBroker
    directory: Path
    state_topic: str = field(default_factory=lambda: f"sharded-state-{uuid.uuid4().hex[:8]}")
    ports: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    groups: list[demo.LocalGroup] = field(default_factory=list)

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def start(self, index: int) -> None:
        peers = ",".join(f"{s}={self.url(i)}" for i, s in enumerate(SETS))
        log = (self.directory / f"coordinator-{index}.log").open("ab")
        self.processes[index] = subprocess.Popen(
            [
                sys.executable, "-m", "kafka_group_operator", "coordinator",
                "--bootstrap", self.broker.bootstrap, "--port", str(self.ports[index]),
                "--topic", self.state_topic, "--state-partitions", str(STATE_PARTITIONS),
                "--partitions", SETS[index], "--advertised-url", self.url(index),
                "--peers", peers,
                "--groups", str(self.directory / "groups.json"),
                "--tokens", str(self.directory / "tokens.json"),
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait_serving(self, index: int, timeout: float = 90) -> None:
        """Until coordinator ``index`` has loaded and configured its group."""
        local = self.groups[index]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.processes[index].poll() is None, "the coordinator exited"
            try:
                local.describe()
                return
            except errors.CoordinatorError:
                time.sleep(0.1)
        raise TimeoutError(f"coordinator {index} not serving after {timeout}s")

    def stop(self, index: int, kill: bool = False) -> None:
        process = self.processes.pop(index)
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def shards(
    broker: embedded.EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shards]:
    suffix = uuid.uuid4().hex[:6]
    directory = tmp_path_factory.mktemp("sharded")
    cluster = Shards(broker, directory, ports=[embedded.free_port() for _ in SETS])
    for index in range(len(SETS)):
        group = _group_served_by(index, suffix)
        local = demo.LocalGroup(
            group=group,
            topic=f"sharded-orders-{group}",
            partitions=4,
            # Long enough that members keep their partitions while a coordinator restarts
            # on a loaded machine.
            session_timeout_ms=30_000,
            heartbeat_interval_ms=200,
            directory=directory / group,
            broker=broker,
            coordinator_url=cluster.url(index),  # where the test looks; members get url(0)
        )
        local.directory.mkdir()
        local.create_topic(local.topic, local.partitions)
        cluster.groups.append(local)
    (directory / "tokens.json").write_text(json.dumps({g.group: g.token for g in cluster.groups}))
    settings = {
        g.group: {
            "sessionTimeoutMs": g.session_timeout_ms,
            "heartbeatIntervalMs": g.heartbeat_interval_ms,
            "topics": [g.topic],
        }
        for g in cluster.groups
    }
    (directory / "groups.json").write_text(json.dumps(settings))
    producers = [
        demo.Producer(broker.bootstrap, g.topic, g.partitions, rate=80) for g in cluster.groups
    ]
    try:
        for index in range(len(SETS)):
            cluster.start(index)
        for index in range(len(SETS)):
            cluster.wait_serving(index)
        for producer in producers:
            producer.start()
        yield cluster
    finally:
        for producer in producers:
            producer.stop()
        for local in cluster.groups:
            local.stop()
        for index in list(cluster.processes):
            cluster.stop(index)


def _find(url: str, local: demo.LocalGroup) -> dict[str, Any]:
    coordinator = client.CoordinatorClient(url, local.group, local.token)
    try:
        return coordinator.request("GET", "/coordinator")
    finally:
        coordinator.close()


def _fetch(local: demo.LocalGroup) -> dict[tuple[str, int], int]:
    """The group's committed offsets, from its coordinator."""
    coordinator = local.client()
    try:
        return coordinator.fetch()
    finally:
        coordinator.close()


def _acknowledged(local: demo.LocalGroup, until: float) -> dict[tuple[str, int], int]:
    """The highest offset acknowledged to any member of the group, per partition, before."""
    highest: dict[tuple[str, int], int] = {}
    for instance in MEMBERS:
        for tp, offset, at in demo.Journal.read(local.journal_path(instance)).acknowledged():
            if at <= until:
                highest[tp] = max(highest.get(tp, -1), offset)
    return highest


def _lost_since(local: demo.LocalGroup, since: float) -> list[str]:
    return [
        instance
        for instance in MEMBERS
        for at, _ in demo.Journal.read(local.journal_path(instance)).changes("lost")
        if at >= since
    ]


def test_every_coordinator_names_each_groups_owner(shards: Shards) -> None:
    for owner, local in enumerate(shards.groups):
        for asked in range(len(SETS)):
            found = _find(shards.url(asked), local)
            assert found["url"] == shards.url(owner)
            assert found["self"] is (asked == owner)
            assert found["partition"] == partitioning.partition_for(local.group, STATE_PARTITIONS)


def test_members_given_one_url_follow_the_hints_and_commit(shards: Shards) -> None:
    for local in shards.groups:
        for instance in sorted(MEMBERS):
            local.start_member(instance, env={"KGO_COORDINATOR_URL": shards.url(0)})
    for local in shards.groups:
        local.wait_settled(MEMBERS, timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        acknowledged = [_acknowledged(local, time.time()) for local in shards.groups]
        if all(
            len(a) == local.partitions for a, local in zip(acknowledged, shards.groups, strict=True)
        ):
            break
        time.sleep(0.2)
    for local in shards.groups:
        # Every partition's commits were acknowledged, and are what its coordinator holds.
        committed = _fetch(local)
        acknowledged_now = _acknowledged(local, time.time())
        assert acknowledged_now.keys() == {(local.topic, p) for p in range(local.partitions)}
        for tp, offset in acknowledged_now.items():
            assert committed[tp] >= offset
        # The first coordinator answers NOT_COORDINATOR naming the owner for the others.
        if local is not shards.groups[0]:
            wrong = client.CoordinatorClient(shards.url(0), local.group, local.token)
            # The client sends the request on to the owner, which answers it.
            assert wrong.fetch().keys() == acknowledged_now.keys()
            assert wrong.coordinator_url == local.coordinator_url
            wrong.close()


def test_a_killed_coordinator_is_replaced_and_no_acknowledged_commit_is_lost(
    shards: Shards,
) -> None:
    victim = 1
    local = shards.groups[victim]
    others = [g for i, g in enumerate(shards.groups) if i != victim]
    time.sleep(1.0)  # commits keep flowing
    killed_at = time.time()
    shards.stop(victim, kill=True)
    acknowledged = _acknowledged(local, killed_at)
    assert acknowledged.keys() == {(local.topic, p) for p in range(local.partitions)}
    shards.start(victim)
    shards.wait_serving(victim)
    loaded = _fetch(local)
    for tp, offset in acknowledged.items():
        assert loaded[tp] >= offset, f"{tp}: acknowledged {offset}, loaded {loaded[tp]}"
    # The group resumes: both members heartbeat to the replacement and consume on.
    local.wait_settled(MEMBERS, timeout=60)
    resumed_at = time.time()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = {
            tp
            for instance in MEMBERS
            for tp, _, at in demo.Journal.read(local.journal_path(instance)).acknowledged()
            if at > resumed_at
        }
        if len(after) == local.partitions:
            break
        time.sleep(0.2)
    assert len(after) == local.partitions, f"commits resumed on {sorted(after)} only"
    # The other coordinators' groups never lost a partition.
    for other in others:
        assert _lost_since(other, killed_at) == [], f"{other.group} lost partitions"
        other.wait_settled(MEMBERS, timeout=10)


def test_a_bad_partition_set_is_one_line(broker: embedded.EmbeddedBroker) -> None:
    for arguments, message in (
        (
            ["--partitions", "3-1"],
            "--partitions: '3-1': '3-1' is not a range of partitions (low-high, >= 0)",
        ),
        (
            ["--partitions", "0-60"],
            "--partitions/--peers: partitions 50-60 are outside the state topic's 0-49",
        ),
        (["--peers", "0-4"], "--peers: '0-4': '0-4' is not PARTITIONS=URL"),
    ):
        run = subprocess.run(
            [
                *(sys.executable, "-m", "kafka_group_operator", "coordinator"),
                *("--bootstrap", broker.bootstrap, *arguments),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 2
        assert run.stderr.strip() == f"kgo coordinator: {message}"
