"""A ``kgo coordinator`` and ``kgo gateway`` as real processes, and a canary group that keeps
committing through them: what the hostile-frame tests and the fuzzer attack.

Each process writes its log to a file (``Served.log``), so that a test can read what it said
about each connection, and its memory is read from /proc (``rss_mb``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.offset_commit.v2.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.static.primitive import i64Timedelta

from kafka_group_operator.wire import framing, layout
from tests.cli.conftest import ROOT
from tests.protocol import frames
from tests.protocol.wire import Connection

CANARY, CANARY_TOKEN = "canary", "canary-token"
TENANT, TENANT_TOKEN = "tenant", "tenant-token"
FUZZ, FUZZ_TOKEN = "fuzz", "fuzz-token"
TOKENS = {CANARY: CANARY_TOKEN, TENANT: TENANT_TOKEN, FUZZ: FUZZ_TOKEN}
# The gateway's settings come from the environment in a pod; none may leak into these runs.
_GATEWAY_ENV = (
    "KGO_UPSTREAM_BOOTSTRAP_SERVERS",
    "KGO_COORDINATOR_KAFKA_ADDRESS",
    "KGO_GROUP_ID",
    "KGO_GROUP_TOKEN",
    "KGO_KAFKA_CONFIG_DIR",
    "KGO_COORDINATOR_CA_FILE",
    "KGO_GATEWAY_PORT",
)


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    from kafka_group_operator.embedded import broker as embedded

    return embedded.free_port()


def _start(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kafka_group_operator", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )


async def _until(condition: Callable[[], bool], what: str, served: Served, bound: float) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert served.alive(), f"{what} exited ({served.process.returncode}): {served.log_text()}"
        assert time.monotonic() < deadline, f"{what}: not within {bound} s"
        await asyncio.sleep(0.1)


async def coordinator(
    bootstrap: str, directory: Path, *options: str, tokens: bool = True
) -> Served:
    """``kgo coordinator`` with a Kafka listener, requiring the ``TOKENS`` (unless not
    ``tokens``: every group open); once it is ready."""
    if tokens:
        tokens_file = directory / "tokens.json"
        tokens_file.write_text(json.dumps(TOKENS))
        options = ("--tokens", str(tokens_file), *options)
    port = free_port()
    log = directory / f"coordinator-{port}.log"
    process = _start(
        [
            "coordinator", "--bootstrap", bootstrap, "--port", str(free_port()),
            "--kafka-port", str(port),
            "--topic", f"hostile-state-{uuid.uuid4().hex[:8]}", "--state-partitions", "2",
            *options,
        ],
        log,
    )  # fmt: skip
    served = Served(process, port, log)
    await _until(lambda: "ready on" in served.log_text(), "kgo coordinator", served, 120)
    return served


async def gateway(bootstrap: str, listener_port: int, directory: Path) -> Served:
    """``kgo gateway`` for the ``TENANT`` group in front of ``bootstrap`` and the listener."""
    port = free_port()
    log = directory / f"gateway-{port}.log"
    process = _start(
        [
            "gateway", "--bootstrap", bootstrap, "--coordinator", f"127.0.0.1:{listener_port}",
            "--group-id", TENANT, "--token", TENANT_TOKEN, "--port", str(port),
        ],
        log,
        env=dict.fromkeys(_GATEWAY_ENV, ""),
    )  # fmt: skip
    served = Served(process, port, log)

    def listening() -> bool:
        import socket

        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return True
        return False

    await _until(listening, "kgo gateway", served, 60)
    return served


async def authenticated(port: int, group: str, token: str) -> Connection:
    connection = await Connection.open(port)
    handshake = await connection.call(SaslHandshakeRequest(mechanism="PLAIN"))
    assert handshake.error_code == 0
    reply = await connection.call(
        SaslAuthenticateRequest(auth_bytes=b"\0" + group.encode() + b"\0" + token.encode())
    )
    assert reply.error_code == 0, reply
    return connection


def commit(group: str, topic: str, offset: int) -> OffsetCommitRequest:
    """A member-less commit (as an admin tool's) of partition 0 at ``offset``."""
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),
        topics=(
            OffsetCommitRequestTopic(
                name=topic,
                partitions=(
                    OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_metadata=None
                    ),
                ),
            ),
        ),
    )


