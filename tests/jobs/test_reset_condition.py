"""A status write of the ConsumerGroup handlers never undoes the reset handler's
ResetInProgress condition: the status they computed from an older view of the object still
carries the condition as it was then (True, mid-reset), and writing it back would leave a
finished reset's group paused for good."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from kafka_group_operator.handlers import consumer_groups
from kafka_group_operator.kube import client
from kafka_group_operator.manifests import conditions
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.kmock(cls=kube.ApiServer)]

RESOURCE = "kafkagroups.io/v1alpha1/consumergroups"


@pytest.fixture
async def api(kmock: kube.ApiServer) -> AsyncIterator[client.KubeClient]:
    kube_client = client.KubeClient(client.Credentials(server=str(kmock.url)))
    yield kube_client
    await kube_client.close()


def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": ""}


BODY = {
    "apiVersion": "kafkagroups.io/v1alpha1",
    "kind": "ConsumerGroup",
    "metadata": {"name": "g", "namespace": "ns"},
    "spec": {"replicas": 1},
}


async def stale_write(
    api: client.KubeClient,
    kmock: kube.ApiServer,
    written: dict[str, Any],
    stale: dict[str, Any],
    owned: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The group with ``written`` as its status, then a handler's write of ``stale`` (built
    from an older view of it): the status stored after that, conditions by type."""
    await api.create(client.CONSUMER_GROUPS, "ns", BODY)
    await api.patch_status(client.CONSUMER_GROUPS, "ns", "g", {"conditions": [written]})
    state: Any = SimpleNamespace(kube=api)
    await consumer_groups._patch_status(state, BODY, stale, owned=owned)
    stored = kmock.get(RESOURCE, "ns", "g")
    assert stored is not None
    status: dict[str, Any] = stored["status"]
    status["conditions"] = {c["type"]: c["status"] for c in status["conditions"]}
    return status


async def test_a_stale_status_write_keeps_a_finished_resets_condition(
    api: client.KubeClient, kmock: kube.ApiServer
) -> None:
    # The reset finished: the reset handler wrote ResetInProgress=False. The status daemon
    # computed its status from the object as it was mid-reset.
    stored = await stale_write(
        api,
        kmock,
        condition(conditions.RESET_IN_PROGRESS, "False", "Done"),
        {
            "state": "Stable",
            "conditions": [
                condition(conditions.READY, "True", "Stable"),
                condition(conditions.RESET_IN_PROGRESS, "True", "Pausing"),
            ],
        },
    )
    assert stored["conditions"] == {conditions.RESET_IN_PROGRESS: "False", conditions.READY: "True"}
    assert stored["state"] == "Stable"


async def test_a_stale_status_refresh_keeps_a_resumed_groups_condition(
    api: client.KubeClient, kmock: kube.ApiServer
) -> None:
    """The status daemon's refresh, computed on the body it saw while the group's
    reconciliation was paused, must not write ReconciliationPaused=True back over the resumed
    reconcile's False: nothing would ever set it False again."""
    paused = consumer_groups.RECONCILIATION_PAUSED
    stored = await stale_write(
        api,
        kmock,
        condition(paused, "False", "AnnotationRemoved"),
        {
            "conditions": [
                condition(conditions.READY, "True", "GroupStable"),
                condition(paused, "True", "AnnotationSet"),
            ],
        },
        owned=consumer_groups.REFRESHED_CONDITIONS,
    )
    assert stored["conditions"] == {paused: "False", conditions.READY: "True"}
