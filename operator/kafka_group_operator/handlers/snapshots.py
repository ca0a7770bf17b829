"""kopf registrations for the Spark jobs: OffsetSnapshots, scheduled snapshots, online resets,
the state-topic compaction. Thin glue: what to run is ``jobs.runs``, how it runs is the
``jobs.runner`` port (``spark.mode`` chooses a SparkApplication or local Spark for every job),
the reset's steps are ``jobs.reset_machine``, and the status words are ``manifests``.

* **OffsetSnapshot**: on create, start the snapshot run; a timer mirrors the run's progress
  into ``status`` (phase, conditions, location, records, takenAt, checksum). A failed run is
  retried as a new run, at most ``offset_jobs.MAX_ATTEMPTS`` times, with its reason shown.
* **ConsumerGroup.spec.snapshots**: a timer creates OffsetSnapshots on the cron schedule and
  prunes the oldest beyond ``historyLimit``.
* **ConsumerGroup.spec.offsetReset**: a timer observes the reset once per tick, feeds the
  state machine one event and carries out its actions (pause, plan with the restore job, write
  the plan through the embedded coordinator as one administrative commit, resume). The audit
  lands in ``status.lastReset``. Assignment stays paused while the ResetInProgress condition
  is True (``consumer_groups.reconcile`` honours it too).
* **Compaction** of the state topic on the chart's schedule (``KGO_COMPACTION_SCHEDULE``,
  checkpoints under ``KGO_COMPACTION_STORAGE_URI``), run like every other job.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.coordinator import messages
from kafka_group_operator.handlers import consumer_groups, kafka_probe, lifecycle, ownership
from kafka_group_operator.jobs import reset_machine, runs
from kafka_group_operator.jobs import runner as job_runner
from kafka_group_operator.jobs.reset_machine import Action, Event, State

# The demo runs jobs as the operator does; it reads these two from here.
from kafka_group_operator.jobs.runner import LOCAL_MASTER as LOCAL_MASTER
from kafka_group_operator.jobs.runner import outcome_of as outcome_of
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import conditions, group_settings, offset_jobs
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors as spec_errors
from kafka_group_operator.specs import offset_jobs as spec_views

SNAPSHOTS = ("kafkagroups.io", "v1alpha1", "offsetsnapshots")
CONSUMER_GROUPS = ("kafkagroups.io", "v1alpha1", "consumergroups")
COMPACTION_KEY = "kafka_group_operator_compaction"
COMPACTION_POLL_SECONDS = 10.0


def ready(
    status: bool | None, reason: str, message: str, previous: Any, generation: Any
) -> list[dict[str, Any]]:
    return conditions.merge_conditions(
        previous,
        [conditions.Condition(conditions.READY, status, reason, message)],
        generation,
        conditions.now_rfc3339(),
    )


@kopf.on.cleanup()
async def stop_local_runs(memo: Any, **_: Any) -> None:
    """Local runs die with the operator; their handlers start them again after a restart."""
    await job_runner.local_runner_of(memo).stop()


# ---------------------------------------------------------------------------------------
# OffsetSnapshot


class GroupNotFound(LookupError):
    """The snapshot's ``consumerGroupRef`` names no ConsumerGroup (yet): retried."""


async def _group_of(state: lifecycle.OperatorState, namespace: str, name: str) -> Any:
    body = await state.kube.get_or_none(kube_client.CONSUMER_GROUPS, namespace, name)
    if body is None:
        raise GroupNotFound(f"ConsumerGroup {name!r} (consumerGroupRef) does not exist")
    group = consumer_groups.parse(body)
    owner = await ownership.other_owner(state.runtime, group.group_id, body["metadata"])
    if owner is not None:
        # A second claimant of another resource's group id must not read its offsets.
        raise GroupNotFound(
            f"ConsumerGroup {name!r} does not own group id {group.group_id!r}: "
            + ownership.conflict_message(group.group_id, owner)
        )
    return group


def _polled(run_status: Mapping[str, Any], namespace: str, result_uri: str | None) -> Any:
    """The ``JobRun`` a status records, enough to poll it (polling needs no arguments)."""
    return job_runner.JobRun(
        job=str(run_status.get("job", "")),
        name=str(run_status["name"]),
        namespace=namespace,
        arguments=(),
        result_uri=result_uri,
    )


