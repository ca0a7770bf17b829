"""``kgo dev up|env|down``: what starts, what it prints, and that both directions are idempotent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_group_operator.commands import dev
from kafka_group_operator.member import client
from tests.cli.conftest import kgo, parse_exports

pytestmark = pytest.mark.broker

MEMBER_ENVIRONMENT = {
    "KAFKA_BOOTSTRAP_SERVERS",
    "KGO_COORDINATOR_URL",
    "KGO_GROUP_ID",
    "KGO_GROUP_TOKEN",
    "KGO_TOPICS",
    "KGO_AUTO_OFFSET_RESET",
}


def test_up_env_down_up_again_and_down_again(tmp_path: Path) -> None:
    env = {"KGO_DEV_DIR": str(tmp_path)}
    up = kgo("dev", "up", env=env)
    assert up.code == 0, up.stderr
    exports = parse_exports(up.stdout)
    try:
        assert set(exports) == MEMBER_ENVIRONMENT
        assert exports["KGO_GROUP_ID"] == "shop.orders"
        assert exports["KGO_TOPICS"] == "orders"
        # What it started, on stderr, so that `eval "$(kgo dev up)"` sees only the exports.
        assert up.stderr.splitlines()[0].startswith(
            f"kgo dev: broker on {exports['KAFKA_BOOTSTRAP_SERVERS']}, coordinator on "
            f"{exports['KGO_COORDINATOR_URL']}"
        )
        # The token is the group's: the coordinator answers with it, and refuses without it.
        with_token = client.CoordinatorClient(
            exports["KGO_COORDINATOR_URL"], "shop.orders", exports["KGO_GROUP_TOKEN"]
        )
        assert with_token.describe()["groupId"] == "shop.orders"
        with_token.close()
        assert json.loads((tmp_path / "tokens.json").read_text()) == {
            "shop.orders": exports["KGO_GROUP_TOKEN"]
        }

        again = kgo("dev", "up", env=env)
        assert again.code == 0
        assert parse_exports(again.stdout) == exports
        assert again.stderr.startswith("kgo dev: already up: broker ")
        assert len(again.stderr.splitlines()) == 1

        printed = kgo("dev", "env", env=env)
        assert (printed.code, parse_exports(printed.stdout)) == (0, exports)
        state = json.loads((tmp_path / "dev.json").read_text())
    finally:
        down = kgo("dev", "down", env=env)
    assert down.code == 0
    assert down.stderr == (
        f"kgo dev: stopped the coordinator (pid {state['coordinator']['pid']}) and the broker "
        f"(pid {state['broker']['pid']})\n"
    )
    for part, marker in dev.PARTS.items():
        assert not dev.running(state[part]["pid"], marker), part
    assert not (tmp_path / "dev.json").exists()

    down_again = kgo("dev", "down", env=env)
    assert (down_again.code, down_again.stderr) == (
        0,
        f"kgo dev: nothing to stop (no {tmp_path / 'dev.json'})\n",
    )
    not_up = kgo("dev", "env", env=env)
    assert (not_up.code, not_up.stdout, not_up.stderr) == (
        1,
        "",
        "kgo dev env: not up: run 'kgo dev up'\n",
    )


def test_a_half_down_setup_is_stopped_and_started_again(tmp_path: Path) -> None:
    env = {"KGO_DEV_DIR": str(tmp_path)}
    first = kgo("dev", "up", env=env)
    assert first.code == 0, first.stderr
    state = json.loads((tmp_path / "dev.json").read_text())
    try:
        dev.stop(state["coordinator"]["pid"], dev.PARTS["coordinator"])
        second = kgo("dev", "up", env=env)
        assert second.code == 0, second.stderr
        assert second.stderr.splitlines()[0] == (
            "kgo dev: the last setup is half down (coordinator not running); starting again"
        )
        assert not dev.running(state["broker"]["pid"], dev.PARTS["broker"])
        assert (
            parse_exports(second.stdout)["KGO_GROUP_TOKEN"]
            != (parse_exports(first.stdout)["KGO_GROUP_TOKEN"])
        )
    finally:
        assert kgo("dev", "down", env=env).code == 0


def test_up_while_up_with_another_setup_is_refused_and_an_empty_name_too(tmp_path: Path) -> None:
    env = {"KGO_DEV_DIR": str(tmp_path)}
    empty = kgo("dev", "up", "--group", "", env=env)
    assert (empty.code, empty.stdout, empty.stderr) == (
        2,
        "",
        "kgo dev up: --group must not be empty\n",
    )
    assert not (tmp_path / "dev.json").exists()
    up = kgo("dev", "up", env=env)
    assert up.code == 0, up.stderr
    try:
        other = kgo("dev", "up", "--group", "billing", "--topic", "orders", env=env)
        assert (other.code, other.stdout, other.stderr) == (
            1,
            "",
            "kgo dev up: already up with group shop.orders, not --group billing: 'kgo dev "
            "down' first to start another setup\n",
        )
        same = kgo("dev", "up", "--group", "shop.orders", env=env)
        assert (same.code, parse_exports(same.stdout)) == (0, parse_exports(up.stdout))
    finally:
        assert kgo("dev", "down", env=env).code == 0


def _started_broker(directory: Path, process: subprocess.Popen[str]) -> int:
    """The broker's pid, once ``kgo dev up`` has recorded it."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the broker was never recorded"
        assert process.poll() is None, process.communicate()
        with contextlib.suppress(OSError, ValueError, KeyError):
            pid: int = json.loads((directory / "dev.json").read_text())["broker"]["pid"]
            return pid
        time.sleep(0.02)


