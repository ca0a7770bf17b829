"""The operator's Kubernetes client against the API server: CRUD, errors, status, discovery."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kafka_group_operator.kube import client, errors
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.kmock(cls=kube.ApiServer)]


@pytest.fixture
async def api(kmock: kube.ApiServer) -> AsyncIterator[client.KubeClient]:
    kube_client = client.KubeClient(client.Credentials(server=str(kmock.url)))
    yield kube_client
    await kube_client.close()


def _secret(name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": "ns", "labels": labels or {}},
        "data": {"k": "dg=="},
    }


async def test_create_get_patch_delete(api: client.KubeClient) -> None:
    created = await api.create(client.SECRETS, "ns", _secret("one"))
    assert created["metadata"]["uid"]
    fetched = await api.get(client.SECRETS, "ns", "one")
    assert fetched["data"] == {"k": "dg=="}
    patched = await api.patch(client.SECRETS, "ns", "one", {"metadata": {"labels": {"a": "b"}}})
    assert patched["metadata"]["labels"] == {"a": "b"}
    assert int(patched["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    await api.delete(client.SECRETS, "ns", "one")
    assert await api.get_or_none(client.SECRETS, "ns", "one") is None
    await api.delete(client.SECRETS, "ns", "one")  # deleting what is gone is fine


async def test_errors_are_ours(api: client.KubeClient) -> None:
    with pytest.raises(errors.NotFound):
        await api.get(client.SECRETS, "ns", "absent")
    await api.create(client.SECRETS, "ns", _secret("dup"))
    with pytest.raises(errors.Conflict) as caught:
        await api.create(client.SECRETS, "ns", _secret("dup"))
    assert caught.value.status == 409
    unconfigured = client.KubeClient()
    with pytest.raises(errors.Unreachable):
        await unconfigured.get(client.SECRETS, "ns", "dup")
    gone = client.KubeClient(client.Credentials(server="http://127.0.0.1:1"))
    with pytest.raises(errors.Unreachable):
        await gone.get(client.SECRETS, "ns", "dup")
    await gone.close()


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, errors.Invalid), (422, errors.Invalid), (403, errors.Forbidden)],
)
async def test_refusals_are_told_apart(
    kmock: kube.ApiServer, api: client.KubeClient, status: int, error: type[errors.KubeError]
) -> None:
    kmock.reject("v1/secrets", status, "refused for a reason", name="bad")
    with pytest.raises(error) as caught:
        await api.create(client.SECRETS, "ns", _secret("bad"))
    assert caught.value.status == status
    assert "refused for a reason" in str(caught.value)
    await api.create(client.SECRETS, "ns", _secret("good"))  # only the chosen object


async def test_list_filters_by_labels(api: client.KubeClient) -> None:
    await api.create(client.SECRETS, "ns", _secret("a", {"group": "x"}))
    await api.create(client.SECRETS, "ns", _secret("b", {"group": "y"}))
    names = [
        item["metadata"]["name"] for item in await api.list(client.SECRETS, "ns", {"group": "x"})
    ]
    assert names == ["a"]
    assert len(await api.list(client.SECRETS, "ns")) == 2


async def test_status_patch_touches_only_the_status(
    api: client.KubeClient, kmock: kube.ApiServer
) -> None:
    group = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {"replicas": 1},
    }
    await api.create(client.CONSUMER_GROUPS, "ns", group)
    await api.patch_status(client.CONSUMER_GROUPS, "ns", "g", {"state": "Stable"})
    stored = kmock.get("kafkagroups.io/v1alpha1/consumergroups", "ns", "g")
    assert stored is not None
    assert stored["status"] == {"state": "Stable"}
    assert stored["metadata"]["generation"] == 1  # a status change is not a new generation


async def test_kind_exists(api: client.KubeClient) -> None:
    assert await api.kind_exists(client.CONSUMER_GROUPS)
    assert await api.kind_exists(client.STATEFUL_SETS)
    assert not await api.kind_exists(
        client.Kind("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
    )


def test_paths() -> None:
    assert client.PODS.path("ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert client.CONSUMER_GROUPS.path("ns", "g", "status") == (
        "/apis/kafkagroups.io/v1alpha1/namespaces/ns/consumergroups/g/status"
    )
    assert client.STATEFUL_SETS.path(None) == "/apis/apps/v1/statefulsets"


async def test_a_stale_status_patch_conflicts(api: client.KubeClient) -> None:
    group = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {},
    }
    created = await api.create(client.CONSUMER_GROUPS, "ns", group)
    version = created["metadata"]["resourceVersion"]
    await api.patch_status(client.CONSUMER_GROUPS, "ns", "g", {"state": "Empty"}, version)
    with pytest.raises(errors.Conflict):
        await api.patch_status(client.CONSUMER_GROUPS, "ns", "g", {"state": "Stable"}, version)
