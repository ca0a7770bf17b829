"""The online offset reset (``ConsumerGroup.spec.offsetReset``) as a table-driven state machine.

Pure: no I/O, no clock. The reset handler observes the world once per tick, turns what it saw
into one ``Event``, asks ``step`` for the ``Transition`` and carries out its actions in order.
The new state is recorded (in ``status.lastReset``) only when every action succeeded; when an
action fails, the handler feeds ``Event.ERROR`` from the state it started the tick in, so a
transition is taken whole or not at all.

States, as ``status.lastReset`` shows them (``stage``/``phase``):

=========  ==================  ==============================================================
NEW        (none)              the value of ``spec.offsetReset`` has not been acted on
PAUSING    Pausing/Running     assignment paused; members commit and release their partitions
PLANNING   Planning/Running    the restore job plans (and clamps) the new offsets; it never writes
DONE       Done/Done           the plan was written as one administrative commit (or, for
                               ``dryRun``, only recorded); the group resumed
FAILED     Done/Failed         refused or failed; nothing was written; the group resumed
=========  ==================  ==============================================================

A ``dryRun`` reset never pauses, never writes and never resumes: it goes straight to PLANNING
and records the plan. The two modes have their own tables, so each action is visible as data.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class State(enum.Enum):
    NEW = "New"
    PAUSING = "Pausing"
    PLANNING = "Planning"
    DONE = "Done"
    FAILED = "Failed"


class Event(enum.Enum):
    # NEW
    SCOPE_REFUSED = "the reset names partitions or topics the group has no offsets for"
    KAFKA_UNREACHABLE = "the partition counts could not be read; tried again next tick"
    SCOPE_ACCEPTED = "every partition of the reset exists and is the group's"
    # PAUSING
    PARTITIONS_HELD = "a member still owns or has to revoke a partition"
    PARTITIONS_RELEASED = "no member owns or has to revoke any partition"
    # PLANNING
    # A run is started on entering PLANNING; a local run is lost when the operator restarts.
    PLAN_NOT_RUNNING = "no run of the restore job is known"
    PLAN_RUNNING = "the restore job is still running"
    PLAN_SUCCEEDED = "the restore job returned a plan"
    PLAN_FAILED = "the restore job failed"
    # any active state
    ERROR = "an action failed (the coordinator or the API server refused)"


class Action(enum.Enum):
    PAUSE = "pause assignment and show ResetInProgress=True (re-asserted every tick)"
    START_PLAN = "start the restore job, planning only"
    APPLY_PLAN = "write the plan through the coordinator as one administrative commit"
    RESUME = "resume assignment and show ResetInProgress=False"
    RECORD_PLAN = "record the plan's audit in status.lastReset"
    RECORD_FAILURE = "record the reason in status.lastReset (and ResetInProgress=False)"


@dataclass(frozen=True, slots=True)
class Transition:
    next_state: State
    actions: tuple[Action, ...] = ()


class IllegalResetEvent(ValueError):
    """An event that cannot happen in the state the reset is in (a handler bug)."""


_T = Transition

# (state, event) -> transition, for a reset that writes (``dryRun: false``).
LIVE: Mapping[tuple[State, Event], Transition] = {
    (State.NEW, Event.SCOPE_REFUSED): _T(State.FAILED, (Action.RECORD_FAILURE,)),
    (State.NEW, Event.KAFKA_UNREACHABLE): _T(State.NEW),
    (State.NEW, Event.SCOPE_ACCEPTED): _T(State.PAUSING, (Action.PAUSE,)),
    (State.NEW, Event.ERROR): _T(State.FAILED, (Action.RESUME, Action.RECORD_FAILURE)),
    # Pause is re-asserted every tick: a reconcile that read the status before the pause
    # began may have configured the group unpaused again.
    (State.PAUSING, Event.PARTITIONS_HELD): _T(State.PAUSING, (Action.PAUSE,)),
    (State.PAUSING, Event.PARTITIONS_RELEASED): _T(
        State.PLANNING, (Action.PAUSE, Action.START_PLAN)
    ),
    (State.PAUSING, Event.ERROR): _T(State.FAILED, (Action.RESUME, Action.RECORD_FAILURE)),
    (State.PLANNING, Event.PLAN_NOT_RUNNING): _T(State.PLANNING, (Action.PAUSE, Action.START_PLAN)),
    (State.PLANNING, Event.PLAN_RUNNING): _T(State.PLANNING, (Action.PAUSE,)),
    (State.PLANNING, Event.PLAN_SUCCEEDED): _T(
        State.DONE, (Action.APPLY_PLAN, Action.RESUME, Action.RECORD_PLAN)
    ),
    (State.PLANNING, Event.PLAN_FAILED): _T(State.FAILED, (Action.RESUME, Action.RECORD_FAILURE)),
    (State.PLANNING, Event.ERROR): _T(State.FAILED, (Action.RESUME, Action.RECORD_FAILURE)),
}

# The same for ``dryRun: true``: nothing pauses, nothing is written, nothing resumes.
DRY_RUN: Mapping[tuple[State, Event], Transition] = {
    (State.NEW, Event.SCOPE_REFUSED): _T(State.FAILED, (Action.RECORD_FAILURE,)),
    (State.NEW, Event.KAFKA_UNREACHABLE): _T(State.NEW),
    (State.NEW, Event.SCOPE_ACCEPTED): _T(State.PLANNING, (Action.START_PLAN,)),
    (State.NEW, Event.ERROR): _T(State.FAILED, (Action.RECORD_FAILURE,)),
    (State.PLANNING, Event.PLAN_NOT_RUNNING): _T(State.PLANNING, (Action.START_PLAN,)),
    (State.PLANNING, Event.PLAN_RUNNING): _T(State.PLANNING),
    (State.PLANNING, Event.PLAN_SUCCEEDED): _T(State.DONE, (Action.RECORD_PLAN,)),
    (State.PLANNING, Event.PLAN_FAILED): _T(State.FAILED, (Action.RECORD_FAILURE,)),
    (State.PLANNING, Event.ERROR): _T(State.FAILED, (Action.RECORD_FAILURE,)),
}

FINISHED = frozenset({State.DONE, State.FAILED})


def table(dry_run: bool) -> Mapping[tuple[State, Event], Transition]:
    return DRY_RUN if dry_run else LIVE


def step(state: State, event: Event, dry_run: bool) -> Transition:
    """The transition ``event`` takes from ``state``; ``IllegalResetEvent`` if there is none."""
    try:
        return table(dry_run)[state, event]
    except KeyError:
        mode = "dry-run" if dry_run else "live"
        raise IllegalResetEvent(
            f"{mode} reset: no transition from {state.name} on {event.name}"
        ) from None


# What ``status.lastReset`` shows for each state (``stage``, ``phase``).
STATUS: Mapping[State, tuple[str, str]] = {
    State.PAUSING: ("Pausing", "Running"),
    State.PLANNING: ("Planning", "Running"),
    State.DONE: ("Done", "Done"),
    State.FAILED: ("Done", "Failed"),
}


def state_of(last_reset: Mapping[str, object] | None, fingerprint: str) -> State:
    """The state recorded in ``status.lastReset`` for this value of ``spec.offsetReset``.

    A record of another value (another fingerprint) or of no known stage reads as NEW.
    """
    last = last_reset or {}
    if last.get("fingerprint") != fingerprint:
        return State.NEW
    recorded = (last.get("stage"), last.get("phase"))
    for state, shown in STATUS.items():
        if shown == recorded:
            return state
    return State.NEW


def status_of(state: State) -> dict[str, str]:
    """The ``stage`` and ``phase`` fields that record ``state`` (NEW records nothing)."""
    if state is State.NEW:
        return {}
    stage, phase = STATUS[state]
    return {"stage": stage, "phase": phase}
