"""The scheduled compaction with two coordinators splitting the state topic: each partition is
read up to the read fence its own coordinator took, never past it.

Replicas ``a`` and ``b`` serve two state partitions each (``tests.scenarios``'s replicas, with
the internal API). The operator's port on ``a`` fences every partition, ``b``'s through the
internal API; a commit ``b`` acknowledges after the fence stays out of the checkpoint, one it
acknowledged before is in it. The compaction job runs on the shared local Spark session.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from kafka_group_jobs import compaction as compaction_job
from kafka_group_jobs import fence
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import coordinator_port
from kafka_group_operator.jobs import compaction, runs
from kafka_group_records import checkpoint, codec, records
from tests.runtime import logs
from tests.scenarios import test_remote_coordinator as replicas
from tests.support import groups

pytestmark = [pytest.mark.spark, pytest.mark.broker]


async def test_each_partition_is_compacted_up_to_its_coordinators_fence(
    spark: SparkSession, broker: embedded.EmbeddedBroker, tmp_path: Path
) -> None:
    state_topic = logs.unique_topic()
    partitions = replicas.PARTITIONS
    ports = {name: embedded.free_port() for name in replicas.SETS}
    on_a = replicas._group_on(replicas.SETS["a"], "compacted-a-")
    on_b = replicas._group_on(replicas.SETS["b"], "compacted-b-")
    async with replicas.replica(broker.bootstrap, state_topic, "a", ports) as a:
        port = coordinator_port.RoutingCoordinator(
            a.local,
            discovery_url=a.url,
            internal_token=replicas.INTERNAL_TOKEN,
            advertised_url=a.url,
            state_partitions=partitions,
        )
        try:
            async with replicas.replica(broker.bootstrap, state_topic, "b", ports) as b:
                assert not (await a.runtime.commit_offsets(groups.admin_commit(on_a, 4))).errors
                assert not (await b.runtime.commit_offsets(groups.admin_commit(on_b, 5))).errors
                ends = await compaction.fence_every_partition(port, partitions)
                # Acknowledged by b after its fence: not covered by this compaction.
                assert not (await b.runtime.commit_offsets(groups.admin_commit(on_b, 6))).errors
        finally:
            await port.close()

    due = datetime.datetime(2026, 11, 26, 3, tzinfo=datetime.UTC)
    run = runs.compaction_run(broker.bootstrap, state_topic, f"file://{tmp_path}", due, "kgo", ends)
    assert compaction_job.main(list(run.arguments)) == 0
    location = tmp_path / "checkpoint-20261126T030000Z"
    manifest = checkpoint.parse_manifest((location / checkpoint.MANIFEST_FILE).read_text())
    assert manifest.fence == fence.COORDINATOR
    assert manifest.end_offsets == ends
    committed: dict[str, int] = {}
    for row in pq.read_table(location / checkpoint.RECORDS_FILE).to_pylist():
        key = codec.decode_key(row["key"])
        assert row["offset"] < ends[row["partition"]]
        if isinstance(key, records.OffsetCommitKey):
            value = codec.decode_value(key, row["value"])
            assert isinstance(value, records.OffsetCommitValue)
            committed[key.group] = value.offset
    # b's later commit (6) lies past b's fence, in the log the loader reads after the checkpoint.
    assert committed == {on_a: 4, on_b: 5}
