"""Tenancy on a real control plane: one resource owns a group id. A second ConsumerGroup naming
the same ``groupId`` from another namespace gets ``GroupIdConflict`` and changes nothing (no
token, no pods), and deleting it, even under ``deletionPolicy: Delete``, removes nothing of
the owner's; groups of the same name in two namespaces have two ids; when the owner is deleted
(Retain), a waiting claimant takes the id over, offsets included."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from e2e import groups
from e2e.conftest import WAIT_S, Cluster, attempt, budget, get, run, wait_for

SHARED_ID = groups.SHARED_ID


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    run("kubectl", "create", "namespace", name)
    yield name
    run("kubectl", "delete", "namespace", name, "--wait=false")


def _reason(namespace: str, name: str) -> str | None:
    reason = groups.condition(namespace, name).get("reason")
    return None if reason is None else str(reason)


def _absent(kind: str, name: str, namespace: str) -> bool:
    return attempt("kubectl", "get", kind, name, "-n", namespace).returncode != 0


@budget(waits=14)
def test_one_resource_owns_a_group_id(
    cluster: Cluster, operator: str, namespace: str, other_namespace: str
) -> None:
    owner = groups.create(cluster, namespace, 1, groupId=SHARED_ID)
    topic = owner.topic
    assert owner.group_id == SHARED_ID
    groups.produce(cluster.bootstrap, topic, 100, 4)
    committed = wait_for(
        lambda: (
            view["offsets"]
            if sum(
                (view := groups.read_group(cluster, namespace, "orders", SHARED_ID))[
                    "offsets"
                ].values()
            )
            >= 100
            else None
        ),
        "the owner's commits",
        every=2,
    )
    token = groups.token(namespace, "orders")
    before = groups.read_group(cluster, namespace, "orders", SHARED_ID)

    # A claimant in another namespace: refused, nothing made for it.
    claimant = groups.group_manifest(
        other_namespace, "claimant", topic, cluster.bootstrap, replicas=1, groupId=SHARED_ID,
        deletionPolicy="Delete",
    )  # fmt: skip
    groups.apply(claimant)
    wait_for(lambda: _reason(other_namespace, "claimant") == "GroupIdConflict", "GroupIdConflict")
    assert groups.condition(other_namespace, "claimant")["status"] == "False"
    assert _absent("secret", "claimant-group-token", other_namespace)
    assert _absent("statefulset", "claimant", other_namespace)

    # The same name in the other namespace is another group (its id has the namespace).
    namesake = groups.group_manifest(
        other_namespace, "orders", topic, cluster.bootstrap, replicas=0
    )
    groups.apply(namesake)
    wait_for(
        lambda: not _absent("secret", "orders-group-token", other_namespace),
        "the namesake's own token",
    )
    assert groups.token(other_namespace, "orders") != token
    assert _reason(other_namespace, "orders") != "GroupIdConflict"

    # Deleting the claimant (deletionPolicy Delete) removes nothing of the owner's.
    run(
        "kubectl", "delete", "cg/claimant", "-n", other_namespace,
        "--wait=true", f"--timeout={WAIT_S}s",
    )  # fmt: skip
    assert groups.token(namespace, "orders") == token
    after = groups.read_group(cluster, namespace, "orders", SHARED_ID)
    assert after["assignment"] == before["assignment"]
    assert all(after["offsets"][p] >= o for p, o in committed.items())

    # An heir waits while the owner lives, and takes the id (and its offsets) over once
    # the owner is deleted under Retain.
    heir = groups.group_manifest(
        other_namespace, "heir", topic, cluster.bootstrap, replicas=0, groupId=SHARED_ID
    )
    groups.apply(heir)
    wait_for(lambda: _reason(other_namespace, "heir") == "GroupIdConflict", "the heir waits")
    last = groups.read_group(cluster, namespace, "orders", SHARED_ID)["offsets"]
    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")
    wait_for(
        lambda: not _absent("secret", "heir-group-token", other_namespace),
        "the heir's token (it owns the id)",
    )
    assert groups.read_group(cluster, other_namespace, "heir", SHARED_ID)["offsets"] == last
    assert get("cg", "heir", other_namespace)["spec"]["groupId"] == SHARED_ID
