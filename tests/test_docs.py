"""The operations docs and examples say what the product does: every condition reason the
operator sets is in the troubleshooting page, the PrometheusRule example queries series the
operator exports (with label values it sets), the KEDA example scales a ConsumerGroup
through its scale subresource, and the adoption page's resource is one the CRD accepts."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml

from kafka_group_operator.coordinator import lag_health
from kafka_group_operator.runtime import coordinator_runtime, metrics, mirror
from tests.support import kube_schema

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = ROOT / "operator" / "kafka_group_operator"
# Calls that set a condition, and the position of their reason argument.
REASON_ARGUMENT = {"Condition": 2, "ready": 1, "reset_condition": 2, "Refusal": 1}


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def condition_reasons() -> set[str]:
    """Every reason the operator's code writes into a condition: literals at the reason of
    the calls that set one, ``reason`` attributes of its error classes, the mirror's reasons
    and the group lag verdicts."""
    found: set[str] = set()
    for path in OPERATOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in REASON_ARGUMENT:
                    index = REASON_ARGUMENT[name]
                    if len(node.args) > index:
                        found |= _strings(node.args[index])
                    found |= {
                        s for k in node.keywords if k.arg == "reason" for s in _strings(k.value)
                    }
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if (
                        isinstance(statement, ast.Assign)
                        and any(getattr(t, "id", "") == "reason" for t in statement.targets)
                        and isinstance(statement.value, ast.Constant)
                    ):
                        found.add(statement.value.value)
    found |= {reason.value for reason in mirror.MirrorReason}
    # A group's verdict (STOP, STALL and REWIND are only ever a partition's).
    found |= {v.name for v in lag_health.Verdict} - {"STOP", "STALL", "REWIND"}
    return found


def test_every_condition_reason_is_in_the_troubleshooting_page() -> None:
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z]+)` \|", page, re.MULTILINE))
    reasons = condition_reasons()
    assert len(reasons) > 30  # the collector found the operator's reasons
    assert sorted(reasons - documented) == []


def exported_series() -> set[str]:
    """The series names the operator's /metrics exposes (counters with ``_total``,
    histograms with ``_bucket``, ``_sum`` and ``_count``)."""
    source = Path(metrics.__file__).read_text()
    names: set[str] = set()
    for kind, name in re.findall(
        r"\b(EventCounter|LabelledCounter|CounterMetricFamily|EventHistogram|"
        r"HistogramMetricFamily|GaugeMetricFamily|gauge)\(\s*\"([a-z_]+)\"",
        source,
    ):
        if "Counter" in kind:
            names.add(f"{name}_total")
        elif "Histogram" in kind:
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def test_the_prometheus_rule_queries_what_the_operator_exports() -> None:
    rule = yaml.safe_load((ROOT / "examples" / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    series = exported_series()
    assert {"kgo_failed_requests_total", "kafka_consumergroup_group_max_lag"} <= series
    states = {state.value for state in coordinator_runtime.PartitionState}
    reasons = {reason.value for reason in mirror.MirrorReason}
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert len(rules) >= 5
    for entry in rules:
        assert set(entry) >= {"alert", "expr", "labels", "annotations"}, entry
        assert entry["labels"]["severity"] in ("warning", "critical")
        used = set(re.findall(r"\b((?:kgo|kafka_consumergroup)_[a-z_]+)\b", entry["expr"]))
        assert used, entry["alert"]
        assert used <= series, (entry["alert"], used - series)
        for value in re.findall(r'state="([a-z-]+)"', entry["expr"]):
            assert value in states, entry["alert"]
        for value in re.findall(r'reason="([A-Za-z]+)"', entry["expr"]):
            assert value in reasons, entry["alert"]


def test_the_keda_example_scales_a_consumer_group_on_its_lag() -> None:
    scaled = yaml.safe_load((ROOT / "examples" / "keda-scaledobject.yaml").read_text())
    group = yaml.safe_load((ROOT / "examples" / "consumergroup.yaml").read_text())
    crd = yaml.safe_load((ROOT / "crds" / "consumergroups.kafkagroups.io.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    target = scaled["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": f"{crd['spec']['group']}/{version['name']}",
        "kind": crd["spec"]["names"]["kind"],
        "name": group["metadata"]["name"],
    }
    assert scaled["metadata"]["namespace"] == group["metadata"]["namespace"]
    # KEDA drives it through the scale subresource, as the HPA would.
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    (kafka, *_) = scaled["spec"]["triggers"]
    assert kafka["type"] == "kafka"
    assert kafka["metadata"]["consumerGroup"] == group["spec"]["groupId"]
    assert kafka["metadata"]["topic"] in group["spec"]["topics"]


def yaml_blocks(page: Path) -> list[Any]:
    return [
        yaml.safe_load(block)
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.DOTALL)
    ]


def test_the_adoption_pages_resource_is_valid_and_adopts() -> None:
    (group,) = yaml_blocks(ROOT / "docs" / "adoption.md")
    kube_schema.validate("consumergroups", group)
    assert group["spec"]["offsets"]["adopt"] == "IfEmpty"


def test_the_uninstall_page_names_what_the_operator_creates() -> None:
    page = (ROOT / "docs" / "uninstall.md").read_text()
    crds = sorted(p.name.removesuffix(".yaml") for p in (ROOT / "crds").glob("*.yaml"))
    for name in crds:
        assert name in page, name
    assert "kafkagroups.io/finalizer" in page
    assert "<name>-group-token" in page
