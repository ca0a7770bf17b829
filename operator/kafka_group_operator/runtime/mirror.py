"""Mirrors each group's committed offsets into the brokers' own group of the same id.

Tools that read offsets from the brokers (``kafka-consumer-groups.sh``, Burrow, lag
exporters, KEDA) see nothing of a group whose members commit to this coordinator; the
mirror makes them see it, and lets a group move back to plain Kafka consumers with its
place kept (stop its ConsumerGroup with ``deletionPolicy: Retain``, see ``flush``).

How, and why so:

* One task per mirrored group compares the group's committed offsets in memory with what it
  last mirrored, every ``interval_seconds``, and commits only what changed, in one
  member-less OffsetCommit. So the hot path pays nothing: commits are neither delayed nor
  observed, and at most one OffsetCommit per group per interval reaches the brokers.
* The commit is member-less (member id ``""``, generation -1), as Kafka's admin client sends
  AlterConsumerGroupOffsets, and every group of a cluster shares one connection per broker
  (``wire.offset_commits``): a librdkafka consumer per group (its ``group.id`` is fixed)
  cost three threads and two connections a group, and librdkafka's admin client can abort
  the process when a connection drops under a coordinator request
  (confluentinc/librdkafka#4605). Security settings (TLS, SASL PLAIN and SCRAM) come from
  the same librdkafka properties as every other client of the operator; settings it cannot
  honour are the group's ``MirrorFailed`` reason.
* The brokers accept a member-less commit only while their own group has no members. A
  refusal (``UNKNOWN_MEMBER_ID`` while native consumers are still active) or an outage never
  touches a commit of ours: the attempt is retried with backoff and the group's
  ``MirrorStatus`` says why it is behind; the operator turns it into the
  ``OffsetsMirrored`` condition.
* The state topic stays the source of truth: the mirror is never read back (adoption reads
  the native group once, before the coordinator has offsets; that is the operator's step).
* Only the coordinator serving the group's state partition mirrors it: ``read_offsets``
  answers a coordinator error for any other, and the task then forgets what it mirrored, so
  that whoever serves the partition next (maybe this process again) mirrors from scratch.
  A coordinator fenced without knowing it yet has no new offsets to mirror: its commits can
  no longer be replayed.
* Offsets that expire or are deleted here are not deleted from the native group: the
  brokers' own retention (``offsets.retention.minutes``) ends them. A whole group leaving
  under ``deletionPolicy: Delete`` is the exception: the operator deletes the native group
  then (``handlers.native_group.delete_native``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.wire import connection, offset_commits

logger = logging.getLogger(__name__)

# A failed attempt is retried after the interval doubled per consecutive failure, at most this.
MAX_BACKOFF_SECONDS = 30.0

TopicPartition = messages.TopicPartition
# Reads a group's committed offsets, or raises a coordinator error when it is not served here.
OffsetReader = Callable[[str], Mapping[TopicPartition, messages.CommittedOffset]]


@dataclass(frozen=True, slots=True)
class MirrorTarget:
    """Where a group is mirrored: its own Kafka cluster, as the operator knows it."""

    bootstrap_servers: str
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    interval_seconds: float = 5.0
    request_timeout_seconds: float = 10.0


class MirrorReason(enum.Enum):
    CAUGHT_UP = "CaughtUp"
    # Changes waiting for the next interval (not a failure).
    PENDING = "Pending"
    # The brokers refused or could not be reached; retried with backoff.
    MIRROR_FAILED = "MirrorFailed"
    # Another coordinator serves the group (or its partition is loading): not mirrored here.
    NOT_COORDINATOR = "NotCoordinator"


@dataclass(frozen=True, slots=True)
class MirrorStatus:
    reason: MirrorReason
    message: str
    # Partitions whose committed offset the native group does not carry yet.
    behind: int = 0
    # Consecutive failed attempts.
    failures: int = 0
    # time.time() of the last attempt that left nothing behind, if any.
    caught_up_at: float | None = None

    @property
    def mirrored(self) -> bool:
        return self.reason is MirrorReason.CAUGHT_UP


class _Group:
    def __init__(self, group_id: str, target: MirrorTarget) -> None:
        self.group_id = group_id
        self.target = target
        # (offset, metadata) the native group holds, as far as this task knows.
        self.mirrored: dict[TopicPartition, tuple[int, str]] = {}
        self.status = MirrorStatus(MirrorReason.PENDING, "not mirrored yet")
        self.lock = asyncio.Lock()
        self.retarget = asyncio.Event()
        self.stopped = False
        self.task: asyncio.Task[None] | None = None


def _cluster(target: MirrorTarget) -> tuple[str, frozenset[tuple[str, str]], float]:
    """What a committer is shared on: the cluster, its client settings, the timeout."""
    return (
        target.bootstrap_servers,
        frozenset(target.kafka_config.items()),
        target.request_timeout_seconds,
    )


class OffsetMirror:
    """The mirror tasks of every group configured with a ``MirrorTarget``."""

    def __init__(self, read_offsets: OffsetReader) -> None:
        self._read = read_offsets
        self._groups: dict[str, _Group] = {}
        # One committer per cluster (and settings), shared by its groups.
        self._committers: dict[
            tuple[str, frozenset[tuple[str, str]], float], offset_commits.OffsetCommitter
        ] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def configure(self, group_id: str, target: MirrorTarget | None) -> None:
        """Mirror ``group_id`` to ``target`` from now on (None: stop mirroring it)."""
        if target is None:
            self.remove(group_id)
            return
        existing = self._groups.get(group_id)
        if existing is not None:
            if existing.target != target:
                if existing.target.bootstrap_servers != target.bootstrap_servers:
                    existing.mirrored.clear()  # another cluster holds none of it
                existing.target = target
                existing.retarget.set()
            return
        state = _Group(group_id, target)
        state.task = asyncio.create_task(self._run(state), name=f"mirror-{group_id}")
        self._groups[group_id] = state

    def remove(self, group_id: str) -> None:
        """Stop mirroring ``group_id``: its task ends after the attempt under way, if any
        (a commit is never abandoned half-way)."""
        state = self._groups.pop(group_id, None)
        if state is not None:
            state.stopped = True
            state.retarget.set()

    def status(self, group_id: str) -> MirrorStatus | None:
        """How far the native group is behind; None when the group is not mirrored."""
        state = self._groups.get(group_id)
        return None if state is None else state.status

    def statuses(self) -> dict[str, MirrorStatus]:
        """The status of every mirrored group (for metrics)."""
        return {group_id: state.status for group_id, state in self._groups.items()}

    async def flush(self, group_id: str) -> MirrorStatus | None:
        """Mirror what changed now, without waiting for the interval (e.g. before a group
        leaves the operator); None when the group is not mirrored."""
        state = self._groups.get(group_id)
        if state is None:
            return None
        await self._mirror_once(state)
        return state.status

    async def stop(self) -> None:
        """End every group's task (each after its attempt under way)."""
        states = list(self._groups.values())
        for group_id in [state.group_id for state in states]:
            self.remove(group_id)
        tasks = [state.task for state in states if state.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        committers = list(self._committers.values())
        self._committers.clear()
        for committer in committers:
            await committer.close()

    async def _run(self, state: _Group) -> None:
        await self._loop(state)

    async def _loop(self, state: _Group) -> None:
        while not state.stopped:
            try:
                await self._mirror_once(state)
            except Exception:
                # Never let a bug end mirroring for good: say so and try again later.
                logger.exception("mirroring group %s failed", state.group_id)
                state.status = MirrorStatus(
                    MirrorReason.MIRROR_FAILED,
                    "internal error, see the operator's log",
                    failures=state.status.failures + 1,
                )
            interval = state.target.interval_seconds
            delay = min(interval * 2 ** min(state.status.failures, 10), MAX_BACKOFF_SECONDS)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(delay, interval)):
                    await state.retarget.wait()
            state.retarget.clear()

    async def _mirror_once(self, state: _Group) -> None:
        async with state.lock:
            if state.stopped:
                return
            try:
                offsets = self._read(state.group_id)
            except errors.CoordinatorError as error:
                state.mirrored.clear()
                state.status = MirrorStatus(MirrorReason.NOT_COORDINATOR, str(error))
                return
            changed = {
                tp: (value.offset, value.metadata)
                for tp, value in offsets.items()
                # A negative offset means "none" to the brokers and cannot be committed.
                if value.offset >= 0 and state.mirrored.get(tp) != (value.offset, value.metadata)
            }
            if not changed:
                if state.status.reason is not MirrorReason.CAUGHT_UP:
                    state.status = MirrorStatus(
                        MirrorReason.CAUGHT_UP,
                        "the native group carries every offset",
                        0,
                        0,
                        time.time(),
                    )
                return
            failures = await self._commit(state, changed)
            behind = len(failures)
            if not failures:
                state.status = MirrorStatus(
                    MirrorReason.CAUGHT_UP,
                    "the native group carries every offset",
                    0,
                    0,
                    time.time(),
                )
                return
            state.status = MirrorStatus(
                MirrorReason.MIRROR_FAILED,
                _failure_message(state.target, failures),
                behind,
                state.status.failures + 1,
                state.status.caught_up_at,
            )

    async def _commit(
        self, state: _Group, changed: Mapping[TopicPartition, tuple[int, str]]
    ) -> dict[TopicPartition, str]:
        """One member-less OffsetCommit of ``changed``; the error of each partition that the
        brokers did not take (all of them when the request failed)."""
        try:
            committer = self._committer(state.target)
            failed = await committer.commit(state.group_id, changed)
        except connection.ConfigError as error:
            return dict.fromkeys(changed, f"unusable client settings: {error}")
        except offset_commits.CommitFailed as error:
            return dict.fromkeys(changed, str(error))
        for tp, value in changed.items():
            if tp not in failed:
                state.mirrored[tp] = value
        return failed

    def _committer(self, target: MirrorTarget) -> offset_commits.OffsetCommitter:
        key = _cluster(target)
        committer = self._committers.get(key)
        if committer is None:
            committer = offset_commits.OffsetCommitter(
                target.bootstrap_servers, target.kafka_config, target.request_timeout_seconds
            )
            self._committers[key] = committer
            # Settings no group uses any more (a group retargeted) let their connections go.
            used = {_cluster(state.target) for state in self._groups.values()}
            for stale in [k for k in self._committers if k not in used and k != key]:
                closing = asyncio.create_task(self._committers.pop(stale).close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        return committer


def _failure_message(target: MirrorTarget, failures: Mapping[TopicPartition, str]) -> str:
    by_reason: dict[str, int] = {}
    for reason in failures.values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    reasons = ", ".join(f"{reason} ({count})" for reason, count in sorted(by_reason.items()))
    hint = ""
    if any(reason.startswith("UNKNOWN_MEMBER_ID") for reason in by_reason):
        hint = "; the native group still has active members"
    return (
        f"{len(failures)} partition(s) not mirrored to {target.bootstrap_servers}: "
        f"{reasons}{hint}; retrying"
    )
