"""SASL while the groups' tokens are still loading (an operator that just started): the
listener holds SaslAuthenticate until they are loaded, and past its hold answers the
retriable ``COORDINATOR_LOAD_IN_PROGRESS`` instead of an authentication failure, which clients
treat as fatal. Unmodified clients that connect during the load simply get in."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer
from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.types import GroupId

from kafka_group_operator.access import tokens
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from tests.protocol.test_clients import kafka_python_admin
from tests.protocol.test_kip848 import topic_id
from tests.protocol.test_listener import plain
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

GROUP, TOKEN = "loading-group", "loading-token"


@pytest_asyncio.fixture(loop_scope="package")
async def loading() -> AsyncIterator[tuple[tokens.GroupTokens, Any]]:
    """A token store still loading, and a starter of listeners in front of it."""
    store = tokens.GroupTokens(loaded=False)
    started: list[protocol_listener.Listener] = []

    async def start(
        runtime: coordinator_runtime.CoordinatorRuntime, hold_s: float
    ) -> protocol_listener.Listener:
        served = protocol_listener.Listener(
            runtime, store, protocol_listener.ListenerConfig(port=0, loading_hold_s=hold_s)
        )
        await served.start()
        started.append(served)
        return served

    yield store, start
    for served in started:
        await served.stop()


def finish_loading_later(store: tokens.GroupTokens, delay_s: float) -> threading.Timer:
    """The operator's token reader: the group's token, then the store marked loaded."""

    def finish() -> None:
        store.set(GROUP, TOKEN)
        store.mark_loaded()

    timer = threading.Timer(delay_s, finish)
    timer.start()
    return timer


async def sasl(connection: Connection) -> Any:
    handshake = await connection.call(SaslHandshakeRequest(mechanism="PLAIN"))
    assert handshake.error_code == ErrorCode.none
    return await connection.call(SaslAuthenticateRequest(auth_bytes=plain(GROUP, TOKEN)))


async def test_authentication_is_held_until_the_tokens_are_loaded(
    runtime: coordinator_runtime.CoordinatorRuntime, loading: Any
) -> None:
    store, start = loading
    served = await start(runtime, 30.0)
    connection = await Connection.open(served.port)
    try:
        finish_loading_later(store, 0.5)
        reply = await sasl(connection)
        assert (reply.error_code, reply.error_message) == (ErrorCode.none, None)
        assert store.loaded
        # The connection is authenticated as the group and serves it.
        fetched = await connection.call(
            OffsetFetchRequest(
                groups=(OffsetFetchRequestGroup(group_id=GroupId(GROUP), topics=None),),
                require_stable=False,
            )
        )
        assert [g.error_code for g in fetched.groups] == [ErrorCode.none]
    finally:
        await connection.close()


async def test_past_the_hold_the_answer_is_retriable_and_the_connection_closed(
    runtime: coordinator_runtime.CoordinatorRuntime, loading: Any
) -> None:
    store, start = loading
    served = await start(runtime, 0.3)
    connection = await Connection.open(served.port)
    try:
        reply = await sasl(connection)
        # Kafka's COORDINATOR_LOAD_IN_PROGRESS (14, retriable), not SASL_AUTHENTICATION_FAILED.
        assert reply.error_code == ErrorCode.coordinator_load_in_progress == 14
        assert "loading" in reply.error_message
        assert await connection.closed_by_peer()
    finally:
        await connection.close()
    # Once loaded, a new connection authenticates at once.
    store.set(GROUP, TOKEN)
    store.mark_loaded()
    again = await Connection.open(served.port)
    try:
        assert (await sasl(again)).error_code == ErrorCode.none
    finally:
        await again.close()


def kafka_python_offsets(port: int) -> dict[Any, Any]:
    admin = kafka_python_admin(
        port,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=GROUP,
        sasl_plain_password=TOKEN,
    )
    try:
        return dict(admin.list_group_offsets({GROUP: None})[GROUP])
    finally:
        admin.close()


async def test_kafka_python_authenticates_during_the_load(
    runtime: coordinator_runtime.CoordinatorRuntime, loading: Any
) -> None:
    store, start = loading
    served = await start(runtime, 5.0)
    finish_loading_later(store, 1.0)
    assert await asyncio.to_thread(kafka_python_offsets, served.port) == {}
    assert store.loaded


def join_kip848(port: int, topic: str) -> list[int]:
    """A plain confluent-kafka KIP-848 consumer: its assignment once it has all of it."""
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": GROUP,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(consumer.assignment()) < 3:
            consumer.poll(0.2)
        return sorted(tp.partition for tp in consumer.assignment())
    finally:
        consumer.close()


async def test_a_consumer_joins_through_the_gateway_while_the_tokens_load(
    broker: embedded.EmbeddedBroker,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
    loading: Any,
) -> None:
    """The gateway authenticates to the listener with the group's token; during the load
    its SASL exchange is held, and the application's consumer joins as if nothing was."""
    store, start = loading
    await topic_id(runtime, topic)
    served = await start(runtime, 5.0)
    gateway = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", served.port),
            coordinator_security=kafka_connection.Security(
                sasl=kafka_connection.Sasl("PLAIN", GROUP, TOKEN)
            ),
            port=0,
        )
    )
    await gateway.start()
    try:
        finish_loading_later(store, 1.5)
        assignment = await asyncio.to_thread(join_kip848, gateway.port, topic)
        assert assignment == [0, 1, 2]
    finally:
        await gateway.stop()
    members = (await runtime.describe_group(GROUP)).members
    assert members == ()  # close() left the group
