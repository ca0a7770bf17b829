"""Moving a group in and out: adoption of the brokers' own group's offsets on the first
reconciliation, waiting while native consumers are active, the OffsetsMirrored condition, and
a Retain deletion that leaves the native group current for plain consumers. kopf with our
handlers against the API server, the embedded coordinator and the real broker."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from tests.kube.test_consumer_groups import (
    CG,
    NS,
    Member,
    condition,
    create,
    event_reasons,
    group_body,
    heartbeat_until,
    token_of,
)
from tests.support import kube, native_groups, topics

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

GROUP_ID = f"{NS}.orders"
GROUP_PATH = f"/apis/kafkagroups.io/v1alpha1/namespaces/{NS}/consumergroups/orders"


def reason_of(api: kube.ApiServer, type_: str) -> tuple[str, str] | None:
    found = condition(api, type_)
    return None if found is None else (found["status"], found["reason"])


async def native_offsets(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    """The native group's offsets of ``topic`` (the broker is shared: other tests' groups
    of the same id leave offsets of their own topics)."""
    found = await asyncio.to_thread(native_groups.offsets, bootstrap, GROUP_ID)
    return {tp: offset for tp, offset in found.items() if tp[0] == topic}


async def coordinator_offsets(operator: kube.RunningOperator) -> dict[tuple[str, int], int]:
    request = messages.OffsetFetchRequest(GROUP_ID)
    response = await operator.call(operator.state.runtime.fetch_offsets(request))
    return {tp: value.offset for tp, value in response.offsets.items()}


async def test_if_empty_imports_the_native_offsets_once_before_any_pod(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: embedded.EmbeddedBroker,
) -> None:
    native = {(topic, 0): 11, (topic, 2): 7}
    await asyncio.to_thread(native_groups.commit, broker.bootstrap, GROUP_ID, native)
    await create(kmock, group_body(topic, broker.bootstrap))
    await operator.wait_for(lambda: reason_of(kmock, "Adopted") == ("True", "Imported"))
    assert await coordinator_offsets(operator) == native
    adoption = kmock.get(CG, NS, "orders")["status"]["adoption"]  # type: ignore[index]
    assert adoption["source"] == f"kafka://{broker.bootstrap}/{GROUP_ID}"
    assert adoption["partitions"] == 2
    assert adoption["offsets"] == [
        {"topic": topic, "partition": 0, "offset": 11},
        {"topic": topic, "partition": 2, "offset": 7},
    ]
    assert adoption["time"].endswith("Z")
    await operator.wait_for(lambda: "Adopted" in event_reasons(kmock))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    # Once adopted, never again: a later native commit is not read back.
    await asyncio.to_thread(native_groups.commit, broker.bootstrap, GROUP_ID, {(topic, 1): 99})
    await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"replicas": 1}})
    await operator.wait_for(
        lambda: (kmock.get(CG, NS, "orders") or {}).get("status", {}).get("observedGeneration") == 2
    )
    assert await coordinator_offsets(operator) == native


async def test_never_leaves_the_native_offsets_alone(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: embedded.EmbeddedBroker,
) -> None:
    native = {(topic, 1): 5}
    await asyncio.to_thread(native_groups.commit, broker.bootstrap, GROUP_ID, native)
    await create(kmock, group_body(topic, broker.bootstrap, offsets={"adopt": "Never"}))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    await operator.wait_for(lambda: reason_of(kmock, "OffsetsMirrored") == ("True", "CaughtUp"))
    assert await coordinator_offsets(operator) == {}
    assert condition(kmock, "Adopted") is None
    assert "adoption" not in kmock.get(CG, NS, "orders")["status"]  # type: ignore[index]
    # With nothing committed here, the mirror has nothing to write over them either.
    assert await native_offsets(broker.bootstrap, topic) == native


async def test_adoption_waits_while_native_consumers_are_active(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: embedded.EmbeddedBroker,
) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": GROUP_ID,
            "session.timeout.ms": 6000,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            await asyncio.to_thread(consumer.poll, 0.2)
        assert consumer.assignment(), "the native consumer never joined"
        # The native consumer has made progress that must not be lost.
        await asyncio.to_thread(
            consumer.commit,
            offsets=[TopicPartition(topic, 3, 21)],
            asynchronous=False,
        )
        await create(kmock, group_body(topic, broker.bootstrap))
        await operator.wait_for(
            lambda: reason_of(kmock, "Adopted") == ("False", "NativeMembersActive")
        )
        await operator.wait_for(
            lambda: reason_of(kmock, "Ready") == ("False", "NativeMembersActive")
        )
        assert "active members" in condition(kmock, "Adopted")["message"]  # type: ignore[index]
        # No pod may start while another coordinator owns the group.
        assert kmock.get("apps/v1/statefulsets", NS, "orders") is None
        assert await coordinator_offsets(operator) == {}
        await asyncio.to_thread(consumer.close)
        await operator.wait_for(
            lambda: reason_of(kmock, "Adopted") == ("True", "Imported"), within=60
        )
        assert await coordinator_offsets(operator) == {(topic, 3): 21}
        await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    finally:
        consumer.close()


async def test_a_retained_group_leaves_the_native_group_where_plain_consumers_resume(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = await asyncio.to_thread(topics.create_topic, broker.bootstrap, 2, 10)
    # An hour between mirror commits: only the final flush can carry the last commits.
    await create(
        kmock,
        group_body(topic, broker.bootstrap, replicas=1, offsets={"mirrorIntervalSeconds": 3600}),
    )
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    await operator.wait_for(lambda: reason_of(kmock, "OffsetsMirrored") == ("True", "CaughtUp"))
    committed = {(topic, 0): 4, (topic, 1): 8}
    # The pod's member commits through the member API, then stops for good.
    async with aiohttp.ClientSession() as session:
        member = Member(
            session, operator.config.coordinator_url, token_of(kmock), "orders-0", topic
        )
        await heartbeat_until([member], lambda: len(member.partitions) == 2)
        for (_, partition), offset in committed.items():
            status, reply = await member.commit(partition, offset)
            assert status == 200, reply
        await member.heartbeat(epoch=-1)
    assert await coordinator_offsets(operator) == committed
    assert await native_offsets(broker.bootstrap, topic) == {}

    await kube.api_call(kmock, "DELETE", GROUP_PATH)
    await operator.wait_for(lambda: kmock.get(CG, NS, "orders") is None)
    assert await native_offsets(broker.bootstrap, topic) == committed
    assert "GroupRetained" in event_reasons(kmock)

    # A stock consumer of the same group id resumes exactly there.
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": GROUP_ID,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        first: dict[int, str] = {}
        deadline = time.monotonic() + 60
        while len(first) < 2 and time.monotonic() < deadline:
            message = await asyncio.to_thread(consumer.poll, 0.5)
            if message is not None and message.error() is None:
                first.setdefault(message.partition(), message.value().decode())
        assert first == {0: "m4", 1: "m8"}
    finally:
        await asyncio.to_thread(consumer.close)


async def test_a_refused_mirror_shows_in_the_condition_and_mirroring_can_be_turned_off(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: embedded.EmbeddedBroker,
) -> None:
    # Native consumers that have committed nothing leave nothing to adopt, so the group
    # starts; the brokers then refuse the mirror, and the condition says why.
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": GROUP_ID,
            "session.timeout.ms": 6000,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            await asyncio.to_thread(consumer.poll, 0.2)
        assert consumer.assignment(), "the native consumer never joined"
        await create(
            kmock,
            group_body(topic, broker.bootstrap, offsets={"mirrorIntervalSeconds": 1}),
        )
        await operator.wait_for(lambda: reason_of(kmock, "Adopted") == ("True", "NothingToImport"))
        response = await operator.call(
            operator.state.runtime.commit_offsets(
                messages.OffsetCommitRequest(
                    GROUP_ID, "", messages.LEAVE_EPOCH, {(topic, 0): messages.CommitOffset(3)}
                )
            )
        )
        assert not response.errors
        await operator.wait_for(
            lambda: reason_of(kmock, "OffsetsMirrored") == ("False", "MirrorFailed"), within=60
        )
        message = condition(kmock, "OffsetsMirrored")["message"]  # type: ignore[index]
        assert "UNKNOWN_MEMBER_ID" in message
        assert "active members" in message
        await kube.api_call(
            kmock, "PATCH", GROUP_PATH, {"spec": {"offsets": {"mirrorToKafka": False}}}
        )
        await operator.wait_for(
            lambda: reason_of(kmock, "OffsetsMirrored") == ("False", "MirrorDisabled")
        )
        assert operator.state.runtime.mirror.status(GROUP_ID) is None
    finally:
        await asyncio.to_thread(consumer.close)


async def test_a_group_whose_members_joined_here_is_not_adopted_later(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: embedded.EmbeddedBroker,
) -> None:
    await asyncio.to_thread(native_groups.commit, broker.bootstrap, GROUP_ID, {(topic, 0): 9})
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1, offsets={"adopt": "Never"}))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    async with aiohttp.ClientSession() as session:
        member = Member(
            session, operator.config.coordinator_url, token_of(kmock), "orders-0", topic
        )
        await heartbeat_until([member], lambda: len(member.partitions) == 4)
        # Switched to IfEmpty while a member (that has committed nothing) owns the group.
        await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"offsets": {"adopt": "IfEmpty"}}})
        await operator.wait_for(
            lambda: reason_of(kmock, "Adopted") == ("True", "CoordinatorHasMembers")
        )
        assert await coordinator_offsets(operator) == {}
        assert reason_of(kmock, "Ready") != ("False", "AdoptionFailed")


async def test_a_deleted_group_takes_the_native_group_with_it(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    broker: embedded.EmbeddedBroker,
) -> None:
    """``deletionPolicy: Delete`` removes the mirror's copy too: a group created again with
    the id starts with no offsets, instead of adopting the mirrored ones."""
    topic = await asyncio.to_thread(topics.create_topic, broker.bootstrap, 2, 10)
    body = group_body(
        topic,
        broker.bootstrap,
        replicas=1,
        deletionPolicy="Delete",
        offsets={"mirrorIntervalSeconds": 1},
    )
    await create(kmock, body)
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    committed = {(topic, 0): 4, (topic, 1): 8}
    async with aiohttp.ClientSession() as session:
        member = Member(
            session, operator.config.coordinator_url, token_of(kmock), "orders-0", topic
        )
        await heartbeat_until([member], lambda: len(member.partitions) == 2)
        for (_, partition), offset in committed.items():
            status, reply = await member.commit(partition, offset)
            assert status == 200, reply
        await member.heartbeat(epoch=-1)
    deadline = time.monotonic() + 60
    while await native_offsets(broker.bootstrap, topic) != committed:
        assert time.monotonic() < deadline, "the mirror never caught up"
        await asyncio.sleep(0.5)

    await kube.api_call(kmock, "DELETE", GROUP_PATH)
    await operator.wait_for(lambda: kmock.get(CG, NS, "orders") is None)
    assert "GroupDeleted" in event_reasons(kmock)
    assert await native_offsets(broker.bootstrap, topic) == {}

    await create(kmock, {**body, "spec": {**body["spec"], "replicas": 0}})
    await operator.wait_for(lambda: reason_of(kmock, "Adopted") == ("True", "NothingToImport"))
    assert await coordinator_offsets(operator) == {}
