"""The chart's monitoring: the metrics port on the Service, the optional ServiceMonitor and
Grafana dashboard ConfigMap, and a dashboard that only queries series the operator exports."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest

from kafka_group_operator.runtime import metrics
from tests.chart.test_chart import CHART, K8S_VERSION, REQUIRED, _find, _helm, _render

ENABLED = [
    *REQUIRED,
    *("--set", "metrics.serviceMonitor.enabled=true"),
    *("--set", "metrics.dashboard.enabled=true"),
    *("--set", "metrics.serviceMonitor.labels.release=prometheus"),
    *("--set", "metrics.clusterName=east"),
]


def _exported_names() -> set[str]:
    """Every sample name the operator's /metrics can carry, from its own definitions."""
    families: list[Any] = [
        *metrics.RuntimeMetrics().registry.collect(),
        *metrics.LagCollector._families(),
        *metrics.CoordinatorCollector._families(),
    ]
    names: set[str] = set()
    for family in families:
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        else:
            names.add(family.name)
    return names


def test_the_metrics_port_is_on_the_pod_and_the_service_and_monitoring_is_off_by_default() -> None:
    docs = _render(*REQUIRED)
    operator = _find(docs, "StatefulSet", "kgo-kafka-group-operator")
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KGO_METRICS_PORT"] == "9090"
    assert env["KGO_CLUSTER_NAME"] == "default"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    service = _find(docs, "Service", "kgo-kafka-group-operator")
    assert {
        "name": "metrics",
        "port": 9090,
        "targetPort": "metrics",
        "protocol": "TCP",
    } in service["spec"]["ports"]
    kinds = {doc["kind"] for doc in docs}
    assert "ServiceMonitor" not in kinds
    assert "ConfigMap" not in kinds


def test_the_service_monitor_scrapes_the_services_metrics_port() -> None:
    docs = _render(*ENABLED)
    service = _find(docs, "Service", "kgo-kafka-group-operator")
    monitor = _find(docs, "ServiceMonitor", "kgo-kafka-group-operator")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "kgo-system"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kgo-system"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "30s"}
    assert "metrics" in {port["name"] for port in service["spec"]["ports"]}
    operator = _find(docs, "StatefulSet", "kgo-kafka-group-operator")
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KGO_CLUSTER_NAME"] == "east"


def test_the_dashboard_config_map_carries_the_grafana_label_and_known_series_only() -> None:
    docs = _render(*ENABLED)
    config_map = _find(docs, "ConfigMap", "kgo-kafka-group-operator-dashboard")
    kubernetes_validate.validate(config_map, K8S_VERSION, strict=True)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["kafka-group-operator.json"])
    assert dashboard["uid"] == "kafka-group-operator"
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
    ] + [
        variable["query"]
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    used = {
        name
        for expression in expressions
        for name in re.findall(r"\b(?:kgo|kafka_consumergroup)_[a-z_]+", expression)
    }
    exported = _exported_names()
    assert used - exported == set()
    # The lag series every kafka-lag-exporter dashboard starts from are among them.
    assert {"kafka_consumergroup_group_sum_lag", "kafka_consumergroup_group_lag"} <= used


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("metrics.port=0", "metrics.port"),
        ("metrics.nosuch=1", "nosuch"),
        ("metrics.serviceMonitor.interval=often", "metrics.serviceMonitor.interval"),
        ("metrics.dashboard.enable=true", "enable"),
    ],
)
def test_the_values_schema_refuses_bad_metrics_values(value: str, message: str) -> None:
    result = _helm("template", "kgo", str(CHART), *REQUIRED, "--set", value, check=False)
    assert result.returncode != 0
    assert message in result.stderr