async def launch_snapshot(body: Mapping[str, Any], attempt: int, memo: Any) -> dict[str, Any]:
    """Starts attempt ``attempt`` of a snapshot run; returns the status to patch."""
    state = lifecycle.state_of(memo)
    meta, spec = body["metadata"], body.get("spec") or {}
    group = await _group_of(state, meta["namespace"], spec["consumerGroupRef"]["name"])
    run = runs.snapshot_run(
        body, attempt, state.config.bootstrap_servers, state.config.state_topic, group.group_id
    )
    runner = await job_runner.runner_for((spec.get("spark") or {}).get("mode"), state.kube, memo)
    await runner.start(run)
    operator = runner.mode == "operator"
    kind = "SparkApplication" if operator else "local Spark run"
    location = offset_jobs.snapshot_location(
        spec["storage"]["uri"], meta["namespace"], meta["name"]
    )
    return {
        "phase": "Pending" if operator else "Running",
        "sparkApplication": run.name if operator else None,
        "run": {"mode": runner.mode, "name": run.name, "job": run.job},
        "attempts": attempt,
        "location": location,
        "message": f"attempt {attempt}: {kind} {run.name}",
    }


@kopf.on.resume(*SNAPSHOTS)
@kopf.on.create(*SNAPSHOTS)
async def start_snapshot(
    body: kopf.Body,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    retry: int,
    memo: Any,
    **_: Any,
) -> None:
    generation = meta.get("generation")
    if status.get("phase") in ("Succeeded", "Failed") or status.get("run"):
        return  # finished, or a run is already followed by the timer
    try:
        update = await launch_snapshot(body, int(status.get("attempts") or 0) + 1, memo)
    except GroupNotFound as error:
        # Pending until the group appears (it may be applied after its snapshot).
        patch.status.update(
            {
                "phase": "Pending",
                "message": str(error),
                "conditions": ready(
                    False, "GroupNotFound", str(error), status.get("conditions"), generation
                ),
            }
        )
        base = lifecycle.state_of(memo).config.retry_base_seconds
        raise kopf.TemporaryError(
            str(error), delay=consumer_groups.retry_delay(retry, base)
        ) from error
    except kube_errors.Invalid as error:
        # The API server refused the SparkApplication (e.g. from spec.spark): a retry would
        # be refused the same way, so the snapshot fails with the reason.
        message = f"the API server refused the run: {error}"
        patch.status.update(
            {
                "phase": "Failed",
                "message": message,
                "conditions": ready(
                    False, "InvalidTemplate", message, status.get("conditions"), generation
                ),
            }
        )
        raise kopf.PermanentError(message) from error
    except kube_errors.Forbidden as error:
        message = f"the operator may not start the run: {error}"
        patch.status.update(
            {
                "phase": "Pending",
                "message": message,
                "conditions": ready(
                    False, "Forbidden", message, status.get("conditions"), generation
                ),
            }
        )
        base = lifecycle.state_of(memo).config.retry_base_seconds
        raise kopf.TemporaryError(
            message, delay=consumer_groups.retry_delay(retry, base)
        ) from error
    update["conditions"] = ready(
        False, "Running", update["message"], status.get("conditions"), generation
    )
    patch.status.update(update)


@kopf.timer(*SNAPSHOTS, interval=5.0, initial_delay=2.0)
async def follow_snapshot(
    body: kopf.Body,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    logger: Any,
    **_: Any,
) -> None:
    """Mirror the run's state; a line in the log when the phase changes."""
    await _follow_snapshot(body, status, meta, patch, memo)
    phase, message = patch.status.get("phase"), patch.status.get("message")
    if phase or message:
        logger.info("snapshot %s: %s", phase or status.get("phase"), message or "")


