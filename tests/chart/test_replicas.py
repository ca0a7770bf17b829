"""The chart's replicas: a StatefulSet of 3 by default, each with its own identity and address
through a headless Service, spread over nodes, a PodDisruptionBudget, a shared internal token,
and kopf's peering (objects and rights) so that one replica runs the handlers."""

from __future__ import annotations

from typing import Any

from kafka_group_operator.commands import kube_operator
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.kube import leases
from kafka_group_operator.protocol import peers
from tests.chart.test_chart import REQUIRED, _find, _render, _rules

FULLNAME = "kgo-kafka-group-operator"
HEADLESS = f"{FULLNAME}-headless"


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    operator = _find(docs, "StatefulSet", FULLNAME)
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_three_replicas_by_default_in_a_statefulset_behind_a_headless_service() -> None:
    docs = _render(*REQUIRED)
    assert [doc["kind"] for doc in docs].count("Deployment") == 0
    operator = _find(docs, "StatefulSet", FULLNAME)
    assert operator["spec"]["replicas"] == 3
    assert operator["spec"]["serviceName"] == HEADLESS
    headless = _find(docs, "Service", HEADLESS)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert headless["spec"]["selector"] == operator["spec"]["selector"]["matchLabels"]
    assert {(p["name"], p["targetPort"]) for p in headless["spec"]["ports"]} == {
        ("http", "api"),
        ("kafka", "kafka"),
    }
    # Members still bootstrap through the load-balanced Service (any replica answers, and
    # names the coordinator of their group).
    service = _find(docs, "Service", FULLNAME)
    assert service["spec"].get("clusterIP") != "None"


def test_each_replica_knows_its_identity_address_and_share() -> None:
    container = _container(_render(*REQUIRED, "--set", "leases.durationSeconds=6"))
    env = {item["name"]: item for item in container["env"]}
    for name in ("KGO_POD_NAME", "POD_ID"):
        assert env[name]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["KGO_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["KGO_REPLICAS"]["value"] == "3"
    assert env["KGO_LEASE_DURATION_SECONDS"]["value"] == "6"
    peer_url = env["KGO_PEER_URL"]["value"]
    assert peer_url == f"http://{{identity}}.{HEADLESS}.kgo-system.svc:8080"
    # Each replica's coordinator listener is reached through the headless Service (with the
    # namespace: Kafka clients run in the groups' namespaces), on the chart's Kafka port.
    assert env["KGO_KAFKA_PEER_ADDRESS"]["value"] == f"{{identity}}.{HEADLESS}.kgo-system.svc:9092"
    assert "KGO_KAFKA_ADVERTISED_HOST" not in env
    assert env["KGO_INTERNAL_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": f"{FULLNAME}-internal", "key": "token"}
    }
    # What the operator reads from that environment, for its second replica.
    plain = {
        name: item["value"] for name, item in env.items() if isinstance(item.get("value"), str)
    }
    config = operator_config.OperatorConfig.from_env(
        {
            **plain,
            "KGO_POD_NAME": f"{FULLNAME}-1",
            "KGO_NAMESPACE": "kgo-system",
            "KGO_INTERNAL_TOKEN": "secret",
        }
    )
    assert config.leases is not None
    assert config.leases.identities == tuple(f"{FULLNAME}-{n}" for n in range(3))
    # The Leases it takes are those the chart's Role grants.
    assert config.leases.lease_prefix == f"{FULLNAME}-partition"
    assert leases.lease_name(config.leases.lease_prefix, 7) == f"{FULLNAME}-partition-7"
    assert config.leases.peer_url.format(identity=f"{FULLNAME}-1") == (
        f"http://{FULLNAME}-1.{HEADLESS}.kgo-system.svc:8080"
    )
    assert config.internal_token == "secret"
    # Its listener advertises its own address, and names the others' by theirs.
    address_of = peers.address_template(config.leases.kafka_peer_address)
    assert address_of(f"{FULLNAME}-1") == (f"{FULLNAME}-1.{HEADLESS}.kgo-system.svc", 9092)
    peering = kube_operator.peering_for(config)
    assert peering == kube_operator.Peering(
        standalone=False, name=FULLNAME, priority=kube_operator.PEERING_TOP_PRIORITY - 1
    )


