"""One tick of an online offset reset (``ConsumerGroup.spec.offsetReset``): observe, step the
``reset_machine``, carry out its actions; the status to patch comes back as a mapping.

The handler (``handlers.snapshots.drive_offset_reset``) decides whether a reset is pending and
whose it is, then calls ``tick`` with a ``ResetWorld``: the few ports a reset touches (the
group's coordinator, the API server, the group's Kafka cluster, pausing the group), passed in
so that this module needs no kopf and no handler. The coordinator is the control plane's port
(``handlers.coordinator_port``): the local runtime, or the internal API of the replica whose
Lease holds the group's state partition; the reset never assumes which. The machine's
transition is taken whole or not at all: when an action fails, ``tick`` feeds
``Event.ERROR`` from the state the tick began in, which resumes the group and records why;
a retriable coordinator error (``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``, ...)
instead leaves the reset where it was for the next tick (every action is safe to repeat:
pausing, the plan's commit of the same offsets, resuming).

The plan comes from the restore job, which only plans (``--dry-run``). It reads the group's
state partition up to the coordinator's read fence (``--coordinator-url``, the group's token in
its environment), so the plan's old offsets are every commit acknowledged before the pause.
The group's coordinator applies the plan as one administrative commit (an offset commit
without a member, ``LEAVE_EPOCH``), acknowledged once it is in the state topic.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka_group_operator.api import internal
from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.coordinator import messages
from kafka_group_operator.jobs import reset_machine, runs
from kafka_group_operator.jobs import runner as job_runner
from kafka_group_operator.jobs.reset_machine import Action, Event, State
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import conditions, offset_jobs
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors as spec_errors
from kafka_group_operator.specs import offset_jobs as spec_views


class ResetFailed(RuntimeError):
    """The reset could not be planned or written; the group resumes untouched."""


# What fails a transition (and so the reset) rather than the operator.
FAILURES = (
    ResetFailed,
    coordinator_errors.CoordinatorError,
    kube_errors.KubeError,
    ValueError,
)


@dataclass(frozen=True)
class ResetWorld:
    """What a reset tick may touch, besides the resource it was given."""

    coordinator: internal.GroupCalls  # the group's, wherever it runs
    kube: kube_client.KubeClient
    memo: Any  # where the local runner lives
    set_paused: Callable[[bool], Awaitable[None]]
    partition_counts: Callable[[], Awaitable[Mapping[str, int]]]
    bootstrap: str
    state_topic: str
    coordinator_url: str | None
    token: job_runner.GroupToken | None
    results_uri: str | None  # spark.resultsUri: where a cluster run leaves its plan


@dataclass
class Observed:
    """What one tick saw: the event for the machine, and what its actions need."""

    event: Event
    message: str = ""
    reason: str = ""  # a refusal's reason word, shown in the ResetInProgress condition
    audit: dict[str, Any] | None = None


@dataclass
class Tick:
    """One tick of one ConsumerGroup's reset: what the actions read, and the status they
    write (``status``: the fields to patch)."""

    world: ResetWorld
    body: Mapping[str, Any]
    group: specs.ConsumerGroupSpec
    offset_reset: Mapping[str, Any]
    current_status: Mapping[str, Any]
    progress: dict[str, Any]
    dry_run: bool
    status: dict[str, Any]

    @property
    def generation(self) -> Any:
        return self.body["metadata"].get("generation")

    def plan_run(self, arguments: tuple[str, ...] = ()) -> job_runner.JobRun:
        return runs.reset_run(
            self.body,
            self.progress["fingerprint"],
            arguments,
            self.world.results_uri,
            self.world.token,
        )


def released(description: messages.GroupDescription) -> bool:
    """No member owns, or still has to revoke, any partition."""
    return all(
        not any(member.assignment.values())
        and not any(member.partitions_pending_revocation.values())
        for member in description.members
    )


def reset_condition(
    status: Mapping[str, Any], active: bool, reason: str, message: str, generation: Any
) -> list[dict[str, Any]]:
    return conditions.merge_conditions(
        status.get("conditions"),
        [conditions.Condition(conditions.RESET_IN_PROGRESS, active, reason, message)],
        generation,
        conditions.now_rfc3339(),
    )


def reset_in_progress(status: Mapping[str, Any]) -> bool:
    condition = conditions.find(status.get("conditions"), conditions.RESET_IN_PROGRESS)
    return condition is not None and condition.get("status") == "True"


async def observe(tick: Tick, state: State) -> Observed:
    """The one event this tick feeds the machine in ``state``."""
    if state is State.NEW:
        try:
            # Checked before anything pauses: a reset of what the group cannot have offsets
            # for is refused whole, never narrowed to what exists.
            specs.check_reset_scope(
                tick.offset_reset, tick.group.topics, await tick.world.partition_counts()
            )
        except spec_errors.KafkaUnreachable:
            return Observed(Event.KAFKA_UNREACHABLE)  # the group's Ready condition says why
        except spec_errors.InvalidResetScope as error:
            return Observed(Event.SCOPE_REFUSED, error.message, error.reason)
        return Observed(Event.SCOPE_ACCEPTED)
    if state is State.PAUSING:
        try:
            description = await tick.world.coordinator.describe_group(tick.group.group_id)
        except coordinator_errors.GroupIdNotFound:
            description = None
        if description is not None and not released(description):
            return Observed(Event.PARTITIONS_HELD)  # members are still committing, releasing
        return Observed(Event.PARTITIONS_RELEASED)
    # PLANNING: the restore job computes (and clamps) the plan; it never writes.
    recorded = tick.progress.get("run") or {}
    if not recorded:
        return Observed(Event.PLAN_NOT_RUNNING)
    run = tick.plan_run()
    runner = job_runner.runner_named(str(recorded.get("mode")), tick.world.kube, tick.world.memo)
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


async def snapshot_location(
    kube: kube_client.KubeClient, namespace: str, offset_reset: Mapping[str, Any]
) -> str | None:
    """Where the snapshot a ``to: snapshot`` reset names was written; None for other targets."""
    name = offset_reset.get("snapshot")
    if offset_reset.get("to") != "snapshot" or not name:
        return None
    snapshot = await kube.get_or_none(kube_client.OFFSET_SNAPSHOTS, namespace, name)
    snapshot_status = (snapshot or {}).get("status") or {}
    if snapshot_status.get("phase") != "Succeeded" or not snapshot_status.get("location"):
        raise ResetFailed(f"OffsetSnapshot {name!r} is not a finished snapshot")
    location: str = snapshot_status["location"]
    return location


async def start_plan(tick: Tick) -> None:
    world = tick.world
    arguments = offset_jobs.restore_arguments(
        world.bootstrap,
        world.state_topic,
        tick.group.group_id,
        tick.offset_reset,
        tick.group.topics,
        await snapshot_location(world.kube, tick.body["metadata"]["namespace"], tick.offset_reset),
        world.coordinator_url,
    )
    runner = await job_runner.runner_for(None, world.kube, world.memo)
    run = tick.plan_run(tuple(arguments))
    if runner.mode == "operator" and run.result_uri is None:
        raise ResetFailed(
            "a restore planned by a SparkApplication needs spark.resultsUri (storage the "
            "operator can read) to hand its plan back; set it, or use spark.mode local"
        )
    await runner.start(run)
    tick.progress["run"] = {"mode": runner.mode, "name": run.name, "job": run.job}


async def apply_plan(tick: Tick, audit: Mapping[str, Any]) -> None:
    planned = offset_jobs.commits_of(audit)
    if not planned:
        return
    response = await tick.world.coordinator.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=tick.group.group_id,
            member_id="",
            member_epoch=messages.LEAVE_EPOCH,
            offsets={tp: messages.CommitOffset(offset) for tp, offset in planned.items()},
        )
    )
    if response.errors:
        raise ResetFailed(f"the coordinator rejected: {dict(response.errors)}")


async def carry_out(tick: Tick, transition: reset_machine.Transition, observed: Observed) -> None:
    """Does the transition's actions in order, then records its new state."""
    last: dict[str, Any] = {**tick.progress, **reset_machine.status_of(transition.next_state)}
    for action in transition.actions:
        if action is Action.PAUSE:
            await tick.world.set_paused(True)
            if not reset_in_progress(tick.current_status):
                tick.status["conditions"] = reset_condition(
                    tick.current_status,
                    True,
                    "Pausing",
                    "revoking every partition before the reset",
                    tick.generation,
                )
        elif action is Action.START_PLAN:
            await start_plan(tick)
            last["run"] = tick.progress["run"]
        elif action is Action.APPLY_PLAN:
            assert observed.audit is not None
            await apply_plan(tick, observed.audit)
        elif action is Action.RESUME:
            await tick.world.set_paused(False)
        elif action is Action.RECORD_PLAN:
            # The resource's own target and dryRun win over the plan-only job's view of them.
            last = {**(observed.audit or {}), **last}
        elif action is Action.RECORD_FAILURE:
            last["message"] = observed.message
            if observed.reason:
                last["reason"] = observed.reason
    if transition.next_state in reset_machine.FINISHED and (not tick.dry_run or observed.reason):
        done = transition.next_state is State.DONE
        tick.status["conditions"] = reset_condition(
            tick.current_status,
            False,
            "Done" if done else (observed.reason or "Failed"),
            "offsets reset" if done else observed.message,
            tick.generation,
        )
    if transition.next_state is not State.NEW:
        tick.status["lastReset"] = last


