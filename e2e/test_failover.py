"""Coordinator failover in a real cluster: the operator at three replicas, the replica that
coordinates a consuming group deleted; the group keeps every partition and loses no commit.

The group's coordinator is the holder of its state partition's Lease
(``<release>-partition-<partitionFor(group)>``). Its pod is deleted while the group's two
members consume a topic that keeps receiving messages. Then, read through the member API from
inside a member's pod (where the coordinator's per-replica addresses resolve):

* every member still owns the partitions it owned before, at the same group epoch (no
  rebalance), and no member logged a lost partition;
* every offset committed and acknowledged before the deletion is still there (committed
  offsets never go back), and the group goes on to commit the messages produced meanwhile.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import yaml
from confluent_kafka import Producer

from e2e.conftest import (
    HELM_WAIT_S,
    OPERATOR,
    OPERATOR_SELECTOR,
    ROOT,
    WAIT_S,
    attempt,
    budget,
    run,
)
from e2e.test_cluster import _group, _topic, _wait_ready
from kafka_group_records import partitioning

STATE_PARTITIONS = 50  # the chart's stateTopic.partitions
MESSAGES_PER_BATCH = 400
# Read in a member's pod: the group's view through the member API, following NOT_COORDINATOR.
_READ_GROUP = """
import json, os
from kafka_group_operator.member import client
c = client.CoordinatorClient(
    os.environ["KGO_COORDINATOR_URL"], os.environ["KGO_GROUP_ID"], os.environ["KGO_GROUP_TOKEN"]
)
d = c.describe()
print(json.dumps({
    "groupEpoch": d["groupEpoch"],
    "assignment": {m["instanceId"]: m["assignment"] for m in d["members"]},
    "offsets": [[t, p, o] for (t, p), o in sorted(c.fetch().items())],
}))
"""


def _read_group(namespace: str) -> dict[str, Any]:
    """The group as its coordinator sees it; retried while the coordinator moves."""
    deadline = time.monotonic() + WAIT_S
    while True:
        result = attempt_exec(namespace, "orders-0", "python", "-c", _READ_GROUP)
        if result is not None:
            view: dict[str, Any] = json.loads(result)
            return view
        assert time.monotonic() < deadline, "the group's coordinator never answered"
        time.sleep(2)


def attempt_exec(namespace: str, pod: str, *command: str) -> str | None:
    done = attempt("kubectl", "exec", pod, "-n", namespace, "--", *command)
    return done.stdout if done.returncode == 0 else None


def _offsets(view: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(topic, partition): offset for topic, partition, offset in view["offsets"]}


def _holder(namespace: str, partition: int) -> str:
    lease = json.loads(
        run(
            "kubectl", "get", "lease", f"{OPERATOR}-partition-{partition}",
            "-n", namespace, "-o", "json",
        )
    )  # fmt: skip
    holder: str = lease["spec"]["holderIdentity"]
    return holder


def _produce(topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": os.environ["KGO_E2E_BOOTSTRAP"]})
    for index in range(count):
        producer.produce(topic, f"word{index % 7} and more".encode(), partition=index % 4)
    assert producer.flush(30) == 0


def _lost_lines(namespace: str) -> int:
    """How many times the members logged a lost partition (examples/consumer.py)."""
    return sum(
        run("kubectl", "logs", pod, "-n", namespace).count("lost [")
        for pod in ("orders-0", "orders-1")
    )


@budget(waits=8, polls_s=3 * WAIT_S)
def test_deleting_the_coordinating_replica_moves_no_partition_and_loses_no_commit(
    namespace: str, operator: str
) -> None:
    # Three replicas (the chart's default, said explicitly).
    run(
        "helm", "upgrade", operator, str(ROOT / "charts" / "kafka-group-operator"),
        "--namespace", namespace, "--reuse-values", "--set", "replicas=3",
        "--wait", "--timeout", f"{HELM_WAIT_S}s",
        timeout=HELM_WAIT_S + 60,
    )  # fmt: skip
    run(
        "kubectl", "rollout", "status", f"statefulset/{OPERATOR}", "-n", namespace,
        f"--timeout={WAIT_S}s",
    )  # fmt: skip
    pods = json.loads(
        run("kubectl", "get", "pods", "-n", namespace, "-l", OPERATOR_SELECTOR, "-o", "json")
    )["items"]
    assert len(pods) == 3

    topic = _topic()
    group = _group(namespace, topic)
    # Longer than the Lease (15 s) plus loading: the members must not notice the failover.
    group["spec"]["sessionTimeoutSeconds"] = 45
    run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(group))
    _wait_ready(namespace)
    _produce(topic, MESSAGES_PER_BATCH)
    # Consumed and committed up to the end: the commits we will hold the coordinator to.
    deadline = time.monotonic() + WAIT_S
    while sum(_offsets(_read_group(namespace)).values()) < MESSAGES_PER_BATCH:
        assert time.monotonic() < deadline, "the group never committed the first batch"
        time.sleep(2)
    before = _read_group(namespace)
    acknowledged = _offsets(before)
    lost_before = _lost_lines(namespace)

    coordinator = _holder(
        namespace, partitioning.partition_for(f"{namespace}.orders", STATE_PARTITIONS)
    )
    assert coordinator.startswith(f"{OPERATOR}-")
    producing = threading.Thread(target=_produce, args=(topic, MESSAGES_PER_BATCH))
    producing.start()
    run("kubectl", "delete", "pod", coordinator, "-n", namespace, "--wait=false")
    producing.join(60)

    # The group goes on: every message of both batches committed, through the new coordinator.
    deadline = time.monotonic() + WAIT_S
    while sum(_offsets(after := _read_group(namespace)).values()) < 2 * MESSAGES_PER_BATCH:
        assert time.monotonic() < deadline, f"the group stopped committing: {after}"
        time.sleep(2)
    _wait_ready(namespace)
    assert after["assignment"] == before["assignment"]
    assert after["groupEpoch"] == before["groupEpoch"]
    assert _lost_lines(namespace) == lost_before
    committed = _offsets(after)
    assert all(committed[tp] >= offset for tp, offset in acknowledged.items()), (
        acknowledged,
        committed,
    )

    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")
