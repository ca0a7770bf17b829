"""One Apache Kafka 4.4 node (KRaft, broker and controller) on loopback, for the Java clients.

The Java clients of kafka-clients 4.4 open connections with ApiVersions v5, which tansu (the
embedded broker) cannot read: it closes them. These tests run on Kafka itself, from the jars
``java.classpath()`` fetches (kafka_2.13 among them): the log folder formatted with Kafka's
StorageTool, then ``kafka.Kafka`` with a small heap.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka_group_operator.embedded.broker import free_port
from tests.support import java


def _properties(port: int, controller_port: int, data: Path) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "log.dirs": str(data),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "3",
        "share.coordinator.state.topic.replication.factor": "1",
        "group.initial.rebalance.delay.ms": "0",
        # One node fencing itself (its controller starved of CPU) takes every partition down.
        "broker.session.timeout.ms": "60000",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


@contextmanager
def running_kafka(timeout_s: float = 120.0) -> Iterator[str]:
    """A started node; yields its bootstrap address. Stopped (killed) on exit."""
    directory = Path(tempfile.mkdtemp(prefix="kafka-node-"))
    port, controller_port = free_port(), free_port()
    config = directory / "server.properties"
    config.write_text(_properties(port, controller_port, directory / "data"))
    (directory / "log4j2.properties").write_text(
        "rootLogger.level = WARN\nrootLogger.appenderRef.file.ref = FILE\n"
        f"appender.file.type = File\nappender.file.name = FILE\n"
        f"appender.file.fileName = {directory / 'server.log'}\n"
        "appender.file.layout.type = PatternLayout\n"
        "appender.file.layout.pattern = %d %p %c %m%n\n"
    )
    cluster_id = uuid.uuid4().hex[:22]
    subprocess.run(
        java.command(
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(config),
            "--standalone",
            heap_mb=128,
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    command = java.command("kafka.Kafka", str(config), heap_mb=512)
    command.insert(1, f"-Dlog4j2.configurationFile={directory / 'log4j2.properties'}")
    with (directory / "stdout.log").open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    bootstrap = f"127.0.0.1:{port}"
    try:
        _wait_ready(bootstrap, process, timeout_s)
        yield bootstrap
    finally:
        process.kill()
        process.wait(30)
        shutil.rmtree(directory, ignore_errors=True)


def _wait_ready(bootstrap: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Kafka exited with {process.returncode}")
        try:
            metadata = admin.list_topics(timeout=2)
        except Exception:
            time.sleep(0.2)
            continue
        if metadata.brokers:
            return
    raise RuntimeError(f"Kafka at {bootstrap} was not ready within {timeout_s} s")
