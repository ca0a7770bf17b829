"""The operator on a real control plane, installed by the chart with its defaults: a group's life
(create, scale 3→5→3, a pod deleted and back with the same partitions, deletion under Retain and
under Delete); what the API server refuses (a pod template, a name) reported; the operator's
ServiceAccount granted every verb its code uses.

Each test's timeout (``budget``) exceeds the sum of the bounded waits it may meet, so a slow
machine fails with the wait's own message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from typing import Any

import yaml
from tests.support import rbac

from e2e import groups
from e2e.conftest import (
    OPERATOR,
    OPERATOR_NAMESPACE,
    OPERATOR_SELECTOR,
    ROOT,
    WAIT_S,
    Cluster,
    attempt,
    budget,
    get,
    run,
    wait_for,
)

PARTITIONS = 6


def _assert_the_charts_operator_reconciles(namespace: str, name: str) -> None:
    """The chart's operator reconciles the group: its replicas' handlers (kopf's peering
    pauses all but one, but is not a lock: while a loaded replica's keep-alive is late, or
    at a start, another may handle the group for a moment, as the README says)."""
    pods = json.loads(
        run(
            "kubectl", "get", "pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR,
            "-o", "json",
        )
    )["items"]  # fmt: skip
    assert len(pods) == 3, [pod["metadata"]["name"] for pod in pods]
    # Handler lines name the group ([namespace/name], kopf's per-object prefix).
    logs = {
        pod["metadata"]["name"]: run(
            "kubectl", "logs", pod["metadata"]["name"], "-n", OPERATOR_NAMESPACE
        )
        for pod in pods
    }
    handling = [pod for pod, text in logs.items() if f"[{namespace}/{name}]" in text]
    assert handling, {pod: text[-2000:] for pod, text in logs.items()}
    # The consumers were configured by it: they reach the member API on the chart's Service.
    stateful_set = get("sts", name, namespace)
    (container,) = stateful_set["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["KGO_COORDINATOR_URL"] == groups.MEMBER_API


def _all_partitions(topic: str) -> list[str]:
    return sorted(f"{topic}:{p}" for p in range(PARTITIONS))


def _spread(view: dict[str, Any], members: list[str], topic: str) -> bool:
    """Every partition assigned, to exactly ``members``, each holding some."""
    assignment = view["assignment"]
    owned = sorted(p for partitions in assignment.values() for p in partitions)
    return (
        sorted(assignment) == members
        and all(assignment[m] for m in members)
        and owned == _all_partitions(topic)
    )


def _events(namespace: str, reason: str) -> list[dict[str, Any]]:
    listed = json.loads(
        run(
            "kubectl", "get", "events", "-n", namespace,
            "--field-selector", f"reason={reason}", "-o", "json",
        )
    )  # fmt: skip
    items: list[dict[str, Any]] = listed["items"]
    return items


def _delete_group(namespace: str, name: str) -> None:
    run("kubectl", "delete", f"cg/{name}", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")
    wait_for(
        lambda: attempt("kubectl", "get", "sts", name, "-n", namespace).returncode != 0,
        f"StatefulSet {name} gone",
    )


def _wait_token(namespace: str) -> None:
    wait_for(
        lambda: (
            attempt("kubectl", "get", "secret/orders-group-token", "-n", namespace).returncode == 0
        ),
        "the group's token",
    )


def _committed(cluster: Cluster, namespace: str, gid: str, total: int) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        view = groups.read_group(cluster, namespace, "orders", gid)
        return view if sum(view["offsets"].values()) >= total else None

    found: dict[str, Any] = wait_for(done, f"{total} messages committed", every=2)
    return found


@budget(waits=20)
def test_a_groups_life(cluster: Cluster, operator: str, namespace: str) -> None:
    topic = groups.create_topic(cluster.bootstrap, PARTITIONS)
    manifest = groups.group_manifest(namespace, "orders", topic, cluster.bootstrap, replicas=3)
    gid = groups.group_id(manifest)
    groups.apply(manifest)
    groups.wait_ready(namespace, "orders")
    _assert_the_charts_operator_reconciles(namespace, "orders")
    assert get("secret", "orders-group-token", namespace)["type"] == "Opaque"
    groups.produce(cluster.bootstrap, topic, 300, PARTITIONS)
    _committed(cluster, namespace, gid, 300)

    # Scale up, then down, through the scale subresource.
    for replicas in (5, 3):
        members = [f"orders-{n}" for n in range(replicas)]
        run("kubectl", "scale", "cg/orders", "-n", namespace, f"--replicas={replicas}")
        wait_for(
            lambda members=members: _spread(
                groups.read_group(cluster, namespace, "orders", gid), members, topic
            ),
            f"the partitions spread over {members}",
            every=2,
        )
        wait_for(
            lambda replicas=replicas: (
                groups.status(namespace, "orders").get("readyMembers") == replicas
            ),
            f"readyMembers {replicas}",
        )
        groups.wait_ready(namespace, "orders")
    wait_for(
        lambda: attempt("kubectl", "get", "pod", "orders-3", "-n", namespace).returncode != 0,
        "orders-3 gone",
    )

    # A deleted pod is a temporary leave: it comes back with the same partitions, and nothing
    # moves meanwhile.
    before = groups.read_group(cluster, namespace, "orders", gid)
    deleted_at = time.time()
    old_uid = get("pod", "orders-1", namespace)["metadata"]["uid"]
    run(
        "kubectl", "delete", "pod", "orders-1", "-n", namespace,
        "--wait=true", f"--timeout={WAIT_S}s",
    )  # fmt: skip
    wait_for(
        lambda: (
            attempt(
                "kubectl",
                "get",
                "pod",
                "orders-1",
                "-n",
                namespace,
                "-o",
                "jsonpath={.metadata.uid}",
            ).stdout
            not in ("", old_uid)
        ),
        "orders-1 recreated",
    )
    run(
        "kubectl", "wait", "pod/orders-1", "-n", namespace,
        "--for=condition=Ready", f"--timeout={WAIT_S}s",
    )  # fmt: skip
    wait_for(
        lambda: any(e["event"] == "assigned" for e in groups.events(namespace, "orders-1")),
        "the new orders-1 assigned its partitions",
    )
    after = groups.read_group(cluster, namespace, "orders", gid)
    assert after["assignment"] == before["assignment"]
    (assigned,) = [e for e in groups.events(namespace, "orders-1") if e["event"] == "assigned"]
    assert assigned["partitions"] == before["assignment"]["orders-1"]
    for pod in ("orders-0", "orders-2"):
        moved = [
            e
            for e in groups.events(namespace, pod)
            if e["event"] in ("revoked", "lost") and e["at"] > deleted_at
        ]
        assert moved == [], (pod, moved)
    # No member crashed on the way (each consumer container ran once).
    restarted = groups.restarted(namespace)
    assert restarted == {}, json.dumps(restarted, indent=1)
    groups.produce(cluster.bootstrap, topic, 300, PARTITIONS, start=300)
    retained = _committed(cluster, namespace, gid, 600)["offsets"]

    # Retain (the default) keeps the offsets: a group claiming the id again finds them.
    _delete_group(namespace, "orders")
    wait_for(lambda: _events(namespace, "GroupRetained"), "a GroupRetained event")
    empty = groups.group_manifest(namespace, "orders", topic, cluster.bootstrap, replicas=0)
    groups.apply(empty)
    _wait_token(namespace)
    assert groups.read_group(cluster, namespace, "orders", gid)["offsets"] == retained

    # Delete removes them.
    run(
        "kubectl", "patch", "cg/orders", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"deletionPolicy": "Delete"}}),
    )  # fmt: skip
    _delete_group(namespace, "orders")
    wait_for(lambda: _events(namespace, "GroupDeleted"), "a GroupDeleted event")
    groups.apply(empty)
    _wait_token(namespace)
    assert groups.read_group(cluster, namespace, "orders", gid)["offsets"] == {}
    _delete_group(namespace, "orders")


def _bad_group(namespace: str, name: str, topic: str, bootstrap: str) -> dict[str, Any]:
    group = groups.group_manifest(namespace, name, topic, bootstrap, replicas=1)
    return group


@budget(waits=2)
def test_invalid_spec_is_reported(cluster: Cluster, operator: str, namespace: str) -> None:
    group = _bad_group(
        namespace, "broken", "no-such-topic-" + uuid.uuid4().hex[:6], cluster.bootstrap
    )
    groups.apply(group)
    run(
        "kubectl", "wait", "cg/broken", "-n", namespace,
        "--for=jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}=UnknownTopic",
        f"--timeout={WAIT_S}s",
    )  # fmt: skip
    run("kubectl", "delete", "cg/broken", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")


@budget(waits=2)
def test_a_template_the_api_server_refuses_is_reported(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    """The StatefulSet of a pod template the API server refuses (422) is InvalidTemplate."""
    topic = groups.create_topic(cluster.bootstrap)  # the topic exists: the StatefulSet fails
    group = _bad_group(namespace, "refused", topic, cluster.bootstrap)
    group["spec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    groups.apply(group)
    run(
        "kubectl", "wait", "cg/refused", "-n", namespace,
        "--for=jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}=InvalidTemplate",
        f"--timeout={WAIT_S}s",
    )  # fmt: skip
    run("kubectl", "delete", "cg/refused", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")


@budget(waits=0, polls_s=120)
def test_names_the_statefulset_cannot_carry_are_refused(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    for name in ("orders.v2", "o" * 53):
        group = _bad_group(namespace, name, "orders", cluster.bootstrap)
        refused = attempt(
            "kubectl", "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(group)
        )
        assert refused.returncode != 0, name
        assert "metadata.name must be" in refused.stderr, refused.stderr


# Examples of other projects' resources (KEDA, prometheus-operator), whose CRDs this cluster
# does not have: tests/test_docs.py checks them against what they name of ours.
OTHER_PROJECTS = {"keda.sh", "monitoring.coreos.com"}


@budget(waits=0, polls_s=120)
def test_examples_pass_server_side_validation(operator: str, namespace: str) -> None:
    validated = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        documents = [
            doc
            for doc in yaml.safe_load_all(path.read_text())
            if doc and doc["apiVersion"].partition("/")[0] not in OTHER_PROJECTS
        ]
        if not documents:
            continue
        validated += len(documents)
        for document in documents:
            document["metadata"]["namespace"] = namespace
        run(
            "kubectl", "apply", "--dry-run=server", "-f", "-",
            stdin=yaml.safe_dump_all(documents),
        )  # fmt: skip
    assert validated >= 5


LEASE_VERBS_BY_NAME = ("get", "update")
# The chart's Leases (stateTopic.partitions 50, replicas 3): the first and last of each kind.
LEASES = [
    f"{OPERATOR}-partition-0",
    f"{OPERATOR}-partition-49",
    f"{OPERATOR}-partition-replica-0",
    f"{OPERATOR}-partition-replica-2",
]


def _allowed(verb: str, resource: str, namespace: str, name: str = "") -> str:
    """The authorizer's answer for the chart's ServiceAccount (a SubjectAccessReview, which
    needs no discovery: the spark-operator's resources are asked about without its CRD)."""
    group, _, rest = resource.rpartition(":")
    plural, _, subresource = rest.partition("/")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{OPERATOR_NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "group": group,
                "resource": plural,
                "subresource": subresource,
                "verb": verb,
                "namespace": namespace,
                "name": name,
            },
        },
    }
    answer = json.loads(run("kubectl", "create", "-o", "json", "-f", "-", stdin=json.dumps(review)))
    return "yes" if answer["status"].get("allowed") else "no"


