"""The operator end to end: kopf with our handlers against the API server, the embedded
coordinator on the real broker, consumers played by this test through the member API."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import pytest

from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.coordinator import messages
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
    await kube.api_call(
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


def event_reasons(api: kube.ApiServer) -> set[str]:
    return {
        str(obj.raw.get("reason"))
        for (resource, _, _), obj in api.objects.items()
        if resource.plural == "events" and not obj.deleted
    }


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
    await kube.api_call(kmock, "PATCH", f"{GROUP_PATH}/scale", {"spec": {"replicas": 3}})

    def scaled() -> bool:
        status = (kmock.get(CG, NS, "orders") or {}).get("status") or {}
        return status.get("replicas") == 3 and status.get("observedGeneration") == 2

    await operator.wait_for(scaled)
    assert kmock.get("apps/v1/statefulsets", NS, "orders")["spec"]["replicas"] == 3  # type: ignore[index]
    ready = condition(kmock, "Ready")
    assert ready is not None
    assert (ready["status"], ready["observedGeneration"]) == ("False", 2)
    assert ready["message"] == "0 of 3 members are ready"

    # The StatefulSet controller's count is what the status (and autoscalers) report.
    sts_status = "/apis/apps/v1/namespaces/shop/statefulsets/orders/status"
    for pods in (2, 3):
        await kube.api_call(kmock, "PATCH", sts_status, {"status": {"replicas": pods}})
        await operator.wait_for(
            lambda pods=pods: (kmock.get(CG, NS, "orders") or {})["status"]["replicas"] == pods
        )


async def test_deleted_pod_is_a_temporary_leave_and_scale_down_a_permanent_one(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    # A long session timeout: any movement within this test is the operator's doing.
    await create(kmock, group_body(topic, broker.bootstrap, sessionTimeoutSeconds=120))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    for name in ("orders-0", "orders-1"):
        await kube.api_call(kmock, "POST", PODS_PATH, pod(name))
    url = operator.config.coordinator_url
    async with aiohttp.ClientSession() as session:
        first = Member(session, url, token_of(kmock), "orders-0", topic)
        second = Member(session, url, token_of(kmock), "orders-1", topic)
        await heartbeat_until(
            [first, second], lambda: len(first.partitions) == 2 and len(second.partitions) == 2
        )
        kept = first.partitions
        theirs = second.partitions

        # orders-1 restarts: its pod is deleted and its member leaves temporarily (-2).
        await kube.api_call(kmock, "DELETE", f"{PODS_PATH}/orders-1")
        status, _ = await second.heartbeat(epoch=-2)
        assert status == 200
        for _ in range(15):  # 1.5 s of heartbeats: time for the operator to act, if it would
            await first.heartbeat()
            await asyncio.sleep(0.1)
        assert first.partitions == kept
        description = await operator.call(operator.state.runtime.describe_group(f"{NS}.orders"))
        by_instance = {m.instance_id: m for m in description.members}
        assert set(by_instance) == {"orders-0", "orders-1"}
        assert set(by_instance["orders-1"].assignment.get(topic, ())) == theirs

        # The pod comes back (a new pod, a new member id) and gets its partitions back.
        await kube.api_call(kmock, "POST", PODS_PATH, pod("orders-1"))
        returned = Member(session, url, token_of(kmock), "orders-1", topic)
        await heartbeat_until([first, returned], lambda: returned.partitions == theirs)
        assert first.partitions == kept

        # Scale down: orders-1 is gone for good and its partitions move at once, long before
        # the 120 s session timeout.
        await kube.api_call(kmock, "PATCH", f"{GROUP_PATH}/scale", {"spec": {"replicas": 1}})
        await kube.api_call(kmock, "DELETE", f"{PODS_PATH}/orders-1")
        await heartbeat_until([first], lambda: first.partitions == {0, 1, 2, 3}, within=10)
        status, reply = await returned.heartbeat()
        assert status != 200, reply
        description = await operator.call(operator.state.runtime.describe_group(f"{NS}.orders"))
        assert [m.instance_id for m in description.members] == ["orders-0"]

        def reported() -> bool:
            status = (kmock.get(CG, NS, "orders") or {}).get("status") or {}
            members = status.get("members", [])
            return [(m.get("instanceId"), m.get("partitions")) for m in members] == [
                ("orders-0", 4)
            ]

        # The member confirms what it owns with its next heartbeats; the status follows.
        await heartbeat_until([first], reported)
    await operator.wait_for(lambda: {"MemberRemoved", "Rebalance"} <= event_reasons(kmock))
    status = kmock.get(CG, NS, "orders")["status"]  # type: ignore[index]
    assert status["readyMembers"] == 1
    assert status["state"] == "Stable"
    assert condition(kmock, "Ready")["reason"] == "GroupStable"  # type: ignore[index]


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
async def test_delete_under_each_deletion_policy(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any, policy: str
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1, deletionPolicy=policy))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    group_id = f"{NS}.orders"
    async with aiohttp.ClientSession() as session:
        member = Member(
            session, operator.config.coordinator_url, token_of(kmock), "orders-0", topic
        )
        await heartbeat_until([member], lambda: len(member.partitions) == 4)
        status, reply = await member.commit(2, 42)
        assert status == 200, reply
        await member.heartbeat(epoch=-1)  # the pod stops for good
    runtime = operator.state.runtime
    fetch = messages.OffsetFetchRequest(group_id=group_id)
    assert (await operator.call(runtime.fetch_offsets(fetch))).offsets[(topic, 2)].offset == 42

    await kube.api_call(kmock, "DELETE", GROUP_PATH)
    await operator.wait_for(lambda: kmock.get(CG, NS, "orders") is None)
    offsets = (await operator.call(runtime.fetch_offsets(fetch))).offsets
    if policy == "Retain":
        assert offsets[(topic, 2)].offset == 42
        assert operator.state.tokens.token_for(group_id) is None
    else:
        assert offsets == {}
        with pytest.raises(coordinator_errors.GroupIdNotFound):
            await operator.call(runtime.describe_group(group_id))
    expected = "GroupRetained" if policy == "Retain" else "GroupDeleted"
    await operator.wait_for(lambda: expected in event_reasons(kmock))


@pytest.mark.parametrize(
    ("change", "reason", "message"),
    [
        ({"topics": ["does-not-exist"]}, "UnknownTopic", "does-not-exist do not exist"),
        (
            {"kafka": {"bootstrapServers": "BOOTSTRAP", "secretRef": {"name": "absent"}}},
            "SecretNotFound",
            "'absent'",
        ),
        ({"kafka": {"bootstrapServers": "127.0.0.1:1"}}, "KafkaUnreachable", "127.0.0.1:1"),
        ({"topics": ["twice", "twice"]}, "InvalidSpec", "more than once"),
    ],
    ids=["unknown-topic", "missing-secret", "unreachable-bootstrap", "invalid"],
)
async def test_a_spec_that_cannot_be_honoured_is_reported(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: Any,
    change: dict[str, Any],
    reason: str,
    message: str,
) -> None:
    body = group_body(topic, broker.bootstrap)
    if "kafka" in change:
        change["kafka"]["bootstrapServers"] = change["kafka"]["bootstrapServers"].replace(
            "BOOTSTRAP", broker.bootstrap
        )
    body["spec"].update(change)
    await create(kmock, body)
    ready = await operator.wait_for(lambda: condition(kmock, "Ready"), within=30)
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert message in ready["message"]
    assert ready["observedGeneration"] == 1
    degraded = condition(kmock, "Degraded")
    assert degraded is not None
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    # Nothing is started for a group that cannot work.
    assert kmock.get("apps/v1/statefulsets", NS, "orders") is None


async def test_a_session_timeout_below_the_operators_minimum_is_refused(
    kmock: kube.ApiServer, topic: str, broker: Any
) -> None:
    """The chart's operator refuses session timeouts under 45 s (groups.minSessionTimeoutSeconds):
    such members would drop their partitions during a replica's failover."""
    config = kube.operator_config_for(kmock, broker.bootstrap, retry_base_seconds=0.5)
    assert config.min_session_timeout_seconds == 45
    async with kube.RunningOperator(config) as operator:
        await create(kmock, group_body(topic, broker.bootstrap, sessionTimeoutSeconds=30))
        ready = await operator.wait_for(lambda: condition(kmock, "Ready"), within=30)
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
        assert "sessionTimeoutSeconds 30 is below this operator's minimum of 45" in ready["message"]
        assert kmock.get("apps/v1/statefulsets", NS, "orders") is None
        # At the minimum it is reconciled.
        await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"sessionTimeoutSeconds": 45}})
        await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"), 30)


