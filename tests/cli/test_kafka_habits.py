"""``kgo groups`` with ``kafka-consumer-groups.sh``'s habits, against a running ``kgo dev up``
group: Kafka's spelling of the options and actions, ``--to-current``, ``--export``,
``--delete``, ``--delete-offsets``, the COORDINATOR column, offsets by time whatever the
broker answers, an unknown group, and a reset that waits for stopped members to time out.

The setup's topic ``orders`` has 6 partitions holding 1000 messages round-robin (log ends 167
for partitions 0-3, 166 for 4-5). The tests run in order: the last ones delete the group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_group_operator.embedded import broker as embedded
from tests.cli.conftest import ROOT, DevSetup, kgo

pytestmark = pytest.mark.broker

LOG_ENDS = {0: 167, 1: 167, 2: 167, 3: 167, 4: 166, 5: 166}


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def test_kafkas_spelling_is_the_same_command(dev: DevSetup) -> None:
    bootstrap = dev.env["KAFKA_BOOTSTRAP_SERVERS"]
    ours = dev.kgo("groups", "describe", "shop.orders", "--bootstrap", bootstrap)
    # kafka-consumer-groups.sh --bootstrap-server B --describe --group G
    kafkas = dev.kgo(
        "groups", "--bootstrap-server", bootstrap, "--describe", "--group", "shop.orders"
    )
    assert (kafkas.code, kafkas.stderr) == (0, "")
    assert kafkas.stdout == ours.stdout
    assert kafkas.stdout.startswith("Consumer group 'shop.orders' has no active members.\n\n")


def test_state_names_the_coordinator_serving_the_group(dev: DevSetup) -> None:
    run = dev.kgo("groups", "describe", "--group", "shop.orders", "--state")
    assert run.code == 0, run.stderr
    assert table(run.stdout) == [
        [
            "GROUP", "COORDINATOR", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS", "EPOCH",
            "ASSIGNMENT-EPOCH", "LAG",
        ],
        [
            # Nothing committed yet: no lag to show.
            "shop.orders", dev.env["KGO_COORDINATOR_URL"], "cooperative-sticky", "Empty", "0",
            "0", "0", "-",
        ],
    ]  # fmt: skip
    every = json.loads(
        dev.kgo("groups", "describe", "--all-groups", "--state", "-o", "json").stdout
    )
    assert [(s["group"], s["coordinator"]) for s in every] == [
        ("shop.orders", dev.env["KGO_COORDINATOR_URL"])
    ]


def test_describe_takes_the_one_output_flag(dev: DevSetup) -> None:
    run = dev.kgo("describe", "shop.orders", "-o", "json")
    assert run.code == 0, run.stderr
    described = json.loads(run.stdout)
    assert (described["groupId"], described["sessionTimeoutMs"]) == ("shop.orders", 10_000)


def test_to_current_keeps_committed_offsets_and_takes_the_log_end_without_one(
    dev: DevSetup,
) -> None:
    written = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-offset", "100", "--topic", "orders:0,1,2",
        "--execute",
    )  # fmt: skip
    assert written.code == 0, written.stderr
    run = dev.kgo(
        "groups", "reset-offsets", "--group", "shop.orders", "--to-current", "--topic", "orders",
        "-o", "json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    planned = json.loads(run.stdout)["partitions"]
    assert [(p["partition"], p["oldOffset"], p["newOffset"]) for p in planned] == [
        (0, 100, 100),
        (1, 100, 100),
        (2, 100, 100),
        (3, None, 167),
        (4, None, 166),
        (5, None, 166),
    ]


def test_export_prints_the_plan_as_kafkas_csv(dev: DevSetup) -> None:
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-offset", "5", "--topic", "orders:0,4",
        "--export",
    )  # fmt: skip
    # ConsumerGroupCommand prints exportOffsetsToCsv with println: rows, then an empty line.
    assert (run.code, run.stdout) == (0, "orders,0,5\norders,4,5\n\n")
    assert run.stderr == "dry run: nothing written; add --execute to write 2 offset(s)\n"


def test_a_future_time_plans_the_log_end(dev: DevSetup) -> None:
    # Kafka answers a time newer than every record with no offset, and the tool takes the
    # log end; the embedded broker answers offset 0, which would rewind the group.
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-datetime", "2099-01-01T00:00:00Z",
        "--topic", "orders", "-o", "json",
    )  # fmt: skip
    assert (run.code, run.stderr) == (0, "")
    planned = json.loads(run.stdout)["partitions"]
    assert {p["partition"]: p["newOffset"] for p in planned} == LOG_ENDS


def test_a_time_after_the_newest_record_plans_the_log_end_whatever_the_broker_answers(
    dev: DevSetup,
) -> None:
    # The messages were produced when the setup started, before this.
    just_now = iso(time.time_ns() // 1_000_000 - 1)
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-datetime", just_now, "--topic", "orders",
        "-o", "json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    planned = json.loads(run.stdout)["partitions"]
    assert {p["partition"]: p["newOffset"] for p in planned} == LOG_ENDS


@pytest.fixture(scope="module")
def timed_topic(dev: DevSetup) -> tuple[str, int]:
    """A topic of one partition with ten records stamped one second apart from a base time."""
    bootstrap = dev.env["KAFKA_BOOTSTRAP_SERVERS"]
    name = f"timed-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(15)
    base = time.time_ns() // 1_000_000 - 3_600_000
    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1})
    for index in range(10):
        producer.produce(name, b"m", partition=0, timestamp=base + 1000 * index)
    assert producer.flush(30) == 0
    return name, base


@pytest.mark.parametrize(("after_ms", "offset"), [(0, 0), (4_500, 5), (9_000, 9), (9_001, 10)])
def test_a_past_time_plans_the_first_record_at_or_after_it(
    dev: DevSetup, timed_topic: tuple[str, int], after_ms: int, offset: int
) -> None:
    topic, base = timed_topic
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-datetime", iso(base + after_ms),
        "--topic", topic, "-o", "json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert [p["newOffset"] for p in json.loads(run.stdout)["partitions"]] == [offset]


@pytest.fixture(scope="module")
def open_coordinator(dev: DevSetup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A coordinator without tokens on the setup's broker: anyone may know what exists."""
    port = embedded.free_port()
    log = (tmp_path_factory.mktemp("open") / "coordinator.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "kafka_group_operator", "coordinator",
            "--bootstrap", dev.env["KAFKA_BOOTSTRAP_SERVERS"], "--port", str(port),
            "--topic", f"open-state-{uuid.uuid4().hex[:8]}", "--state-partitions", "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5) as reply:
                if reply.status == 200:
                    break
        except OSError:
            assert time.monotonic() < deadline, "the coordinator did not start"
            assert process.poll() is None, "the coordinator exited"
            time.sleep(0.2)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def test_an_unknown_group_does_not_exist_for_whom_may_know(open_coordinator: str) -> None:
    for argv in (["groups", "describe", "nosuch"], ["describe", "nosuch"]):
        run = kgo(*argv, "--coordinator", open_coordinator, env={"KGO_GROUP_TOKEN": ""})
        command = " ".join(argv[:-1])
        assert (run.code, run.stdout, run.stderr) == (
            1,
            "",
            f"kgo {command}: Consumer group 'nosuch' does not exist.\n",
        )


def test_a_group_that_does_not_exist_yet_gets_its_first_offsets(
    dev: DevSetup, open_coordinator: str
) -> None:
    # As kafka-consumer-groups.sh --reset-offsets: offsets set before any consumer starts.
    where = [
        "--coordinator",
        open_coordinator,
        "--bootstrap-server",
        dev.env["KAFKA_BOOTSTRAP_SERVERS"],
    ]
    group = f"new-{uuid.uuid4().hex[:6]}"
    env = {"KGO_GROUP_TOKEN": ""}
    run = kgo(
        "groups", "reset-offsets", group, "--to-offset", "3", "--topic", "orders:0", *where,
        "--execute", env=env,
    )  # fmt: skip
    assert run.code == 0, run.stderr
    exported = kgo("groups", "export", group, "--file", "-", *where[:2], env=env)
    assert (exported.code, exported.stdout) == (0, "orders,0,3\n")


@pytest.fixture
def member(dev: DevSetup) -> Iterator[subprocess.Popen[bytes]]:
    """One example consumer of the group; killed (SIGKILL: no leave) at the latest at the end."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "consumer.py")],
        env={**os.environ, **dev.env, "KGO_INSTANCE_ID": "orders-0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def test_members_refuse_deletes_and_a_reset_waits_for_killed_ones(
    dev: DevSetup, member: subprocess.Popen[bytes]
) -> None:
    assert dev.kgo("groups", "wait", "shop.orders", "--members", "1").code == 0
    refused = dev.kgo("groups", "delete", "shop.orders")
    assert (refused.code, refused.stdout, refused.stderr) == (
        1,
        "",
        "kgo groups delete: group 'shop.orders' could not be deleted: NON_EMPTY_GROUP: "
        "Group shop.orders still has members.\n",
    )
    subscribed = dev.kgo("groups", "delete-offsets", "shop.orders", "--topic", "orders:0")
    assert subscribed.code == 1
    assert table(subscribed.stdout) == [
        ["TOPIC", "PARTITION", "STATUS"],
        ["orders", "0", "Error:", "GROUP_SUBSCRIBED_TO_TOPIC"],
    ]
    # Killed, the member stays in the group until its session (10 s) times out: --wait
    # writes once it has.
    member.send_signal(signal.SIGKILL)
    member.wait()
    waited = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-offset", "7", "--topic", "orders",
        "--execute", "--wait",
    )  # fmt: skip
    assert waited.code == 0, waited.stderr
    assert waited.stdout.splitlines()[-1] == (
        "wrote 6 offset(s): one administrative commit through the coordinator"
    )
    assert waited.stderr.startswith("waiting up to ")


def test_delete_offsets_then_the_group_as_kafka_does(dev: DevSetup) -> None:
    run = dev.kgo("groups", "delete-offsets", "shop.orders", "--topic", "orders:0,1")
    assert (run.code, run.stderr) == (0, "")
    assert run.stdout == (
        "Request succeed for deleting offsets with topic orders:0,1 group shop.orders\n\n"
        "TOPIC   PARTITION  STATUS\n"
        "orders  0          Successful\n"
        "orders  1          Successful\n"
    )
    exported = dev.kgo("groups", "export", "shop.orders", "--file", "-")
    assert exported.stdout == "".join(f"orders,{p},7\n" for p in range(2, 6))
    none = dev.kgo("groups", "delete-offsets", "shop.orders", "--topic", "nosuch")
    assert (none.code, table(none.stdout)) == (
        1,
        [
            ["TOPIC", "PARTITION", "STATUS"],
            ["nosuch", "Not", "Provided", "Error:", "no", "committed", "offsets"],
        ],
    )

    deleted = dev.kgo("groups", "--delete", "--group", "shop.orders")
    assert (deleted.code, deleted.stdout, deleted.stderr) == (
        0,
        "Deletion of requested consumer groups ('shop.orders') was successful.\n",
        "",
    )
    # The token's holder may know the group is gone.
    gone = dev.kgo("groups", "describe", "shop.orders")
    assert (gone.code, gone.stderr) == (
        1,
        "kgo groups describe: Consumer group 'shop.orders' does not exist.\n",
    )


def test_the_operator_without_kubernetes_credentials_fails_first(
    dev: DevSetup, tmp_path: Path
) -> None:
    state_topic = f"never-{uuid.uuid4().hex[:8]}"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env |= {
        "HOME": str(tmp_path),
        "KGO_BOOTSTRAP_SERVERS": dev.env["KAFKA_BOOTSTRAP_SERVERS"],
        "KGO_STATE_TOPIC": state_topic,
    }
    run = subprocess.run(
        [sys.executable, "-m", "kafka_group_operator", "operator"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout, run.stderr) == (
        1,
        "",
        "kgo operator: no Kubernetes credentials: not in a pod (no service account token) and "
        "no kubeconfig at ~/.kube/config; point KUBECONFIG at one (kubectl's) and retry. "
        "Nothing was started\n",
    )
    admin = AdminClient({"bootstrap.servers": dev.env["KAFKA_BOOTSTRAP_SERVERS"]})
    assert state_topic not in admin.list_topics(timeout=10).topics
