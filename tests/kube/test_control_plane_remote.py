"""The control plane reaching a group coordinated by another replica.

Two replicas split a 4-partition state topic by Leases on the Kubernetes test double: replica
``a`` is the operator (kopf, our handlers, its coordinator, as the chart runs it) and replica
``b`` is a second coordinator, assembled as a replica's startup assembles it (a runtime, its
Lease elector, the member API with the internal API) but without kopf, as a replica whose
handlers are paused by peering. Replicas are named by their URLs, as ``kgo coordinator``
names them, so that both can listen on one machine.

A ConsumerGroup whose group id hashes to one of ``b``'s partitions is reconciled by ``a``'s
handlers: every call (claim, token, settings, mirror, status, deletion) must reach ``b``, act
there, and leave ``a``'s own runtime untouched.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kafka_group_operator.access import tokens
from kafka_group_operator.api import app as api_app
from kafka_group_operator.api import internal
from kafka_group_operator.commands import kube_operator
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import lease_shards, lifecycle
from kafka_group_operator.kube import client
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning
from tests.kube.test_consumer_groups import CG, GROUP_PATH, NS, condition, create, group_body
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

OPERATOR_NS = "kgo-system"
PARTITIONS = 4
PREFIX = "kgo-partition"
TOKEN = "the-replicas-internal-token"
# Long enough that a loaded machine does not make the Leases change hands mid-test.
LEASE_S = 10


@dataclasses.dataclass(frozen=True)
class UrlReplicas(operator_config.LeaseConfig):
    """Replicas named by their member-API URLs instead of StatefulSet pod names."""

    urls: tuple[str, ...] = ()

    @property
    def identities(self) -> tuple[str, ...]:
        return self.urls


@dataclasses.dataclass
class Replica:
    runtime: coordinator_runtime.CoordinatorRuntime
    shards: lease_shards.LeasedShards
    tokens: tokens.GroupTokens


@contextlib.asynccontextmanager
async def second_replica(
    api: kube.ApiServer, bootstrap: str, state_topic: str, me: str, replicas: tuple[str, ...]
) -> AsyncIterator[Replica]:
    """What a replica's startup builds, without kopf."""
    kube_client = client.KubeClient(client.Credentials(server=str(api.url)))
    runtime = coordinator_runtime.CoordinatorRuntime(
        coordinator_runtime.RuntimeConfig(
            bootstrap_servers=bootstrap,
            topic=state_topic,
            partitions=PARTITIONS,
            write_timeout_ms=5000,
            metadata_interval_ms=1000,
            served_partitions=frozenset(),
        )
    )
    shards = lease_shards.LeasedShards(
        kube_client,
        runtime,
        lease_shards.LeaseSettings(
            namespace=OPERATOR_NS,
            identity=me,
            replicas=replicas,
            prefix=PREFIX,
            url_template="{identity}",
            lease_duration_seconds=LEASE_S,
        ),
    )
    store = tokens.GroupTokens()
    app = api_app.build_app(
        runtime,
        store,
        shards.directory(),
        internal.InProcessCoordinator(runtime, store),
        TOKEN,
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await asyncio.wait_for(runtime.start(), 60)
        shards.start()
        port = int(me.rsplit(":", 1)[1])
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield Replica(runtime, shards, store)
    finally:
        await shards.stop()
        await runner.cleanup()
        await runtime.stop()
        await kube_client.close()


def _group_on(partitions: frozenset[int]) -> str:
    index = 0
    while partitioning.partition_for(f"remote-{index}", PARTITIONS) not in partitions:
        index += 1
    return f"remote-{index}"


async def _wait(predicate: Any, within: float = 60) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_the_handlers_reach_a_group_coordinated_by_another_replica(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker, topic: str
) -> None:
    ports = [embedded.free_port(), embedded.free_port()]
    urls = tuple(f"http://127.0.0.1:{port}" for port in ports)
    config = kube.operator_config_for(
        kmock,
        broker.bootstrap,
        state_partitions=PARTITIONS,
        api_port=ports[0],
        coordinator_url=urls[0],
        internal_token=TOKEN,
        retry_base_seconds=0.5,
        kafka_probe_timeout_seconds=2.0,
        leases=UrlReplicas(
            namespace=OPERATOR_NS,
            pod_name=urls[0],
            replicas=2,
            statefulset="kgo",
            lease_prefix=PREFIX,
            peer_url="{identity}",
            lease_duration_seconds=LEASE_S,
            urls=urls,
        ),
    )
    async with (
        kube.RunningOperator(config) as operator,
        second_replica(kmock, broker.bootstrap, config.state_topic, urls[1], urls) as b,
    ):
        # The partitions split two and two, each loaded by its holder.
        await _wait(lambda: len(b.shards.elector.held) == PARTITIONS // 2)
        group_id = _group_on(b.shards.elector.held)
        await _wait(
            lambda: b.runtime.partition_state(group_id) is coordinator_runtime.PartitionState.ACTIVE
        )
        await create(kmock, group_body(topic, broker.bootstrap, groupId=group_id))
        await operator.wait_for(
            lambda: (condition(kmock, "Ready") or {}).get("reason") == "MembersNotReady", 60
        )
        owner = kmock.get(CG, NS, "orders")
        assert owner is not None
        secret = kmock.get("v1/secrets", NS, "orders-group-token")
        assert secret is not None
        token = base64.b64decode(secret["data"]["token"]).decode()

        # Claimed, configured and given its token and mirror at b, its coordinator.
        recorded = await b.runtime.group_owner(group_id)
        assert recorded is not None
        assert recorded.uid == owner["metadata"]["uid"]
        assert b.tokens.token_for(group_id) == token
        assert b.runtime.mirror.status(group_id) is not None
        with pytest.raises(errors.NotCoordinator):
            await operator.call(operator.state.runtime.group_owner(group_id))
        assert operator.state.runtime.mirror.status(group_id) is None
        port = lifecycle.state_of(operator.memo).coordinators
        assert port is not None
        assert port.owner_url(group_id) == urls[1]

        # A member joins at b with the token; the status, computed at a, shows it.
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{urls[1]}/v1/groups/{group_id}/heartbeat",
                json={
                    "memberId": "m-0",
                    "memberEpoch": 0,
                    "instanceId": "orders-0",
                    "subscribedTopicNames": [topic],
                },
                headers={"Authorization": f"Bearer {token}"},
            ) as response,
        ):
            assert response.status == 200, await response.text()

        def member_listed() -> bool:
            status = (kmock.get(CG, NS, "orders") or {}).get("status") or {}
            return [m.get("instanceId") for m in status.get("members") or []] == ["orders-0"]

        await operator.wait_for(member_listed, 60)

        # Deleting the resource deletes the group at b (deletionPolicy: Delete) and releases
        # its id there; b's member API forgets the token.
        await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"deletionPolicy": "Delete"}})
        await kube.api_call(kmock, "DELETE", GROUP_PATH)
        await operator.wait_for(lambda: kmock.get(CG, NS, "orders") is None, 60)
        assert await b.runtime.group_owner(group_id) is None
        with pytest.raises(errors.GroupIdNotFound):
            await b.runtime.describe_group(group_id)
        assert b.tokens.token_for(group_id) is None
        assert b.runtime.mirror.status(group_id) is None


