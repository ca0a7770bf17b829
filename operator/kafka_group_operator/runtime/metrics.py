"""The coordinator's Prometheus metrics: hot-path instruments and scrape-time collectors.

``RuntimeMetrics`` holds what the runtime updates as it serves (one counter increment and
one histogram observation per commit or state-topic write, never more; a heartbeat, the most
frequent request and the cheapest, is counted every time but timed one time in
``HEARTBEAT_TIMED_ONE_IN``: plain numbers updated on the event loop's thread, without the
lock prometheus_client's instruments take) and the log-end history that lag in seconds is
estimated from. Everything else is read from the coordinator's memory when Prometheus
scrapes: ``registry_for`` registers collectors that walk the loaded shards then, so a commit
costs nothing for lag metrics.

Lag metrics carry kafka-lag-exporter's names and labels (seglo/kafka-lag-exporter,
``src/main/scala/com/lightbend/kafkalagexporter/Metrics.scala``)::

    groupLabels = List("cluster_name", "group")
    groupPartitionLabels = List("cluster_name", "group", "topic", "partition",
                                "member_host", "consumer_id", "client_id")
    kafka_consumergroup_group_offset / _lag / _lag_seconds   groupPartitionLabels
    kafka_consumergroup_group_max_lag / _max_lag_seconds / _sum_lag   groupLabels
    kafka_consumergroup_group_topic_sum_lag   cluster_name, group, topic

so dashboards and alerts written for it work unchanged. A partition no member owns has
empty ``member_host``, ``consumer_id`` and ``client_id``, as there.

Lag in seconds is estimated as kafka-lag-exporter does (``LookupTable.scala``): each time the
runtime reads a partition's log end it adds an (offset, time) point to a bounded table; the
time a committed offset was the log end is interpolated between the two points around it,
or extrapolated from the table's first and last points when it is older than the table.
"""

from __future__ import annotations

import bisect
import collections
import math
import time
from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kafka_group_operator.coordinator import errors, messages, shard
from kafka_group_operator.runtime import mirror

# kafka-lag-exporter's labels (Metrics.scala, quoted in the module's docstring).
GROUP_LABELS = ("cluster_name", "group")
GROUP_PARTITION_LABELS = (
    "cluster_name",
    "group",
    "topic",
    "partition",
    "member_host",
    "consumer_id",
    "client_id",
)
GROUP_TOPIC_LABELS = ("cluster_name", "group", "topic")

# Points kept per partition for lag in seconds (kafka-lag-exporter's default
# ``lookup-table-size`` is 60): a log end is read every metadata interval (5 s by default),
# so the table spans minutes, and a flat stretch takes one segment whatever its length.
LOOKUP_TABLE_SIZE = 60
# Log-end histories not fed for this long are dropped (their partitions are no longer asked).
_HISTORY_FORGET_S = 600.0

# Request latencies: from a heartbeat answered from memory (tens of µs) to a commit waiting
# for a slow state-topic write (seconds).
_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_REBALANCE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_LOAD_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# A heartbeat answered from memory takes tens of µs; reading the clock twice and observing a
# histogram cost about a microsecond more on a slow machine (bench/state_topic measures the
# runtime's heartbeat with and without its metrics). Timing one heartbeat in 16 keeps the
# latency distribution (heartbeats are alike and many) for a sixteenth of that; the counter
# still counts every heartbeat.
HEARTBEAT_TIMED_ONE_IN = 16

# Group states a rebalance passes through (group_state.GroupState's words).
_REBALANCING = frozenset({"Assigning", "Reconciling"})


