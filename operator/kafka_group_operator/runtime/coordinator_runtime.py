"""The asyncio runtime around the sans-IO coordinator: one shard per state-topic partition.

Every write follows one path, as in Kafka's ``CoordinatorRuntime``: the shard's handler
validates the request against the current state and returns records plus a response; the
records are appended to the partition (idempotent, ``acks=all``); once acknowledged they are
replayed into the shard, and only then is the response released. Nothing is ever replied
before it is durable.

Each partition has one serial queue, so a handler always sees the state left by the previous
write. Offset commits are the exception that makes throughput: commits queued together are
validated against the same state (a commit changes nothing a commit is validated against),
produced as one batch and replayed in order; if the batch is not acknowledged every one of
them fails with a retriable error and none is replayed.

A write whose fate is unknown (the brokers did not acknowledge it in time) leaves the log and
memory possibly apart, so that partition is reloaded from the log; meanwhile its groups answer
``COORDINATOR_LOAD_IN_PROGRESS``, exactly as while the runtime starts. Reads (fetch, describe)
are served from memory, which only ever holds durable state.

Timers call the shard's ``on_timer`` at its ``next_deadline_ms`` (session and rebalance
timeouts, offsets retention) and at least every ``timer_interval_ms``; broker metadata of
the cluster's topics is polled and fed to every shard through ``update_topics``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, not in __all__
    AdminClient,
    OffsetSpec,
)

from kafka_group_operator.assignors import api as assignors_api
from kafka_group_operator.coordinator import errors, messages, result, shard
from kafka_group_operator.runtime import errors as runtime_errors
from kafka_group_operator.runtime import loader, topic, writer
from kafka_group_records import codec, partitioning, records

logger = logging.getLogger(__name__)

T = TypeVar("T")

_MIN_TIMER_GAP_MS = 10
_RELOAD_GATHER_S = 0.1
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]


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


class PartitionState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(eq=False)
class _Write:
    """A queued write: the handler to run against the shard, and who awaits its response."""

    handler: Callable[[shard.CoordinatorShard, int], result.Result[Any]]
    future: asyncio.Future[Any]
    batchable: bool


@dataclass(eq=False)
class _Partition:
    index: int
    state: PartitionState = PartitionState.LOADING
    shard: shard.CoordinatorShard | None = None
    pending: collections.deque[_Write] = field(default_factory=collections.deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    timer_changed: asyncio.Event = field(default_factory=asyncio.Event)
    # When the timer task wakes next; a write that arms an earlier deadline wakes it sooner.
    timer_due_ms: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


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
        self._admin: AdminClient | None = None
        self._writer = writer.StateWriter(
            config.bootstrap_servers,
            config.topic,
            timeout_ms=config.write_timeout_ms,
            kafka_config=config.kafka_config,
        )
        self._loader = loader.PartitionLoader(
            bootstrap_servers=config.bootstrap_servers,
            topic=config.topic,
            state_writer=self._writer,
            kafka_config=config.kafka_config,
            clock_ms=config.clock_ms,
            partition_count=config.partitions,
            checkpoint_uri=config.checkpoint_uri,
        )
        self._partitions: list[_Partition] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._topics: dict[str, messages.TopicInfo] = {}
        self._topic_ids: dict[str, str | None] = {}
        self._all_loaded: asyncio.Event | None = None
        self._stopped = False
        # Java's String.hashCode in Python is slow enough to matter on every request.
        self._partition_of: dict[str, int] = {}
        self._to_reload: set[int] = set()

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
        self._partitions = [_Partition(index) for index in range(self.config.partitions)]
        for partition in self._partitions:
            partition.tasks = [
                asyncio.create_task(self._serve(partition), name=f"state-{partition.index}"),
                asyncio.create_task(self._tick(partition), name=f"timer-{partition.index}"),
            ]
        self._spawn(self._load(list(range(self.config.partitions))))
        self._spawn(self._poll_metadata())
        if self.config.wait_until_loaded:
            await self.wait_until_loaded()

    async def wait_until_loaded(self) -> None:
        assert self._all_loaded is not None, "start() first"
        await self._all_loaded.wait()

    async def stop(self) -> None:
        self._stopped = True
        for partition in self._partitions:
            partition.state = PartitionState.STOPPED
            self._fail_pending(partition, errors.CoordinatorNotAvailable("coordinator stopped"))
        tasks = [*self._tasks, *(t for p in self._partitions for t in p.tasks)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self._writer.stop)
        self._tasks.clear()
        # confluent-kafka clients have no close(): dropping the last reference destroys the
        # client, which otherwise keeps reconnecting to a broker that may be gone.
        self._admin = None

    def partition_state(self, group_id: str) -> PartitionState:
        return self._partitions[self.partition_of(group_id)].state

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
        response: messages.HeartbeatResponse = await self._write(
            request.group_id, lambda s, now: s.heartbeat(request, now)
        )
        return response

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse:
        response: messages.OffsetCommitResponse = await self._write(
            request.group_id, lambda s, now: s.commit_offsets(request, now), batchable=True
        )
        return response

    async def configure_group(self, settings: messages.GroupSettings) -> None:
        await self._write(settings.group_id, lambda s, now: s.configure_group(settings, now))

    async def remove_members(self, request: messages.RemoveMembersRequest) -> dict[str, str | None]:
        removed: dict[str, str | None] = await self._write(
            request.group_id, lambda s, now: s.remove_members(request, now)
        )
        return removed

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None:
        await self._write(request.group_id, lambda s, now: s.delete_group(request, now))

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse:
        return self._active_shard(request.group_id).fetch_offsets(request)

    async def describe_group(self, group_id: str) -> messages.GroupDescription:
        return self._active_shard(group_id).describe_group(group_id)

    async def list_groups(self) -> list[str]:
        groups = []
        for partition in self._partitions:
            if partition.state is PartitionState.ACTIVE and partition.shard is not None:
                groups.extend(partition.shard.list_groups())
        return sorted(groups)

    async def group_lag(self, group_id: str) -> dict[tuple[str, int], int]:
        """Log-end offset minus committed offset for each partition the group committed."""
        committed = (await self.fetch_offsets(messages.OffsetFetchRequest(group_id))).offsets
        if not committed or self._admin is None:
            return {}
        requests = {KafkaTopicPartition(name, index): _LATEST for name, index in committed}
        try:
            futures = self._admin.list_offsets(
                requests, request_timeout=self.config.admin_timeout_s
            )
        except KafkaException as error:
            raise errors.CoordinatorNotAvailable(f"cannot list log-end offsets: {error}") from error
        lag: dict[tuple[str, int], int] = {}
        for partition, future in futures.items():
            try:
                end = (await asyncio.wrap_future(future)).offset
            except KafkaException as error:
                logger.debug("no log-end offset for %s: %s", partition, error)
                continue
            tp = (partition.topic, partition.partition)
            lag[tp] = max(0, end - committed[tp].offset)
        return lag

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

    def _active_shard_index(self, group_id: str) -> int:
        """The partition of ``group_id``, or the retriable error explaining why not now."""
        partition = self._partitions[self.partition_of(group_id)] if self._partitions else None
        if partition is not None and partition.state is PartitionState.ACTIVE:
            return partition.index
        if partition is None or partition.state is PartitionState.STOPPED:
            raise errors.CoordinatorNotAvailable("the coordinator is not running")
        if partition.state is PartitionState.LOADING:
            raise errors.CoordinatorLoadInProgress(
                f"state partition {partition.index} of group {group_id!r} is loading"
            )
        raise errors.CoordinatorNotAvailable(
            f"state partition {partition.index} of group {group_id!r} failed to load"
        )

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

    async def _write(
        self,
        group_id: str,
        handler: Callable[[shard.CoordinatorShard, int], result.Result[T]],
        *,
        batchable: bool = False,
    ) -> T:
        partition = self._partitions[self._active_shard_index(group_id)]
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        partition.pending.append(_Write(handler, future, batchable))
        partition.wakeup.set()
        return await future

    # -----------------------------------------------------------------------------------
    # The serial queue of one partition

    async def _serve(self, partition: _Partition) -> None:
        while not self._stopped:
            await partition.wakeup.wait()
            partition.wakeup.clear()
            while partition.pending and partition.state is PartitionState.ACTIVE:
                batch = [partition.pending.popleft()]
                if batch[0].batchable:
                    while partition.pending and partition.pending[0].batchable:
                        batch.append(partition.pending.popleft())
                await self._run(partition, batch)
            if partition.shard is not None:
                deadline = partition.shard.next_deadline_ms()
                if deadline is not None and deadline < partition.timer_due_ms:
                    partition.timer_changed.set()

    async def _run(self, partition: _Partition, batch: list[_Write]) -> None:
        state = partition.shard
        assert state is not None
        now = self.config.clock_ms()
        accepted: list[tuple[_Write, result.Result[Any]]] = []
        for write in batch:
            if write.future.done():
                continue  # the caller went away before its turn
            try:
                accepted.append((write, write.handler(state, now)))
            except errors.CoordinatorError as error:
                write.future.set_exception(error)
            except Exception as error:
                logger.exception("coordinator handler failed on partition %d", partition.index)
                write.future.set_exception(errors.CoordinatorError(f"internal error: {error}"))
        produced = [record for _, outcome in accepted for record in outcome.records]
        if produced:
            try:
                encoded = [codec.encode_record(record) for record in produced]
                await self._writer.append(partition.index, encoded)
            except (runtime_errors.WriteFailed, codec.CodecError) as error:
                failure = errors.CoordinatorNotAvailable(str(error))
                for write, _ in accepted:
                    if not write.future.done():
                        write.future.set_exception(failure)
                # The brokers may or may not hold these records: re-read the log.
                self._reload(partition, f"write not acknowledged: {error}")
                return
            try:
                for record in produced:
                    state.replay(record)
            except Exception as error:
                logger.exception("replay failed on partition %d", partition.index)
                for write, _ in accepted:
                    if not write.future.done():
                        write.future.set_exception(
                            errors.CoordinatorNotAvailable(f"replay failed: {error}")
                        )
                self._reload(partition, f"replay failed: {error}")
                return
        for write, outcome in accepted:
            if not write.future.done():
                write.future.set_result(outcome.response)

    def _fail_pending(self, partition: _Partition, error: errors.CoordinatorError) -> None:
        while partition.pending:
            write = partition.pending.popleft()
            if not write.future.done():
                write.future.set_exception(error)

    # -----------------------------------------------------------------------------------
    # Loading

    def _reload(self, partition: _Partition, reason: str) -> None:
        logger.warning("reloading state partition %d: %s", partition.index, reason)
        partition.state = PartitionState.LOADING
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

        def build(index: int, replayed: list[records.Record]) -> shard.CoordinatorShard:
            fresh = shard.CoordinatorShard(assignors)
            for record in replayed:
                fresh.replay(record)
            return fresh

        await self._loader.load(indexes, build, self._loaded)

    def _loaded(self, index: int, outcome: shard.CoordinatorShard | BaseException) -> None:
        partition = self._partitions[index]
        if partition.state is PartitionState.STOPPED:
            return
        if isinstance(outcome, BaseException):
            partition.state = PartitionState.FAILED
            logger.error("state partition %d is unavailable: %s", index, outcome)
        else:
            outcome.on_loaded(self.config.clock_ms())
            partition.shard = outcome
            if self._topics:
                # First in the queue: no request is served on stale topic metadata.
                topics = dict(self._topics)
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                future.add_done_callback(_consume_outcome)
                partition.pending.appendleft(_Write(_update_topics(topics), future, False))
            partition.state = PartitionState.ACTIVE
            partition.wakeup.set()
            partition.timer_changed.set()
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
                deadline = partition.shard.next_deadline_ms()
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
            partition.pending.append(_Write(lambda s, t: s.on_timer(t), future, batchable=False))
            partition.wakeup.set()
            with contextlib.suppress(errors.CoordinatorError):
                await future

    async def _poll_metadata(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.config.metadata_interval_ms / 1000)
            try:
                changed = await self._refresh_topics()
            except (KafkaException, runtime_errors.StateTopicError) as error:
                logger.warning("cannot read topic metadata: %s", error)
                continue
            if not changed:
                continue
            topics = dict(self._topics)
            for partition in self._partitions:
                if partition.state is PartitionState.ACTIVE:
                    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    future.add_done_callback(_consume_outcome)
                    partition.pending.append(_Write(_update_topics(topics), future, False))
                    partition.wakeup.set()

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


def _consume_outcome(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.warning("topic metadata update failed: %s", future.exception())
