"""An OffsetSnapshot on a real control plane: the chart's default ``spark.mode: auto`` runs it
as local Spark in the operator's pod (no spark-operator is installed); the Parquet it writes
holds exactly the group's committed offsets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from e2e import groups
from e2e.conftest import (
    OPERATOR_NAMESPACE,
    WAIT_S,
    Cluster,
    budget,
    run,
    wait_for,
)

PARTITIONS = groups.PARTITIONS
MESSAGES = 200
# Local Spark in a loaded machine's operator pod: the JVM's start and the job.
SNAPSHOT_WAIT_S = 900


def _snapshot(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "OffsetSnapshot",
        "metadata": {"name": "before-migration", "namespace": namespace},
        "spec": {
            "consumerGroupRef": {"name": "orders"},
            # The operator pod's /tmp (an emptyDir).
            "storage": {"uri": f"file:///tmp/snapshots/{namespace}", "format": "parquet"},
        },
    }


def _status(namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = (
        json.loads(
            run("kubectl", "get", "offsetsnapshot/before-migration", "-n", namespace, "-o", "json")
        ).get("status")
        or {}
    )
    return found


def _on_node(cluster: Cluster, location: str) -> Path:
    """Where a path in an operator pod's /tmp is on the node: that pod's emptyDir."""
    relative = location.removeprefix("file://").removeprefix("/tmp/")
    found = sorted(
        cluster.state_dir.glob(f"pods/{OPERATOR_NAMESPACE}_*/volumes/tmp/{relative}/manifest.json")
    )
    assert found, f"no operator pod holds {location}"
    return found[-1].parent


@budget(waits=8, polls_s=SNAPSHOT_WAIT_S)
def test_a_snapshot_holds_the_committed_offsets(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    group = groups.create(cluster, namespace, 2)
    topic, gid = group.topic, group.group_id
    groups.produce(cluster.bootstrap, topic, MESSAGES, PARTITIONS)
    committed = wait_for(
        lambda: (
            view["offsets"]
            if sum(
                (view := groups.read_group(cluster, namespace, "orders", gid))["offsets"].values()
            )
            >= MESSAGES
            else None
        ),
        f"{MESSAGES} messages committed",
        every=2,
    )
    groups.apply(_snapshot(namespace))
    status = wait_for(
        lambda: (
            found if (found := _status(namespace)).get("phase") in ("Succeeded", "Failed") else None
        ),
        "the snapshot finished",
        within=SNAPSHOT_WAIT_S,
        every=3,
    )
    assert status["phase"] == "Succeeded", status
    assert status["records"] == PARTITIONS
    written = _on_node(cluster, status["location"])
    table = pq.read_table(written / "offsets.parquet").to_pylist()
    assert {f"{row['topic']}:{row['partition']}": row["offset"] for row in table} == committed
    manifest_json = json.loads((written / "manifest.json").read_text())
    assert manifest_json["group"] == gid
    assert manifest_json["checksum"] == status["checksum"]
    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")
