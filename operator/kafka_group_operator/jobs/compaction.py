"""The scheduled compaction of the state topic, run like every other job.

At each time of the chart's schedule (``KGO_COMPACTION_SCHEDULE``) the operator's own
coordinator takes a read fence over every state partition, in-process (no group's token could
ask for every partition), and the compaction job checkpoints the topic up to it
(``--fenced-ends``) under ``KGO_COMPACTION_STORAGE_URI``. A replica that does not serve every
partition cannot fence them all: its job reads up to the last stable offsets instead, which
makes the checkpoint cover less, never wrong (the loader reads the log from where it ends).
The job writes the checkpoint and nothing else.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.jobs import runner as job_runner
from kafka_group_operator.jobs import runs
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import offset_jobs
from kafka_group_operator.runtime import coordinator_runtime

POLL_SECONDS = 10.0


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


def schedules_here(env: Mapping[str, str]) -> bool:
    """Whether this replica runs the schedule: with several replicas, only the first
    (``<statefulset>-0``), so that two replicas never write the same checkpoint at once (every
    replica has the same schedule and storage). While that pod is away no checkpoint is
    written; the loaders read a little more log meanwhile, nothing is lost."""
    try:
        replicas = int(env.get("KGO_REPLICAS", "1"))
    except ValueError:
        replicas = 1
    if replicas <= 1:
        return True
    pod = (env.get("KGO_POD_NAME") or env.get("HOSTNAME") or "").strip()
    return pod.rpartition("-")[2] == "0"


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
    runtime: coordinator_runtime.CoordinatorRuntime, logger: logging.Logger | Any
) -> dict[int, int] | None:
    """The coordinator's read fence over every state partition, or None when this replica
    cannot take it (the job then reads up to the last stable offsets)."""
    try:
        # The group id names no partition when every partition is fenced.
        return await runtime.read_fence("", all_partitions=True)
    except coordinator_errors.CoordinatorError as error:
        logger.warning("compaction reads up to the last stable offsets: no read fence: %s", error)
        return None


async def compact_once(
    runtime: coordinator_runtime.CoordinatorRuntime,
    kube: kube_client.KubeClient,
    memo: Any,
    bootstrap: str,
    state_topic: str,
    settings: CompactionSchedule,
    due: datetime.datetime,
    logger: logging.Logger | Any,
    poll_seconds: float = POLL_SECONDS,
) -> job_runner.JobOutcome:
    """One compaction, due at ``due``: fence, run, wait."""
    try:
        ends = await fence_every_partition(runtime, logger)
        run = runs.compaction_run(
            bootstrap, state_topic, settings.storage_uri, due, settings.namespace, ends
        )
        runner = await job_runner.runner_for(None, kube, memo)
        return await run_to_end(runner, run, poll_seconds)
    except (kube_errors.KubeError, ValueError) as error:
        return job_runner.JobOutcome(False, reason=str(error))


@dataclass(frozen=True)
class Operator:
    """What a compaction needs of the running operator."""

    runtime: coordinator_runtime.CoordinatorRuntime
    kube: kube_client.KubeClient
    memo: Any
    bootstrap: str
    state_topic: str


async def loop(
    settings: CompactionSchedule,
    operator: Callable[[], Operator | None],
    logger: logging.Logger | Any,
) -> None:
    """Runs the compaction at every scheduled time, for as long as the operator runs;
    ``operator()`` is None while the coordinator is not running (that time is skipped)."""
    last = datetime.datetime.now(datetime.UTC)
    while True:
        due = offset_jobs.next_run(settings.schedule, last)
        await asyncio.sleep(max((due - datetime.datetime.now(datetime.UTC)).total_seconds(), 0))
        last = due
        running = operator()
        if running is None:
            logger.warning("compaction due at %s skipped: the coordinator is not running", due)
            continue
        outcome = await compact_once(
            running.runtime,
            running.kube,
            running.memo,
            running.bootstrap,
            running.state_topic,
            settings,
            due,
            logger,
        )
        if outcome.succeeded:
            logger.info("state topic compacted: %s", outcome.result)
        else:
            logger.error("state-topic compaction failed: %s", outcome.reason)
