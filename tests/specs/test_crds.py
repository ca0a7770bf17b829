"""The CRDs in crds/: their shape, their schemas against examples/ and bad resources, and the
chart's generated copy."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from kafka_group_operator.commands import chart
from kafka_group_operator.coordinator import lag_health, messages
from kafka_group_operator.manifests import group_status
from kafka_group_operator.specs import consumer_group as specs
from tests.support import kube_schema

# Kubernetes evaluates CRD patterns with Go's RE2: no lookaround, no backreferences.
_NOT_RE2 = re.compile(r"\(\?[=!<]|\\[1-9]")


def _walk(schema: Any) -> Iterator[dict[str, Any]]:
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from _walk(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _walk(value)


def test_consumer_group_crd_names_subresources_and_columns() -> None:
    crd = kube_schema.load_crd("consumergroups")
    assert crd["spec"]["group"] == "kafkagroups.io"
    assert crd["spec"]["names"]["shortNames"] == ["cg"]
    # Not "kafka": Strimzi's Kafka kind has that singular name, and kubectl expands
    # categories first, so `kubectl get kafka` would list our kinds instead of its clusters.
    assert crd["spec"]["names"]["categories"] == ["kafkagroups"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.labelSelector",
        },
    }
    default = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default == ["Ready", "Replicas", "State", "Epoch", "Lag", "Health", "Age"]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")]
    assert wide == ["Members", "Group"]


# kubectl's JSONPath, as far as the printer columns use it: fields, and one filter by equality.
_FILTER = re.compile(r'\[\?\(@\.(\w+)=="([^"]*)"\)\]')


def _column_value(resource: dict[str, Any], path: str) -> Any:
    value: Any = resource
    for step in re.findall(r'\.\w+|\[\?\(@\.\w+=="[^"]*"\)\]', path):
        filtered = _FILTER.fullmatch(step)
        if filtered is not None:
            key, wanted = filtered.groups()
            value = next((item for item in value or () if item.get(key) == wanted), None)
        else:
            value = (value or {}).get(step[1:])
    return value


@pytest.mark.parametrize("named", [True, False], ids=["spec.groupId", "defaulted"])
def test_consumer_group_columns_read_a_built_status(named: bool) -> None:
    """Every column reads a built status; GROUP shows the id in effect, also when
    ``spec.groupId`` is left to its default (``<namespace>.<name>``)."""
    crd = kube_schema.load_crd("consumergroups")
    (version,) = crd["spec"]["versions"]
    example = _example_group()
    assert example["spec"]["groupId"] == "shop.orders"
    if not named:
        del example["spec"]["groupId"]
    group = specs.parse_consumer_group("orders", "shop", example["spec"])
    description = messages.GroupDescription(
        group_id=group.group_id,
        state="stable",
        group_epoch=7,
        assignment_epoch=7,
        assignor="uniform",
        members=(),
    )
    verdict = lag_health.GroupVerdict(
        lag_health.Verdict.ERROR,
        (lag_health.PartitionVerdict("orders", 0, lag_health.Verdict.STALL, 12, 3, 0),),
    )
    status = group_status.build_group_status(
        group, 1, description, {("orders", 0): 12}, None, "2026-01-01T00:00:00Z", verdict=verdict
    )
    resource = {
        **example,
        "metadata": {"name": "orders", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": status,
    }
    row = {
        column["name"]: _column_value(resource, column["jsonPath"])
        for column in version["additionalPrinterColumns"]
    }
    assert row == {
        "Ready": "False",
        "Replicas": resource["spec"]["replicas"],
        "State": "Stable",
        "Epoch": 7,
        "Lag": 12,
        "Health": "ERROR",
        "Age": "2026-01-01T00:00:00Z",
        "Members": 0,
        "Group": "shop.orders",
    }


def test_offset_snapshot_crd_names_and_status() -> None:
    crd = kube_schema.load_crd("offsetsnapshots")
    assert crd["spec"]["names"]["shortNames"] == ["osnap"]
    assert crd["spec"]["names"]["categories"] == ["kafkagroups"]
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "Running", "Succeeded", "Failed"]
    for field in ("sparkApplication", "location", "records", "partitions", "takenAt", "checksum"):
        assert field in status


@pytest.mark.parametrize("plural", ["consumergroups", "offsetsnapshots"])
def test_patterns_are_re2_compatible(plural: str) -> None:
    patterns = [
        node["pattern"] for node in _walk(kube_schema.schema_of(plural)) if "pattern" in node
    ]
    assert patterns, "the schema should constrain names with patterns"
    assert [p for p in patterns if _NOT_RE2.search(p)] == []


@pytest.mark.parametrize(
    ("plural", "kind"),
    [("consumergroups", "ConsumerGroup"), ("offsetsnapshots", "OffsetSnapshot")],
)
def test_examples_are_valid(plural: str, kind: str) -> None:
    resources = kube_schema.examples(kind)
    assert resources, f"examples/ should hold a {kind}"
    for resource in resources:
        kube_schema.validate(plural, resource)
        assert list(kube_schema.pruned_paths(kube_schema.schema_of(plural), resource)) == []
        assert kube_schema.cel_violations(plural, resource) == []


def _example_group() -> dict[str, Any]:
    return copy.deepcopy(kube_schema.examples("ConsumerGroup")[0])


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "assignor"), "sticky-ish"),
        (("spec", "replicas"), -1),
        (("spec", "topics"), []),
        (("spec", "topics"), ["orders", "orders"]),
        (("spec", "topics"), ["has space"]),
        (("spec", "groupId"), "x" * 250),
        (("spec", "kafka", "bootstrapServers"), "no-port"),
        (("spec", "sessionTimeoutSeconds"), 1),
        (("spec", "deletionPolicy"), "Orphan"),
        (("spec", "autoOffsetReset"), "smallest"),
        (("spec", "offsetReset"), {"to": "yesterday"}),
        (("spec", "offsetReset"), {"to": "duration", "duration": "1h"}),
        (("spec", "snapshots"), {"schedule": "daily", "storage": {"uri": "file:///x"}}),
        (("spec", "snapshots"), {"schedule": "0 2 * * *", "storage": {"uri": "ftp://x"}}),
        (("spec", "template"), {"spec": {"containers": []}}),
        (("spec", "offsets"), {"adopt": "Always"}),
        (("spec", "offsets"), {"mirrorIntervalSeconds": 0}),
        (("spec", "offsets"), {"mirrorToKafka": "yes"}),
        (("spec", "assignment"), "Leader"),
    ],
)
def test_invalid_consumer_groups_are_rejected(path: tuple[str, ...], value: Any) -> None:
    resource = _example_group()
    target = resource
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        kube_schema.validate("consumergroups", resource)


def test_client_assignment_needs_the_kafka_protocol_and_no_pause() -> None:
    resource = _example_group()
    resource["spec"]["assignment"] = "Client"
    resource["spec"]["clientProtocol"] = "library"
    kube_schema.validate("consumergroups", resource)
    assert kube_schema.cel_violations("consumergroups", resource) == [
        "assignment Client needs clientProtocol kafka: only Kafka clients assign as a group's "
        "leader"
    ]
    resource["spec"]["clientProtocol"] = "kafka"
    assert kube_schema.cel_violations("consumergroups", resource) == []
    resource["spec"]["paused"] = True
    assert kube_schema.cel_violations("consumergroups", resource) == [
        "paused needs assignment Server: with Client the group's leader assigns"
    ]
    # Server (explicit or by default) takes both.
    resource["spec"]["assignment"] = "Server"
    resource["spec"]["clientProtocol"] = "library"
    assert kube_schema.cel_violations("consumergroups", resource) == []


@pytest.mark.parametrize("missing", ["topics", "template", "kafka"])
def test_required_consumer_group_fields(missing: str) -> None:
    resource = _example_group()
    del resource["spec"][missing]
    with pytest.raises(jsonschema.ValidationError):
        kube_schema.validate("consumergroups", resource)


def test_invalid_offset_snapshot_is_rejected() -> None:
    snapshot = copy.deepcopy(kube_schema.examples("OffsetSnapshot")[0])
    snapshot["spec"]["spark"]["mode"] = "yarn"
    with pytest.raises(jsonschema.ValidationError):
        kube_schema.validate("offsetsnapshots", snapshot)
    del snapshot["spec"]["consumerGroupRef"]
    snapshot["spec"]["spark"]["mode"] = "local"
    with pytest.raises(jsonschema.ValidationError):
        kube_schema.validate("offsetsnapshots", snapshot)


def test_chart_crds_are_generated_from_crds() -> None:
    assert chart.differences(kube_schema.ROOT) == []


def test_a_stale_chart_crd_is_detected(tmp_path: Any) -> None:
    (tmp_path / "crds").mkdir()
    for path in kube_schema.CRDS.glob("*.yaml"):
        (tmp_path / "crds" / path.name).write_text(path.read_text())
    assert chart.differences(tmp_path) == sorted(p.name for p in kube_schema.CRDS.glob("*.yaml"))
    args = type("Args", (), {"check": False, "root": tmp_path})()
    assert chart.run(args) == 0  # type: ignore[arg-type]
    assert chart.differences(tmp_path) == []
    stale = tmp_path / chart.CHART_CRDS / "consumergroups.kafkagroups.io.yaml"
    stale.write_text(stale.read_text().replace("minimum: 0", "minimum: 1"))
    assert chart.differences(tmp_path) == ["consumergroups.kafkagroups.io.yaml"]


def _unbounded(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    if schema.get("type") == "string" and "maxLength" not in schema and "enum" not in schema:
        yield path
    if schema.get("type") == "array" and "maxItems" not in schema:
        yield path
    if isinstance(schema.get("additionalProperties"), dict) and "maxProperties" not in schema:
        yield path
    for key, child in (schema.get("properties") or {}).items():
        yield from _unbounded(child, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _unbounded(schema[key], f"{path}[]")


# Whether a field is present costs the same whatever it holds.
_PRESENCE_ONLY = re.compile(r"has\(self\.\w+\) == has\(oldSelf\.\w+\)")


@pytest.mark.parametrize("plural", ["consumergroups", "offsetsnapshots"])
def test_values_compared_by_cel_rules_are_bounded(plural: str) -> None:
    """The API server rejects a CRD whose rules may cost too much: what they read is bounded."""
    for node in _walk(kube_schema.schema_of(plural)):
        rules = " ".join(
            rule["rule"]
            for rule in node.get("x-kubernetes-validations", ())
            if not _PRESENCE_ONLY.fullmatch(rule["rule"])
        )
        if "oldSelf" in rules or "endsWith" in rules:
            assert list(_unbounded(node)) == [], rules


def test_group_id_can_be_neither_changed_nor_added_nor_removed() -> None:
    with_id = _example_group()
    assert with_id["spec"]["groupId"] == "shop.orders"
    without_id = copy.deepcopy(with_id)
    del without_id["spec"]["groupId"]
    other_id = copy.deepcopy(with_id)
    other_id["spec"]["groupId"] = "shop.other"
    presence = "groupId is immutable; it can be neither added nor removed"

    def violations(new: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        return kube_schema.cel_violations("consumergroups", new, old)

    # Created with or without one; updated without touching it.
    assert violations(with_id, None) == []
    assert violations(without_id, None) == []
    assert violations(with_id, with_id) == []
    assert violations(without_id, without_id) == []
    # Changed, added or removed.
    assert violations(other_id, with_id) == ["groupId is immutable"]
    assert violations(with_id, without_id) == [presence]
    assert violations(without_id, with_id) == [presence]
