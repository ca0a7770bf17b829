"""The Kafka-protocol listener follows the partition Leases.

Two replicas, ``kgo-0`` and ``kgo-1``, split a 2-partition state topic by Leases on the
Kubernetes test double and the embedded broker, each assembled as the operator's startup
assembles it (``lifecycle._shards`` and ``lifecycle.listener_config``) without kopf. Their
listeners are on loopback, so the replicas' Kafka addresses come from a map instead of the
chart's ``{identity}.<sts>-headless.<namespace>.svc:9092`` template.

Either listener's FindCoordinator names the Lease holder of the group's partition, Metadata
lists both replicas, and a group request for the other's group is ``NOT_COORDINATOR``. When
a replica stops (releasing its Leases), FindCoordinator names the replica that took its
partition over. An unmodified confluent-kafka consumer (KIP-848) given one listener through
the gateway consumes a group that the other coordinates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from confluent_kafka import Consumer
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup
from kio.schema.types import GroupId
from kio.static.primitive import i8

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import lifecycle
from kafka_group_operator.kube import client
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.protocol import peers
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_records import partitioning
from tests.protocol.wire import Connection
from tests.runtime import logs
from tests.support import kube, topics

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

NS = "kgo-system"
STATE_PARTITIONS = 2
NAMES = ("kgo-0", "kgo-1")
# Long enough that a loaded machine does not make the Leases change hands mid-test.
LEASE_S = 6
PARTITIONS, PER_PARTITION = 3, 4
State = coordinator_runtime.PartitionState


class Replica:
    """One operator replica's coordinator side: runtime, Lease elector, Kafka listener."""

    def __init__(
        self,
        api: client.KubeClient,
        bootstrap: str,
        topic: str,
        identity: str,
        address_of: Callable[[str], peers.Address],
    ) -> None:
        self.identity = identity
        self.address = address_of(identity)
        config = operator_config.OperatorConfig(
            bootstrap_servers=bootstrap,
            state_topic=topic,
            state_partitions=STATE_PARTITIONS,
            api_host="127.0.0.1",
            kafka_port=self.address[1],
            leases=operator_config.LeaseConfig(
                namespace=NS,
                pod_name=identity,
                replicas=len(NAMES),
                statefulset="kgo",
                lease_prefix="kgo-partition",
                peer_url="http://{identity}.kgo-headless:8080",
                lease_duration_seconds=LEASE_S,
            ),
        )
        self.runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=bootstrap,
                topic=topic,
                partitions=STATE_PARTITIONS,
                write_timeout_ms=5000,
                metadata_interval_ms=1000,
                served_partitions=frozenset(),
            )
        )
        shards = lifecycle._shards(config, api, self.runtime)
        assert shards is not None
        self.shards = shards
        self.listener = protocol_listener.Listener(
            self.runtime, None, lifecycle.listener_config(config, shards, address_of)
        )
        self.stopped = False

    @property
    def node(self) -> tuple[int, str, int]:
        return (peers.node_id_for(self.address), *self.address)

    async def start(self) -> None:
        await asyncio.wait_for(self.runtime.start(), 60)
        self.shards.start()
        await self.listener.start()

    async def stop(self) -> None:
        """As the operator's cleanup: the listener, then the Leases, then the runtime."""
        if self.stopped:
            return
        self.stopped = True
        await self.listener.stop()
        await self.shards.stop()
        await self.runtime.stop()


@pytest.fixture
async def pair(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker
) -> AsyncIterator[dict[str, Replica]]:
    """Both replicas started, each serving its one partition (the fair share of two)."""
    api = client.KubeClient(client.Credentials(server=str(kmock.url)))
    address_of = peers.address_map({name: ("127.0.0.1", embedded.free_port()) for name in NAMES})
    topic = logs.unique_topic()
    made = {name: Replica(api, broker.bootstrap, topic, name, address_of) for name in NAMES}
    try:
        await asyncio.gather(*(replica.start() for replica in made.values()))
        await _until(
            lambda: all(
                len(r.runtime.served_partitions) == 1
                and r.runtime.partition_state(_group_on(next(iter(r.runtime.served_partitions))))
                is State.ACTIVE
                # ... and each has read the other's Lease since (once per election round).
                and all(r.shards.elector.holder(p) is not None for p in range(STATE_PARTITIONS))
                for r in made.values()
            ),
            60,
        )
        yield made
    finally:
        await asyncio.gather(*(replica.stop() for replica in made.values()))
        await api.close()