@budget(waits=0, polls_s=300)
def test_the_operator_identity_may_do_what_its_code_does(operator: str, namespace: str) -> None:
    """The cluster's authorizer, asked as the chart's ServiceAccount, grants every verb the
    code uses, ``update`` on the finalizers that OwnerReferencesPermissionEnforcement checks
    included, in any namespace (the chart's default watches them all), Leases in its own and
    by name only the chart's."""
    refused = []
    for group, resource, verb in sorted(rbac.used()):
        # The partition Leases live in the operator's own namespace (a Role of the chart's),
        # and only the chart's Leases may be read and renewed, by name.
        where = OPERATOR_NAMESPACE if resource == "leases" else namespace
        names = LEASES if resource == "leases" and verb in LEASE_VERBS_BY_NAME else [""]
        for name in names:
            answer = _allowed(verb, f"{group}:{resource}", where, name)
            if answer != "yes":
                refused.append((group, resource, verb, name, answer))
    assert refused == []
    # Any other Lease is not the operator's to take.
    for verb in LEASE_VERBS_BY_NAME:
        lease = f"{OPERATOR}-other"
        assert _allowed(verb, "coordination.k8s.io:leases", OPERATOR_NAMESPACE, lease) == "no"
    # Nor may it delete Secrets (it creates the groups' tokens and reads Secrets, no more).
    assert _allowed("delete", ":secrets", namespace) == "no"


