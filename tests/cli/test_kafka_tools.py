"""Kafka's own ``kafka-consumer-groups`` (ConsumerGroupCommand from ``kafka-tools``) on our
groups, compared with ``kgo groups describe``: against the brokers (the mirrored native
group), against the coordinator's Kafka listener, and through a gateway. On Apache Kafka 4.4.

One ``kgo coordinator`` (member API, Kafka listener, mirror every second) and one ``kgo
gateway`` serve the module. The tool exits 0 even when it prints ``Error:``, so every call is
checked by its output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.embedded import kafka
from tests.cli.conftest import kgo
from tests.support import processes, topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PARTITIONS, MESSAGES = 3, 10
WAIT_S = 60


@dataclass
class Setup:
    bootstrap: str  # the brokers
    listener: str  # the coordinator's Kafka listener
    gateway: str  # a gateway in front of both
    url: str  # the member API
    topic: str

    def describe(self, group: str, *flags: str) -> Any:
        """``kgo groups describe GROUP [flags] -o json`` with the brokers' log ends."""
        done = kgo(
            "groups", "describe", group, *flags, "--coordinator", self.url,
            "--bootstrap", self.bootstrap, "-o", "json",
        )  # fmt: skip
        assert done.code == 0, done.stderr
        return json.loads(done.stdout)


