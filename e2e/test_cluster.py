"""The operator in a real cluster: helm install, the example ConsumerGroup, scale, a pod
restart (temporary leave), a scale-down (permanent leave) and deletion."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from e2e.conftest import ROOT, run

EXAMPLE = ROOT / "examples" / "consumergroup.yaml"


def _group(namespace: str, topic: str) -> dict[str, Any]:
    """examples/consumergroup.yaml, pointed at the test's namespace, Kafka, topic and image."""
    group: dict[str, Any] = yaml.safe_load(Path(EXAMPLE).read_text())
    group["metadata"]["namespace"] = namespace
    group["spec"]["groupId"] = f"{namespace}.orders"
    group["spec"]["topics"] = [topic]
    group["spec"]["replicas"] = 2
    group["spec"]["kafka"]["bootstrapServers"] = os.environ["KGO_E2E_BOOTSTRAP"]
    group["spec"]["template"]["spec"]["containers"][0]["image"] = os.environ["KGO_E2E_IMAGE"]
    return group


def _status(namespace: str) -> dict[str, Any]:
    out = run("kubectl", "get", "cg/orders", "-n", namespace, "-o", "json")
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def _wait_ready(namespace: str) -> None:
    run(
        "kubectl", "wait", "cg/orders", "-n", namespace,
        "--for=condition=Ready", "--timeout=5m",
    )  # fmt: skip


def _wait_for(predicate: Any, within: float = 300) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(2)


def test_consumer_group_lifecycle(namespace: str, operator: str) -> None:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": os.environ["KGO_E2E_BOOTSTRAP"]})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)

    run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(_group(namespace, topic)))
    _wait_ready(namespace)
    status = _status(namespace)
    assert status["readyMembers"] == 2
    assert sorted(m["instanceId"] for m in status["members"]) == ["orders-0", "orders-1"]
    token_secret = run("kubectl", "get", "secret", "orders-group-token", "-n", namespace)
    assert "orders-group-token" in token_secret

    # Scale up through the scale subresource.
    run("kubectl", "scale", "cg/orders", "-n", namespace, "--replicas=3")
    _wait_for(lambda: _status(namespace).get("readyMembers") == 3)
    _wait_ready(namespace)

    # A restarted pod is a temporary leave: it comes back with the same partitions.
    before = {m["instanceId"]: m["partitions"] for m in _status(namespace)["members"]}
    run("kubectl", "delete", "pod", "orders-1", "-n", namespace, "--wait=true")
    _wait_ready(namespace)
    _wait_for(lambda: _status(namespace).get("readyMembers") == 3)
    after = {m["instanceId"]: m["partitions"] for m in _status(namespace)["members"]}
    assert after == before

    # A scale-down is a permanent leave: orders-2's partitions move at once.
    run("kubectl", "scale", "cg/orders", "-n", namespace, "--replicas=2")
    _wait_for(
        lambda: (
            sorted(m["instanceId"] for m in _status(namespace).get("members", []))
            == ["orders-0", "orders-1"]
        ),
        within=60,
    )
    _wait_ready(namespace)
    assert sum(m["partitions"] for m in _status(namespace)["members"]) == 4

    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", "--timeout=2m")
    _wait_for(
        lambda: (
            "orders" not in run("kubectl", "get", "statefulsets", "-n", namespace, "-o", "name")
        ),
        120,
    )


def test_invalid_spec_is_reported(namespace: str, operator: str) -> None:
    group = _group(namespace, "no-such-topic-" + uuid.uuid4().hex[:6])
    group["metadata"]["name"] = "broken"
    run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(group))
    run(
        "kubectl", "wait", "cg/broken", "-n", namespace,
        "--for=jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}=UnknownTopic",
        "--timeout=2m",
    )  # fmt: skip
    run("kubectl", "delete", "cg/broken", "-n", namespace, "--wait=true")


def test_examples_pass_server_side_validation(namespace: str, operator: str) -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for document in documents:
            document["metadata"]["namespace"] = namespace
        run(
            "kubectl", "apply", "--dry-run=server", "-f", "-",
            stdin=yaml.safe_dump_all(documents),
        )  # fmt: skip
