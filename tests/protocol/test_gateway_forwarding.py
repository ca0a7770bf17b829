"""How a broker port forwards: replies arriving a byte at a time (over TLS too) pass on byte for
byte, with a rewritten reply among them rewritten; a client that stops reading stops its
broker being read (flow control) instead of the gateway buffering what the broker sends; a
hostile frame from either side closes that connection alone, with the reason logged. On
asyncio's event loop and on uvloop's, which ``kgo gateway`` runs on.

A relay of the test's own stands between the gateway and the real broker (the gateway's
broker port is pointed at it), to cut the broker's replies into one-byte writes, speak TLS,
or break off inside a reply; a flooding upstream stands for a broker sending more than the
client reads."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvloop
from kio.schema.api_versions.v3.response import ApiVersionsResponse
from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_operator.wire import framing
from tests.protocol.test_listener import api_versions_v3, self_signed

pytestmark = [pytest.mark.broker]

LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
ALL_TOPICS = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)
BROKER_PORT = "port of broker"


def run(loop: str, scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(asyncio.wait_for(scenario(), 120))


def fetch(topic: str, partition: int) -> FetchRequest:
    return FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=datetime.timedelta(milliseconds=500),  # type: ignore[arg-type]
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=(
            FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    FetchPartition(
                        partition=i32(partition),
                        fetch_offset=i64(0),
                        partition_max_bytes=i32(1 << 20),
                    ),
                ),
            ),
        ),
    )


async def read(reader: asyncio.StreamReader) -> bytes:
    payload = await framing.read_frame(reader, 1 << 20)
    assert payload is not None, "the gateway closed the connection"
    return payload


def frames(stream: bytes) -> list[bytes]:
    """The payloads of a stream of whole frames."""
    payloads, at = [], 0
    while at < len(stream):
        (size,) = struct.unpack_from(">i", stream, at)
        payloads.append(stream[at + 4 : at + 4 + size])
        at += 4 + size
    assert at == len(stream)
    return payloads


@dataclass
class Relay:
    port: int
    # Every byte the broker sent on each connection, as it sent them.
    streams: list[bytearray] = field(default_factory=list)

    @property
    def replies(self) -> bytearray:
        """What the broker sent on the first connection (a client's, through the gateway)."""
        return self.streams[0]


@contextlib.asynccontextmanager
async def relay(
    broker: tuple[str, int],
    *,
    dribble: bool = False,
    tls: ssl.SSLContext | None = None,
    cut_after: int | None = None,
) -> AsyncIterator[Relay]:
    """A stand-in for the broker at a port of its own: requests go to ``broker`` as they are;
    its replies come back one byte per write (``dribble``), or stop after ``cut_after`` bytes
    with the connection closed; over TLS with ``tls`` (a server context)."""
    relayed = Relay(0)
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*broker)
        replied = bytearray()
        relayed.streams.append(replied)

        async def requests() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        async def replies() -> None:
            while data := await up_reader.read(65536):
                if cut_after is not None:
                    data = data[: cut_after - len(replied)]
                replied.extend(data)
                if dribble:
                    for index in range(len(data)):
                        writer.write(data[index : index + 1])
                        await writer.drain()
                        await asyncio.sleep(0.0005)  # each byte a read of its own
                else:
                    writer.write(data)
                    await writer.drain()
                if len(replied) == cut_after:
                    return

        both = [asyncio.ensure_future(requests()), asyncio.ensure_future(replies())]
        tasks.update(both)
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in both:
                task.cancel()
            await asyncio.gather(*both, return_exceptions=True)
            writer.close()
            up_writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    relayed.port = server.sockets[0].getsockname()[1]
    try:
        yield relayed
    finally:
        server.close()
        for task in tasks:
            task.cancel()


@contextlib.asynccontextmanager
async def broker_port_via(
    broker_address: tuple[str, int],
    upstream: tuple[str, int],
    security: kafka_connection.Security | None = None,
    max_request_bytes: int = protocol_gateway.MAX_REQUEST_BYTES,
    bootstrap: tuple[str, int] | None = None,
) -> AsyncIterator[tuple[protocol_gateway.Gateway, int]]:
    """A gateway in front of ``broker_address`` (or ``bootstrap``, reached with ``security``
    as every broker), and the local port of that broker, whose connections go to
    ``upstream``; the coordinator listener is not needed here."""
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=(bootstrap or broker_address,),
            coordinator=("127.0.0.1", embedded.free_port()),
            brokers_security=security or kafka_connection.Security(),
            port=0,
            max_request_bytes=max_request_bytes,
        )
    )
    await served.start()
    try:
        # As when a reply names the broker at the upstream's address.
        local = await served._broker(await node_id(broker_address), upstream)
        yield served, local.port
    finally:
        await served.stop()


