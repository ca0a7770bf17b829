"""The Helm chart: lint, render, validate every object offline, and check its contracts.

helm comes from ``make install`` (``.tools/helm/helm``); built-in kinds are validated with
kubernetes-validate (strict: unknown fields fail), our custom resources with jsonschema.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support import kube_schema, rbac

ROOT = kube_schema.ROOT
CHART = ROOT / "charts" / "kafka-group-operator"
HELM = ROOT / ".tools" / "helm" / "helm"
K8S_VERSION = "1.32"
REQUIRED = ["--set", "kafka.bootstrapServers=kafka.kafka.svc:9092"]


def _helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM.exists(), f"{HELM} is missing: run `make install` (it fetches helm)"
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, check=check, timeout=60
    )


def _render(*values: str) -> list[dict[str, Any]]:
    out = _helm(
        "template", "kgo", str(CHART), "--namespace", "kgo-system", "--include-crds", *values
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def test_helm_lint() -> None:
    result = _helm("lint", "--strict", str(CHART), *REQUIRED, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bootstrap_servers_are_required() -> None:
    result = _helm("template", "kgo", str(CHART), check=False)
    assert result.returncode != 0
    assert "kafka.bootstrapServers is required" in result.stderr


@pytest.mark.parametrize(
    "values",
    [
        REQUIRED,
        [
            *REQUIRED,
            "--set",
            "watchNamespaces={shop,billing}",
            "--set",
            "kafka.secretName=kafka-tls",
        ],
    ],
    ids=["cluster-wide", "namespaced"],
)
def test_rendered_objects_are_valid(values: list[str]) -> None:
    docs = _render(*values)
    kinds = sorted({doc["kind"] for doc in docs})
    assert {
        "CustomResourceDefinition",
        "StatefulSet",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "PodDisruptionBudget",
    } <= set(kinds)
    for doc in docs:
        if doc["apiVersion"] == PEERING_API_VERSION:
            kube_schema_of_peering(doc)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


PEERING_API_VERSION = "kopf.dev/v1"


def kube_schema_of_peering(doc: dict[str, Any]) -> None:
    """kopf's peering objects: their CRD (shipped in the chart) has no spec, only a status
    kopf writes; the chart creates them empty."""
    assert doc["kind"] in ("ClusterKopfPeering", "KopfPeering")
    assert set(doc) == {"apiVersion", "kind", "metadata"}
    assert (CHART / "crds" / f"{doc['kind'].lower()}s.kopf.dev.yaml").is_file()


def test_validation_is_strict() -> None:
    operator = _find(_render(*REQUIRED), "StatefulSet")
    operator["spec"]["replica"] = 1  # a typo must not pass silently
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(operator, K8S_VERSION, strict=True)


def test_the_operator_runs_with_the_settings() -> None:
    docs = _render(*REQUIRED, "--set", "kafka.secretName=kafka-tls")
    operator = _find(docs, "StatefulSet", "kgo-kafka-group-operator")
    pod = operator["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:2] == ["kgo", "operator"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KGO_BOOTSTRAP_SERVERS"] == "kafka.kafka.svc:9092"
    assert env["KGO_COORDINATOR_URL"] == "http://kgo-kafka-group-operator.kgo-system.svc:8080"
    assert env["KGO_STATE_TOPIC"] == "kafka-group-operator.group-state"
    assert env["KGO_KAFKA_CONFIG_DIR"] == "/etc/kafka-group-operator/kafka"
    assert {"name": "kafka-config", "secret": {"secretName": "kafka-tls"}} in pod["volumes"]
    service = _find(docs, "Service", "kgo-kafka-group-operator")
    assert service["spec"]["selector"] == operator["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 8080
    # The coordinator listener (Kafka protocol) beside the member API.
    assert env["KGO_KAFKA_PORT"] == "9092"
    assert env["KGO_KAFKA_MAX_CONNECTIONS"] == "10000"
    assert {"name": "kafka", "containerPort": 9092, "protocol": "TCP"} in container["ports"]
    assert {"name": "kafka", "port": 9092, "targetPort": "kafka", "protocol": "TCP"} in service[
        "spec"
    ]["ports"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                rules.setdefault((group, resource), set()).update(rule["verbs"])
    return rules


def test_rbac_is_least_privilege() -> None:
    docs = _render(*REQUIRED)
    rules = _rules(_find(docs, "ClusterRole", "kgo-kafka-group-operator-cluster"))
    assert all("*" not in verbs for verbs in rules.values())
    assert all("*" not in resource for _, resource in rules)
    assert rules[("", "secrets")] == {"get", "create"}
    assert rules[("", "pods")] == {"list", "watch"}
    assert rules[("apps", "statefulsets")] == {"get", "create", "patch", "delete"}
    assert rules[("", "services")] == {"get", "create"}
    assert rules[("kafkagroups.io", "consumergroups")] == {"get", "list", "watch", "patch"}
    assert rules[("kafkagroups.io", "consumergroups/status")] == {"get", "patch"}
    assert rules[("apiextensions.k8s.io", "customresourcedefinitions")] == {"list", "watch"}
    assert rules[("", "events")] == {"create"}
    binding = _find(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kgo-kafka-group-operator", "namespace": "kgo-system"}
    ]


def test_the_derivation_of_used_verbs_sees_the_code() -> None:
    """The scan finds calls we know of, so an empty or broken scan cannot pass the next test."""
    used = rbac.used()
    assert {
        ("apps", "statefulsets", "create"),
        ("apps", "statefulsets", "patch"),
        ("kafkagroups.io", "consumergroups/status", "patch"),
        ("kafkagroups.io", "offsetsnapshots", "delete"),
        ("sparkoperator.k8s.io", "sparkapplications", "create"),
        ("", "pods", "watch"),
        ("kafkagroups.io", "consumergroups/finalizers", "update"),
    } <= used


@pytest.mark.parametrize(
    "values",
    [REQUIRED, [*REQUIRED, "--set", "watchNamespaces={shop}"]],
    ids=["cluster-wide", "namespaced"],
)
def test_every_verb_the_code_uses_is_granted(values: list[str]) -> None:
    docs = _render(*values)
    granted: dict[tuple[str, str], set[str]] = {}
    for role in docs:
        if role["kind"] in ("ClusterRole", "Role") and not role["metadata"]["name"].endswith(
            "-view"
        ):
            for key, verbs in _rules(role).items():
                granted.setdefault(key, set()).update(verbs)
    missing = sorted(
        need for need in rbac.used() if need[2] not in granted.get((need[0], need[1]), set())
    )
    assert missing == []


def test_watched_namespaces_get_roles_not_cluster_rights() -> None:
    docs = _render(*REQUIRED, "--set", "watchNamespaces={shop,billing}")
    cluster_rules = _rules(_find(docs, "ClusterRole", "kgo-kafka-group-operator-cluster"))
    assert set(cluster_rules) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("", "namespaces"),
    }
    # Beside the operator's own Leases role (tests/chart/test_lease_rbac.py) and the Spark
    # driver's (tests/chart/test_chart_defaults.py).
    roles = [
        doc
        for doc in docs
        if doc["kind"] == "Role" and not doc["metadata"]["name"].endswith(("-leases", "-spark"))
    ]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["billing", "shop"]
    assert ("", "secrets") in _rules(roles[0])


def test_aggregate_to_view_role_is_read_only() -> None:
    role = _find(_render(*REQUIRED), "ClusterRole", "kgo-kafka-group-operator-view")
    assert role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert set().union(*_rules(role).values()) == {"get", "list", "watch"}


def test_rendered_crds_are_ours_and_accept_the_examples() -> None:
    docs = _render(*REQUIRED)
    for plural in ("consumergroups", "offsetsnapshots"):
        rendered = _find(docs, "CustomResourceDefinition", f"{plural}.kafkagroups.io")
        assert rendered == kube_schema.load_crd(plural)
    for resource in kube_schema.examples("ConsumerGroup"):
        kube_schema.validate("consumergroups", resource)
    for resource in kube_schema.examples("OffsetSnapshot"):
        kube_schema.validate("offsetsnapshots", resource)


def test_every_value_is_commented() -> None:
    """Each value has a comment right above it, or sits inside a key that has one."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented: list[tuple[int, bool]] = []  # (indent, commented) of the enclosing keys
    undocumented = []
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "- ")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        while documented and documented[-1][0] >= indent:
            documented.pop()
        commented = index > 0 and lines[index - 1].strip().startswith("#")
        is_value = not stripped.endswith(":")  # a section header holds documented values
        if is_value and not commented and not any(flag for _, flag in documented):
            undocumented.append(f"values.yaml:{index + 1} {stripped}")
        documented.append((indent, commented))
    assert undocumented == []


def test_chart_readme_has_argo_cd_health_checks() -> None:
    readme = (CHART / "README.md").read_text()
    assert "resource.customizations.health.kafkagroups.io_ConsumerGroup" in readme
    assert "resource.customizations.health.kafkagroups.io_OffsetSnapshot" in readme


def test_examples_directory_exists() -> None:
    assert Path(kube_schema.EXAMPLES / "consumergroup.yaml").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("spark.mode=yarn", "spark.mode"),
        ("stateTopic.partitions=0", "stateTopic.partitions"),
        ("logLevel=LOUD", "logLevel"),
    ],
)
def test_values_schema_rejects_bad_values(value: str, message: str) -> None:
    result = _helm("template", "kgo", str(CHART), *REQUIRED, "--set", value, check=False)
    assert result.returncode != 0
    assert message in result.stderr
