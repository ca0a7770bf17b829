"""Clients that work on Kafka 3.x, for real, through the gateway to the coordinator listener:
each consumes what a topic holds, commits, stops; a new process of the same client then
resumes exactly from the commit (nothing consumed twice, nothing skipped).

- sarama (Go) as old applications configure it: ``Version`` 0.10.2.0 (JoinGroup v1,
  OffsetCommit v2, OffsetFetch v2); sarama 1.40.1, the last that, like
  sarama 1.22, commits with OffsetCommit v1 inside its group; sarama's offset manager of
  Kafka 0.8.2 (member-less OffsetCommit and OffsetFetch v1); and v0 of both through sarama's
  own encoder;
- kafka-python with ``api_version=(0, 10, 0)`` (JoinGroup v0, OffsetCommit v2, OffsetFetch v1);
- segmentio kafka-go, whose version-1 subscription has no owned partitions (it was refused
  with INCONSISTENT_GROUP_PROTOCOL and retried every 5 ms);
- franz-go (its version-3 subscription; capped at Kafka 4.0's versions, see its test) and
  librdkafka, for the subscription bytes.

The listener here records the version of every request and each JoinGroup's subscription,
so the tests also check which versions each client really sent and that its subscription is
the byte vector ``test_consumer_protocol`` pins.
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer
from kafka import KafkaConsumer

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import dispatch, routes
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from tests.protocol.test_consumer_protocol import FIRST_JOINS, ORDERS
from tests.protocol.test_kip848 import topic_id
from tests.support import goclients, topics

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

PARTITIONS, FIRST, MORE = 3, 5, 2
# Kafka 4 removed Fetch below v4 and Produce below v3 (KIP-896): clients configured for
# Kafka 0.10 fetch with v2/v3 and get their connection closed by the brokers themselves.
OLD_FETCH = pytest.mark.kafka_cannot(
    "it serves no Fetch below v4 (KIP-896), which this client configured for Kafka 0.10 sends"
)
OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP = 8, 9, 11


@dataclasses.dataclass
class Recorded:
    """(client id, API key, version) of every request the listener served, and the
    subscription bytes of every JoinGroup by client id."""

    requests: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    subscriptions: dict[str, list[bytes]] = dataclasses.field(default_factory=dict)
    # Set by a translation, for the handler call that follows it at once (the listener
    # reads a request and calls its handler with no await in between).
    translated: bool = False

    def versions(self, client_id: str, api_key: int) -> set[int]:
        return {v for c, k, v in self.requests if c == client_id and k == api_key}


def recording_routes(recorded: Recorded) -> Mapping[int, dispatch.Route]:
    """``routes.ROUTES`` with each handler and translation noting what it was sent."""

    def handler(route: dispatch.Route) -> dispatch.Handler:
        async def handle(ctx: dispatch.RequestContext, request: Any) -> Any:
            client_id = ctx.header.client_id or ""
            if not recorded.translated:  # a translation noted the version it was sent
                recorded.requests.append((client_id, route.api_key, ctx.api_version))
            recorded.translated = False
            if route.api_key == JOIN_GROUP and request.protocols:
                recorded.subscriptions.setdefault(client_id, []).append(
                    request.protocols[0].metadata
                )
            return await route.handler(ctx, request)

        return handle

    def translation(route: dispatch.Route, version: int) -> dispatch.Translation:
        original = route.translations[version]

        def read(reader: Any) -> Any:
            # The client id is the header's last field, just before the body.
            client_id = "?"
            with_id = reader.data[8 : reader.position]
            if len(with_id) >= 2:
                client_id = with_id[2:].decode()
            recorded.requests.append((client_id, route.api_key, version))
            recorded.translated = True
            return original.read(reader)

        return dispatch.Translation(original.served_as, read)

    return {
        key: dataclasses.replace(
            route,
            handler=handler(route),
            translations={v: translation(route, v) for v in route.translations},
        )
        for key, route in routes.ROUTES.items()
    }


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def recorded(broker: embedded.EmbeddedBroker) -> Recorded:
    """Anew for each broker: a client's first join is the one on this broker's topic."""
    return Recorded()


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def gateway(
    broker: embedded.EmbeddedBroker,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
) -> AsyncIterator[protocol_gateway.Gateway]:
    listener = protocol_listener.Listener(
        runtime, None, protocol_listener.ListenerConfig(port=0), recording_routes(recorded)
    )
    await listener.start()
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", listener.port),
            port=0,
        )
    )
    await served.start()
    yield served
    await served.stop()
    await listener.stop()


@pytest.fixture(scope="module", autouse=True)
def go_clients_built() -> None:
    """Both Go builds, before any test's clock runs (a cold build takes minutes)."""
    for variant in goclients.MODFILES:
        goclients.binary(variant)


async def new_topic(broker: embedded.EmbeddedBroker, runtime: Any) -> str:
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=FIRST)
    await topic_id(runtime, topic)
    return topic