async def node_id(broker: tuple[str, int]) -> int:
    reader, writer = await asyncio.open_connection(*broker)
    try:
        writer.write(framing.encode_request(ALL_TOPICS, 1))
        payload = await framing.read_frame(reader, 1 << 20)
        assert payload is not None
        (node,) = framing.read_response(payload, MetadataResponse)[1].brokers
        return int(node.node_id)
    finally:
        writer.close()


def address(broker: embedded.EmbeddedBroker) -> tuple[str, int]:
    return kafka_connection.parse_servers(broker.bootstrap)[0]


@LOOPS
@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_replies_a_byte_at_a_time_pass_intact_and_rewritten_ones_are_rewritten(
    broker: embedded.EmbeddedBroker, topic: str, loop: str, tls: bool, tmp_path: Path
) -> None:
    server_tls = client_tls = None
    if tls:
        cert, key = self_signed(tmp_path)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(cert, key)
        client_tls = kafka_connection.tls_context(str(cert))

    async def scenario() -> None:
        async with (
            relay(address(broker), dribble=True, tls=server_tls) as relayed,
            broker_port_via(
                address(broker),
                ("127.0.0.1", relayed.port),
                kafka_connection.Security(tls=client_tls),
                # The gateway's own Metadata requests go through the relay too (over TLS).
                bootstrap=("127.0.0.1", relayed.port),
            ) as (gateway, port),
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                # Pipelined: replies passed through around two the gateway rewrites.
                requests = [
                    fetch(topic, 0),
                    ALL_TOPICS,
                    fetch(topic, 1),
                    api_versions_v3(),
                    fetch(topic, 2),
                    api_versions_v3(),
                ]
                writer.write(
                    b"".join(framing.encode_request(r, 100 + i) for i, r in enumerate(requests))
                )
                replies = [await read(reader) for _ in requests]
            finally:
                writer.close()
            upstream = frames(bytes(relayed.replies))
            assert len(upstream) == len(requests)
            for index in (0, 2, 4):
                assert replies[index] == upstream[index]  # byte for byte
                assert b"m4" in upstream[index]  # records, not an empty reply
            correlation, metadata = framing.read_response(replies[1], MetadataResponse)
            assert correlation == 101
            (broker_node, coordinator) = metadata.brokers
            assert (broker_node.host, broker_node.port) == ("127.0.0.1", port)
            assert (coordinator.node_id, coordinator.port) == (1_000_000, gateway.port)
            assert replies[1] != upstream[1]
            correlation, versions = framing.read_response(replies[3], ApiVersionsResponse)
            assert correlation == 103
            assert versions.error_code == 0
            # The same reply again: the same rewritten reply (but for the correlation id).
            # Apache Kafka's replies may differ in one field: FinalizedFeaturesEpoch is the
            # offset of its newest metadata record (KRaftMetadataCache.features), which moves
            # on between two requests (a no-op record every metadata.max.idle.interval.ms,
            # 500 ms), and then so do their rewrites, in that field alone.
            assert replies[5][:4] == struct.pack(">i", 105)
            if upstream[5][4:] == upstream[3][4:]:
                assert replies[5][4:] == replies[3][4:]
            else:
                decoded = [
                    framing.read_response(reply, ApiVersionsResponse)[1]
                    for reply in (upstream[3], upstream[5], replies[3], replies[5])
                ]
                assert decoded[2].finalized_features_epoch == decoded[0].finalized_features_epoch
                assert decoded[3].finalized_features_epoch == decoded[1].finalized_features_epoch
                same = [dataclasses.replace(d, finalized_features_epoch=0) for d in decoded]
                assert same[1] == same[0]
                assert same[3] == same[2]

    run(loop, scenario)


@contextlib.asynccontextmanager
async def flooding_upstream(size: int) -> AsyncIterator[list[int]]:
    """An upstream answering the first request with a frame of ``size`` bytes that it writes
    as fast as it is read; yields the count of bytes written so far (its first item)."""
    written = [0]
    chunk = bytes(256 * 1024)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            request = await framing.read_frame(reader, 1 << 20)
            assert request is not None
            writer.write(struct.pack(">i", size) + request[4:8])
            left = size - 4
            while left > 0:
                writer.write(chunk[:left])
                await writer.drain()
                written[0] += min(left, len(chunk))
                left -= len(chunk)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        written.append(server.sockets[0].getsockname()[1])
        yield written
    finally:
        server.close()


@LOOPS
def test_a_client_that_stops_reading_stops_its_broker_being_read(
    broker: embedded.EmbeddedBroker, topic: str, loop: str
) -> None:
    size = 240 * 1024 * 1024

    async def steady(written: list[int]) -> int:
        """What the upstream has written once it no longer gets further."""
        last = -1
        while written[0] != last:
            last = written[0]
            await asyncio.sleep(1.0)
        return last

    async def scenario() -> None:
        async with (
            flooding_upstream(size) as written,
            broker_port_via(address(broker), ("127.0.0.1", written[1])) as (_, port),
        ):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
            try:
                writer.write(framing.encode_request(fetch(topic, 0), 7))
                # Nothing read: the gateway stops reading the upstream. What it wrote is
                # what the sockets' buffers took and the gateway's bounded buffer.
                stalled = await steady(written)
                assert stalled < 80 * 1024 * 1024, stalled
                # Reading again: the upstream is read again.
                head = await reader.readexactly(8)
                assert struct.unpack(">ii", head) == (size, 7)
                for _ in range(64):
                    await reader.readexactly(1024 * 1024)
                assert written[0] >= stalled + 32 * 1024 * 1024
            finally:
                writer.close()

    run(loop, scenario)


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """True once the gateway has closed the connection (whatever it forwarded before)."""
    try:
        async with asyncio.timeout(10):
            while await reader.read(1 << 20):
                pass
    except ConnectionError:
        pass
    return True


async def answered(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(framing.encode_request(ALL_TOPICS, 1))
        payload = await framing.read_frame(reader, 1 << 20)
        return payload is not None and payload[:4] == struct.pack(">i", 1)
    finally:
        writer.close()


@LOOPS
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">i", 64 * 1024 + 1), "frame of 65537 bytes"),
        (struct.pack(">i", -5), "frame of -5 bytes"),
        (struct.pack(">i", 3) + b"abc", "frame of 3 bytes"),
    ],
    ids=["oversized", "negative", "short"],
)
def test_a_bad_request_frame_closes_only_its_broker_port_connection(
    broker: embedded.EmbeddedBroker,
    loop: str,
    data: bytes,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with broker_port_via(
            address(broker), address(broker), max_request_bytes=64 * 1024
        ) as (_, port):
            by_reader, by_writer = await asyncio.open_connection("127.0.0.1", port)
            bad_reader, bad_writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                # Pass-through bytes first, then the bad frame in the same write.
                bad_writer.write(framing.encode_request(fetch("none", 0), 1) + data)
                assert await closed_by_peer(bad_reader)
                by_writer.write(framing.encode_request(ALL_TOPICS, 2))
                assert (await framing.read_frame(by_reader, 1 << 20)) is not None
            finally:
                by_writer.close()
                bad_writer.close()
            assert await answered(port)

    with caplog.at_level(logging.INFO, logger=protocol_gateway.__name__):
        run(loop, scenario)
    assert any(BROKER_PORT in r.message and reason in r.message for r in caplog.records)


@LOOPS
@pytest.mark.parametrize("cut_after", [2, 30], ids=["in-the-size", "in-the-reply"])
def test_an_upstream_closing_inside_a_reply_closes_only_that_connection(
    broker: embedded.EmbeddedBroker,
    topic: str,
    loop: str,
    cut_after: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with (
            relay(address(broker), cut_after=cut_after) as relayed,
            broker_port_via(address(broker), ("127.0.0.1", relayed.port)) as (gateway, port),
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(framing.encode_request(fetch(topic, 0), 1))
                assert await closed_by_peer(reader)
            finally:
                writer.close()
            # New connections go to the broker itself (a reply named it), and are served.
            await gateway._broker(await node_id(address(broker)), address(broker))
            assert await answered(port)

    with caplog.at_level(logging.INFO, logger=protocol_gateway.__name__):
        run(loop, scenario)
    reason = "inside a frame's size" if cut_after < 4 else "inside a frame"
    assert any(BROKER_PORT in r.message and reason in r.message for r in caplog.records)
