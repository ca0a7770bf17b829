"""The Spark-job handlers with the group coordinated by another replica.

As in ``test_control_plane_remote``: replica ``a`` runs kopf with our handlers and its own
coordinator, replica ``b`` is a second coordinator on the same Leases; the group id hashes to
one of ``b``'s partitions. An OffsetSnapshot of the group starts once ``b`` says the resource
owns the group id (the spark-operator is played, as in ``test_snapshot_handlers``). An online
reset of the group must pause it at ``b``, see its
members released there, and write the plan there as one administrative commit that ``b``
acknowledges; the restore job (local Spark, for real) plans from ``b``'s read fence. The
scheduled compaction's fence over every partition is taken by each partition's holder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import coordinator_port, lifecycle, snapshots
from kafka_group_operator.jobs import compaction
from kafka_group_operator.runtime import coordinator_runtime
from tests.jobs import test_snapshot_handlers as handlers_test
from tests.kube import test_control_plane_remote as remote
from tests.kube.test_consumer_groups import CG, GROUP_PATH, NS, condition, create, group_body
from tests.support import kube, topics

pytestmark = [
    pytest.mark.kube,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.kmock(cls=handlers_test.ApiServerWithSparkOperator),
    # One local Spark run (the restore plan) with its JVM start.
    pytest.mark.timeout(420),
]


def _last_reset(api: kube.ApiServer) -> dict[str, Any]:
    return dict(((api.get(CG, NS, "orders") or {}).get("status") or {}).get("lastReset") or {})


async def test_the_job_handlers_reach_the_groups_replica(
    kmock: kube.ApiServer,
    broker: embedded.EmbeddedBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The spark-operator is installed; the chart runs jobs locally unless a resource says not.
    monkeypatch.setenv("KGO_SPARK_MODE", "local")
    data_topic = topics.create_topic(broker.bootstrap, 2, 10)
    ports = [embedded.free_port(), embedded.free_port()]
    urls = tuple(f"http://127.0.0.1:{port}" for port in ports)
    state_topic = f"kgo-state-jobs-{ports[0]}"
    config = remote._replicas_config(kmock, broker.bootstrap, urls, 0, state_topic)
    async with (
        kube.RunningOperator(config) as operator,
        remote.second_replica(kmock, broker.bootstrap, state_topic, urls[1], urls) as b,
    ):
        await remote._wait(lambda: len(b.shards.elector.held) == remote.PARTITIONS // 2)
        held_by_b = frozenset(b.shards.elector.held)
        group_id = remote._group_on(held_by_b)
        await remote._wait(
            lambda: b.runtime.partition_state(group_id) is coordinator_runtime.PartitionState.ACTIVE
        )
        await create(kmock, group_body(data_topic, broker.bootstrap, groupId=group_id))
        await operator.wait_for(
            lambda: (condition(kmock, "Ready") or {}).get("reason") == "MembersNotReady", 60
        )
        # A snapshot: only the group id's owner, asked of b, may have its offsets read.
        await handlers_test.create_snapshot(
            kmock, "nightly", f"file://{tmp_path}", "operator", group="orders", namespace=NS
        )
        application = await operator.wait_for(
            lambda: handlers_test.status_of(kmock, handlers_test.SNAPSHOTS, "nightly").get(
                "sparkApplication"
            ),
            60,
        )
        arguments = (kmock.get(handlers_test.SPARK_APPS, NS, application) or {})["spec"][
            "arguments"
        ]
        assert arguments[arguments.index("--group") + 1] == group_id

        # Offsets the group committed before the reset, acknowledged by its coordinator, b.
        before = messages.OffsetCommitRequest(
            group_id=group_id,
            member_id="",
            member_epoch=messages.LEAVE_EPOCH,
            offsets={
                (data_topic, 0): messages.CommitOffset(7),
                (data_topic, 1): messages.CommitOffset(9),
            },
        )
        assert not (await b.runtime.commit_offsets(before)).errors

        reset = {"to": "offset", "offset": 3, "dryRun": False}
        await kube.api_call(kmock, "PATCH", GROUP_PATH, {"spec": {"offsetReset": reset}})
        await operator.wait_for(
            lambda: _last_reset(kmock).get("phase") in ("Done", "Failed"), 240, 0.5
        )
        audit = _last_reset(kmock)
        assert audit["phase"] == "Done", (audit.get("reason"), audit.get("message"))
        assert audit["run"]["mode"] == "local"
        # Planned from b's state partition (the old offsets are b's acknowledged commits) ...
        assert [(p["partition"], p["oldOffset"], p["newOffset"]) for p in audit["partitions"]] == [
            (0, 7, 3),
            (1, 9, 3),
        ]
        # ... and written at b, which acknowledged it; a's runtime never served the group.
        fetched = await b.runtime.fetch_offsets(messages.OffsetFetchRequest(group_id))
        assert {tp: value.offset for tp, value in fetched.offsets.items()} == {
            (data_topic, 0): 3,
            (data_topic, 1): 3,
        }
        with pytest.raises(errors.NotCoordinator):
            await operator.call(
                operator.state.runtime.fetch_offsets(messages.OffsetFetchRequest(group_id))
            )
        resetting = condition(kmock, "ResetInProgress")
        assert resetting is not None
        assert (resetting["status"], resetting["reason"]) == ("False", "Done")
        port = lifecycle.state_of(operator.memo).coordinators
        assert port is not None
        assert port.owner_url(group_id) == urls[1]

        # The scheduled compaction's fence, as the compaction schedule gets it on a: each
        # partition fenced by its holder, b's through the internal API.
        running = snapshots._running_operator(operator.memo)
        assert running is not None
        assert running.partitions == remote.PARTITIONS
        ends = await operator.call(
            compaction.fence_every_partition(running.fences, running.partitions)
        )
        assert sorted(ends) == list(range(remote.PARTITIONS))
        for partition in range(remote.PARTITIONS):
            probe = coordinator_port.partition_probe(partition, remote.PARTITIONS)
            expected = urls[1] if partition in held_by_b else coordinator_port.LOCAL
            assert port.owner_url(probe) == expected, partition
