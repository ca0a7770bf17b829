"""``kgo groups`` against a running ``kgo dev up`` group: exact tables, audits and CSV.

The setup's topic ``orders`` has 6 partitions holding 1000 messages round-robin, so the log
ends are 167 (partitions 0-3) and 166 (4-5). The tests run in order: offsets set by one are
read by the next.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_group_operator.commands import groups
from tests.cli.conftest import ROOT, DevSetup

pytestmark = pytest.mark.broker

LOG_ENDS = {0: 167, 1: 167, 2: 167, 3: 167, 4: 166, 5: 166}


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_list_shows_the_groups_the_token_may_see(dev: DevSetup) -> None:
    listed = dev.kgo("groups", "list")
    assert listed.code == 0, listed.stderr
    assert table(listed.stdout) == [
        ["GROUP", "STATE", "MEMBERS", "EPOCH", "ASSIGNOR"],
        ["shop.orders", "Empty", "0", "0", "cooperative-sticky"],
    ]
    assert json.loads(dev.kgo("groups", "list", "-o", "json").stdout) == [
        {
            "groupId": "shop.orders",
            "state": "Empty",
            "members": 0,
            "groupEpoch": 0,
            "assignor": "cooperative-sticky",
        }
    ]


def test_a_dry_run_plans_and_writes_nothing(dev: DevSetup) -> None:
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-offset", "100", "--topic", "orders:1,4"
    )
    assert run.code == 0, run.stderr
    assert table(run.stdout) == [
        ["GROUP", "TOPIC", "PARTITION", "OLD-OFFSET", "NEW-OFFSET", "REQUESTED", "CLAMP"],
        ["shop.orders", "orders", "1", "-", "→", "100", "100"],
        ["shop.orders", "orders", "4", "-", "→", "100", "100"],
        ["dry", "run:", "nothing", "written;", "add", "--execute", "to", "write", "2", "offset(s)"],
    ]
    assert dev.kgo("groups", "export", "shop.orders", "--file", "-").code == 1  # still none


def test_execute_writes_one_administrative_commit(dev: DevSetup) -> None:
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-offset", "100", "--topic", "orders",
        "--execute",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert table(run.stdout)[1:7] == [
        ["shop.orders", "orders", str(p), "-", "→", "100", "100"] for p in range(6)
    ]
    assert run.stdout.splitlines()[-1] == (
        "wrote 6 offset(s): one administrative commit through the coordinator"
    )
    described = dev.kgo("groups", "describe", "shop.orders", "-o", "json")
    rows = json.loads(described.stdout)
    assert [(r["partition"], r["currentOffset"], r["logEndOffset"], r["lag"]) for r in rows] == [
        (p, 100, LOG_ENDS[p], LOG_ENDS[p] - 100) for p in range(6)
    ]


def test_out_of_range_offsets_are_clamped_with_a_warning(dev: DevSetup) -> None:
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--shift-by", "100", "--topic", "orders:0,5",
        "-o", "json",
    )  # fmt: skip
    assert run.code == 0, run.stderr
    assert json.loads(run.stdout)["partitions"] == [
        {
            "topic": "orders",
            "partition": p,
            "oldOffset": 100,
            "requestedOffset": 200,
            "newOffset": LOG_ENDS[p],
            "clamp": "latest",
        }
        for p in (0, 5)
    ]
    table_run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--shift-by", "-200", "--topic", "orders:2"
    )
    assert table(table_run.stdout)[1] == [
        "shop.orders", "orders", "2", "100", "→", "0", "-100", "earliest",
    ]  # fmt: skip
    assert table_run.stderr == (
        "warning: orders:2 requested -100 is out of range; set to the earliest offset 0\n"
    )


def test_export_writes_kafkas_csv_and_import_reads_it_back(dev: DevSetup, tmp_path: Path) -> None:
    exported = dev.kgo("groups", "export", "shop.orders", "--file", "-")
    # kafka-consumer-groups.sh --export for one group: CsvRecordNoGroup rows, no header.
    assert exported.stdout == "".join(f"orders,{p},100\n" for p in range(6))
    saved = tmp_path / "offsets.csv"
    written = dev.kgo("groups", "export", "shop.orders", "--file", str(saved))
    assert written.stdout == f"exported 6 offset(s) of group shop.orders to {saved}\n"
    assert saved.read_text() == exported.stdout

    moved = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-earliest", "--all-topics", "--execute"
    )
    assert moved.code == 0, moved.stderr
    # Kafka's multi-group rows are read too: only this group's are taken.
    saved.write_text(
        "other.group,orders,0,7\n" + "".join(f"shop.orders,orders,{p},100\n" for p in range(6))
    )
    imported = dev.kgo("groups", "import", "shop.orders", "--file", str(saved), "--execute")
    assert imported.code == 0, imported.stderr
    assert table(imported.stdout)[1:7] == [
        ["shop.orders", "orders", str(p), "0", "→", "100", "100"] for p in range(6)
    ]
    again = dev.kgo("groups", "export", "shop.orders", "--file", "-")
    assert again.stdout == exported.stdout


@pytest.fixture
def member(dev: DevSetup) -> Iterator[subprocess.Popen[bytes]]:
    """One example consumer of the group, stopped with SIGKILL (no leave, no commit)."""
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


def test_a_group_with_members_is_refused_as_kafka_refuses(
    dev: DevSetup, member: subprocess.Popen[bytes]
) -> None:
    assert dev.kgo("groups", "wait", "shop.orders", "--members", "1").code == 0
    refused = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-earliest", "--topic", "orders", "--execute"
    )
    assert (refused.code, refused.stdout) == (1, "")
    # The member heartbeats every second against a 10 s session: its session ends within
    # 10 s unless it heartbeats again, which the refusal says, with --wait.
    assert re.fullmatch(
        re.escape(
            "kgo groups reset-offsets: "
            + groups.NOT_INACTIVE.format(group="shop.orders", state="Stable")
            + " Stop its 1 member(s) or pause the group first; members stopped without leaving "
            "stay until their session times out (within "
        )
        + r"(\d+\.\d) s"
        + re.escape(
            " unless they heartbeat again; the session timeout is 10 s): --wait retries until "
            "then.\n"
        ),
        refused.stderr,
    ), refused.stderr
    planned = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-earliest", "--topic", "orders"
    )
    assert planned.code == 0
    assert planned.stdout.splitlines()[-1] == (
        "dry run: nothing written; add --execute to write 6 offset(s); the group has 1 active "
        "member(s), so --execute is refused until it is empty or paused"
    )
    members = dev.kgo("groups", "describe", "shop.orders", "--members")
    rows = table(members.stdout)
    assert rows[0] == [
        "GROUP", "MEMBER-ID", "INSTANCE-ID", "HOST", "EPOCH", "STATE", "#PARTITIONS", "ASSIGNMENT",
    ]  # fmt: skip
    assert rows[1][0] == "shop.orders"
    # The host is the address the member's heartbeats come from: loopback here.
    assert rows[1][2:] == ["orders-0", "127.0.0.1", rows[1][4], "STABLE", "6", "orders[0-5]"]
    state = json.loads(dev.kgo("groups", "describe", "shop.orders", "--state", "-o", "json").stdout)
    assert (state["group"], state["state"], state["members"]) == ("shop.orders", "Stable", 1)


def test_state_as_yaml(dev: DevSetup) -> None:
    run = dev.kgo("groups", "describe", "shop.orders", "--state", "-o", "yaml")
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "group: shop.orders"
    assert [line.split(":")[0] for line in lines] == [
        "group", "coordinator", "assignor", "state", "members", "groupEpoch", "assignmentEpoch",
        "totalLag",
    ]  # fmt: skip


def test_without_a_bootstrap_the_log_end_is_the_commit_plus_the_coordinators_lag() -> None:
    description = {
        "groupId": "g",
        "members": [
            {"memberId": "m", "instanceId": "g-0", "clientHost": "10.0.0.7",
             "assignment": {"t": [0, 1]}},
        ],
        "lag": [{"topic": "t", "partition": 0, "lag": 5}, {"topic": "t", "partition": 2, "lag": 0}],
    }  # fmt: skip
    rows = groups.partition_rows(description, {("t", 0): 10, ("t", 2): 4}, None)
    assert [tuple(row.values()) for row in rows] == [
        ("g", "t", 0, 10, 15, 5, "m", "g-0", "10.0.0.7"),
        ("g", "t", 1, None, None, None, "m", "g-0", "10.0.0.7"),
        ("g", "t", 2, 4, 4, 0, None, None, None),
    ]
