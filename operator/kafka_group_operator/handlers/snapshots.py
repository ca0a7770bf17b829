"""kopf handlers for the Spark jobs: OffsetSnapshots, scheduled snapshots, online resets.

* **OffsetSnapshot**: on create, run the snapshot job, as a SparkApplication when the
  spark-operator is installed (``spec.spark.mode`` auto or operator) or as local Spark in a
  subprocess of the operator (mode local, or auto without the CRD); a timer mirrors the run's
  state into ``status`` (phase, conditions, location, records, takenAt, checksum). A failed run
  is retried as a new run, at most ``offset_jobs.MAX_ATTEMPTS`` times, with its reason shown.
* **ConsumerGroup.spec.snapshots**: a timer creates OffsetSnapshots on the cron schedule and
  prunes the oldest beyond ``historyLimit``.
* **Compaction** of the state topic on the chart's schedule (``KGO_COMPACTION_SCHEDULE``,
  checkpoints under ``KGO_COMPACTION_STORAGE_URI``), as local Spark runs of the operator.
* **ConsumerGroup.spec.offsetReset**: a timer drives the reset once per value of the field:
  pause assignment (every member commits and releases cooperatively), wait until no partition
  is owned, plan with the restore job (which clamps and audits), write the plan through the
  embedded coordinator as an administrative commit, resume. The audit lands in
  ``status.lastReset``; ``dryRun`` only plans. Assignment stays paused while the
  ResetInProgress condition is True (``consumer_groups.reconcile`` honours it too).

Decisions live in ``manifests.offset_jobs`` and ``manifests.spark_application``; this module
only calls the API, the coordinator and subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.coordinator import messages
from kafka_group_operator.handlers import consumer_groups, kafka_probe, lifecycle, ownership
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.kube import spark as kube_spark
from kafka_group_operator.manifests import conditions, group_settings, offset_jobs
from kafka_group_operator.manifests import spark_application as spark_manifests
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors as spec_errors

SNAPSHOTS = ("kafkagroups.io", "v1alpha1", "offsetsnapshots")
CONSUMER_GROUPS = ("kafkagroups.io", "v1alpha1", "consumergroups")
LOCAL_JOBS_KEY = "kafka_group_operator_local_jobs"
RESULT_PREFIX = "KGO-RESULT "  # what kafka_group_jobs.arguments.emit_result prints
LOCAL_MASTER = "local[2]"
COMPACTION_KEY = "kafka_group_operator_compaction"


# ---------------------------------------------------------------------------------------
# Settings and local runs


def spark_defaults(
    env: Mapping[str, str] | None = None,
) -> tuple[str, spark_manifests.SparkSettings]:
    """The chart's Spark settings (``KGO_SPARK_*``): the default mode and the run settings."""
    environ = os.environ if env is None else env
    settings = spark_manifests.SparkSettings(
        image=environ.get("KGO_SPARK_IMAGE", "ghcr.io/kafka-group-operator/kafka-group-jobs:0.1.0"),
        service_account=environ.get("KGO_SPARK_SERVICE_ACCOUNT", "spark"),
        spark_conf=json.loads(environ.get("KGO_SPARK_CONF") or "{}"),
    )
    return environ.get("KGO_SPARK_MODE", "auto"), settings


@dataclass(frozen=True, slots=True)
class JobOutcome:
    succeeded: bool
    result: dict[str, Any] | None = None
    reason: str = ""


# What kafka_group_jobs.arguments.run prints for every failure it expects.
_JOB_ERROR = re.compile(r"^kafka_group_jobs\.\w+: error: (?P<message>.+)$")
# A Python or Java exception line ("pkg.SomeError: message", "Caused by: java.io.X: ..."),
# never a stack frame ("\tat org.apache...Exception..." is indented, log lines start with a date).
_EXCEPTION_LINE = re.compile(
    r"^(?:Caused by: )?(?:[A-Za-z_][\w$]*\.)*[A-Za-z_][\w$]*(?:Error|Exception|Exit)\w*(?::\s.*)?$"
)


