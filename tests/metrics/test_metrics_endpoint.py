"""``/metrics`` of a real coordinator runtime on the embedded broker, parsed as Prometheus
parses it: kafka-lag-exporter's lag series and the coordinator's own counters and gauges."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kafka_group_operator.api import metrics as metrics_api
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.runtime import metrics as runtime_metrics
from tests.runtime import logs
from tests.support import groups, topics

pytestmark = pytest.mark.broker

# kafka-lag-exporter's labels (src/main/scala/com/lightbend/kafkalagexporter/Metrics.scala):
#   val groupPartitionLabels = List("cluster_name", "group", "topic", "partition",
#                                   "member_host", "consumer_id", "client_id")
#   val groupLabels = List("cluster_name", "group")
PARTITION_LABELS = {
    "cluster_name",
    "group",
    "topic",
    "partition",
    "member_host",
    "consumer_id",
    "client_id",
}
GROUP_LABELS = {"cluster_name", "group"}


async def _scrape(url: str) -> dict[str, list[Sample]]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = await response.text()
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _one(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    found = [s for s in samples.get(name, []) if labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0].value


def _by_partition(samples: dict[str, list[Sample]], name: str, group: str) -> dict[int, Sample]:
    return {
        int(s.labels["partition"]): s for s in samples.get(name, []) if s.labels["group"] == group
    }


async def _scrape_until(
    url: str, ready: Callable[[dict[str, list[Sample]]], bool]
) -> dict[str, list[Sample]]:
    for _ in range(150):
        samples = await _scrape(url)
        if ready(samples):
            return samples
        await asyncio.sleep(0.2)
    raise AssertionError(f"never ready: {samples}")


async def _heartbeat(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, member: str, epoch: int
) -> messages.HeartbeatResponse:
    return await runtime.heartbeat(messages.HeartbeatRequest(group, member, epoch))


async def test_scrape_shows_committed_offsets_lag_and_coordinator_counters(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = topics.create_topic(broker.bootstrap, 2, messages_per_partition=10)
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=broker.bootstrap,
        topic=logs.unique_topic(),
        partitions=2,
        metadata_interval_ms=300,
    )
    async with groups.running(config) as runtime:
        runner = await metrics_api.start_server(runtime, "127.0.0.1", 0, cluster_name="east")
        try:
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
            await _scenario(runtime, url, broker.bootstrap, topic)
        finally:
            await runner.cleanup()


async def _scenario(
    runtime: coordinator_runtime.CoordinatorRuntime, url: str, bootstrap: str, topic: str
) -> None:
    group = "billing"
    members = ["member-a", "member-b"]
    # The topic must be known to the coordinator before members subscribe to it.
    for _ in range(100):
        if topic in runtime.known_topics():
            break
        await asyncio.sleep(0.1)
    await groups.settle(runtime, group, members, topic)
    description = await runtime.describe_group(group)
    owner_of = {
        partition: member.member_id
        for member in description.members
        for partition in member.assignment.get(topic, ())
    }
    epochs = {member.member_id: member.member_epoch for member in description.members}

    before = await _scrape(url)
    heartbeats_before = _one(before, "kgo_heartbeats_total")
    timed_before = _one(before, "kgo_heartbeat_latency_seconds_count")
    commits_before = _one(before, "kgo_offset_commits_total")
    appended_before = _one(before, "kgo_state_topic_append_latency_seconds_count")

    # Ten heartbeats each that change nothing (twenty: at least one is timed), two commits
    # by the partitions' owners, one heartbeat with a stale epoch.
    for _ in range(10):
        for member_id in members:
            await _heartbeat(runtime, group, member_id, epochs[member_id])
    committed = {0: 3, 1: 10}
    for partition, offset in committed.items():
        owner = owner_of[partition]
        await runtime.commit_offsets(
            messages.OffsetCommitRequest(
                group_id=group,
                member_id=owner,
                member_epoch=epochs[owner],
                offsets={(topic, partition): messages.CommitOffset(offset)},
            )
        )
    with pytest.raises(errors.FencedMemberEpoch):
        await _heartbeat(runtime, group, members[0], epochs[members[0]] + 5)

    def lag_known(samples: dict[str, list[Sample]]) -> bool:
        return len(_by_partition(samples, "kafka_consumergroup_group_lag", group)) == 2

    after = await _scrape_until(url, lag_known)

    # Counters move by exactly what was done.
    assert _one(after, "kgo_heartbeats_total") - heartbeats_before == 20
    # One heartbeat in HEARTBEAT_TIMED_ONE_IN is timed: those that arrive when the count of
    # answered heartbeats is a multiple of it (these twenty arrive one after the other; the
    # fenced one is not answered, so it is never observed).
    timed = [
        n
        for n in range(int(heartbeats_before), int(heartbeats_before) + 20)
        if n % runtime_metrics.HEARTBEAT_TIMED_ONE_IN == 0
    ]
    assert _one(after, "kgo_heartbeat_latency_seconds_count") - timed_before == len(timed)
    assert (
        0
        < _one(after, "kgo_heartbeat_latency_seconds_count")
        <= _one(after, "kgo_heartbeats_total")
    )
    assert _one(after, "kgo_offset_commits_total") - commits_before == 2
    assert _one(after, "kgo_offset_commit_latency_seconds_count") == _one(
        after, "kgo_offset_commits_total"
    )
    assert (
        _one(after, "kgo_failed_requests_total", request="heartbeat", error="FENCED_MEMBER_EPOCH")
        == 1
    )
    # Each commit was its own state-topic write (one after the other).
    assert _one(after, "kgo_state_topic_append_latency_seconds_count") - appended_before >= 2
    assert _one(after, "kgo_state_partition_load_seconds_count") >= 1
    # The settle was at least one rebalance, and the later heartbeats found it over.
    rebalances = _one(after, "kgo_rebalances_total")
    assert rebalances >= 1
    assert _one(after, "kgo_rebalance_duration_seconds_count") == rebalances
    assert _one(after, "kgo_groups", state="Stable") == 1
    assert _one(after, "kgo_members", state="STABLE") == 2
    assert _one(after, "kgo_state_partitions", state="active") == 2

    # kafka-lag-exporter's series: offsets as committed, lag = log end (10) - offset, the
    # partition's owner in consumer_id, group aggregates.
    offsets = _by_partition(after, "kafka_consumergroup_group_offset", group)
    lags = _by_partition(after, "kafka_consumergroup_group_lag", group)
    lag_seconds = _by_partition(after, "kafka_consumergroup_group_lag_seconds", group)
    for partition, offset in committed.items():
        for series in (offsets, lags, lag_seconds):
            assert set(series[partition].labels) == PARTITION_LABELS
            assert series[partition].labels["cluster_name"] == "east"
            assert series[partition].labels["topic"] == topic
            assert series[partition].labels["consumer_id"] == owner_of[partition]
        assert offsets[partition].value == offset
        assert lags[partition].value == 10 - offset
    # Caught up: no time lag. Behind with one log-end point known: no estimate yet.
    assert lag_seconds[1].value == 0
    assert math.isnan(lag_seconds[0].value)
    for name in (
        "kafka_consumergroup_group_max_lag",
        "kafka_consumergroup_group_sum_lag",
        "kafka_consumergroup_group_max_lag_seconds",
    ):
        (sample,) = [s for s in after[name] if s.labels["group"] == group]
        assert set(sample.labels) == GROUP_LABELS
    assert _one(after, "kafka_consumergroup_group_max_lag", group=group) == 7
    assert _one(after, "kafka_consumergroup_group_sum_lag", group=group) == 7
    assert _one(after, "kafka_consumergroup_group_topic_sum_lag", group=group, topic=topic) == 7

    # The log grows by 5: lag follows the new log end, and with two log-end points the time
    # lag of the partition behind becomes a finite estimate.
    topics.produce(bootstrap, topic, [0], 5, first=10)

    def grown(samples: dict[str, list[Sample]]) -> bool:
        series = _by_partition(samples, "kafka_consumergroup_group_lag_seconds", group)
        lag = _by_partition(samples, "kafka_consumergroup_group_lag", group)
        return 0 in lag and lag[0].value == 12 and 0 in series and not math.isnan(series[0].value)

    grown_samples = await _scrape_until(url, grown)
    seconds = _by_partition(grown_samples, "kafka_consumergroup_group_lag_seconds", group)
    assert seconds[0].value > 0
    assert _one(grown_samples, "kafka_consumergroup_group_sum_lag", group=group) == 12
    assert _one(grown_samples, "kafka_consumergroup_group_max_lag_seconds", group=group) == (
        seconds[0].value
    )