async def _follow_snapshot(
    body: kopf.Body, status: kopf.Status, meta: kopf.Meta, patch: kopf.Patch, memo: Any
) -> None:
    run_status = status.get("run") or {}
    if status.get("phase") not in ("Pending", "Running") or not run_status:
        return
    state = lifecycle.state_of(memo)
    mode = str(run_status.get("mode"))
    location = status.get("location")
    run = _polled(
        {"job": "snapshot", **run_status},
        meta["namespace"],
        f"{location}/{runs.SNAPSHOT_MANIFEST}" if location else None,
    )
    progress = await job_runner.runner_named(mode, state.kube, memo).poll(run)
    if progress.state is job_runner.RunState.UNKNOWN:
        lost = (
            f"SparkApplication {run.name} disappeared"
            if mode == "operator"
            else "the operator restarted during the local run"
        )
        outcome = job_runner.JobOutcome(False, reason=lost)
    elif progress.outcome is None:
        phase = "Pending" if progress.state is job_runner.RunState.PENDING else "Running"
        if phase != status.get("phase"):
            patch.status["phase"] = phase
        return
    else:
        outcome = progress.outcome
    generation = meta.get("generation")
    if outcome.succeeded:
        update = offset_jobs.snapshot_status(outcome.result or {"location": location})
        update["conditions"] = ready(
            True, "Succeeded", "snapshot written", status.get("conditions"), generation
        )
        patch.status.update(update)
        return
    attempts = int(status.get("attempts") or 1)
    retry, message = offset_jobs.next_attempt(attempts, outcome.reason or "the job failed")
    if retry:
        try:
            update = await launch_snapshot(body, attempts + 1, memo)
        except (GroupNotFound, kube_errors.Invalid) as error:
            # Nothing to retry with: the group is gone, or the API server refuses the run.
            reason = "GroupNotFound" if isinstance(error, GroupNotFound) else "InvalidTemplate"
            update = {"phase": "Failed", "message": f"{message}; no retry: {error}"}
            update["conditions"] = ready(
                False, reason, update["message"], status.get("conditions"), generation
            )
            patch.status.update(update)
            return
        update["message"] = message
        update["conditions"] = ready(
            False, "Retrying", message, status.get("conditions"), generation
        )
    else:
        update = {"phase": "Failed", "message": message}
        update["conditions"] = ready(
            False, "JobFailed", message, status.get("conditions"), generation
        )
    patch.status.update(update)


# ---------------------------------------------------------------------------------------
# ConsumerGroup.spec.snapshots


def _parse_time(text: str | None) -> datetime.datetime | None:
    return None if not text else datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