def _replicas_config(
    kmock: kube.ApiServer, bootstrap: str, urls: tuple[str, ...], me: int, state_topic: str
) -> operator_config.OperatorConfig:
    port = int(urls[me].rsplit(":", 1)[1])
    return kube.operator_config_for(
        kmock,
        bootstrap,
        state_topic=state_topic,
        state_partitions=PARTITIONS,
        api_port=port,
        coordinator_url=urls[0],
        internal_token=TOKEN,
        retry_base_seconds=0.5,
        kafka_probe_timeout_seconds=2.0,
        leases=UrlReplicas(
            namespace=OPERATOR_NS,
            pod_name=urls[me],
            replicas=len(urls),
            statefulset="kgo",
            lease_prefix=PREFIX,
            peer_url="{identity}",
            lease_duration_seconds=LEASE_S,
            urls=urls,
        ),
    )


def _keep_alives(kmock: kube.ApiServer) -> dict[str, Any]:
    peering = kmock.get("kopf.dev/v1/clusterkopfpeerings", None, "kgo") or {}
    return dict(peering.get("status") or {})


async def test_one_replica_runs_the_handlers_and_the_next_takes_over(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker, topic: str
) -> None:
    """kopf's peering, as ``kgo operator`` sets it up: the replica of top priority runs the
    handlers, the other's are paused until it stops."""
    urls = tuple(f"http://127.0.0.1:{embedded.free_port()}" for _ in range(2))
    state_topic = f"kgo-state-peering-{urls[0].rsplit(':', 1)[1]}"
    await kube.api_call(
        kmock,
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "kgo"}},
    )
    configs = [_replicas_config(kmock, broker.bootstrap, urls, me, state_topic) for me in (0, 1)]
    priorities = [kube_operator.peering_for(config) for config in configs]
    assert [p.priority for p in priorities] == [
        kube_operator.PEERING_TOP_PRIORITY - n for n in (0, 1)
    ]
    active = kube.RunningOperator(configs[0], peering=("kgo", priorities[0].priority))
    standby = kube.RunningOperator(configs[1], peering=("kgo", priorities[1].priority))
    async with contextlib.AsyncExitStack() as running:
        # The active one first: the standby starts paused (peering is mandatory) and finds a
        # peer of higher priority at its first look, so it never resumes.
        await running.enter_async_context(active)
        await active.wait_for(lambda: len(_keep_alives(kmock)) == 1)
        await running.enter_async_context(standby)
        await active.wait_for(lambda: len(_keep_alives(kmock)) == 2)
        await create(kmock, group_body(topic, broker.bootstrap))
        await active.wait_for(lambda: active.state.reconciled.get((NS, "orders")) == 1, 60)
        assert (condition(kmock, "Ready") or {}).get("reason") == "MembersNotReady"
        # The standby's handlers never ran: nothing reconciled, no status refreshed.
        assert standby.state.reconciled == {}
        assert standby.state.lag_windows == {}
        # The active replica stops (its keep-alive withdrawn): the standby takes over and
        # reconciles the next change.
        await active.__aexit__(None, None, None)
        await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"replicas": 3}})
        await standby.wait_for(lambda: standby.state.reconciled.get((NS, "orders")) == 2, 90)
