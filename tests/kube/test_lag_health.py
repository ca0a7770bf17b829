"""The lag verdict end to end: kopf with our handlers against the API server, the embedded
coordinator on the real broker, a member played over the member API that stops committing
while the log grows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kafka_group_operator.coordinator import lag_health
from kafka_group_operator.embedded import broker as embedded
from tests.kube.test_consumer_groups import (
    CG,
    NS,
    Member,
    condition,
    create,
    group_body,
    heartbeat_until,
    token_of,
)
from tests.support import kube, topics

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]


def verdict_of(api: kube.ApiServer) -> dict[str, Any]:
    group = api.get(CG, NS, "orders") or {}
    return dict(((group.get("status") or {}).get("lag") or {}).get("verdict") or {})


def lag_healthy(api: kube.ApiServer) -> str | None:
    return (condition(api, "LagHealthy") or {}).get("status")


def lag_events(api: kube.ApiServer) -> list[dict[str, Any]]:
    """The LagVerdictChanged Events, in the order they were posted."""
    return [
        obj.raw
        for (resource, _, _), obj in api.objects.items()
        if resource.plural == "events"
        and not obj.deleted
        and obj.raw.get("reason") == "LagVerdictChanged"
    ]


@contextlib.asynccontextmanager
async def heartbeating(member: Member) -> AsyncIterator[None]:
    """The member stays in the group (through operator restarts) while the block runs."""

    async def keep_heartbeating() -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                await member.heartbeat()
            await asyncio.sleep(0.2)

    task = asyncio.create_task(keep_heartbeating())
    try:
        yield
    finally:
        task.cancel()


def _newest_commit(operator: kube.RunningOperator, topic: str) -> lag_health.Commit | None:
    group = operator.state.lag_windows.get((NS, "orders"))
    window = group.partitions.get((topic, 0)) if group is not None else None
    return window.commits[-1] if window is not None and window.commits else None


async def commit_seen(operator: kube.RunningOperator, member: Member, offset: int) -> None:
    """Commit ``offset`` of partition 0 and wait until a status refresh saw that commit."""
    before = _newest_commit(operator, member.topic)
    status, reply = await member.commit(0, offset)
    assert status == 200, reply
    await operator.wait_for(lambda: _newest_commit(operator, member.topic) not in (None, before))


async def joined(
    api: kube.ApiServer, operator: kube.RunningOperator, session: aiohttp.ClientSession, topic: str
) -> Member:
    member = Member(session, operator.config.coordinator_url, token_of(api), "orders-0", topic)
    await heartbeat_until([member], lambda: member.partitions == {0})
    return member


async def test_a_member_that_stops_committing_while_lag_grows_is_reported(
    kmock: kube.ApiServer, operator: kube.RunningOperator, broker: embedded.EmbeddedBroker
) -> None:
    topic = topics.create_topic(broker.bootstrap, 1, messages_per_partition=5)
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    async with aiohttp.ClientSession() as session:
        member = await joined(kmock, operator, session, topic)
        async with heartbeating(member):
            # Two commits, each seen by a status refresh: the consumer catches up.
            await commit_seen(operator, member, 3)
            await asyncio.sleep(0.5)
            await commit_seen(operator, member, 5)
            await operator.wait_for(lambda: lag_healthy(kmock) == "True")
            assert verdict_of(kmock)["status"] == "OK"

            # The log grows and the member commits no more.
            topics.produce(broker.bootstrap, topic, [0], 10, first=5)
            await operator.wait_for(lambda: lag_healthy(kmock) == "False", within=60)
            topics.produce(broker.bootstrap, topic, [0], 10, first=15)
            await operator.wait_for(
                lambda: (verdict_of(kmock).get("partitions") or [{}])[0].get("lag") == 20,
                within=60,
            )
    healthy = condition(kmock, "LagHealthy")
    assert healthy is not None
    assert healthy["reason"] == "ERROR"
    assert healthy["message"].startswith(f"1 partition(s): {topic}/0 STOP (lag ")
    verdict = verdict_of(kmock)
    assert (verdict["status"], verdict["unhealthyPartitions"]) == ("ERROR", 1)
    (partition,) = verdict["partitions"]
    assert (partition["topic"], partition["partition"], partition["status"]) == (topic, 0, "STOP")
    assert partition["offset"] == 5
    group = kmock.get(CG, NS, "orders")
    assert group is not None
    assert group["status"]["lag"]["total"] == 20
    await operator.wait_for(
        lambda: any(
            event["type"] == "Warning" and "OK -> ERROR" in event["message"]
            for event in lag_events(kmock)
        )
    )


async def test_a_restarted_operator_posts_no_event_for_an_unchanged_verdict(
    kmock: kube.ApiServer, operator: kube.RunningOperator, broker: embedded.EmbeddedBroker
) -> None:
    """The window starts empty after a restart; the verdict in the status is the one to
    compare with, so only real changes make Events."""
    topic = topics.create_topic(broker.bootstrap, 1, messages_per_partition=5)
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    async with aiohttp.ClientSession() as session:
        member = await joined(kmock, operator, session, topic)
        async with heartbeating(member):
            await commit_seen(operator, member, 5)
            await operator.wait_for(lambda: lag_healthy(kmock) == "True")
            await operator.__aexit__(None, None, None)

            async with kube.RunningOperator(operator.config) as restarted:
                # The new window holds the commit made before the restart; one more commit
                # (of the same offset) makes two, enough to be judged.
                await restarted.wait_for(lambda: _newest_commit(restarted, topic) is not None)
                await commit_seen(restarted, member, 5)
                topics.produce(broker.bootstrap, topic, [0], 10, first=5)
                await restarted.wait_for(lambda: lag_healthy(kmock) == "False", within=60)
                await restarted.wait_for(lambda: len(lag_events(kmock)) >= 2)
                await asyncio.sleep(1)
    messages = [event["message"].split(":")[0] for event in lag_events(kmock)]
    assert messages == ["lag verdict NOTFOUND -> OK", "lag verdict OK -> ERROR"]
