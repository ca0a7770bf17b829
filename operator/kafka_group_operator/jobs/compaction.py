"""The scheduled compaction of the state topic, run like every other job.

At each time of the chart's schedule (``KGO_COMPACTION_SCHEDULE``) the operator takes a read
fence over every state partition and the compaction job checkpoints the topic up to it
(``--fenced-ends``) under ``KGO_COMPACTION_STORAGE_URI``. With several replicas each
partition's fence comes from the replica that coordinates it (the control plane's port,
``handlers.coordinator_port``: the local runtime, else the internal API of the partition's
coordinator), so the job reads each partition up to the end its own coordinator returned,
past every write that coordinator acknowledged. No group's token could ask for every
partition; the replicas' internal token does. While some partition has no coordinator that
answers (its Lease is changing hands, its replica is away) there is no fence and nothing is
run: the compaction is tried again after ``RETRY_SECONDS`` (doubling), until the next
scheduled time. The job writes the checkpoint and nothing else.

Every replica keeps the schedule (they share it and the storage), and at each attempt only
the one that coordinates state partition 0 runs it (``Operator.compacts``): at most one
replica holds that Lease at a time, so two never write one checkpoint at once, and when that
replica goes away the schedule goes on with the partition's next holder.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka_group_operator.api import internal
from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.jobs import runner as job_runner
from kafka_group_operator.jobs import runs
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import offset_jobs

POLL_SECONDS = 10.0
# A compaction without a read fence is tried again after this long, then twice as long, ...
RETRY_SECONDS = 30.0
MAX_RETRY_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class CompactionSchedule:
    schedule: str
    storage_uri: str
    namespace: str


def schedule_of(env: Mapping[str, str]) -> CompactionSchedule | None:
    """The chart's compaction settings; None when either the schedule or the storage is unset."""
    schedule = env.get("KGO_COMPACTION_SCHEDULE", "").strip()
    storage = env.get("KGO_COMPACTION_STORAGE_URI", "").strip()
    if not schedule or not storage:
        return None
    return CompactionSchedule(schedule, storage, env.get("KGO_POD_NAMESPACE", "default"))


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


async def fence_every_partition(
    fences: internal.PartitionFences, partitions: int
) -> dict[int, int]:
    """The read fence over every one of the state topic's ``partitions``, each taken by its
    coordinator; the coordinator's error (``CoordinatorError``) when any cannot be taken."""
    return await fences.read_fence(range(partitions))


@dataclass(frozen=True)
class Operator:
    """What a compaction needs of the running operator."""

    fences: internal.PartitionFences
    partitions: int  # the state topic's
    kube: kube_client.KubeClient
    memo: Any
    bootstrap: str
    state_topic: str
    # Whether this replica runs the compaction now: it coordinates state partition 0 (with
    # one replica, always).
    compacts: Callable[[], bool] = lambda: True


async def compact_once(
    operator: Operator,
    settings: CompactionSchedule,
    due: datetime.datetime,
    poll_seconds: float = POLL_SECONDS,
) -> job_runner.JobOutcome:
    """One compaction, due at ``due``: fence, run, wait. Raises ``CoordinatorError`` when the
    fence cannot be taken (then nothing runs)."""
    ends = await fence_every_partition(operator.fences, operator.partitions)
    try:
        run = runs.compaction_run(
            operator.bootstrap,
            operator.state_topic,
            settings.storage_uri,
            due,
            settings.namespace,
            ends,
        )
        runner = await job_runner.runner_for(None, operator.kube, operator.memo)
        return await run_to_end(runner, run, poll_seconds)
    except (kube_errors.KubeError, ValueError) as error:
        return job_runner.JobOutcome(False, reason=str(error))


async def loop(
    settings: CompactionSchedule,
    operator: Callable[[], Operator | None],
    logger: logging.Logger | Any,
    retry_seconds: float = RETRY_SECONDS,
) -> None:
    """Runs the compaction at every scheduled time, for as long as the operator runs;
    ``operator()`` is None while the coordinator is not running (that time is skipped). A
    compaction without a read fence is retried until the next scheduled time."""
    last = datetime.datetime.now(datetime.UTC)
    while True:
        due = offset_jobs.next_run(settings.schedule, last)
        await _sleep_until(due)
        last = due
        try:
            await _compact_due(settings, operator, logger, due, retry_seconds)
        except Exception:  # a bug in one compaction must not end the schedule
            logger.exception("state-topic compaction due at %s failed", due)


async def _sleep_until(when: datetime.datetime) -> None:
    await asyncio.sleep(max((when - datetime.datetime.now(datetime.UTC)).total_seconds(), 0))


async def _compact_due(
    settings: CompactionSchedule,
    operator: Callable[[], Operator | None],
    logger: logging.Logger | Any,
    due: datetime.datetime,
    retry_seconds: float,
) -> None:
    """The compaction due at ``due``, retried while it has no read fence."""
    following = offset_jobs.next_run(settings.schedule, due)
    delay = retry_seconds
    while True:
        running = operator()
        if running is None:
            logger.warning("compaction due at %s skipped: the coordinator is not running", due)
            return
        if not running.compacts():
            logger.info(
                "compaction due at %s left to the replica coordinating state partition 0", due
            )
            return
        try:
            outcome = await compact_once(running, settings, due)
        except coordinator_errors.CoordinatorError as error:
            retry_at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=delay)
            if retry_at >= following:
                logger.error(
                    "compaction due at %s not run: no read fence before the next one: %s",
                    due,
                    error,
                )
                return
            logger.warning(
                "compaction due at %s waits for a read fence (retry in %.0fs): %s",
                due,
                delay,
                error,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_SECONDS)
            continue
        if outcome.succeeded:
            logger.info("state topic compacted: %s", outcome.result)
        else:
            logger.error("state-topic compaction failed: %s", outcome.reason)
        return
