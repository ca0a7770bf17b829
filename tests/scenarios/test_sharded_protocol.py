"""Real processes: two ``kgo coordinator`` processes split one state topic and serve it on the
Kafka protocol, each knowing the other's Kafka listener (``--kafka-peers``).

Either listener's FindCoordinator names each group's own coordinator, and a group request for
a group the listener does not serve is ``NOT_COORDINATOR``. Unmodified clients given the
first listener only end up at the second for its groups: kafka-python's admin client directly,
and confluent-kafka consumers (KIP-848 and classic) through a gateway configured with the first
listener, which opens a local port for the second.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.structs import OffsetAndMetadata
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup
from kio.schema.types import GroupId
from kio.static.primitive import i8

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import peers
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_records import partitioning
from tests.protocol.wire import Connection
from tests.support import processes as processes_support
from tests.support import topics

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.asyncio(loop_scope="module")]

STATE_PARTITIONS = 2
PARTITIONS, PER_PARTITION = 3, 4


def group_on(partition: int, prefix: str) -> str:
    number = 0
    while partitioning.partition_for(f"{prefix}-{number}", STATE_PARTITIONS) != partition:
        number += 1
    return f"{prefix}-{number}"


@dataclass
class Pair:
    broker: embedded.EmbeddedBroker
    directory: Path
    http: list[int] = field(default_factory=lambda: [embedded.free_port() for _ in range(2)])
    kafka: list[int] = field(default_factory=lambda: [embedded.free_port() for _ in range(2)])
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    state_topic: str = field(default_factory=lambda: f"sharded-kafka-{uuid.uuid4().hex[:8]}")

    def address(self, index: int) -> tuple[str, int]:
        return ("127.0.0.1", self.kafka[index])

    def kafka_peers(self, index: int) -> str:
        """The first process gets a map of both listeners (its own too), the second only
        the other's."""
        listed = range(2) if index == 0 else [1 - index]
        return ",".join(f"{i}=127.0.0.1:{self.kafka[i]}" for i in listed)

    def start(self, index: int) -> None:
        other = 1 - index
        log = (self.directory / f"coordinator-{index}.log").open("ab")
        self.processes.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "kafka_group_operator", "coordinator",
                    "--bootstrap", self.broker.bootstrap, "--port", str(self.http[index]),
                    "--kafka-port", str(self.kafka[index]),
                    "--topic", self.state_topic, "--state-partitions", str(STATE_PARTITIONS),
                    "--partitions", str(index),
                    "--advertised-url", f"http://127.0.0.1:{self.http[index]}",
                    "--peers", f"{other}=http://127.0.0.1:{self.http[other]}",
                    "--kafka-peers", self.kafka_peers(index),
                ],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip

    def stop(self) -> None:
        processes_support.stop_all(self.processes)


async def fetch_error(port: int, group: str) -> ErrorCode | None:
    """OffsetFetch's error for ``group`` on the listener at ``port`` (None: no answer yet)."""
    try:
        connection = await Connection.open(port)
    except OSError:
        return None
    try:
        reply = await connection.call(
            OffsetFetchRequest(
                groups=(OffsetFetchRequestGroup(group_id=GroupId(group), topics=None),),
                require_stable=False,
            )
        )
        return ErrorCode(reply.groups[0].error_code)
    finally:
        await connection.close()


@pytest.fixture(scope="module")
def pair(
    broker: embedded.EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    started = Pair(broker, tmp_path_factory.mktemp("sharded-kafka"))
    try:
        for index in range(2):
            started.start(index)
        yield started
    finally:
        started.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def serving(pair: Pair) -> AsyncIterator[Pair]:
    """``pair`` once each listener serves its own partition's groups."""
    deadline = time.monotonic() + 120
    for index in range(2):
        group = group_on(index, "ready")
        while await fetch_error(pair.kafka[index], group) != ErrorCode.none:
            assert all(p.poll() is None for p in pair.processes), "a coordinator exited"
            assert time.monotonic() < deadline, f"coordinator {index} not serving"
            await asyncio.sleep(0.2)
    yield pair


async def test_each_listener_names_each_groups_coordinator(serving: Pair) -> None:
    groups = [group_on(0, "find"), group_on(1, "find")]
    nodes = [(peers.node_id_for(serving.address(i)), *serving.address(i)) for i in range(2)]
    for asked in range(2):
        connection = await Connection.open(serving.kafka[asked])
        try:
            found = await connection.call(
                FindCoordinatorRequest(key_type=i8(0), coordinator_keys=tuple(groups))
            )
            assert [
                (c.key, c.error_code, (int(c.node_id), c.host, int(c.port)))
                for c in found.coordinators
            ] == [(groups[i], ErrorCode.none, nodes[i]) for i in range(2)]
            # Every coordinator is a node of the cluster it describes.
            metadata = await connection.call(
                MetadataRequest(
                    topics=(),
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            )
            assert sorted(
                (int(b.node_id), b.host, int(b.port)) for b in metadata.brokers
            ) == sorted(nodes)
        finally:
            await connection.close()
        # The other coordinator's group is not served here.
        assert await fetch_error(serving.kafka[asked], groups[1 - asked]) == (
            ErrorCode.not_coordinator
        )


def admin(port: int) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=30_000)


def commit_and_read(bootstrap: int, reader: int, group: str, topic: str) -> dict[int, int]:
    """kafka-python commits through one listener and reads back through the other."""
    writer = admin(bootstrap)
    try:
        writer.alter_group_offsets(
            group, {KafkaTopicPartition(topic, 1): OffsetAndMetadata(2, "", -1)}
        )
    finally:
        writer.close()
    read = admin(reader)
    try:
        offsets = read.list_group_offsets({group: None})[group]
        return {tp.partition: meta.offset for tp, meta in offsets.items()}
    finally:
        read.close()


async def test_kafka_python_follows_find_coordinator_to_the_owner(
    serving: Pair, broker: embedded.EmbeddedBroker
) -> None:
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=1)
    group = group_on(1, "admin")
    # Given the first listener only, the group's offsets go to (and come from) the second.
    assert await asyncio.to_thread(
        commit_and_read, serving.kafka[0], serving.kafka[1], group, topic
    ) == {1: 2}