def tool(server: str, *args: str) -> str:
    """``kafka-consumer-groups --bootstrap-server SERVER ARGS``: its output, refused on
    ``Error:`` lines unless the caller expects them."""
    command = kafka.java_command(
        kafka.CONSUMER_GROUP_COMMAND, "--bootstrap-server", server, *args, heap_mb=128
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def rows(output: str) -> list[dict[str, str]]:
    """The tool's table: one dict per line from the header line (``GROUP ...``) to the
    first blank line."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GROUP"]), None)
    if start is None:
        return []
    headers = lines[start].split()
    table = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        values = line.split()
        if "(ID)" in headers:  # "COORDINATOR (ID)": one column, two words in each row
            values = [values[0], " ".join(values[1:3]), *values[3:]]
        table.append(dict(zip([h for h in headers if h != "(ID)"], values, strict=False)))
    return table


def until(check: Any, what: str, context: list[str] | None = None) -> Any:
    deadline = time.monotonic() + WAIT_S
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: never; last {last!r} {context or ''}")


@pytest.fixture(scope="module")
def setup(
    kafka_broker: kafka.KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    home = tmp_path_factory.mktemp("tools")
    topic = topics.create_topic(kafka_broker.bootstrap, PARTITIONS, MESSAGES)
    settings = {"topics": [topic], "mirrorIntervalSeconds": 1}
    groups_file = home / "groups.json"
    groups_file.write_text(json.dumps({g: settings for g in GROUPS}))
    port, kafka_port, gateway_port = (embedded.free_port() for _ in range(3))
    started = [
        subprocess.Popen(
            [
                sys.executable, "-m", "kafka_group_operator", "coordinator",
                "--bootstrap", kafka_broker.bootstrap, "--port", str(port),
                "--kafka-port", str(kafka_port), "--state-partitions", "3",
                "--topic", f"tools-state-{uuid.uuid4().hex[:6]}", "--groups", str(groups_file),
            ],
            stdout=(home / "coordinator.log").open("wb"), stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [
                sys.executable, "-m", "kafka_group_operator", "gateway",
                "--bootstrap", kafka_broker.bootstrap, "--coordinator", f"127.0.0.1:{kafka_port}",
                "--host", "127.0.0.1", "--port", str(gateway_port),
            ],
            stdout=(home / "gateway.log").open("wb"), stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        until(lambda: _healthy(url), "the coordinator answers")
        yield Setup(
            kafka_broker.bootstrap,
            f"127.0.0.1:{kafka_port}",
            f"127.0.0.1:{gateway_port}",
            url,
            topic,
        )
    finally:
        processes.stop_all(started)


GROUPS = ("tools.mirrored", "tools.active", "tools.reset", "tools.deleted")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def commit(server: str, group: str, offsets: dict[int, int], topic: str) -> None:
    """A member-less commit through ``server``, as a tool or a stopped consumer makes."""
    consumer = Consumer({"bootstrap.servers": server, "group.id": group, "log_level": 3})
    wanted = [TopicPartition(topic, p, o) for p, o in offsets.items()]
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            try:
                consumer.commit(offsets=wanted, asynchronous=False)
                return
            except KafkaException as error:
                # The coordinator still loading its partitions: as a client, try again.
                if (
                    error.args[0].code()
                    not in (
                        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                        KafkaError.COORDINATOR_NOT_AVAILABLE,
                    )
                    or time.monotonic() > deadline
                ):
                    raise
            time.sleep(0.3)
    finally:
        consumer.close()


def by_partition(table: list[dict[str, str]]) -> dict[int, dict[str, str]]:
    return {int(row["PARTITION"]): row for row in table}


def test_the_brokers_show_the_mirrored_group_as_kgo_does(setup: Setup) -> None:
    group = "tools.mirrored"
    commit(setup.listener, group, {0: 4, 1: 5, 2: 6}, setup.topic)
    last: list[str] = []

    def native() -> dict[int, dict[str, str]] | None:
        last[:] = [tool(setup.bootstrap, "--describe", "--group", group)]
        found = by_partition(rows(last[0]))
        current = {p: row.get("CURRENT-OFFSET") for p, row in found.items()}
        return found if current == {0: "4", 1: "5", 2: "6"} else None

    mirrored = until(native, "the native group carries the offsets", last)
    ours = {row["partition"]: row for row in setup.describe(group)}
    for partition, row in mirrored.items():
        assert row["TOPIC"] == setup.topic
        assert int(row["CURRENT-OFFSET"]) == ours[partition]["currentOffset"] == 4 + partition
        # The real high watermark: every partition holds MESSAGES records.
        assert int(row["LOG-END-OFFSET"]) == ours[partition]["logEndOffset"] == MESSAGES
        assert int(row["LAG"]) == ours[partition]["lag"] == MESSAGES - 4 - partition
        assert row["CONSUMER-ID"] == "-"
    assert group in tool(setup.bootstrap, "--list").split()
    members = tool(setup.bootstrap, "--describe", "--group", group, "--members")
    assert f"Consumer group '{group}' has no active members." in members
    (state,) = rows(tool(setup.bootstrap, "--describe", "--group", group, "--state"))
    assert (state["STATE"], state["#MEMBERS"]) == ("Empty", "0")


class Member:
    """A classic confluent-kafka consumer of the group, through the gateway."""

    def __init__(self, server: str, group: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": server,
                "group.id": group,
                "client.id": "tools-member",
                "group.protocol": "classic",
                "partition.assignment.strategy": "range",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "log_level": 3,
            }
        )
        self.consumer.subscribe([topic])

    def assigned(self) -> bool:
        self.consumer.poll(0.2)
        return len(self.consumer.assignment()) == PARTITIONS

    def close(self) -> None:
        self.consumer.close()


@pytest.mark.parametrize("via", ["listener", "gateway"])
def test_describe_through_the_coordinator_matches_kgo(setup: Setup, via: str) -> None:
    group = "tools.active"
    server = setup.listener if via == "listener" else setup.gateway
    commit(setup.listener, group, {0: 1, 1: 2, 2: 3}, setup.topic)
    member = Member(setup.gateway, group, setup.topic)
    try:
        until(member.assigned, "the member owns every partition")
        ours = {row["partition"]: row for row in setup.describe(group)}
        outputs: list[str] = []

        def described_now() -> Any:
            outputs[:] = [tool(server, "--describe", "--group", group)]
            return by_partition(rows(outputs[0]))

        described = until(described_now, "the tool describes the group", outputs)
        assert set(described) == set(range(PARTITIONS))
        for partition, row in described.items():
            assert int(row["CURRENT-OFFSET"]) == ours[partition]["currentOffset"] == partition + 1
            assert int(row["LOG-END-OFFSET"]) == ours[partition]["logEndOffset"] == MESSAGES
            assert int(row["LAG"]) == ours[partition]["lag"]
            assert row["CONSUMER-ID"] == ours[partition]["memberId"]
            assert row["CLIENT-ID"] == "tools-member"
            assert row["HOST"].lstrip("/") == "127.0.0.1"
        (listed,) = rows(tool(server, "--describe", "--group", group, "--members"))
        assert (listed["CLIENT-ID"], listed["#PARTITIONS"]) == ("tools-member", str(PARTITIONS))
        (state,) = rows(tool(server, "--describe", "--group", group, "--state"))
        ours_state = setup.describe(group, "--state")
        assert state["STATE"] == "Stable"
        assert state["#MEMBERS"] == str(ours_state["members"]) == "1"
        # The assignor that assigns: the coordinator's own (server-side), whatever protocol
        # the classic member proposed.
        assert state["ASSIGNMENT-STRATEGY"] == ours_state["assignor"] == "cooperative-sticky"
        # An active group refuses a reset: the tool checks its state first, as Kafka's
        # coordinator would refuse the commit (NON_EMPTY_GROUP) after it.
        refused = tool(server, "--reset-offsets", "--group", group, "--topic", setup.topic,
                       "--to-earliest", "--execute")  # fmt: skip
        assert "inactive" in refused, refused
        assert {r["partition"]: r["currentOffset"] for r in setup.describe(group)} == {
            0: 1,
            1: 2,
            2: 3,
        }
    finally:
        member.close()


def test_reset_delete_offsets_and_delete_through_the_listener(setup: Setup) -> None:
    group = "tools.reset"
    commit(setup.listener, group, {0: 7, 1: 8, 2: 9}, setup.topic)
    plan = by_partition(
        rows(tool(setup.listener, "--reset-offsets", "--group", group, "--topic", setup.topic,
                  "--to-offset", "2", "--dry-run"))
    )  # fmt: skip
    assert {p: int(row["NEW-OFFSET"]) for p, row in plan.items()} == dict.fromkeys(range(3), 2)
    assert {r["partition"]: r["currentOffset"] for r in setup.describe(group)} == {0: 7, 1: 8, 2: 9}
    done = tool(setup.listener, "--reset-offsets", "--group", group, "--topic", setup.topic,
                "--to-earliest", "--execute")  # fmt: skip
    assert {p: int(r["NEW-OFFSET"]) for p, r in by_partition(rows(done)).items()} == {
        0: 0,
        1: 0,
        2: 0,
    }
    assert {r["partition"]: r["currentOffset"] for r in setup.describe(group)} == dict.fromkeys(
        range(3), 0
    )
    # Mirrored afterwards: the brokers' own group follows.
    until(
        lambda: (
            {
                p: int(r["CURRENT-OFFSET"])
                for p, r in by_partition(
                    rows(tool(setup.bootstrap, "--describe", "--group", group))
                ).items()
            }
            == dict.fromkeys(range(3), 0)
        ),
        "the reset is mirrored",
    )

    deleted = tool(setup.listener, "--delete-offsets", "--group", group, "--topic",
                   f"{setup.topic}:2")  # fmt: skip
    assert "Successful" in deleted, deleted
    assert sorted(r["partition"] for r in setup.describe(group)) == [0, 1]

    gone = tool(setup.listener, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in gone, gone
    assert group not in tool(setup.listener, "--list").split()
    listed = kgo("groups", "list", "--coordinator", setup.url, "-o", "json")
    assert group not in {g["groupId"] for g in json.loads(listed.stdout)}


def test_a_group_the_coordinator_does_not_know_is_refused_with_kafkas_error(setup: Setup) -> None:
    missing = tool(setup.listener, "--delete", "--group", "tools.never-seen")
    assert "GROUP_ID_NOT_FOUND" in missing or "does not exist" in missing, missing
