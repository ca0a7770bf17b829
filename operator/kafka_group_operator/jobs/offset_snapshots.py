"""OffsetSnapshots and their schedule: starting a snapshot's run, following it into
``status``, and the scheduled snapshots of ``ConsumerGroup.spec.snapshots``.

The handlers (``handlers.snapshots``) call one function each and patch what it returns. What
a start refusal means is a table (``REFUSALS``); what a polled run means for the status is the
pure ``next_step``; the schedule's decisions are ``manifests.offset_jobs``. The I/O a snapshot
needs (the API server, the runner, finding its ConsumerGroup) comes in a ``SnapshotWorld``.

A snapshot reads its group's state partition up to the coordinator's read fence: its run gets
``--coordinator-url`` and the group's token (``runs.snapshot_run``).
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_group_operator.jobs import runner as job_runner
from kafka_group_operator.jobs import runs
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import conditions, offset_jobs
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors as spec_errors
from kafka_group_operator.specs import offset_jobs as spec_views


class GroupNotFound(LookupError):
    """The snapshot's ``consumerGroupRef`` names no ConsumerGroup (yet), or one that does not
    own its group id: retried."""


@dataclass(frozen=True)
class SnapshotWorld:
    """What a snapshot's handlers touch: the API server, the runners, the operator's settings,
    and ``find_group`` (the ConsumerGroup of a namespace and name, owning its group id, and its
    token as far as the operator knows it; raises ``GroupNotFound``)."""

    kube: kube_client.KubeClient
    memo: Any
    bootstrap: str
    state_topic: str
    coordinator_url: str | None
    find_group: Callable[
        [str, str], Awaitable[tuple[specs.ConsumerGroupSpec, job_runner.GroupToken | None]]
    ]


def ready(
    status: bool | None, reason: str, message: str, previous: Any, generation: Any
) -> list[dict[str, Any]]:
    return conditions.merge_conditions(
        previous,
        [conditions.Condition(conditions.READY, status, reason, message)],
        generation,
        conditions.now_rfc3339(),
    )


# ---------------------------------------------------------------------------------------
# Starting a run


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a start that raised means: the phase and Ready reason shown, and whether the
    start is retried (the handler's temporary error) or the snapshot fails."""

    phase: str
    reason: str
    prefix: str
    retried: bool


REFUSALS: Mapping[type[Exception], Refusal] = {
    # Pending until the group appears (it may be applied after its snapshot).
    GroupNotFound: Refusal("Pending", "GroupNotFound", "", retried=True),
    # The API server refused the SparkApplication (e.g. from spec.spark): a retry would be
    # refused the same way.
    kube_errors.Invalid: Refusal(
        "Failed", "InvalidTemplate", "the API server refused the run: ", retried=False
    ),
    # A spec the CRD's schema would refuse (a server without it let it through).
    spec_errors.InvalidSpec: Refusal("Failed", "InvalidSpec", "", retried=False),
    # RBAC may be fixed without any edit of the snapshot.
    kube_errors.Forbidden: Refusal(
        "Pending", "Forbidden", "the operator may not start the run: ", retried=True
    ),
}


@dataclass(frozen=True, slots=True)
class Started:
    """What ``start`` did: the status to patch, and a refusal's message and retry."""

    status: dict[str, Any]
    refused: str | None = None
    retried: bool = False