@kopf.timer(*CONSUMER_GROUPS, interval=30.0, initial_delay=5.0)
async def schedule_snapshots(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    logger: Any,
    **_: Any,
) -> None:
    schedule = spec.get("snapshots")
    if not schedule:
        return
    try:
        view = spec_views.parse_snapshot_schedule_spec(schedule)
    except spec_errors.InvalidSpec as error:
        scheduled = conditions.Condition(
            conditions.SNAPSHOTS_SCHEDULED, False, error.reason, error.message
        )
    else:
        scheduled = conditions.Condition(
            conditions.SNAPSHOTS_SCHEDULED, True, "Scheduled", "snapshots follow the schedule"
        )
    current = conditions.find(status.get("conditions"), conditions.SNAPSHOTS_SCHEDULED) or {}
    if (current.get("status"), current.get("message")) != (
        "True" if scheduled.status else "False",
        scheduled.message,
    ):
        logger.log(
            logging.INFO if scheduled.status else logging.WARNING,
            "snapshot schedule: %s",
            scheduled.message,
        )
        patch.status["conditions"] = conditions.merge_conditions(
            status.get("conditions"), [scheduled], meta.get("generation"), conditions.now_rfc3339()
        )
    if not scheduled.status:
        return  # reported; the next edit of the schedule is checked again
    kube = lifecycle.state_of(memo).kube
    history = status.get("snapshots") or {}
    now = datetime.datetime.now(datetime.UTC)
    created = _parse_time(meta.get("creationTimestamp")) or now
    due = offset_jobs.due_run(
        schedule["schedule"], _parse_time(history.get("lastScheduleTime")), created, now
    )
    if due is not None:
        snapshot = offset_jobs.build_scheduled_snapshot(body, schedule, due)
        # A conflict: an earlier tick created it and lost its status patch.
        with contextlib.suppress(kube_errors.Conflict):
            await kube.create(kube_client.OFFSET_SNAPSHOTS, meta["namespace"], snapshot)
        logger.info("scheduled snapshot %s created", snapshot["metadata"]["name"])
        patch.status["snapshots"] = {
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
        logger.info("snapshot %s deleted (beyond historyLimit)", name)


# ---------------------------------------------------------------------------------------
# ConsumerGroup.spec.offsetReset


class ResetFailed(RuntimeError):
    """The reset could not be planned or written; the group resumes untouched."""


def _released(description: messages.GroupDescription) -> bool:
    """No member owns, or still has to revoke, any partition."""
    return all(
        not any(member.assignment.values())
        and not any(member.partitions_pending_revocation.values())
        for member in description.members
    )


async def _set_paused(state: Any, body: Mapping[str, Any], paused: bool) -> None:
    group = consumer_groups.parse(body)
    await state.runtime.configure_group(
        group_settings.build_group_settings(group, paused_for_reset=paused)
    )


def _reset_condition(
    status: Mapping[str, Any], active: bool, reason: str, message: str, generation: Any
) -> list[dict[str, Any]]:
    return conditions.merge_conditions(
        status.get("conditions"),
        [conditions.Condition(conditions.RESET_IN_PROGRESS, active, reason, message)],
        generation,
        conditions.now_rfc3339(),
    )


@dataclass
class Observed:
    """What one tick saw: the event for the machine, and what its actions need."""

    event: Event
    message: str = ""
    reason: str = ""  # a refusal's reason word, shown in the ResetInProgress condition
    audit: dict[str, Any] | None = None


@dataclass
class ResetTick:
    """One tick of one ConsumerGroup's reset: what the actions read and write."""

    state: lifecycle.OperatorState
    body: Mapping[str, Any]
    group: specs.ConsumerGroupSpec
    offset_reset: Mapping[str, Any]
    current_status: Mapping[str, Any]
    progress: dict[str, Any]
    dry_run: bool
    memo: Any
    patch: kopf.Patch

    @property
    def generation(self) -> Any:
        return self.body["metadata"].get("generation")

    def plan_run(self, arguments: tuple[str, ...] = ()) -> job_runner.JobRun:
        fingerprint = self.progress["fingerprint"]
        results_uri = os.environ.get("KGO_SPARK_RESULTS_URI") or None
        return runs.reset_run(self.body, fingerprint, arguments, results_uri)


async def _observe(tick: ResetTick, state: State) -> Observed:
    """The one event this tick feeds the machine in ``state``."""
    if state is State.NEW:
        try:
            # Checked before anything pauses: a reset of what the group cannot have offsets
            # for is refused whole, never narrowed to what exists.
            specs.check_reset_scope(
                tick.offset_reset,
                tick.group.topics,
                await kafka_probe.partition_counts(
                    tick.group.kafka.bootstrap_servers,
                    tick.state.config.kafka_config,
                    tick.state.config.kafka_probe_timeout_seconds,
                ),
            )
        except spec_errors.KafkaUnreachable:
            return Observed(Event.KAFKA_UNREACHABLE)  # the group's Ready condition says why
        except spec_errors.InvalidResetScope as error:
            return Observed(Event.SCOPE_REFUSED, error.message, error.reason)
        return Observed(Event.SCOPE_ACCEPTED)
    if state is State.PAUSING:
        try:
            description = await tick.state.runtime.describe_group(tick.group.group_id)
        except coordinator_errors.GroupIdNotFound:
            description = None
        if description is not None and not _released(description):
            return Observed(Event.PARTITIONS_HELD)  # members are still committing, releasing
        return Observed(Event.PARTITIONS_RELEASED)
    # PLANNING: the restore job computes (and clamps) the plan; it never writes.
    recorded = tick.progress.get("run") or {}
    if not recorded:
        return Observed(Event.PLAN_NOT_RUNNING)
    run = tick.plan_run()
    runner = job_runner.runner_named(str(recorded.get("mode")), tick.state.kube, tick.memo)
    progress = await runner.poll(run)
    if progress.state is job_runner.RunState.UNKNOWN:
        return Observed(Event.PLAN_NOT_RUNNING)
    outcome = progress.outcome
    if outcome is None:
        return Observed(Event.PLAN_RUNNING)
    if not outcome.succeeded:
        return Observed(Event.PLAN_FAILED, outcome.reason or "the restore job failed")
    if outcome.result is None:
        where = run.result_uri or "nowhere (spark.resultsUri is not set)"
        message = f"the restore job succeeded but its plan at {where} cannot be read"
        return Observed(Event.PLAN_FAILED, message)
    return Observed(Event.PLAN_SUCCEEDED, audit=dict(outcome.result))


async def _start_plan(tick: ResetTick) -> None:
    state = tick.state
    arguments = offset_jobs.restore_arguments(
        state.config.bootstrap_servers,
        state.config.state_topic,
        tick.group.group_id,
        tick.offset_reset,
        tick.group.topics,
        await _snapshot_location(state, tick.body["metadata"]["namespace"], tick.offset_reset),
    )
    runner = await job_runner.runner_for(None, state.kube, tick.memo)
    run = tick.plan_run(tuple(arguments))
    if runner.mode == "operator" and run.result_uri is None:
        raise ResetFailed(
            "a restore planned by a SparkApplication needs spark.resultsUri (storage the "
            "operator can read) to hand its plan back; set it, or use spark.mode local"
        )
    await runner.start(run)
    tick.progress["run"] = {"mode": runner.mode, "name": run.name, "job": run.job}


async def _apply_plan(tick: ResetTick, audit: Mapping[str, Any]) -> None:
    planned = offset_jobs.commits_of(audit)
    if not planned:
        return
    response = await tick.state.runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=tick.group.group_id,
            member_id="",
            member_epoch=messages.LEAVE_EPOCH,
            offsets={tp: messages.CommitOffset(offset) for tp, offset in planned.items()},
        )
    )
    if response.errors:
        raise ResetFailed(f"the coordinator rejected: {dict(response.errors)}")


