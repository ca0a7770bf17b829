"""Bad input on either side of the gateway closes that one connection: a client that
disconnects mid-request, an oversized or short frame, Produce on the coordinator port, an
unreachable or garbage-speaking upstream. Connections opened before and after go on."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kio.schema.metadata.v12.request import MetadataRequest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_operator.wire import framing
from tests.protocol.test_listener import api_versions_v3
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

ALL_TOPICS = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)


@pytest_asyncio.fixture(loop_scope="package")
async def gateway(
    broker: embedded.EmbeddedBroker, open_listener: protocol_listener.Listener
) -> AsyncIterator[protocol_gateway.Gateway]:
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", open_listener.port),
            port=0,
            max_gathered_bytes=64 * 1024,
        )
    )
    await served.start()
    yield served
    await served.stop()


async def answered(port: int) -> bool:
    connection = await Connection.open(port)
    try:
        return len((await connection.call(ALL_TOPICS)).brokers) > 0
    finally:
        await connection.close()


async def test_a_client_that_leaves_mid_request_affects_only_its_connection(
    gateway: protocol_gateway.Gateway,
) -> None:
    survivor = await Connection.open(gateway.port)
    try:
        assert (await survivor.call(ALL_TOPICS)).brokers  # also opens the broker ports
        ports = [gateway.port, *gateway.broker_ports().values()]
        request = framing.encode_request(ALL_TOPICS, 7)
        for port in ports:
            leaver = await Connection.open(port)
            # Half a request (size prefix included), then gone.
            await leaver.send_raw(request[: len(request) // 2])
            await leaver.close()
            # Only a size prefix.
            leaver = await Connection.open(port)
            await leaver.send_raw(request[:2])
            await leaver.close()
        # The connection opened before goes on, pipelined requests included.
        await survivor.send_raw(
            framing.encode_request(api_versions_v3(), 100) + framing.encode_request(ALL_TOPICS, 101)
        )
        for expected in (100, 101):
            payload = await survivor.read_raw()
            assert payload is not None
            assert struct.unpack_from(">i", payload)[0] == expected
        for port in ports:
            assert await answered(port)
    finally:
        await survivor.close()


@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">i", 64 * 1024 + 1),  # above the request limit
        struct.pack(">i", -5),  # negative size
        struct.pack(">i", 3) + b"abc",  # shorter than a request header
        # Produce v9's header (api key 0): no partition leads on the coordinator port.
        struct.pack(">ihhih", 10, 0, 9, 1, -1),
        # Fetch v4's header (api key 1): nor does one lead here.
        struct.pack(">ihhih", 10, 1, 4, 1, -1),
    ],
    ids=[
        "oversized",
        "negative",
        "short",
        "produce-on-coordinator-port",
        "fetch-on-coordinator-port",
    ],
)
async def test_bad_frames_close_only_that_connection(
    gateway: protocol_gateway.Gateway, data: bytes
) -> None:
    bystander = await Connection.open(gateway.port)
    try:
        assert (await bystander.call(api_versions_v3())).error_code == 0
        bad = await Connection.open(gateway.port)
        try:
            await bad.send_raw(data)
            assert await bad.closed_by_peer()
        finally:
            await bad.close()
        assert (await bystander.call(ALL_TOPICS)).brokers
    finally:
        await bystander.close()
    assert await answered(gateway.port)


@contextlib.asynccontextmanager
async def garbage_server() -> AsyncIterator[int]:
    """Answers every frame with a frame that is no Kafka reply to it."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while (payload := await framing.read_frame(reader)) is not None:
                writer.write(framing.frame(payload[4:8] + b"\xff" * 9))
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_unreachable_or_garbage_upstreams_close_only_that_connection(
    broker: embedded.EmbeddedBroker, open_listener: protocol_listener.Listener
) -> None:
    async with garbage_server() as garbage:
        dead = embedded.free_port()
        served = protocol_gateway.Gateway(
            protocol_gateway.GatewayConfig(
                bootstrap_servers=(("127.0.0.1", garbage),),
                coordinator=("127.0.0.1", dead),
                port=0,
            )
        )
        await served.start()
        try:
            for _ in range(2):
                # ApiVersions needs the (dead) listener; Metadata gets an unreadable reply.
                for request in (api_versions_v3(), ALL_TOPICS):
                    connection = await Connection.open(served.port)
                    try:
                        await connection.send_raw(framing.encode_request(request, 1))
                        assert await connection.closed_by_peer()
                    finally:
                        await connection.close()
        finally:
            await served.stop()