async def launch(world: SnapshotWorld, body: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """Starts attempt ``attempt`` of a snapshot run; returns the status to patch."""
    meta = body["metadata"]
    view = spec_views.parse_offset_snapshot(meta["name"], meta["namespace"], body.get("spec") or {})
    group, token = await world.find_group(meta["namespace"], view.group_name)
    run = runs.snapshot_run(
        body,
        attempt,
        world.bootstrap,
        world.state_topic,
        group.group_id,
        world.coordinator_url,
        token,
    )
    mode = None if view.spark is None else view.spark.mode
    runner = await job_runner.runner_for(mode, world.kube, world.memo)
    await runner.start(run)
    operator = runner.mode == "operator"
    kind = "SparkApplication" if operator else "local Spark run"
    return {
        "phase": "Pending" if operator else "Running",
        "sparkApplication": run.name if operator else None,
        "run": {"mode": runner.mode, "name": run.name, "job": run.job},
        "attempts": attempt,
        "location": offset_jobs.snapshot_location(view.storage.uri, view.namespace, view.name),
        "message": f"attempt {attempt}: {kind} {run.name}",
    }


def started(status: Mapping[str, Any]) -> bool:
    """Finished, or a run is already followed by the timer: nothing to start."""
    return status.get("phase") in ("Succeeded", "Failed") or bool(status.get("run"))


async def start(
    world: SnapshotWorld, body: Mapping[str, Any], status: Mapping[str, Any]
) -> Started:
    """Starts the next attempt; a refusal in ``REFUSALS`` is shown in the status."""
    generation = body["metadata"].get("generation")
    try:
        update = await launch(world, body, int(status.get("attempts") or 0) + 1)
    except tuple(REFUSALS) as error:
        refusal = next(r for kind, r in REFUSALS.items() if isinstance(error, kind))
        message = f"{refusal.prefix}{error}"
        shown = {
            "phase": refusal.phase,
            "message": message,
            "conditions": ready(
                False, refusal.reason, message, status.get("conditions"), generation
            ),
        }
        return Started(shown, message, refusal.retried)
    update["conditions"] = ready(
        False, "Running", update["message"], status.get("conditions"), generation
    )
    return Started(update)


# ---------------------------------------------------------------------------------------
# Following a run


class StepKind(enum.Enum):
    WAIT = "the run goes on; its phase is shown"
    SUCCEEDED = "the run wrote the snapshot"
    RETRY = "the run failed; another attempt starts"
    FAILED = "the run failed, and no attempt is left"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    phase: str = ""
    message: str = ""
    result: Mapping[str, Any] | None = None


def lost_reason(mode: str, name: str) -> str:
    if mode == "operator":
        return f"SparkApplication {name} disappeared"
    return "the operator restarted during the local run"


def next_step(progress: job_runner.Progress, run_status: Mapping[str, Any], attempts: int) -> Step:
    """What a polled run means for the snapshot (pure)."""
    if progress.state is job_runner.RunState.UNKNOWN:
        outcome = job_runner.JobOutcome(
            False,
            reason=lost_reason(str(run_status.get("mode")), str(run_status.get("name"))),
        )
    elif progress.outcome is None:
        phase = "Pending" if progress.state is job_runner.RunState.PENDING else "Running"
        return Step(StepKind.WAIT, phase)
    else:
        outcome = progress.outcome
    if outcome.succeeded:
        return Step(StepKind.SUCCEEDED, result=outcome.result)
    retry, message = offset_jobs.next_attempt(attempts, outcome.reason or "the job failed")
    return Step(StepKind.RETRY if retry else StepKind.FAILED, message=message)


def followed(status: Mapping[str, Any]) -> bool:
    """A run is under way and is followed."""
    return status.get("phase") in ("Pending", "Running") and bool(status.get("run"))


async def follow(
    world: SnapshotWorld, body: Mapping[str, Any], status: Mapping[str, Any]
) -> dict[str, Any]:
    """Polls the run the status records; returns the status fields that change."""
    if not followed(status):
        return {}
    run_status, location = status["run"], status.get("location")
    run = job_runner.JobRun(
        job=str(run_status.get("job") or "snapshot"),
        name=str(run_status["name"]),
        namespace=body["metadata"]["namespace"],
        arguments=(),  # polling needs none
        result_uri=f"{location}/{runs.SNAPSHOT_MANIFEST}" if location else None,
    )
    runner = job_runner.runner_named(str(run_status.get("mode")), world.kube, world.memo)
    attempts = int(status.get("attempts") or 1)
    step = next_step(await runner.poll(run), run_status, attempts)
    generation = body["metadata"].get("generation")
    previous = status.get("conditions")
    if step.kind is StepKind.WAIT:
        return {"phase": step.phase} if step.phase != status.get("phase") else {}
    if step.kind is StepKind.SUCCEEDED:
        update = offset_jobs.snapshot_status(step.result or {"location": location})
        update["conditions"] = ready(True, "Succeeded", "snapshot written", previous, generation)
        return update
    if step.kind is StepKind.FAILED:
        return {
            "phase": "Failed",
            "message": step.message,
            "conditions": ready(False, "JobFailed", step.message, previous, generation),
        }
    try:
        update = await launch(world, body, attempts + 1)
    except (GroupNotFound, kube_errors.Invalid, spec_errors.InvalidSpec) as error:
        # Nothing to retry with: the group is gone, or the API server refuses the run.
        reason = next(r.reason for kind, r in REFUSALS.items() if isinstance(error, kind))
        message = f"{step.message}; no retry: {error}"
        return {
            "phase": "Failed",
            "message": message,
            "conditions": ready(False, reason, message, previous, generation),
        }
    update["message"] = step.message
    update["conditions"] = ready(False, "Retrying", step.message, previous, generation)
    return update


# ---------------------------------------------------------------------------------------
# ConsumerGroup.spec.snapshots


@dataclass
class ScheduleTick:
    """What one tick of a schedule did: the status to patch, and lines for the log."""

    status: dict[str, Any] = field(default_factory=dict)
    log: list[tuple[int, str]] = field(default_factory=list)


def parse_time(text: str | None) -> datetime.datetime | None:
    return None if not text else datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def schedule_condition(schedule: Mapping[str, Any]) -> conditions.Condition:
    """SnapshotsScheduled: whether ``spec.snapshots`` is a schedule the operator follows."""
    try:
        spec_views.parse_snapshot_schedule_spec(schedule)
    except spec_errors.InvalidSpec as error:
        return conditions.Condition(
            conditions.SNAPSHOTS_SCHEDULED, False, error.reason, error.message
        )
    return conditions.Condition(
        conditions.SNAPSHOTS_SCHEDULED, True, "Scheduled", "snapshots follow the schedule"
    )


async def schedule_tick(
    kube: kube_client.KubeClient,
    body: Mapping[str, Any],
    status: Mapping[str, Any],
    now: datetime.datetime,
) -> ScheduleTick:
    """Creates the snapshot that is due, if any, and prunes those beyond ``historyLimit``."""
    meta, schedule = body["metadata"], (body.get("spec") or {}).get("snapshots")
    done = ScheduleTick()
    if not schedule:
        return done
    scheduled = schedule_condition(schedule)
    current = conditions.find(status.get("conditions"), conditions.SNAPSHOTS_SCHEDULED) or {}
    if (current.get("status"), current.get("message")) != (
        "True" if scheduled.status else "False",
        scheduled.message,
    ):
        level = logging.INFO if scheduled.status else logging.WARNING
        done.log.append((level, f"snapshot schedule: {scheduled.message}"))
        done.status["conditions"] = conditions.merge_conditions(
            status.get("conditions"), [scheduled], meta.get("generation"), conditions.now_rfc3339()
        )
    if not scheduled.status:
        return done  # reported; the next edit of the schedule is checked again
    view = spec_views.parse_snapshot_schedule_spec(schedule)
    history = status.get("snapshots") or {}
    created = parse_time(meta.get("creationTimestamp")) or now
    due = offset_jobs.due_run(
        view.schedule, parse_time(history.get("lastScheduleTime")), created, now
    )
    if due is not None:
        snapshot = offset_jobs.build_scheduled_snapshot(body, schedule, due)
        # A conflict: an earlier tick created it and lost its status patch.
        with contextlib.suppress(kube_errors.Conflict):
            await kube.create(kube_client.OFFSET_SNAPSHOTS, meta["namespace"], snapshot)
        done.log.append(
            (logging.INFO, f"scheduled snapshot {snapshot['metadata']['name']} created")
        )
        done.status["snapshots"] = {
            "lastScheduleTime": due.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastSnapshot": snapshot["metadata"]["name"],
        }
    existing = await kube.list(
        kube_client.OFFSET_SNAPSHOTS,
        meta["namespace"],
        labels={offset_jobs.SCHEDULED_BY_LABEL: meta["name"]},
    )
    for name in offset_jobs.snapshots_to_prune(existing, view.history_limit):
        await kube.delete(kube_client.OFFSET_SNAPSHOTS, meta["namespace"], name)
        done.log.append((logging.INFO, f"snapshot {name} deleted (beyond historyLimit)"))
    return done
