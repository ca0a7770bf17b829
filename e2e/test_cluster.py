"""The operator in a real cluster: helm install, the example ConsumerGroup reconciled by the
chart's operator (one of its replicas), scale, a pod restart (temporary leave), a scale-down
(permanent leave) and deletion; what the API server refuses (a pod template, a name) reported; the
operator's identity granted every verb its code uses.

Each test's timeout (``budget``) exceeds the sum of the bounded waits it may meet, the
chart's ``helm --wait`` included, so a slow cluster fails with the command's own message.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from tests.support import rbac

from e2e.conftest import OPERATOR, OPERATOR_SELECTOR, ROOT, WAIT_S, attempt, budget, run

EXAMPLE = ROOT / "examples" / "consumergroup.yaml"
TOPIC_WAIT_S = 30


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


def _topic() -> str:
    """A fresh 4-partition topic on the test's Kafka."""
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": os.environ["KGO_E2E_BOOTSTRAP"]})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(TOPIC_WAIT_S)
    return topic


def _status(namespace: str) -> dict[str, Any]:
    out = run("kubectl", "get", "cg/orders", "-n", namespace, "-o", "json")
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def _wait_ready(namespace: str) -> None:
    run(
        "kubectl", "wait", "cg/orders", "-n", namespace,
        "--for=condition=Ready", f"--timeout={WAIT_S}s",
    )  # fmt: skip


def _wait_for(predicate: Any, within: float = WAIT_S) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(2)


def _assert_the_charts_operator_reconciles(namespace: str) -> None:
    """The chart's operator, and nothing else, reconciles the group: one of its replicas
    (kopf's peering pauses the handlers of the others)."""
    run(
        "kubectl", "wait", "pod", "-n", namespace, "-l", OPERATOR_SELECTOR,
        "--for=condition=Ready", f"--timeout={WAIT_S}s",
    )  # fmt: skip
    pods = json.loads(
        run("kubectl", "get", "pods", "-n", namespace, "-l", OPERATOR_SELECTOR, "-o", "json")
    )["items"]
    assert len(pods) == 3, [pod["metadata"]["name"] for pod in pods]
    # Handler lines name the group ([namespace/name], kopf's per-object prefix).
    logs = {
        pod["metadata"]["name"]: run("kubectl", "logs", pod["metadata"]["name"], "-n", namespace)
        for pod in pods
    }
    handling = [name for name, text in logs.items() if f"[{namespace}/orders]" in text]
    assert len(handling) == 1, {name: text[-2000:] for name, text in logs.items()}
    # The consumers were configured by it: they reach the member API on the chart's Service.
    stateful_set = json.loads(run("kubectl", "get", "sts/orders", "-n", namespace, "-o", "json"))
    (container,) = stateful_set["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KGO_COORDINATOR_URL"] == f"http://{OPERATOR}.{namespace}.svc:8080"


@budget(waits=8, polls_s=TOPIC_WAIT_S + 3 * WAIT_S + 60 + 120)
def test_consumer_group_lifecycle(namespace: str, operator: str) -> None:
    topic = _topic()
    run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(_group(namespace, topic)))
    _wait_ready(namespace)
    _assert_the_charts_operator_reconciles(namespace)
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
    run(
        "kubectl", "delete", "pod", "orders-1", "-n", namespace,
        "--wait=true", f"--timeout={WAIT_S}s",
    )  # fmt: skip
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

    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")
    _wait_for(
        lambda: (
            "orders" not in run("kubectl", "get", "statefulsets", "-n", namespace, "-o", "name")
        ),
        120,
    )


@budget(waits=2)
def test_invalid_spec_is_reported(namespace: str, operator: str) -> None:
    group = _group(namespace, "no-such-topic-" + uuid.uuid4().hex[:6])
    group["metadata"]["name"] = "broken"
    run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(group))
    run(
        "kubectl", "wait", "cg/broken", "-n", namespace,
        "--for=jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}=UnknownTopic",
        f"--timeout={WAIT_S}s",
    )  # fmt: skip
    run("kubectl", "delete", "cg/broken", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")


@budget(waits=2, polls_s=TOPIC_WAIT_S)
def test_a_template_the_api_server_refuses_is_reported(namespace: str, operator: str) -> None:
    """The StatefulSet of a pod template the API server refuses (422) is InvalidTemplate."""
    group = _group(namespace, _topic())  # the topic exists: the StatefulSet is what fails
    group["metadata"]["name"] = "refused"
    group["spec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(group))
    run(
        "kubectl", "wait", "cg/refused", "-n", namespace,
        "--for=jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}=InvalidTemplate",
        f"--timeout={WAIT_S}s",
    )  # fmt: skip
    run("kubectl", "delete", "cg/refused", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")


@budget(waits=0, polls_s=120)
def test_names_the_statefulset_cannot_carry_are_refused(namespace: str, operator: str) -> None:
    for name in ("orders.v2", "o" * 53):
        group = _group(namespace, "orders")
        group["metadata"]["name"] = name
        refused = attempt(
            "kubectl", "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(group)
        )
        assert refused.returncode != 0, name
        assert "metadata.name must be" in refused.stderr, refused.stderr


@budget(waits=0, polls_s=120)
def test_examples_pass_server_side_validation(namespace: str, operator: str) -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for document in documents:
            document["metadata"]["namespace"] = namespace
        run(
            "kubectl", "apply", "--dry-run=server", "-f", "-",
            stdin=yaml.safe_dump_all(documents),
        )  # fmt: skip


@budget(waits=0, polls_s=300)
def test_the_operator_identity_may_do_what_its_code_does(namespace: str, operator: str) -> None:
    """The cluster's authorizer, asked as the chart's ServiceAccount, grants every verb the
    code uses, ``update`` on the finalizers that OwnerReferencesPermissionEnforcement checks
    (on by default in OpenShift) included."""
    identity = f"system:serviceaccount:{namespace}:{OPERATOR}"
    refused = []
    for group, resource, verb in sorted(rbac.used()):
        plural, _, subresource = resource.partition("/")
        target = f"{plural}.{group}" if group else plural
        command = ["kubectl", "auth", "can-i", verb, target, "-n", namespace, f"--as={identity}"]
        if subresource:
            command += [f"--subresource={subresource}"]
        answer = attempt(*command).stdout.strip()
        if answer != "yes":
            refused.append((group, resource, verb, answer))
    assert refused == []
