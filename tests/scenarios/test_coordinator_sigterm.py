"""Real processes: a standalone ``kgo coordinator`` stops on SIGTERM within its documented
grace period (``commands.coordinator.STOP_GRACE_S``), with traffic running: commits over
the member API, a Kafka client pipelining requests without reading a reply, an HTTP client
doing the same, and, in one case, brokers that are gone. It once took more than 8 s; with
clients that read nothing it never ended (each one's close waited for its unread replies).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_group_operator.commands import coordinator as coordinator_command
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import client

pytestmark = [pytest.mark.slow, pytest.mark.broker]

GROUPS = [f"sigterm-{n}" for n in range(4)]


class Coordinator:
    def __init__(self, bootstrap: str, directory: Path) -> None:
        self.port, self.kafka_port = embedded.free_port(), embedded.free_port()
        self.log = directory / "coordinator.log"
        (directory / "groups.json").write_text(
            json.dumps({g: {"topics": ["orders"]} for g in GROUPS})
        )
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "kafka_group_operator", "coordinator",
                "--bootstrap", bootstrap, "--port", str(self.port),
                "--kafka-port", str(self.kafka_port),
                "--topic", f"sigterm-state-{uuid.uuid4().hex[:8]}", "--state-partitions", "4",
                "--groups", str(directory / "groups.json"),
            ],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait_for(self, line: bytes, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.log.read_bytes():
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"no {line!r} after {timeout} s"
            time.sleep(0.05)

    def sigterm(self) -> float:
        """Seconds from SIGTERM to the process's end (killed after twice the grace)."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(2 * coordinator_command.STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return time.monotonic() - started


@contextlib.contextmanager
def commits(port: int) -> Iterator[list[int]]:
    """Member-less commits to every group in a loop; yields the count acknowledged."""
    acknowledged = [0]
    stop = threading.Event()

    def loop(group: str) -> None:
        each = client.CoordinatorClient(f"http://127.0.0.1:{port}", group, timeout_s=5)
        offset = 0
        while not stop.is_set():
            offset += 1
            try:
                each.commit("", messages.LEAVE_EPOCH, {("orders", 0): offset})
                acknowledged[0] += 1
            except (errors.CoordinatorError, OSError):
                stop.wait(0.05)
        each.close()

    threads = [threading.Thread(target=loop, args=(group,), daemon=True) for group in GROUPS]
    for thread in threads:
        thread.start()
    try:
        yield acknowledged
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def non_reading(port: int, request: bytes) -> socket.socket:
    """A connection that pipelines ``request`` until the server stops taking it, and reads
    nothing."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        for _ in range(100_000):
            sock.send(request)
    return sock


def api_versions_frame() -> bytes:
    # ApiVersions v0, header v1 with client id "stall".
    body = struct.pack(">hhih", 18, 0, 1, 5) + b"stall"
    return struct.pack(">i", len(body)) + body


HTTP_REQUEST = b"GET /openapi.json HTTP/1.1\r\nHost: coordinator\r\n\r\n"


def test_sigterm_with_traffic_and_clients_that_read_nothing(
    broker: embedded.EmbeddedBroker, tmp_path: Path
) -> None:
    coordinator = Coordinator(broker.bootstrap, tmp_path)
    try:
        coordinator.wait_for(b"ready on")
        with commits(coordinator.port) as acknowledged:
            deadline = time.monotonic() + 60
            while acknowledged[0] < 50:
                assert time.monotonic() < deadline, "no commits acknowledged"
                time.sleep(0.05)
            stalled = [
                non_reading(coordinator.kafka_port, api_versions_frame()) for _ in range(3)
            ] + [non_reading(coordinator.port, HTTP_REQUEST) for _ in range(3)]
            took = coordinator.sigterm()
            for sock in stalled:
                sock.close()
    finally:
        if coordinator.process.poll() is None:
            coordinator.process.kill()
    assert coordinator.process.returncode == 0, coordinator.log.read_text()[-3000:]
    assert took <= coordinator_command.STOP_GRACE_S, (took, coordinator.log.read_text()[-3000:])


def test_sigterm_while_loading(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    coordinator = Coordinator(broker.bootstrap, tmp_path)
    try:
        coordinator.wait_for(b"member API on")
        took = coordinator.sigterm()
    finally:
        if coordinator.process.poll() is None:
            coordinator.process.kill()
    assert coordinator.process.returncode == 0, coordinator.log.read_text()[-3000:]
    assert took <= coordinator_command.STOP_GRACE_S, took


def test_sigterm_with_the_brokers_gone(tmp_path: Path) -> None:
    with embedded.running_broker() as own:
        coordinator = Coordinator(own.bootstrap, tmp_path)
        try:
            coordinator.wait_for(b"ready on")
            with commits(coordinator.port) as acknowledged:
                deadline = time.monotonic() + 60
                while acknowledged[0] < 50:
                    assert time.monotonic() < deadline, "no commits acknowledged"
                    time.sleep(0.05)
                own.stop()  # commits now wait for brokers that never answer
                time.sleep(1)
                took = coordinator.sigterm()
        finally:
            if coordinator.process.poll() is None:
                coordinator.process.kill()
    assert coordinator.process.returncode == 0, coordinator.log.read_text()[-3000:]
    assert took <= coordinator_command.STOP_GRACE_S, (took, coordinator.log.read_text()[-3000:])
