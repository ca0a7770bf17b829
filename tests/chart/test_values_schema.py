"""The chart's values: a misspelled key fails at ``helm template``; Secret access can be narrowed.

helm validates the values against ``values.schema.json`` on install, upgrade, lint and
template alike, so ``helm template`` shows what ``helm install`` would say.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.chart import test_chart

REQUIRED = test_chart.REQUIRED


def template(*values: str) -> tuple[int, str, list[dict[str, Any]]]:
    done = test_chart._helm(
        "template", "kgo", str(test_chart.CHART), "--namespace", "kgo-system", *values, check=False
    )
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc] if done.returncode == 0 else []
    return done.returncode, done.stderr, docs


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        (
            "kafka.bootstrapServer=k:9092",
            "- kafka: Additional property bootstrapServer is not allowed",
        ),
        ("logLevl=DEBUG", "- (root): Additional property logLevl is not allowed"),
        ("image.tags=1.2.3", "- image: Additional property tags is not allowed"),
        ("stateTopic.partition=12", "- stateTopic: Additional property partition is not allowed"),
        ("spark.sparkconf.a=b", "- spark: Additional property sparkconf is not allowed"),
        ("compaction.enable=false", "- compaction: Additional property enable is not allowed"),
        (
            "rbac.secretNamespace={shop}",
            "- rbac: Additional property secretNamespace is not allowed",
        ),
        (
            "serviceAccount.annotation.a=b",
            "- serviceAccount: Additional property annotation is not allowed",
        ),
        ("api.serviceTyp=NodePort", "- api: Additional property serviceTyp is not allowed"),
    ],
)
def test_a_misspelled_value_fails_the_install(setting: str, refusal: str) -> None:
    code, stderr, _ = template(*REQUIRED, "--set", setting)
    assert code != 0
    assert "values don't meet the specifications of the schema(s)" in stderr
    assert refusal in stderr.splitlines()


def test_every_documented_value_and_the_open_kubernetes_structures_pass() -> None:
    code, stderr, _ = template(
        *REQUIRED,
        "--set", "global.imageRegistry=mirror.example",
        "--set", "resources.limits.cpu=1",
        "--set", "affinity.nodeAffinity.x=y",
        "--set", "podSecurityContext.fsGroupChangePolicy=OnRootMismatch",
        "--set", "imagePullSecrets[0].name=regcred",
        "--set", "extraEnv[0].name=A",
        "--set", "extraEnv[0].value=b",
    )  # fmt: skip
    assert code == 0, stderr


def secret_rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for rule in doc.get("rules", []) if "secrets" in rule.get("resources", [])]


def test_secrets_are_cluster_wide_only_until_their_namespaces_are_listed() -> None:
    _, _, docs = template(*REQUIRED)
    cluster = test_chart._find(docs, "ClusterRole", "kgo-kafka-group-operator-cluster")
    assert secret_rules(cluster) == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]}
    ]

    _, _, docs = template(*REQUIRED, "--set", "rbac.secretNamespaces={shop,billing}")
    cluster = test_chart._find(docs, "ClusterRole", "kgo-kafka-group-operator-cluster")
    assert secret_rules(cluster) == []
    roles = {
        doc["metadata"]["namespace"]: secret_rules(doc)
        for doc in docs
        if doc["kind"] == "Role" and doc["metadata"]["name"] == "kgo-kafka-group-operator-secrets"
    }
    assert roles == {
        namespace: [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]}]
        for namespace in ("shop", "billing")
    }
    bindings = {
        doc["metadata"]["namespace"]: (doc["roleRef"]["name"], doc["subjects"])
        for doc in docs
        if doc["kind"] == "RoleBinding" and doc["roleRef"]["name"].endswith("-secrets")
    }
    subject = [
        {"kind": "ServiceAccount", "name": "kgo-kafka-group-operator", "namespace": "kgo-system"}
    ]
    assert bindings == {
        "shop": ("kgo-kafka-group-operator-secrets", subject),
        "billing": ("kgo-kafka-group-operator-secrets", subject),
    }
    # Everything else the operator needs stays cluster-wide.
    assert any("consumergroups" in rule["resources"] for rule in cluster["rules"])