def records(first: int, count: int) -> list[tuple[int, int, str]]:
    return sorted(
        (p, offset, f"m{offset}")
        for p in range(PARTITIONS)
        for offset in range(first, first + count)
    )


async def committed(runtime: Any, group: str, topic: str) -> dict[int, int]:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return {p: c.offset for (t, p), c in fetched.offsets.items() if t == topic}


async def resumes_from_its_commit(
    broker: embedded.EmbeddedBroker, runtime: Any, topic: str, group: str, consume: Any
) -> None:
    """``consume(expect)`` twice: all of the topic, then only what came after the commit."""
    first = await asyncio.to_thread(consume, PARTITIONS * FIRST)
    assert sorted(first) == records(0, FIRST)
    assert await committed(runtime, group, topic) == dict.fromkeys(range(PARTITIONS), FIRST)
    topics.produce(broker.bootstrap, topic, range(PARTITIONS), MORE, first=FIRST)
    second = await asyncio.to_thread(consume, PARTITIONS * MORE)
    assert sorted(second) == records(FIRST, MORE)
    assert await committed(runtime, group, topic) == dict.fromkeys(range(PARTITIONS), FIRST + MORE)


def go_consumer(variant: str, mode: str, port: int, group: str, topic: str, *extra: str) -> Any:
    def consume(expect: int) -> list[tuple[int, int, str]]:
        done = goclients.run(
            variant, mode, "-bootstrap", f"127.0.0.1:{port}", "-group", group,
            "-topic", topic, "-expect", str(expect), *extra,
        )  # fmt: skip
        assert done.code == 0, done.stderr[-3000:]
        return [(r["partition"], r["offset"], r["value"]) for r in done.lines]

    return consume


# ---------------------------------------------------------------------------------------
# sarama


@pytest.mark.parametrize(
    ("variant", "commit_version"),
    [("current", 2), ("sarama-1.40", 1)],
    ids=["sarama-newest", "sarama-1.40"],
)
@OLD_FETCH
async def test_sarama_group_of_kafka_0_10_2_resumes_from_its_commit(
    broker: embedded.EmbeddedBroker,
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
    variant: str,
    commit_version: int,
) -> None:
    topic = await new_topic(broker, runtime)
    group = f"sarama-{variant}-{uuid.uuid4().hex[:6]}"
    consume = go_consumer(variant, "sarama-group", gateway.port, group, topic)
    await resumes_from_its_commit(broker, runtime, topic, group, consume)
    client_id = "sarama-0.10.2.0"
    assert commit_version in recorded.versions(client_id, OFFSET_COMMIT)
    assert recorded.versions(client_id, JOIN_GROUP) == {1}
    first_join = FIRST_JOINS["sarama v0 (and 1.22)"].replace(ORDERS, _string(topic).hex())
    assert recorded.subscriptions[client_id][-1] == bytes.fromhex(first_join)


def _string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


async def test_sarama_offset_manager_commits_member_less_with_version_1(
    broker: embedded.EmbeddedBroker,
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
) -> None:
    topic = await new_topic(broker, runtime)
    group = f"sarama-offsets-{uuid.uuid4().hex[:6]}"
    arguments = ["-bootstrap", f"127.0.0.1:{gateway.port}", "-group", group, "-topic", topic]
    before = await asyncio.to_thread(
        goclients.run, "current", "sarama-offsets", *arguments, "-commit", "4"
    )
    assert before.code == 0, before.stderr
    assert before.lines == [{"partition": p, "committed": -1} for p in range(PARTITIONS)]
    after = await asyncio.to_thread(goclients.run, "current", "sarama-offsets", *arguments)
    assert after.code == 0, after.stderr
    assert after.lines == [{"partition": p, "committed": 4} for p in range(PARTITIONS)]
    assert await committed(runtime, group, topic) == dict.fromkeys(range(PARTITIONS), 4)
    assert recorded.versions("sarama-0.8.2.0", OFFSET_COMMIT) >= {1}
    assert recorded.versions("sarama-0.8.2.0", OFFSET_FETCH) >= {1}


async def test_sarama_version_0_commit_and_fetch(
    broker: embedded.EmbeddedBroker,
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
) -> None:
    topic = await new_topic(broker, runtime)
    group = f"sarama-v0-{uuid.uuid4().hex[:6]}"
    arguments = ["-bootstrap", f"127.0.0.1:{gateway.port}", "-group", group, "-topic", topic]
    done = await asyncio.to_thread(
        goclients.run, "current", "sarama-v0", *arguments, "-commit", "3"
    )
    assert done.code == 0, done.stderr
    assert done.lines == [{"partition": p, "committed": 3} for p in range(PARTITIONS)]
    assert await committed(runtime, group, topic) == dict.fromkeys(range(PARTITIONS), 3)
    assert {0} <= recorded.versions("sarama-0.8.2.0", OFFSET_COMMIT)
    assert {0} <= recorded.versions("sarama-0.8.2.0", OFFSET_FETCH)


