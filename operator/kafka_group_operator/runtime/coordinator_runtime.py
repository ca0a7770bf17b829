"""The asyncio runtime around the sans-IO coordinator: one shard per state-topic partition.

Every write follows one path, as in Kafka's ``CoordinatorRuntime``: the shard's handler
validates the request against the current state and returns records plus a response; the
records are appended to the partition (one transaction, ``acks=all``, see ``writer``); once
committed they are replayed into the shard, and only then is the response released. Nothing
is ever replied before it is durable. A request whose handler or record encoding fails (a
string that is not valid Unicode, a bug) fails alone; the partition goes on serving.

Each partition has one serial queue, so a handler always sees the state left by the previous
write. Offset commits are the exception that makes throughput: commits queued together are
validated against the same state (a commit changes nothing a commit is validated against),
produced as one batch and replayed in order; if the batch is not acknowledged every one of
them fails with a retriable error and none is replayed.

A KIP-848 heartbeat may skip the queue: when nothing of its group, and nothing over the
whole partition (timers, topic metadata), is queued or being appended, the shard holds every
record its answer can depend on, all committed, so its handler runs at once; an answer that
writes nothing (a steady heartbeat) is given then, and one that writes takes its turn in the
queue (the handler runs again there). Without this, steady heartbeats waited behind other
groups' commits (a transaction or two) and split the commits queued around them into
separate transactions. A heartbeat of a group with a write queued or in flight waits for
it, as in Kafka, whose runtime defers such an answer until what was written before it is
committed.

Classic groups park requests: a JoinGroup waits for the rest of the group, a SyncGroup for the
leader's assignment (Kafka's join and sync barriers). Their handler answers
``result.Deferred``; the runtime keeps the caller's future by its key and moves on to the next
write, so a parked request never holds up the partition's queue. A later write (another
member's request, a timer) carries a ``result.Completion`` for the key, which answers it once
that write's records are durable and replayed, like any answer. A partition that stops,
reloads or is given up answers its parked requests with the same retriable error as its
queued ones; a caller that goes away (its connection closed) leaves nothing behind. Soft
records (the part of classic groups Kafka keeps in memory) are replayed right after a write's
records, never written.

A write whose fate is unknown (the brokers did not acknowledge it in time) is never
acknowledged; it leaves the log and memory possibly apart, so that partition is reloaded from
the log (unless the writer finds that another coordinator took it meanwhile, see ``writer``);
meanwhile its groups answer ``COORDINATOR_LOAD_IN_PROGRESS``, exactly as while the runtime
starts. Reads (fetch, describe)
are served from memory, which only ever holds durable state.

Split brain is prevented by the brokers: each partition's writer writes with transactional
producers whose transactional ids name the topic and partition (``writer``), so a second
coordinator's load fences this one's writer (Kafka's zombie fencing). A fenced partition
stops at once: what is queued or in flight fails, every later request for its groups
answers ``NOT_COORDINATOR`` (a warning says so once), and that tenure's writer never writes
again (a partition under a Lease may be taken again by a new writer: see below). Requests
that write nothing (heartbeats that change nothing, fetch, describe) cannot discover a fence
by themselves, so a partition that answered them and has had no committed write for
``fence_check_interval_ms`` writes a marker (never replayed; on the writer's lane 0, the one
that decides who holds the partition) to check it still holds the partition: a fenced
coordinator answers such requests for about that long at most.

Timers call the shard's ``on_timer`` at its ``next_deadline_ms`` (session and rebalance
timeouts, offsets retention) and at least every ``timer_interval_ms``; broker metadata of
the cluster's topics is polled and fed to every shard through ``update_topics``. Log-end
offsets for group lag are refreshed in the background too, so a describe never waits for the
brokers: lag is computed from the cached log ends, whose age is reported with it. A log end
is the last stable offset (ListOffsets read committed): the end a ``read_committed`` consumer
can reach, so records of a transaction still open are not counted as lag yet (its high
watermark, which ``kafka-consumer-groups`` shows, counts them).

A runtime may serve only a set of the topic's partitions (``RuntimeConfig.served_partitions``),
so that several coordinators split one state topic: it loads and writes only those, with the
same per-partition fencing, and answers ``NOT_COORDINATOR`` for the groups of any other.

The set may also change while the runtime runs, as partition Leases come and go (the
elector calls ``acquire`` and ``release``). Taking a partition is Kafka's takeover: a fresh
writer's first append (the load marker) runs ``init_transactions`` on the partition's
transactional ids, fencing whoever wrote it before; the partition answers
``COORDINATOR_LOAD_IN_PROGRESS`` until its load ends, then serves. Each tenure of a partition
has a writer of its own, because a writer's fencing is sticky: a partition lost and taken back
needs a producer that was never fenced. Giving a partition up stops it at once: what is queued
fails, what is in flight is answered ``NOT_COORDINATOR`` when it returns (even if the brokers
committed it: a retry at the new coordinator finds it there), and so is every later request.
``lease_check`` (the elector's ``holds``) is asked before anything of a partition is
acknowledged: a coordinator whose Lease may have expired acknowledges nothing, whatever the
latency of the callbacks that would have told it. A partition fenced while its Lease is still
held here is taken again (after ``_RETAKE_DELAY_S``, if the Lease is still held then): only
one holder's Lease is valid at a time, so the fence came from an earlier holder whose writer
was still starting when it gave the partition up, and finished after this one's. The new
writer fences that late one. A fence that keeps coming back under the same Lease is a second
writer of the topic, not a late one: each further retake waits twice as long, up to 30 s.
Without a Lease (fixed partitions), a fence is final.

``mirror`` copies each configured group's committed offsets into the brokers' own group of
the same id, from memory and in the background (see ``mirror``): the write path does not
know about it.

``unhealthy_partitions`` names partitions that cannot serve until the process restarts: a
task that died, or a load that failed for good. A fenced partition is not among them: a
restart would only fence the other coordinator back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import IsolationLevel, KafkaException, TopicCollection
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, not in __all__
    AdminClient,
    OffsetSpec,
)

from kafka_group_operator.assignors import api as assignors_api
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import errors, messages, result, shard
from kafka_group_operator.runtime import errors as runtime_errors
from kafka_group_operator.runtime import loader, mirror, topic, writer
from kafka_group_operator.runtime import metrics as runtime_metrics
from kafka_group_records import codec, partitioning, records

logger = logging.getLogger(__name__)

T = TypeVar("T")

_MIN_TIMER_GAP_MS = 10
_RELOAD_GATHER_S = 0.1
# Partitions taken within this long of each other are loaded by one writer and one reader.
_ACQUIRE_GATHER_S = 0.05
# How long a partition fenced under a Lease still held waits before it is taken again: a
# Lease about to be lost is then seen lost, and a late writer has finished starting. Each
# further retake under the same Lease waits twice as long, up to ``_RETAKE_MAX_DELAY_S``: a
# fence that keeps coming back is not a late writer but a second writer of the same topic
# (two deployments sharing one state topic), and the two must not take turns forever.
_RETAKE_DELAY_S = 0.5
_RETAKE_MAX_DELAY_S = 30.0
# Log ends are refreshed at most this often when describes ask for unknown ones.
_LOG_END_MIN_GAP_S = 0.2
# A topic-partition no describe asked about for this long is no longer refreshed.
_LOG_END_FORGET_S = 600.0
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]
# Kafka's UNKNOWN_SERVER_ERROR: what a ListOffsets partition gets for a client-side failure.
_UNKNOWN_SERVER_ERROR = -1


def _offset_spec(timestamp: int) -> Any:
    if timestamp == messages.LATEST_TIMESTAMP:
        return _LATEST
    if timestamp == messages.EARLIEST_TIMESTAMP:
        return OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    if timestamp == messages.MAX_TIMESTAMP:
        return OffsetSpec.max_timestamp()  # type: ignore[no-untyped-call]
    return OffsetSpec.for_timestamp(timestamp)


def _broker_error_code(error: KafkaException) -> int:
    """Kafka's error code of a broker's answer; librdkafka's own (negative) codes are
    failures of the client, reported as UNKNOWN_SERVER_ERROR."""
    code = error.args[0].code() if error.args else _UNKNOWN_SERVER_ERROR
    return code if isinstance(code, int) and code > 0 else _UNKNOWN_SERVER_ERROR


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class RuntimeConfig:
    bootstrap_servers: str
    topic: str = "kafka-group-operator.group-state"
    partitions: int = 50
    replication_factor: int = 1
    min_insync_replicas: int = 1
    # Extra librdkafka settings (TLS, SASL, ...) for every client of the runtime.
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    # Kafka's offsets.commit.timeout.ms: how long a write may wait for acknowledgement.
    write_timeout_ms: int = 5_000
    # The shard's timers run at their deadlines and at least this often.
    timer_interval_ms: int = 5_000
    metadata_interval_ms: int = 5_000
    admin_timeout_s: float = 10.0
    # start() returns only after every partition is loaded.
    wait_until_loaded: bool = True
    assignors: Mapping[str, assignors_api.PartitionAssignor] | None = None
    clock_ms: Callable[[], int] = wall_clock_ms
    # Compaction checkpoints (a local directory or file:// URI of one checkpoint or of the
    # scheduled runs' ``checkpoint-*`` directories): loads start from the newest usable one.
    checkpoint_uri: str | None = None
    # A partition that answered requests without a committed write for this long checks
    # that no other coordinator has fenced its writer (see the module's docstring).
    fence_check_interval_ms: int = 1_000
    # The state partitions this runtime serves (None: every one). Groups of the others are
    # answered NOT_COORDINATOR: another coordinator serves them.
    served_partitions: frozenset[int] | None = None
    # Broker-level group settings (Kafka's GroupCoordinatorConfig): session timeout bounds,
    # the initial rebalance delay of classic groups, the migration policy.
    coordinator: coordinator_config.CoordinatorConfig = coordinator_config.DEFAULT

    def served(self) -> list[int]:
        """The state partitions served, in order; ValueError for one outside the topic."""
        if self.served_partitions is None:
            return list(range(self.partitions))
        outside = sorted(p for p in self.served_partitions if not 0 <= p < self.partitions)
        if outside:
            raise ValueError(
                f"state partitions {outside} are outside the topic's 0-{self.partitions - 1}"
            )
        return sorted(self.served_partitions)


class PartitionState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    # Another coordinator's writer fenced this one's: the partition is theirs.
    FENCED = "fenced"
    STOPPED = "stopped"
    # Outside this runtime's partition set: another coordinator serves it.
    NOT_SERVED = "not-served"


@dataclass(eq=False)
class _Write:
    """A queued write: the handler to run against the shard, and who awaits its response."""

    handler: Callable[[shard.CoordinatorShard, int], result.Result[Any]]
    future: asyncio.Future[Any]
    batchable: bool
    # The group it writes for; None for a write over the whole partition (timers, topics).
    group_id: str | None = None


@dataclass(eq=False)
class _Tenure:
    """A writer and its loader, serving the partitions taken together (a takeover, a start)."""

    writer: writer.StateWriter
    loader: loader.PartitionLoader
    partitions: set[int] = field(default_factory=set)


@dataclass(eq=False)
class _Partition:
    index: int
    state: PartitionState = PartitionState.LOADING
    # The tenure serving the partition now (None while not served): a write, load or fence
    # check that started under another tenure changes nothing when it returns.
    tenure: _Tenure | None = None
    shard: shard.CoordinatorShard | None = None
    pending: collections.deque[_Write] = field(default_factory=collections.deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    timer_changed: asyncio.Event = field(default_factory=asyncio.Event)
    # When the timer task wakes next; a write that arms an earlier deadline wakes it sooner.
    timer_due_ms: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Set when a request was answered; the fence check clears it.
    served: asyncio.Event = field(default_factory=asyncio.Event)
    # time.monotonic() when a write was last known to be committed by this writer.
    confirmed_at: float = 0.0
    # Times taken again after a fence under a Lease still held, since the Lease was taken.
    retakes: int = 0
    # Set while the partition is not loading: what a request met by a load may wait for.
    not_loading: asyncio.Event = field(default_factory=asyncio.Event)
    # Writes in the queue by group (None: over the whole partition), and the groups of the
    # batch being appended: a heartbeat may skip the queue only when its group has neither.
    queued: collections.Counter[str | None] = field(default_factory=collections.Counter)
    in_flight: frozenset[str | None] = frozenset()
    # Parked classic requests (a JoinGroup or SyncGroup at a barrier), by key.
    parked: dict[result.DeferredKey, asyncio.Future[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.enter(self.state)

    def enter(self, state: PartitionState) -> None:
        self.state = state
        if state is PartitionState.LOADING:
            self.not_loading.clear()
        else:
            self.not_loading.set()


@dataclass(frozen=True)
class GroupLag:
    """Lag per partition the group committed, from log ends cached ``log_end_age_ms`` ago
    (the oldest one used; None when no log end is known yet)."""

    lag: dict[tuple[str, int], int]
    log_end_age_ms: int | None


class CoordinatorRuntime:
    """Runs the coordinator shards on the state topic; the API and handlers call this."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self._settings = topic.TopicSettings(
            config.topic, config.partitions, config.replication_factor, config.min_insync_replicas
        )
        self._admin_config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": config.bootstrap_servers,
            **config.kafka_config,
        }
        self._served = config.served()
        self._admin: AdminClient | None = None
        self._writer = writer.StateWriter(
            config.bootstrap_servers,
            config.topic,
            timeout_ms=config.write_timeout_ms,
            kafka_config=config.kafka_config,
        )
        self._loader = self._new_loader(self._writer)
        # The tenure of the partitions served from the start.
        self._first = _Tenure(self._writer, self._loader)
        # Writers of tenures begun since; each is stopped when its last partition goes.
        self._tenures: set[_Tenure] = set()
        self._to_acquire: set[int] = set()
        # Whether this process may still acknowledge anything of a partition (the elector's
        # ``holds``, set by whoever runs one); None: always (fixed partition sets).
        self.lease_check: Callable[[int], bool] | None = None
        # Whether a partition whose Lease ``lease_check`` denies was given up by choice.
        self.lease_given_up: Callable[[int], bool] | None = None
        self._partitions: list[_Partition] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._topics: dict[str, messages.TopicInfo] = {}
        self._topic_ids: dict[str, str | None] = {}
        self._all_loaded: asyncio.Event | None = None
        self._stopped = False
        # Java's String.hashCode in Python is slow enough to matter on every request.
        self._partition_of: dict[str, int] = {}
        self._to_reload: set[int] = set()
        # (topic, partition) -> (log-end offset, time.monotonic() it was read)
        self._log_ends: dict[tuple[str, int], tuple[int, float]] = {}
        # (topic, partition) -> time.monotonic() a describe last asked for it
        self._log_ends_wanted: dict[tuple[str, int], float] = {}
        self._log_ends_asked = asyncio.Event()
        # Counters and histograms updated as requests are served; gauges are read at scrape
        # time from memory (runtime.metrics.registry_for).
        self.metrics = runtime_metrics.RuntimeMetrics()
        # Groups' offsets mirrored into the brokers' own groups (the operator configures it).
        self.mirror = mirror.OffsetMirror(self.committed_offsets)

    def _new_writer(self) -> writer.StateWriter:
        return writer.StateWriter(
            self.config.bootstrap_servers,
            self.config.topic,
            timeout_ms=self.config.write_timeout_ms,
            kafka_config=self.config.kafka_config,
        )

    def _new_loader(self, state_writer: writer.StateWriter) -> loader.PartitionLoader:
        return loader.PartitionLoader(
            bootstrap_servers=self.config.bootstrap_servers,
            topic=self.config.topic,
            state_writer=state_writer,
            kafka_config=self.config.kafka_config,
            clock_ms=self.config.clock_ms,
            partition_count=self.config.partitions,
            checkpoint_uri=self.config.checkpoint_uri,
        )

    # -----------------------------------------------------------------------------------
    # Lifecycle

    async def start(self) -> None:
        """Check or create the topic, then load every partition (awaited unless configured
        otherwise); raises ``runtime.errors.StateTopicError`` when the topic is unusable."""
        self._admin = AdminClient(self._admin_config)
        await asyncio.to_thread(
            topic.ensure_state_topic, self._admin, self._settings, self.config.admin_timeout_s
        )
        self._writer.start()
        with contextlib.suppress(KafkaException, runtime_errors.StateTopicError):
            await self._refresh_topics()
        self._all_loaded = asyncio.Event()
        served = set(self._served)
        self._partitions = [
            _Partition(
                index, PartitionState.LOADING if index in served else PartitionState.NOT_SERVED
            )
            for index in range(self.config.partitions)
        ]
        for partition in self._partitions:
            if partition.state is PartitionState.NOT_SERVED:
                continue
            partition.tenure = self._first
            self._first.partitions.add(partition.index)
            self._start_tasks(partition)
        if self._served:
            self._spawn(self._load(list(self._served)))
        else:
            self._all_loaded_check()  # nothing to load
        self._spawn(self._poll_metadata())
        self._spawn(self._refresh_log_ends())
        if self.config.wait_until_loaded:
            await self.wait_until_loaded()

    def _start_tasks(self, partition: _Partition) -> None:
        if partition.tasks:
            return
        partition.tasks = [
            asyncio.create_task(self._serve(partition), name=f"state-{partition.index}"),
            asyncio.create_task(self._tick(partition), name=f"timer-{partition.index}"),
            asyncio.create_task(
                self._check_fence(partition), name=f"fence-check-{partition.index}"
            ),
        ]
        for task in partition.tasks:
            task.add_done_callback(_report_death)

    async def wait_until_loaded(self) -> None:
        assert self._all_loaded is not None, "start() first"
        await self._all_loaded.wait()

    async def stop(self) -> None:
        self._stopped = True
        for partition in self._partitions:
            partition.enter(PartitionState.STOPPED)
            self._fail_pending(partition, errors.CoordinatorNotAvailable("coordinator stopped"))
        await self.mirror.stop()
        tasks = [*self._tasks, *(t for p in self._partitions for t in p.tasks)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        writers = [self._writer, *(tenure.writer for tenure in self._tenures)]
        self._tenures.clear()
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in writers))
        self._tasks.clear()
        # confluent-kafka clients have no close(): dropping the last reference destroys the
        # client, which otherwise keeps reconnecting to a broker that may be gone.
        self._admin = None

    @property
    def served_partitions(self) -> list[int]:
        """The state partitions this runtime serves (when not fenced), in order: its fixed
        set, or those it holds now (loading or serving) when its set changes at run time."""
        if not self._partitions:
            return list(self._served)
        return [
            p.index
            for p in self._partitions
            if p.state not in (PartitionState.NOT_SERVED, PartitionState.STOPPED)
        ]

    def loading(self, index: int) -> bool:
        """Whether state partition ``index`` is being taken here: its new writer fencing the
        previous one, or its state loading. May be called from another thread."""
        if not self._partitions:
            return False
        return self._partitions[index].state is PartitionState.LOADING

    def serving(self, index: int) -> bool:
        """Whether state partition ``index`` is taken here (loading or serving)."""
        if not self._partitions:
            return index in self._served
        return self._partitions[index].state in (PartitionState.LOADING, PartitionState.ACTIVE)

    # -----------------------------------------------------------------------------------
    # Partitions taken and given up at run time (Leases)

    def acquire(self, index: int) -> None:
        """Start serving state partition ``index``: fence its previous writer, load, serve.

        Returns at once (the elector waits for its callbacks); the partition answers
        ``COORDINATOR_LOAD_IN_PROGRESS`` until loaded. Partitions taken together are loaded
        together, by one new writer and one reader. Taking one already served does nothing.
        """
        if self._stopped or not self._partitions:
            raise RuntimeError("the runtime is not running")
        partition = self._partitions[index]
        if partition.state in (PartitionState.LOADING, PartitionState.ACTIVE):
            return
        self._detach(partition)
        partition.enter(PartitionState.LOADING)
        partition.shard = None
        self._start_tasks(partition)
        if not self._to_acquire:
            self._spawn(self._acquire_soon())
        self._to_acquire.add(index)
        logger.info("taking state partition %d", index)

    def release(
        self, index: int, reason: str = "its lease was lost", *, voluntary: bool = False
    ) -> None:
        """Stop serving state partition ``index`` at once: everything queued or in flight
        is answered ``NOT_COORDINATOR``, and so is every later request for its groups.
        ``voluntary``: given up by choice (a handover), logged at INFO; else at WARNING."""
        if not self._partitions:
            return
        partition = self._partitions[index]
        if partition.state in (PartitionState.NOT_SERVED, PartitionState.STOPPED):
            return
        self._detach(partition)
        partition.enter(PartitionState.NOT_SERVED)
        partition.shard = None
        partition.retakes = 0  # the next Lease starts afresh
        self._to_acquire.discard(index)
        self._to_reload.discard(index)
        self._fail_pending(partition, _released(index))
        logger.log(
            logging.INFO if voluntary else logging.WARNING,
            "stopped serving state partition %d: %s",
            index,
            reason,
        )
        self._all_loaded_check()

    def _detach(self, partition: _Partition) -> None:
        """End the partition's tenure; the last partition of a tenure stops its writer."""
        tenure, partition.tenure = partition.tenure, None
        if tenure is None:
            return
        tenure.partitions.discard(partition.index)
        if not tenure.partitions and tenure in self._tenures:
            self._tenures.discard(tenure)
            # In a thread: closing producers may wait for the brokers.
            self._spawn(asyncio.to_thread(tenure.writer.stop, 2.0))

    async def _acquire_soon(self) -> None:
        await asyncio.sleep(_ACQUIRE_GATHER_S)
        indexes, self._to_acquire = sorted(self._to_acquire), set()
        indexes = [
            i
            for i in indexes
            if self._partitions[i].state is PartitionState.LOADING
            and self._partitions[i].tenure is None
        ]
        if not indexes or self._stopped:
            return
        state_writer = self._new_writer()
        state_writer.start()
        tenure = _Tenure(state_writer, self._new_loader(state_writer), set(indexes))
        self._tenures.add(tenure)
        for index in indexes:
            self._partitions[index].tenure = tenure
        await self._load(indexes)

    def _lease_held(self, index: int) -> bool:
        check = self.lease_check
        return check is None or check(index)

    def partition_state(self, group_id: str) -> PartitionState:
        return self._partitions[self.partition_of(group_id)].state

    def unhealthy_partitions(self) -> list[int]:
        """State partitions that cannot serve until the process restarts: one of their tasks
        died, or their load failed for good. Fenced partitions are not unhealthy (see the
        module's docstring); a stopped runtime has none."""
        if self._stopped:
            return []
        return [
            partition.index
            for partition in self._partitions
            if partition.state is PartitionState.FAILED
            or any(task.done() for task in partition.tasks)
        ]

    def partition_of(self, group_id: str) -> int:
        index = self._partition_of.get(group_id)
        if index is None:
            index = partitioning.partition_for(group_id, self.config.partitions)
            if len(self._partition_of) >= 100_000:
                self._partition_of.clear()
            self._partition_of[group_id] = index
        return index

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -----------------------------------------------------------------------------------
    # Requests

    async def heartbeat(self, request: messages.HeartbeatRequest) -> messages.HeartbeatResponse:
        metrics = self.metrics
        heartbeats = metrics.heartbeats
        # Counted every time, timed one time in HEARTBEAT_TIMED_ONE_IN: two clock reads and
        # a histogram observation would cost a steady heartbeat a few percent.
        started = (
            time.perf_counter()
            if not heartbeats.value % runtime_metrics.HEARTBEAT_TIMED_ONE_IN
            else None
        )
        try:
            response: messages.HeartbeatResponse = await self._write(
                request.group_id,
                lambda s, now: s.heartbeat(request, now),
                skip_queue_if_unwritten=True,
            )
        except Exception as error:
            metrics.request_failed("heartbeat", error)
            raise
        self._heartbeat_answered(request, response, started)
        return response

    def heartbeat_now(
        self, request: messages.HeartbeatRequest
    ) -> messages.HeartbeatResponse | None:
        """``heartbeat``'s answer when it needs no wait: nothing of the group (nor of the whole
        partition) is queued or being appended, and the answer writes nothing (a steady
        heartbeat). ``None`` otherwise, and nothing is done: ``heartbeat`` serves it then (its
        handler runs again: handlers change nothing). A front door answers a steady heartbeat
        with it from the callback that read the request, without a task."""
        metrics = self.metrics
        started = (
            time.perf_counter()
            if not metrics.heartbeats.value % runtime_metrics.HEARTBEAT_TIMED_ONE_IN
            else None
        )
        group_id = request.group_id
        try:
            partition = self._partitions[self._active_shard_index(group_id)]
            outcome = self._unwritten_outcome(
                partition, group_id, lambda s, now: s.heartbeat(request, now)
            )
        except Exception as error:
            metrics.request_failed("heartbeat", error)
            raise
        if outcome is None:
            return None
        response: messages.HeartbeatResponse = outcome.response
        self._heartbeat_answered(request, response, started)
        return response

    def _heartbeat_answered(
        self,
        request: messages.HeartbeatRequest,
        response: messages.HeartbeatResponse,
        started: float | None,
    ) -> None:
        metrics = self.metrics
        metrics.heartbeats.value += 1
        if started is not None:
            metrics.heartbeat_seconds.observe(time.perf_counter() - started)
        # A steady heartbeat (no new assignment, no rebalance under way) skips the state look-up.
        if response.assignment is not None or metrics.rebalancing:
            metrics.group_seen(request.group_id, self._group_state(request.group_id))

    # Classic-protocol members. Every request goes through the partition's queue: answered
    # only while the partition is served. A classic group's JoinGroup and SyncGroup may be
    # parked there (see the module docstring).

    async def classic_join(
        self, request: messages.ClassicJoinRequest
    ) -> messages.ClassicJoinResponse:
        response: messages.ClassicJoinResponse = await self._write(
            request.group_id, lambda s, now: s.classic_join(request, now)
        )
        return response

    async def classic_sync(
        self, request: messages.ClassicSyncRequest
    ) -> messages.ClassicSyncResponse:
        response: messages.ClassicSyncResponse = await self._write(
            request.group_id, lambda s, now: s.classic_sync(request, now)
        )
        return response

    async def classic_heartbeat(
        self, request: messages.ClassicHeartbeatRequest
    ) -> messages.ClassicHeartbeatResponse:
        heartbeats = self.metrics.heartbeats
        started = (
            time.perf_counter()
            if not heartbeats.value % runtime_metrics.HEARTBEAT_TIMED_ONE_IN
            else None
        )
        try:
            response: messages.ClassicHeartbeatResponse = await self._write(
                request.group_id, lambda s, now: s.classic_heartbeat(request, now)
            )
        except Exception as error:
            self.metrics.request_failed("heartbeat", error)
            raise
        heartbeats.value += 1
        if started is not None:
            self.metrics.heartbeat_seconds.observe(time.perf_counter() - started)
        self.metrics.group_seen(request.group_id, self._group_state(request.group_id))
        return response

    async def classic_leave(
        self, request: messages.ClassicLeaveRequest
    ) -> messages.ClassicLeaveResponse:
        response: messages.ClassicLeaveResponse = await self._write(
            request.group_id, lambda s, now: s.classic_leave(request, now)
        )
        return response

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse:
        started = time.perf_counter()
        try:
            response: messages.OffsetCommitResponse = await self._write(
                request.group_id, lambda s, now: s.commit_offsets(request, now), batchable=True
            )
        except Exception as error:
            self.metrics.request_failed("offset_commit", error)
            raise
        self.metrics.commit_acknowledged(time.perf_counter() - started)
        return response

    async def delete_offsets(
        self, request: messages.OffsetDeleteRequest
    ) -> messages.OffsetDeleteResponse:
        response: messages.OffsetDeleteResponse = await self._write(
            request.group_id, lambda s, now: s.delete_offsets(request, now)
        )
        return response

    def _group_state(self, group_id: str) -> str | None:
        state = self._partitions[self.partition_of(group_id)].shard
        return None if state is None else state.group_state(group_id)

    async def configure_group(self, settings: messages.GroupSettings) -> None:
        await self._write(settings.group_id, lambda s, now: s.configure_group(settings, now))

    async def remove_members(self, request: messages.RemoveMembersRequest) -> dict[str, str | None]:
        removed: dict[str, str | None] = await self._write(
            request.group_id, lambda s, now: s.remove_members(request, now)
        )
        return removed

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None:
        await self._write(request.group_id, lambda s, now: s.delete_group(request, now))

    async def claim_group(self, request: messages.ClaimGroupRequest) -> messages.GroupOwner:
        """Record ``request.owner`` as the group id's owner unless another resource owns it;
        returns the owner after the claim (durable: it survives restarts)."""
        owner: messages.GroupOwner = await self._write(
            request.group_id, lambda s, now: s.claim_group(request, now)
        )
        return owner

    async def release_group(self, request: messages.ReleaseGroupRequest) -> bool:
        released: bool = await self._write(
            request.group_id, lambda s, now: s.release_group(request, now)
        )
        return released

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None:
        return self._active_shard(group_id).group_owner(group_id)

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse:
        return self._active_shard(request.group_id).fetch_offsets(request)

    def committed_offsets(
        self, group_id: str
    ) -> Mapping[messages.TopicPartition, messages.CommittedOffset]:
        """The group's committed offsets if its partition is served here, else the coordinator
        error saying why. Unlike a fetch, it does not count as a request served (no fence
        check follows): the mirror reads it every interval, and changed offsets can only
        come from writes, which find a fence by themselves."""
        partition = self._partitions[self.partition_of(group_id)] if self._partitions else None
        if partition is None or partition.state is not PartitionState.ACTIVE:
            self._active_shard_index(group_id)  # raises the error that says why
        assert partition is not None
        assert partition.shard is not None
        return partition.shard.fetch_offsets(messages.OffsetFetchRequest(group_id)).offsets

    async def describe_group(self, group_id: str) -> messages.GroupDescription:
        return self._active_shard(group_id).describe_group(group_id, self.config.clock_ms())

    async def list_groups(self) -> list[str]:
        groups = []
        for partition in self._partitions:
            if partition.state is PartitionState.ACTIVE and partition.shard is not None:
                groups.extend(partition.shard.list_groups())
        return sorted(groups)

    def known_topics(self) -> Mapping[str, messages.TopicInfo]:
        """The cluster's topics as last polled: names, partition counts and topic ids."""
        return self._topics

    async def list_offsets(
        self, wanted: Mapping[messages.TopicPartition, int], read_committed: bool
    ) -> dict[messages.TopicPartition, messages.ListedOffset]:
        """The brokers' ListOffsets for each partition's timestamp (or latest, earliest, max
        timestamp), read committed or not: what the Kafka listener answers, for tools that
        ask their group coordinator for log ends (``kafka-consumer-groups --describe``)."""
        admin = self._admin
        if admin is None:
            raise errors.CoordinatorNotAvailable("coordinator stopped")
        specs = {
            KafkaTopicPartition(topic_name, index): _offset_spec(timestamp)
            for (topic_name, index), timestamp in wanted.items()
        }
        isolation = (
            IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
        )
        try:
            futures = admin.list_offsets(
                specs, isolation_level=isolation, request_timeout=self.config.admin_timeout_s
            )
        except KafkaException as error:
            raise errors.CoordinatorNotAvailable(f"cannot list offsets: {error}") from error
        listed: dict[messages.TopicPartition, messages.ListedOffset] = {}
        for partition, future in futures.items():
            tp = (partition.topic, partition.partition)
            try:
                found = await asyncio.wrap_future(future)
            except KafkaException as error:
                listed[tp] = messages.ListedOffset(error_code=_broker_error_code(error))
                continue
            listed[tp] = messages.ListedOffset(
                offset=found.offset,
                timestamp=found.timestamp,
                leader_epoch=-1 if found.leader_epoch is None else found.leader_epoch,
            )
        return listed

    async def group_lag(self, group_id: str) -> dict[tuple[str, int], int]:
        """Log-end offset minus committed offset for each partition the group committed whose
        log end is known (see ``group_lag_report``)."""
        return (await self.group_lag_report(group_id)).lag

    async def group_lag_report(self, group_id: str) -> GroupLag:
        """The group's lag from cached log ends, never waiting for the brokers. Log ends not
        cached yet are fetched in the background and missing from this answer."""
        committed = (await self.fetch_offsets(messages.OffsetFetchRequest(group_id))).offsets
        now = time.monotonic()
        lag: dict[tuple[str, int], int] = {}
        oldest: float | None = None
        for tp, offset in committed.items():
            self._log_ends_wanted[tp] = now
            cached = self._log_ends.get(tp)
            if cached is None:
                self._log_ends_asked.set()
                continue
            end, read_at = cached
            lag[tp] = max(0, end - offset.offset)
            oldest = read_at if oldest is None else min(oldest, read_at)
        age = None if oldest is None else max(0, round((now - oldest) * 1000))
        return GroupLag(lag, age)

    async def read_fence(self, group_id: str, all_partitions: bool = False) -> dict[int, int]:
        """A read fence for a job: appends a load marker (never replayed) to the state partition
        of ``group_id`` (``all_partitions``: to every one) through this runtime's writer, and
        returns each marker's offset, the exclusive end a reader must cover. Every write this
        runtime acknowledged before the call lies below it.

        Jobs never write the state topic themselves; this is how they get a fixed end. Every
        partition asked for must be served here (else the retriable error saying why); a
        partition found fenced stops serving, as on any write.
        """
        if self._stopped or not self._partitions:
            raise errors.CoordinatorNotAvailable("the coordinator is not running")
        if all_partitions:
            for index in range(len(self._partitions)):
                self._require_active(index)
            indexes = list(range(len(self._partitions)))
        else:
            indexes = [self._active_shard_index(group_id)]
        offsets = await asyncio.gather(*(self._append_marker(index) for index in indexes))
        return dict(zip(indexes, offsets, strict=True))

    async def read_fence_partitions(self, partitions: Collection[int]) -> dict[int, int]:
        """``read_fence`` over the state partitions ``partitions``: each must be served here
        (else the retriable error saying why, and no marker is appended); ``InvalidRequest``
        for a partition outside the topic or an empty set."""
        if self._stopped or not self._partitions:
            raise errors.CoordinatorNotAvailable("the coordinator is not running")
        indexes = sorted(set(partitions))
        if not indexes or not all(0 <= index < len(self._partitions) for index in indexes):
            raise errors.InvalidRequest(
                f"a read fence needs state partitions in 0-{len(self._partitions) - 1}"
            )
        for index in indexes:
            self._require_active(index)
        offsets = await asyncio.gather(*(self._append_marker(index) for index in indexes))
        return dict(zip(indexes, offsets, strict=True))

    def _require_active(self, index: int) -> None:
        partition = self._partitions[index]
        if partition.state is PartitionState.ACTIVE:
            return
        if partition.state is PartitionState.FENCED:
            raise _not_coordinator(index)
        if partition.state is PartitionState.NOT_SERVED:
            raise _not_served(index)
        if partition.state is PartitionState.LOADING:
            raise errors.CoordinatorLoadInProgress(f"state partition {index} is loading")
        raise errors.CoordinatorNotAvailable(f"state partition {index} is not served")

    async def _append_marker(self, index: int) -> int:
        partition = self._partitions[index]
        tenure = partition.tenure
        assert tenure is not None, "an active partition has a tenure"
        marker = codec.encode_record(
            records.Record(
                records.LoadMarkerKey(),
                records.LoadMarkerValue(
                    tenure.writer.marker_nonce("read-fence"), self.config.clock_ms()
                ),
            )
        )
        started = time.monotonic()
        try:
            offset = await tenure.writer.append(index, [marker])
        except runtime_errors.WriterFenced as error:
            if partition.tenure is tenure:
                self._fence(partition, error, [])
            raise _not_coordinator(index) from error
        except runtime_errors.WriteFailed as error:
            # A marker changes no state: nothing to reload; the caller may ask again.
            raise errors.CoordinatorNotAvailable(
                f"state partition {index}: read fence not written: {error}"
            ) from error
        if partition.tenure is not tenure or not self._lease_held(index):
            # Below the marker lies only what this tenure acknowledged; but the caller must
            # ask the partition's coordinator now.
            raise _released(index)
        partition.confirmed_at = max(partition.confirmed_at, started)
        return offset

    def loaded_shards(self) -> list[shard.CoordinatorShard]:
        """The shards of the partitions served now (for reads at metrics scrape time)."""
        return [
            partition.shard
            for partition in self._partitions
            if partition.state is PartitionState.ACTIVE and partition.shard is not None
        ]

    def partition_states(self) -> dict[str, int]:
        """How many state partitions are in each ``PartitionState`` (by its value)."""
        return dict(collections.Counter(partition.state.value for partition in self._partitions))

    def log_end(self, tp: tuple[str, int]) -> int | None:
        """The cached log-end offset of ``tp``, never waiting for the brokers; asking keeps
        it refreshed in the background (None until first read)."""
        self._log_ends_wanted[tp] = time.monotonic()
        cached = self._log_ends.get(tp)
        if cached is None:
            self._log_ends_asked.set()
            return None
        return cached[0]

    def canonical_state(self) -> dict[int, dict[str, Any]]:
        """Every loaded partition's hard state as plain data, for checks and debugging."""
        return {
            partition.index: partition.shard.canonical_state()
            for partition in self._partitions
            if partition.state is PartitionState.ACTIVE and partition.shard is not None
        }

    def _active_shard(self, group_id: str) -> shard.CoordinatorShard:
        state = self._partitions[self._active_shard_index(group_id)].shard
        assert state is not None
        return state

    async def until_loaded(self, group_id: str, timeout_s: float) -> None:
        """Return once ``group_id``'s partition is not loading here, or after ``timeout_s``.

        For front doors that may hold a request met by a load rather than refuse it at once:
        a member retrying a moving coordinator backs off up to a second between attempts, so
        holding its request until the load ends answers it as soon as the group is served.
        """
        partition = self._partitions[self.partition_of(group_id)] if self._partitions else None
        if partition is None or partition.state is not PartitionState.LOADING:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await partition.not_loading.wait()

    def _active_shard_index(self, group_id: str) -> int:
        """The partition of ``group_id``, or the retriable error explaining why not now."""
        partition = self._partitions[self.partition_of(group_id)] if self._partitions else None
        if partition is not None and partition.state is PartitionState.ACTIVE:
            if not self._lease_held(partition.index):
                raise _released(partition.index)
            partition.served.set()
            return partition.index
        if partition is None or partition.state is PartitionState.STOPPED:
            raise errors.CoordinatorNotAvailable("the coordinator is not running")
        if partition.state is PartitionState.FENCED:
            raise _not_coordinator(partition.index)
        if partition.state is PartitionState.NOT_SERVED:
            raise _not_served(partition.index)
        if partition.state is PartitionState.LOADING:
            raise errors.CoordinatorLoadInProgress(
                f"state partition {partition.index} of group {group_id!r} is loading"
            )
        raise errors.CoordinatorNotAvailable(
            f"state partition {partition.index} of group {group_id!r} failed to load"
        )

    async def _write(
        self,
        group_id: str,
        handler: Callable[[shard.CoordinatorShard, int], result.Result[T]],
        *,
        batchable: bool = False,
        skip_queue_if_unwritten: bool = False,
    ) -> T:
        partition = self._partitions[self._active_shard_index(group_id)]
        if skip_queue_if_unwritten:
            outcome = self._unwritten_outcome(partition, group_id, handler)
            if outcome is not None:
                return outcome.response
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        _enqueue(partition, _Write(handler, future, batchable, group_id))
        return await future

    def _unwritten_outcome(
        self,
        partition: _Partition,
        group_id: str,
        handler: Callable[[shard.CoordinatorShard, int], result.Result[T]],
    ) -> result.Result[T] | None:
        """The handler's outcome at once if it writes nothing and nothing it depends on is
        pending; ``None`` when the request must take its turn in the queue."""
        if not self._quiet(partition, group_id):
            return None
        # Nothing of this group (nor of the whole partition) is queued or being appended,
        # so the shard holds every record of the group the answer depends on, all of them
        # committed: an answer that writes nothing needs no turn in the queue, and does
        # not wait behind other groups' commits. One that writes takes its turn (its
        # handler runs again then: handlers change nothing).
        state = partition.shard
        assert state is not None
        try:
            outcome = handler(state, self.config.clock_ms())
        except errors.CoordinatorError:
            raise
        except Exception as error:
            raise _request_failure(partition.index, error) from None
        self._wake_timer(partition)
        if outcome.records or outcome.soft or outcome.completions:
            return None
        return outcome

    def _quiet(self, partition: _Partition, group_id: str) -> bool:
        return (
            not partition.queued[group_id]
            and not partition.queued[None]
            and group_id not in partition.in_flight
            and None not in partition.in_flight
        )

    # -----------------------------------------------------------------------------------
    # The serial queue of one partition

    async def _serve(self, partition: _Partition) -> None:
        while not self._stopped:
            await partition.wakeup.wait()
            partition.wakeup.clear()
            while partition.pending and partition.state is PartitionState.ACTIVE:
                batch = [_dequeue(partition)]
                if batch[0].batchable:
                    while partition.pending and partition.pending[0].batchable:
                        batch.append(_dequeue(partition))
                partition.in_flight = frozenset(write.group_id for write in batch)
                try:
                    await self._run(partition, batch)
                except Exception as error:
                    # A bug outside what _run expects: memory and the log may be apart, so
                    # fail what is left of the batch and re-read the partition; the task
                    # itself must live on, or every group of the partition would hang.
                    logger.exception("state partition %d failed a batch", partition.index)
                    failure = errors.CoordinatorNotAvailable(
                        f"internal error ({type(error).__name__}) on state partition "
                        f"{partition.index}"
                    )
                    for write in batch:
                        if not write.future.done():
                            write.future.set_exception(failure)
                    if partition.state is PartitionState.ACTIVE:
                        self._reload(partition, f"internal error: {error!r}")
                finally:
                    partition.in_flight = frozenset()
            self._wake_timer(partition)

    def _wake_timer(self, partition: _Partition) -> None:
        state = partition.shard
        if state is None:
            return
        try:
            deadline = state.next_deadline_ms()
        except Exception:
            logger.exception("state partition %d: no next deadline", partition.index)
            return
        if deadline is not None and deadline < partition.timer_due_ms:
            partition.timer_changed.set()

    async def _run(self, partition: _Partition, batch: list[_Write]) -> None:
        """Validate, append and replay one batch; every write of it is answered here."""
        state = partition.shard
        tenure = partition.tenure
        assert state is not None
        assert tenure is not None
        now = self.config.clock_ms()
        accepted: list[tuple[_Write, result.Result[Any]]] = []
        encoded: list[writer.EncodedRecord] = []
        for write in batch:
            if write.future.done():
                continue  # the caller went away before its turn
            try:
                outcome = write.handler(state, now)
                # Encoded one write at a time: a write whose records cannot be encoded fails
                # alone. Handlers change nothing (only replay does), and commits of one
                # batch never depend on each other, so the others stay valid.
                records_of_write = [codec.encode_record(record) for record in outcome.records]
            except errors.CoordinatorError as error:
                write.future.set_exception(error)
                continue
            except Exception as error:
                write.future.set_exception(_request_failure(partition.index, error))
                continue
            accepted.append((write, outcome))
            encoded.extend(records_of_write)
        if encoded:
            started = time.monotonic()
            try:
                await tenure.writer.append(partition.index, encoded)
            except runtime_errors.WriterFenced as error:
                if partition.tenure is tenure:
                    self._fence(partition, error, [write for write, _ in accepted])
                else:
                    _fail(accepted, _released(partition.index))
                return
            except runtime_errors.WriteFailed as error:
                if partition.tenure is not tenure:
                    _fail(accepted, _released(partition.index))
                    return
                _fail(accepted, errors.CoordinatorNotAvailable(str(error)))
                # The brokers may or may not hold these records: re-read the log.
                if partition.state is PartitionState.ACTIVE:
                    self._reload(partition, f"write not acknowledged: {error}")
                return
            if partition.tenure is tenure:
                partition.confirmed_at = max(partition.confirmed_at, started)
            self.metrics.appended(len(encoded), time.monotonic() - started)
        if partition.tenure is not tenure or partition.shard is not state:
            # Given up (or reloaded) while the write was in flight: the records may be in
            # the log, but this process answers nothing more for the partition. A retry at
            # the new coordinator finds them (commits are idempotent).
            _fail(accepted, _released(partition.index))
            return
        if not self._lease_held(partition.index):
            # The Lease may already be another replica's: acknowledge nothing. What was
            # just written is not replayed here, so memory and log are apart: stop serving.
            _fail(accepted, _released(partition.index))
            if self.lease_given_up is not None and self.lease_given_up(partition.index):
                # Handed over while the write was in flight: the elector's own word (INFO)
                # is on its way; this only comes first.
                self.release(
                    partition.index, "given up while a write was in flight", voluntary=True
                )
            else:
                self.release(partition.index, "its lease expired while a write was in flight")
            return
        try:
            for _, outcome in accepted:
                for record in outcome.records:
                    state.replay(record)
                for soft in outcome.soft:
                    state.replay_soft(soft)
        except Exception as error:
            logger.exception("replay failed on partition %d", partition.index)
            for write, _ in accepted:
                if not write.future.done():
                    write.future.set_exception(
                        errors.CoordinatorNotAvailable(f"replay failed: {error}")
                    )
            if partition.state is PartitionState.ACTIVE:
                self._reload(partition, f"replay failed: {error}")
            return
        for write, outcome in accepted:
            _answer(partition, write.future, outcome)

    def _fence(
        self, partition: _Partition, error: runtime_errors.WriterFenced, in_flight: list[_Write]
    ) -> None:
        """Another coordinator holds the partition: answer nothing more from here."""
        failure = _not_coordinator(partition.index)
        for write in in_flight:
            if not write.future.done():
                write.future.set_exception(failure)
        if partition.state in (PartitionState.FENCED, PartitionState.STOPPED):
            return
        partition.enter(PartitionState.FENCED)
        partition.shard = None
        self._fail_pending(partition, failure)
        if self.lease_check is not None and self._lease_held(partition.index):
            delay = min(_RETAKE_DELAY_S * 2**partition.retakes, _RETAKE_MAX_DELAY_S)
            partition.retakes += 1
            logger.warning(
                "state partition %d: this coordinator's writer was fenced while it holds the "
                "partition's Lease (an earlier holder's writer finished starting late, or, if "
                "this repeats, another deployment writes the same state topic); taking it "
                "again in %.1f s (%s)",
                partition.index,
                delay,
                error,
            )
            self._spawn(self._retake_soon(partition.index, delay))
        else:
            logger.warning(
                "state partition %d was taken over by another coordinator; its groups now "
                "answer NOT_COORDINATOR here (%s)",
                partition.index,
                error,
            )
        self._all_loaded_check()

    async def _retake_soon(self, index: int, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        partition = self._partitions[index]
        if partition.state is PartitionState.FENCED and self._lease_held(index):
            with contextlib.suppress(RuntimeError):  # the runtime stopped meanwhile
                self.acquire(index)

    def _fail_pending(self, partition: _Partition, error: errors.CoordinatorError) -> None:
        while partition.pending:
            write = _dequeue(partition)
            if not write.future.done():
                write.future.set_exception(error)
        parked, partition.parked = partition.parked, {}
        for future in parked.values():
            if not future.done():
                future.set_exception(error)

    # -----------------------------------------------------------------------------------
    # Loading

    def _reload(self, partition: _Partition, reason: str) -> None:
        logger.warning("reloading state partition %d: %s", partition.index, reason)
        partition.enter(PartitionState.LOADING)
        partition.shard = None
        self._fail_pending(
            partition, errors.CoordinatorLoadInProgress(f"state partition {partition.index}")
        )
        # An outage fails many partitions at once: one loader (one consumer) takes them all.
        if not self._to_reload:
            self._spawn(self._reload_soon())
        self._to_reload.add(partition.index)

    async def _reload_soon(self) -> None:
        await asyncio.sleep(_RELOAD_GATHER_S)
        indexes, self._to_reload = sorted(self._to_reload), set()
        await self._load(indexes)

    async def _load(self, indexes: list[int]) -> None:
        assignors = self.config.assignors

        def build(index: int, replayed: loader.Survivors) -> shard.CoordinatorShard:
            fresh = shard.CoordinatorShard(assignors, self.config.coordinator)
            for record in replayed.records:
                fresh.replay(record)
            fresh.replay_encoded_offset_commits(replayed.offset_commits)
            return fresh

        by_tenure: dict[_Tenure, list[int]] = {}
        for index in indexes:
            partition = self._partitions[index]
            if partition.state is PartitionState.LOADING and partition.tenure is not None:
                by_tenure.setdefault(partition.tenure, []).append(index)
        await asyncio.gather(
            *(self._load_tenure(tenure, group, build) for tenure, group in by_tenure.items())
        )

    async def _load_tenure(
        self,
        tenure: _Tenure,
        indexes: list[int],
        build: Callable[[int, loader.Survivors], shard.CoordinatorShard],
    ) -> None:
        def loaded(index: int, outcome: shard.CoordinatorShard | BaseException) -> None:
            self._loaded(index, outcome, tenure)

        started = time.monotonic()
        try:
            await tenure.loader.load_survivors(indexes, build, loaded)
            self.metrics.load_seconds.observe(time.monotonic() - started)
        except Exception as error:
            # E.g. no consumer could be created: these partitions will not load by themselves.
            logger.exception("loading state partitions %s failed", indexes)
            for index in indexes:
                partition = self._partitions[index]
                if partition.state is PartitionState.LOADING:
                    self._loaded(index, error, tenure)

    def _loaded(
        self, index: int, outcome: shard.CoordinatorShard | BaseException, tenure: _Tenure
    ) -> None:
        partition = self._partitions[index]
        if partition.tenure is not tenure or partition.state is not PartitionState.LOADING:
            return  # given up, stopped or fenced meanwhile: another tenure's business
        if isinstance(outcome, runtime_errors.WriterFenced):
            self._fence(partition, outcome, [])
            return
        if isinstance(outcome, BaseException):
            partition.enter(PartitionState.FAILED)
            logger.error("state partition %d is unavailable: %s", index, outcome)
        else:
            outcome.on_loaded(self.config.clock_ms())
            partition.shard = outcome
            if self._topics:
                # First in the queue: no request is served on stale topic metadata.
                topics = dict(self._topics)
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                future.add_done_callback(_consume_outcome)
                _enqueue(partition, _Write(_update_topics(topics), future, False), first=True)
            partition.enter(PartitionState.ACTIVE)
            # Its marker, written just before the read ended, was committed.
            partition.confirmed_at = time.monotonic()
            partition.wakeup.set()
            partition.timer_changed.set()
        self._all_loaded_check()

    def _all_loaded_check(self) -> None:
        if self._all_loaded is not None and all(
            p.state is not PartitionState.LOADING for p in self._partitions
        ):
            self._all_loaded.set()

    # -----------------------------------------------------------------------------------
    # Timers and broker metadata

    async def _tick(self, partition: _Partition) -> None:
        interval_ms = self.config.timer_interval_ms
        last_run = self.config.clock_ms()
        while not self._stopped:
            now = self.config.clock_ms()
            due = last_run + interval_ms
            if partition.state is PartitionState.ACTIVE and partition.shard is not None:
                try:
                    deadline = partition.shard.next_deadline_ms()
                except Exception:
                    logger.exception("state partition %d: no next deadline", partition.index)
                    deadline = None
                if deadline is not None:
                    # A deadline the last run left in the past must not spin the loop.
                    due = max(min(due, deadline), last_run + _MIN_TIMER_GAP_MS)
            partition.timer_due_ms = due
            if due > now:
                # asyncio.timeout, unlike wait_for, never swallows a cancellation (3.11).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout((due - now) / 1000):
                        await partition.timer_changed.wait()
                partition.timer_changed.clear()
                continue
            last_run = now
            if partition.state is not PartitionState.ACTIVE:
                continue
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            _enqueue(partition, _Write(lambda s, t: s.on_timer(t), future, batchable=False))
            with contextlib.suppress(errors.CoordinatorError):
                await future

    async def _check_fence(self, partition: _Partition) -> None:
        """Write a marker when the partition answered requests but has not committed a write
        for ``fence_check_interval_ms``: a fenced writer learns it here (see the docstring)."""
        interval_s = self.config.fence_check_interval_ms / 1000
        while not self._stopped:
            await partition.served.wait()
            wait_s = partition.confirmed_at + interval_s - time.monotonic()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
                continue  # a write may have confirmed the partition meanwhile
            partition.served.clear()
            tenure = partition.tenure
            if partition.state is not PartitionState.ACTIVE or tenure is None:
                continue
            marker = codec.encode_record(
                records.Record(
                    records.LoadMarkerKey(),
                    records.LoadMarkerValue(
                        tenure.writer.marker_nonce("fence-check"), self.config.clock_ms()
                    ),
                )
            )
            started = time.monotonic()
            try:
                await tenure.writer.append_marker(partition.index, marker)
            except runtime_errors.WriterFenced as error:
                if partition.tenure is tenure:
                    self._fence(partition, error, [])
            except runtime_errors.WriteFailed as error:
                # A marker changes no state: nothing to reload; check again later.
                logger.info("state partition %d: fence check failed: %s", partition.index, error)
                partition.served.set()
                await asyncio.sleep(interval_s)
            else:
                partition.confirmed_at = max(partition.confirmed_at, started)

    async def _refresh_log_ends(self) -> None:
        """Keep the log ends describes asked for fresh, every ``metadata_interval_ms`` and
        soon after a describe asked for one not cached yet."""
        while not self._stopped:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.metadata_interval_ms / 1000):
                    await self._log_ends_asked.wait()
            self._log_ends_asked.clear()
            forget_before = time.monotonic() - _LOG_END_FORGET_S
            for tp, asked_at in list(self._log_ends_wanted.items()):
                if asked_at < forget_before:
                    del self._log_ends_wanted[tp]
                    self._log_ends.pop(tp, None)
            self.metrics.forget_stale_histories()
            if self._log_ends_wanted and self._admin is not None:
                try:
                    await self._read_log_ends(self._admin, list(self._log_ends_wanted))
                except Exception:
                    # Lag only: never worth ending the refresh for good.
                    logger.exception("reading log-end offsets failed")
            await asyncio.sleep(_LOG_END_MIN_GAP_S)

    async def _read_log_ends(self, admin: AdminClient, wanted: list[tuple[str, int]]) -> None:
        requests = {KafkaTopicPartition(name, index): _LATEST for name, index in wanted}
        read_at = time.monotonic()
        read_at_wall = time.time()
        try:
            futures = admin.list_offsets(
                requests,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self.config.admin_timeout_s,
            )
        except KafkaException as error:
            logger.info("cannot list log-end offsets: %s", error)
            return
        for partition, future in futures.items():
            try:
                end = (await asyncio.wrap_future(future)).offset
            except KafkaException as error:
                logger.debug("no log-end offset for %s: %s", partition, error)
                continue
            self._log_ends[(partition.topic, partition.partition)] = (end, read_at)
            self.metrics.log_end_read((partition.topic, partition.partition), end, read_at_wall)

    async def _poll_metadata(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.config.metadata_interval_ms / 1000)
            try:
                changed = await self._refresh_topics()
            except (KafkaException, runtime_errors.StateTopicError) as error:
                logger.warning("cannot read topic metadata: %s", error)
                continue
            except Exception:
                logger.exception("reading topic metadata failed")
                continue
            if not changed:
                continue
            topics = dict(self._topics)
            for partition in self._partitions:
                if partition.state is PartitionState.ACTIVE:
                    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    future.add_done_callback(_consume_outcome)
                    _enqueue(partition, _Write(_update_topics(topics), future, False))

    async def _refresh_topics(self) -> bool:
        """Read the cluster's topics; True when they differ from what the shards know."""
        admin = self._admin
        if admin is None:
            return False
        metadata = await asyncio.to_thread(admin.list_topics, timeout=self.config.admin_timeout_s)
        counts = {
            name: len(described.partitions)
            for name, described in metadata.topics.items()
            if described.error is None and name != self.config.topic and not name.startswith("__")
        }
        unseen = [name for name in counts if name not in self._topic_ids]
        if unseen:
            self._topic_ids.update(await self._describe_topic_ids(admin, unseen))
        topics = {
            name: messages.TopicInfo(name, count, self._topic_ids.get(name))
            for name, count in counts.items()
        }
        if topics == self._topics:
            return False
        self._topics = topics
        return True

    async def _describe_topic_ids(
        self, admin: AdminClient, names: list[str]
    ) -> dict[str, str | None]:
        ids: dict[str, str | None] = dict.fromkeys(names)
        try:
            futures = admin.describe_topics(TopicCollection(names))
        except KafkaException:
            return ids
        for name, future in futures.items():
            try:
                described = await asyncio.wrap_future(future)
            except KafkaException:
                continue
            topic_id = getattr(described, "topic_id", None)
            if topic_id is not None:
                most = topic_id.get_most_significant_bits() & (2**64 - 1)
                least = topic_id.get_least_significant_bits() & (2**64 - 1)
                if most or least:
                    ids[name] = str(uuid.UUID(int=(most << 64) | least))
        return ids


