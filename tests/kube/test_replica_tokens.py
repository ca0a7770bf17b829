"""Every replica authenticates every group: three operator replicas, a group created after all
three started.

Three replicas of the operator (kopf with our handlers, its coordinator, its member API and
its Kafka listener, as the chart runs each) split a 6-partition state topic by Leases on the
Kubernetes test double; kopf's peering makes one of them the control plane. They are named by
their member-API URLs, so that all three listen on one machine, and their Kafka listeners are
found through a map.

A ConsumerGroup created once all three run is reconciled by the control plane, which hands
the group's token to the group's coordinator only. Then each replica is asked, on both front
doors, with the group's token: the coordinator serves the heartbeat, the others answer
``NOT_COORDINATOR`` naming it; each authenticates a SASL/PLAIN connection as the group and
its FindCoordinator names the coordinator's listener. A wrong token is refused everywhere.
Then the coordinator's replica stops, the survivors take its partitions over, and the same
again on the two that are left.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.static.primitive import i8
from kmock._internal import references

from kafka_group_operator.commands import kube_operator
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import lease_shards, lifecycle, ownership
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.manifests import consumer_group
from kafka_group_operator.protocol import peers
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_records import partitioning
from tests.kube.test_consumer_groups import CG, NS, create, group_body
from tests.protocol.test_listener import plain
from tests.protocol.wire import Connection
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

OPERATOR_NS = "kgo-system"
PARTITIONS = 6
PREFIX = "kgo-partition"
INTERNAL_TOKEN = "the-replicas-internal-token"
# Long enough that a loaded machine does not make the Leases change hands mid-test.
LEASE_S = 10
CG_RESOURCE = references.resource(CG)


@dataclasses.dataclass(frozen=True)
class LoopbackReplicas(operator_config.LeaseConfig):
    """Replicas named by their member-API URLs, their Kafka listeners found by a map."""

    urls: tuple[str, ...] = ()
    kafka: tuple[tuple[str, peers.Address], ...] = ()

    @property
    def identities(self) -> tuple[str, ...]:
        return self.urls

    def kafka_address_of(self) -> Callable[[str], peers.Address]:
        return peers.address_map(dict(self.kafka))


def _configs(
    kmock: kube.ApiServer, bootstrap: str, count: int
) -> list[operator_config.OperatorConfig]:
    api_ports = [embedded.free_port() for _ in range(count)]
    kafka_ports = [embedded.free_port() for _ in range(count)]
    urls = tuple(f"http://127.0.0.1:{port}" for port in api_ports)
    kafka = tuple((url, ("127.0.0.1", port)) for url, port in zip(urls, kafka_ports, strict=True))
    state_topic = f"kgo-state-tokens-{api_ports[0]}"
    return [
        kube.operator_config_for(
            kmock,
            bootstrap,
            state_topic=state_topic,
            state_partitions=PARTITIONS,
            api_port=api_ports[me],
            kafka_port=kafka_ports[me],
            # The Service's URL: any replica answers who coordinates a group.
            coordinator_url=urls[0],
            internal_token=INTERNAL_TOKEN,
            retry_base_seconds=0.5,
            kafka_probe_timeout_seconds=2.0,
            leases=LoopbackReplicas(
                namespace=OPERATOR_NS,
                pod_name=urls[me],
                replicas=count,
                statefulset="kgo",
                lease_prefix=PREFIX,
                peer_url="{identity}",
                lease_duration_seconds=LEASE_S,
                urls=urls,
                kafka=kafka,
            ),
        )
        for me in range(count)
    ]


@contextlib.asynccontextmanager
async def three_replicas(
    kmock: kube.ApiServer, bootstrap: str
) -> AsyncIterator[list[kube.RunningOperator]]:
    """Three replicas in kopf's peering, the first the control plane, their Leases settled
    (two partitions each, every holder known to every replica)."""
    await kube.api_call(
        kmock,
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "kgo"}},
    )
    configs = _configs(kmock, bootstrap, 3)
    replicas = [
        kube.RunningOperator(config, peering=("kgo", kube_operator.peering_for(config).priority))
        for config in configs
    ]
    async with contextlib.AsyncExitStack() as running:
        for replica in replicas:
            await running.enter_async_context(replica)
        await replicas[0].wait_for(lambda: _settled(replicas), within=90)
        yield replicas


def shards_of(replica: kube.RunningOperator) -> lease_shards.LeasedShards:
    shards = replica.memo[lifecycle.SHARDS_KEY]
    assert isinstance(shards, lease_shards.LeasedShards)
    return shards


def _settled(replicas: list[kube.RunningOperator]) -> bool:
    alive = [r for r in replicas if r.alive]
    share = PARTITIONS // len(alive)
    return all(
        len(shards_of(r).elector.held) == share
        and all(shards_of(r).elector.holder(p) is not None for p in range(PARTITIONS))
        and all(r.state.runtime.serving(p) for p in shards_of(r).elector.held)
        for r in alive
    )


def coordinator_of(replicas: list[kube.RunningOperator], group_id: str) -> kube.RunningOperator:
    partition = partitioning.partition_for(group_id, PARTITIONS)
    (holder,) = [r for r in replicas if r.alive and partition in shards_of(r).elector.held]
    return holder


def _url(replica: kube.RunningOperator) -> str:
    assert replica.config.leases is not None
    return replica.config.leases.pod_name


def _kafka_address(replica: kube.RunningOperator) -> peers.Address:
    return ("127.0.0.1", replica.config.kafka_port)


async def heartbeat(
    url: str, group_id: str, token: str, instance: str, topic: str
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/v1/groups/{group_id}/heartbeat",
            json={
                "memberId": f"{instance}-member",
                "memberEpoch": 0,
                "instanceId": instance,
                "subscribedTopicNames": [topic],
            },
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):
        return response.status, await response.json()


async def find_coordinator(
    address: peers.Address, group_id: str, token: str
) -> tuple[ErrorCode, ErrorCode, tuple[str, int] | None]:
    """SASL/PLAIN as the group, then FindCoordinator for it: (SaslAuthenticate's error,
    FindCoordinator's error, the node it names)."""
    connection = await Connection.open(address[1])
    try:
        handshake = await connection.call(SaslHandshakeRequest(mechanism="PLAIN"))
        assert handshake.error_code == ErrorCode.none
        authenticated = await connection.call(
            SaslAuthenticateRequest(auth_bytes=plain(group_id, token))
        )
        if authenticated.error_code != ErrorCode.none:
            return ErrorCode(authenticated.error_code), ErrorCode.none, None
        found = await connection.call(
            FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group_id,))
        )
    finally:
        await connection.close()
    (coordinator,) = found.coordinators
    node = (coordinator.host, int(coordinator.port)) if coordinator.error_code == 0 else None
    return ErrorCode.none, ErrorCode(coordinator.error_code), node


