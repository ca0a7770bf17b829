"""``kgo coordinator --groups``: the offset mirror's settings per group, as ``spec.offsets``
has them (``mirrorToKafka`` on by default, ``mirrorIntervalSeconds`` 5), read from the file
and honoured by a running process."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kafka_group_operator.commands import coordinator
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import client
from tests.cli.conftest import ROOT, kgo
from tests.runtime import logs
from tests.support import topics


def _groups_file(tmp_path: Path, groups: dict[str, dict[str, object]]) -> Path:
    path = tmp_path / "groups.json"
    path.write_text(json.dumps(groups))
    return path


def test_every_group_of_the_file_is_mirrored_every_5_seconds_unless_it_says_otherwise(
    tmp_path: Path,
) -> None:
    path = _groups_file(
        tmp_path,
        {
            "plain": {"topics": ["orders"]},
            "often": {"mirrorIntervalSeconds": 1, "mirrorToKafka": True},
            "off": {"mirrorToKafka": False, "mirrorIntervalSeconds": 60},
        },
    )
    assert coordinator.read_mirror_intervals(path) == {"plain": 5, "often": 1, "off": None}
    # The mirror's fields are not group settings of the coordinator's state.
    settings = {s.group_id: s for s in coordinator.read_group_settings(path)}
    assert settings["plain"].topics == ("orders",)
    assert set(settings) == {"plain", "often", "off"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mirrorToKafka": "yes"}, "mirrorToKafka of group 'g' must be true or false"),
        (
            {"mirrorIntervalSeconds": 0},
            "mirrorIntervalSeconds of group 'g' must be a whole number of seconds from 1 to "
            "3600, not 0",
        ),
        (
            {"mirrorIntervalSeconds": 2.5},
            "mirrorIntervalSeconds of group 'g' must be a whole number of seconds from 1 to "
            "3600, not 2.5",
        ),
        (
            {"mirrorIntervalSeconds": True},
            "mirrorIntervalSeconds of group 'g' must be a whole number of seconds from 1 to "
            "3600, not True",
        ),
        (
            {"mirrorIntervalSeconds": 3601},
            "mirrorIntervalSeconds of group 'g' must be a whole number of seconds from 1 to "
            "3600, not 3601",
        ),
    ],
)
def test_a_wrong_mirror_setting_is_one_line_and_exit_2(
    fields: dict[str, object], message: str, tmp_path: Path
) -> None:
    path = _groups_file(tmp_path, {"g": fields})
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        coordinator.read_mirror_intervals(path)
    if fields == {"mirrorIntervalSeconds": 0}:  # one process run is enough for the CLI's path
        run = kgo("coordinator", "--bootstrap", "127.0.0.1:1", "--groups", str(path))
        assert (run.code, run.stdout) == (2, "")
        assert run.stderr.splitlines() == [f"kgo coordinator: {message}"]


def _native_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The brokers' own group's committed offsets (OffsetFetch by a consumer that never joins)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        answered = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=10
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in answered if tp.offset >= 0}


@pytest.mark.broker
def test_a_running_coordinator_mirrors_the_groups_of_its_file_into_the_brokers(
    broker: embedded.EmbeddedBroker, tmp_path: Path
) -> None:
    topic = topics.create_topic(broker.bootstrap, 3, messages_per_partition=20)
    suffix = uuid.uuid4().hex[:8]
    mirrored, unmirrored = f"mirrored-{suffix}", f"unmirrored-{suffix}"
    groups = _groups_file(
        tmp_path,
        {
            mirrored: {"topics": [topic], "mirrorIntervalSeconds": 1},
            unmirrored: {"topics": [topic], "mirrorToKafka": False, "mirrorIntervalSeconds": 1},
        },
    )
    api_port, metrics_port = embedded.free_port(), embedded.free_port()
    argv = [
        *("coordinator", "--bootstrap", broker.bootstrap, "--topic", logs.unique_topic()),
        *("--state-partitions", "2", "--port", str(api_port), "--groups", str(groups)),
        *("--metrics-port", str(metrics_port)),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "kafka_group_operator", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("ready on http://127.0.0.1:")
        committed = {0: 7, 1: 20, 2: 3}
        for group in (mirrored, unmirrored):
            with contextlib.closing(
                client.CoordinatorClient(f"http://127.0.0.1:{api_port}", group)
            ) as api:
                # An administrative commit (no member): the groups are empty.
                assert api.commit("", -1, {(topic, p): o for p, o in committed.items()}) == {}

        deadline = time.monotonic() + 30
        while _native_offsets(broker.bootstrap, mirrored, topic, 3) != committed:
            assert time.monotonic() < deadline, "the native group never got the offsets"
            time.sleep(0.3)
        # Mirrored every second: by now, the group with the mirror off would have been too.
        time.sleep(2)
        assert _native_offsets(broker.bootstrap, unmirrored, topic, 3) == {}

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            text = response.read().decode()
        families = {family.name: family for family in text_string_to_metric_families(text)}
        states = {
            (sample.labels["group"], sample.labels["reason"]): sample.value
            for sample in families["kgo_offsets_mirrored"].samples
        }
        assert states == {(mirrored, "CaughtUp"): 1.0}
    finally:
        process.terminate()
        assert process.wait(30) == 0
