"""How a member moves from its current assignment to its target (``CurrentAssignmentBuilder``).

A pure function of the member's current assignment, its target, the target epoch, what the
member reports owning, and which partitions are free. The rules (KIP-848):

* Revoke first. Partitions the member holds outside its target become *pending revocation*
  and the member stays at its epoch in UNREVOKED_PARTITIONS until it stops reporting them.
* Then assign, but only what nobody else owns: a partition still owned (assigned or pending
  revocation) by another member is withheld, and the member waits in UNRELEASED_PARTITIONS
  at the target epoch until the owner releases it on one of its own heartbeats.
* A member that owns exactly its target at the target epoch is STABLE; its heartbeats cost
  nothing here (the fast path returns before looking at any partition).

Epoch bookkeeping follows Kafka's ``updateMemberEpoch``: moving to a new epoch records the
old one as the previous epoch, which is what lets a lost response be recognised (a heartbeat
at the previous epoch whose owned partitions are a subset of the assignment). Unlike Kafka,
a step that keeps the epoch keeps the previous epoch too, so a member waiting for released
partitions does not lose that tolerance.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kafka_group_operator.coordinator import group_state
from kafka_group_operator.coordinator import records as coordinator_records

TopicIdAssignment = coordinator_records.TopicIdAssignment
MemberState = group_state.MemberState

_NOTHING: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class CurrentAssignment:
    """The content of a ConsumerGroupCurrentMemberAssignment record."""

    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned: TopicIdAssignment
    pending_revocation: TopicIdAssignment


NEW_MEMBER = CurrentAssignment(0, 0, MemberState.STABLE, {}, {})


def still_owns(owned: TopicIdAssignment | None, partitions: TopicIdAssignment) -> bool:
    """Whether the member still reports any of ``partitions`` (unknown when it sent nothing)."""
    if owned is None:
        return bool(partitions)
    return any(parts & owned.get(topic, _NOTHING) for topic, parts in partitions.items())


def is_subset(owned: TopicIdAssignment, assigned: TopicIdAssignment) -> bool:
    return all(parts <= assigned.get(topic, _NOTHING) for topic, parts in owned.items())


def reconcile(
    current: CurrentAssignment,
    target: TopicIdAssignment,
    target_epoch: int,
    owned: TopicIdAssignment | None,
    is_free: Callable[[uuid.UUID, int], bool],
) -> CurrentAssignment:
    """The member's next current assignment; ``current`` itself when nothing can change."""
    state = current.state
    if state is MemberState.STABLE and current.member_epoch == target_epoch:
        return current
    if state is MemberState.UNREVOKED_PARTITIONS and still_owns(owned, current.pending_revocation):
        return current
    return _next_assignment(current, target, target_epoch, owned, is_free)


def _next_assignment(
    current: CurrentAssignment,
    target: TopicIdAssignment,
    target_epoch: int,
    owned: TopicIdAssignment | None,
    is_free: Callable[[uuid.UUID, int], bool],
) -> CurrentAssignment:
    assigned = current.assigned
    kept: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    arriving: dict[uuid.UUID, frozenset[int]] = {}
    withheld = False
    for topic in target.keys() | assigned.keys():
        wanted = target.get(topic, _NOTHING)
        held = assigned.get(topic, _NOTHING)
        keep = held & wanted
        if keep:
            kept[topic] = keep
        revoke = held - wanted
        if revoke:
            revoking[topic] = revoke
        missing = wanted - held
        if missing:
            free = frozenset(p for p in missing if is_free(topic, p))
            if len(free) < len(missing):
                withheld = True
            if free:
                arriving[topic] = free
    epoch, previous = current.member_epoch, current.previous_member_epoch
    if revoking and still_owns(owned, revoking):
        return CurrentAssignment(epoch, previous, MemberState.UNREVOKED_PARTITIONS, kept, revoking)
    for topic, parts in arriving.items():
        kept[topic] = kept.get(topic, _NOTHING) | parts
    next_state = MemberState.UNRELEASED_PARTITIONS if withheld else MemberState.STABLE
    if target_epoch != epoch:
        previous = epoch
    return CurrentAssignment(target_epoch, previous, next_state, kept, {})
