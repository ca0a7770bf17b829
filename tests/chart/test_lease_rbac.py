"""The chart's Lease RBAC: only the verbs the elector uses, on only the Leases it names."""

from __future__ import annotations

import pytest

from kafka_group_operator.kube import leases
from tests.chart.test_chart import REQUIRED, _find, _render

FULLNAME = "kgo-kafka-group-operator"


@pytest.mark.parametrize("partitions", [3, 50])
def test_leases_are_granted_by_name_in_the_operators_namespace(partitions: int) -> None:
    docs = _render(*REQUIRED, "--set", f"stateTopic.partitions={partitions}")
    role = _find(docs, "Role", f"{FULLNAME}-leases")
    assert role["metadata"]["namespace"] == "kgo-system"
    names = [leases.lease_name(f"{FULLNAME}-partition", p) for p in range(partitions)]
    assert role["rules"] == [
        # A create is authorized before its object has a name: it cannot be narrowed.
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
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