@dataclass
class Canary:
    """A group committing a growing offset every ``interval_s`` on a connection of its own
    (to the listener, authenticated; or to a gateway, which authenticates for it)."""

    port: int
    topic: str
    group: str = CANARY
    token: str | None = CANARY_TOKEN
    interval_s: float = 0.05
    commits: int = 0
    failures: list[str] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def start(self, bound_s: float = 60) -> None:
        """Commits once (retried until the coordinator knows the topic), then keeps on."""
        deadline = time.monotonic() + bound_s
        connection = await self._connect()
        while True:
            try:
                await self._commit(connection)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self._task = asyncio.create_task(self._run(connection))

    async def _connect(self) -> Connection:
        if self.token is None:
            return await Connection.open(self.port)
        return await authenticated(self.port, self.group, self.token)

    async def _commit(self, connection: Connection) -> None:
        response = await connection.call(commit(self.group, self.topic, self.commits + 1))
        codes = [p.error_code for t in response.topics for p in t.partitions]
        assert codes == [0], f"{self.group}'s commit answered {codes}"
        self.commits += 1

    async def _run(self, connection: Connection) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                await self._commit(connection)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self.failures.append(repr(error))
        finally:
            await connection.close()

    async def still_committing(self, bound_s: float = 30) -> None:
        """The canary commits at least 3 more times within ``bound_s``."""
        assert not self.failures, self.failures
        target = self.commits + 3
        deadline = time.monotonic() + bound_s
        while self.commits < target:
            assert not self.failures, self.failures
            assert time.monotonic() < deadline, f"{self.group} stopped committing"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._task, 10)


def stop_all(served: Iterable[Served]) -> None:
    for each in served:
        each.stop()


# --- an upstream broker that answers with what a test gives it ------------------------


class EvilBroker:
    """Answers each request with the reply body registered for its correlation id."""

    def __init__(self) -> None:
        self.replies: dict[int, bytes] = {}
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (payload := await framing.read_frame(reader)) is not None:
                key, version, correlation = struct.unpack_from(">hhi", payload)
                schema = framing.response_type(key, version)
                body = self.replies.pop(correlation, None)
                if body is None:
                    body = frames.minimal_body(layout.layout(schema))
                writer.write(framing.frame(frames.response_payload(schema, body, correlation)))
                await writer.drain()
        except (ConnectionError, framing.FrameError):
            pass
        finally:
            writer.close()


# --- everything at once ----------------------------------------------------------------


@dataclass
class Stack:
    coordinator: Served
    gateway: Served  # in front of the embedded broker, for the TENANT group
    evil_gateway: Served  # in front of the EvilBroker
    evil: EvilBroker
    canary: Canary  # commits straight to the listener
    gateway_canary: Canary  # commits through the gateway

    async def still_serving(self) -> None:
        """Every process alive, no traceback logged, and both canaries still committing."""
        processes = (self.coordinator, self.gateway, self.evil_gateway)
        for process in processes:
            assert process.alive(), process.log_text()[-3000:]
        await self.canary.still_committing()
        await self.gateway_canary.still_committing()
        for process in processes:
            text = process.log_text()
            at = text.find("Traceback")
            assert at < 0, text[max(0, at - 500) : at + 4000]


@contextlib.asynccontextmanager
async def running_stack(bootstrap: str, topic: str, directory: Path) -> AsyncIterator[Stack]:
    """A coordinator, a gateway in front of ``bootstrap`` and one in front of an EvilBroker,
    with canaries committing to ``topic``'s partition 0."""
    evil = EvilBroker()
    await evil.start()
    started: list[Served] = []
    try:
        coordinator_ = await coordinator(bootstrap, directory)
        started.append(coordinator_)
        gateway_ = await gateway(bootstrap, coordinator_.port, directory)
        started.append(gateway_)
        evil_gateway = await gateway(f"127.0.0.1:{evil.port}", coordinator_.port, directory)
        started.append(evil_gateway)
        canary = Canary(coordinator_.port, topic)
        await canary.start()
        gateway_canary = Canary(gateway_.port, topic, TENANT, token=None)
        await gateway_canary.start()
        try:
            yield Stack(coordinator_, gateway_, evil_gateway, evil, canary, gateway_canary)
        finally:
            await canary.stop()
            await gateway_canary.stop()
    finally:
        stop_all(started)
        await evil.stop()
