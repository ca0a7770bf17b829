"""Every transition of the online reset's state machine, live and dry-run.

The expected rows are written out here, independently of the module's tables: a change to a
table must change this list too.
"""

from __future__ import annotations

import itertools

import pytest

from kafka_group_operator.jobs import reset_machine as rm
from kafka_group_operator.jobs.reset_machine import Action as A
from kafka_group_operator.jobs.reset_machine import Event as E
from kafka_group_operator.jobs.reset_machine import State as S

# (dry_run, state, event, next state, actions)
EXPECTED = [
    (False, S.NEW, E.SCOPE_REFUSED, S.FAILED, (A.RECORD_FAILURE,)),
    (False, S.NEW, E.KAFKA_UNREACHABLE, S.NEW, ()),
    (False, S.NEW, E.SCOPE_ACCEPTED, S.PAUSING, (A.PAUSE,)),
    (False, S.NEW, E.ERROR, S.FAILED, (A.RESUME, A.RECORD_FAILURE)),
    (False, S.PAUSING, E.PARTITIONS_HELD, S.PAUSING, (A.PAUSE,)),
    (False, S.PAUSING, E.PARTITIONS_RELEASED, S.PLANNING, (A.PAUSE, A.START_PLAN)),
    (False, S.PAUSING, E.ERROR, S.FAILED, (A.RESUME, A.RECORD_FAILURE)),
    (False, S.PLANNING, E.PLAN_NOT_RUNNING, S.PLANNING, (A.PAUSE, A.START_PLAN)),
    (False, S.PLANNING, E.PLAN_RUNNING, S.PLANNING, (A.PAUSE,)),
    (False, S.PLANNING, E.PLAN_SUCCEEDED, S.DONE, (A.APPLY_PLAN, A.RESUME, A.RECORD_PLAN)),
    (False, S.PLANNING, E.PLAN_FAILED, S.FAILED, (A.RESUME, A.RECORD_FAILURE)),
    (False, S.PLANNING, E.ERROR, S.FAILED, (A.RESUME, A.RECORD_FAILURE)),
    (True, S.NEW, E.SCOPE_REFUSED, S.FAILED, (A.RECORD_FAILURE,)),
    (True, S.NEW, E.KAFKA_UNREACHABLE, S.NEW, ()),
    (True, S.NEW, E.SCOPE_ACCEPTED, S.PLANNING, (A.START_PLAN,)),
    (True, S.NEW, E.ERROR, S.FAILED, (A.RECORD_FAILURE,)),
    (True, S.PLANNING, E.PLAN_NOT_RUNNING, S.PLANNING, (A.START_PLAN,)),
    (True, S.PLANNING, E.PLAN_RUNNING, S.PLANNING, ()),
    (True, S.PLANNING, E.PLAN_SUCCEEDED, S.DONE, (A.RECORD_PLAN,)),
    (True, S.PLANNING, E.PLAN_FAILED, S.FAILED, (A.RECORD_FAILURE,)),
    (True, S.PLANNING, E.ERROR, S.FAILED, (A.RECORD_FAILURE,)),
]


@pytest.mark.parametrize(
    ("dry_run", "state", "event", "next_state", "actions"),
    EXPECTED,
    ids=[f"{'dry' if d else 'live'}-{s.name}-{e.name}" for d, s, e, *_ in EXPECTED],
)
def test_each_transition(
    dry_run: bool, state: S, event: E, next_state: S, actions: tuple[A, ...]
) -> None:
    assert rm.step(state, event, dry_run) == rm.Transition(next_state, actions)


def test_the_tables_hold_exactly_the_expected_rows() -> None:
    for dry_run in (False, True):
        expected = {(s, e) for d, s, e, *_ in EXPECTED if d is dry_run}
        assert set(rm.table(dry_run)) == expected


@pytest.mark.parametrize("dry_run", [False, True])
def test_every_other_pair_is_illegal(dry_run: bool) -> None:
    legal = set(rm.table(dry_run))
    for state, event in itertools.product(S, E):
        if (state, event) in legal:
            continue
        with pytest.raises(rm.IllegalResetEvent, match=f"{state.name} on {event.name}"):
            rm.step(state, event, dry_run)


@pytest.mark.parametrize("dry_run", [False, True])
def test_nothing_leaves_a_finished_reset(dry_run: bool) -> None:
    assert not [key for key in rm.table(dry_run) if key[0] in rm.FINISHED]


def test_a_dry_run_never_pauses_writes_or_resumes() -> None:
    touching = {A.PAUSE, A.APPLY_PLAN, A.RESUME}
    assert not [t for t in rm.DRY_RUN.values() if touching & set(t.actions)]
    assert S.PAUSING not in {t.next_state for t in rm.DRY_RUN.values()}


def test_a_live_reset_that_paused_always_resumes_when_it_ends() -> None:
    # Any transition out of a paused state into a finished one resumes the group.
    for (state, _event), transition in rm.LIVE.items():
        if state in (S.PAUSING, S.PLANNING) and transition.next_state in rm.FINISHED:
            assert A.RESUME in transition.actions, (state, _event)
    # And the plan is written before the group resumes.
    done = rm.LIVE[S.PLANNING, E.PLAN_SUCCEEDED].actions
    assert done.index(A.APPLY_PLAN) < done.index(A.RESUME)


@pytest.mark.parametrize("dry_run", [False, True])
def test_every_state_can_finish(dry_run: bool) -> None:
    transitions = rm.table(dry_run)
    reach = set(rm.FINISHED)
    changed = True
    while changed:
        changed = False
        for (state, _), transition in transitions.items():
            if transition.next_state in reach and state not in reach:
                reach.add(state)
                changed = True
    assert {state for state, _ in transitions} <= reach


@pytest.mark.parametrize("state", [S.PAUSING, S.PLANNING, S.DONE, S.FAILED])
def test_status_round_trip(state: S) -> None:
    shown = {"fingerprint": "f1", **rm.status_of(state)}
    assert rm.state_of(shown, "f1") is state
    # The record of another value of spec.offsetReset is no progress on this one.
    assert rm.state_of(shown, "f2") is S.NEW


def test_status_as_the_reset_shows_it() -> None:
    # The words status.lastReset has always used (stage/phase), kept for existing readers.
    assert rm.status_of(S.PAUSING) == {"stage": "Pausing", "phase": "Running"}
    assert rm.status_of(S.PLANNING) == {"stage": "Planning", "phase": "Running"}
    assert rm.status_of(S.DONE) == {"stage": "Done", "phase": "Done"}
    assert rm.status_of(S.FAILED) == {"stage": "Done", "phase": "Failed"}
    assert rm.status_of(S.NEW) == {}
    assert rm.state_of(None, "f1") is S.NEW
    assert rm.state_of({"fingerprint": "f1", "stage": "Bogus", "phase": "?"}, "f1") is S.NEW