async def ask_every_replica(
    replicas: list[kube.RunningOperator], group_id: str, token: str, instance: str, topic: str
) -> kube.RunningOperator:
    """Both front doors of every live replica, with the group's token and a wrong one."""
    coordinator = coordinator_of(replicas, group_id)
    for replica in (r for r in replicas if r.alive):
        status, body = await heartbeat(_url(replica), group_id, token, instance, topic)
        if replica is coordinator:
            assert status == 200, body
        else:
            assert (status, body["error"]) == (503, "NOT_COORDINATOR"), body
            assert body["coordinator"]["url"] == _url(coordinator)
        status, body = await heartbeat(_url(replica), group_id, token[::-1], instance, topic)
        assert (status, body["error"]) == (403, "GROUP_AUTHORIZATION_FAILED"), body

        sasl, found, node = await find_coordinator(_kafka_address(replica), group_id, token)
        assert (sasl, found, node) == (ErrorCode.none, ErrorCode.none, _kafka_address(coordinator))
        sasl, _, _ = await find_coordinator(_kafka_address(replica), group_id, token[::-1])
        assert sasl == ErrorCode.sasl_authentication_failed
    return coordinator


async def test_every_replica_authenticates_a_group_created_after_it_started(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker, topic: str
) -> None:
    async with three_replicas(kmock, broker.bootstrap) as replicas:
        control_plane, others = replicas[0], replicas[1:]
        # A group coordinated by a replica that does not run the control plane, so that the
        # third replica neither coordinates nor reconciles it.
        held = {p for r in others[:1] for p in shards_of(r).elector.held}
        group_id = next(
            f"{NS}.orders-{i}"
            for i in range(1000)
            if partitioning.partition_for(f"{NS}.orders-{i}", PARTITIONS) in held
        )
        await create(kmock, group_body(topic, broker.bootstrap, groupId=group_id))
        await control_plane.wait_for(
            lambda: control_plane.state.reconciled.get((NS, "orders")) == 1, 60
        )
        secret = kmock.get("v1/secrets", NS, "orders-group-token")
        assert secret is not None
        token = base64.b64decode(secret["data"]["token"]).decode()
        coordinator = coordinator_of(replicas, group_id)
        assert coordinator is others[0]
        # The control plane handed the token to the coordinator; the third replica was
        # given nothing.
        assert coordinator.state.tokens.token_for(group_id) == token
        assert others[1].state.tokens.token_for(group_id) is None

        await ask_every_replica(replicas, group_id, token, "orders-0", topic)

        # The coordinator's replica goes; the survivors take its partitions over.
        await coordinator.__aexit__(None, None, None)
        await control_plane.wait_for(lambda: _settled(replicas), within=90)
        successor = await ask_every_replica(replicas, group_id, token, "orders-1", topic)
        assert successor is not coordinator


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Owners:
    """Who owns each group id, as the coordinator would answer (an error: it cannot now)."""

    def __init__(self, owners: dict[str, messages.GroupOwner | Exception]) -> None:
        self.owners = owners
        self.asked: list[str] = []

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None:
        self.asked.append(group_id)
        owner = self.owners.get(group_id)
        if isinstance(owner, Exception):
            raise owner
        return owner

    async def claim_group(self, request: messages.ClaimGroupRequest) -> messages.GroupOwner:
        raise AssertionError("a lookup claims nothing")


