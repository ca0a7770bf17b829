"""Replies are matched to requests in request order on every gateway port, as a Kafka broker
answers them; broker ports open only for the brokers the gateway's own Metadata names.

- a request reusing the correlation id of one awaiting its reply closes the connection;
- a reply that is not the oldest outstanding request's closes it; a rewritten reply with bytes
  after its body closes it;
- a Produce request with acks=0 expects no reply (Kafka sends none; tansu sends one anyway):
  the gateway reads its acks, however its header and transactional id are spelled and
  however its bytes arrive, and the replies around it keep their requests;
- thousands of pipelined requests come back in order (the client is not read while too many
  await their replies, then read again);
- a reply naming a broker the brokers' own Metadata does not (Metadata, DescribeCluster, a
  transaction coordinator), on a broker port or the coordinator port, loses that broker and
  nothing connects to it; a broker that moves is followed once the brokers say so.

A relay of the test's own stands between the gateway and a real broker (tansu, advertising
the relay's address) to tamper with the broker's replies to the client's requests, never to
the gateway's own (client id ``kgo-gateway``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import io
import logging
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_batch
from kio.schema.api_versions.v3.response import ApiVersionsResponse
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
from kio.schema.describe_cluster.v1.response import DescribeClusterResponse
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4.response import FetchResponse
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.produce.v3.request import PartitionProduceData as PartitionV3
from kio.schema.produce.v3.request import ProduceRequest as ProduceV3
from kio.schema.produce.v3.request import TopicProduceData as TopicV3
from kio.schema.produce.v9.request import PartitionProduceData as PartitionV9
from kio.schema.produce.v9.request import ProduceRequest as ProduceV9
from kio.schema.produce.v9.request import TopicProduceData as TopicV9
from kio.schema.types import BrokerId, TopicName, TransactionalId
from kio.serial import entity_writer
from kio.static.primitive import i8, i16, i32, i64

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_operator.wire import framing
from tests.protocol.test_gateway_forwarding import fetch
from tests.protocol.test_gateway_upstream_trust import (
    attacker,
    broker_port,
    replies_until_closed,
    tansu_advertising,
)
from tests.protocol.test_listener import api_versions_v3
from tests.support import topics

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

ALL_TOPICS = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)
GATEWAY_CLIENT_ID = "kgo-gateway"
ROGUE_NODE = 4242

# A reply tamperer: (request header, client id, reply payload) -> the payloads sent instead.
Tamper = Callable[[framing.RequestHeader, str | None, bytes], list[bytes]]


def untouched(header: framing.RequestHeader, client_id: str | None, reply: bytes) -> list[bytes]:
    return [reply]


class Relay:
    """Frames pass both ways between the gateway and ``upstream``; each reply goes through
    ``tamper`` with the request it answers. Counts its connections."""

    def __init__(self) -> None:
        self.upstream: tuple[str, int] = ("127.0.0.1", 0)
        self.tamper: Tamper = untouched
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        """Closes the relay and its connections (before the broker stops: tansu waits for
        its connections to close)."""
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
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        asked: dict[int, tuple[framing.RequestHeader, str | None]] = {}

        async def requests() -> None:
            while (payload := await framing.read_frame(reader, 1 << 26)) is not None:
                header = framing.peek_request_header(payload)
                (length,) = struct.unpack_from(">h", payload, 8)
                client_id = payload[10 : 10 + length].decode() if length >= 0 else None
                asked[header.correlation_id] = (header, client_id)
                up_writer.write(framing.frame(payload))
                await up_writer.drain()

        async def replies() -> None:
            while (payload := await framing.read_frame(up_reader, 1 << 28)) is not None:
                header, client_id = asked.pop(framing.peek_correlation(payload))
                for each in self.tamper(header, client_id, payload):
                    writer.write(framing.frame(each))
                await writer.drain()

        pumps = [asyncio.ensure_future(requests()), asyncio.ensure_future(replies())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            writer.close()
            up_writer.close()
            self._tasks.discard(task)
            await asyncio.gather(*pumps, return_exceptions=True)


@contextlib.asynccontextmanager
async def relayed_gateway(
    coordinator: tuple[str, int] | None = None,
) -> AsyncIterator[tuple[protocol_gateway.Gateway, Relay]]:
    """A gateway whose one broker (a tansu of its own) is reached through a ``Relay``."""
    relay = Relay()
    port = await relay.start()
    with tansu_advertising(port) as tansu:
        relay.upstream = tansu
        served = protocol_gateway.Gateway(
            protocol_gateway.GatewayConfig(
                bootstrap_servers=(("127.0.0.1", port),),
                coordinator=coordinator or ("127.0.0.1", embedded.free_port()),
                port=0,
            )
        )
        await served.start()
        try:
            yield served, relay
        finally:
            await served.stop()
            await relay.stop()


async def closed_with(reader: asyncio.StreamReader) -> list[bytes]:
    """The replies the gateway sends before it closes the connection (within 30 s)."""
    replies = await replies_until_closed(reader, 1_000)
    assert await reader.read() == b"", "the gateway did not close the connection"
    return replies


def logged(caplog: pytest.LogCaptureFixture, *parts: str) -> bool:
    return any(all(part in r.getMessage() for part in parts) for r in caplog.records)


# --- request order ------------------------------------------------------------------------


async def test_a_correlation_id_reused_while_outstanding_closes_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with relayed_gateway() as (gateway, _):
        port = await broker_port(gateway)
        caplog.set_level(logging.INFO, logger=protocol_gateway.__name__)
        for local in (port, gateway.port):
            reader, writer = await asyncio.open_connection("127.0.0.1", local)
            try:
                # The same id again once answered is fine (clients wrap around).
                for _ in range(2):
                    writer.write(framing.encode_request(ALL_TOPICS, 5))
                    (reply,) = await replies_until_closed(reader, 1)
                    assert framing.peek_correlation(reply) == 5
                # Twice while the first awaits its reply: closed.
                writer.write(
                    framing.encode_request(ALL_TOPICS, 6) + framing.encode_request(ALL_TOPICS, 6)
                )
                await closed_with(reader)
            finally:
                writer.close()
        assert logged(caplog, "port of broker", "correlation id 6 reused")
        assert logged(caplog, "coordinator port", "correlation id 6 reused")


async def test_a_reply_out_of_order_closes_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with relayed_gateway() as (gateway, relay):
        port = await broker_port(gateway)
        held: list[bytes] = []

        def swap(header: framing.RequestHeader, client_id: str | None, reply: bytes) -> list[bytes]:
            if client_id == GATEWAY_CLIENT_ID:
                return [reply]
            if header.correlation_id == 1:
                held.append(reply)
                return []
            return [reply, *held]  # the second reply first

        relay.tamper = swap
        caplog.set_level(logging.INFO, logger=protocol_gateway.__name__)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                framing.encode_request(api_versions_v3(), 1) + framing.encode_request(ALL_TOPICS, 2)
            )
            assert await closed_with(reader) == []
        finally:
            writer.close()
        assert logged(caplog, "port of broker", "reply 2 while the oldest request", "is 1")


async def test_bytes_after_a_rewritten_reply_close_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with relayed_gateway() as (gateway, relay):
        port = await broker_port(gateway)

        def pad(header: framing.RequestHeader, client_id: str | None, reply: bytes) -> list[bytes]:
            if client_id != GATEWAY_CLIENT_ID and header.api_key == 3:
                return [reply + b"\0"]
            return [reply]

        relay.tamper = pad
        caplog.set_level(logging.INFO, logger=protocol_gateway.__name__)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                framing.encode_request(api_versions_v3(), 1) + framing.encode_request(ALL_TOPICS, 2)
            )
            (versions,) = await closed_with(reader)  # ApiVersions' reply, then no more
            assert framing.peek_correlation(versions) == 1
        finally:
            writer.close()
        assert logged(caplog, "port of broker", "1 bytes after the response")


def record_batch(value: bytes) -> bytes:
    buffer = io.BytesIO()
    record = Record(
        attributes=i8(0),
        timestamp=datetime.datetime.now(datetime.UTC),
        offset=i64(0),
        key=None,
        value=value,
        headers=(),
    )
    write_batch(
        buffer,
        NewRecordBatch(
            producer_id=i64(-1),
            producer_epoch=i16(-1),
            base_sequence=i32(-1),
            attributes=i16(0),
            records=(record,),
        ),
    )
    return buffer.getvalue()


def produce(
    version: int,
    topic: str,
    value: bytes,
    acks: int,
    correlation_id: int,
    client_id: str | None,
    transactional_id: str | None = None,
    header_tags: bytes = b"\0",
) -> bytes:
    """A framed Produce request, its header written out here: client id of any length (or
    null), and for a flexible version the header's tagged fields as given (unknown ones,
    which a broker skips)."""
    buffer = io.BytesIO()
    buffer.write(struct.pack(">hhi", 0, version, correlation_id))
    if client_id is None:
        buffer.write(struct.pack(">h", -1))
    else:
        buffer.write(struct.pack(">h", len(client_id.encode())) + client_id.encode())
    body: Any
    if version >= 9:
        buffer.write(header_tags)
        partition = PartitionV9(index=i32(0), records=record_batch(value))  # type: ignore[arg-type]
        body = ProduceV9(
            transactional_id=None
            if transactional_id is None
            else TransactionalId(transactional_id),
            acks=i16(acks),
            timeout=datetime.timedelta(seconds=5),  # type: ignore[arg-type]
            topic_data=(TopicV9(name=TopicName(topic), partition_data=(partition,)),),
        )
    else:
        partition3 = PartitionV3(index=i32(0), records=record_batch(value))  # type: ignore[arg-type]
        body = ProduceV3(
            transactional_id=None
            if transactional_id is None
            else TransactionalId(transactional_id),
            acks=i16(acks),
            timeout=datetime.timedelta(seconds=5),  # type: ignore[arg-type]
            topic_data=(TopicV3(name=TopicName(topic), partition_data=(partition3,)),),
        )
    entity_writer(type(body))(buffer, body)
    return framing.frame(buffer.getvalue())


@pytest.mark.parametrize("answered", [True, False], ids=["answered-as-tansu", "as-kafka"])
@pytest.mark.parametrize("dribble", [False, True], ids=["whole", "a-byte-at-a-time"])
async def test_produce_with_acks_0_expects_no_reply_and_the_replies_around_it_keep_their_requests(
    dribble: bool, answered: bool
) -> None:
    async with relayed_gateway() as (gateway, relay):
        tansu = f"{relay.upstream[0]}:{relay.upstream[1]}"
        topic = await asyncio.to_thread(topics.create_topic, tansu, 1)
        port = await broker_port(gateway)
        # An unknown tag (7, 3 bytes) in a flexible request header: skipped, as a broker does.
        tags = b"\x01\x07\x03abc"
        sent = [
            produce(3, topic, b"a", 0, 1, None),
            framing.encode_request(ALL_TOPICS, 2),
            produce(9, topic, b"b", 0, 3, "c" * 300, header_tags=tags),
            produce(8, topic, b"c", 1, 4, "client-x" * 50),
            produce(11, topic, b"d", 0, 5, ""),
            framing.encode_request(ALL_TOPICS, 6),
            produce(9, topic, b"e", -1, 7, "y", header_tags=tags),
            framing.encode_request(fetch(topic, 0), 8),
        ]
        unanswered = {1, 3, 5}
        if not answered:
            # More acks=0 requests than the gateway keeps track of, none answered, first.
            many = protocol_gateway._MAX_OUTSTANDING + 100
            sent[:0] = [produce(9, topic, b"z", 0, 100 + i, "p") for i in range(many)]
            unanswered.update(range(100, 100 + many))

            def as_kafka(
                header: framing.RequestHeader, client_id: str | None, reply: bytes
            ) -> list[bytes]:
                # Kafka's broker sends no reply to a Produce with acks=0 (tansu does).
                if client_id != GATEWAY_CLIENT_ID and header.correlation_id in unanswered:
                    return []
                return [reply]

            relay.tamper = as_kafka
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            stream = b"".join(sent)
            if dribble:
                for index in range(len(stream)):
                    writer.write(stream[index : index + 1])
                    await writer.drain()
            else:
                writer.write(stream)
            answers = await replies_until_closed(reader, 8 if answered else 5)
        finally:
            writer.close()
        correlations = [framing.peek_correlation(reply) for reply in answers]
        if answered:
            assert correlations == [1, 2, 3, 4, 5, 6, 7, 8]  # in request order
        else:
            assert correlations == [2, 4, 6, 7, 8]
        by_id = dict(zip(correlations, answers, strict=True))
        for metadata_id in (2, 6):
            _, metadata = framing.read_response(by_id[metadata_id], MetadataResponse)
            assert metadata.brokers[0].port == port  # rewritten: the local port
        _, fetched = framing.read_response(by_id[8], FetchResponse)
        records = bytes(fetched.responses[0].partitions[0].records or b"")
        for value in (b"a", b"b", b"c", b"d", b"e"):
            assert value in records


async def test_thousands_of_pipelined_requests_come_back_in_order(
    broker: embedded.EmbeddedBroker,
) -> None:
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", embedded.free_port()),
            port=0,
        )
    )
    await served.start()
    try:
        port = await broker_port(served)
        count = 3 * protocol_gateway._MAX_OUTSTANDING
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # All sent before any is read: the gateway stops reading the client while too
            # many await their replies, and reads it again as they come.
            writer.write(
                b"".join(
                    framing.encode_request(ALL_TOPICS if i % 100 == 0 else api_versions_v3(), i)
                    for i in range(count)
                )
            )
            answers = await replies_until_closed(reader, count, within_s=120)
        finally:
            writer.close()
        assert [framing.peek_correlation(reply) for reply in answers] == list(range(count))
        _, metadata = framing.read_response(answers[100], MetadataResponse)
        assert metadata.brokers[0].port == port
        _, versions = framing.read_response(answers[101], ApiVersionsResponse)
        assert versions.error_code == ErrorCode.none
    finally:
        await served.stop()


# --- brokers the gateway's own Metadata names ---------------------------------------------


def naming_a_rogue_broker(target: tuple[str, int]) -> Tamper:
    """Adds node ``ROGUE_NODE`` at ``target`` to the Metadata and DescribeCluster replies to
    the client, and names it as every coordinator in FindCoordinator replies."""

    def tamper(header: framing.RequestHeader, client_id: str | None, reply: bytes) -> list[bytes]:
        if client_id == GATEWAY_CLIENT_ID or header.api_key not in (3, 10, 60):
            return [reply]
        schema = framing.response_type(header.api_key, header.api_version)
        correlation_id, body = framing.read_response(reply, schema)
        host, port = target[0], i32(target[1])
        if header.api_key == 10:
            coordinators = tuple(
                dataclasses.replace(c, node_id=BrokerId(ROGUE_NODE), host=host, port=port)
                for c in body.coordinators
            )
            body = dataclasses.replace(body, coordinators=coordinators)
        else:
            id_field = "node_id" if header.api_key == 3 else "broker_id"
            rogue = dataclasses.replace(
                body.brokers[0], **{id_field: BrokerId(ROGUE_NODE)}, host=host, port=port
            )
            body = dataclasses.replace(body, brokers=(*body.brokers, rogue))
        encoded = framing.encode_response(header.api_key, header.api_version, correlation_id, body)
        return [encoded[4:]]

    return tamper


async def test_a_broker_the_brokers_do_not_name_is_left_out_and_never_connected_to() -> None:
    async with attacker(None) as evil, relayed_gateway() as (gateway, relay):
        relay.tamper = naming_a_rogue_broker(("127.0.0.1", evil.port))
        # The coordinator port (its lane to the brokers), then the broker port.
        port = await broker_port(gateway)  # one broker: the rogue one is left out
        (real,) = gateway.broker_ports()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            find = FindCoordinatorRequest(key_type=i8(1), coordinator_keys=("tx-1",))
            describe = DescribeClusterRequest(
                include_cluster_authorized_operations=False,
                endpoint_type=i8(1),
            )
            writer.write(
                framing.encode_request(ALL_TOPICS, 1)
                + framing.encode_request(find, 2)
                + framing.encode_request(describe, 3)
            )
            metadata, coordinator, cluster = await replies_until_closed(reader, 3)
        finally:
            writer.close()
        _, metadata_body = framing.read_response(metadata, MetadataResponse)
        assert [b.node_id for b in metadata_body.brokers] == [real, 1_000_000]
        _, cluster_body = framing.read_response(cluster, DescribeClusterResponse)
        assert [b.broker_id for b in cluster_body.brokers] == [real, 1_000_000]
        _, find_body = framing.read_response(coordinator, FindCoordinatorResponse)
        (answer,) = find_body.coordinators
        assert answer.error_code == ErrorCode.coordinator_not_available
        assert (answer.node_id, answer.host, answer.port) == (-1, "", -1)
        assert set(gateway.broker_ports()) == {real}
        assert evil.connections == 0
        # Many replies naming it: the brokers are asked again at most once a second.
        calls = gateway._cluster_calls
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"".join(framing.encode_request(ALL_TOPICS, i) for i in range(50)))
            assert len(await replies_until_closed(reader, 50)) == 50
        finally:
            writer.close()
        assert gateway._cluster_calls - calls <= 2


async def test_a_broker_that_moves_is_followed_once_the_brokers_say_so() -> None:
    second = Relay()
    second_port = await second.start()
    try:
        async with relayed_gateway() as (gateway, relay):
            second.upstream = relay.upstream
            port = await broker_port(gateway)
            (real,) = gateway.broker_ports()
            moved = collections.Counter[str]()

            def move(
                header: framing.RequestHeader, client_id: str | None, reply: bytes
            ) -> list[bytes]:
                # Every Metadata reply, the gateway's own included, names the second address.
                if header.api_key != 3:
                    return [reply]
                moved[client_id or ""] += 1
                schema = framing.response_type(3, header.api_version)
                correlation_id, body = framing.read_response(reply, schema)
                brokers = tuple(dataclasses.replace(b, port=i32(second_port)) for b in body.brokers)
                body = dataclasses.replace(body, brokers=brokers)
                return [framing.encode_response(3, header.api_version, correlation_id, body)[4:]]

            relay.tamper = move
            await asyncio.sleep(protocol_gateway._CLUSTER_REFRESH_S)  # past the refresh bound
            assert await broker_port(gateway) == port  # the same local port
            assert moved[GATEWAY_CLIENT_ID] == 1  # the gateway asked the brokers again
            before = second.connections
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(framing.encode_request(api_versions_v3(), 1))
                assert len(await replies_until_closed(reader, 1)) == 1
            finally:
                writer.close()
            assert second.connections == before + 1  # new connections go to the new address
            assert set(gateway.broker_ports()) == {real}
    finally:
        await second.stop()


async def test_a_real_producer_with_acks_0_keeps_its_connections(
    broker: embedded.EmbeddedBroker,
    open_listener: protocol_listener.Listener,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka producing with acks=0 (and asking metadata meanwhile) through the gateway:
    every record lands and no connection is closed for a reply out of place."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = topics.create_topic(broker.bootstrap, 2, messages_per_partition=0)
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", open_listener.port),
            port=0,
        )
    )
    await served.start()
    caplog.set_level(logging.INFO, logger=protocol_gateway.__name__)
    count = 2_000

    def produce_then_read() -> int:
        bootstrap = f"127.0.0.1:{served.port}"
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": 0,
                "linger.ms": 0,
                "batch.num.messages": 10,
                "topic.metadata.refresh.interval.ms": 100,
                "log_level": 0,
            }
        )
        for index in range(count):
            producer.produce(topic, f"r{index}".encode(), partition=index % 2)
            producer.poll(0)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "log_level": 0})
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
            seen = 0
            deadline = time.monotonic() + 60
            while seen < count and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    seen += 1
            return seen
        finally:
            consumer.close()

    try:
        assert await asyncio.to_thread(produce_then_read) == count
    finally:
        await served.stop()
    assert not logged(caplog, "port of broker", "reply")
