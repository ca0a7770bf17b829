"""``spec.clientProtocol: kafka``: the gateway as a native sidecar, the Kafka client's three
variables in the application containers, nothing of the library's."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import shutil
import sys
from typing import Any

import kubernetes_validate
import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config
from kafka_group_operator.manifests import consumer_group
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors
from tests.chart import test_chart as chart
from tests.manifests.test_consumer_group import K8S_VERSION, URL

GATEWAY = consumer_group.GatewaySettings(
    image="ghcr.io/kafka-group-operator/kafka-group-operator:0.1.0",
    coordinator_address="kafka-group-operator.kgo.svc:9092",
)


def _group(**changes: Any) -> specs.ConsumerGroupSpec:
    spec: dict[str, Any] = {
        "topics": ["orders"],
        "replicas": 2,
        "kafka": {"bootstrapServers": "kafka-0:9092,kafka-1:9092"},
        "clientProtocol": "kafka",
        "template": {
            "spec": {
                "initContainers": [{"name": "migrate", "image": "migrate:1"}],
                "containers": [
                    {
                        "name": "app",
                        "image": "app:1",
                        "env": [
                            {"name": "LOG_LEVEL", "value": "info"},
                            {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": "elsewhere:9092"},
                        ],
                    }
                ],
            }
        },
    }
    spec.update(changes)
    return specs.parse_consumer_group("orders", "shop", spec)


def _pod(group: specs.ConsumerGroupSpec) -> dict[str, Any]:
    pod: dict[str, Any] = consumer_group.build_stateful_set(group, URL, GATEWAY)["spec"][
        "template"
    ]["spec"]
    return pod


def test_client_protocol_defaults_to_library_and_is_checked() -> None:
    assert _group(clientProtocol="library").client_protocol == "library"
    spec = copy.deepcopy(dict(_group().template))
    default = specs.parse_consumer_group(
        "orders", "shop", {"topics": ["t"], "kafka": {"bootstrapServers": "k:1"}, "template": spec}
    )
    assert default.client_protocol == "library"
    with pytest.raises(errors.InvalidSpec, match="clientProtocol must be one of library, kafka"):
        _group(clientProtocol="grpc")


def test_gateway_is_a_native_sidecar_started_first() -> None:
    pod = _pod(_group())
    gateway, migrate = pod["initContainers"]
    assert migrate == {"name": "migrate", "image": "migrate:1"}
    assert gateway == {
        "name": "kgo-gateway",
        "image": GATEWAY.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["kgo", "gateway"],
        "restartPolicy": "Always",
        "env": [
            {"name": "KGO_UPSTREAM_BOOTSTRAP_SERVERS", "value": "kafka-0:9092,kafka-1:9092"},
            {"name": "KGO_COORDINATOR_KAFKA_ADDRESS", "value": GATEWAY.coordinator_address},
            {"name": "KGO_GROUP_ID", "value": "shop.orders"},
            {
                "name": "KGO_GROUP_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "orders-group-token", "key": "token"}},
            },
            {"name": "KGO_GATEWAY_PORT", "value": "9092"},
        ],
        "startupProbe": {
            "exec": {"command": ["python3", "-c", consumer_group.GATEWAY_PROBE, "9092"]},
            "periodSeconds": 1,
            "timeoutSeconds": 5,
            "failureThreshold": 60,
        },
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def test_application_gets_the_kafka_client_variables_only() -> None:
    (app,) = _pod(_group())["containers"]
    assert app["env"] == [
        # The template's own bootstrap would bypass the gateway: replaced.
        {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": "127.0.0.1:9092"},
        {"name": "KAFKA_GROUP_ID", "value": "shop.orders"},
        {
            "name": "KAFKA_GROUP_INSTANCE_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        },
        {"name": "LOG_LEVEL", "value": "info"},
    ]
    # No token and no Kafka credentials in the application container.
    assert "volumeMounts" not in app


def test_kafka_secret_goes_to_the_gateway_only() -> None:
    group = _group(kafka={"bootstrapServers": "kafka:9093", "secretRef": {"name": "sasl"}})
    pod = _pod(group)
    assert pod["volumes"] == [{"name": "kgo-kafka-config", "secret": {"secretName": "sasl"}}]
    gateway = pod["initContainers"][0]
    assert gateway["volumeMounts"] == [
        {"name": "kgo-kafka-config", "mountPath": "/etc/kafka-group/kafka", "readOnly": True}
    ]
    assert {"name": "KGO_KAFKA_CONFIG_DIR", "value": "/etc/kafka-group/kafka"} in gateway["env"]
    assert "volumeMounts" not in pod["containers"][0]


def test_a_template_gateway_is_replaced_and_rebuilding_is_stable() -> None:
    group = _group()
    template = copy.deepcopy(dict(group.template))
    template["spec"]["initContainers"].append({"name": "kgo-gateway", "image": "old:1"})
    own = specs.parse_consumer_group(
        "orders",
        "shop",
        {
            "topics": ["orders"],
            "kafka": {"bootstrapServers": "kafka:9092"},
            "clientProtocol": "kafka",
            "template": template,
        },
    )
    names = [c["name"] for c in _pod(own)["initContainers"]]
    assert names == ["kgo-gateway", "migrate"]
    assert _pod(own)["initContainers"][0]["image"] == GATEWAY.image
    # The spec's template is left as it was.
    assert own.template["spec"]["initContainers"][-1] == {"name": "kgo-gateway", "image": "old:1"}


def test_kafka_protocol_needs_the_gateway_settings() -> None:
    with pytest.raises(ValueError, match="gateway"):
        consumer_group.build_stateful_set(_group(), URL)
    # The library protocol needs none and gets no sidecar.
    pod = consumer_group.build_stateful_set(_group(clientProtocol="library"), URL)["spec"]
    assert [c["name"] for c in pod["template"]["spec"]["initContainers"]] == ["migrate"]


def test_patch_carries_the_sidecar() -> None:
    patch = consumer_group.build_stateful_set_patch(_group(), URL, GATEWAY)
    init = patch["spec"]["template"]["spec"]["initContainers"]
    assert init[0]["name"] == "kgo-gateway"


@pytest.mark.parametrize("secret", [None, {"name": "sasl"}])
def test_body_is_a_valid_kubernetes_object(secret: dict[str, str] | None) -> None:
    kafka: dict[str, Any] = {"bootstrapServers": "kafka:9093"}
    if secret:
        kafka["secretRef"] = secret
    body = consumer_group.build_stateful_set(_group(kafka=kafka), URL, GATEWAY)
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)


async def test_the_startup_probe_passes_once_the_gateway_listens() -> None:
    """The probe's command, run as the kubelet runs it (in the pod, so on its loopback):
    it fails while nothing listens on the gateway's port and passes once something does,
    without sending a byte (the gateway opens no upstream for a connection that sends
    nothing)."""
    port = embedded.free_port()
    settings = dataclasses.replace(GATEWAY, port=port)
    probe = consumer_group.build_gateway_container(_group(), settings)["startupProbe"]
    command = [
        "python3" if shutil.which("python3") else sys.executable,
        *probe["exec"]["command"][1:],
    ]

    async def run_probe() -> int:
        process = await asyncio.create_subprocess_exec(*command)
        return await asyncio.wait_for(process.wait(), probe["timeoutSeconds"] * 6)

    assert await run_probe() != 0
    received = bytearray()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.read())
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", port)
    try:
        assert await run_probe() == 0
    finally:
        server.close()
        await server.wait_closed()
    assert received == b""


def test_operator_settings_give_the_sidecar_its_resources() -> None:
    resources = {"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
    settings = config.OperatorConfig.from_env(
        {"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_GATEWAY_RESOURCES": json.dumps(resources)}
    )
    gateway = consumer_group.build_gateway_container(_group(), config.gateway_settings(settings))
    assert gateway["resources"] == resources
    for bad in ("[1]", '{"requests": {"cpu": true}}', '{"claims": []}', "{"):
        with pytest.raises(config.ConfigError, match="KGO_GATEWAY_RESOURCES"):
            config.OperatorConfig.from_env(
                {"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_GATEWAY_RESOURCES": bad}
            )
    docs = chart._render(
        *chart.REQUIRED,
        "--set-json",
        f"gateway.resources={json.dumps(resources)}",
    )
    (container,) = chart._find(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert json.loads(env["KGO_GATEWAY_RESOURCES"]) == resources
    # By default the chart sets nothing: the builder's defaults apply.
    (default,) = chart._find(chart._render(*chart.REQUIRED), "StatefulSet")["spec"]["template"][
        "spec"
    ]["containers"]
    assert "KGO_GATEWAY_RESOURCES" not in {item["name"] for item in default["env"]}


def test_operator_settings_give_the_sidecar_its_image_and_coordinator() -> None:
    settings = config.OperatorConfig.from_env(
        {
            "KGO_BOOTSTRAP_SERVERS": "k:1",
            "KGO_COORDINATOR_URL": "http://kgo.system.svc:8080",
            "KGO_KAFKA_PORT": "9093",
            "KGO_GATEWAY_IMAGE": "registry/kgo:1.2.3",
        }
    )
    assert config.gateway_settings(settings) == consumer_group.GatewaySettings(
        image="registry/kgo:1.2.3", coordinator_address="kgo.system.svc:9093"
    )


def test_chart_gives_the_operator_its_own_image_for_the_sidecar() -> None:
    docs = chart._render(*chart.REQUIRED, "--set", "image.tag=9.9.9")
    (container,) = chart._find(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KGO_GATEWAY_IMAGE"] == container["image"]
    assert container["image"].endswith(":9.9.9")
