"""What the end-to-end tests share: topics and messages on the session's broker, ConsumerGroup
manifests, the group as its coordinator reports it, and the consumers' own accounts (their
logs, one JSON line per event: ``support/consumer.py``)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from e2e.conftest import (
    OPERATOR,
    OPERATOR_NAMESPACE,
    OPERATOR_SELECTOR,
    ROOT,
    WAIT_S,
    Cluster,
    attempt,
    get,
    run,
    wait_for,
)

STATE_PARTITIONS = 50  # the chart's stateTopic.partitions
EXAMPLE = ROOT / "examples" / "consumergroup.yaml"
# Paths in the image's working directory are the source tree's on the test node.
CONSUMER = "/opt/kafka-group-operator/e2e/support/consumer.py"
KAFKA_CONSUMER = "/opt/kafka-group-operator/e2e/support/kafka_consumer.py"
MEMBER_API = f"http://{OPERATOR}.{OPERATOR_NAMESPACE}.svc:8080"
TOPIC_WAIT_S = 60


def create_topic(bootstrap: str, partitions: int = 4) -> str:
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TOPIC_WAIT_S)
    return topic


def produce(bootstrap: str, topic: str, count: int, partitions: int, start: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for index in range(start, start + count):
        producer.produce(
            topic, f"word{index % 7} message {index}".encode(), partition=index % partitions
        )
    assert producer.flush(TOPIC_WAIT_S) == 0


def group_manifest(
    namespace: str, name: str, topic: str, bootstrap: str, replicas: int, **spec: Any
) -> dict[str, Any]:
    """examples/consumergroup.yaml in ``namespace``, its pods running the recording consumer
    (committing every second), the group id defaulted (``<namespace>.<name>``) unless given."""
    group: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    group["metadata"] = {"name": name, "namespace": namespace}
    del group["spec"]["groupId"]
    group["spec"]["topics"] = [topic]
    group["spec"]["replicas"] = replicas
    group["spec"]["kafka"]["bootstrapServers"] = bootstrap
    (container,) = group["spec"]["template"]["spec"]["containers"]
    container["command"] = ["python", CONSUMER]
    container["env"] = [{"name": "KGO_COMMIT_INTERVAL_MS", "value": "1000"}]
    group["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    group["spec"].update(spec)
    return group


def apply(manifest: dict[str, Any]) -> None:
    run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(manifest))


def group_id(manifest: dict[str, Any]) -> str:
    explicit = manifest["spec"].get("groupId")
    return str(explicit or f"{manifest['metadata']['namespace']}.{manifest['metadata']['name']}")


def status(namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get("cg", name, namespace).get("status") or {}
    return found


def condition(namespace: str, name: str, kind: str = "Ready") -> dict[str, Any]:
    for item in status(namespace, name).get("conditions") or []:
        if item.get("type") == kind:
            found: dict[str, Any] = item
            return found
    return {}


def wait_ready(namespace: str, name: str) -> None:
    run(
        "kubectl", "wait", f"cg/{name}", "-n", namespace,
        "--for=condition=Ready", f"--timeout={WAIT_S}s",
    )  # fmt: skip


def token(namespace: str, name: str) -> str:
    secret = get("secret", f"{name}-group-token", namespace)
    return base64.b64decode(secret["data"]["token"]).decode()


# Run as a client of the cluster (its names resolve): the group through the member API,
# following NOT_COORDINATOR hints.
_READ_GROUP = """
import json, os
from kafka_group_operator.member import client
c = client.CoordinatorClient(
    os.environ["KGO_COORDINATOR_URL"], os.environ["KGO_GROUP_ID"], os.environ["KGO_GROUP_TOKEN"]
)
d = c.describe()
print(json.dumps({
    "groupEpoch": d["groupEpoch"],
    "assignment": {
        m["instanceId"]: sorted(f"{t}:{p}" for t, ps in m["assignment"].items() for p in ps)
        for m in d["members"]
    },
    "offsets": {f"{t}:{p}": o for (t, p), o in sorted(c.fetch().items())},
}))
"""


def read_group(cluster: Cluster, namespace: str, name: str, gid: str) -> dict[str, Any]:
    """The group as its coordinator sees it (epoch, assignment, committed offsets); retried
    while the coordinator moves."""
    env = {
        **cluster.client_env(),
        "KGO_COORDINATOR_URL": MEMBER_API,
        "KGO_GROUP_ID": gid,
        "KGO_GROUP_TOKEN": token(namespace, name),
    }
    last: list[str] = []

    def read() -> dict[str, Any] | None:
        done = subprocess.run(
            [sys.executable, "-c", _READ_GROUP],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            last[:] = [done.stderr[-2000:]]
            return None
        view: dict[str, Any] = json.loads(done.stdout)
        return view

    result: dict[str, Any] = wait_for(read, f"reading group {gid} ({last})", every=2)
    return result


def events(
    namespace: str, pod: str, container: str = "consumer", previous: bool = False
) -> list[dict[str, Any]]:
    """The JSON lines a consumer pod logged (``support/consumer.py``)."""
    args = ["kubectl", "logs", pod, "-n", namespace, "-c", container]
    if previous:
        args.append("--previous")
    done = attempt(*args)
    if done.returncode != 0:
        return []
    found = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def restarted(namespace: str) -> dict[str, dict[str, Any]]:
    """Containers of the namespace's pods that restarted: the count, how the last run ended
    (exit code, reason, start and end) and the end of its log, so that a failed "nothing
    restarted" check carries the evidence of why."""
    listed = json.loads(run("kubectl", "get", "pods", "-n", namespace, "-o", "json"))["items"]
    found: dict[str, dict[str, Any]] = {}
    for pod in listed:
        name = pod["metadata"]["name"]
        statuses = (pod["status"].get("containerStatuses") or []) + (
            pod["status"].get("initContainerStatuses") or []
        )
        for status in statuses:
            if not status["restartCount"]:
                continue
            previous = attempt(
                "kubectl", "logs", name, "-n", namespace, "-c", status["name"], "--previous"
            )
            found[f"{name}/{status['name']}"] = {
                "restarts": status["restartCount"],
                "last": (status.get("lastState") or {}).get("terminated"),
                "log": previous.stdout.splitlines()[-40:],
            }
    return found