async def tick(
    world: ResetWorld,
    body: Mapping[str, Any],
    group: specs.ConsumerGroupSpec,
    offset_reset: Mapping[str, Any],
    current_status: Mapping[str, Any],
) -> dict[str, Any]:
    """One step of a pending reset; the status fields to patch (``conditions``, ``lastReset``).

    ``current_status`` is the object's status as read now (a timer's body can predate the
    handler's own last patch).
    """
    last = dict(current_status.get("lastReset") or {})
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
    status: dict[str, Any] = {}
    current = Tick(world, body, group, offset_reset, current_status, progress, dry_run, status)
    try:
        observed = refusal or await observe(current, machine_state)
        transition = reset_machine.step(machine_state, observed.event, dry_run)
        await carry_out(current, transition, observed)
    except FAILURES as error:
        if isinstance(error, coordinator_errors.CoordinatorError) and error.retriable:
            # The group's coordinator is moving or loading (a Lease changing hands): nothing
            # of this tick's transition counts, and the next tick tries it again.
            return {}
        # The transition is taken whole or not at all: a failed action fails the reset.
        observed = Observed(Event.ERROR, str(error))
        transition = reset_machine.step(machine_state, Event.ERROR, dry_run)
        try:
            await carry_out(current, transition, observed)
        except FAILURES as again:
            # Could not even resume: the ResetInProgress=False condition makes the group's
            # reconcile configure it unpaused.
            status["conditions"] = reset_condition(
                current_status, False, "Failed", f"{error}; {again}", current.generation
            )
            status["lastReset"] = {
                **progress,
                **reset_machine.status_of(State.FAILED),
                "message": f"{error}; resuming failed: {again}",
            }
    return status
