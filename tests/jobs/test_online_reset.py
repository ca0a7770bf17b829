"""A snapshot, then an online restore of it while real member processes keep consuming.

The operator runs against the API server with its embedded coordinator (no spark-operator
installed, so the jobs run on local Spark in subprocesses). The group's offsets start at 20;
an OffsetSnapshot captures them. Two member processes (the demo's journaling member) then
consume a 4-partition topic to its end. ``spec.offsetReset`` restores the snapshot: the
coordinator pauses assignment, the members commit and release, the restore job plans, the
operator writes the plan, and the group resumes. The members' journals must then show every
message from offset 20 on processed exactly once more, and nothing before it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_group_operator.commands import demo
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from tests.jobs import test_snapshot_handlers as handlers_test
from tests.support import kube, topics

pytestmark = [
    pytest.mark.kube,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.kmock(cls=kube.ApiServer),
    # Two local Spark runs (snapshot, restore plan) with their JVM starts, plus members.
    pytest.mark.timeout(600),
]

NS = handlers_test.NS
GROUP = f"{NS}.payments"
PARTITIONS = 4
MESSAGES = 50
RESET_TO = 20


@pytest.fixture
def data_topic(broker: embedded.EmbeddedBroker) -> str:
    return topics.create_topic(broker.bootstrap, PARTITIONS, MESSAGES)


@pytest.fixture
async def operator(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker
) -> AsyncIterator[kube.RunningOperator]:
    config = kube.operator_config_for(kmock, broker.bootstrap)
    async with kube.RunningOperator(config) as running:
        yield running


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def start_member(
    operator: kube.RunningOperator, broker: Any, topic: str, instance: str, journal: Path
) -> subprocess.Popen[bytes]:
    token = operator.state.tokens.token_for(GROUP)
    assert token is not None
    env = {
        **os.environ,
        "KGO_GROUP_ID": GROUP,
        "KGO_COORDINATOR_URL": operator.config.coordinator_url,
        "KGO_GROUP_TOKEN": token,
        "KGO_INSTANCE_ID": instance,
        "KGO_MEMBER_ID": str(uuid.uuid4()),
        "KGO_TOPICS": topic,
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "KGO_AUTO_OFFSET_RESET": "earliest",
        "KGO_COMMIT_INTERVAL_MS": "300",
    }
    log = journal.with_suffix(".log").open("ab")
    command = [sys.executable, "-m", "kafka_group_operator.commands.demo", "member"]
    return subprocess.Popen(
        [*command, "--journal", str(journal)], env=env, stdout=log, stderr=subprocess.STDOUT
    )


def processed(journals: list[Path]) -> list[tuple[tuple[str, int], int, float]]:
    found = []
    for path in journals:
        if path.exists():
            found.extend(demo.Journal.read(path).processed())
    return found


async def committed(operator: kube.RunningOperator) -> dict[tuple[str, int], int]:
    fetched = await operator.call(
        operator.state.runtime.fetch_offsets(messages.OffsetFetchRequest(group_id=GROUP))
    )
    return {tp: value.offset for tp, value in fetched.offsets.items()}


async def test_online_reset_with_members_consuming(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    tmp_path: Path,
    members: list[subprocess.Popen[bytes]],
) -> None:
    await handlers_test.create_group(kmock, data_topic, broker.bootstrap, replicas=2)
    await operator.wait_for(lambda: operator.state.tokens.token_for(GROUP), 60)
    await handlers_test.commit(operator, {(data_topic, p): RESET_TO for p in range(PARTITIONS)})

    await handlers_test.create_snapshot(kmock, "before", f"file://{tmp_path}/snaps", "auto")

    def snapshot_status() -> dict[str, Any]:
        return handlers_test.status_of(kmock, handlers_test.SNAPSHOTS, "before")

    await operator.wait_for(
        lambda: snapshot_status().get("phase") in ("Succeeded", "Failed"), 240, 0.5
    )
    snapshot = snapshot_status()
    assert snapshot["phase"] == "Succeeded", snapshot
    assert snapshot["run"]["mode"] == "local"
    assert (snapshot["records"], snapshot["partitions"]) == (PARTITIONS, PARTITIONS)
    assert snapshot["location"] == f"file://{tmp_path}/snaps/{NS}/before"
    ready = [c for c in snapshot["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"

    journals = [tmp_path / f"payments-{i}.jsonl" for i in range(2)]
    for index, journal in enumerate(journals):
        members.append(start_member(operator, broker, data_topic, f"payments-{index}", journal))
    everything = {(data_topic, p): MESSAGES for p in range(PARTITIONS)}

    async def caught_up() -> bool:
        return await committed(operator) == everything

    await operator.wait_for(caught_up, 120, 0.5)

    reset_started = time.time()
    reset = {"to": "snapshot", "snapshot": "before", "dryRun": False}
    path = f"/apis/kafkagroups.io/v1alpha1/namespaces/{NS}/consumergroups/payments"
    await kube.api_call(kmock, "PATCH", path, {"spec": {"offsetReset": reset}})

    def last_reset() -> dict[str, Any]:
        status = handlers_test.status_of(kmock, handlers_test.CG, "payments")
        return dict(status.get("lastReset") or {})

    await operator.wait_for(lambda: last_reset().get("phase") in ("Done", "Failed"), 300, 0.5)
    audit = last_reset()
    assert audit["phase"] == "Done", audit
    assert audit["target"] == reset
    assert audit["clamped"] == 0
    assert [(p["partition"], p["oldOffset"], p["newOffset"]) for p in audit["partitions"]] == [
        (p, MESSAGES, RESET_TO) for p in range(PARTITIONS)
    ]

    conditions = handlers_test.status_of(kmock, handlers_test.CG, "payments")["conditions"]
    resetting = [c for c in conditions if c["type"] == "ResetInProgress"]
    assert resetting[0]["status"] == "False"

    # The group resumes from the plan and works its way back to the end: every message from
    # the new position on is processed exactly once more, nothing before it.
    await operator.wait_for(caught_up, 120, 0.5)
    after = [(tp, offset) for tp, offset, at in processed(journals) if at >= reset_started]
    for partition in range(PARTITIONS):
        offsets = sorted(o for tp, o in after if tp == (data_topic, partition))
        assert offsets == list(range(RESET_TO, MESSAGES)), (partition, offsets)
