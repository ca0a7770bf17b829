"""kopf registrations for the Spark jobs: OffsetSnapshots, scheduled snapshots, online resets,
the state-topic compaction. Thin glue: each handler reads its resource, calls one function of
``jobs`` and patches the status it returns.

* **OffsetSnapshot** (``jobs.offset_snapshots``): on create, start the snapshot run; a timer
  mirrors the run's progress into ``status`` (phase, conditions, location, records, takenAt,
  checksum). A failed run is retried as a new run, at most ``offset_jobs.MAX_ATTEMPTS`` times.
* **ConsumerGroup.spec.snapshots** (``jobs.offset_snapshots.schedule_tick``): a timer creates
  OffsetSnapshots on the cron schedule and prunes the oldest beyond ``historyLimit``.
* **ConsumerGroup.spec.offsetReset** (``jobs.online_reset``, the ``jobs.reset_machine``
  table): a timer feeds the machine one event per tick and carries out its actions (pause,
  plan with the restore job, write the plan through the group's coordinator as one
  administrative commit, resume). The audit lands in ``status.lastReset``. Assignment stays
  paused while the ResetInProgress condition is True (``consumer_groups.reconcile`` honours it).
* **Compaction** of the state topic on the chart's schedule (``jobs.compaction``), fenced
  partition by partition by each one's coordinator, run by the replica coordinating state
  partition 0.

Every call on a group or a state partition goes through the control plane's port
(``coordinator_port.port_of``), as the ConsumerGroup handlers' do: the group's coordinator
may be this replica's runtime or another replica's, reached through the internal API.

``spark.mode`` chooses how every one of these jobs runs (``jobs.runner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
from collections.abc import Mapping
from typing import Any

import kopf

from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.handlers import (
    consumer_groups,
    coordinator_port,
    kafka_probe,
    lease_shards,
    lifecycle,
    ownership,
)
from kafka_group_operator.jobs import compaction, offset_snapshots, online_reset, runs
from kafka_group_operator.jobs import runner as job_runner
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.manifests import group_settings, offset_jobs
from kafka_group_operator.specs import consumer_group as specs

SNAPSHOTS = ("kafkagroups.io", "v1alpha1", "offsetsnapshots")
CONSUMER_GROUPS = ("kafkagroups.io", "v1alpha1", "consumergroups")
COMPACTION_KEY = "kafka_group_operator_compaction"


@kopf.on.cleanup()
async def stop_local_runs(memo: Any, **_: Any) -> None:
    """Local runs die with the operator; their handlers start them again after a restart."""
    await job_runner.local_runner_of(memo).stop()


def group_token(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec
) -> job_runner.GroupToken:
    """The group's token for a job: its Secret, and its value when the operator holds it."""
    try:
        value = state.tokens.token_for(group.group_id)
    except coordinator_errors.CoordinatorLoadInProgress:
        value = None  # a local run then fails and is retried; a SparkApplication reads the Secret
    return runs.group_token(group.name, value)


# ---------------------------------------------------------------------------------------
# OffsetSnapshot


def snapshot_world(memo: Any) -> offset_snapshots.SnapshotWorld:
    state = lifecycle.state_of(memo)

    async def find_group(
        namespace: str, name: str
    ) -> tuple[specs.ConsumerGroupSpec, job_runner.GroupToken | None]:
        body = await state.kube.get_or_none(kube_client.CONSUMER_GROUPS, namespace, name)
        if body is None:
            raise offset_snapshots.GroupNotFound(
                f"ConsumerGroup {name!r} (consumerGroupRef) does not exist"
            )
        group = consumer_groups.parse(body)
        owner = await ownership.other_owner(
            coordinator_port.port_of(state), group.group_id, body["metadata"]
        )
        if owner is not None:
            # A second claimant of another resource's group id must not read its offsets.
            raise offset_snapshots.GroupNotFound(
                f"ConsumerGroup {name!r} does not own group id {group.group_id!r}: "
                + ownership.conflict_message(group.group_id, owner)
            )
        return group, group_token(state, group)

    return offset_snapshots.SnapshotWorld(
        kube=state.kube,
        memo=memo,
        bootstrap=state.config.bootstrap_servers,
        state_topic=state.config.state_topic,
        coordinator_url=state.config.coordinator_url,
        find_group=find_group,
    )


@kopf.on.resume(*SNAPSHOTS)
@kopf.on.create(*SNAPSHOTS)
async def start_snapshot(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, retry: int, memo: Any, **_: Any
) -> None:
    if offset_snapshots.started(status):
        return
    started = await offset_snapshots.start(snapshot_world(memo), body, status)
    patch.status.update(started.status)
    if started.refused is None:
        return
    if not started.retried:
        raise kopf.PermanentError(started.refused)
    base = lifecycle.state_of(memo).config.retry_base_seconds
    raise kopf.TemporaryError(started.refused, delay=consumer_groups.retry_delay(retry, base))


@kopf.timer(*SNAPSHOTS, interval=5.0, initial_delay=2.0)
async def follow_snapshot(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, memo: Any, logger: Any, **_: Any
) -> None:
    """Mirror the run's state; a line in the log when the phase changes."""
    if not offset_snapshots.followed(status):
        return
    update = await offset_snapshots.follow(snapshot_world(memo), body, status)
    patch.status.update(update)
    if update.get("phase") or update.get("message"):
        logger.info(
            "snapshot %s: %s", update.get("phase") or status.get("phase"), update.get("message", "")
        )