class LogEndHistory:
    """One partition's (log-end offset, wall time in seconds) points, oldest first, at most
    ``limit``: kafka-lag-exporter's ``LookupTable.Table``."""

    __slots__ = ("fed_at", "points")

    def __init__(self, limit: int = LOOKUP_TABLE_SIZE) -> None:
        self.points: collections.deque[tuple[int, float]] = collections.deque(maxlen=limit)
        self.fed_at = 0.0

    def add(self, offset: int, at_s: float) -> None:
        """``Table.addPoint``: out-of-order and decreasing points are ignored; a third point
        of a flat line moves the line's right end instead of filling the table."""
        self.fed_at = time.monotonic()
        points = self.points
        if points:
            last_offset, last_at = points[-1]
            if last_at >= at_s or last_offset > offset:
                return
            if last_offset == offset and len(points) > 1 and points[-2][0] == offset:
                points[-1] = (offset, at_s)
                return
        points.append((offset, at_s))

    def lag_seconds(self, committed: int, now_s: float) -> float:
        """``Table.lookup``, as seconds behind ``now_s``: 0 when the committed offset is the
        newest log end (or beyond); NaN with fewer than two points or on a flat table."""
        points = self.points
        if not points:
            return math.nan
        if committed >= points[-1][0]:
            return 0.0
        if len(points) < 2:
            return math.nan
        left, right = points[0], points[-1]
        for index in range(len(points) - 1, 0, -1):
            low, high = points[index - 1], points[index]
            if low[0] <= committed <= high[0]:
                left, right = low, high
                break
        dy = right[0] - left[0]
        if dy == 0:
            return math.nan
        predicted = right[1] - (right[0] - committed) * (right[1] - left[1]) / dy
        return max(0.0, now_s - predicted)


class EventCounter:
    """A counter updated only from the event loop's thread: a plain integer, no lock
    (prometheus_client's ``Counter`` takes one per increment, which a heartbeat would feel).
    Read by ``InstrumentCollector`` at scrape time, on the same thread."""

    __slots__ = ("documentation", "name", "value")

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        # An int while only whole increments are added (the runtime's heartbeat takes its
        # remainder to choose which heartbeats to time).
        self.value: float = 0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LabelledCounter:
    """``EventCounter`` per label values (few: a request kind and an error name)."""

    __slots__ = ("documentation", "labels", "name", "values")

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *label_values: str) -> None:
        self.values[label_values] = self.values.get(label_values, 0.0) + 1.0


