"""The runtime's lock-free counters and histograms read as Prometheus's own types would."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kafka_group_operator.coordinator import errors
from kafka_group_operator.runtime import metrics


def _samples(runtime_metrics: metrics.RuntimeMetrics) -> dict[tuple[str, tuple[Any, ...]], float]:
    text = generate_latest(runtime_metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_histogram_buckets_are_cumulative_and_a_value_on_a_bound_counts_in_it() -> None:
    runtime_metrics = metrics.RuntimeMetrics()
    for value in (0.00005, 0.001, 0.0011, 99.0):
        runtime_metrics.heartbeat_seconds.observe(value)
    samples = _samples(runtime_metrics)

    def bucket(le: str) -> float:
        return samples[("kgo_heartbeat_latency_seconds_bucket", (("le", le),))]

    assert bucket("0.0001") == 1
    assert bucket("0.001") == 2  # Prometheus buckets hold values <= their bound
    assert bucket("0.0025") == 3
    assert bucket("10.0") == 3
    assert bucket("+Inf") == 4
    assert samples[("kgo_heartbeat_latency_seconds_count", ())] == 4
    assert samples[("kgo_heartbeat_latency_seconds_sum", ())] == 0.00005 + 0.001 + 0.0011 + 99.0


def test_counters_and_failures_by_request_and_error() -> None:
    runtime_metrics = metrics.RuntimeMetrics()
    runtime_metrics.commit_acknowledged(0.002)
    runtime_metrics.commit_acknowledged(0.003)
    runtime_metrics.request_failed("heartbeat", errors.FencedMemberEpoch())
    runtime_metrics.request_failed("heartbeat", errors.FencedMemberEpoch())
    runtime_metrics.request_failed("offset_commit", errors.NotCoordinator())
    samples = _samples(runtime_metrics)
    assert samples[("kgo_offset_commits_total", ())] == 2
    assert samples[("kgo_offset_commit_latency_seconds_count", ())] == 2
    failed = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "kgo_failed_requests_total"
    }
    assert failed == {
        (("error", "FENCED_MEMBER_EPOCH"), ("request", "heartbeat")): 2,
        (("error", "NOT_COORDINATOR"), ("request", "offset_commit")): 1,
    }


def test_a_rebalance_is_counted_once_and_timed_until_a_heartbeat_finds_the_group_steady() -> None:
    runtime_metrics = metrics.RuntimeMetrics()
    runtime_metrics.group_seen("g", "Stable")
    runtime_metrics.group_seen("g", "Assigning")
    runtime_metrics.group_seen("g", "Reconciling")
    runtime_metrics.group_seen("other", "Stable")
    assert runtime_metrics.rebalances.value == 1
    assert sum(runtime_metrics.rebalance_seconds.counts) == 0
    assert set(runtime_metrics.rebalancing) == {"g"}
    runtime_metrics.group_seen("g", "Stable")
    assert runtime_metrics.rebalances.value == 1
    assert sum(runtime_metrics.rebalance_seconds.counts) == 1
    assert runtime_metrics.rebalancing == {}
