"""One owner per group id, and a deletion that waits for the group's pods: kopf with our
handlers against the API server, the embedded coordinator on the real broker."""

from __future__ import annotations

import asyncio
import base64
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import messages
from kafka_group_operator.handlers import ownership
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.runtime import coordinator_runtime
from tests.jobs import test_snapshot_handlers as handlers_test
from tests.kube.test_consumer_groups import (
    CG,
    GROUP_PATH,
    NS,
    PODS_PATH,
    Member,
    create,
    event_reasons,
    group_body,
    heartbeat_until,
    pod,
    token_of,
)
from tests.support import groups, kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

GROUP_ID = f"{NS}.orders"
OTHER_NS = "tenant-b"


def intruder_body(topic: str, bootstrap: str, **spec: Any) -> dict[str, Any]:
    """A ConsumerGroup of another namespace naming the owner's group id."""
    body = group_body(topic, bootstrap, groupId=GROUP_ID, **spec)
    body["metadata"] = {"name": "intruder", "namespace": OTHER_NS}
    return body


async def create_intruder(api: kube.ApiServer, body: dict[str, Any]) -> None:
    await kube.api_call(
        api, "POST", f"/apis/kafkagroups.io/v1alpha1/namespaces/{OTHER_NS}/consumergroups", body
    )


def ready_of(api: kube.ApiServer, namespace: str, name: str) -> dict[str, Any]:
    group = api.get(CG, namespace, name) or {}
    for item in (group.get("status") or {}).get("conditions") or []:
        if item["type"] == "Ready":
            return dict(item)
    return {}


def uid_of(api: kube.ApiServer, namespace: str, name: str) -> str:
    group = api.get(CG, namespace, name)
    assert group is not None
    return str(group["metadata"]["uid"])


async def committed(operator: kube.RunningOperator) -> dict[tuple[str, int], int]:
    fetch = messages.OffsetFetchRequest(group_id=GROUP_ID)
    offsets = (await operator.call(operator.state.runtime.fetch_offsets(fetch))).offsets
    return {tp: value.offset for tp, value in offsets.items()}