class EventHistogram:
    """A histogram updated only from the event loop's thread: one ``bisect`` and two
    additions per observation (see ``EventCounter``)."""

    __slots__ = ("bounds", "counts", "documentation", "name", "sum")

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = bounds
        # counts[i]: observations in (bounds[i-1], bounds[i]]; the last one above every bound.
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class InstrumentCollector(Collector):
    """Exposes the runtime's counters and histograms in Prometheus's types."""

    def __init__(self, metrics: RuntimeMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        metrics = self._metrics
        for counter in metrics.counters:
            family = CounterMetricFamily(counter.name, counter.documentation)
            family.add_metric([], counter.value)
            yield family
        for counter_by_labels in metrics.labelled_counters:
            labelled = CounterMetricFamily(
                counter_by_labels.name,
                counter_by_labels.documentation,
                labels=list(counter_by_labels.labels),
            )
            for label_values, value in sorted(counter_by_labels.values.items()):
                labelled.add_metric(list(label_values), value)
            yield labelled
        for histogram in metrics.histograms:
            histogram_family = HistogramMetricFamily(histogram.name, histogram.documentation)
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip(
                [*map(floatToGoString, histogram.bounds), "+Inf"], histogram.counts, strict=True
            ):
                cumulative += count
                buckets.append((bound, cumulative))
            histogram_family.add_metric([], buckets, histogram.sum)
            yield histogram_family


class RuntimeMetrics:
    """The runtime's instruments, in a registry of their own (one per runtime, so several
    runtimes in one process never share a series)."""

    def __init__(self) -> None:
        # Updated inline by the runtime's heartbeat (no call): heartbeats.value += 1 for
        # each one answered, an observation for one in HEARTBEAT_TIMED_ONE_IN.
        self.heartbeats = EventCounter("kgo_heartbeats", "Consumer-group heartbeats answered")
        self.heartbeat_seconds = EventHistogram(
            "kgo_heartbeat_latency_seconds",
            "Time to answer a heartbeat, from its arrival at the runtime; one heartbeat in "
            f"{HEARTBEAT_TIMED_ONE_IN} is timed (kgo_heartbeats_total counts them all)",
            _LATENCY_BUCKETS,
        )
        self.commits = EventCounter("kgo_offset_commits", "Offset-commit requests acknowledged")
        self.commit_seconds = EventHistogram(
            "kgo_offset_commit_latency_seconds",
            "Time to acknowledge an offset commit (durable on the state topic)",
            _LATENCY_BUCKETS,
        )
        self.failed = LabelledCounter(
            "kgo_failed_requests",
            "Requests answered with an error, by request and Kafka error name "
            "(FENCED_MEMBER_EPOCH, NOT_COORDINATOR, ...)",
            ("request", "error"),
        )
        self.append_seconds = EventHistogram(
            "kgo_state_topic_append_latency_seconds",
            "Time to append one batch of records to the state topic (one transaction)",
            _LATENCY_BUCKETS,
        )
        self.append_records = EventCounter(
            "kgo_state_topic_appended_records", "Records appended to the state topic"
        )
        self.load_seconds = EventHistogram(
            "kgo_state_partition_load_seconds",
            "Time to load state partitions (one observation per load, which may cover many)",
            _LOAD_BUCKETS,
        )
        self.rebalances = EventCounter(
            "kgo_rebalances",
            "Rebalances started: a group left Stable (or Empty) for Assigning or Reconciling",
        )
        self.rebalance_seconds = EventHistogram(
            "kgo_rebalance_duration_seconds",
            "Time from a group leaving a steady state to the heartbeat that found it steady",
            _REBALANCE_BUCKETS,
        )
        # Every instrument exported; one added elsewhere (e.g. by the offset mirror) is
        # appended to one of these lists.
        self.counters = [self.heartbeats, self.commits, self.append_records, self.rebalances]
        self.labelled_counters = [self.failed]
        self.histograms = [
            self.heartbeat_seconds,
            self.commit_seconds,
            self.append_seconds,
            self.load_seconds,
            self.rebalance_seconds,
        ]
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(InstrumentCollector(self))
        self.collectors_added = False
        # group id -> time.monotonic() its current rebalance was first seen
        self.rebalancing: dict[str, float] = {}
        # (topic, partition) -> its log-end history
        self.log_end_history: dict[tuple[str, int], LogEndHistory] = {}

    # Hot path: called once per request or per write (a steady heartbeat calls none of them).

    def group_seen(self, group_id: str, group_state: str | None) -> None:
        """The group's state after a heartbeat that got a new assignment, or any heartbeat
        while a rebalance is under way (``rebalancing``). A rebalance starts and ends with
        states seen so: the request that joins or leaves is a heartbeat, a rebalance hands
        someone a new assignment, and every member heartbeats while it reconciles."""
        if group_state in _REBALANCING:
            if group_id not in self.rebalancing:
                self.rebalancing[group_id] = time.monotonic()
                self.rebalances.inc()
        elif self.rebalancing:
            started = self.rebalancing.pop(group_id, None)
            if started is not None:
                self.rebalance_seconds.observe(time.monotonic() - started)

    def commit_acknowledged(self, seconds: float) -> None:
        self.commits.inc()
        self.commit_seconds.observe(seconds)

    def request_failed(self, request: str, error: BaseException) -> None:
        name = error.name if isinstance(error, errors.CoordinatorError) else type(error).__name__
        self.failed.inc(request, name)

    def appended(self, records: int, seconds: float) -> None:
        self.append_records.inc(records)
        self.append_seconds.observe(seconds)

    # Background: log ends are read every metadata interval, never on a request.

    def log_end_read(self, tp: tuple[str, int], offset: int, at_s: float) -> None:
        history = self.log_end_history.get(tp)
        if history is None:
            history = self.log_end_history[tp] = LogEndHistory()
        history.add(offset, at_s)

    def forget_stale_histories(self) -> None:
        forget_before = time.monotonic() - _HISTORY_FORGET_S
        for tp, history in list(self.log_end_history.items()):
            if history.fed_at < forget_before:
                del self.log_end_history[tp]


class Observed(Protocol):
    """What the scrape-time collectors read of the coordinator runtime, handed to them by
    ``registry_for``: the runtime imports this module for its instruments, not the reverse."""

    @property
    def metrics(self) -> RuntimeMetrics: ...

    @property
    def mirror(self) -> mirror.OffsetMirror: ...

    def loaded_shards(self) -> list[shard.CoordinatorShard]: ...

    def partition_states(self) -> dict[str, int]: ...

    def log_end(self, tp: tuple[str, int]) -> int | None: ...


def registry_for(runtime: Observed, cluster_name: str) -> CollectorRegistry:
    """The runtime's registry with the scrape-time collectors added (once per runtime)."""
    metrics = runtime.metrics
    if not metrics.collectors_added:
        metrics.registry.register(LagCollector(runtime, cluster_name))
        metrics.registry.register(CoordinatorCollector(runtime))
        metrics.registry.register(MirrorCollector(runtime))
        metrics.collectors_added = True
    return metrics.registry


class LagCollector(Collector):
    """kafka-lag-exporter's consumer-group metrics from the coordinator's memory."""

    def __init__(self, runtime: Observed, cluster_name: str) -> None:
        self._runtime = runtime
        self._cluster = cluster_name

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        offset, lag, lag_seconds, max_lag, max_lag_seconds, sum_lag, topic_sum = families
        cluster = self._cluster
        runtime = self._runtime
        now_s = time.time()
        histories = runtime.metrics.log_end_history
        for loaded in runtime.loaded_shards():
            for group_id in loaded.list_groups():
                snapshot = _group_snapshot(loaded, group_id)
                if snapshot is None:
                    continue
                owners, committed = snapshot
                group_max: float = 0.0
                group_max_seconds = math.nan
                group_sum: float = 0.0
                per_topic: dict[str, float] = {}
                for (topic, partition), position in sorted(committed.items()):
                    host, consumer_id, client_id = owners.get((topic, partition), ("", "", ""))
                    labels = [
                        cluster,
                        group_id,
                        topic,
                        str(partition),
                        host,
                        consumer_id,
                        client_id,
                    ]
                    offset.add_metric(labels, position)
                    end = runtime.log_end((topic, partition))
                    if end is None:
                        continue  # not read yet: asking starts the reads
                    partition_lag = max(0, end - position)
                    lag.add_metric(labels, partition_lag)
                    history = histories.get((topic, partition))
                    seconds = (
                        history.lag_seconds(position, now_s) if history is not None else math.nan
                    )
                    lag_seconds.add_metric(labels, seconds)
                    group_max = max(group_max, partition_lag)
                    group_sum += partition_lag
                    per_topic[topic] = per_topic.get(topic, 0) + partition_lag
                    if not math.isnan(seconds):
                        group_max_seconds = (
                            seconds
                            if math.isnan(group_max_seconds)
                            else max(group_max_seconds, seconds)
                        )
                max_lag.add_metric([cluster, group_id], group_max)
                max_lag_seconds.add_metric([cluster, group_id], group_max_seconds)
                sum_lag.add_metric([cluster, group_id], group_sum)
                for topic, total in sorted(per_topic.items()):
                    topic_sum.add_metric([cluster, group_id, topic], total)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        def gauge(name: str, documentation: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=list(labels))

        return [
            gauge(
                "kafka_consumergroup_group_offset",
                "Last group consumed offset of a partition",
                GROUP_PARTITION_LABELS,
            ),
            gauge(
                "kafka_consumergroup_group_lag",
                "Group offset lag of a partition",
                GROUP_PARTITION_LABELS,
            ),
            gauge(
                "kafka_consumergroup_group_lag_seconds",
                "Group time lag of a partition",
                GROUP_PARTITION_LABELS,
            ),
            gauge("kafka_consumergroup_group_max_lag", "Max group offset lag", GROUP_LABELS),
            gauge("kafka_consumergroup_group_max_lag_seconds", "Max group time lag", GROUP_LABELS),
            gauge("kafka_consumergroup_group_sum_lag", "Sum of group offset lag", GROUP_LABELS),
            gauge(
                "kafka_consumergroup_group_topic_sum_lag",
                "Sum of group offset lag across topic partitions",
                GROUP_TOPIC_LABELS,
            ),
        ]


def _group_snapshot(
    state: shard.CoordinatorShard, group_id: str
) -> tuple[dict[tuple[str, int], tuple[str, str, str]], dict[tuple[str, int], int]] | None:
    """Who owns each partition (host, member id, client id) and the committed offsets."""
    try:
        description = state.describe_group(group_id)
        fetched = state.fetch_offsets(messages.OffsetFetchRequest(group_id))
    except errors.CoordinatorError:
        return None  # expired between list and read
    owners: dict[tuple[str, int], tuple[str, str, str]] = {}
    for member in description.members:
        for topic, partitions in member.assignment.items():
            for partition in partitions:
                owners[(topic, partition)] = (
                    member.client_host,
                    member.member_id,
                    member.client_id,
                )
    committed = {tp: value.offset for tp, value in fetched.offsets.items()}
    return owners, committed


class CoordinatorCollector(Collector):
    """Groups and members by state and state partitions by state, read at scrape time."""

    def __init__(self, runtime: Observed) -> None:
        self._runtime = runtime

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        groups, members, partitions, known = self._families()
        group_counts: collections.Counter[str] = collections.Counter()
        member_counts: collections.Counter[str] = collections.Counter()
        runtime = self._runtime
        for loaded in runtime.loaded_shards():
            for group_id in loaded.list_groups():
                try:
                    description = loaded.describe_group(group_id)
                except errors.CoordinatorError:
                    continue
                group_counts[description.state] += 1
                for member in description.members:
                    member_counts[member.state] += 1
        for state, count in sorted(group_counts.items()):
            groups.add_metric([state], count)
        for state, count in sorted(member_counts.items()):
            members.add_metric([state], count)
        for state, count in sorted(runtime.partition_states().items()):
            partitions.add_metric([state], count)
        known.add_metric([], len(runtime.metrics.log_end_history))
        return [groups, members, partitions, known]

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily
    ]:
        return (
            GaugeMetricFamily("kgo_groups", "Consumer groups by state", labels=["state"]),
            GaugeMetricFamily("kgo_members", "Group members by state", labels=["state"]),
            GaugeMetricFamily(
                "kgo_state_partitions",
                "State-topic partitions of this coordinator by state",
                labels=["state"],
            ),
            GaugeMetricFamily(
                "kgo_log_end_histories",
                "Partitions whose log-end history is kept for lag in seconds",
            ),
        )


