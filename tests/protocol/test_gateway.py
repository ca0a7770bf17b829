"""The gateway between unmodified Kafka clients and the embedded broker plus the coordinator
listener (SASL/PLAIN with the group's token): a confluent-kafka consumer with
``group.protocol=consumer`` joins, consumes from the committed offsets and commits; kafka-python
reads metadata and fetches; rewritten replies point at the gateway's own ports."""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_cluster.v1.request import DescribeClusterRequest
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorV3
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import TopicName
from kio.static.primitive import i8

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.protocol import routes
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_operator.wire import framing
from tests.protocol.test_kip848 import topic_id
from tests.protocol.wire import Connection
from tests.support import topics

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

GROUP, TOKEN = "gateway-group", "gateway-token"
PARTITIONS, PER_PARTITION = 3, 5


@pytest.fixture(scope="module")
def gateway_topic(broker: embedded.EmbeddedBroker) -> str:
    return topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION)


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def token_listener(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> AsyncIterator[protocol_listener.Listener]:
    """A listener that requires the token of ``GROUP`` (SASL/PLAIN)."""
    served = protocol_listener.Listener(
        runtime, tokens.GroupTokens({GROUP: TOKEN}), protocol_listener.ListenerConfig(port=0)
    )
    await served.start()
    yield served
    await served.stop()


def gateway_config(broker: embedded.EmbeddedBroker, listener_port: int) -> Any:
    return protocol_gateway.GatewayConfig(
        bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
        coordinator=("127.0.0.1", listener_port),
        coordinator_security=kafka_connection.Security(
            sasl=kafka_connection.Sasl("PLAIN", GROUP, TOKEN)
        ),
        port=0,
    )


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def gateway(
    broker: embedded.EmbeddedBroker, token_listener: protocol_listener.Listener
) -> AsyncIterator[protocol_gateway.Gateway]:
    served = protocol_gateway.Gateway(gateway_config(broker, token_listener.port))
    await served.start()
    yield served
    await served.stop()


def consume_and_commit(port: int, topic: str, expected: int) -> list[tuple[Any, ...]]:
    """A plain confluent-kafka KIP-848 consumer: every record it gets, then a commit."""
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": GROUP,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    records: list[tuple[Any, ...]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records) < expected:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.partition(), message.offset(), message.value()))
        # A little longer: nothing beyond the expected records may come.
        end = time.monotonic() + 1
        while time.monotonic() < end:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                records.append((message.partition(), message.offset(), message.value()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return records


async def test_confluent_kafka_consumer_joins_consumes_from_committed_and_commits(
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    gateway_topic: str,
) -> None:
    await topic_id(runtime, gateway_topic)
    # Partition 0 resumes after its committed offset; the others start from the earliest.
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=GROUP,
            member_id="",
            member_epoch=-1,
            offsets={(gateway_topic, 0): messages.CommitOffset(2)},
        )
    )
    expected = sorted(
        (partition, offset, f"m{offset}".encode())
        for partition in range(PARTITIONS)
        for offset in range(2 if partition == 0 else 0, PER_PARTITION)
    )
    records = await asyncio.to_thread(
        consume_and_commit, gateway.port, gateway_topic, len(expected)
    )
    assert sorted(records) == expected
    # The commit reached the coordinator (not the brokers' own group), and close() left.
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(GROUP))
    assert {tp: o.offset for tp, o in fetched.offsets.items()} == {
        (gateway_topic, partition): PER_PARTITION for partition in range(PARTITIONS)
    }
    assert (await runtime.describe_group(GROUP)).members == ()


def kafka_python_fetch(port: int, topic: str) -> list[tuple[int, int, bytes]]:
    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
    )
    try:
        partitions = consumer.partitions_for_topic(topic)
        assert partitions == set(range(PARTITIONS))
        consumer.assign([KafkaTopicPartition(topic, p) for p in sorted(partitions)])
        records: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records) < PARTITIONS * PER_PARTITION:
            for batch in consumer.poll(500).values():
                records.extend((r.partition, r.offset, r.value) for r in batch)
        return records
    finally:
        consumer.close()


async def test_kafka_python_reads_metadata_and_fetches(
    gateway: protocol_gateway.Gateway, gateway_topic: str
) -> None:
    records = await asyncio.to_thread(kafka_python_fetch, gateway.port, gateway_topic)
    assert sorted(records) == sorted(
        (partition, offset, f"m{offset}".encode())
        for partition in range(PARTITIONS)
        for offset in range(PER_PARTITION)
    )