def consume(port: int, group: str, topic: str, protocol: str) -> list[tuple[int, int]]:
    """An unmodified confluent-kafka consumer: every record, then a synchronous commit."""
    settings: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "group.id": group,
        "group.protocol": protocol,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "log_level": 0,
    }
    if protocol == "classic":
        settings.update({"partition.assignment.strategy": "cooperative-sticky"})
        settings.update({"session.timeout.ms": 10_000, "heartbeat.interval.ms": 500})
    consumer = Consumer(settings)
    records: list[tuple[int, int]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records) < PARTITIONS * PER_PARTITION:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                records.append((message.partition(), message.offset()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return sorted(records)


def committed(port: int, group: str) -> dict[int, int]:
    reader = admin(port)
    try:
        offsets = reader.list_group_offsets({group: None})[group]
        return {tp.partition: meta.offset for tp, meta in offsets.items()}
    finally:
        reader.close()


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
async def test_a_consumer_through_the_gateway_reaches_its_groups_coordinator(
    serving: Pair, broker: embedded.EmbeddedBroker, protocol: str
) -> None:
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION)
    group = group_on(1, f"gateway-{protocol}-{uuid.uuid4().hex[:4]}")
    gateway = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=serving.address(0),
            port=0,
        )
    )
    await gateway.start()
    try:
        records = await asyncio.to_thread(consume, gateway.port, group, topic, protocol)
        assert records == [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)]
        # The gateway opened a port for the second coordinator, and the commit went there.
        assert list(gateway.peer_ports()) == [serving.address(1)]
    finally:
        await gateway.stop()
    expected = {p: PER_PARTITION for p in range(PARTITIONS)}
    assert await asyncio.to_thread(committed, serving.kafka[1], group) == expected
    assert await fetch_error(serving.kafka[0], group) == ErrorCode.not_coordinator


class RoundRobinService:
    """What a Kubernetes Service is to a client: one address, each new connection going to
    the next of its endpoints (kube-proxy picks one per connection)."""

    def __init__(self, endpoints: list[tuple[str, int]]) -> None:
        self.endpoints = endpoints
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return "127.0.0.1", self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.endpoints[self.connections % len(self.endpoints)]
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(host, port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_gateway_behind_a_load_balanced_service_reaches_each_groups_coordinator(
    serving: Pair, broker: embedded.EmbeddedBroker
) -> None:
    """The chart gives each gateway the coordinators' Service, which sends every new
    connection to any replica. A group must still reach its own coordinator: the gateway may
    not take a later connection to the Service for the replica its first one reached (it
    did, and a member whose connection landed elsewhere was answered NOT_COORDINATOR, asked
    again, was sent back to the same port, and never joined)."""
    service = RoundRobinService([serving.address(0), serving.address(1)])
    address = await service.start()
    gateway = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=address,
            port=0,
        )
    )
    await gateway.start()
    try:
        for owner in (0, 1, 0, 1):
            topic = topics.create_topic(
                broker.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION
            )
            group = group_on(owner, f"service-{uuid.uuid4().hex[:4]}")
            records = await asyncio.to_thread(consume, gateway.port, group, topic, "consumer")
            assert records == [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)]
            expected = {p: PER_PARTITION for p in range(PARTITIONS)}
            assert await asyncio.to_thread(committed, serving.kafka[owner], group) == expected
        assert service.connections > 2
    finally:
        await gateway.stop()
        await service.stop()


def test_a_bad_kafka_peers_option_is_one_line(broker: embedded.EmbeddedBroker) -> None:
    for spec, message in (
        ("1=nowhere", "is not host:port"),
        ("0=127.0.0.1:9092", "served here and given to a peer"),
        ("7=127.0.0.1:9092", "outside the state topic"),
    ):
        done = subprocess.run(
            [
                sys.executable, "-m", "kafka_group_operator", "coordinator",
                "--bootstrap", broker.bootstrap, "--kafka-port", "0",
                "--state-partitions", str(STATE_PARTITIONS), "--partitions", "0",
                "--kafka-peers", spec,
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert "--kafka-peers" in lines[0]
        assert message in lines[0]
