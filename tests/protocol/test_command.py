"""``kgo coordinator --kafka-port``: the standalone coordinator also serves the Kafka
protocol, with its ``--tokens`` as SASL/PLAIN passwords; wrong options are one line."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
from pathlib import Path

import pytest
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest

from kafka_group_operator.embedded import broker as embedded
from tests.cli.conftest import ROOT, kgo
from tests.protocol.test_listener import GROUP_AUTHORIZATION_FAILED, authenticated

pytestmark = [pytest.mark.broker]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("event_loop", "loop_class"),
    [
        pytest.param("uvloop", b"uvloop.Loop", id="uvloop"),
        pytest.param("asyncio", b"asyncio.", id="asyncio"),
    ],
)
async def test_kgo_coordinator_serves_the_kafka_protocol(
    broker: embedded.EmbeddedBroker, tmp_path: Path, event_loop: str, loop_class: bytes
) -> None:
    """On uvloop's event loop (the default) and on asyncio's own (``--event-loop``)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"orders": "s3cret"}))
    api_port, kafka_port = embedded.free_port(), embedded.free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kafka_group_operator", "coordinator",
        "--bootstrap", broker.bootstrap, "--port", str(api_port),
        "--kafka-port", str(kafka_port), "--tokens", str(tokens),
        "--topic", f"cmd-state-{uuid.uuid4().hex[:8]}", "--state-partitions", "2",
        *(["--event-loop", event_loop] if event_loop != "uvloop" else []),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        loops = []
        while True:
            line = await asyncio.wait_for(process.stdout.readline(), 120)
            assert line, "kgo coordinator exited before it was ready"
            if b"event loop: " in line:
                loops.append(line.split(b"event loop: ", 1)[1].strip())
            if line.startswith(b"ready on"):
                break
        assert len(loops) == 1, loops
        assert loops[0].startswith(loop_class), loops
        connection = await authenticated(kafka_port, "orders", "s3cret")
        try:
            found = await connection.call(
                FindCoordinatorRequest(key_type=0, coordinator_keys=("orders", "other"))
            )
            assert [(c.key, c.error_code, c.port) for c in found.coordinators] == [
                ("orders", 0, kafka_port),
                ("other", GROUP_AUTHORIZATION_FAILED, -1),
            ]
        finally:
            await connection.close()
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--kafka-port", "70000"],
            "kgo coordinator: --kafka-port must be between 0 and 65535, not 70000",
        ),
        (
            ["--kafka-max-connections", "0"],
            "kgo coordinator: --kafka-max-connections must be at least 1, not 0",
        ),
        (
            ["--kafka-tls-cert", "c.pem"],
            "kgo coordinator: --kafka-tls-cert and --kafka-tls-key go together",
        ),
        (
            ["--kafka-tls-cert", "missing.pem", "--kafka-tls-key", "missing.key"],
            "kgo coordinator: --kafka-tls-cert: missing.pem is not a readable file",
        ),
        (
            ["--event-loop", "trio"],
            "kgo coordinator: argument --event-loop: invalid choice: 'trio' (choose from "
            "'uvloop', 'asyncio') (see 'kgo coordinator --help')",
        ),
    ],
)
def test_wrong_listener_options_are_one_line(options: list[str], message: str) -> None:
    run = kgo("coordinator", "--bootstrap", "127.0.0.1:1", *options)
    assert run.code == 2
    assert run.stderr.strip() == message
