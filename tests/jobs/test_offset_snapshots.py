"""The pure decisions of a snapshot run (``jobs.offset_snapshots``): what a polled run means
for the OffsetSnapshot, and what each start refusal shows."""

from __future__ import annotations

import pytest

from kafka_group_operator.jobs import offset_snapshots as snapshots
from kafka_group_operator.jobs import runner
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import offset_jobs
from kafka_group_operator.specs import errors as spec_errors

LOCAL = {"mode": "local", "name": "nightly-snapshot-1", "job": "snapshot"}
CLUSTER = {"mode": "operator", "name": "nightly-snapshot-2", "job": "snapshot"}


@pytest.mark.parametrize(
    ("state", "phase"),
    [(runner.RunState.PENDING, "Pending"), (runner.RunState.RUNNING, "Running")],
)
def test_a_run_under_way_shows_its_phase(state: runner.RunState, phase: str) -> None:
    step = snapshots.next_step(runner.Progress(state), LOCAL, 1)
    assert step == snapshots.Step(snapshots.StepKind.WAIT, phase)


def test_a_finished_run_hands_its_manifest_over() -> None:
    outcome = runner.JobOutcome(True, {"records": 3})
    step = snapshots.next_step(runner.Progress(runner.RunState.FINISHED, outcome), LOCAL, 1)
    assert (step.kind, step.result) == (snapshots.StepKind.SUCCEEDED, {"records": 3})


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        (LOCAL, "the operator restarted during the local run"),
        (CLUSTER, "SparkApplication nightly-snapshot-2 disappeared"),
    ],
)
def test_a_lost_run_is_a_failed_attempt_with_its_reason(run: dict[str, str], reason: str) -> None:
    step = snapshots.next_step(runner.Progress(runner.RunState.UNKNOWN), run, 1)
    assert step.kind is snapshots.StepKind.RETRY
    assert step.message == f"attempt 1 of {offset_jobs.MAX_ATTEMPTS} failed, retrying: {reason}"


def test_the_last_attempt_fails_the_snapshot() -> None:
    failed = runner.Progress(runner.RunState.FINISHED, runner.JobOutcome(False, reason="OOM"))
    retried = snapshots.next_step(failed, CLUSTER, offset_jobs.MAX_ATTEMPTS - 1)
    assert retried.kind is snapshots.StepKind.RETRY
    last = snapshots.next_step(failed, CLUSTER, offset_jobs.MAX_ATTEMPTS)
    assert last.kind is snapshots.StepKind.FAILED
    assert last.message == f"failed after {offset_jobs.MAX_ATTEMPTS} attempts: OOM"


def test_each_start_refusal_says_whether_it_is_retried() -> None:
    shown = {kind: (r.phase, r.reason, r.retried) for kind, r in snapshots.REFUSALS.items()}
    assert shown == {
        snapshots.GroupNotFound: ("Pending", "GroupNotFound", True),
        kube_errors.Invalid: ("Failed", "InvalidTemplate", False),
        spec_errors.InvalidSpec: ("Failed", "InvalidSpec", False),
        kube_errors.Forbidden: ("Pending", "Forbidden", True),
    }


def test_only_a_run_under_way_is_followed_and_only_a_new_snapshot_started() -> None:
    assert snapshots.followed({"phase": "Running", "run": LOCAL})
    assert not snapshots.followed({"phase": "Succeeded", "run": LOCAL})
    assert not snapshots.followed({"phase": "Pending"})  # waiting for its group
    assert snapshots.started({"phase": "Failed"})
    assert snapshots.started({"phase": "Pending", "run": LOCAL})
    assert not snapshots.started({"phase": "Pending"})