class MirrorCollector(Collector):
    """The offset mirror into the brokers' native groups, per group, read at scrape time.

    A failing mirror never fails a commit, so these are where an alert sees it: ``mirrored``
    drops to 0, ``behind`` counts the partitions the native group lags on, and ``failures``
    the consecutive failed attempts.
    """

    def __init__(self, runtime: Observed) -> None:
        self._runtime = runtime

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        mirrored, behind, failures = self._families()
        for group_id, status in sorted(self._runtime.mirror.statuses().items()):
            labels = [group_id, status.reason.value]
            mirrored.add_metric(labels, 1 if status.mirrored else 0)
            behind.add_metric(labels, status.behind)
            failures.add_metric(labels, status.failures)
        return [mirrored, behind, failures]

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        labels = ["group", "reason"]
        return (
            GaugeMetricFamily(
                "kgo_offsets_mirrored",
                "1 when the brokers' native group carries every committed offset",
                labels=labels,
            ),
            GaugeMetricFamily(
                "kgo_offsets_mirror_behind_partitions",
                "Partitions whose committed offset the native group does not carry yet",
                labels=labels,
            ),
            GaugeMetricFamily(
                "kgo_offsets_mirror_failures",
                "Consecutive failed attempts to mirror the group's offsets",
                labels=labels,
            ),
        )