# ---------------------------------------------------------------------------------------
# ConsumerGroup.spec.snapshots


@kopf.timer(*CONSUMER_GROUPS, interval=30.0, initial_delay=5.0)
async def schedule_snapshots(
    body: kopf.Body, status: kopf.Status, patch: kopf.Patch, memo: Any, logger: Any, **_: Any
) -> None:
    if not (body.get("spec") or {}).get("snapshots"):
        return
    kube = lifecycle.state_of(memo).kube
    done = await offset_snapshots.schedule_tick(
        kube, body, status, datetime.datetime.now(datetime.UTC)
    )
    patch.status.update(done.status)
    for level, line in done.log:
        logger.log(level, "%s", line)


# ---------------------------------------------------------------------------------------
# ConsumerGroup.spec.offsetReset


def reset_world(
    state: lifecycle.OperatorState,
    body: Mapping[str, Any],
    group: specs.ConsumerGroupSpec,
    memo: Any,
) -> online_reset.ResetWorld:
    coordinator = coordinator_port.port_of(state)

    async def set_paused(paused: bool) -> None:
        await coordinator.configure_group(
            group_settings.build_group_settings(
                consumer_groups.parse(body), paused_for_reset=paused
            )
        )

    async def partition_counts() -> Mapping[str, int]:
        return await kafka_probe.partition_counts(
            group.kafka.bootstrap_servers,
            state.config.kafka_config,
            state.config.kafka_probe_timeout_seconds,
        )

    return online_reset.ResetWorld(
        coordinator=coordinator,
        kube=state.kube,
        memo=memo,
        set_paused=set_paused,
        partition_counts=partition_counts,
        bootstrap=state.config.bootstrap_servers,
        state_topic=state.config.state_topic,
        coordinator_url=state.config.coordinator_url,
        token=group_token(state, group),
        results_uri=os.environ.get("KGO_SPARK_RESULTS_URI") or None,
    )


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
    offset_reset = spec.get("offsetReset")
    if not offset_jobs.reset_pending(offset_reset, None):
        return
    assert offset_reset is not None
    state = lifecycle.state_of(memo)
    # The body a timer sees can predate this handler's own last patch; deciding from it could
    # start a finished reset over (pausing the group again). Decide from the object as it is.
    current = await state.kube.get(kube_client.CONSUMER_GROUPS, meta["namespace"], meta["name"])
    current_status: Mapping[str, Any] = current.get("status") or {}
    if not offset_jobs.reset_pending(offset_reset, current_status.get("lastReset")):
        return
    group = consumer_groups.parse(body)
    if not await ownership.owns(coordinator_port.port_of(state), group.group_id, meta):
        return  # a second claimant of the group id (GroupIdConflict) resets nobody's offsets
    world = reset_world(state, body, group, memo)
    update = await online_reset.tick(world, body, group, offset_reset, current_status)
    patch.status.update(update)
    step = update.get("lastReset")
    if step:
        logger.info(
            "offset reset to %s: %s %s%s",
            offset_reset.get("to"),
            step.get("stage"),
            step.get("phase"),
            f" ({step['message']})" if step.get("message") else "",
        )


# ---------------------------------------------------------------------------------------
# Scheduled compaction of the state topic


def _running_operator(memo: Any) -> compaction.Operator | None:
    state = memo.get(lifecycle.STATE_KEY)
    if not isinstance(state, lifecycle.OperatorState):
        return None
    shards = memo.get(lifecycle.SHARDS_KEY)
    holder = shards.elector.holds if isinstance(shards, lease_shards.LeasedShards) else None
    return compaction.Operator(
        fences=coordinator_port.port_of(state),
        partitions=state.config.state_partitions,
        kube=state.kube,
        memo=memo,
        bootstrap=state.config.bootstrap_servers,
        state_topic=state.config.state_topic,
        # With Leases, the replica coordinating state partition 0; alone, this one.
        compacts=(lambda: holder(0)) if holder is not None else lambda: True,
    )


@kopf.on.startup()
async def start_compaction_schedule(memo: Any, logger: Any, **_: Any) -> None:
    settings = compaction.schedule_of(os.environ)
    if settings is None:
        if os.environ.get("KGO_COMPACTION_SCHEDULE", "").strip():
            # Scheduled, with nowhere to write: it would never run. Said, not silent.
            logger.warning(
                "state-topic compaction is scheduled but has no storage URI "
                "(KGO_COMPACTION_STORAGE_URI, the chart's compaction.storageUri): it never runs"
            )
        else:
            logger.info("state-topic compaction is not scheduled")
        return
    memo[COMPACTION_KEY] = asyncio.create_task(
        compaction.loop(settings, lambda: _running_operator(memo), logger),
        name="compaction-schedule",
    )


@kopf.on.cleanup()
async def stop_compaction_schedule(memo: Any, **_: Any) -> None:
    task = memo.get(COMPACTION_KEY)
    if isinstance(task, asyncio.Task):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
