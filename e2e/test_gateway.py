"""A ``clientProtocol: kafka`` group on a real control plane: the operator gives each pod the
gateway as a native sidecar, and an unmodified confluent-kafka consumer (the README's,
``support/kafka_consumer.py``) joins the group through it, consumes every message once and
commits it to the operator's coordinator."""

from __future__ import annotations

import json
from collections import Counter

from e2e import groups
from e2e.conftest import WAIT_S, Cluster, budget, get, run, wait_for

PARTITIONS = groups.PARTITIONS
MESSAGES = 400


@budget(waits=10)
def test_an_unmodified_client_consumes_through_the_gateway(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    group = groups.create(cluster, namespace, 2, groups.gateway_spec)
    topic, gid = group.topic, group.group_id
    pod = get("pod", "orders-0", namespace)
    # The gateway is a native sidecar, and the application got only the three variables.
    (sidecar,) = pod["spec"]["initContainers"]
    assert (sidecar["name"], sidecar["restartPolicy"]) == ("kgo-gateway", "Always")
    (application,) = pod["spec"]["containers"]
    names = sorted(item["name"] for item in application["env"])
    assert names == sorted(
        ["KAFKA_BOOTSTRAP_SERVERS", "KAFKA_GROUP_ID", "KAFKA_GROUP_INSTANCE_ID", "TOPIC"]
    )

    groups.produce(cluster.bootstrap, topic, MESSAGES, PARTITIONS)
    wait_for(
        lambda: (
            sum(groups.read_group(cluster, namespace, "orders", gid)["offsets"].values())
            >= MESSAGES
        ),
        f"{MESSAGES} messages committed through the gateway",
        every=2,
    )
    view = groups.read_group(cluster, namespace, "orders", gid)
    assert sorted(view["assignment"]) == ["orders-0", "orders-1"]
    owned = sorted(p for partitions in view["assignment"].values() for p in partitions)
    assert owned == sorted(f"{topic}:{p}" for p in range(PARTITIONS))
    processed = Counter(
        (event["partition"], event["offset"])
        for member in ("orders-0", "orders-1")
        for event in groups.events(namespace, member)
        if event["event"] == "processed"
    )
    assert len(processed) == MESSAGES
    assert max(processed.values()) == 1
    restarts = {
        f"{member}/{status['name']}": status["restartCount"]
        for member in ("orders-0", "orders-1")
        for status in get("pod", member, namespace)["status"]["containerStatuses"]
        + get("pod", member, namespace)["status"]["initContainerStatuses"]
        if status["restartCount"]
    }
    assert restarts == {}
    gateway_log = run("kubectl", "logs", "orders-0", "-n", namespace, "-c", "kgo-gateway")
    assert "gateway on 127.0.0.1:9092" in gateway_log, gateway_log[-2000:]
    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")
    print(json.dumps({"gateway_messages": MESSAGES, "processed_once": len(processed)}))