# ---------------------------------------------------------------------------------------
# segmentio kafka-go, franz-go


async def test_segmentio_kafka_go_joins_and_resumes_from_its_commit(
    broker: embedded.EmbeddedBroker,
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
) -> None:
    topic = await new_topic(broker, runtime)
    group = f"segmentio-{uuid.uuid4().hex[:6]}"
    consume = go_consumer("current", "segmentio-group", gateway.port, group, topic)
    await resumes_from_its_commit(broker, runtime, topic, group, consume)
    # Its version-1 subscription ends after the user data, as pinned.
    (client_id,) = {c for c, s in recorded.subscriptions.items() if _subscribes(s, topic)}
    expected = bytes.fromhex("0001" + "00000001") + _string(topic) + bytes.fromhex("ffffffff")
    assert set(recorded.subscriptions[client_id]) == {expected}
    # One join per member id round per run: it was not retrying in a loop.
    assert len(recorded.subscriptions[client_id]) <= 4


async def test_franz_go_resumes_from_its_commit(
    broker: embedded.EmbeddedBroker,
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
) -> None:
    topic = await new_topic(broker, runtime)
    group = f"franz-{uuid.uuid4().hex[:6]}"
    # At most Kafka 4.0's versions: the embedded broker closes the connection on the newest
    # ApiVersions franz-go sends (directly as through the gateway).
    consume = go_consumer(
        "current", "franz-group", gateway.port, group, topic, "-version", "v4.0.0"
    )
    await resumes_from_its_commit(broker, runtime, topic, group, consume)
    (client_id,) = {c for c, s in recorded.subscriptions.items() if _subscribes(s, topic)}
    first_join = bytes.fromhex(FIRST_JOINS["franz-go"].replace(ORDERS, _string(topic).hex()))
    assert recorded.subscriptions[client_id][0] == first_join


def _subscribes(subscriptions: list[bytes], topic: str) -> bool:
    return any(_string(topic) in subscription for subscription in subscriptions)


# ---------------------------------------------------------------------------------------
# kafka-python and librdkafka


def kafka_python_consumer(port: int, group: str, topic: str, api_version: tuple[int, ...]) -> Any:
    def consume(expect: int) -> list[tuple[int, int, str]]:
        consumer = KafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{port}",
            group_id=group,
            client_id=f"kafka-python-{'.'.join(map(str, api_version))}",
            api_version=api_version,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=500,
        )
        got: list[tuple[int, int, str]] = []
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(got) < expect:
                for batch in consumer.poll(timeout_ms=200).values():
                    got.extend((m.partition, m.offset, m.value.decode()) for m in batch)
            consumer.commit()
        finally:
            consumer.close()
        return got

    return consume


@OLD_FETCH
async def test_kafka_python_of_kafka_0_10_resumes_from_its_commit(
    broker: embedded.EmbeddedBroker,
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
) -> None:
    topic = await new_topic(broker, runtime)
    group = f"kafka-python-old-{uuid.uuid4().hex[:6]}"
    # Committed offsets to start from: the embedded broker answers ListOffsets v0 (what
    # kafka-python of Kafka 0.10.0 would send to reset a position) in a layout kafka-python
    # cannot read, directly as through the gateway.
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=group,
            member_id="",
            member_epoch=messages.LEAVE_EPOCH,
            offsets={(topic, p): messages.CommitOffset(0) for p in range(PARTITIONS)},
        )
    )
    consume = kafka_python_consumer(gateway.port, group, topic, (0, 10, 0))
    await resumes_from_its_commit(broker, runtime, topic, group, consume)
    client_id = "kafka-python-0.10.0"
    assert recorded.versions(client_id, JOIN_GROUP) == {0}
    assert recorded.versions(client_id, OFFSET_COMMIT) == {2}
    assert recorded.versions(client_id, OFFSET_FETCH) == {1}
    first_join = bytes.fromhex(FIRST_JOINS["kafka-python"].replace(ORDERS, _string(topic).hex()))
    assert recorded.subscriptions[client_id][0] == first_join


async def test_librdkafkas_subscription_is_the_pinned_vector(
    broker: embedded.EmbeddedBroker,
    gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    recorded: Recorded,
) -> None:
    topic = await new_topic(broker, runtime)
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{gateway.port}",
            "group.id": f"librdkafka-{uuid.uuid4().hex[:6]}",
            "client.id": f"librdkafka-{topic}",
            "group.protocol": "classic",
            "partition.assignment.strategy": "range",
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while f"librdkafka-{topic}" not in recorded.subscriptions:
            assert time.monotonic() < deadline, "librdkafka never joined"
            await asyncio.to_thread(consumer.poll, 0.2)
    finally:
        await asyncio.to_thread(consumer.close)
    first_join = bytes.fromhex(FIRST_JOINS["librdkafka"].replace(ORDERS, _string(topic).hex()))
    assert recorded.subscriptions[f"librdkafka-{topic}"][0] == first_join