async def _resource(kmock: kube.ApiServer, namespace: str, name: str, **spec: Any) -> str:
    """A ConsumerGroup and its token Secret, as the reconciliation leaves them; its uid."""
    body = group_body("t", "k:1", **spec)
    body["metadata"] = {"name": name, "namespace": namespace}
    await kube.api_call(
        kmock, "POST", f"/apis/kafkagroups.io/v1alpha1/namespaces/{namespace}/consumergroups", body
    )
    group = specs.parse_consumer_group(name, namespace, body["spec"])
    secret = consumer_group.build_token_secret(group, f"token-of-{namespace}-{name}")
    await kube.api_call(kmock, "POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    created = kmock.get(CG, namespace, name)
    assert created is not None
    return str(created["metadata"]["uid"])


async def test_the_lookup_reads_the_owners_secret(kmock: kube.ApiServer) -> None:
    api = kube_client.KubeClient(kube_client.Credentials(server=str(kmock.url)))
    try:
        await _resource(kmock, "shop", "orders")
        first = await _resource(kmock, "shop", "payments", groupId="shared")
        await _resource(kmock, "tenant-b", "intruder", groupId="shared")
        await _resource(kmock, "tenant-c", "waiting", groupId="undecided")
        await _resource(kmock, "tenant-d", "waiting", groupId="undecided")
        owners = _Owners(
            {
                "shared": messages.GroupOwner("shop", "payments", first),
                "undecided": errors.CoordinatorLoadInProgress("loading"),
            }
        )
        clock = _Clock()
        lookup = ownership.TokenLookup(api, lambda: owners, (), list_interval_s=60, clock=clock)

        def lists() -> int:
            return sum(
                1 for r in kmock if r.method == "GET" and r.resource == CG_RESOURCE and not r.name
            )

        # The only claimant's token, without asking who owns the id.
        assert await lookup("shop.orders") == "token-of-shop-orders"
        assert owners.asked == []
        # Of two claimants, the recorded owner's; not the intruder's.
        assert await lookup("shared") == "token-of-shop-payments"
        # Several claimants and the owner unknown now: retriable, never a refusal.
        with pytest.raises(errors.CoordinatorLoadInProgress):
            await lookup("undecided")
        # The lookups above shared one list of ConsumerGroups.
        assert lists() == 1
        # An id nobody names has no token, as a list begun after the lookup says.
        clock.now += 60
        assert await lookup("nobody") is None
        assert lists() == 2
        # A group created just after a list, its pods presenting its token at once: missing
        # from that list (begun before the lookup), it is looked up in the next one, which
        # waits for the interval's end (the old lookup answered None: a refusal).
        fresh = ownership.TokenLookup(api, lambda: owners, (), list_interval_s=2)
        assert await fresh("shop.orders") == "token-of-shop-orders"
        await _resource(kmock, "shop", "late")
        assert await fresh("shop.late") == "token-of-shop-late"
        assert lists() == 4
        # Made-up ids at once, inside the interval: each waits, and one list answers them all.
        made_up = await asyncio.gather(*(fresh(f"made-up-{n}") for n in range(5)))
        assert made_up == [None] * 5
        assert lists() == 5
        # Secrets it may not read: no token (the reconciliation reports the missing right).
        kmock.reject("v1/secrets", 403, "forbidden", action="fetch")
        assert await lookup("shop.orders") is None
        # The API server unreachable: retriable.
        await api.close()
        api.configure(kube_client.Credentials(server=f"http://127.0.0.1:{embedded.free_port()}"))
        unreachable = ownership.TokenLookup(api, lambda: owners, ())
        with pytest.raises(errors.CoordinatorLoadInProgress):
            await unreachable("shop.orders")
    finally:
        await api.close()
