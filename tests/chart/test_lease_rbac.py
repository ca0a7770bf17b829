"""The chart's Lease RBAC: only the verbs the elector uses, reading and renewing only the Leases
it names (one per state partition, one per replica); create, list and watch, which cannot be
narrowed by name, on the operator's namespace only."""

from __future__ import annotations

import pytest

from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import elector, leases
from tests.chart.test_chart import REQUIRED, _find, _render

FULLNAME = "kgo-kafka-group-operator"


@pytest.mark.parametrize(("partitions", "replicas"), [(3, 1), (50, 3), (50, 5)])
def test_leases_are_granted_by_name_in_the_operators_namespace(
    partitions: int, replicas: int
) -> None:
    docs = _render(
        *REQUIRED,
        "--set",
        f"stateTopic.partitions={partitions}",
        "--set",
        f"replicas={replicas}",
    )
    role = _find(docs, "Role", f"{FULLNAME}-leases")
    assert role["metadata"]["namespace"] == "kgo-system"
    prefix = f"{FULLNAME}-partition"
    pods = [f"{FULLNAME}-{index}" for index in range(replicas)]
    # Only its names are asked for: no API is called.
    alive = elector.ReplicaLeases(kube_client.KubeClient(), "kgo-system", prefix, pods[0], pods, 15)
    names = [leases.lease_name(prefix, p) for p in range(partitions)] + [
        alive.lease_name(index) for index in range(replicas)
    ]
    assert role["rules"] == [
        # A create is authorized before its object has a name, and a watch is of the
        # collection: neither can be narrowed.
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "list", "watch"],
        },
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "update"],
            "resourceNames": names,
        },
    ]
    binding = _find(docs, "RoleBinding", f"{FULLNAME}-leases")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": "kgo-system"}
    ]
    # No other role grants anything on Leases.
    others = [
        rule
        for doc in docs
        if doc["kind"] in ("Role", "ClusterRole") and doc is not role
        for rule in doc["rules"]
        if "leases" in rule["resources"]
    ]
    assert others == []
