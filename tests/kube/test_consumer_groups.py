"""The operator end to end: kopf with our handlers against the API server, the embedded
coordinator on the real broker, consumers played by this test through the member API."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import pytest

from kafka_group_operator.manifests import consumer_group
from kafka_group_operator.specs import consumer_group as specs
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

NS = "shop"
CG = "kafkagroups.io/v1alpha1/consumergroups"


def group_body(topic: str, bootstrap: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": "orders", "namespace": NS},
        "spec": {
            "topics": [topic],
            "replicas": 2,
            "kafka": {"bootstrapServers": bootstrap},
            "template": {"spec": {"containers": [{"name": "consumer", "image": "consumer:1"}]}},
            **spec,
        },
    }


async def create(api: kube.ApiServer, body: dict[str, Any]) -> None:
    await api_call(
        api, "POST", f"/apis/kafkagroups.io/v1alpha1/namespaces/{NS}/consumergroups", body
    )


def condition(api: kube.ApiServer, type_: str) -> dict[str, Any] | None:
    group = api.get(CG, NS, "orders") or {}
    for item in (group.get("status") or {}).get("conditions") or []:
        if item["type"] == type_:
            return dict(item)
    return None


async def test_create_makes_exactly_the_expected_children(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    owner = kmock.get(CG, NS, "orders")
    assert owner is not None
    reference = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "name": "orders",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    group = specs.parse_consumer_group("orders", NS, owner["spec"])
    url = operator.config.coordinator_url

    def expected(body: dict[str, Any]) -> dict[str, Any]:
        body["metadata"]["ownerReferences"] = [reference]
        return body

    def stored(resource: str, name: str) -> dict[str, Any]:
        body = kmock.get(resource, NS, name)
        assert body is not None, f"{resource} {name} was not created"
        for key in ("uid", "resourceVersion", "generation", "creationTimestamp"):
            body["metadata"].pop(key)
        return body

    assert stored("apps/v1/statefulsets", "orders") == expected(
        consumer_group.build_stateful_set(group, url)
    )
    assert stored("v1/services", "orders") == expected(consumer_group.build_headless_service(group))
    secret = stored("v1/secrets", "orders-group-token")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) >= 32
    assert secret == expected(consumer_group.build_token_secret(group, token))
    # The token works for this group's member API, and only there.
    assert operator.state.tokens.token_for(f"{NS}.orders") == token
    await operator.wait_for(
        lambda: (condition(kmock, "Ready") or {}).get("reason") == "MembersNotReady"
    )
    status = kmock.get(CG, NS, "orders")["status"]  # type: ignore[index]
    assert status["labelSelector"] == "kafkagroups.io/consumer-group=orders"
    assert status["replicas"] == 2
    assert status["observedGeneration"] == 1


class Member:
    """A consumer pod's member, played over the member API as the member library would."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, token: str, instance: str, topic: str
    ) -> None:
        self.session, self.url, self.instance, self.topic = session, url, instance, topic
        self.headers = {"Authorization": f"Bearer {token}"}
        self.member_id = f"uid-{instance}-{id(self)}"
        self.epoch = 0
        self.owned: dict[str, list[int]] = {}

    @property
    def partitions(self) -> set[int]:
        return set(self.owned.get(self.topic, []))

    async def heartbeat(self, epoch: int | None = None) -> tuple[int, dict[str, Any]]:
        body = {
            "memberId": self.member_id,
            "memberEpoch": self.epoch if epoch is None else epoch,
            "instanceId": self.instance,
            "subscribedTopicNames": [self.topic],
            "ownedPartitions": self.owned,
        }
        async with self.session.post(
            f"{self.url}/v1/groups/{NS}.orders/heartbeat", json=body, headers=self.headers
        ) as response:
            reply: dict[str, Any] = await response.json()
        if response.status == 200 and epoch is None:
            self.epoch = reply["memberEpoch"]
            if "assignment" in reply:
                self.owned = {t: sorted(p) for t, p in reply["assignment"].items()}
        return response.status, reply

    async def commit(self, partition: int, offset: int) -> tuple[int, dict[str, Any]]:
        body = {
            "memberId": self.member_id,
            "memberEpoch": self.epoch,
            "offsets": [{"topic": self.topic, "partition": partition, "offset": offset}],
        }
        async with self.session.post(
            f"{self.url}/v1/groups/{NS}.orders/offsets", json=body, headers=self.headers
        ) as response:
            return response.status, await response.json()


async def heartbeat_until(members: list[Member], predicate: Any, within: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, [
            (m.instance, m.epoch, m.owned) for m in members
        ]
        for member in members:
            await member.heartbeat()
        await asyncio.sleep(0.1)


async def api_call(api: kube.ApiServer, method: str, path: str, body: Any = None) -> None:
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"{str(api.url).rstrip('/')}{path}", json=body, headers=headers
        ) as response,
    ):
        assert response.status < 300, await response.text()


def token_of(api: kube.ApiServer) -> str:
    secret = api.get("v1/secrets", NS, "orders-group-token")
    assert secret is not None
    return base64.b64decode(secret["data"]["token"]).decode()


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": consumer_group.common_labels("orders"),
        },
        "spec": {"containers": [{"name": "consumer", "image": "consumer:1"}]},
    }


GROUP_PATH = f"/apis/kafkagroups.io/v1alpha1/namespaces/{NS}/consumergroups/orders"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"


async def test_scale_and_the_status_follows(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap))
    await operator.wait_for(
        lambda: (kmock.get(CG, NS, "orders") or {}).get("status", {}).get("replicas") == 2
    )
    # What `kubectl scale cg/orders --replicas=3` sends to the scale subresource.
    await api_call(kmock, "PATCH", f"{GROUP_PATH}/scale", {"spec": {"replicas": 3}})

    def scaled() -> bool:
        status = (kmock.get(CG, NS, "orders") or {}).get("status") or {}
        return status.get("replicas") == 3 and status.get("observedGeneration") == 2

    await operator.wait_for(scaled)
    assert kmock.get("apps/v1/statefulsets", NS, "orders")["spec"]["replicas"] == 3  # type: ignore[index]
    ready = condition(kmock, "Ready")
    assert ready is not None
    assert (ready["status"], ready["observedGeneration"]) == ("False", 2)
    assert ready["message"] == "0 of 3 members are ready"
