"""The gateway is no proxy to anywhere: a client cannot make it connect, or send the brokers'
credentials, to an address of the client's choice.

The attack: on a broker port, a client pipelines a FindCoordinator v4 whose key is crafted
to read as a Metadata v9 reply naming an "attacker" address, plus a Metadata request with the
same correlation id. A gateway that matches replies to requests by correlation id reads the
broker's echo of the key as the Metadata reply, opens a broker port for the attacker's
"broker" and, once the client connects there, authenticates to it with the brokers'
credentials. Replies are matched in request order instead (a reused outstanding correlation
id closes the connection), rewritten replies are read whole, and broker ports only open for
brokers the gateway's own Metadata requests to the bootstrap servers name.

The brokers here are real (tansu) behind a secured front of the test's own: TLS and SASL
(PLAIN, SCRAM) as a Kafka broker's listener runs them, then the connection relayed byte for
byte to a tansu that advertises the front's address (tansu speaks neither TLS nor SASL). The
attacker is a listener on another loopback port recording whatever reaches it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import random
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import scramp  # type: ignore[import-untyped]
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v9.request import MetadataRequest
from kio.schema.metadata.v9.response import MetadataResponse, MetadataResponseBroker
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i32

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_operator.wire import framing
from tests.protocol.test_listener import api_versions_v3, self_signed

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

USER, PASSWORD = "app", "pencil-7f3a9c"
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


# --- a secured broker: TLS and SASL in front of a tansu of its own ------------------------


class SecuredFront:
    """TLS (a server context) and SASL (PLAIN or SCRAM-SHA-*) in front of ``upstream``; once
    authenticated, a connection is relayed byte for byte."""

    def __init__(self, tls: ssl.SSLContext | None, mechanism: str | None) -> None:
        self.tls, self.mechanism = tls, mechanism
        self.upstream: tuple[str, int] = ("127.0.0.1", 0)
        self.authenticated = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.sleep(0.1)  # the sockets' closes run

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.mechanism is None or await self._authenticate(reader, writer):
                await self._relay(reader, writer)
        except (OSError, asyncio.IncompleteReadError, framing.FrameError, ssl.SSLError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Kafka's SASL exchange (KIP-152): SaslHandshake, then SaslAuthenticate rounds."""
        mechanism = scramp.ScramMechanism(self.mechanism) if self.mechanism != "PLAIN" else None
        info = mechanism.make_auth_info(PASSWORD) if mechanism is not None else None
        server: Any = None
        while (payload := await framing.read_frame(reader)) is not None:
            header, request = framing.read_request(payload)
            schema = framing.response_type(header.api_key, header.api_version)
            done = False
            if header.api_key == SASL_HANDSHAKE:
                ok = request.mechanism == self.mechanism
                body = schema(
                    error_code=ErrorCode.none if ok else ErrorCode.unsupported_sasl_mechanism,
                    mechanisms=(self.mechanism,),
                )
                if mechanism is not None:
                    server = mechanism.make_server(lambda user: info if user == USER else None)
            elif header.api_key == SASL_AUTHENTICATE:
                message, error = bytes(request.auth_bytes), ErrorCode.none
                reply = b""
                if server is None:
                    done = message == f"\0{USER}\0{PASSWORD}".encode()
                    error = ErrorCode.none if done else ErrorCode.sasl_authentication_failed
                else:
                    try:
                        if server.stage is None:
                            server.set_client_first(message.decode())
                            reply = server.get_server_first().encode()
                        else:
                            server.set_client_final(message.decode())
                            reply = server.get_server_final().encode()
                            done = True
                    except (scramp.ScramException, TypeError):
                        error = ErrorCode.sasl_authentication_failed
                body = schema(
                    error_code=error,
                    error_message=None if error == ErrorCode.none else "Authentication failed",
                    auth_bytes=reply,
                    session_lifetime=datetime.timedelta(0),
                )
            else:
                return False  # nothing before authentication, as a broker's SASL listener
            writer.write(
                framing.encode_response(
                    header.api_key, header.api_version, header.correlation_id, body
                )
            )
            await writer.drain()
            if done:
                self.authenticated += 1
                return True
        return False

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(1 << 16):
                sink.write(data)
                await sink.drain()

        pumps = [
            asyncio.ensure_future(pump(reader, up_writer)),
            asyncio.ensure_future(pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for each in pumps:
                each.cancel()
            up_writer.close()
            await asyncio.gather(*pumps, return_exceptions=True)


@contextlib.contextmanager
def tansu_advertising(port: int) -> Iterator[tuple[str, int]]:
    """A tansu of its own on a free port that advertises 127.0.0.1:``port`` (the front's)."""
    own = embedded.free_port()
    process = subprocess.Popen(
        [
            str(embedded.tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{own}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{port}",
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(400):
            assert process.poll() is None, "tansu exited"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", own), 0.2):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        yield ("127.0.0.1", own)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclasses.dataclass
class Upstream:
    """A secured broker and the gateway's ``Security`` toward it."""

    address: tuple[str, int]
    security: kafka_connection.Security
    front: SecuredFront
    # The front's TLS server context (the attacker presents the same certificate: one that
    # the gateway's CA file vouches for, for the loopback address it is sent to).
    tls: ssl.SSLContext | None


UPSTREAMS = ["sasl_plaintext-PLAIN", "sasl_plaintext-SCRAM-SHA-512", "ssl", "sasl_ssl-PLAIN"]


@contextlib.asynccontextmanager
async def secured_broker(kind: str, directory: Path) -> AsyncIterator[Upstream]:
    protocol, _, mechanism = kind.partition("-")
    server_tls = client_tls = None
    if protocol in ("ssl", "sasl_ssl"):
        cert, key = self_signed(directory)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        client_tls = kafka_connection.tls_context(str(cert))
    sasl = kafka_connection.Sasl(mechanism, USER, PASSWORD) if mechanism else None
    front = SecuredFront(server_tls, mechanism or None)
    port = await front.start()
    with tansu_advertising(port) as tansu:
        front.upstream = tansu
        security = kafka_connection.Security(client_tls, sasl)
        try:
            yield Upstream(("127.0.0.1", port), security, front, server_tls)
        finally:
            # Its connections closed before the broker stops (tansu waits for them).
            await front.stop()


# --- the attacker -------------------------------------------------------------------------


@dataclasses.dataclass
class Attacker:
    port: int
    connections: int = 0
    received: bytearray = dataclasses.field(default_factory=bytearray)


def ascii_port() -> socket.socket:
    """A listening socket on a port whose two bytes are ASCII, so that the port can travel
    inside a FindCoordinator key (a UTF-8 string)."""
    for _ in range(200):
        port = random.randrange(0x50, 0x80) << 8 | random.randrange(0x21, 0x7F)
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.listen()
        return sock
    raise AssertionError("no free port of ASCII bytes")


@contextlib.asynccontextmanager
async def attacker(tls: ssl.SSLContext | None) -> AsyncIterator[Attacker]:
    """Records every connection and byte (over TLS with ``tls``); says yes to SASL so that a
    PLAIN password comes."""
    sock = ascii_port()
    recorded = Attacker(sock.getsockname()[1])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        recorded.connections += 1
        with contextlib.suppress(Exception):
            while data := await reader.read(1 << 16):
                recorded.received += data
                with contextlib.suppress(Exception):
                    header, request = framing.read_request(data[4:])
                    schema = framing.response_type(header.api_key, header.api_version)
                    if header.api_key == SASL_HANDSHAKE:
                        body = schema(error_code=ErrorCode.none, mechanisms=(request.mechanism,))
                    else:
                        body = schema(
                            error_code=ErrorCode.none,
                            error_message=None,
                            auth_bytes=b"",
                            session_lifetime=datetime.timedelta(0),
                        )
                    writer.write(
                        framing.encode_response(
                            header.api_key, header.api_version, header.correlation_id, body
                        )
                    )
        writer.close()

    server = await asyncio.start_server(serve, sock=sock, ssl=tls)
    try:
        yield recorded
    finally:
        server.close()


def forging_key(target: tuple[str, int]) -> tuple[str, int]:
    """A FindCoordinator key whose v4 reply, read as a Metadata v9 reply, names one broker at
    ``target``; and that broker's node id.

    Both replies are flexible (response header v1), so after the correlation id and the
    header's tags both start with a 4-byte throttle time and a one-element compact array
    (0x02). Metadata's broker then starts with its node id, where FindCoordinator has the
    key's length (one varint byte) and the key's first three bytes: the key is the rest of a
    Metadata body from the node id's second byte on, and the node id's first byte is the key's
    length + 1. The broker's own fields after the key are bytes the Metadata body does not
    reach."""
    template = MetadataResponse(
        throttle_time=datetime.timedelta(0),  # type: ignore[arg-type]
        brokers=(
            MetadataResponseBroker(
                node_id=BrokerId(0x41414141), host=target[0], port=i32(target[1]), rack=None
            ),
        ),
        cluster_id=None,
        controller_id=BrokerId(0),
        topics=(),
        cluster_authorized_operations=i32(0),
    )
    body = framing.encode_response(3, 9, 0, template)[4 + 4 + 1 :]  # size, id, header tags
    assert body[:5] == b"\0\0\0\0\x02"
    rest = body[9:]  # after the node id
    key = b"AAA" + rest
    node_id = int.from_bytes(bytes([len(key) + 1]) + b"AAA", "big")
    return key.decode(), node_id


# --- the gateway --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def gateway_to(upstream: Upstream) -> AsyncIterator[protocol_gateway.Gateway]:
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=(upstream.address,),
            # The attack needs no coordinator listener.
            coordinator=("127.0.0.1", embedded.free_port()),
            brokers_security=upstream.security,
            port=0,
        )
    )
    await served.start()
    try:
        yield served
    finally:
        await served.stop()


ALL_TOPICS = MetadataRequest(
    topics=None,
    allow_auto_topic_creation=False,
    include_cluster_authorized_operations=False,
    include_topic_authorized_operations=False,
)


async def replies_until_closed(
    reader: asyncio.StreamReader, count: int, within_s: float = 30
) -> list[bytes]:
    """Up to ``count`` replies; fewer if the gateway closes the connection first (or none
    comes within ``within_s``)."""
    replies: list[bytes] = []
    with contextlib.suppress(ConnectionError, framing.FrameError, TimeoutError):
        async with asyncio.timeout(within_s):
            while len(replies) < count:
                payload = await framing.read_frame(reader, 1 << 24)
                if payload is None:
                    break
                replies.append(payload)
    return replies


async def broker_port(gateway: protocol_gateway.Gateway) -> int:
    """The local port of the (one) broker, opened as a client opens it: Metadata on the
    coordinator port."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(framing.encode_request(ALL_TOPICS, 1))
        payload = await framing.read_frame(reader, 1 << 24)
        assert payload is not None, "the coordinator port closed the connection"
        _, metadata = framing.read_response(payload, MetadataResponse)
        (broker, coordinator) = metadata.brokers
        assert coordinator.node_id == gateway.config.coordinator_node_id
        return int(broker.port)
    finally:
        writer.close()


@pytest.mark.parametrize("kind", UPSTREAMS)
async def test_a_forged_reply_opens_no_port_and_sends_no_credentials(
    kind: str, tmp_path: Path
) -> None:
    async with secured_broker(kind, tmp_path) as upstream, attacker(upstream.tls) as evil:
        await attack(upstream, evil)


async def attack(upstream: Upstream, evil: Attacker) -> None:
    """The attack through a gateway to ``upstream``; what reaches ``evil``."""
    async with gateway_to(upstream) as gateway:
        key, forged_node = forging_key(("127.0.0.1", evil.port))
        port = await broker_port(gateway)
        (real_node,) = gateway.broker_ports()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # The same correlation id twice, pipelined: the broker answers FindCoordinator
            # first, echoing the key.
            find = FindCoordinatorRequest(key_type=i8(1), coordinator_keys=(key,))
            writer.write(framing.encode_request(find, 7) + framing.encode_request(ALL_TOPICS, 7))
            replies = await replies_until_closed(reader, 2)
        finally:
            writer.close()
        named: dict[int, int] = {}
        for reply in replies:
            with contextlib.suppress(Exception):
                _, metadata = framing.read_response(reply, MetadataResponse)
                named.update((int(b.node_id), int(b.port)) for b in metadata.brokers)
        # What a client would do with a forged reply: connect to the port it names.
        if forged_node in named:
            forged_reader, forged_writer = await asyncio.open_connection(
                "127.0.0.1", named[forged_node]
            )
            forged_writer.write(framing.encode_request(api_versions_v3(), 1))
            await replies_until_closed(forged_reader, 1, within_s=5)
            forged_writer.close()
        assert PASSWORD.encode() not in evil.received
        assert USER.encode() not in evil.received
        assert evil.connections == 0
        assert forged_node not in named
        assert set(gateway.broker_ports()) == {real_node}
        # The gateway goes on serving, the broker port included.
        assert await broker_port(gateway) == port