async def _carry_out(
    tick: ResetTick, transition: reset_machine.Transition, observed: Observed
) -> None:
    """Does the transition's actions in order, then records its new state."""
    last: dict[str, Any] = {**tick.progress, **reset_machine.status_of(transition.next_state)}
    for action in transition.actions:
        if action is Action.PAUSE:
            await _set_paused(tick.state, tick.body, True)
            if not consumer_groups.reset_in_progress(tick.current_status):
                tick.patch.status["conditions"] = _reset_condition(
                    tick.current_status,
                    True,
                    "Pausing",
                    "revoking every partition before the reset",
                    tick.generation,
                )
        elif action is Action.START_PLAN:
            await _start_plan(tick)
            last["run"] = tick.progress["run"]
        elif action is Action.APPLY_PLAN:
            assert observed.audit is not None
            await _apply_plan(tick, observed.audit)
        elif action is Action.RESUME:
            await _set_paused(tick.state, tick.body, False)
        elif action is Action.RECORD_PLAN:
            # The resource's own target and dryRun win over the plan-only job's view of them.
            last = {**(observed.audit or {}), **last}
        elif action is Action.RECORD_FAILURE:
            last["message"] = observed.message
            if observed.reason:
                last["reason"] = observed.reason
    if transition.next_state in reset_machine.FINISHED and (not tick.dry_run or observed.reason):
        done = transition.next_state is State.DONE
        tick.patch.status["conditions"] = _reset_condition(
            tick.current_status,
            False,
            "Done" if done else (observed.reason or "Failed"),
            "offsets reset" if done else observed.message,
            tick.generation,
        )
    if transition.next_state is not State.NEW:
        tick.patch.status["lastReset"] = last


async def _drive_offset_reset(
    body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, memo: Any
) -> None:
    offset_reset = spec.get("offsetReset")
    if not offset_jobs.reset_pending(offset_reset, None):
        return
    assert offset_reset is not None
    state = lifecycle.state_of(memo)
    # The body a timer sees can predate this handler's own last patch; deciding from it could
    # start a finished reset over (pausing the group again). Decide from the object as it is.
    current = await state.kube.get(kube_client.CONSUMER_GROUPS, meta["namespace"], meta["name"])
    current_status: Mapping[str, Any] = current.get("status") or {}
    last = dict(current_status.get("lastReset") or {})
    if not offset_jobs.reset_pending(offset_reset, last):
        return
    group = consumer_groups.parse(body)
    if not await ownership.owns(state.runtime, group.group_id, meta):
        return  # a second claimant of the group id (GroupIdConflict) resets nobody's offsets
    fingerprint = offset_jobs.reset_fingerprint(offset_reset)
    machine_state = reset_machine.state_of(last, fingerprint)
    try:
        refusal = None
        dry_run = spec_views.parse_offset_reset(offset_reset).dry_run
    except spec_errors.InvalidSpec as error:
        # Refused before anything pauses; a refusal records the same in either table.
        refusal = Observed(Event.SCOPE_REFUSED, error.message, error.reason)
        dry_run = True
    progress: dict[str, Any] = {
        "fingerprint": fingerprint,
        "target": dict(offset_reset),
        "dryRun": dry_run,
    }
    if machine_state is not State.NEW and last.get("run"):
        progress["run"] = last["run"]
    tick = ResetTick(
        state, body, group, offset_reset, current_status, progress, dry_run, memo, patch
    )
    failures = (
        ResetFailed,
        coordinator_errors.CoordinatorError,
        kube_errors.KubeError,
        ValueError,
    )
    try:
        observed = refusal or await _observe(tick, machine_state)
        transition = reset_machine.step(machine_state, observed.event, dry_run)
        await _carry_out(tick, transition, observed)
    except failures as error:
        # The transition is taken whole or not at all: a failed action fails the reset.
        observed = Observed(Event.ERROR, str(error))
        transition = reset_machine.step(machine_state, Event.ERROR, dry_run)
        try:
            await _carry_out(tick, transition, observed)
        except failures as again:
            # Could not even resume: the ResetInProgress=False condition makes the group's
            # reconcile configure it unpaused.
            tick.patch.status["conditions"] = _reset_condition(
                current_status, False, "Failed", f"{error}; {again}", tick.generation
            )
            tick.patch.status["lastReset"] = {
                **progress,
                **reset_machine.status_of(State.FAILED),
                "message": f"{error}; resuming failed: {again}",
            }