def _update_topics(
    topics: Mapping[str, messages.TopicInfo],
) -> Callable[[shard.CoordinatorShard, int], result.Result[None]]:
    return lambda state, now: state.update_topics(topics, now)


def _not_coordinator(index: int) -> errors.NotCoordinator:
    return errors.NotCoordinator(
        f"state partition {index} is served by another coordinator (this one's writer was fenced)"
    )


def _released(index: int) -> errors.NotCoordinator:
    return errors.NotCoordinator(
        f"state partition {index} is no longer served here (its lease moved to another coordinator)"
    )


def _fail(writes: list[tuple[_Write, result.Result[Any]]], error: errors.CoordinatorError) -> None:
    for write, _ in writes:
        if not write.future.done():
            write.future.set_exception(error)


def _not_served(index: int) -> errors.NotCoordinator:
    return errors.NotCoordinator(
        f"state partition {index} is not in this coordinator's partition set"
    )


def _answer(
    partition: _Partition, future: asyncio.Future[Any], outcome: result.Result[Any]
) -> None:
    """Answer a write once its records are durable and replayed: its own response (or park
    it), then the parked requests its result completes."""
    response = outcome.response
    if isinstance(response, result.Deferred):
        _park(partition, response.key, future)
    elif future.done():
        pass  # the caller went away
    elif isinstance(response, result.Failed):
        future.set_exception(response.error)
    else:
        future.set_result(response)
    for completion in outcome.completions:
        parked = partition.parked.pop(completion.key, None)
        if parked is None or parked.done():
            continue
        if completion.error is not None:
            parked.set_exception(completion.error)
        else:
            parked.set_result(completion.response)