async def test_replies_point_at_the_gateway(
    gateway: protocol_gateway.Gateway,
    broker: embedded.EmbeddedBroker,
    gateway_topic: str,
) -> None:
    host, port = kafka_connection.parse_servers(broker.bootstrap)[0]
    direct = await Connection.open(port, host)
    through = await Connection.open(gateway.port)
    try:
        metadata = MetadataRequest(
            topics=(
                MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TopicName(gateway_topic)),
            ),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        upstream, local = await direct.call(metadata), await through.call(metadata)
        ports = gateway.broker_ports()
        # The brokers, each at its local port, and the coordinator FindCoordinator names
        # (clients drop a coordinator that is not a node of the cluster); the same topics:
        # the coordinator leads no partition and is not the controller.
        assert [(b.node_id, b.host, b.port) for b in local.brokers] == [
            *((b.node_id, "127.0.0.1", ports[b.node_id]) for b in upstream.brokers),
            (1_000_000, "127.0.0.1", gateway.port),
        ]
        assert local.topics == upstream.topics
        assert local.controller_id == upstream.controller_id
        # A group's coordinator is the coordinator port, on it and on every broker port.
        find = FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(GROUP,))
        on_broker_port = await Connection.open(next(iter(ports.values())))
        try:
            for connection in (through, on_broker_port):
                (coordinator,) = (await connection.call(find)).coordinators
                assert (coordinator.node_id, coordinator.host, coordinator.port) == (
                    1_000_000,
                    "127.0.0.1",
                    gateway.port,
                )
                assert coordinator.error_code == 0
        finally:
            await on_broker_port.close()
        # ApiVersions on the coordinator port: the group APIs are the listener's, the rest
        # the broker's.
        versions = ApiVersionsRequest(client_software_name="t", client_software_version="1")
        broker_keys = {
            int(k.api_key): (k.min_version, k.max_version)
            for k in (await direct.call(versions)).api_keys
        }
        merged = {
            int(k.api_key): (k.min_version, k.max_version)
            for k in (await through.call(versions)).api_keys
        }
        heartbeat = routes.ROUTES[68]
        assert merged[68] == (heartbeat.min_version, heartbeat.max_version)
        assert merged[1] == broker_keys[1]  # Fetch
        assert set(merged) - protocol_gateway.GROUP_APIS == set(broker_keys) - (
            protocol_gateway.GROUP_APIS
        )
    finally:
        await direct.close()
        await through.close()


async def test_describe_cluster_and_other_coordinators_point_at_the_gateway(
    gateway: protocol_gateway.Gateway, broker: embedded.EmbeddedBroker
) -> None:
    host, port = kafka_connection.parse_servers(broker.bootstrap)[0]
    direct = await Connection.open(port, host)
    through = await Connection.open(gateway.port)
    try:
        describe = DescribeClusterRequest(
            include_cluster_authorized_operations=False, endpoint_type=i8(1)
        )
        upstream, local = await direct.call(describe), await through.call(describe)
        ports = gateway.broker_ports()
        assert [(b.broker_id, b.host, b.port) for b in local.brokers] == [
            *((b.broker_id, "127.0.0.1", ports[b.broker_id]) for b in upstream.brokers),
            (1_000_000, "127.0.0.1", gateway.port),
        ]
        assert local.cluster_id == upstream.cluster_id
        assert local.controller_id == upstream.controller_id
        # A transaction coordinator is a broker's business: its local port, from the
        # coordinator port too (routed to a broker, not to the group coordinator).
        transaction = FindCoordinatorRequest(key_type=i8(1), coordinator_keys=("tx-1",))
        (expected,) = (await direct.call(transaction)).coordinators
        (coordinator,) = (await through.call(transaction)).coordinators
        assert (coordinator.node_id, coordinator.host, coordinator.port) == (
            expected.node_id,
            "127.0.0.1",
            ports[expected.node_id],
        )
        # FindCoordinator before batching (v3: one key) on a broker port.
        on_broker_port = await Connection.open(ports[expected.node_id])
        try:
            single = await on_broker_port.call(FindCoordinatorV3(key=GROUP, key_type=i8(0)))
        finally:
            await on_broker_port.close()
        assert (single.error_code, single.node_id, single.host, single.port) == (
            0,
            1_000_000,
            "127.0.0.1",
            gateway.port,
        )
    finally:
        await direct.close()
        await through.close()