def log_text(namespace: str, pod: str, container: str = "consumer") -> str:
    done = attempt("kubectl", "logs", pod, "-n", namespace, "-c", container)
    return done.stdout


def acknowledged(found: list[dict[str, Any]]) -> dict[str, int]:
    """The highest offset each partition's commits were acknowledged at."""
    highest: dict[str, int] = {}
    for event in found:
        if event.get("event") == "committed":
            for partition, offset in event["offsets"].items():
                highest[partition] = max(highest.get(partition, 0), int(offset))
    return highest


# ----------------------------------------------------------------------------- the operator


def spread() -> bool:
    """Every partition Lease held, each replica its fair share (the state after a restart)."""
    listed = json.loads(run("kubectl", "get", "leases", "-n", OPERATOR_NAMESPACE, "-o", "json"))
    # A Lease released and not yet taken (a handover) has no holder: not held.
    holders = Counter(
        holder
        for lease in listed["items"]
        if re.fullmatch(rf"{OPERATOR}-partition-\d+", lease["metadata"]["name"])
        and (holder := lease["spec"].get("holderIdentity"))
    )
    replicas = {f"{OPERATOR}-{n}" for n in range(3)}
    return sum(holders.values()) == STATE_PARTITIONS and all(
        holders[r] >= STATE_PARTITIONS // 3 for r in replicas
    )


def replicas_ready() -> bool:
    done = attempt(
        "kubectl", "wait", "pod", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_SELECTOR,
        "--for=condition=Ready", "--timeout=5s",
    )  # fmt: skip
    return done.returncode == 0


def restart_replicas() -> None:
    """A rolling restart of the operator, until every replica serves its share again."""
    run("kubectl", "rollout", "restart", f"statefulset/{OPERATOR}", "-n", OPERATOR_NAMESPACE)
    run(
        "kubectl", "rollout", "status", f"statefulset/{OPERATOR}", "-n", OPERATOR_NAMESPACE,
        f"--timeout={WAIT_S * 2}s",
        timeout=WAIT_S * 2 + 60,
    )  # fmt: skip
    wait_for(lambda: replicas_ready() and spread(), "every replica serving its share")


@dataclass(frozen=True)
class Group:
    """A test's group: its namespace, its topic, its manifest."""

    namespace: str
    topic: str
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def group_id(self) -> str:
        return group_id(self.manifest)


SHARED_ID = "shared.orders"
PARTITIONS = 4


def gateway_spec(topic: str) -> dict[str, Any]:
    """A ``clientProtocol: kafka`` group's pods: the README's unmodified consumer."""
    return {
        "clientProtocol": "kafka",
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "consumer",
                        "image": "registry.example.com/orders-consumer:1.0",
                        "command": ["python", KAFKA_CONSUMER],
                        "env": [{"name": "TOPIC", "value": topic}],
                    }
                ],
            }
        },
    }


def create(
    cluster: Cluster,
    namespace: str,
    members: int,
    of_topic: Callable[[str], dict[str, Any]] | None = None,
    **spec: Any,
) -> Group:
    """A group ``orders`` in ``namespace`` on a topic of its own (``PARTITIONS``), created
    after the operator's replicas started (any of them may be asked for it first), with
    ``members`` members, all ready. ``spec`` and ``of_topic(topic)`` add to its spec."""
    topic = create_topic(cluster.bootstrap, PARTITIONS)
    manifest = group_manifest(namespace, "orders", topic, cluster.bootstrap, replicas=members)
    manifest["spec"].update(spec)
    if of_topic is not None:
        manifest["spec"].update(of_topic(topic))
    apply(manifest)
    group = Group(namespace, topic, manifest)
    wait_for(
        lambda: status(namespace, group.name).get("readyMembers") == members,
        f"{members} members ready",
    )
    wait_ready(namespace, group.name)
    return group
