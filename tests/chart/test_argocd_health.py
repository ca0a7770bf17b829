"""The Argo CD health checks the chart's README documents, run by a Lua interpreter on
ConsumerGroup and OffsetSnapshot objects as Argo CD passes them (``obj``, the resource as
JSON; the script returns ``{status, message}``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from lupa import LuaRuntime

from tests.support import kube_schema

README = kube_schema.ROOT / "charts" / "kafka-group-operator" / "README.md"


def _checks() -> dict[str, str]:
    (block,) = re.findall(
        r"```yaml\n(resource\.customizations\.health\..*?)```", README.read_text(), re.S
    )
    checks: dict[str, str] = yaml.safe_load(block)
    return checks


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    script = _checks()[f"resource.customizations.health.kafkagroups.io_{kind}"]
    lua = LuaRuntime()
    check = lua.eval(f"function(obj)\n{script}\nend")
    result = check(lua.table_from(obj, recursive=True))
    return str(result["status"]), str(result["message"])


def _group(*conditions: tuple[str, str, str], **status: Any) -> dict[str, Any]:
    listed = [
        {"type": type_, "status": value, "reason": reason, "message": f"{reason} message"}
        for type_, value, reason in conditions
    ]
    return {
        "metadata": {"generation": 2},
        "status": {"observedGeneration": 2, "conditions": listed, **status},
    }


READY = ("Ready", "True", "GroupStable")


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"metadata": {"generation": 1}}, ("Progressing", "Waiting for the operator")),
        (_group(READY), ("Healthy", "GroupStable message")),
        (
            _group(("Ready", "False", "Rebalancing")),
            ("Progressing", "Rebalancing: Rebalancing message"),
        ),
        (
            _group(("Ready", "False", "UnknownTopic")),
            ("Degraded", "UnknownTopic: UnknownTopic message"),
        ),
        (
            {**_group(READY), "metadata": {"generation": 3}},
            ("Progressing", "The operator has not seen the latest spec"),
        ),
        (_group(READY, state="Paused"), ("Suspended", "spec.paused is set")),
        # Lag health, whichever order the conditions come in.
        (_group(READY, ("LagHealthy", "True", "OK")), ("Healthy", "GroupStable message")),
        (
            _group(("LagHealthy", "False", "ERROR"), READY),
            ("Degraded", "Lag ERROR: ERROR message"),
        ),
        (
            _group(READY, ("LagHealthy", "False", "WARNING")),
            ("Healthy", "Lag WARNING: WARNING message"),
        ),
        # A group that is not ready says why, not how its lag is.
        (
            _group(("Ready", "False", "MembersNotReady"), ("LagHealthy", "False", "ERROR")),
            ("Progressing", "MembersNotReady: MembersNotReady message"),
        ),
    ],
)
def test_consumer_group_health(obj: dict[str, Any], expected: tuple[str, str]) -> None:
    assert health("ConsumerGroup", obj) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({}, ("Progressing", "Waiting for the snapshot job")),
        ({"phase": "Running"}, ("Progressing", "Snapshot Running")),
        ({"phase": "Succeeded", "location": "s3://b/x"}, ("Healthy", "Snapshot at s3://b/x")),
        ({"phase": "Failed", "message": "no such group"}, ("Degraded", "no such group")),
    ],
)
def test_offset_snapshot_health(status: dict[str, Any], expected: tuple[str, str]) -> None:
    assert health("OffsetSnapshot", {"status": status} if status else {}) == expected