async def test_a_missing_secret_heals_on_retry(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    body = group_body(topic, broker.bootstrap)
    body["spec"]["kafka"]["secretRef"] = {"name": "kafka-tls"}
    await create(kmock, body)
    await operator.wait_for(
        lambda: (condition(kmock, "Ready") or {}).get("reason") == "SecretNotFound"
    )
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kafka-tls"}, "data": {}}
    await kube.api_call(kmock, "POST", f"/api/v1/namespaces/{NS}/secrets", secret)
    # Retried with backoff, without any change to the resource.
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"), within=20)
    await operator.wait_for(
        lambda: (condition(kmock, "Degraded") or {}).get("reason") == "MembersMissing"
    )


async def test_a_child_the_api_server_refuses_is_reported_until_the_next_edit(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    # What a real API server answers for, e.g., a pod template with an invalid volume name.
    refusal = kmock.reject(
        "apps/v1/statefulsets",
        422,
        'StatefulSet.apps "orders" is invalid: spec.template.spec.volumes[0].name: Invalid value',
    )
    await create(kmock, group_body(topic, broker.bootstrap))
    ready = await operator.wait_for(
        lambda: (
            (found := condition(kmock, "Ready")) and found["reason"] == "InvalidTemplate" and found
        )
    )
    assert ready["status"] == "False"
    assert "spec.template.spec.volumes[0].name" in ready["message"]
    assert ready["observedGeneration"] == 1
    # A permanent error: not retried (the operator's retries start at 0.5 s), and the
    # status daemon does not overwrite the condition.
    attempts = kmock.rejected[refusal]
    await asyncio.sleep(3.0)
    assert kmock.rejected[refusal] == attempts == 1
    assert (condition(kmock, "Ready") or {}).get("reason") == "InvalidTemplate"
    # The next edit is tried again; once the API server accepts it, the group runs.
    kmock.rejections.remove(refusal)
    await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"replicas": 1}})
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    await operator.wait_for(
        lambda: (condition(kmock, "Ready") or {}).get("reason") != "InvalidTemplate"
    )