def _up(directory: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kafka_group_operator", "dev", "up"],
        env={**os.environ, "KGO_DEV_DIR": str(directory)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ctrl_c_during_up_leaves_nothing_behind(tmp_path: Path) -> None:
    process = _up(tmp_path)
    broker = _started_broker(tmp_path, process)
    process.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
    stdout, stderr = process.communicate(timeout=60)
    assert (process.returncode, stdout, stderr) == (
        130,
        "",
        "kgo dev up: interrupted: stopped what had started\n",
    )
    assert not dev.running(broker, dev.PARTS["broker"])
    assert not (tmp_path / "dev.json").exists()


def test_down_stops_what_a_killed_up_had_started(tmp_path: Path) -> None:
    process = _up(tmp_path)
    broker = _started_broker(tmp_path, process)
    process.kill()  # no chance to clean up
    process.communicate()
    assert dev.running(broker, dev.PARTS["broker"])
    down = kgo("dev", "down", env={"KGO_DEV_DIR": str(tmp_path)})
    assert (down.code, down.stderr) == (0, f"kgo dev: stopped the broker (pid {broker})\n")
    assert not dev.running(broker, dev.PARTS["broker"])


def test_running_refuses_a_pid_that_is_not_the_process_started(tmp_path: Path) -> None:
    # This test process is alive but is not a broker: its pid must never be signalled.
    assert not dev.running(os.getpid(), "tansu")
    assert dev.running(os.getpid(), "python")


def test_up_with_apache_kafka_and_down(tmp_path: Path) -> None:
    """``--broker kafka``: an Apache Kafka node carries the topic, the group's coordinator
    answers, and ``down`` stops the JVM it started."""
    env = {"KGO_DEV_DIR": str(tmp_path)}
    up = kgo("dev", "up", "--broker", "kafka", "--messages", "60", env=env, timeout=300)
    assert up.code == 0, up.stderr
    exports = parse_exports(up.stdout)
    state = json.loads((tmp_path / "dev.json").read_text())
    try:
        assert state["broker"]["kind"] == "kafka"
        started = f"kgo dev: Apache Kafka broker on {exports['KAFKA_BOOTSTRAP_SERVERS']}, "
        assert any(line.startswith(started) for line in up.stderr.splitlines()), up.stderr
        assert dev.running(state["broker"]["pid"], "kafka.Kafka")
        assert not dev.running(state["broker"]["pid"], "tansu")
        admin = AdminClient({"bootstrap.servers": exports["KAFKA_BOOTSTRAP_SERVERS"]})
        described = admin.describe_cluster().result(10)
        # A KRaft cluster id from the log folder `up` formatted.
        meta = (tmp_path / "kafka" / "node-1" / "data" / "meta.properties").read_text()
        assert f"cluster.id={described.cluster_id}" in meta.splitlines()
        consumer = Consumer(
            {"bootstrap.servers": exports["KAFKA_BOOTSTRAP_SERVERS"], "group.id": "ends"}
        )
        try:
            ends = [
                consumer.get_watermark_offsets(TopicPartition("orders", p), timeout=10)[1]
                for p in range(6)
            ]
        finally:
            consumer.close()
        assert ends == [10] * 6
        watcher = client.CoordinatorClient(
            exports["KGO_COORDINATOR_URL"], "shop.orders", exports["KGO_GROUP_TOKEN"]
        )
        assert watcher.describe()["groupId"] == "shop.orders"
        watcher.close()
    finally:
        down = kgo("dev", "down", env=env)
    assert down.code == 0, down.stderr
    assert not dev.running(state["broker"]["pid"], "kafka.Kafka")