def test_the_replicas_kafka_address_follows_the_kafka_port() -> None:
    container = _container(_render(*REQUIRED, "--set", "api.kafkaPort=9093"))
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KGO_KAFKA_PEER_ADDRESS"] == f"{{identity}}.{HEADLESS}.kgo-system.svc:9093"
    assert env["KGO_KAFKA_PORT"] == "9093"


def test_replicas_prefer_distinct_nodes_unless_the_affinity_is_given() -> None:
    operator = _find(_render(*REQUIRED), "StatefulSet", FULLNAME)
    affinity = operator["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == operator["spec"]["selector"]["matchLabels"]
    )
    given = _find(_render(*REQUIRED, "--set", "affinity.nodeAffinity.x=y"), "StatefulSet", FULLNAME)
    assert given["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {"x": "y"}}


def test_a_disruption_takes_one_replica_at_a_time() -> None:
    docs = _render(*REQUIRED)
    budget = _find(docs, "PodDisruptionBudget", FULLNAME)
    operator = _find(docs, "StatefulSet", FULLNAME)
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == operator["spec"]["selector"]
    single = _render(*REQUIRED, "--set", "replicas=1")
    assert "PodDisruptionBudget" not in {doc["kind"] for doc in single}


def test_the_internal_token_is_a_generated_secret() -> None:
    secret = _find(_render(*REQUIRED), "Secret", f"{FULLNAME}-internal")
    assert len(secret["data"]["token"]) >= 48


def test_one_replica_runs_the_handlers_through_kopf_peering() -> None:
    docs = _render(*REQUIRED)
    peering = _find(docs, "ClusterKopfPeering", FULLNAME)
    assert peering["apiVersion"] == "kopf.dev/v1"
    rules = _rules(_find(docs, "ClusterRole", f"{FULLNAME}-cluster"))
    assert rules[("kopf.dev", "clusterkopfpeerings")] == {"list", "watch", "get", "patch"}
    named = [
        rule
        for rule in _find(docs, "ClusterRole", f"{FULLNAME}-cluster")["rules"]
        if "patch" in rule["verbs"] and rule["apiGroups"] == ["kopf.dev"]
    ]
    assert [rule["resourceNames"] for rule in named] == [[FULLNAME]]
    # A namespaced operator peers in each namespace it watches.
    namespaced = _render(*REQUIRED, "--set", "watchNamespaces={shop,billing}")
    for namespace in ("shop", "billing"):
        found = [
            doc
            for doc in namespaced
            if doc["kind"] == "KopfPeering" and doc["metadata"]["namespace"] == namespace
        ]
        assert [doc["metadata"]["name"] for doc in found] == [FULLNAME]
        (role,) = [
            doc
            for doc in namespaced
            if doc["kind"] == "Role"
            and doc["metadata"]["name"] == FULLNAME
            and doc["metadata"]["namespace"] == namespace
        ]
        assert _rules(role)[("kopf.dev", "kopfpeerings")] == {"list", "watch", "get", "patch"}
    # One replica runs standalone: no peering objects, no rights on them.
    single = _render(*REQUIRED, "--set", "replicas=1")
    assert not [doc for doc in single if doc["apiVersion"] == "kopf.dev/v1"]
    assert ("kopf.dev", "clusterkopfpeerings") not in _rules(
        _find(single, "ClusterRole", f"{FULLNAME}-cluster")
    )
    assert kube_operator.peering_for(
        operator_config.OperatorConfig(bootstrap_servers="k:9092")
    ) == kube_operator.Peering(standalone=True)