async def test_a_second_claimant_changes_nothing_even_across_a_restart_or_its_deletion(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: Any,
    tmp_path: Path,
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    token = token_of(kmock)
    async with aiohttp.ClientSession() as session:
        member = Member(session, operator.config.coordinator_url, token, "orders-0", topic)
        await heartbeat_until([member], lambda: member.partitions == {0, 1, 2, 3})
        status, reply = await member.commit(3, 30)
        assert status == 200, reply
    description = await operator.call(operator.state.runtime.describe_group(GROUP_ID))
    assert description.assignor == "cooperative-sticky"

    # Ownership is in the state topic: a restarted operator still knows the owner.
    await operator.__aexit__(None, None, None)
    async with kube.RunningOperator(operator.config) as restarted:
        owner = await restarted.call(restarted.state.runtime.group_owner(GROUP_ID))
        assert owner == messages.GroupOwner(NS, "orders", uid_of(kmock, NS, "orders"))

        # Another tenant names the same group id, with other settings, deletionPolicy Delete
        # and an offset reset.
        await create_intruder(
            kmock,
            intruder_body(
                topic,
                broker.bootstrap,
                assignor="range",
                deletionPolicy="Delete",
                offsetReset={"to": "earliest", "dryRun": False},
            ),
        )
        ready = await restarted.wait_for(
            lambda: (
                ready_of(kmock, OTHER_NS, "intruder").get("reason") == "GroupIdConflict"
                and ready_of(kmock, OTHER_NS, "intruder")
            )
        )
        assert ready["status"] == "False"
        assert f"owned by ConsumerGroup {NS}/orders" in ready["message"]
        await restarted.wait_for(lambda: "GroupIdConflict" in event_reasons(kmock))
        # Nothing changed: no child in its namespace, the owner's token and settings stand.
        for resource in ("v1/secrets", "v1/services", "apps/v1/statefulsets"):
            assert not [
                key for key, obj in kmock.objects.items()
                if key[1] == OTHER_NS and key[0].plural == resource.rsplit("/", 1)[1]
                and not obj.deleted
            ], resource  # fmt: skip
        await restarted.wait_for(lambda: restarted.state.tokens.token_for(GROUP_ID) == token)
        # Nor may it read the owner's offsets through a snapshot.
        await handlers_test.create_snapshot(
            kmock, "peek", f"file://{tmp_path}", "local", group="intruder", namespace=OTHER_NS
        )
        snapshots = "kafkagroups.io/v1alpha1/offsetsnapshots"
        status = await restarted.wait_for(
            lambda: (
                ((kmock.get(snapshots, OTHER_NS, "peek") or {}).get("status") or {}).get("phase")
                and kmock.get(snapshots, OTHER_NS, "peek")["status"]
            )  # type: ignore[index]
        )
        assert status["phase"] == "Pending"
        assert not status.get("run")
        (snapshot_ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
        assert snapshot_ready["reason"] == "GroupNotFound"
        assert "does not own group id 'shop.orders'" in snapshot_ready["message"]
        # Time for the reset's timer (every 3 s) to have acted, had it been allowed to.
        await asyncio.sleep(8)
        intruder = kmock.get(CG, OTHER_NS, "intruder")
        assert intruder is not None
        assert "lastReset" not in (intruder.get("status") or {})
        description = await restarted.call(restarted.state.runtime.describe_group(GROUP_ID))
        assert description.assignor == "cooperative-sticky"
        assert description.state != "Paused"
        async with aiohttp.ClientSession() as session:
            member.session = session
            status, reply = await member.heartbeat()
            assert status == 200, reply
            assert member.partitions == {0, 1, 2, 3}

            # Deleting the intruder (deletionPolicy: Delete) wipes nothing of the owner's.
            await kube.api_call(
                kmock,
                "DELETE",
                f"/apis/kafkagroups.io/v1alpha1/namespaces/{OTHER_NS}/consumergroups/intruder",
            )
            await restarted.wait_for(lambda: kmock.get(CG, OTHER_NS, "intruder") is None)
            assert await committed(restarted) == {(topic, 3): 30}
            assert restarted.state.tokens.token_for(GROUP_ID) == token
            owner = await restarted.call(restarted.state.runtime.group_owner(GROUP_ID))
            assert owner is not None
            assert owner.name == "orders"
            status, reply = await member.heartbeat()
            assert status == 200, reply
            status, reply = await member.commit(3, 31)
            assert status == 200, reply


async def test_the_owners_deletion_releases_the_id_to_a_waiting_claimant(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1))
    await operator.wait_for(lambda: operator.state.tokens.token_for(GROUP_ID))
    owners_token = token_of(kmock)
    await create_intruder(kmock, intruder_body(topic, broker.bootstrap))
    await operator.wait_for(
        lambda: ready_of(kmock, OTHER_NS, "intruder").get("reason") == "GroupIdConflict"
    )
    assert operator.state.tokens.token_for(GROUP_ID) == owners_token
    # -o wide's GROUP column names the id it is refused for.
    intruder = kmock.get(CG, OTHER_NS, "intruder") or {}
    assert (intruder.get("status") or {}).get("groupId") == GROUP_ID

    await kube.api_call(kmock, "DELETE", GROUP_PATH)
    await operator.wait_for(lambda: kmock.get(CG, NS, "orders") is None)
    # The waiting claimant takes the id over on its next retry: its own children and token.
    await operator.wait_for(
        lambda: kmock.get("apps/v1/statefulsets", OTHER_NS, "intruder"), within=60
    )
    secret = kmock.get("v1/secrets", OTHER_NS, "intruder-group-token")
    assert secret is not None
    takers_token = base64.b64decode(secret["data"]["token"]).decode()
    assert takers_token != owners_token
    await operator.wait_for(lambda: operator.state.tokens.token_for(GROUP_ID) == takers_token)
    owner = await operator.call(operator.state.runtime.group_owner(GROUP_ID))
    assert owner == messages.GroupOwner(OTHER_NS, "intruder", uid_of(kmock, OTHER_NS, "intruder"))
    await operator.wait_for(
        lambda: ready_of(kmock, OTHER_NS, "intruder").get("reason") == "MembersNotReady"
    )


async def test_deletion_keeps_the_token_until_the_groups_pods_are_gone(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, replicas=1, deletionPolicy="Delete"))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    await kube.api_call(kmock, "POST", PODS_PATH, pod("orders-0"))
    async with aiohttp.ClientSession() as session:
        member = Member(
            session, operator.config.coordinator_url, token_of(kmock), "orders-0", topic
        )
        await heartbeat_until([member], lambda: member.partitions == {0, 1, 2, 3})

        await kube.api_call(kmock, "DELETE", GROUP_PATH)
        # The operator stops the pods (the garbage collector would wait for the resource
        # to be gone, which the finalizer holds back)...
        await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders") is None)
        deleting = kmock.get(CG, NS, "orders")
        assert deleting is not None
        assert deleting["metadata"].get("deletionTimestamp")
        # ...and while the pod stops its member still makes its final commit and leaves.
        status, reply = await member.commit(1, 11)
        assert status == 200, reply
        status, reply = await member.heartbeat(epoch=-1)
        assert status == 200, reply
        assert operator.state.tokens.token_for(GROUP_ID) is not None
        assert kmock.get(CG, NS, "orders") is not None

    # The pod is gone (as the garbage collector removes it): then the token and records go.
    await kube.api_call(kmock, "DELETE", f"{PODS_PATH}/orders-0")
    await operator.wait_for(lambda: kmock.get(CG, NS, "orders") is None, within=60)
    assert operator.state.tokens.token_for(GROUP_ID) is None
    assert await committed(operator) == {}
    assert await operator.call(operator.state.runtime.group_owner(GROUP_ID)) is None


