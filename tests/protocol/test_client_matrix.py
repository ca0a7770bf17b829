"""The life of a consumer group, for each unmodified client through the gateway: confluent-kafka
classic with ``range`` (eager) and ``cooperative-sticky``, confluent-kafka with
``group.protocol=consumer`` (KIP-848), and kafka-python (classic).

Each client runs in processes of its own, so that it can be stopped and killed like a pod:
a static member joins and takes every partition; a second joins and only the partitions it
needs move, never owned by both at once; the first is restarted (a new process, the same
``group.instance.id``: killed with SIGKILL for the classic clients, stopped for KIP-848,
whose static member then leaves with epoch -2) and gets exactly its partitions back without
a new group epoch, while its old member id is refused as a zombie's; the second is killed
with SIGKILL and its partitions move to the survivor once its session timeout (6 s) passed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

import pytest

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.test_classic_clients import (
    PARTITIONS,
    open_gateway,
    shares_by_instance,
    stable_with,
    wait_for_async,
)
from tests.protocol.test_kip848 import topic_id
from tests.support import topics

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

__all__ = ["open_gateway"]  # the classic clients' gateway fixture, used here too

SESSION_MS = 6_000

# One consumer process; SIGTERM closes it as an application's shutdown does (a static
# classic member does not leave; a static KIP-848 member leaves with epoch -2 and keeps its
# partitions for the session timeout).
CONSUMER = """
import signal, sys
client, port, group, topic, instance, session = sys.argv[1:]
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
if client == "kafka-python":
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}", group_id=group, group_instance_id=instance,
        session_timeout_ms=int(session), heartbeat_interval_ms=300,
        auto_offset_reset="earliest",
    )
    consumer.subscribe([topic])
    while not stopping:
        consumer.poll(timeout_ms=100)
else:
    from confluent_kafka import Consumer
    settings = {
        "bootstrap.servers": f"127.0.0.1:{port}", "group.id": group,
        "group.instance.id": instance, "auto.offset.reset": "earliest", "log_level": 0,
    }
    if client == "confluent-consumer":
        settings["group.protocol"] = "consumer"
    else:
        settings.update({
            "group.protocol": "classic", "session.timeout.ms": int(session),
            "heartbeat.interval.ms": 300,
            "partition.assignment.strategy":
                "range" if client == "confluent-eager" else "cooperative-sticky",
        })
    consumer = Consumer(settings)
    consumer.subscribe([topic])
    while not stopping:
        consumer.poll(0.1)
consumer.close()
"""

CLIENTS = ["confluent-eager", "confluent-cooperative-sticky", "confluent-consumer", "kafka-python"]


def consumer_process(
    client: str, port: int, group: str, topic: str, instance: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            CONSUMER,
            client,
            str(port),
            group,
            topic,
            instance,
            str(SESSION_MS),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def stable_never_sharing(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, topic: str, count: int
) -> messages.GroupDescription:
    """``stable_with``, checking at every look on the way that no partition is owned by two
    members at once (what a member still revokes counts as owned)."""

    async def ready() -> bool:
        try:
            described = await runtime.describe_group(group)
        except errors.GroupIdNotFound:
            return False
        owned = [
            p
            for m in described.members
            for p in (*m.assignment.get(topic, ()), *m.partitions_pending_revocation.get(topic, ()))
        ]
        assert len(owned) == len(set(owned)), f"a partition owned twice: {described.members}"
        held = [set(m.assignment.get(topic, ())) for m in described.members]
        return (
            described.state == "Stable"
            and len(held) == count
            and all(held)
            and set().union(*held) == set(range(PARTITIONS))
        )

    await wait_for_async(ready)
    return await stable_with(runtime, group, topic, count)


@pytest.mark.parametrize("client", CLIENTS)
async def test_join_add_static_restart_zombie_and_kill(
    client: str,
    broker: embedded.EmbeddedBroker,
    open_gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=1)
    await topic_id(runtime, topic)
    group = f"matrix-{client}-{uuid.uuid4().hex[:6]}"
    # A KIP-848 member's session timeout is the group's.
    await runtime.configure_group(
        messages.GroupSettings(group, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=300)
    )
    port = open_gateway.port
    pods = {"pod-0": consumer_process(client, port, group, topic, "pod-0")}
    try:
        alone = shares_by_instance(await stable_never_sharing(runtime, group, topic, 1), topic)
        assert alone == {"pod-0": set(range(PARTITIONS))}

        # A member added: only what it needs moves, revoked before it is assigned.
        pods["pod-1"] = consumer_process(client, port, group, topic, "pod-1")
        before = await stable_never_sharing(runtime, group, topic, 2)
        shares = shares_by_instance(before, topic)
        assert shares["pod-0"] < alone["pod-0"]
        assert shares["pod-1"] == alone["pod-0"] - shares["pod-0"]
        old = {m.instance_id: m for m in before.members}

        # A static restart: a new process, the same instance id, the same partitions.
        # A classic static member is killed (it would not leave anyway); a KIP-848 one is
        # stopped, so that it leaves with epoch -2 (killed, its instance id would stay
        # taken, UNRELEASED_INSTANCE_ID, until its session timeout).
        if client == "confluent-consumer":
            pods["pod-0"].terminate()
        else:
            pods["pod-0"].kill()
        # Waited for off the event loop: its close() talks to the gateway and listener here.
        await asyncio.to_thread(pods["pod-0"].wait, 30)
        pods["pod-0"] = consumer_process(client, port, group, topic, "pod-0")

        async def replaced() -> bool:
            members = (await runtime.describe_group(group)).members
            ids = {m.instance_id: m.member_id for m in members}
            return ids.get("pod-0") not in (None, old["pod-0"].member_id)

        await wait_for_async(replaced)
        after = await stable_never_sharing(runtime, group, topic, 2)
        assert shares_by_instance(after, topic) == shares
        assert after.group_epoch == before.group_epoch
        survivor = next(m for m in after.members if m.instance_id == "pod-1")
        assert survivor.member_id == old["pod-1"].member_id

        # The old process's member id is a zombie: its commit is refused.
        with pytest.raises(errors.UnknownMemberId):
            await runtime.commit_offsets(
                messages.OffsetCommitRequest(
                    group_id=group,
                    member_id=old["pod-0"].member_id,
                    member_epoch=old["pod-0"].member_epoch,
                    offsets={(topic, min(shares["pod-0"])): messages.CommitOffset(1)},
                )
            )

        # SIGKILL: nothing more from pod-1; its partitions move after its session timeout.
        pods["pod-1"].kill()
        pods["pod-1"].wait(30)
        killed_at = time.monotonic()
        last = await stable_never_sharing(runtime, group, topic, 1)
        assert time.monotonic() - killed_at >= SESSION_MS / 1000 - 0.5
        assert shares_by_instance(last, topic) == {"pod-0": set(range(PARTITIONS))}
    finally:
        for process in pods.values():
            process.kill()
            process.wait(30)
