"""``GroupMember``: a consumer that follows the coordinator instead of a broker-side group.

Theory of operation. Three threads share one small, locked state:

* the **heartbeat thread** talks to the coordinator every ``heartbeatIntervalMs`` (sooner
  when ownership changed, or when the coordinator closed the connection: see below) and
  records the assignment each reply brings as the *target*;
* the **consumer thread** (the caller's, iterating messages or batches) reconciles the
  confluent-kafka ``Consumer`` towards the target between two batches, and between two
  messages when the target changed: it first drops partitions it *lost*, then *revokes*
  (commit what was processed, ``incremental_unassign``, stop reporting the partition), then
  *assigns* (fetch committed offsets from the coordinator, ``incremental_assign`` at them, or
  at ``auto.offset.reset`` without one);
* the **commit thread** sends asynchronous commits.

The coordinator gives a partition to a new owner only after the previous owner stopped
reporting it, so revoking first and reporting at once is what makes a rebalance fast.

Costs are per batch, not per message. The consumer thread fetches batches
(``Consumer.consume``), even when it hands messages out one at a time. Ownership is a
frozenset swapped under the lock; each batch is screened against it once, under the lock,
right after the fetch returned it. librdkafka returns messages of assigned partitions only
(what it fetched before an unassign is dropped), so while every partition assigned at the
fetch is still owned, no message needs a look of its own. Whatever changes ownership (a new
target, fencing, a fatal error, ``stop()``) raises one plain flag, ``_attention``, before it
changes anything; before each message (or batch) it hands out, the consumer thread reads that
flag and the clock, and takes the slow path (the lock, reconciling, screening the rest of the
batch again) only when the flag is up or a deadline has come. When the coordinator fences the
member (``FENCED_MEMBER_EPOCH``, ``UNKNOWN_MEMBER_ID``), the heartbeat thread empties the
ownership at once, so not a single further message of a lost partition is handed out; the
member then rejoins with epoch 0. ``FENCED_INSTANCE_ID`` (another live process has our
identity) is fatal, as in Kafka; see ``RETRY_ERRORS`` for how every other error is handled.

Processed offsets. A message counts as processed when the next one is asked for, a batch
when the next batch is. Nothing is recorded per message: once a batch was handed out whole,
the consumer's positions (librdkafka's offset after the last message it returned of each
partition, one call per batch) are recorded under the lock, as Kafka's consumer commits its
positions; a batch left part way (a revocation between two messages, ``stop()``, a commit
asked for mid-batch, a ``break``) is recorded from the messages handed out before it.

No zombie processing. Ownership is only *provably fresh* until ``lost_after_ms`` after the
last successful heartbeat was *sent* (the coordinator armed its session deadline when it
handled that heartbeat, which was later, and ``lost_after_ms`` is below the session timeout).
So a message is handed out only if, on the monotonic clock, ``now < fresh_until``, checked by
the consuming thread twice: under the lock once the fetch returned its batch, and again right
before each message (or the whole batch) is yielded. Otherwise the
partitions are lost on the spot (``on_lost``, epoch 0, rejoin), whatever the heartbeat thread
is doing: blocked on a black-holed connection, or frozen together with the whole process
(SIGSTOP, a GC pause, a suspended VM) and woken up with stale messages already fetched. Each
heartbeat is bounded by the time left before ``fresh_until`` and never retried past it.

A coordinator that dies (a crash, an OOM kill, a SIGKILL) or stops closes the heartbeat
thread's kept-alive connection, and the heartbeat thread, which watches it between two
heartbeats, heartbeats at once instead of when the next one is due: it finds the group's new
coordinator (retrying while the partition moves) seconds earlier, well before ``fresh_until``,
as Kafka's consumer marks a disconnected coordinator unknown and looks it up again at once. At
most one such early heartbeat per heartbeat interval, so a path that closes idle connections
(a proxy's idle timeout) costs one more heartbeat per interval, not a loop. A node that
vanishes closes nothing; its members notice at their next heartbeat.

Stopping (``stop()``, or SIGTERM after ``install_signal_handlers()``): no further message (or
batch) is handed out, the one in flight finishes, processed offsets are committed, and the member
leaves with epoch -2 (static: it keeps its partitions for the session timeout, so a restart
gets them back) or -1 when asked to leave for good.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.member import client, config

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Partitions = frozenset[TopicPartition]
PartitionsCallback = Callable[[Partitions], None]
CommitCallback = Callable[[Mapping[TopicPartition, int], Mapping[TopicPartition, str]], None]

# How the heartbeat thread handles each error, as Kafka's consumer does
# (AbstractHeartbeatRequestManager.onErrorResponse and ConsumerHeartbeatRequestManager
# .handleSpecificExceptionInResponse in org.apache.kafka.clients.consumer.internals):
# NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE and COORDINATOR_LOAD_IN_PROGRESS are retried
# with backoff; FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID drop the assignment and rejoin with
# epoch 0 (transitionToFenced); anything else (GROUP_AUTHORIZATION_FAILED, INVALID_REQUEST,
# GROUP_MAX_SIZE_REACHED, UNSUPPORTED_ASSIGNOR, FENCED_INSTANCE_ID, an unknown error) is fatal.
# Also retried: REQUEST_TIMED_OUT, a RetriableException in Kafka's Errors.java (Kafka's own
# coordinator turns it into COORDINATOR_NOT_AVAILABLE before answering), no answer at all
# (Kafka's onFailure retries a RetriableException such as a disconnect), and, unlike Kafka,
# UNRELEASED_INSTANCE_ID: the pod that replaces a dead pod waits for its predecessor's session
# to expire instead of crash-looping through it. A NOT_COORDINATOR naming another coordinator
# is followed by the client itself (see ``client``); only a second one in a row reaches here.
RETRY_ERRORS: tuple[type[errors.CoordinatorError], ...] = (
    errors.NotCoordinator,
    errors.CoordinatorNotAvailable,  # client.CoordinatorUnreachable included
    errors.CoordinatorLoadInProgress,
    errors.RequestTimedOut,
    errors.UnreleasedInstanceId,
)
REJOIN_ERRORS: tuple[type[errors.CoordinatorError], ...] = (
    errors.FencedMemberEpoch,
    errors.UnknownMemberId,
)
BACKOFF_INITIAL_S = 0.1
# How often, at most, the consumer thread records its processed offsets while it consumes
# (see GroupMember._fold): what a commit from another thread may lag behind.
FOLD_INTERVAL_S = 0.1
BACKOFF_MAX_S = 5.0
# NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS say that a group's coordinator is moving or
# loading, and no answer at all that its pod is restarting or gone (a crash, a drained node,
# the Service between endpoints), which ends within seconds (a restart or a Lease's expiry,
# and a load): retried at most this far apart (Kafka's default retry.backoff.max.ms, KIP-580;
# Kafka's consumer rediscovers a coordinator it was disconnected from on that backoff too), a
# member reaches the new coordinator within about a second of its serving, where BACKOFF_MAX_S
# would leave it up to five (and a restart well within lost_after_ms could then outlast it).
COORDINATOR_MOVING_ERRORS: tuple[type[errors.CoordinatorError], ...] = (
    errors.NotCoordinator,
    errors.CoordinatorLoadInProgress,
    client.CoordinatorUnreachable,
)
COORDINATOR_MOVING_BACKOFF_MAX_S = 1.0


def retry_delay(backoff_s: float, error: errors.CoordinatorError) -> float:
    """How long to wait before retrying after ``error`` at backoff ``backoff_s``: jittered by
    20% either way, as Kafka's clients do, and bounded by the error's own maximum."""
    if isinstance(error, COORDINATOR_MOVING_ERRORS):
        backoff_s = min(backoff_s, COORDINATOR_MOVING_BACKOFF_MAX_S)
    return backoff_s * random.uniform(0.8, 1.2)


class _Wake:
    """Wakes the heartbeat thread, like a ``threading.Event`` it can also wait on together
    with a socket (the coordinator connection it watches): ``set`` writes a byte to a socket
    pair. Lock-free, because ``set`` is called from signal handlers (through ``stop``)."""

    def __init__(self) -> None:
        self._receiver, self._sender = socket.socketpair()
        self._receiver.setblocking(False)
        self._sender.setblocking(False)

    def set(self) -> None:
        # A full socket pair already wakes the waiter; a closed one has no waiter left.
        with contextlib.suppress(OSError):
            self._sender.send(b"\0")

    def clear(self) -> None:
        """Forget earlier wakes (a wake that races with this still wakes the next wait)."""
        with contextlib.suppress(OSError):
            while self._receiver.recv(4096):
                pass

    def wait(self, timeout: float, watch: socket.socket | None = None) -> bool:
        """Wait up to ``timeout`` seconds for a wake, or for ``watch`` to turn readable;
        True if ``watch`` did."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._receiver, selectors.EVENT_READ)
            if watch is not None:
                selector.register(watch, selectors.EVENT_READ)
            ready = selector.select(max(timeout, 0.0))
        return watch is not None and any(key.fileobj is watch for key, _ in ready)

    def close(self) -> None:
        self._receiver.close()
        self._sender.close()


