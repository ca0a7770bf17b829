"""``kgo coordinator --metrics-port``: a running process serves ``/metrics``; a wrong port is
one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kafka_group_operator.embedded import broker as embedded
from tests.cli.conftest import ROOT, kgo
from tests.runtime import logs


def test_a_metrics_port_out_of_range_is_one_line_and_exit_2() -> None:
    run = kgo("coordinator", "--bootstrap", "127.0.0.1:1", "--metrics-port", "70000")
    assert run.code == 2
    assert run.stderr.strip().splitlines() == [
        "kgo coordinator: --metrics-port must be between 0 and 65535, not 70000"
    ]


@pytest.mark.broker
def test_a_running_coordinator_serves_metrics_with_its_cluster_name(
    broker: embedded.EmbeddedBroker,
) -> None:
    api_port, metrics_port = embedded.free_port(), embedded.free_port()
    argv = [
        *("coordinator", "--bootstrap", broker.bootstrap, "--topic", logs.unique_topic()),
        *("--state-partitions", "2", "--port", str(api_port)),
        *("--metrics-port", str(metrics_port), "--cluster-name", "east"),
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
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                text = response.read().decode()
            families = {family.name: family for family in text_string_to_metric_families(text)}
            partitions = {
                sample.labels["state"]: sample.value
                for sample in families["kgo_state_partitions"].samples
            }
            if partitions == {"active": 2} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert partitions == {"active": 2}
        for name in ("kgo_heartbeats", "kgo_offset_commits", "kafka_consumergroup_group_lag"):
            assert name in families
    finally:
        process.terminate()
        assert process.wait(30) == 0