# Run as a client of the cluster: describe the group at one replica's own address (following
# its NOT_COORDINATOR hint, if any); "ok" or the error's name.
_ASK_REPLICA = """
import os, sys
from kafka_group_operator.member import client
env = os.environ
try:
    client.CoordinatorClient(sys.argv[1], env["KGO_GROUP_ID"], env["KGO_GROUP_TOKEN"]).describe()
    print("ok")
except Exception as error:
    print(type(error).__name__, error)
"""


@budget(waits=3)
def test_every_replica_answers_a_group_created_after_it_started(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    topic = groups.create_topic(cluster.bootstrap)
    manifest = groups.group_manifest(namespace, "orders", topic, cluster.bootstrap, replicas=0)
    groups.apply(manifest)
    _wait_token(namespace)
    groups.read_group(cluster, namespace, "orders", groups.group_id(manifest))  # it is served
    env = {
        **cluster.client_env(),
        "KGO_GROUP_ID": groups.group_id(manifest),
        "KGO_GROUP_TOKEN": groups.token(namespace, "orders"),
    }
    replicas = json.loads(
        run(
            "kubectl", "get", "pods", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR,
            "-o", "json",
        )
    )["items"]  # fmt: skip
    answers = {}
    for pod in replicas:
        url = f"http://{pod['status']['podIP']}:8080"
        done = subprocess.run(
            [sys.executable, "-c", _ASK_REPLICA, url],
            env=env, capture_output=True, text=True, timeout=WAIT_S, check=False,
        )  # fmt: skip
        answers[pod["metadata"]["name"]] = done.stdout.strip() or done.stderr[-500:]
    assert set(answers.values()) == {"ok"}, answers