class MemberError(Exception):
    """The member cannot go on (fenced instance id, refused token, invalid request)."""


def _flatten(assignment: Mapping[str, Any]) -> Partitions:
    return frozenset((topic, int(p)) for topic, parts in assignment.items() for p in parts)


def _grouped(partitions: Partitions) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        grouped.setdefault(topic, []).append(partition)
    return grouped


class GroupMember:
    """A member of a coordinator-managed group: iterate it, iterate ``batches()``, or
    ``run(handler)``.

    >>> with GroupMember(MemberConfig.from_env()) as member:   # doctest: +SKIP
    ...     member.install_signal_handlers()
    ...     for message in member:
    ...         handle(message)           # the offset counts as processed on the next one
    """

    def __init__(
        self,
        member_config: config.MemberConfig,
        *,
        on_assigned: PartitionsCallback | None = None,
        on_revoked: PartitionsCallback | None = None,
        on_lost: PartitionsCallback | None = None,
        on_commit: CommitCallback | None = None,
    ) -> None:
        self.config = member_config
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._on_lost = on_lost
        self._on_commit = on_commit
        self._client = client.CoordinatorClient(
            member_config.coordinator_url,
            member_config.group_id,
            member_config.token,
            member_config.request_timeout_s,
        )
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        # Shared state, guarded by _lock.
        self._epoch = messages.JOIN_EPOCH
        self._interval_s = 1.0
        self._owned: Partitions = frozenset()
        self._target: Partitions | None = None
        self._lost: Partitions = frozenset()
        self._generation = 0  # bumped whenever ownership is lost, to void in-flight assigns
        self._processed: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._fatal: BaseException | None = None
        # Monotonic instant until which ownership is provably fresh (see the module doc).
        self._fresh_until = 0.0
        # Consumer-thread state.
        self._assigned: Partitions = frozenset()
        self._consumer: Consumer | None = None
        self._consumer_thread: int | None = None
        self._next_interval_commit = 0.0
        # Bumped (under the lock) whenever _assigned changes; _assigned_at says when each
        # partition came.
        self._assignment_version = 0
        self._assigned_at: dict[TopicPartition, int] = {}
        # The batch in hand (see the module doc): its messages before _handed count as
        # processed, those before _folded are recorded in _processed already. Fetched while
        # _batch_assigned were assigned, at _batch_version, screened at _batch_generation.
        self._batch: list[Message] = []
        self._handed = 0
        self._folded = 0
        self._batch_assigned: Partitions = frozenset()
        self._batch_version = 0
        self._batch_generation = 0
        self._position_requests: tuple[Partitions, list[KafkaTopicPartition]] = (frozenset(), [])
        # What _fold found processed, not yet recorded in _processed: the consumer's
        # positions, less what it returned that is not processed yet, as of a generation and
        # an assignment version.
        self._positions: (
            tuple[int, int, list[KafkaTopicPartition], dict[TopicPartition, int]] | None
        ) = None
        self._next_fold = 0.0
        # Before this instant a message may be handed out without the slow path: the
        # ownership's deadline as last seen (it only moves later, except when everything is
        # lost, which raises _attention) or the next interval commit, whichever comes first.
        self._check_at = 0.0
        # Signalling. _attention is raised (a plain attribute: one read per message) before
        # anything the consumer thread must act on changes: a new target, lost partitions, a
        # fatal error, stop(). The consumer thread lowers it before it looks.
        self._attention = False
        self._stopping = threading.Event()
        self._permanent = False
        self._closed = threading.Event()
        self._wake = _Wake()
        # Heartbeat-thread state: no early heartbeat (see the module doc) before this instant.
        self._early_allowed_at = 0.0
        self._reconcile_needed = threading.Event()
        self._commits: queue.Queue[Callable[[], object] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._started = False

    # ----------------------------------------------------------------------------- public

    @property
    def member_id(self) -> str:
        return self.config.member_id

    @property
    def member_epoch(self) -> int:
        with self._lock:
            return self._epoch

    @property
    def assignment(self) -> Partitions:
        """The partitions this member owns and processes right now."""
        return self._owned

    def __enter__(self) -> GroupMember:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Message]:
        """Messages of owned partitions; each counts as processed when the next is asked for.

        Fetched ``max_poll_records`` at a time; the checks before each message are a flag and
        the clock (see the module doc).
        """
        self._start()
        monotonic = time.monotonic
        max_records, timeout = self.config.max_poll_records, self.config.poll_timeout_s
        try:
            batch = self._next_batch(max_records, timeout)
            while batch is not None:
                check_at = self._check_at
                index = 0
                for index, message in enumerate(batch):
                    if self._attention or monotonic() >= check_at:
                        break
                    self._handed = index
                    yield message
                else:
                    self._handed = len(batch)
                    batch = self._next_batch(max_records, timeout)
                    continue
                batch = self._interrupt(index)
        finally:
            self._fold()
            self.close()

    def batches(
        self, max_records: int = 500, timeout: float | None = None
    ) -> Iterator[list[Message]]:
        """Batches of up to ``max_records`` messages of owned partitions, in each partition's
        order; each batch counts as processed when the next one is asked for.

        A batch holds what the fetcher has at hand, at once; with nothing at hand it waits up
        to ``timeout`` seconds (``poll_timeout_s`` by default) for the first message, and
        yields an empty batch if none came (the loop can do periodic work). Checked like a
        message: no batch is handed out once ownership may be lost.
        """
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {max_records}")
        wait = self.config.poll_timeout_s if timeout is None else max(timeout, 0.0)
        return self._batches(max_records, wait)

    def _batches(self, max_records: int, wait: float) -> Iterator[list[Message]]:
        self._start()
        try:
            batch = self._next_batch(max_records, wait)
            while batch is not None:
                if batch and (self._attention or time.monotonic() >= self._check_at):
                    batch = self._interrupt(0)
                    continue
                yield batch
                self._handed = len(batch)
                batch = self._next_batch(max_records, wait)
        finally:
            self._fold()
            self.close()

    def run(self, handler: Callable[[Message], None]) -> None:
        """Call ``handler`` for every message until ``stop()``; it commits as it goes."""
        for message in self:
            handler(message)

    def stop(self, permanent: bool = False) -> None:
        """Ask the member to stop after the message in flight (safe from signal handlers).

        ``permanent`` leaves the group for good (epoch -1), so the partitions move at once;
        otherwise a static member leaves temporarily (epoch -2) and gets them back when it
        restarts within the session timeout.
        """
        self._permanent = self._permanent or permanent
        self._stopping.set()
        self._attention = True  # after: the consumer thread lowers it, then looks
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the member cleanly (call from the main thread)."""

        def handle(signum: int, frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def commit(
        self, asynchronous: bool = False, partitions: Partitions | None = None
    ) -> dict[TopicPartition, str]:
        """Commit processed offsets through the coordinator.

        Synchronously it returns the partitions that failed with their Kafka error names;
        asynchronously it returns ``{}`` at once and reports through ``on_commit``. Called on
        the consuming thread, it covers every message processed so far; on another thread,
        what the consuming thread recorded last (every ``FOLD_INTERVAL_S`` while it hands
        messages out, and whenever it waits for more).
        """
        if self._consumer_thread == threading.get_ident():
            self._fold()
        if asynchronous:
            self._commits.put(lambda: self._commit_now(partitions))
            return {}
        return self._commit_now(partitions)

    def close(self) -> None:
        """Commit, leave the group and release the consumer; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._stopping.set()
        self._attention = True
        self._wake.set()
        if self._started:
            self._commits.put(None)
            for thread in self._threads:
                thread.join()
            try:
                self._commit_now(None)
            except errors.CoordinatorError as error:
                logger.warning("final commit failed: %s", error)
            self._leave()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._client.close()
        self._wake.close()

    # --------------------------------------------------------------------- consumer thread

    def _start(self) -> None:
        if self._started:
            return
        if self._closed.is_set():
            raise MemberError("this member was closed; create a new one")
        self._started = True
        self._consumer_thread = threading.get_ident()
        settings: dict[str, Any] = {
            "bootstrap.servers": self.config.bootstrap_servers,
            # librdkafka insists on a group id, but no broker-side group is ever joined:
            # partitions are assigned by hand and offsets go to the coordinator.
            "group.id": f"{self.config.group_id}.kgo-fetcher",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": self.config.auto_offset_reset,
            "client.id": self.config.instance_id or self.member_id,
            **self.config.kafka_config,
        }
        self._consumer = Consumer(settings)
        self._next_interval_commit = time.monotonic() + self.config.commit_interval_ms / 1000
        self._next_fold = time.monotonic() + FOLD_INTERVAL_S
        self._threads = [
            threading.Thread(target=self._heartbeat_loop, name="kgo-heartbeat", daemon=True),
            threading.Thread(target=self._commit_loop, name="kgo-commit", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _next_batch(self, max_records: int, timeout: float) -> list[Message] | None:
        """The next batch to hand out, screened (maybe empty); None once stopping.

        The batch handed out before counts as processed from here on. Its offsets are
        recorded lazily (see ``_fold``): the consumer's positions cover it at the next fold.
        """
        if self._attention:
            self._fold()  # before a revocation commits, or stopping
            self._attention = False  # lowered before looking, so a later raise is seen
            if self._stopping.is_set():
                return None
            self._raise_if_fatal()
            if self._reconcile_needed.is_set():
                self._reconcile()
        elif self._batch_version != self._assignment_version:
            self._fold()  # the positions no longer cover it
        now = time.monotonic()
        if now >= self._next_fold:
            self._fold_at_interval(now)
        consumer = self._consumer
        assert consumer is not None
        assigned, version = self._assigned, self._assignment_version
        self._batch, self._handed, self._folded = [], 0, 0
        self._batch_assigned, self._batch_version = assigned, version
        if not assigned:
            # Nothing to fetch: wait for an assignment instead of spinning on consume.
            self._reconcile_needed.wait(timeout)
            return []
        # What is at hand, at once; else wait for the first message only, so that a trickle
        # is handed out as it comes instead of when a batch is full.
        batch = consumer.consume(max_records, 0)
        if not batch:
            self._fold()  # idle: a good moment to record where the consumer stands
            batch = consumer.consume(1, timeout)
            if not batch:
                return batch
            if max_records > 1:
                batch += consumer.consume(max_records - 1, 0)
        if any(map(Message.error, batch)):  # one C-level look per message, as a peer needs
            batch = self._without_errors(batch)
        batch = self._screen(batch)
        self._batch = batch
        return batch

    @staticmethod
    def _without_errors(batch: list[Message]) -> list[Message]:
        kept = []
        for message in batch:
            error = message.error()
            if error is None:
                kept.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                logger.warning("fetch error: %s", error)
        return kept

    def _screen(self, batch: list[Message]) -> list[Message]:
        """What of ``batch`` (fetched at ``_batch_version``) may be handed out: messages of
        partitions owned, and assigned since before the fetch, while the ownership is
        provably fresh. One look under the lock, with the clock read there: a lost or revoked
        partition is never processed, nor one of a member cut off from the coordinator, or
        frozen while the coordinator moved on."""
        with self._lock:
            owned, generation, fresh_until = self._owned, self._generation, self._fresh_until
            now = time.monotonic()
        fetched_from = self._batch_assigned
        if self._batch_version != self._assignment_version or not fetched_from <= owned:
            # Rare: ownership or the assignment changed since the fetch. Keep what is still
            # owned and was assigned before it (a partition assigned again since restarts
            # from its committed offset: what came before that is not its next message).
            keep = {
                partition
                for partition in fetched_from & owned
                if self._assigned_at.get(partition, self._batch_version + 1) <= self._batch_version
            }
            if keep != fetched_from:
                batch = [m for m in batch if (m.topic(), m.partition()) in keep]
        if not batch:
            return batch
        if now >= fresh_until:
            self._lose_stale(generation)
            self._reconcile()  # on_lost fires now, on this thread
            return []
        self._batch_generation = generation
        self._check_at = min(fresh_until, self._next_fold)
        return batch

    def _interrupt(self, index: int) -> list[Message] | None:
        """The slow path before handing out ``_batch[index]``: the flag was up, or a deadline
        came. What comes before ``index`` is processed; returns what of the rest may still
        be handed out, screened again under the lock (None once stopping)."""
        self._handed = index
        self._fold()  # before a revocation commits, or stopping
        self._attention = False  # lowered before looking, so a later raise is seen
        if self._stopping.is_set():
            return None
        self._raise_if_fatal()
        if self._reconcile_needed.is_set():
            self._reconcile()
        now = time.monotonic()
        if now >= self._next_fold:
            self._fold_at_interval(now)
        rest = self._batch[index:]
        self._batch, self._handed, self._folded = rest, 0, 0
        rest = self._screen(rest)
        self._batch = rest
        return rest

    def _fold(self) -> None:
        """Record what is processed so far (consumer thread only; exact whenever called).

        Nothing per message: the consumer's positions (librdkafka's offset after the last
        message it returned, per partition: one call) are kept, less what of the batch in
        hand is not processed yet (each partition's first such offset, when there is any),
        and recorded in ``_processed`` when a commit reads them (``_absorb_positions``).
        Positions cover every batch since the assignment last changed, so ``_next_batch``
        folds only when something is about to read them, now and then (``FOLD_INTERVAL_S``,
        for commits from other threads), and when idle. Messages handed out after the
        assignment changed, and before the next fetch, are recorded one by one (rare).
        """
        batch, handed, folded = self._batch, self._handed, self._folded
        if self._batch_version != self._assignment_version:
            if handed <= folded:
                return
            self._folded = handed
            offsets: dict[TopicPartition, int] = {}
            for message in batch[folded:handed]:
                offset = message.offset()
                if offset is not None:
                    offsets[(message.topic() or "", message.partition() or 0)] = offset + 1
            with self._lock:
                if self._generation == self._batch_generation:  # else lost since: drop them
                    self._record_processed(offsets.items())
            return
        assert self._consumer is not None
        cached, requests = self._position_requests
        if cached is not self._batch_assigned:
            requests = [KafkaTopicPartition(t, p) for t, p in sorted(self._batch_assigned)]
            self._position_requests = (self._batch_assigned, requests)
        positions = self._consumer.position(requests)
        ahead: dict[TopicPartition, int] = {}
        if handed < len(batch):
            # Reversed, so that each partition ends up with its first offset not processed.
            ahead = {
                (m.topic() or "", m.partition() or 0): m.offset() or 0
                for m in reversed(batch[handed:])
            }
        self._folded = handed
        self._positions = (self._batch_generation, self._batch_version, positions, ahead)

    def _absorb_positions(self) -> None:
        """Record the positions ``_fold`` kept (under the lock, on any thread): only if
        nothing was lost, and the assignment did not change, since they were taken. Kept
        for the next look too (recording them twice changes nothing): the consumer thread
        replaces them without the lock."""
        kept = self._positions
        if kept is None:
            return
        generation, version, positions, ahead = kept
        if generation == self._generation and version == self._assignment_version:
            self._record_processed(
                ((p.topic, p.partition), ahead.get((p.topic, p.partition), p.offset))
                for p in positions
                if p.error is None
            )

    def _record_processed(self, offsets: Iterable[tuple[TopicPartition, int]]) -> None:
        for partition, offset in offsets:  # under the lock
            if partition in self._owned and offset > self._processed.get(partition, -1):
                self._processed[partition] = offset

    def _fold_at_interval(self, now: float) -> None:
        self._next_fold = now + FOLD_INTERVAL_S
        self._fold()
        if now >= self._next_interval_commit:
            self._next_interval_commit = now + self.config.commit_interval_ms / 1000
            self.commit(asynchronous=True)

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise MemberError(str(self._fatal)) from self._fatal

    def _request_reconcile(self) -> None:
        self._reconcile_needed.set()
        self._attention = True  # after: the consumer thread lowers it, then looks

    def _reconcile(self) -> None:
        self._reconcile_needed.clear()
        assert self._consumer is not None
        with self._lock:
            target, lost, generation = self._target, self._lost, self._generation
            self._lost = frozenset()
        lost &= self._assigned
        if lost:
            # Already removed from ownership by the heartbeat thread: release without commit
            # (the coordinator would refuse it, and the next owner may be working already).
            self._consumer.incremental_unassign([KafkaTopicPartition(t, p) for t, p in lost])
            self._unassigned(lost)
            logger.info("lost %d partition(s): %s", len(lost), _grouped(lost))
            if self._on_lost is not None:
                self._on_lost(lost)
        if target is None:
            return
        revoked = self._assigned - target
        if revoked:
            self._revoke(revoked)
        added = target - self._assigned
        if added:
            self._assign(added, generation)

    def _revoke(self, revoked: Partitions) -> None:
        assert self._consumer is not None
        try:
            failed = self._commit_now(revoked)
            if failed:
                logger.warning("commit on revoke failed for %s", failed)
        except errors.CoordinatorError as error:
            logger.warning("commit on revoke failed: %s", error)
        if self._on_revoked is not None:
            self._on_revoked(revoked)
        self._consumer.incremental_unassign([KafkaTopicPartition(t, p) for t, p in revoked])
        self._unassigned(revoked)
        with self._lock:
            self._owned -= revoked
            for partition in revoked:
                self._processed.pop(partition, None)
                self._committed.pop(partition, None)
        logger.info("revoked %d partition(s): %s", len(revoked), _grouped(revoked))
        # Report the release at once: the next owner is waiting for it.
        self._wake.set()

    def _assign(self, added: Partitions, generation: int) -> None:
        assert self._consumer is not None
        with self._lock:
            epoch = self._epoch
        try:
            committed = self._client.fetch(added, self.member_id, epoch)
        except errors.CoordinatorError as error:
            # Try again on the next reconcile; the heartbeat keeps the target.
            logger.warning("cannot fetch committed offsets yet: %s", error)
            self._request_reconcile()
            time.sleep(BACKOFF_INITIAL_S)
            return
        self._consumer.incremental_assign(
            [KafkaTopicPartition(t, p, committed.get((t, p), OFFSET_INVALID)) for t, p in added]
        )
        self._assigned |= added
        with self._lock:
            self._absorb_positions()  # the last moment they mean something
            self._assignment_version += 1
        for partition in added:
            self._assigned_at[partition] = self._assignment_version
        with self._lock:
            if self._generation != generation:
                # Fenced while we were fetching: these are lost already.
                self._lost |= added
                self._request_reconcile()
                return
            self._owned |= added
            for partition in added:
                if partition in committed:
                    self._committed[partition] = committed[partition]
        logger.info("assigned %d partition(s): %s", len(added), _grouped(added))
        if self._on_assigned is not None:
            self._on_assigned(added)
        self._wake.set()

    def _unassigned(self, partitions: Partitions) -> None:
        self._assigned -= partitions
        with self._lock:
            self._absorb_positions()  # the last moment they mean something
            self._assignment_version += 1
        for partition in partitions:
            self._assigned_at.pop(partition, None)

    # ------------------------------------------------------------------------------ commits

    def _commit_now(self, partitions: Partitions | None) -> dict[TopicPartition, str]:
        # One commit at a time, so that a slow asynchronous commit can never land after a
        # newer one and move a committed offset backwards.
        with self._commit_lock:
            return self._commit_serialized(partitions)

    def _commit_serialized(self, partitions: Partitions | None) -> dict[TopicPartition, str]:
        with self._lock:
            self._absorb_positions()
            epoch = self._epoch
            pending = {
                partition: offset
                for partition, offset in self._processed.items()
                if partition in self._owned
                and (partitions is None or partition in partitions)
                and self._committed.get(partition) != offset
            }
        if not pending or epoch <= 0:
            return {}
        failed = self._client.commit(self.member_id, epoch, pending)
        with self._lock:
            for partition, offset in pending.items():
                if partition not in failed and self._committed.get(partition, -1) < offset:
                    self._committed[partition] = offset
        if self._on_commit is not None:
            self._on_commit(pending, failed)
        return failed

    def _commit_loop(self) -> None:
        while True:
            job = self._commits.get()
            if job is None:
                return
            try:
                job()
            except errors.CoordinatorError as error:
                logger.warning("asynchronous commit failed: %s", error)

    # ---------------------------------------------------------------------------- heartbeat

    def _heartbeat_body(self, epoch: int, owned: Partitions) -> dict[str, Any]:
        body: dict[str, Any] = {
            "memberId": self.member_id,
            "memberEpoch": epoch,
            "instanceId": self.config.instance_id,
            "rack": self.config.rack,
            "ownedPartitions": _grouped(owned),
        }
        if epoch == messages.JOIN_EPOCH:
            body["subscribedTopicNames"] = list(self.config.topics)
            body["rebalanceTimeoutMs"] = self.config.rebalance_timeout_ms
            body["clientId"] = self.config.instance_id or self.member_id
        return body

    def _heartbeat_loop(self) -> None:
        backoff = BACKOFF_INITIAL_S
        lost_after_s = self.config.lost_after_ms / 1000
        while not self._stopping.is_set():
            # Cleared before reading the state, so a change made while the request is in
            # flight wakes the next heartbeat at once.
            self._wake.clear()
            self._lose_if_stale(time.monotonic())
            with self._lock:
                epoch, owned, generation = self._epoch, self._owned, self._generation
                holding = bool(self._owned or self._target)
                fresh_until = self._fresh_until
            # The coordinator arms the session deadline when it handles the request, which
            # is after it was sent: counting from the send keeps "lost" ahead of expiry.
            sent_at = time.monotonic()
            # While partitions are held, an answer after fresh_until is worthless: they are
            # lost by then. So the heartbeat waits no longer, and is not retried past it.
            deadline = fresh_until if holding else None
            try:
                reply = self._client.heartbeat(self._heartbeat_body(epoch, owned), deadline)
            except REJOIN_ERRORS as error:
                logger.warning("fenced (%s): dropping partitions and rejoining", error.name)
                self._lose_everything(generation)
                self._wake.wait(BACKOFF_INITIAL_S)
                continue
            except RETRY_ERRORS as error:
                delay = retry_delay(backoff, error)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                now = time.monotonic()
                if not self._lose_if_stale(now) and holding:
                    # Never sleep past the moment the partitions must be dropped, so that
                    # on_lost fires then even when no message comes in.
                    delay = max(0.01, min(delay, fresh_until - now))
                logger.info("heartbeat failed (%s), retrying in %.1fs", error.name, delay)
                self._wake.wait(delay)
                continue
            except errors.CoordinatorError as error:
                self._fail(error)
                return
            backoff = BACKOFF_INITIAL_S
            self._apply_reply(reply, sent_at, generation)
            # Heartbeat well before the ownership goes stale, whatever the interval.
            self._idle(min(self._interval_s, lost_after_s / 2))

    def _idle(self, seconds: float) -> None:
        """Wait ``seconds`` for the next heartbeat, or less: when woken, or when the
        coordinator closes the connection (once per ``seconds`` at most)."""
        now = time.monotonic()
        watch = self._client.idle_socket() if now >= self._early_allowed_at else None
        if self._wake.wait(seconds, watch):
            self._client.drop_connection()
            self._early_allowed_at = now + seconds
            logger.info("the coordinator closed the connection: heartbeating at once")

    def _apply_reply(self, reply: Mapping[str, Any], sent_at: float, generation: int) -> None:
        with self._lock:
            if self._generation != generation:
                # The partitions were lost while this heartbeat was in flight: its answer is
                # about an epoch we gave up; the next heartbeat rejoins.
                return
            self._fresh_until = sent_at + self.config.lost_after_ms / 1000
            self._epoch = int(reply["memberEpoch"])
            self._interval_s = max(int(reply["heartbeatIntervalMs"]), 10) / 1000
            assignment = reply.get("assignment")
            if assignment is not None:
                target = _flatten(assignment)
                if target != self._target:
                    self._target = target
                    self._request_reconcile()

    def _lose_if_stale(self, now: float) -> bool:
        """Lose everything held if ownership is no longer provably fresh at ``now``."""
        with self._lock:
            if now < self._fresh_until or not (self._owned or self._target):
                return False
            generation = self._generation
        return self._lose_stale(generation)

    def _lose_stale(self, generation: int) -> bool:
        if not self._lose_everything(generation):
            return False  # the other thread was first
        logger.warning(
            "no successful heartbeat for %d ms: dropped the partitions, rejoining",
            self.config.lost_after_ms,
        )
        return True

    def _lose_everything(self, generation: int) -> bool:
        """Drop ownership and start over with epoch 0, unless already done since ``generation``."""
        with self._lock:
            if self._generation != generation:
                return False  # another thread did it already
            self._attention = True  # before the ownership goes: see the module doc
            lost = self._owned | (self._target or frozenset())
            self._owned = frozenset()
            self._lost |= lost
            self._target = frozenset()
            self._processed.clear()
            self._committed.clear()
            self._epoch = messages.JOIN_EPOCH
            self._generation += 1
            self._fresh_until = 0.0
        self._request_reconcile()
        self._wake.set()  # rejoin at once
        if self._on_lost is None and lost:
            logger.warning("stopped processing %d lost partition(s)", len(lost))
        return True

    def _fail(self, error: BaseException) -> None:
        logger.error("member cannot continue: %s", error)
        with self._lock:
            self._attention = True
            self._fatal = error
            self._owned = frozenset()
        self._request_reconcile()

    def _leave(self) -> None:
        with self._lock:
            epoch = self._epoch
            self._owned = frozenset()
        if epoch <= 0 or self._fatal is not None:
            return
        static = self.config.instance_id is not None and not self._permanent
        leave_epoch = messages.STATIC_LEAVE_EPOCH if static else messages.LEAVE_EPOCH
        try:
            self._client.heartbeat(self._heartbeat_body(leave_epoch, frozenset()))
        except errors.CoordinatorError as error:
            logger.warning("leave heartbeat failed: %s", error)
