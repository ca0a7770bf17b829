"""Group and member states, and every legal transition between them, as tables.

This module is the single place that says which state changes are legal. ``group.py``
derives a group's state from its hard state after each replayed record (as Kafka's
``ConsumerGroup#maybeUpdateGroupState`` does) and asks ``check_group_transition`` whether the
move is allowed; members are checked the same way. An illegal move raises
``errors.IllegalStateTransition`` naming the role, the states and the event (the record type
that caused it). Tables hold data only: no handler logic lives here.

Group states (KIP-848 plus our PAUSED):

==============  ==========================================================================
EMPTY           no members
ASSIGNING       group epoch > target-assignment epoch: the assignor has to run
RECONCILING     some member is not yet at the target epoch, or still revoking/waiting
PAUSED          the assignment is paused and every member has released its partitions
STABLE          every member owns exactly its target at the target epoch
DEAD            every record of the group is gone (deleted or expired)
==============  ==========================================================================

Classic groups (Kafka's ``ClassicGroup``, the leader assigns) have their own states and
table, ``ClassicGroupState`` and ``VALID_PREVIOUS_CLASSIC_STATES`` (Kafka's
``ClassicGroupState``), plus ``CLASSIC_HEARTBEAT_ANSWER``: what a heartbeat of a known member
at the current generation is told in each state.

The handlers order their records so that live operation only takes the transitions below
(a join bumps the group epoch before the member record, so EMPTY goes through ASSIGNING;
a delete removes the members before the group). While the state topic is loading, records
arrive in compacted order and intermediate states mean nothing, so the shard checks the
tables only for live writes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from kafka_group_operator.coordinator import errors


class GroupState(enum.Enum):
    # Values are the words the ConsumerGroup status shows (DESIGN §4).
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    PAUSED = "Paused"
    DEAD = "Dead"


class MemberState(enum.IntEnum):
    # Kafka's ids, stored in ConsumerGroupCurrentMemberAssignmentValue.state: the byte
    # values of Kafka's ``org.apache.kafka.coordinator.group.modern.MemberState``. Records
    # written before these ids matched Kafka's are renumbered by the codec on reading.
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


_LIVE = frozenset({GroupState.ASSIGNING, GroupState.RECONCILING, GroupState.STABLE})

# next state -> the states it may be entered from (Kafka's VALID_PREVIOUS_STATES shape).
VALID_PREVIOUS_GROUP_STATES: Mapping[GroupState, frozenset[GroupState]] = {
    # The last member leaves (or is fenced) whatever the group was doing.
    GroupState.EMPTY: _LIVE | {GroupState.PAUSED},
    # A group epoch bump: a join, leave, subscription, metadata or config change.
    GroupState.ASSIGNING: _LIVE | {GroupState.EMPTY, GroupState.PAUSED},
    # A new target, a member at a new epoch, a static member leaving temporarily. Never
    # straight from EMPTY: a join always bumps the group epoch first.
    GroupState.RECONCILING: _LIVE | {GroupState.PAUSED},
    # Reached only by reconciling a target; never straight from EMPTY or PAUSED.
    GroupState.STABLE: frozenset({GroupState.ASSIGNING, GroupState.RECONCILING}),
    # Pausing computes an empty target (ASSIGNING), then members revoke (RECONCILING).
    GroupState.PAUSED: frozenset({GroupState.ASSIGNING, GroupState.RECONCILING}),
    # Only an empty group disappears: a delete removes its members first.
    GroupState.DEAD: frozenset({GroupState.EMPTY}),
}

_RECONCILIATION = frozenset(
    {
        MemberState.STABLE,
        MemberState.UNREVOKED_PARTITIONS,
        MemberState.UNRELEASED_PARTITIONS,
    }
)

# Kafka's CurrentAssignmentBuilder may take a member from any reconciliation state to any
# other (a new target can arrive at any time), but never into UNKNOWN, which exists only
# to read ids written by a newer version.
VALID_PREVIOUS_MEMBER_STATES: Mapping[MemberState, frozenset[MemberState]] = {
    MemberState.STABLE: _RECONCILIATION | {MemberState.UNKNOWN},
    MemberState.UNREVOKED_PARTITIONS: _RECONCILIATION | {MemberState.UNKNOWN},
    MemberState.UNRELEASED_PARTITIONS: _RECONCILIATION | {MemberState.UNKNOWN},
    MemberState.UNKNOWN: frozenset(),
}


class ClassicGroupState(enum.Enum):
    # Values are Kafka's names (DescribeGroups, ListGroups).
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# next state -> the states it may be entered from (Kafka's ClassicGroupState static block).
VALID_PREVIOUS_CLASSIC_STATES: Mapping[ClassicGroupState, frozenset[ClassicGroupState]] = {
    # The last offsets expired, or the last member left during a rebalance.
    ClassicGroupState.EMPTY: frozenset({ClassicGroupState.PREPARING_REBALANCE}),
    # A join, a leave or a failed member: from any live state.
    ClassicGroupState.PREPARING_REBALANCE: frozenset(
        {
            ClassicGroupState.STABLE,
            ClassicGroupState.COMPLETING_REBALANCE,
            ClassicGroupState.EMPTY,
        }
    ),
    # Every expected member joined, or the rebalance timeout passed.
    ClassicGroupState.COMPLETING_REBALANCE: frozenset({ClassicGroupState.PREPARING_REBALANCE}),
    # The leader's assignment was written.
    ClassicGroupState.STABLE: frozenset({ClassicGroupState.COMPLETING_REBALANCE}),
    # Deleted, expired or converted: from anywhere.
    ClassicGroupState.DEAD: frozenset(ClassicGroupState),
}

# What a classic group answers a heartbeat of a member it knows, at its generation (Kafka's
# classicGroupHeartbeatToClassicGroup): the error name, None for none. EMPTY has no members
# to know, DEAD answers COORDINATOR_NOT_AVAILABLE before validating anyone.
CLASSIC_HEARTBEAT_ANSWER: Mapping[ClassicGroupState, str | None] = {
    ClassicGroupState.EMPTY: "UNKNOWN_MEMBER_ID",
    ClassicGroupState.PREPARING_REBALANCE: "REBALANCE_IN_PROGRESS",
    ClassicGroupState.COMPLETING_REBALANCE: None,
    ClassicGroupState.STABLE: None,
    ClassicGroupState.DEAD: "COORDINATOR_NOT_AVAILABLE",
}


def check_classic_transition(
    group_id: str, state: ClassicGroupState, next_state: ClassicGroupState, event: str
) -> None:
    """Raise ``IllegalStateTransition`` unless ``state -> next_state`` is in the table.

    Unlike the consumer-group table, staying in a state is a transition too (Kafka's
    ``assertValidTransition``): only DEAD may be entered from itself.
    """
    if state not in VALID_PREVIOUS_CLASSIC_STATES[next_state]:
        raise errors.IllegalStateTransition(
            "classic group", group_id, state.name, next_state.name, event
        )


def check_group_transition(
    group_id: str, state: GroupState, next_state: GroupState, event: str
) -> None:
    """Raise ``IllegalStateTransition`` unless ``state -> next_state`` is in the table."""
    if state is next_state:
        return
    if state not in VALID_PREVIOUS_GROUP_STATES[next_state]:
        raise errors.IllegalStateTransition("group", group_id, state.name, next_state.name, event)


def check_member_transition(
    member_id: str, state: MemberState, next_state: MemberState, event: str
) -> None:
    """Raise ``IllegalStateTransition`` unless ``state -> next_state`` is in the table."""
    if state is next_state:
        return
    if state not in VALID_PREVIOUS_MEMBER_STATES[next_state]:
        raise errors.IllegalStateTransition("member", member_id, state.name, next_state.name, event)


def member_state_from_id(state_id: int) -> MemberState:
    """The member state stored in a record; ids this version does not know read as UNKNOWN."""
    try:
        return MemberState(state_id)
    except ValueError:
        return MemberState.UNKNOWN