async def test_a_forbidden_child_is_reported_and_heals_when_rbac_is_fixed(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    # What OwnerReferencesPermissionEnforcement answers without update on .../finalizers.
    refusal = kmock.reject(
        "v1/services",
        403,
        'services "orders" is forbidden: cannot set blockOwnerDeletion if an ownerReference '
        "refers to a resource you can't set finalizers on",
    )
    await create(kmock, group_body(topic, broker.bootstrap))
    ready = await operator.wait_for(
        lambda: (found := condition(kmock, "Ready")) and found["reason"] == "Forbidden" and found
    )
    assert ready["status"] == "False"
    assert "cannot set blockOwnerDeletion" in ready["message"]
    # Fixing RBAC does not edit the resource: the operator retries with backoff.
    kmock.rejections.remove(refusal)
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"), within=30)
    await operator.wait_for(lambda: (condition(kmock, "Ready") or {}).get("reason") != "Forbidden")


async def test_an_invalid_snapshot_schedule_is_a_condition_not_a_traceback(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The CRD's pattern (five fields) accepts it; no field is in range.
    snapshots = {"schedule": "99 99 99 99 99", "storage": {"uri": "file:///snapshots"}}
    await create(kmock, group_body(topic, broker.bootstrap, snapshots=snapshots))
    scheduled = await operator.wait_for(lambda: condition(kmock, "SnapshotsScheduled"), within=30)
    assert (scheduled["status"], scheduled["reason"]) == ("False", "InvalidSchedule")
    assert "'99 99 99 99 99'" in scheduled["message"]
    # The group itself runs; only its snapshots wait for a valid schedule.
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    assert not [record for record in caplog.records if record.exc_info]
    await kube.api_call(
        kmock, "PATCH", GROUP_PATH, {"spec": {"snapshots": {"schedule": "0 2 * * *"}}}
    )
    await operator.wait_for(
        lambda: (condition(kmock, "SnapshotsScheduled") or {}).get("status") == "True",
        within=60,
    )


async def test_pause_reconciliation_annotation(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    annotation = {"metadata": {"annotations": {"kafkagroups.io/pause-reconciliation": "true"}}}
    await kube.api_call(kmock, "PATCH", GROUP_PATH, annotation)
    await operator.wait_for(
        lambda: (condition(kmock, "ReconciliationPaused") or {}).get("status") == "True"
    )
    await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"replicas": 4}})
    await asyncio.sleep(1.0)
    assert kmock.get("apps/v1/statefulsets", NS, "orders")["spec"]["replicas"] == 2  # type: ignore[index]
    resume = {"metadata": {"annotations": {"kafkagroups.io/pause-reconciliation": None}}}
    await kube.api_call(kmock, "PATCH", GROUP_PATH, resume)
    await operator.wait_for(
        lambda: kmock.get("apps/v1/statefulsets", NS, "orders")["spec"]["replicas"] == 4  # type: ignore[index]
    )
    await operator.wait_for(
        lambda: (condition(kmock, "ReconciliationPaused") or {}).get("status") == "False"
    )