async def test_tokens_read_at_start_are_the_owners_only(
    kmock: kube.ApiServer, broker: Any, topic: str
) -> None:
    """What an operator start reads before it refuses anyone: per group id, the token of the
    recorded owner; without one, of the only claimant; of nobody when several claim it."""
    bodies = {
        # (namespace, name): groupId
        (NS, "orders"): GROUP_ID,  # the recorded owner
        (OTHER_NS, "intruder"): GROUP_ID,  # a second claimant
        (NS, "alone"): None,  # no recorded owner, the only claimant
        (NS, "first"): "contested",  # no recorded owner, two claimants
        (OTHER_NS, "second"): "contested",
    }
    for (namespace, name), group_id in bodies.items():
        body = group_body(topic, broker.bootstrap)
        body["metadata"] = {"name": name, "namespace": namespace}
        if group_id is not None:
            body["spec"]["groupId"] = group_id
        await kube.api_call(
            kmock,
            "POST",
            f"/apis/kafkagroups.io/v1alpha1/namespaces/{namespace}/consumergroups",
            body,
        )
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-group-token", "namespace": namespace},
            "data": {"token": base64.b64encode(f"token-of-{name}".encode()).decode()},
        }
        await kube.api_call(kmock, "POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    runtime_config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=broker.bootstrap, topic=f"kgo-state-{uuid.uuid4().hex[:8]}", partitions=2
    )
    client = kube_client.KubeClient(
        kube_client.Credentials(server=str(kmock.url).rstrip("/"), insecure=True)
    )
    try:
        async with groups.running(runtime_config) as runtime:
            owner = messages.GroupOwner(NS, "orders", uid_of(kmock, NS, "orders"))
            await runtime.claim_group(messages.ClaimGroupRequest(GROUP_ID, owner))
            store = tokens.GroupTokens(loaded=False)
            assert await ownership.load_tokens(client, runtime, store, ()) == 2
    finally:
        await client.close()
    assert store.loaded
    assert store.token_for(GROUP_ID) == "token-of-orders"
    assert store.token_for(f"{NS}.alone") == "token-of-alone"
    assert store.token_for("contested") is None


async def test_while_nobody_owns_an_id_the_oldest_claimant_gets_it_whatever_the_order(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    """As after an upgrade from a version without owners: the older resource has not claimed
    its id yet (here: its reconciliation is paused) when a younger one naming it reconciles."""
    paused = group_body(topic, broker.bootstrap, replicas=1)
    paused["metadata"]["annotations"] = {"kafkagroups.io/pause-reconciliation": "true"}
    await create(kmock, paused)
    await operator.wait_for(
        lambda: (kmock.get(CG, NS, "orders") or {}).get("status", {}).get("conditions")
    )
    # Creation times have a resolution of a second (as the API server's).
    await asyncio.sleep(1.1)
    await create_intruder(kmock, intruder_body(topic, broker.bootstrap, deletionPolicy="Delete"))
    ready = await operator.wait_for(
        lambda: (
            ready_of(kmock, OTHER_NS, "intruder").get("reason") == "GroupIdConflict"
            and ready_of(kmock, OTHER_NS, "intruder")
        )
    )
    assert f"owned by ConsumerGroup {NS}/orders" in ready["message"]
    assert kmock.get("apps/v1/statefulsets", OTHER_NS, "intruder") is None
    assert await operator.call(operator.state.runtime.group_owner(GROUP_ID)) is None
    # Nor does the younger one's deletion claim the id to wipe it.
    await operator.call(
        operator.state.runtime.commit_offsets(
            messages.OffsetCommitRequest(
                GROUP_ID, "", messages.LEAVE_EPOCH, {(topic, 0): messages.CommitOffset(5)}
            )
        )
    )
    await kube.api_call(
        kmock,
        "DELETE",
        f"/apis/kafkagroups.io/v1alpha1/namespaces/{OTHER_NS}/consumergroups/intruder",
    )
    await operator.wait_for(lambda: kmock.get(CG, OTHER_NS, "intruder") is None)
    assert await committed(operator) == {(topic, 0): 5}

    # The older one resumes, claims its id and runs.
    resume = {"metadata": {"annotations": {"kafkagroups.io/pause-reconciliation": None}}}
    await kube.api_call(kmock, "PATCH", GROUP_PATH, resume)
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    owner = await operator.call(operator.state.runtime.group_owner(GROUP_ID))
    assert owner == messages.GroupOwner(NS, "orders", uid_of(kmock, NS, "orders"))