def outcome_of(returncode: int, stdout: str, stderr: str) -> JobOutcome:
    """A job's result line, or the clearest reason it failed (see ``failure_reason``)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX) and returncode == 0:
            return JobOutcome(True, json.loads(line.removeprefix(RESULT_PREFIX)))
    return JobOutcome(False, reason=failure_reason(returncode, stderr)[:500])


def failure_reason(returncode: int, stderr: str) -> str:
    """The exception's message, not whatever the JVM logged last.

    In order: the job's own ``error:`` line; else the exception line that ends the last
    Python traceback; else the last Python or Java exception line; else the last line.
    """
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if match := _JOB_ERROR.match(line):
            return match["message"]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if starts:
        for line in lines[starts[-1] + 1 :]:
            if not line[0].isspace():
                return line
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1].strip() if lines else f"exit status {returncode}"


async def run_local_job(job: str, arguments: Sequence[str]) -> JobOutcome:
    """Runs ``python -m kafka_group_jobs.<job>`` on local Spark and waits for it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        f"kafka_group_jobs.{job}",
        *arguments,
        "--master",
        LOCAL_MASTER,
        "--json",  # the result as one KGO-RESULT line, for outcome_of
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    return outcome_of(
        process.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")
    )


@dataclass
class LocalJobs:
    """Local runs of this operator process, by run name (lost, and so retried, on restart)."""

    tasks: dict[str, asyncio.Task[JobOutcome]] = field(default_factory=dict)

    def start(self, name: str, job: str, arguments: Sequence[str]) -> None:
        if name not in self.tasks:
            self.tasks[name] = asyncio.create_task(run_local_job(job, arguments), name=name)

    def known(self, name: str) -> bool:
        return name in self.tasks

    def outcome(self, name: str) -> JobOutcome | None:
        """The finished run's outcome (forgotten once read), or None while it runs."""
        task = self.tasks[name]
        if not task.done():
            return None
        del self.tasks[name]
        if task.cancelled():
            return JobOutcome(False, reason="the run was cancelled")
        error = task.exception()
        if error is not None:
            return JobOutcome(False, reason=f"could not run the job: {error}")
        return task.result()


def local_jobs_of(memo: Any) -> LocalJobs:
    jobs = memo.get(LOCAL_JOBS_KEY)
    if not isinstance(jobs, LocalJobs):
        jobs = LocalJobs()
        memo[LOCAL_JOBS_KEY] = jobs
    return jobs


def kafka_arguments() -> list[str]:
    # The operator's own Kafka settings dir (a mounted Secret): passed by path, never by value.
    config_dir = os.environ.get("KGO_KAFKA_CONFIG_DIR")
    return ["--kafka-config-dir", config_dir] if config_dir else []


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


