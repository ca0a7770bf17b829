"""Read fences on a real broker: the coordinator appends the markers, a job reads up to them.

Jobs never write the state topic. A job that needs a fixed end asks the coordinator, which
appends a load marker through its own writer (one transaction per partition) and returns its
offset: every write it acknowledged before the call lies below that offset, and reading up to
it, ``read_committed``, finds them all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest
from aiohttp import test_utils
from confluent_kafka import Consumer

from kafka_group_jobs import errors as job_errors
from kafka_group_jobs import fence, topics
from kafka_group_operator.access import tokens
from kafka_group_operator.api import app
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime, writer
from kafka_group_records import codec, partitioning, records
from tests.runtime import logs
from tests.support import groups

pytestmark = pytest.mark.broker

PARTITIONS = 3


def _config(bootstrap: str) -> coordinator_runtime.RuntimeConfig:
    return coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=logs.unique_topic(),
        partitions=PARTITIONS,
        write_timeout_ms=5000,
        metadata_interval_ms=500,
    )


def _commit(group: str, offsets: Mapping[tuple[str, int], int]) -> messages.OffsetCommitRequest:
    return messages.OffsetCommitRequest(
        group_id=group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={tp: messages.CommitOffset(offset) for tp, offset in offsets.items()},
    )


def _read(bootstrap: str, topic: str, partition: int, end: int) -> list[tuple[int, Any, Any]]:
    """Offsets ``[0, end]`` of the partition, decoded, as a job's reader sees them."""
    consumer = Consumer(topics.reader_config(bootstrap))
    try:
        return [
            (m.offset(), codec.decode_key(m.key()), m.value())
            for batch in topics.read_range(consumer, topic, partition, 0, end + 1)
            for m in batch
        ]
    finally:
        consumer.close()


async def test_a_read_fence_covers_every_acknowledged_write(
    broker: embedded.EmbeddedBroker,
) -> None:
    config = _config(broker.bootstrap)
    group = "fenced-group"
    home = partitioning.partition_for(group, PARTITIONS)
    async with groups.running(config) as runtime:
        await runtime.commit_offsets(_commit(group, {("orders", 0): 41}))
        before = runtime.canonical_state()
        ends = await runtime.read_fence(group)
        assert list(ends) == [home]
        every = await runtime.read_fence(group, all_partitions=True)
        assert sorted(every) == list(range(PARTITIONS))
        assert every[home] > ends[home]
        # A marker changes no state.
        assert runtime.canonical_state() == before
    log = await asyncio.to_thread(_read, broker.bootstrap, config.topic, home, ends[home])
    below = [(key, value) for offset, key, value in log if offset < ends[home]]
    commit_key = records.OffsetCommitKey(group, "orders", 0)
    assert [codec.decode_value(key, value).offset for key, value in below if key == commit_key] == [  # type: ignore[union-attr]
        41
    ]
    # The fence's end is the coordinator's own marker, named by its writer's nonce.
    (marker,) = [(key, value) for offset, key, value in log if offset == ends[home]]
    assert isinstance(marker[0], records.LoadMarkerKey)
    decoded = codec.decode_value(marker[0], marker[1])
    assert isinstance(decoded, records.LoadMarkerValue)
    assert decoded.nonce.startswith(writer.COORDINATOR_NONCE_PREFIX)


async def test_a_partition_not_served_gives_no_fence(broker: embedded.EmbeddedBroker) -> None:
    runtime = coordinator_runtime.CoordinatorRuntime(_config(broker.bootstrap))
    with pytest.raises(errors.CoordinatorNotAvailable):
        await runtime.read_fence("any-group")
    with pytest.raises(errors.CoordinatorNotAvailable):
        await runtime.read_fence("any-group", all_partitions=True)


async def test_the_read_fence_endpoint_takes_the_groups_token(
    broker: embedded.EmbeddedBroker,
) -> None:
    config = _config(broker.bootstrap)
    store = tokens.GroupTokens({"payments": "s3cret"})
    async with (
        groups.running(config) as runtime,
        test_utils.TestClient(test_utils.TestServer(app.build_app(runtime, store))) as http,
    ):
        refused = await http.post("/v1/groups/payments/read-fence")
        assert refused.status == 401
        wrong = await http.post(
            "/v1/groups/payments/read-fence", headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status == 403
        auth = {"Authorization": "Bearer s3cret"}
        one = await http.post("/v1/groups/payments/read-fence", headers=auth)
        body = await one.json()
        assert one.status == 200, body
        assert body["fence"] == "coordinator"
        assert list(body["endOffsets"]) == [str(partitioning.partition_for("payments", PARTITIONS))]
        every = await http.post(
            "/v1/groups/payments/read-fence", headers=auth, json={"allPartitions": True}
        )
        assert sorted((await every.json())["endOffsets"]) == ["0", "1", "2"]
        bad = await http.post(
            "/v1/groups/payments/read-fence", headers=auth, data=json.dumps({"all": 1})
        )
        assert bad.status == 400
        assert (await bad.json())["error"] == "INVALID_REQUEST"
        not_bool = await http.post(
            "/v1/groups/payments/read-fence", headers=auth, json={"allPartitions": "yes"}
        )
        assert not_bool.status == 400

        # The jobs' client of the endpoint.
        url = str(http.make_url(""))
        asked = fence.Coordinator(url, "payments", "s3cret")
        got = await asyncio.to_thread(
            fence.obtain, broker.bootstrap, config.topic, [0, 1, 2], {}, asked, True
        )
        assert got.kind == fence.COORDINATOR
        assert sorted(got.end_offsets) == [0, 1, 2]
        with pytest.raises(job_errors.JobError, match="refused a read fence"):
            await asyncio.to_thread(
                fence.request, fence.Coordinator(url, "payments", "nope"), False
            )


async def test_without_a_coordinator_a_job_reads_up_to_the_last_stable_offsets(
    broker: embedded.EmbeddedBroker,
) -> None:
    """Offline: the transactional log's committed end, reachable past its commit markers."""
    config = _config(broker.bootstrap)
    group = "offline-group"
    home = partitioning.partition_for(group, PARTITIONS)
    async with groups.running(config) as runtime:
        for offset in range(3):
            await runtime.commit_offsets(_commit(group, {("orders", 0): offset}))
    got = await asyncio.to_thread(
        fence.obtain, broker.bootstrap, config.topic, range(PARTITIONS), {}
    )
    assert got.kind == fence.LAST_STABLE_OFFSET
    end = got.end_offsets[home]
    consumer = Consumer(topics.reader_config(broker.bootstrap))
    try:
        read = await asyncio.to_thread(
            lambda: [
                m.offset()
                for batch in topics.read_range(consumer, config.topic, home, 0, end, stall_s=10)
                for m in batch
            ]
        )
    finally:
        consumer.close()
    # The last record of a transactional log is a commit marker no consumer hands out.
    assert read
    assert max(read) < end - 1
