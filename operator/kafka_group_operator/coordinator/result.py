"""What every coordinator write handler returns: the records to persist and the response.

The runtime appends ``records`` to the state topic, waits for the acknowledgement, replays
them into the shard, and only then hands ``response`` to the caller. A handler never mutates
state itself.

Classic groups add two things, both answered the same way, after the records are durable:

* ``soft``: soft records, the part of a group's state Kafka keeps in memory only (who is
  joining, the rebalance under way). The runtime replays them after ``records``, in order,
  and never writes them; a load starts without them, as Kafka's does.
* Parked requests: a JoinGroup waits for the rest of the group, a SyncGroup for the leader's
  assignment. Such a handler answers ``Deferred(key)``; the runtime holds the caller, without
  holding up the partition's queue, until a later result (of any request, or of a timer)
  carries a ``Completion`` for that key. A completion nobody waits for (the caller went away,
  or the partition was reloaded) is dropped; a second ``Deferred`` for a key replaces the
  first, which is answered REBALANCE_IN_PROGRESS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kafka_group_operator.coordinator import errors
from kafka_group_records import records

T = TypeVar("T")


class SoftRecord:
    """Base of the records replayed but never written (see the module docstring)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class DeferredKey:
    """Whose parked request: ``kind`` is ``join`` or ``sync``."""

    kind: str
    group_id: str
    member_id: str


def join_key(group_id: str, member_id: str) -> DeferredKey:
    return DeferredKey("join", group_id, member_id)


def sync_key(group_id: str, member_id: str) -> DeferredKey:
    return DeferredKey("sync", group_id, member_id)


@dataclass(frozen=True, slots=True)
class Deferred:
    """A response that a later ``Completion`` for ``key`` will give."""

    key: DeferredKey


@dataclass(frozen=True, slots=True)
class Failed:
    """A response that is an error, given once the result's records are written: Kafka
    answers some classic requests with an error yet still appends (a JoinGroup that creates
    a group, then fails, leaves the group behind)."""

    error: errors.CoordinatorError


@dataclass(frozen=True, slots=True)
class Completion:
    """The answer to a parked request: ``response``, or ``error`` when set."""

    key: DeferredKey
    response: Any = None
    error: errors.CoordinatorError | None = None


@dataclass(frozen=True, slots=True)
class Result(Generic[T]):
    response: T
    records: list[records.Record] = field(default_factory=list)
    soft: list[SoftRecord] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