def _group_on(partition: int, prefix: str = "g") -> str:
    index = 0
    while partitioning.partition_for(f"{prefix}-{index}", STATE_PARTITIONS) != partition:
        index += 1
    return f"{prefix}-{index}"


async def _until(condition: Callable[[], bool], seconds: float = 30) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if condition():
                return
            await asyncio.sleep(0.05)


def _split(pair: dict[str, Replica]) -> tuple[Replica, Replica]:
    """The replica serving partition 0, then the one serving partition 1."""
    first = next(r for r in pair.values() if r.runtime.serving(0))
    second = next(r for r in pair.values() if r is not first)
    assert second.runtime.serving(1)
    return first, second


async def _find(port: int, groups: list[str]) -> list[tuple[ErrorCode, tuple[int, str, int]]]:
    connection = await Connection.open(port)
    try:
        found = await connection.call(
            FindCoordinatorRequest(key_type=i8(0), coordinator_keys=tuple(groups))
        )
    finally:
        await connection.close()
    assert [c.key for c in found.coordinators] == groups
    return [
        (ErrorCode(c.error_code), (int(c.node_id), c.host, int(c.port))) for c in found.coordinators
    ]


async def _fetch_error(port: int, group: str) -> ErrorCode:
    connection = await Connection.open(port)
    try:
        reply = await connection.call(
            OffsetFetchRequest(
                groups=(OffsetFetchRequestGroup(group_id=GroupId(group), topics=None),),
                require_stable=False,
            )
        )
    finally:
        await connection.close()
    return ErrorCode(reply.groups[0].error_code)


async def test_find_coordinator_names_the_lease_holder_and_follows_a_handover(
    pair: dict[str, Replica],
) -> None:
    holders = _split(pair)
    groups = [_group_on(0, "find"), _group_on(1, "find")]
    for asked in holders:
        # Both listeners name each group's holder, by the holder's own address.
        assert await _find(asked.address[1], groups) == [
            (ErrorCode.none, holders[0].node),
            (ErrorCode.none, holders[1].node),
        ]
        connection = await Connection.open(asked.address[1])
        try:
            metadata = await connection.call(
                MetadataRequest(
                    topics=(),
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            )
        finally:
            await connection.close()
        assert sorted((int(b.node_id), b.host, int(b.port)) for b in metadata.brokers) == sorted(
            r.node for r in holders
        )
        other = 1 if asked is holders[0] else 0
        assert await _fetch_error(asked.address[1], groups[other]) == ErrorCode.not_coordinator

    # The holder of partition 1 stops and releases its Lease: the other takes it over, and
    # its FindCoordinator then names itself. Meanwhile it names the old holder or nobody
    # (retriable), never anyone else.
    stays, leaves = holders
    await leaves.stop()
    seen: set[tuple[ErrorCode, tuple[int, str, int]]] = set()
    deadline = time.monotonic() + 60
    while True:
        (answer,) = await _find(stays.address[1], [groups[1]])
        seen.add(answer)
        if answer == (ErrorCode.none, stays.node):
            break
        assert time.monotonic() < deadline, f"no handover; answers {seen}"
        await asyncio.sleep(0.1)
    assert seen <= {
        (ErrorCode.none, leaves.node),
        (ErrorCode.coordinator_not_available, (-1, "", -1)),
        (ErrorCode.none, stays.node),
    }
    await _until(lambda: stays.runtime.partition_state(groups[1]) is State.ACTIVE, 60)
    assert await _fetch_error(stays.address[1], groups[1]) == ErrorCode.none
    assert await _find(stays.address[1], groups) == [(ErrorCode.none, stays.node)] * 2


def consume(port: int, group: str, topic: str) -> list[tuple[int, int]]:
    """An unmodified confluent-kafka consumer (KIP-848): every record, then a commit."""
    settings: dict[str, Any] = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "group.id": group,
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "log_level": 0,
    }
    consumer = Consumer(settings)
    records: list[tuple[int, int]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records) < PARTITIONS * PER_PARTITION:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                partition, offset = message.partition(), message.offset()
                assert partition is not None
                assert offset is not None
                records.append((partition, offset))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return sorted(records)


