"""The children of a ConsumerGroup, built purely from its spec."""

from __future__ import annotations

import base64
import copy
from typing import Any

import kubernetes_validate
import pytest

from kafka_group_operator.manifests import consumer_group, group_settings
from kafka_group_operator.specs import consumer_group as specs

URL = "http://kafka-group-operator.kgo.svc:8080"
K8S_VERSION = "1.32"


def _group(**changes: Any) -> specs.ConsumerGroupSpec:
    spec: dict[str, Any] = {
        "topics": ["orders", "refunds"],
        "replicas": 3,
        "kafka": {"bootstrapServers": "kafka:9092"},
        "autoOffsetReset": "earliest",
        "template": {
            "metadata": {"labels": {"app": "orders"}, "annotations": {"team": "shop"}},
            "spec": {
                "containers": [
                    {
                        "name": "consumer",
                        "image": "consumer:1",
                        "env": [
                            {"name": "LOG_LEVEL", "value": "debug"},
                            {"name": "KGO_GROUP_ID", "value": "spoofed"},
                        ],
                    },
                    {"name": "sidecar", "image": "sidecar:1"},
                ]
            },
        },
    }
    spec.update(changes)
    return specs.parse_consumer_group("orders", "shop", spec)


GROUP_ENV = [
    {"name": "KGO_GROUP_ID", "value": "shop.orders"},
    {"name": "KGO_COORDINATOR_URL", "value": URL},
    {
        "name": "KGO_GROUP_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "orders-group-token", "key": "token"}},
    },
    {"name": "KGO_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "KGO_MEMBER_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    {"name": "KGO_TOPICS", "value": "orders,refunds"},
    {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": "kafka:9092"},
    {"name": "KGO_AUTO_OFFSET_RESET", "value": "earliest"},
    {"name": "KGO_SESSION_TIMEOUT_MS", "value": "45000"},
]
LABELS = {
    "app.kubernetes.io/name": "kafka-group-consumer",
    "app.kubernetes.io/instance": "orders",
    "app.kubernetes.io/managed-by": "kafka-group-operator",
    "kafkagroups.io/consumer-group": "orders",
}


def test_stateful_set_body() -> None:
    assert consumer_group.build_stateful_set(_group(), URL) == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "orders", "namespace": "shop", "labels": LABELS},
        "spec": {
            "replicas": 3,
            "serviceName": "orders",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"kafkagroups.io/consumer-group": "orders"}},
            "template": {
                "metadata": {
                    "labels": {"app": "orders", **LABELS},
                    "annotations": {"team": "shop", "kafkagroups.io/group-id": "shop.orders"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "consumer",
                            "image": "consumer:1",
                            # The template's own KGO_GROUP_ID cannot override the operator's.
                            "env": [*GROUP_ENV, {"name": "LOG_LEVEL", "value": "debug"}],
                        },
                        {"name": "sidecar", "image": "sidecar:1", "env": GROUP_ENV},
                    ]
                },
            },
        },
    }


def test_kafka_secret_is_mounted_into_every_container() -> None:
    group = _group(kafka={"bootstrapServers": "kafka:9093", "secretRef": {"name": "tls"}})
    pod = consumer_group.build_stateful_set(group, URL)["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "kgo-kafka-config", "secret": {"secretName": "tls"}}]
    for container in pod["containers"]:
        assert container["volumeMounts"] == [
            {"name": "kgo-kafka-config", "mountPath": "/etc/kafka-group/kafka", "readOnly": True}
        ]
        assert {"name": "KGO_KAFKA_CONFIG_DIR", "value": "/etc/kafka-group/kafka"} in container[
            "env"
        ]


def test_building_does_not_mutate_the_spec() -> None:
    group = _group()
    before = copy.deepcopy(dict(group.template))
    consumer_group.build_stateful_set(group, URL)
    assert dict(group.template) == before


def test_stateful_set_patch_leaves_immutable_fields_alone() -> None:
    patch = consumer_group.build_stateful_set_patch(_group(replicas=5), URL)
    assert set(patch["spec"]) == {"replicas", "template"}
    assert patch["spec"]["replicas"] == 5


def test_headless_service_and_token_secret() -> None:
    group = _group()
    assert consumer_group.build_headless_service(group) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "orders", "namespace": "shop", "labels": LABELS},
        "spec": {
            "clusterIP": "None",
            "selector": {"kafkagroups.io/consumer-group": "orders"},
            "publishNotReadyAddresses": True,
        },
    }
    secret = consumer_group.build_token_secret(group, "s3cr3t")
    assert secret["metadata"]["name"] == "orders-group-token"
    assert secret["data"] == {"token": base64.b64encode(b"s3cr3t").decode()}
    assert consumer_group.token_from_secret(secret) == "s3cr3t"
    assert consumer_group.token_from_secret({"data": {}}) is None


@pytest.mark.parametrize(
    "build",
    [
        lambda g: consumer_group.build_stateful_set(g, URL),
        consumer_group.build_headless_service,
        lambda g: consumer_group.build_token_secret(g, "t"),
    ],
)
def test_bodies_are_valid_kubernetes_objects(build: Any) -> None:
    group = _group(kafka={"bootstrapServers": "kafka:9093", "secretRef": {"name": "tls"}})
    kubernetes_validate.validate(build(group), K8S_VERSION, strict=True)


def test_ordinals_and_selector() -> None:
    assert consumer_group.instance_id("orders", 2) == "orders-2"
    assert consumer_group.ordinal_of("orders", "orders-12") == 12
    assert consumer_group.ordinal_of("orders", "orders-x") is None
    assert consumer_group.ordinal_of("orders", "payments-1") is None
    assert consumer_group.label_selector("orders") == "kafkagroups.io/consumer-group=orders"


def test_group_settings() -> None:
    settings = group_settings.build_group_settings(
        _group(sessionTimeoutSeconds=30, offsetsRetentionMinutes=60, assignor="range")
    )
    assert settings.group_id == "shop.orders"
    assert (settings.assignor, settings.session_timeout_ms) == ("range", 30_000)
    assert settings.offsets_retention_ms == 3_600_000
    assert settings.topics == ("orders", "refunds")
    assert settings.assignment_paused is False
    assert group_settings.build_group_settings(_group(paused=True)).assignment_paused
    assert group_settings.build_group_settings(_group(), paused_for_reset=True).assignment_paused
