"""The lag verdict end to end: kopf with our handlers against the API server, the embedded
coordinator on the real broker, a member played over the member API that stops committing
while the log grows."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

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


def lag_events(api: kube.ApiServer) -> list[dict[str, Any]]:
    return [
        obj.raw
        for (resource, _, _), obj in api.objects.items()
        if resource.plural == "events"
        and not obj.deleted
        and obj.raw.get("reason") == "LagVerdictChanged"
    ]


async def test_a_member_that_stops_committing_while_lag_grows_is_reported(
    kmock: kube.ApiServer, operator: kube.RunningOperator, broker: embedded.EmbeddedBroker
) -> None:
    topic = topics.create_topic(broker.bootstrap, 1, messages_per_partition=5)
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    async with aiohttp.ClientSession() as session:
        member = Member(
            session, operator.config.coordinator_url, token_of(kmock), "orders-0", topic
        )
        await heartbeat_until([member], lambda: member.partitions == {0})

        async def keep_heartbeating() -> None:
            while True:
                await member.heartbeat()
                await asyncio.sleep(0.2)

        heartbeats = asyncio.create_task(keep_heartbeating())
        try:
            # Two commits, each seen by a status refresh: the consumer catches up.
            status, reply = await member.commit(0, 3)
            assert status == 200, reply
            await operator.wait_for(lambda: verdict_of(kmock).get("evaluatedPartitions") == 1)
            await asyncio.sleep(0.5)
            status, reply = await member.commit(0, 5)
            assert status == 200, reply
            await operator.wait_for(
                lambda: (condition(kmock, "LagHealthy") or {}).get("status") == "True"
            )
            assert verdict_of(kmock)["status"] == "OK"

            # The log grows and the member commits no more.
            topics.produce(broker.bootstrap, topic, [0], 10, first=5)
            await operator.wait_for(
                lambda: (condition(kmock, "LagHealthy") or {}).get("status") == "False",
                within=60,
            )
            topics.produce(broker.bootstrap, topic, [0], 10, first=15)
            await operator.wait_for(
                lambda: (verdict_of(kmock).get("partitions") or [{}])[0].get("lag") == 20, within=60
            )
        finally:
            heartbeats.cancel()
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