async def launch_snapshot(body: Mapping[str, Any], attempt: int, memo: Any) -> dict[str, Any]:
    """Starts attempt ``attempt`` of a snapshot run; returns the status to patch."""
    state = lifecycle.state_of(memo)
    meta, spec = body["metadata"], body.get("spec") or {}
    group = await _group_of(state, meta["namespace"], spec["consumerGroupRef"]["name"])
    location = offset_jobs.snapshot_location(
        spec["storage"]["uri"], meta["namespace"], meta["name"]
    )
    arguments = offset_jobs.snapshot_arguments(
        state.config.bootstrap_servers,
        state.config.state_topic,
        group.group_id,
        location,
        spec.get("asOf"),
    )
    default_mode, defaults = spark_defaults()
    mode = (spec.get("spark") or {}).get("mode") or default_mode
    if mode == "auto":
        mode = "operator" if await kube_spark.spark_operator_installed(state.kube) else "local"
    name = spark_manifests.application_name(meta["name"], "snapshot", meta["uid"], attempt)
    if mode == "operator":
        uri = spec["storage"]["uri"]
        claim = uri.removeprefix("pvc://").split("/")[0] if uri.startswith("pvc://") else None
        application = spark_manifests.build_spark_application(
            owner=body,
            job="snapshot",
            arguments=arguments,
            settings=spark_manifests.overlay(defaults, spec.get("spark")),
            attempt=attempt,
            storage_claim=claim,
        )
        await kube_spark.create_application(state.kube, application)
    else:
        local_jobs_of(memo).start(name, "snapshot", [*arguments, *kafka_arguments()])
    kind = "SparkApplication" if mode == "operator" else "local Spark run"
    return {
        "phase": "Pending" if mode == "operator" else "Running",
        "sparkApplication": name if mode == "operator" else None,
        "run": {"mode": mode, "name": name},
        "attempts": attempt,
        "location": location,
        "message": f"attempt {attempt}: {kind} {name}",
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
    run = status.get("run") or {}
    if status.get("phase") not in ("Pending", "Running") or not run:
        return
    state = lifecycle.state_of(memo)
    outcome: JobOutcome | None
    if run.get("mode") == "operator":
        application = await kube_spark.get_application(state.kube, meta["namespace"], run["name"])
        if application is None:
            outcome = JobOutcome(False, reason=f"SparkApplication {run['name']} disappeared")
        else:
            phase, error = spark_manifests.phase_of(application)
            if phase in ("Pending", "Running"):
                if phase != status.get("phase"):
                    patch.status["phase"] = phase
                return
            outcome = JobOutcome(
                phase == "Succeeded", _manifest_if_readable(status.get("location")), error
            )
    else:
        jobs = local_jobs_of(memo)
        if not jobs.known(run["name"]):
            outcome = JobOutcome(False, reason="the operator restarted during the local run")
        else:
            outcome = jobs.outcome(run["name"])
            if outcome is None:
                return
    generation = meta.get("generation")
    if outcome.succeeded:
        update = offset_jobs.snapshot_status(outcome.result or {"location": status.get("location")})
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


def _manifest_if_readable(location: str | None) -> dict[str, Any] | None:
    """A cluster run's manifest, when its storage is a file system the operator sees too."""
    if not location or not location.startswith("file://"):
        return None
    path = Path(location.removeprefix("file://")) / "manifest.json"
    try:
        found: dict[str, Any] = json.loads(path.read_text())
        return found
    except (OSError, ValueError):
        return None


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
        specs.parse_snapshot_schedule(schedule.get("schedule"))
    except spec_errors.InvalidSchedule as error:
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
    for name in offset_jobs.snapshots_to_prune(existing, int(schedule.get("historyLimit", 7))):
        await kube.delete(kube_client.OFFSET_SNAPSHOTS, meta["namespace"], name)
        logger.info("snapshot %s deleted (beyond historyLimit)", name)


# ---------------------------------------------------------------------------------------
# ConsumerGroup.spec.offsetReset


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


async def _drive_offset_reset(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    offset_reset = spec.get("offsetReset")
    if not offset_jobs.reset_pending(offset_reset, status.get("lastReset")):
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
    stage = last.get("stage") if last.get("fingerprint") == fingerprint else None
    dry_run = bool(offset_reset.get("dryRun", True))
    generation = meta.get("generation")
    run_name = f"reset-{meta['uid']}-{fingerprint}"
    progress: dict[str, Any] = {
        "fingerprint": fingerprint,
        "target": dict(offset_reset),
        "dryRun": dry_run,
    }

    if stage is None:
        try:
            # Checked before anything pauses: a reset of what the group cannot have offsets
            # for is refused whole, never narrowed to what exists.
            specs.check_reset_scope(
                offset_reset,
                group.topics,
                await kafka_probe.partition_counts(
                    group.kafka.bootstrap_servers,
                    state.config.kafka_config,
                    state.config.kafka_probe_timeout_seconds,
                ),
            )
        except spec_errors.KafkaUnreachable:
            return  # the next tick tries again; the group's Ready condition says why
        except spec_errors.InvalidResetScope as error:
            patch.status["conditions"] = _reset_condition(
                current_status, False, error.reason, error.message, generation
            )
            patch.status["lastReset"] = {
                **progress,
                "stage": "Done",
                "phase": "Failed",
                "reason": error.reason,
                "message": error.message,
            }
            return
    try:
        if stage is None:
            if not dry_run:
                patch.status["conditions"] = _reset_condition(
                    current_status,
                    True,
                    "Pausing",
                    "revoking every partition before the reset",
                    generation,
                )
                await _set_paused(state, body, True)
            patch.status["lastReset"] = {
                **progress,
                "stage": "Planning" if dry_run else "Pausing",
                "phase": "Running",
            }
            return
        if not dry_run:
            # Re-asserted every tick: a reconcile that read the status before the pause began
            # may have configured the group unpaused again.
            await _set_paused(state, body, True)
            if not consumer_groups.reset_in_progress(current_status):
                patch.status["conditions"] = _reset_condition(
                    current_status,
                    True,
                    "Pausing",
                    "revoking every partition before the reset",
                    generation,
                )
        if stage == "Pausing":
            try:
                description = await state.runtime.describe_group(group.group_id)
            except coordinator_errors.GroupIdNotFound:
                description = None
            if description is not None and not _released(description):
                return  # members are still committing and releasing
            patch.status["lastReset"] = {**progress, "stage": "Planning", "phase": "Running"}
            return
        # Planning: the restore job computes (and clamps) the plan; it never writes.
        jobs = local_jobs_of(memo)
        if not jobs.known(run_name):
            snapshot_location = await _snapshot_location(state, meta["namespace"], offset_reset)
            arguments = offset_jobs.restore_arguments(
                state.config.bootstrap_servers,
                state.config.state_topic,
                group.group_id,
                offset_reset,
                group.topics,
                snapshot_location,
            )
            jobs.start(run_name, "restore", [*arguments, *kafka_arguments()])
            return
        outcome = jobs.outcome(run_name)
        if outcome is None:
            return
        if not outcome.succeeded or outcome.result is None:
            raise ResetFailed(outcome.reason or "the restore job failed")
        audit = dict(outcome.result)
        if not dry_run:
            planned = offset_jobs.commits_of(audit)
            if planned:
                response = await state.runtime.commit_offsets(
                    messages.OffsetCommitRequest(
                        group_id=group.group_id,
                        member_id="",
                        member_epoch=messages.LEAVE_EPOCH,
                        offsets={
                            tp: messages.CommitOffset(offset) for tp, offset in planned.items()
                        },
                    )
                )
                if response.errors:
                    raise ResetFailed(f"the coordinator rejected: {dict(response.errors)}")
            await _set_paused(state, body, False)
            patch.status["conditions"] = _reset_condition(
                current_status, False, "Done", "offsets reset", generation
            )
        # The resource's own target and dryRun win over the plan-only job's view of them.
        patch.status["lastReset"] = {**audit, **progress, "stage": "Done", "phase": "Done"}
    except (
        ResetFailed,
        coordinator_errors.CoordinatorError,
        kube_errors.KubeError,
        ValueError,
    ) as error:
        if not dry_run:
            await _set_paused(state, body, False)
            patch.status["conditions"] = _reset_condition(
                current_status, False, "Failed", str(error), generation
            )
        patch.status["lastReset"] = {
            **progress,
            "stage": "Done",
            "phase": "Failed",
            "message": str(error),
        }


@kopf.timer(*CONSUMER_GROUPS, interval=3.0, initial_delay=1.0)
async def drive_offset_reset(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: Any,
    logger: Any,
    **_: Any,
) -> None:
    """One step of a pending ``offsetReset``; a line in the log for each step taken."""
    await _drive_offset_reset(body, spec, status, meta, patch, memo)
    step = patch.status.get("lastReset")
    if step:
        logger.info(
            "offset reset to %s: %s %s%s",
            (spec.get("offsetReset") or {}).get("to"),
            step.get("stage"),
            step.get("phase"),
            f" ({step['message']})" if step.get("message") else "",
        )


class ResetFailed(RuntimeError):
    """The reset could not be planned or written; the group resumes untouched."""


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


async def compaction_loop(schedule: str, storage: str, memo: Any, logger: Any) -> None:
    """Runs the compaction job at every scheduled time, for as long as the operator runs."""
    last = datetime.datetime.now(datetime.UTC)
    while True:
        due = offset_jobs.next_run(schedule, last)
        await asyncio.sleep(max((due - datetime.datetime.now(datetime.UTC)).total_seconds(), 0))
        last = due
        state = memo.get(lifecycle.STATE_KEY)
        if not isinstance(state, lifecycle.OperatorState):
            logger.warning("compaction due at %s skipped: the coordinator is not running", due)
            continue
        arguments = offset_jobs.compaction_arguments(
            state.config.bootstrap_servers, state.config.state_topic, storage, due
        )
        outcome = await run_local_job("compaction", [*arguments, *kafka_arguments()])
        if outcome.succeeded:
            logger.info("state topic compacted: %s", outcome.result)
        else:
            logger.error("state-topic compaction failed: %s", outcome.reason)