def _park(partition: _Partition, key: result.DeferredKey, future: asyncio.Future[Any]) -> None:
    if future.done():
        return
    older = partition.parked.get(key)
    if older is not None and older is not future and not older.done():
        older.set_exception(errors.RebalanceInProgress("superseded by a newer request"))
    partition.parked[key] = future

    def forget(done: asyncio.Future[Any]) -> None:
        # A caller that went away (or was answered) leaves nothing parked behind.
        if partition.parked.get(key) is done:
            del partition.parked[key]

    future.add_done_callback(forget)


def _enqueue(partition: _Partition, write: _Write, first: bool = False) -> None:
    if first:
        partition.pending.appendleft(write)
    else:
        partition.pending.append(write)
    partition.queued[write.group_id] += 1
    partition.wakeup.set()


def _dequeue(partition: _Partition) -> _Write:
    write = partition.pending.popleft()
    partition.queued[write.group_id] -= 1
    if not partition.queued[write.group_id]:
        del partition.queued[write.group_id]
    return write


def _request_failure(index: int, error: Exception) -> errors.CoordinatorError:
    """The error for one request whose handler or encoding raised something unexpected."""
    if isinstance(error, UnicodeError):
        # E.g. a lone surrogate in a member id: valid JSON, yet not encodable as UTF-8.
        return errors.InvalidRequest("a string of the request is not valid Unicode text")
    if isinstance(error, codec.CodecError):
        return errors.InvalidRequest(f"the request cannot be stored: {error}")
    logger.error("state partition %d failed one request", index, exc_info=error)
    return errors.CoordinatorError(f"internal error ({type(error).__name__})")


def _report_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("task %s died", task.get_name(), exc_info=task.exception())


def _consume_outcome(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("topic metadata update failed: %s", future.exception())