async def test_paused_group_assigns_nothing_until_resumed(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1, paused=True))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    async with aiohttp.ClientSession() as session:
        member = Member(
            session, operator.config.coordinator_url, token_of(kmock), "orders-0", topic
        )
        for _ in range(10):
            status, reply = await member.heartbeat()
            assert status == 200, reply
            await asyncio.sleep(0.1)
        assert member.partitions == set()
        await operator.wait_for(
            lambda: (kmock.get(CG, NS, "orders") or {}).get("status", {}).get("state") == "Paused"
        )
        assert condition(kmock, "Ready")["reason"] == "Paused"  # type: ignore[index]

        await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"paused": False}})
        await heartbeat_until([member], lambda: member.partitions == {0, 1, 2, 3})


async def test_a_restarted_operator_picks_up_where_it_left(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    token = token_of(kmock)
    async with aiohttp.ClientSession() as session:
        member = Member(session, operator.config.coordinator_url, token, "orders-0", topic)
        await heartbeat_until([member], lambda: member.partitions == {0, 1, 2, 3})
        status, reply = await member.commit(1, 7)
        assert status == 200, reply
    await operator.__aexit__(None, None, None)

    # The Deployment's Recreate strategy: a new operator on the same state topic.
    async with kube.RunningOperator(operator.config) as restarted:
        # The group's token is taken from its Secret again, never regenerated.
        # (Until every group's token is read, a token-less group is "loading", not refused.)
        await restarted.wait_for(lambda: restarted.state.tokens.loaded)
        assert restarted.state.tokens.token_for(f"{NS}.orders") == token
        assert token_of(kmock) == token
        async with aiohttp.ClientSession() as session:
            # The same member (pod) carries on: its id, epoch and partitions are still valid.
            member.session = session
            status, reply = await member.heartbeat()
            assert status == 200, reply
            assert member.partitions == {0, 1, 2, 3}
            fetch = messages.OffsetFetchRequest(group_id=f"{NS}.orders")
            offsets = (await restarted.call(restarted.state.runtime.fetch_offsets(fetch))).offsets
            assert offsets[(topic, 1)].offset == 7
