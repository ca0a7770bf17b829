"""Typed views of an OffsetSnapshot, ``spec.offsetReset`` and ``spec.snapshots``: their
defaults match the CRDs' (every default the CRDs declare in those subtrees, and no other),
and what they refuse."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_group_operator.specs import errors
from kafka_group_operator.specs import offset_jobs as views

ROOT = Path(__file__).resolve().parents[2]


def crd_spec(plural: str) -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / f"{plural}.kafkagroups.io.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def defaults(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``default`` in a schema, by its dotted path."""
    if "default" in schema:
        yield path, schema["default"]
    for name, child in (schema.get("properties") or {}).items():
        yield from defaults(child, f"{path}.{name}" if path else name)
    if "items" in schema:
        yield from defaults(schema["items"], f"{path}[]")


SNAPSHOT = views.parse_offset_snapshot(
    "s",
    "shop",
    {"consumerGroupRef": {"name": "g"}, "storage": {"uri": "file:///x"}, "spark": {}},
)
RESET = views.parse_offset_reset({"to": "earliest"})
SCHEDULE = views.parse_snapshot_schedule_spec({"schedule": "@daily", "storage": {"uri": "s3://b"}})
assert SNAPSHOT.spark is not None

# CRD path -> the typed view's value for a spec that leaves the field out.
VIEWS: dict[tuple[str, str], Callable[[], Any]] = {
    ("offsetsnapshots", "storage.format"): lambda: SNAPSHOT.storage.format,
    ("consumergroups", "offsetReset.dryRun"): lambda: RESET.dry_run,
    ("consumergroups", "snapshots.historyLimit"): lambda: SCHEDULE.history_limit,
    ("consumergroups", "snapshots.storage.format"): lambda: SCHEDULE.storage.format,
}


def crd_defaults() -> dict[tuple[str, str], Any]:
    found = dict(
        (("offsetsnapshots", path), value) for path, value in defaults(crd_spec("offsetsnapshots"))
    )
    group = crd_spec("consumergroups")["properties"]
    for field in ("offsetReset", "snapshots"):
        for path, value in defaults(group[field], field):
            found["consumergroups", path] = value
    return found


def test_every_crd_default_has_a_view_and_they_agree() -> None:
    found = crd_defaults()
    assert set(found) == set(VIEWS)
    for key, value in found.items():
        assert VIEWS[key]() == value, key


def test_an_unset_spark_mode_is_the_operators_choice() -> None:
    # No CRD default: the API server must not fill in a mode that overrides the chart's.
    mode = crd_spec("offsetsnapshots")["properties"]["spark"]["properties"]["mode"]
    assert "default" not in mode
    assert SNAPSHOT.spark is not None
    assert SNAPSHOT.spark.mode is None


def test_explicit_fields_are_kept() -> None:
    snapshot = views.parse_offset_snapshot(
        "nightly",
        "shop",
        {
            "consumerGroupRef": {"name": "payments"},
            "storage": {"uri": "pvc://claim/snaps"},
            "asOf": "2026-11-22T00:00:00Z",
            "spark": {"mode": "local", "image": "img:2", "sparkConf": {"spark.a": "b"}},
        },
    )
    assert snapshot.group_name == "payments"
    assert snapshot.storage == views.Storage("pvc://claim/snaps")
    assert snapshot.as_of == "2026-11-22T00:00:00Z"
    assert snapshot.spark == views.SparkOverrides(
        mode="local", image="img:2", spark_conf={"spark.a": "b"}
    )
    # Without spec.spark the chart's settings apply, spark.mode included.
    plain = views.parse_offset_snapshot(
        "n", "shop", {"consumerGroupRef": {"name": "p"}, "storage": {"uri": "s3a://b/p"}}
    )
    assert plain.spark is None
    reset = views.parse_offset_reset(
        {
            "to": "shiftBy",
            "shiftBy": -5,
            "dryRun": False,
            "topics": [{"name": "orders", "partitions": [0, 2]}, {"name": "refunds"}],
        }
    )
    assert (reset.to, reset.shift_by, reset.dry_run) == ("shiftBy", -5, False)
    assert reset.topics == (views.ResetScope("orders", (0, 2)), views.ResetScope("refunds"))
    schedule = views.parse_snapshot_schedule_spec(
        {"schedule": "0 3 * * *", "historyLimit": 3, "storage": {"uri": "file:///s"}}
    )
    assert (schedule.schedule, schedule.history_limit) == ("0 3 * * *", 3)


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        (views.parse_offset_reset, {"to": "offset"}, "to=offset needs offsetReset.offset"),
        (views.parse_offset_reset, {"to": "tomorrow"}, "offsetReset.to must be one of"),
        (views.parse_offset_reset, {"to": "offset", "offset": True}, "must be an integer"),
        (views.parse_offset_reset, {"to": "latest", "dryRun": "no"}, "true or false"),
        (views.parse_offset_reset, "earliest", "offsetReset must be an object"),
        (
            views.parse_snapshot_schedule_spec,
            {"schedule": "@daily", "storage": {"uri": "ftp://x"}},
            "snapshots.storage.uri must be a file://",
        ),
        (
            views.parse_snapshot_schedule_spec,
            {"schedule": "@daily", "storage": {"uri": "s3://b"}, "historyLimit": 0},
            "between 1 and 1000",
        ),
        (
            views.parse_snapshot_schedule_spec,
            {"schedule": "99 99 99 99 99", "storage": {"uri": "s3://b"}},
            "not a valid cron schedule",
        ),
    ],
)
def test_bad_values_are_refused_with_the_field_named(
    parse: Callable[[object], object], value: object, message: str
) -> None:
    with pytest.raises(errors.InvalidSpec, match=message):
        parse(value)


def test_a_snapshot_without_a_group_is_refused() -> None:
    with pytest.raises(errors.InvalidSpec, match=r"consumerGroupRef\.name"):
        views.parse_offset_snapshot(
            "s", "shop", {"consumerGroupRef": {}, "storage": {"uri": "s3://b"}}
        )
    with pytest.raises(errors.InvalidSpec, match=r"spark\.mode must be one of"):
        views.parse_offset_snapshot(
            "s",
            "shop",
            {
                "consumerGroupRef": {"name": "g"},
                "storage": {"uri": "s3://b"},
                "spark": {"mode": "x"},
            },
        )
