"""ListGroups through the gateway, with a real client's admin API (confluent-kafka's
``AdminClient.list_consumer_groups``, which asks every node of the cluster): the gateway's
group is listed once, as the coordinator sees it, and no other tenant's group is listed, though
the brokers hold mirrored copies of both (their own groups of the same ids, committed to
directly here) and the coordinator coordinates the other tenant's group too.

The client keeps the first listing of a group id it gets (the brokers' copy or the
coordinator's, whichever node answers first); the brokers' ports list no group, so the
coordinator's listing, of the groups the gateway's group may see, is the one."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from tests.protocol.test_kip848 import topic_id

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]


def commit_on_the_brokers(bootstrap: str, group: str, topic: str) -> None:
    """The brokers' own group ``group``, with a committed offset (what the offset mirror
    leaves there)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    finally:
        consumer.close()


def listed(port: int) -> tuple[list[Any], list[Any]]:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    result = admin.list_consumer_groups(request_timeout=30).result()
    return list(result.valid), list(result.errors)


async def test_the_gateways_group_once_as_the_coordinator_sees_it_and_no_other_tenants(
    broker: embedded.EmbeddedBroker,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    suffix = uuid.uuid4().hex[:6]
    ours, theirs = f"listed-{suffix}", f"other-tenant-{suffix}"
    listener = protocol_listener.Listener(
        runtime,
        tokens.GroupTokens({ours: "our-token", theirs: "their-token"}),
        protocol_listener.ListenerConfig(port=0),
    )
    await listener.start()
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", listener.port),
            coordinator_security=kafka_connection.Security(
                sasl=kafka_connection.Sasl("PLAIN", ours, "our-token")
            ),
            port=0,
        )
    )
    await served.start()
    try:
        for group in (ours, theirs):
            # The coordinator's group, and the brokers' copy of it.
            await runtime.commit_offsets(
                messages.OffsetCommitRequest(
                    group_id=group,
                    member_id="",
                    member_epoch=-1,
                    offsets={(topic, 0): messages.CommitOffset(3)},
                )
            )
            await asyncio.to_thread(commit_on_the_brokers, broker.bootstrap, group, topic)
        # The brokers list both copies themselves.
        direct, _ = await asyncio.to_thread(listed, broker.port)
        assert {ours, theirs} <= {g.group_id for g in direct}
        # The brokers' copies say UNKNOWN and CLASSIC: the client keeps the first answer of
        # a group id it gets, so it is asked a few times.
        for _ in range(3):
            valid, errors = await asyncio.to_thread(listed, served.port)
            assert errors == []
            assert [(g.group_id, g.state, g.type) for g in valid] == [
                (ours, ConsumerGroupState.EMPTY, ConsumerGroupType.CONSUMER)  # the coordinator's
            ]
    finally:
        await served.stop()
        await listener.stop()
