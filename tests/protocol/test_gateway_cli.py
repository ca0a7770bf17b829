"""``kgo gateway`` as a process: a wrong invocation is one line and exit 2; a running gateway
serves kafka-python (metadata and fetches) and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import listener as protocol_listener
from tests.cli.conftest import ROOT, kgo
from tests.protocol import test_gateway
from tests.support import processes, topics

# The gateway's settings come from the environment in a pod; none may leak into these runs.
CLEAN = {
    name: ""
    for name in (
        "KGO_UPSTREAM_BOOTSTRAP_SERVERS",
        "KGO_COORDINATOR_KAFKA_ADDRESS",
        "KGO_GROUP_ID",
        "KGO_GROUP_TOKEN",
        "KGO_KAFKA_CONFIG_DIR",
        "KGO_COORDINATOR_CA_FILE",
        "KGO_GATEWAY_PORT",
        "KGO_GATEWAY_MAX_CONNECTIONS",
    )
}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--bootstrap is required"),
        (["--bootstrap", "k:1"], "--coordinator is required"),
        (["--bootstrap", "k", "--coordinator", "c:1"], "--bootstrap: 'k' is not host:port"),
        (["--bootstrap", "k:1", "--coordinator", "c:1,d:2"], "--coordinator takes one"),
        (["--bootstrap", "k:1", "--coordinator", "c:1", "--group-id", "g"], "go together"),
        (
            ["--bootstrap", "k:1", "--coordinator", "c:1", "--kafka-config-dir", "{sasl}"],
            "--kafka-config-dir: sasl.mechanism 'GSSAPI' is not supported",
        ),
        (
            ["--bootstrap", "k:1", "--coordinator", "c:1", "--coordinator-ca", "/nonexistent"],
            "--coordinator-ca: ",
        ),
        (
            ["--bootstrap", "k:1", "--coordinator", "c:1", "--max-connections", "0"],
            "--max-connections must be at least 1",
        ),
    ],
)
def test_wrong_invocations_are_one_line(argv: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "security.protocol").write_text("SASL_SSL\n")
    argv = [arg.replace("{sasl}", str(tmp_path)) for arg in argv]
    run = kgo("gateway", *argv, env=CLEAN)
    assert run.code == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("kgo gateway: ")
    assert message in lines[0]


def test_a_port_in_use_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = kgo(
            "gateway", "--bootstrap", "k:1", "--coordinator", "c:1", "--port", str(port), env=CLEAN
        )
    assert run.code == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"kgo gateway: cannot listen on 127.0.0.1:{port}")


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="package")
async def test_gateway_process_serves_and_stops_on_sigterm(
    broker: embedded.EmbeddedBroker, open_listener: protocol_listener.Listener
) -> None:
    topic = topics.create_topic(
        broker.bootstrap, test_gateway.PARTITIONS, test_gateway.PER_PARTITION
    )
    port = embedded.free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kafka_group_operator",
        "gateway",
        "--bootstrap",
        broker.bootstrap,
        "--coordinator",
        f"127.0.0.1:{open_listener.port}",
        "--port",
        str(port),
        cwd=ROOT,
        env={**os.environ, **CLEAN},
        stderr=subprocess.PIPE,
    )
    try:
        await processes.until_accepting(port, process, "kgo gateway")
        records = await asyncio.to_thread(test_gateway.kafka_python_fetch, port, topic)
        assert len(records) == test_gateway.PARTITIONS * test_gateway.PER_PARTITION
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
        assert process.stderr is not None
        stderr = (await process.stderr.read()).decode()
        assert code == 0, stderr
        assert "Traceback" not in stderr
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