async def test_a_consumer_through_the_gateway_reaches_the_lease_holder(
    pair: dict[str, Replica], broker: embedded.EmbeddedBroker
) -> None:
    given, holder = _split(pair)
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION)
    group = _group_on(1, f"gateway-{uuid.uuid4().hex[:4]}")
    gateway = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=given.address,
            port=0,
        )
    )
    await gateway.start()
    try:
        records = await asyncio.to_thread(consume, gateway.port, group, topic)
        assert records == [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)]
        # The gateway opened a port for the holder's listener, and the commit went there.
        assert list(gateway.peer_ports()) == [holder.address]
    finally:
        await gateway.stop()
    fetched = await holder.runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    assert {tp[1]: c.offset for tp, c in fetched.offsets.items() if tp[0] == topic} == {
        p: PER_PARTITION for p in range(PARTITIONS)
    }
    assert await _fetch_error(given.address[1], group) == ErrorCode.not_coordinator


def test_lease_peers_name_nobody_between_holders_and_refuse_bad_templates() -> None:
    held: dict[int, str] = {0: "kgo-0"}
    lease_peers = peers.LeasePeers(
        partitions=STATE_PARTITIONS,
        identity="kgo-1",
        replicas=NAMES,
        address_of=peers.address_template("{identity}.kgo-headless.ns.svc:9092"),
        serving=lambda partition: False,
        holder=held.get,
    )
    assert lease_peers.own == ("kgo-1.kgo-headless.ns.svc", 9092)
    assert lease_peers.addresses() == [("kgo-0.kgo-headless.ns.svc", 9092)]
    assert lease_peers.locate(_group_on(0)) == peers.Location(
        0, False, ("kgo-0.kgo-headless.ns.svc", 9092)
    )
    assert lease_peers.locate(_group_on(1)) == peers.Location(1, False, None)
    held[1] = "kgo-1"  # held here, not yet taken: this listener
    assert lease_peers.locate(_group_on(1)) == peers.Location(1, True, None)
    # A holder with no address (not among the replicas of this map): nobody known.
    mapped = dataclasses.replace(
        lease_peers,
        address_of=peers.address_map({n: ("127.0.0.1", 9092 + i) for i, n in enumerate(NAMES)}),
    )
    held[0] = "kgo-2"
    assert mapped.locate(_group_on(0)) == peers.Location(0, False, None)
    assert mapped.addresses() == [("127.0.0.1", 9092)]
    for template, message in (
        ("kgo.svc:9092", "no {identity}"),
        ("{identity}.svc", "is not host:port"),
        ("{identity}.svc:http", "is not host:port"),
    ):
        with pytest.raises(operator_config.ConfigError, match=re.escape(message)) as raised:
            operator_config.LeaseConfig.from_env(
                {
                    "KGO_REPLICAS": "2",
                    "KGO_POD_NAME": "kgo-0",
                    "KGO_NAMESPACE": NS,
                    "KGO_KAFKA_PEER_ADDRESS": template,
                }
            )
        assert "KGO_KAFKA_PEER_ADDRESS" in str(raised.value)
    default = operator_config.LeaseConfig.from_env(
        {
            "KGO_REPLICAS": "2",
            "KGO_POD_NAME": "kgo-0",
            "KGO_NAMESPACE": NS,
            "KGO_KAFKA_PORT": "9093",
        }
    )
    assert default is not None
    assert default.kafka_peer_address == "{identity}.kgo-headless.kgo-system.svc:9093"
