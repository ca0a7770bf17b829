"""The operator gives a ``clientProtocol: kafka`` group's pods the gateway sidecar, pointed at
its own coordinator listener, and changes the StatefulSet when the protocol changes."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_group_operator.handlers import config
from tests.kube.test_consumer_groups import NS, create, group_body
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]


def pod_spec(api: kube.ApiServer) -> dict[str, Any] | None:
    body = api.get("apps/v1/statefulsets", NS, "orders")
    return None if body is None else dict(body["spec"]["template"]["spec"])


async def test_kafka_protocol_group_gets_the_gateway_sidecar(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, clientProtocol="kafka"))
    await operator.wait_for(lambda: pod_spec(kmock))
    pod = pod_spec(kmock)
    assert pod is not None
    (gateway,) = pod["initContainers"]
    settings = config.gateway_settings(operator.config)
    assert gateway["name"] == "kgo-gateway"
    assert gateway["restartPolicy"] == "Always"
    assert gateway["image"] == settings.image
    env = {item["name"]: item.get("value") for item in gateway["env"]}
    assert env["KGO_COORDINATOR_KAFKA_ADDRESS"] == settings.coordinator_address
    assert env["KGO_UPSTREAM_BOOTSTRAP_SERVERS"] == broker.bootstrap
    (app,) = pod["containers"]
    assert [item["name"] for item in app["env"]] == [
        "KAFKA_BOOTSTRAP_SERVERS",
        "KAFKA_GROUP_ID",
        "KAFKA_GROUP_INSTANCE_ID",
    ]