async def test_rewritten_apis_are_capped_at_what_kio_reads_on_every_port(
    gateway: protocol_gateway.Gateway, broker: embedded.EmbeddedBroker
) -> None:
    host, port = kafka_connection.parse_servers(broker.bootstrap)[0]
    versions = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    direct = await Connection.open(port, host)
    try:
        upstream = {int(k.api_key): k for k in (await direct.call(versions)).api_keys}
    finally:
        await direct.close()
    opener = await Connection.open(gateway.port)
    try:
        everything = MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        assert (await opener.call(everything)).brokers  # opens the broker ports
    finally:
        await opener.close()
    for local_port in [gateway.port, *gateway.broker_ports().values()]:
        through = await Connection.open(local_port)
        try:
            seen = {int(k.api_key): k for k in (await through.call(versions)).api_keys}
        finally:
            await through.close()
        for api_key in (3, 10, 60):  # Metadata, FindCoordinator, DescribeCluster
            kio_max = max(v for v in range(40) if framing.request_type(api_key, v) is not None)
            if api_key in upstream and not (api_key == 10 and local_port == gateway.port):
                assert seen[api_key].max_version == min(upstream[api_key].max_version, kio_max)
                assert seen[api_key].min_version == upstream[api_key].min_version
        # Everything else passes as the broker said (the group APIs aside, on the coordinator
        # port).
        for api_key, key in upstream.items():
            if api_key not in (3, 10, 60) and api_key not in protocol_gateway.GROUP_APIS:
                assert (seen[api_key].min_version, seen[api_key].max_version) == (
                    key.min_version,
                    key.max_version,
                )


async def test_a_broker_newer_than_kio_is_capped() -> None:
    # A broker of a later Kafka than kio's schemas advertises Metadata versions the gateway
    # could not rewrite: clients must not pick them.
    from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i16

    newer = ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(
            ApiVersion(api_key=i16(1), min_version=i16(4), max_version=i16(99)),  # Fetch
            ApiVersion(api_key=i16(3), min_version=i16(0), max_version=i16(99)),  # Metadata
        ),
        throttle_time=datetime.timedelta(0),  # type: ignore[arg-type]
        supported_features=(),
        finalized_features_epoch=-1,  # type: ignore[arg-type]
        finalized_features=(),
        zk_migration_ready=False,
    )
    unused = protocol_gateway.GatewayConfig(bootstrap_servers=(("k", 1),), coordinator=("c", 1))
    capped = protocol_gateway.Gateway(unused)._merge_versions(newer, coordinator_port=False)
    metadata_max = max(v for v in range(200) if framing.request_type(3, v) is not None)
    assert [(k.api_key, k.min_version, k.max_version) for k in capped.api_keys] == [
        (1, 4, 99),  # passed through: never decoded
        (3, 0, metadata_max),
    ]


async def test_the_clients_connection_closes_with_the_listeners(
    broker: embedded.EmbeddedBroker, runtime: coordinator_runtime.CoordinatorRuntime
) -> None:
    """A client's connection to the coordinator port lives as long as the gateway's own to the
    coordinator listener: while the listener serves, it stays open between requests; when the
    listener goes (its replica stopped or died), the client's connection is closed too, as a
    dead coordinator's would be, so the client looks its coordinator up again at once. The
    gateway goes on accepting connections."""
    listener = protocol_listener.Listener(
        runtime, tokens.GroupTokens({GROUP: TOKEN}), protocol_listener.ListenerConfig(port=0)
    )
    await listener.start()
    served = protocol_gateway.Gateway(gateway_config(broker, listener.port))
    await served.start()
    client = await Connection.open(served.port)
    try:
        # ApiVersions opens the connection to the listener (its versions are advertised).
        assert (
            await client.call(
                ApiVersionsRequest(client_software_name="t", client_software_version="1")
            )
        ).error_code == 0
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.reader.read(1), 1.0)  # open while the listener is
        await listener.stop()
        assert await client.closed_by_peer()
        later = await Connection.open(served.port)
        everything = MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        try:
            assert (await later.call(everything)).brokers
        finally:
            await later.close()
    finally:
        await client.close()
        await served.stop()
        await listener.stop()