@kopf.timer(*CONSUMER_GROUPS, interval=3.0, initial_delay=1.0)
async def drive_offset_reset(
    body: kopf.Body,
    spec: kopf.Spec,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    logger: Any,
    **_: Any,
) -> None:
    """One step of a pending ``offsetReset``; a line in the log for each step taken."""
    await _drive_offset_reset(body, spec, meta, patch, memo)
    step = patch.status.get("lastReset")
    if step:
        logger.info(
            "offset reset to %s: %s %s%s",
            (spec.get("offsetReset") or {}).get("to"),
            step.get("stage"),
            step.get("phase"),
            f" ({step['message']})" if step.get("message") else "",
        )


async def _snapshot_location(
    state: Any, namespace: str, offset_reset: Mapping[str, Any]
) -> str | None:
    name = offset_reset.get("snapshot")
    if offset_reset.get("to") != "snapshot" or not name:
        return None
    snapshot = await state.kube.get_or_none(kube_client.OFFSET_SNAPSHOTS, namespace, name)
    snapshot_status = (snapshot or {}).get("status") or {}
    if snapshot_status.get("phase") != "Succeeded" or not snapshot_status.get("location"):
        raise ResetFailed(f"OffsetSnapshot {name!r} is not a finished snapshot")
    location: str = snapshot_status["location"]
    return location


# ---------------------------------------------------------------------------------------
# Scheduled compaction of the state topic


@kopf.on.startup()
async def start_compaction_schedule(memo: Any, logger: Any, **_: Any) -> None:
    schedule = os.environ.get("KGO_COMPACTION_SCHEDULE", "").strip()
    storage = os.environ.get("KGO_COMPACTION_STORAGE_URI", "").strip()
    if not schedule or not storage:
        logger.info("state-topic compaction is not scheduled (no schedule or storage URI)")
        return
    memo[COMPACTION_KEY] = asyncio.create_task(
        compaction_loop(schedule, storage, memo, logger), name="compaction-schedule"
    )


@kopf.on.cleanup()
async def stop_compaction_schedule(memo: Any, **_: Any) -> None:
    task = memo.get(COMPACTION_KEY)
    if isinstance(task, asyncio.Task):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def run_to_end(
    runner: job_runner.JobRunner, run: job_runner.JobRun, poll_seconds: float
) -> job_runner.JobOutcome:
    """Starts ``run`` and waits for its outcome (the compaction has no resource to patch)."""
    await runner.start(run)
    while True:
        progress = await runner.poll(run)
        if progress.state is job_runner.RunState.UNKNOWN:
            return job_runner.JobOutcome(False, reason=f"the run {run.name} disappeared")
        if progress.outcome is not None:
            return progress.outcome
        await asyncio.sleep(poll_seconds)


async def compaction_loop(schedule: str, storage: str, memo: Any, logger: Any) -> None:
    """Runs the compaction job at every scheduled time, for as long as the operator runs."""
    last = datetime.datetime.now(datetime.UTC)
    namespace = os.environ.get("KGO_POD_NAMESPACE", "default")
    while True:
        due = offset_jobs.next_run(schedule, last)
        await asyncio.sleep(max((due - datetime.datetime.now(datetime.UTC)).total_seconds(), 0))
        last = due
        state = memo.get(lifecycle.STATE_KEY)
        if not isinstance(state, lifecycle.OperatorState):
            logger.warning("compaction due at %s skipped: the coordinator is not running", due)
            continue
        run = runs.compaction_run(
            state.config.bootstrap_servers, state.config.state_topic, storage, due, namespace
        )
        try:
            runner = await job_runner.runner_for(None, state.kube, memo)
            outcome = await run_to_end(runner, run, COMPACTION_POLL_SECONDS)
        except (kube_errors.KubeError, ValueError) as error:
            outcome = job_runner.JobOutcome(False, reason=str(error))
        if outcome.succeeded:
            logger.info("state topic compacted: %s", outcome.result or run.result_uri)
        else:
            logger.error("state-topic compaction failed: %s", outcome.reason)
