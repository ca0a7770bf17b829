"""Soft deadlines of the coordinator: session, rebalance, sync and retention timers, and the
classic groups' heartbeat, join and sync timers.

Kafka keeps heartbeat deadlines as timer state, not as records, and so do we: after a load
``CoordinatorShard.on_loaded`` restarts them. The shard never sleeps; the runtime asks
``next_deadline_ms`` and calls ``on_timer(now_ms)`` when it has passed.

A heartbeat re-arms its member's session deadline, so ``Deadlines`` must be cheap to re-arm:
it keeps the current deadline per key in a dict and pushes every arming onto a heap, and
skips heap entries that no longer match the dict when they surface (lazy deletion), and
rebuilds the heap when stale entries outnumber live ones 4 to 1. Arming and cancelling are
amortised O(log n) and O(1); nothing scans all members on a heartbeat.

Expiring a deadline does not disarm it: the records the timer handler returns only take
effect once replayed, and replay is what cancels the timers of a removed member. If the
write fails, the deadline is still due and the next ``on_timer`` tries again.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from enum import Enum


class TimerKind(Enum):
    SESSION = "session"
    REBALANCE = "rebalance"
    # A classic member's time from JoinGroup to SyncGroup (Kafka's consumer-group sync key).
    SYNC = "sync"
    RETENTION = "retention"
    # Classic groups (Kafka's classicGroupHeartbeatKey, classicGroupJoinKey,
    # classicGroupSyncKey): a member's session (or a new member's join) timeout; the end of
    # the join phase (tag: ``JOIN_COMPLETE`` or ``JOIN_INITIAL_DELAY``); the end of the
    # sync phase (tag: the generation it was armed for).
    CLASSIC_HEARTBEAT = "classic-heartbeat"
    CLASSIC_JOIN = "classic-join"
    CLASSIC_SYNC = "classic-sync"


# Tags of a classic group's join timer: complete the join phase, or the initial rebalance's
# delay (which may extend itself while members keep arriving).
JOIN_COMPLETE = 0
JOIN_INITIAL_DELAY = 1


@dataclass(frozen=True, slots=True)
class TimerKey:
    kind: TimerKind
    group_id: str
    member_id: str = ""


def session_key(group_id: str, member_id: str) -> TimerKey:
    return TimerKey(TimerKind.SESSION, group_id, member_id)


def rebalance_key(group_id: str, member_id: str) -> TimerKey:
    return TimerKey(TimerKind.REBALANCE, group_id, member_id)


def sync_key(group_id: str, member_id: str) -> TimerKey:
    return TimerKey(TimerKind.SYNC, group_id, member_id)


def classic_heartbeat_key(group_id: str, member_id: str) -> TimerKey:
    return TimerKey(TimerKind.CLASSIC_HEARTBEAT, group_id, member_id)


def classic_join_key(group_id: str) -> TimerKey:
    return TimerKey(TimerKind.CLASSIC_JOIN, group_id)


def classic_sync_key(group_id: str) -> TimerKey:
    return TimerKey(TimerKind.CLASSIC_SYNC, group_id)


def retention_key(group_id: str) -> TimerKey:
    return TimerKey(TimerKind.RETENTION, group_id)


@dataclass(frozen=True, slots=True)
class Armed:
    deadline_ms: int
    # What the deadline was armed for, e.g. the member epoch a rebalance timeout guards.
    tag: int


class Deadlines:
    def __init__(self) -> None:
        self._armed: dict[TimerKey, Armed] = {}
        self._heap: list[tuple[int, int, TimerKey]] = []
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._armed)

    def arm(self, key: TimerKey, deadline_ms: int, tag: int = 0) -> None:
        armed = Armed(deadline_ms, tag)
        if self._armed.get(key) == armed:
            return
        self._armed[key] = armed
        heapq.heappush(self._heap, (deadline_ms, next(self._sequence), key))
        if len(self._heap) > 4 * len(self._armed) + 64:
            # Many re-armings (heartbeats) left stale entries behind: rebuild, amortised O(1).
            self._heap = [
                (entry.deadline_ms, next(self._sequence), entry_key)
                for entry_key, entry in self._armed.items()
            ]
            heapq.heapify(self._heap)

    def cancel(self, key: TimerKey) -> None:
        self._armed.pop(key, None)

    def get(self, key: TimerKey) -> Armed | None:
        return self._armed.get(key)

    def armed(self) -> dict[TimerKey, Armed]:
        return dict(self._armed)

    def clear(self) -> None:
        self._armed.clear()
        self._heap.clear()

    def next_deadline_ms(self) -> int | None:
        heap = self._heap
        while heap:
            deadline_ms, _, key = heap[0]
            armed = self._armed.get(key)
            if armed is not None and armed.deadline_ms == deadline_ms:
                return deadline_ms
            heapq.heappop(heap)
        return None

    def due(self, now_ms: int) -> list[tuple[TimerKey, Armed]]:
        """Every armed deadline at or before ``now_ms``, earliest first; they stay armed."""
        heap = self._heap
        found: dict[TimerKey, Armed] = {}
        while heap and heap[0][0] <= now_ms:
            deadline_ms, _, key = heapq.heappop(heap)
            armed = self._armed.get(key)
            if armed is not None and armed.deadline_ms == deadline_ms:
                found[key] = armed
        for key, armed in found.items():
            heapq.heappush(heap, (armed.deadline_ms, next(self._sequence), key))
        return list(found.items())
