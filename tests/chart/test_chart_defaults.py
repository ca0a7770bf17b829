"""The chart's defaults are the ones a platform team can install from: a state topic that
survives a broker, no compaction that silently never runs, the Spark driver's ServiceAccount,
NOTES that point at nothing outside the release, and the Kubernetes versions the chart needs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kafka_group_operator.handlers import config
from tests.chart import test_chart
from tests.support import kube_schema

REQUIRED = test_chart.REQUIRED


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    operator = test_chart._find(docs, "StatefulSet", "kgo-kafka-group-operator")
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"] if "value" in e}


def test_the_state_topic_survives_a_broker_by_default() -> None:
    env = env_of(test_chart._render(*REQUIRED))
    assert (env["KGO_STATE_REPLICATION_FACTOR"], env["KGO_STATE_MIN_INSYNC_REPLICAS"]) == (
        "3",
        "2",
    )
    refused = test_chart._helm(
        "template", "kgo", str(test_chart.CHART), *REQUIRED,
        "--set", "stateTopic.replicationFactor=1",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert (
        "stateTopic.minInsyncReplicas must not exceed stateTopic.replicationFactor"
        in refused.stderr
    )


def test_compaction_without_storage_is_refused_not_silently_never_run() -> None:
    assert env_of(test_chart._render(*REQUIRED))["KGO_COMPACTION_SCHEDULE"] == ""  # off
    refused = test_chart._helm(
        "template", "kgo", str(test_chart.CHART), *REQUIRED,
        "--set", "compaction.enabled=true",
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "compaction.enabled needs compaction.storageUri" in refused.stderr
    env = env_of(
        test_chart._render(
            *REQUIRED,
            "--set", "compaction.enabled=true",
            "--set", "compaction.storageUri=pvc://checkpoints/kgo",
        )
    )  # fmt: skip
    assert (env["KGO_COMPACTION_SCHEDULE"], env["KGO_COMPACTION_STORAGE_URI"]) == (
        "0 3 * * *",
        "pvc://checkpoints/kgo",
    )


def spark_objects(docs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted(
        (doc["kind"], doc["metadata"]["namespace"], doc["metadata"]["name"])
        for doc in docs
        if doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "spark"
    )


def test_the_spark_drivers_service_account_is_created_where_jobs_run() -> None:
    docs = test_chart._render(
        *REQUIRED,
        "--set", "watchNamespaces={shop}",
        "--set", "spark.rbac.jobNamespaces={billing,shop}",
    )  # fmt: skip
    namespaces = ("billing", "kgo-system", "shop")  # the release's for compaction
    assert spark_objects(docs) == sorted(
        (kind, namespace, name)
        for namespace in namespaces
        for kind, name in (
            ("ServiceAccount", "spark"),
            ("Role", "kgo-kafka-group-operator-spark"),
            ("RoleBinding", "kgo-kafka-group-operator-spark"),
        )
    )
    for doc in docs:
        if doc["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            kubernetes_validate.validate(doc, test_chart.K8S_VERSION, strict=True)
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-spark"))
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
            "verbs": [
                "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection",
            ],
        }
    ]  # fmt: skip
    binding = next(
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-spark")
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "spark", "namespace": binding["metadata"]["namespace"]}
    ]
    # The operator tells its SparkApplications that name.
    assert env_of(docs)["KGO_SPARK_SERVICE_ACCOUNT"] == "spark"
    # Local Spark starts no driver pod; and it can be left to the spark-operator's chart.
    assert spark_objects(test_chart._render(*REQUIRED, "--set", "spark.mode=local")) == []
    assert spark_objects(test_chart._render(*REQUIRED, "--set", "spark.rbac.create=false")) == []


def notes(tmp_path: Path, *values: str) -> str:
    """NOTES.txt as helm prints it after an install. ``helm template`` leaves it out, so it is
    rendered from a copy of the chart where a ConfigMap holds it as a string."""
    chart = tmp_path / "chart"
    shutil.copytree(test_chart.CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "notes.under.test" -}}\n' + text + "{{- end }}\n"
    )
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "notes.under.test" . | toJson }}}\n'
    )
    rendered = test_chart._helm(
        "template", "kgo", str(chart), "--namespace", "kgo-system", *values,
        "--show-only", "templates/notes.yaml",
    ).stdout  # fmt: skip
    notes_text: str = yaml.safe_load(rendered)["data"]["notes"]
    return notes_text


def test_the_notes_hold_their_example_instead_of_a_link_to_a_branch(tmp_path: Path) -> None:
    text = notes(tmp_path, *REQUIRED)
    assert "http" not in text.replace("http://kgo-kafka-group-operator", "")
    assert "raw.githubusercontent" not in text
    # The example is applied from the notes themselves: a valid ConsumerGroup, running this
    # release's image, on this release's Kafka.
    body = text.split("kubectl apply -f - <<'EOF'\n", 1)[1].split("  EOF\n", 1)[0]
    group = yaml.safe_load("\n".join(line.removeprefix("  ") for line in body.splitlines()))
    kube_schema.validate("consumergroups", group)
    assert group["spec"]["kafka"]["bootstrapServers"] == "kafka.kafka.svc:9092"
    (container,) = group["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/kafka-group-operator/kafka-group-operator:0.1.0"
    assert "Compaction: off (compaction.enabled" in text
    assert "(replication factor 3, min.insync.replicas 2)" in text


@pytest.mark.parametrize(("version", "accepted"), [("1.28.9", False), ("1.29.0", True)])
def test_the_chart_needs_native_sidecars(version: str, accepted: bool) -> None:
    # The gateway sidecar of clientProtocol: kafka groups is an init container with
    # restartPolicy: Always, which Kubernetes runs as a sidecar from 1.29 on.
    done = test_chart._helm(
        "template", "kgo", str(test_chart.CHART), *REQUIRED, "--kube-version", version,
        check=False,
    )  # fmt: skip
    assert (done.returncode == 0) is accepted, done.stderr
    if not accepted:
        assert "incompatible with Kubernetes" in done.stderr


@pytest.mark.parametrize(
    ("values", "delay_ms", "policy"),
    [
        ((), 3_000, "bidirectional"),
        (("groups.initialRebalanceDelayMs=0", "groups.consumerMigrationPolicy=downgrade"), 0,
         "downgrade"),
    ],
)  # fmt: skip
def test_kafkas_group_settings_reach_the_operator(
    values: tuple[str, ...], delay_ms: int, policy: str
) -> None:
    """What the chart renders is what the operator reads: Kafka's defaults unless set."""
    sets = [arg for value in values for arg in ("--set", value)]
    env = env_of(test_chart._render(*REQUIRED, *sets))
    coordinator = config.OperatorConfig.from_env(
        {
            "KGO_BOOTSTRAP_SERVERS": "k:1",
            **{k: v for k, v in env.items() if k.startswith("KGO_GROUP_")},
        }
    ).coordinator
    assert coordinator.initial_rebalance_delay_ms == delay_ms
    assert coordinator.migration_policy.value == policy


@pytest.mark.parametrize(
    "value", ["groups.consumerMigrationPolicy=sideways", "groups.initialRebalanceDelayMs=-1"]
)
def test_kafkas_group_settings_out_of_range_fail_the_install(value: str) -> None:
    refused = test_chart._helm(
        "template", "kgo", str(test_chart.CHART), *REQUIRED, "--set", value, check=False
    )
    assert refused.returncode != 0
    assert value.split("=")[0].split(".")[1] in refused.stderr
