"""kopf handlers of ConsumerGroup resources and of their pods. Thin glue.

* create/update/resume: validate the spec, adopt the native group's offsets if asked (before
  any pod starts, see ``native_group``), create or patch the children (token Secret,
  headless Service, StatefulSet; adopted by the group), configure the group and its offset
  mirror in the embedded coordinator, refresh the status. A spec that cannot be honoured
  gets Ready=False with the reason; what may heal by itself (a missing Secret or topic,
  Kafka down) is retried with backoff, a malformed spec waits for the next edit. Never a
  crash loop.
* a daemon per group refreshes the status from the coordinator (state, epochs, members, lag,
  conditions) and posts an Event per rebalance. Each refresh also feeds the group's window of
  recent commits and log ends (``coordinator.lag_health``, Burrow's rules): the verdict is
  ``status.lag.verdict`` and the ``LagHealthy`` condition, with an Event on each change.
* pod events: a pod whose ordinal is at or above ``spec.replicas`` has left for good (a
  scale-down), so its static member is removed at once and its partitions move. A deleted or
  failed pod of a live ordinal is a temporary leave: nothing is done, its static member keeps
  its assignment for the session timeout and gets it back when the pod returns.
* delete: once the group's pods are gone (their members need the token for their final
  commit), ``deletionPolicy: Delete`` removes every record of the group; ``Retain`` keeps
  them and first mirrors the final offsets into the native group, so that plain consumers
  resume there. Either way the token is revoked and the group id released.
* ownership: the first resource to claim a group id owns it (see ``ownership``); another
  one naming the same ``groupId`` gets ``Ready=False, GroupIdConflict`` and changes nothing,
  not even on its deletion.

The annotation ``kafkagroups.io/pause-reconciliation: "true"`` stops every change the
operator would make to the group, its children and its members; the status is still
refreshed until the spec changes (then it waits for the reconciliation to resume).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.coordinator import lag_health, messages
from kafka_group_operator.handlers import (
    config,
    coordinator_port,
    kafka_probe,
    lifecycle,
    native_group,
    ownership,
)
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.manifests import conditions, consumer_group, group_settings, group_status
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors as spec_errors

GROUP, VERSION, PLURAL = "kafkagroups.io", "v1alpha1", "consumergroups"
PAUSE_ANNOTATION = f"{lifecycle.DOMAIN}/pause-reconciliation"
RECONCILIATION_PAUSED = "ReconciliationPaused"
# A group being deleted waits this many attempts for the brokers' own group: its final mirror
# (Retain), its deletion (Delete).
_FLUSH_RETRIES = 5


def retry_delay(retry: int, base: float = 5.0) -> float:
    """Exponential backoff for specs that may heal: 5 s, 10 s, 20 s, ... at most 5 minutes."""
    return float(min(base * 2 ** min(retry, 10), 300.0))


def reconciliation_paused(meta: Mapping[str, Any]) -> bool:
    annotations = meta.get("annotations") or {}
    return str(annotations.get(PAUSE_ANNOTATION, "")).lower() == "true"


def reset_in_progress(status: Mapping[str, Any]) -> bool:
    """Whether the reset flow has paused the group (it owns the ResetInProgress condition)."""
    condition = conditions.find(status.get("conditions"), conditions.RESET_IN_PROGRESS)
    return condition is not None and condition.get("status") == "True"


def parse(body: Mapping[str, Any]) -> specs.ConsumerGroupSpec:
    meta = body.get("metadata") or {}
    return specs.parse_consumer_group(
        name=meta["name"],
        namespace=meta["namespace"],
        spec=body.get("spec") or {},
        labels=meta.get("labels") or {},
    )


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def reconcile(
    body: kopf.Body, meta: kopf.Meta, status: kopf.Status, retry: int, memo: Any, **_: Any
) -> None:
    state = lifecycle.state_of(memo)
    name, namespace = meta["name"], meta["namespace"]
    generation = meta.get("generation")
    now = conditions.now_rfc3339()
    if reconciliation_paused(meta):
        paused = conditions.Condition(
            RECONCILIATION_PAUSED, True, "AnnotationSet", f"{PAUSE_ANNOTATION} is true"
        )
        await _patch_status(
            state,
            body,
            {
                "conditions": conditions.merge_conditions(
                    status.get("conditions"), [paused], None, now
                )
            },
        )
        return
    state.reconciled.pop((namespace, name), None)
    try:
        group = parse(body)
        check_session_timeout(group, state.config)
        await claim_group_id(state, group, meta)
        await _check_dependencies(state, group)
        # Before any pod starts: its members' commits would leave nothing to adopt.
        adopted = await native_group.adopt(state, group, body, status)
        if adopted is not None:
            await _patch_status(
                state,
                body,
                native_group.condition_patch(status.get("conditions"), adopted, generation, now),
            )
            native_group.raise_if_waiting(adopted)
        await _apply_children_or_report(state, group, body)
        coordinators = coordinator_port.port_of(state)
        await coordinators.configure_group(
            group_settings.build_group_settings(group, paused_for_reset=reset_in_progress(status))
        )
        await coordinators.configure_mirror(
            group.group_id, native_group.mirror_target(group, state.config.kafka_config)
        )
        description = await refresh_status(state, group, body)
        await remove_surplus_members(state, group, description, body)
    except spec_errors.SpecError as error:
        error_status = group_status.build_error_status(
            error, generation, status.get("conditions"), now, _group_id_or_none(body)
        )
        await _patch_status(state, body, error_status)
        kopf.warn(body, reason=error.reason, message=error.message)
        if isinstance(error, spec_errors.InvalidSpec):
            # Retrying cannot help; the next edit of the resource triggers a new attempt.
            raise kopf.PermanentError(error.message) from error
        raise kopf.TemporaryError(
            error.message, delay=retry_delay(retry, state.config.retry_base_seconds)
        ) from error
    except (kube_errors.KubeError, coordinator_errors.CoordinatorError) as error:
        kopf.warn(body, reason="ReconcileFailed", message=str(error))
        raise kopf.TemporaryError(
            str(error), delay=retry_delay(retry, state.config.retry_base_seconds)
        ) from error
    if isinstance(generation, int):
        state.reconciled[(namespace, name)] = generation
    # The pause condition, if any, is over.
    if conditions.find(status.get("conditions"), RECONCILIATION_PAUSED) is not None:
        resumed = conditions.Condition(
            RECONCILIATION_PAUSED, False, "AnnotationRemoved", "reconciliation runs"
        )
        current = (await state.kube.get(kube_client.CONSUMER_GROUPS, namespace, name)).get(
            "status"
        ) or {}
        await _patch_status(
            state,
            body,
            {
                "conditions": conditions.merge_conditions(
                    current.get("conditions"), [resumed], generation, now
                )
            },
        )


def check_session_timeout(group: specs.ConsumerGroupSpec, settings: config.OperatorConfig) -> None:
    """``InvalidSpec`` when the group's session timeout is below the operator's minimum: its
    members would drop their partitions in a failover (as Kafka refuses a session timeout
    below ``group.consumer.min.session.timeout.ms``)."""
    minimum = settings.min_session_timeout_seconds
    if group.session_timeout_seconds < minimum:
        raise spec_errors.InvalidSpec(
            f"sessionTimeoutSeconds {group.session_timeout_seconds} is below this operator's "
            f"minimum of {minimum} (groups.minSessionTimeoutSeconds): a replica's failover "
            "could outlast the half session timeout its members keep their partitions for"
        )


def _group_id_or_none(body: Mapping[str, Any]) -> str | None:
    """The group id the resource names, for its status; None when even that is malformed."""
    try:
        return ownership.group_id_of(body)
    except (KeyError, TypeError):
        return None


async def claim_group_id(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec, meta: Mapping[str, Any]
) -> None:
    """Make this resource the owner of its group id, or raise ``GroupIdConflict``.

    Comes before any change: a second claimant must not touch the owner's token, settings
    or members.
    """
    owner = await ownership.claim(
        coordinator_port.port_of(state), state.kube, group.group_id, meta, state.config.namespaces
    )
    if owner.uid != meta.get("uid"):
        raise ownership.GroupIdConflict(ownership.conflict_message(group.group_id, owner))


async def _check_dependencies(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec
) -> None:
    if group.kafka.secret_name is not None:
        secret = await state.kube.get_or_none(
            kube_client.SECRETS, group.namespace, group.kafka.secret_name
        )
        if secret is None:
            raise spec_errors.SecretNotFound(
                f"the Kafka Secret {group.kafka.secret_name!r} (kafka.secretRef) does not exist"
            )
    await kafka_probe.check_topics(
        group.kafka.bootstrap_servers,
        state.config.kafka_config,
        group.topics,
        state.config.kafka_probe_timeout_seconds,
    )


async def _apply_children_or_report(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec, owner: kopf.Body
) -> None:
    """``apply_children``, with the API server's refusals turned into reportable errors.

    A 400/422 (an invalid pod template, a name the API refuses) fails the same way on every
    retry, so it is reported as ``InvalidTemplate`` and waits for the next edit; a 403 is
    ``Forbidden``, retried with backoff until the operator's RBAC is fixed.
    """
    try:
        await apply_children(state, group, owner)
    except kube_errors.Invalid as error:
        raise spec_errors.InvalidTemplate(f"the API server refused a child: {error}") from error
    except kube_errors.Forbidden as error:
        raise spec_errors.Forbidden(
            f"the operator may not manage this group's children: {error}"
        ) from error


async def apply_children(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec, owner: kopf.Body
) -> None:
    """Create what is missing and bring the StatefulSet to the spec; adopt everything."""
    kube = state.kube
    ns = group.namespace
    secret_name = consumer_group.token_secret_name(group.name)
    secret = await kube.get_or_none(kube_client.SECRETS, ns, secret_name)
    token = consumer_group.token_from_secret(secret) if secret is not None else None
    if secret is None:
        token = tokens.new_token()
        secret_body = consumer_group.build_token_secret(group, token)
        kopf.adopt(secret_body, owner=owner)
        try:
            await kube.create(kube_client.SECRETS, ns, secret_body)
        except kube_errors.Conflict:
            # Created meanwhile (a concurrent run): the stored token wins.
            token = consumer_group.token_from_secret(
                await kube.get(kube_client.SECRETS, ns, secret_name)
            )
    if token is None:
        raise kube_errors.KubeError(
            f"the Secret {secret_name} holds no '{consumer_group.TOKEN_KEY}'"
        )
    await coordinator_port.port_of(state).set_token(group.group_id, token)

    service_name = consumer_group.service_name(group)
    if await kube.get_or_none(kube_client.SERVICES, ns, service_name) is None:
        service_body = consumer_group.build_headless_service(group)
        kopf.adopt(service_body, owner=owner)
        await kube.create(kube_client.SERVICES, ns, service_body)

    sts_name = consumer_group.stateful_set_name(group)
    url = state.config.coordinator_url
    gateway = config.gateway_settings(state.config)
    if await kube.get_or_none(kube_client.STATEFUL_SETS, ns, sts_name) is None:
        sts_body = consumer_group.build_stateful_set(group, url, gateway)
        kopf.adopt(sts_body, owner=owner)
        await kube.create(kube_client.STATEFUL_SETS, ns, sts_body)
    else:
        await kube.patch(
            kube_client.STATEFUL_SETS,
            ns,
            sts_name,
            consumer_group.build_stateful_set_patch(group, url, gateway),
        )


async def describe(
    state: lifecycle.OperatorState, group_id: str
) -> messages.GroupDescription | None:
    try:
        return await coordinator_port.port_of(state).describe_group(group_id)
    except coordinator_errors.GroupIdNotFound:
        return None


async def refresh_status(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec, body: Mapping[str, Any]
) -> messages.GroupDescription | None:
    """Compute the status from the coordinator and patch it when it changed; an Event when
    the lag verdict changed."""
    description = await describe(state, group.group_id)
    lag: Mapping[tuple[str, int], int] = {}
    window = state.lag_windows.setdefault(
        (group.namespace, group.name), lag_health.GroupLagWindow()
    )
    verdict = lag_health.GroupVerdict(lag_health.Verdict.NOTFOUND, ())
    if description is not None:
        lag = await observe_lag(state, group.group_id, window)
        # This process's wall clock (every replica runs a runtime), not the coordinator's.
        verdict = window.evaluate(state.runtime.config.clock_ms())
    status = body.get("status") or {}
    stateful_set = await state.kube.get_or_none(
        kube_client.STATEFUL_SETS, group.namespace, consumer_group.stateful_set_name(group)
    )
    observed = ((stateful_set or {}).get("status") or {}).get("replicas")
    fresh = group_status.build_group_status(
        group,
        (body.get("metadata") or {}).get("generation"),
        description,
        lag,
        status.get("conditions"),
        conditions.now_rfc3339(),
        observed_replicas=observed if isinstance(observed, int) else None,
        verdict=verdict,
    )
    mirrored = native_group.mirror_condition(
        group.mirror_to_kafka, await coordinator_port.port_of(state).mirror_status(group.group_id)
    )
    fresh["conditions"] = conditions.merge_conditions(
        fresh["conditions"], [mirrored], fresh.get("observedGeneration"), conditions.now_rfc3339()
    )
    await _patch_status(state, body, fresh, owned=REFRESHED_CONDITIONS)
    report_verdict_change(window, verdict, status, body)
    return description


async def observe_lag(
    state: lifecycle.OperatorState, group_id: str, window: lag_health.GroupLagWindow
) -> Mapping[tuple[str, int], int]:
    """The group's lag per partition; feeds ``window`` with the committed offsets (and their
    commit times) and the log ends the lag comes from."""
    coordinators = coordinator_port.port_of(state)
    committed = (await coordinators.fetch_offsets(messages.OffsetFetchRequest(group_id))).offsets
    lag = await coordinators.group_lag(group_id)
    window.observe(
        {tp: (value.offset, value.commit_timestamp) for tp, value in committed.items()},
        # The lag is the log end minus the committed offset (0 when the log end is behind).
        {tp: committed[tp].offset + value for tp, value in lag.items() if tp in committed},
    )
    return lag


def report_verdict_change(
    window: lag_health.GroupLagWindow,
    verdict: lag_health.GroupVerdict,
    status: Mapping[str, Any],
    body: Mapping[str, Any],
) -> None:
    """An Event when the group's lag verdict differs from the one published before (by this
    process, or as found in the status after a restart; none is NOTFOUND)."""
    previous = window.published
    if previous is None:
        recorded = ((status.get("lag") or {}).get("verdict") or {}).get("status")
        previous = lag_health.Verdict.__members__.get(str(recorded), lag_health.Verdict.NOTFOUND)
    window.published = verdict.verdict
    if previous is verdict.verdict:
        return
    healthy = verdict.verdict in (lag_health.Verdict.OK, lag_health.Verdict.NOTFOUND)
    kopf.event(
        kopf.Body(cast("kopf.RawBody", body)),
        type="Normal" if healthy else "Warning",
        reason="LagVerdictChanged",
        message=f"lag verdict {previous.name} -> {verdict.verdict.name}: "
        f"{group_status.lag_condition(verdict).message}",
    )


async def remove_surplus_members(
    state: lifecycle.OperatorState,
    group: specs.ConsumerGroupSpec,
    description: messages.GroupDescription | None,
    owner: Mapping[str, Any],
) -> None:
    """Remove static members whose pod ordinal is at or above ``spec.replicas``."""
    if description is None:
        return
    surplus = tuple(
        member.instance_id
        for member in description.members
        if member.instance_id is not None
        and (ordinal := consumer_group.ordinal_of(group.name, member.instance_id)) is not None
        and ordinal >= group.replicas
    )
    if surplus:
        await remove_members(state, group, surplus, owner)


async def remove_members(
    state: lifecycle.OperatorState,
    group: specs.ConsumerGroupSpec,
    instance_ids: tuple[str, ...],
    owner: Mapping[str, Any],
) -> None:
    """Permanent leave of ``instance_ids``; an Event for each member that was still there."""
    results = await coordinator_port.port_of(state).remove_members(
        messages.RemoveMembersRequest(group_id=group.group_id, instance_ids=instance_ids)
    )
    for instance_id in instance_ids:
        # An error (UNKNOWN_MEMBER_ID) only says it was removed already, e.g. by a pod event.
        if instance_id in results and results[instance_id] is None:
            kopf.event(
                kopf.Body(cast("kopf.RawBody", owner)),
                type="Normal",
                reason="MemberRemoved",
                message=f"{instance_id} is beyond spec.replicas={group.replicas}: "
                "its partitions move now",
            )


# Conditions other handlers own; a status write here never carries them.
OTHER_HANDLERS_CONDITIONS = frozenset({conditions.RESET_IN_PROGRESS})
# What a status refresh computes. The refresh runs on the body its daemon last saw, so any
# other condition in it may be stale: a ReconciliationPaused=True written back after the
# resumed reconcile set it False would stay True for good.
REFRESHED_CONDITIONS = frozenset({*group_status.STATUS_CONDITIONS, native_group.OFFSETS_MIRRORED})


async def _patch_status(
    state: lifecycle.OperatorState,
    body: Mapping[str, Any],
    fresh: Mapping[str, Any],
    owned: frozenset[str] | None = None,
) -> None:
    """Write our part of the status without losing what others wrote meanwhile.

    Other handlers own other conditions (ResetInProgress) and fields (lastReset), and the
    status daemon and the handlers write concurrently. So the conditions computed here
    replace only their own types in the object as it is now, and the patch carries that
    object's resourceVersion: on a conflict the merge is redone on the newer object.
    ``owned``, when given, names the only condition types this write may change.
    """
    meta = body.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta["name"]
    # ``fresh`` was built on the status as this handler last saw it, which carries the other
    # handlers' conditions as they were then: writing those back could undo a newer write
    # (a finished reset's ResetInProgress=False back to True, leaving the group paused).
    ours = {
        item["type"]: item
        for item in fresh.get("conditions") or ()
        if item["type"] not in OTHER_HANDLERS_CONDITIONS
        and (owned is None or item["type"] in owned)
    }
    for _ in range(5):
        current = await state.kube.get(kube_client.CONSUMER_GROUPS, namespace, name)
        status = current.get("status") or {}
        patch = dict(fresh)
        if "conditions" in fresh:
            merged = [ours.get(item.get("type"), item) for item in status.get("conditions") or ()]
            present = {item.get("type") for item in merged}
            merged.extend(item for key, item in ours.items() if key not in present)
            patch["conditions"] = merged
        if all(status.get(key) == value for key, value in patch.items()):
            return
        version = (current.get("metadata") or {}).get("resourceVersion")
        try:
            await state.kube.patch_status(
                kube_client.CONSUMER_GROUPS, namespace, name, patch, resource_version=version
            )
            return
        except kube_errors.Conflict:
            continue
    raise kube_errors.Conflict(f"the status of {namespace}/{name} keeps changing")


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10)
async def observe(stopped: Any, body: kopf.Body, memo: Any, logger: Any, **_: Any) -> None:
    """Refresh the status every few seconds; an Event per change of the group epoch."""
    last_epoch: int | None = None
    while not stopped:
        try:
            state = lifecycle.state_of(memo)
            meta = body.get("metadata") or {}
            if state.reconciled.get((meta["namespace"], meta["name"])) != meta.get("generation"):
                # A change is pending or failed: ``reconcile`` owns the status until it is done.
                await stopped.wait(lifecycle.config_of(memo).status_interval_seconds)
                continue
            group = parse(body)
            description = await refresh_status(state, group, body)
            if description is not None:
                if last_epoch is not None and description.group_epoch != last_epoch:
                    kopf.event(
                        body,
                        type="Normal",
                        reason="Rebalance",
                        message=f"group epoch {last_epoch} -> {description.group_epoch} "
                        f"({len(description.members)} members, state {description.state})",
                    )
                last_epoch = description.group_epoch
            if not reconciliation_paused(body.get("metadata") or {}):
                await remove_surplus_members(state, group, description, body)
        except spec_errors.SpecError:
            pass  # reported by ``reconcile``
        except kopf.TemporaryError:
            pass  # still starting
        except (kube_errors.KubeError, coordinator_errors.CoordinatorError) as error:
            logger.warning("cannot refresh the status: %s", error)
        await stopped.wait(lifecycle.config_of(memo).status_interval_seconds)


@kopf.on.event("", "v1", "pods", labels={consumer_group.GROUP_LABEL: kopf.PRESENT})
async def pod_event(
    type: str,  # noqa: A002 - kopf's keyword
    name: str,
    namespace: str | None,
    labels: Mapping[str, str],
    memo: Any,
    **_: Any,
) -> None:
    group_name = labels[consumer_group.GROUP_LABEL]
    ordinal = consumer_group.ordinal_of(group_name, name)
    if ordinal is None or namespace is None:
        return
    state = lifecycle.state_of(memo)
    owner = await state.kube.get_or_none(kube_client.CONSUMER_GROUPS, namespace, group_name)
    if owner is None or reconciliation_paused(owner.get("metadata") or {}):
        return
    try:
        group = parse(owner)
    except spec_errors.SpecError:
        return
    recorded = await coordinator_port.port_of(state).group_owner(group.group_id)
    if recorded is None or recorded.uid != owner["metadata"].get("uid"):
        return  # a second claimant of the group id acts on nobody's members
    if ordinal < group.replicas:
        # A live ordinal: a restart or failure is a temporary leave; the member keeps its
        # partitions for the session timeout.
        return
    await remove_members(state, group, (name,), owner)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(
    body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, retry: int, memo: Any, **_: Any
) -> None:
    """Only the owner of the group id removes anything, and only once its pods are gone.

    The pods' members need the token for their final commit and leave, so the StatefulSet
    is deleted first and the token kept (the finalizer held) until no pod of the group is
    left; then the records go (``deletionPolicy: Delete``), the token is discarded and the
    group id released for a waiting claimant.
    """
    state = lifecycle.state_of(memo)
    group_id = ownership.group_id_of(body)
    state.reconciled.pop((meta["namespace"], meta["name"]), None)
    state.lag_windows.pop((meta["namespace"], meta["name"]), None)
    delay = min(retry_delay(retry, state.config.retry_base_seconds), 10.0)
    coordinators = coordinator_port.port_of(state)
    try:
        # A resource that never got to claim its id (deleted before its first
        # reconciliation, or an upgrade from a version without owners) claims it now,
        # unless an older resource names the id too.
        owner = await ownership.claim(
            coordinators, state.kube, group_id, meta, state.config.namespaces
        )
    except (coordinator_errors.CoordinatorError, kube_errors.KubeError) as error:
        raise kopf.TemporaryError(
            f"cannot look up the owner of {group_id}: {error}", delay
        ) from error
    if owner.uid != meta.get("uid"):
        kopf.event(
            body,
            type="Normal",
            reason=ownership.GROUP_ID_CONFLICT,
            message=f"{group_id} belongs to ConsumerGroup {owner.namespace}/{owner.name}: "
            "its token and offsets are left alone",
        )
        return
    try:
        remaining = await _stop_pods(state, meta)
    except kube_errors.KubeError as error:
        raise kopf.TemporaryError(f"cannot stop the pods of {group_id}: {error}", delay) from error
    if remaining:
        raise kopf.TemporaryError(
            f"waiting for {remaining} pod(s) of the group to stop before revoking its token",
            delay,
        )
    policy = spec.get("deletionPolicy", "Retain")
    if policy != "Delete":
        await _flush_mirror(state, body, retry)
    try:
        await coordinators.remove_mirror(group_id)
    except coordinator_errors.CoordinatorError as error:
        raise kopf.TemporaryError(f"cannot stop mirroring {group_id}: {error}", delay) from error
    if policy == "Delete":
        try:
            await coordinators.delete_group(
                messages.DeleteGroupRequest(group_id=group_id, force=True, owner_uid=owner.uid)
            )
        except coordinator_errors.GroupIdNotFound:
            pass
        except coordinator_errors.CoordinatorError as error:
            raise kopf.TemporaryError(
                f"cannot delete group {group_id}: {error}", delay=10
            ) from error
        await _delete_native(state, body, retry)
        kopf.event(
            body,
            type="Normal",
            reason="GroupDeleted",
            message=f"every record of {group_id} was removed",
        )
    else:
        kopf.event(
            body,
            type="Normal",
            reason="GroupRetained",
            message=f"the offsets of {group_id} are kept",
        )
    # The token goes before the id is released: a claimant taking the id over sets its own.
    try:
        await coordinators.discard_token(group_id)
        await coordinators.release_group(messages.ReleaseGroupRequest(group_id, owner.uid))
    except coordinator_errors.CoordinatorError as error:
        raise kopf.TemporaryError(f"cannot release {group_id}: {error}", delay) from error


async def _flush_mirror(state: lifecycle.OperatorState, body: kopf.Body, retry: int) -> None:
    """Bring the native group up to the last commits before the group leaves (moving out):
    retried a few times, then the group goes anyway, with a Warning saying it is behind."""
    try:
        group = parse(body)
    except spec_errors.SpecError:
        return  # never reconciled as written: never mirrored
    try:
        flushed = await native_group.flush_before_leaving(state, group)
    except coordinator_errors.CoordinatorError as error:
        raise kopf.TemporaryError(
            f"cannot mirror the final offsets: {error}",
            min(retry_delay(retry, state.config.retry_base_seconds), 10.0),
        ) from error
    if flushed is None or flushed.mirrored:
        return
    _retry_then_warn(
        state,
        body,
        retry,
        f"the native group is behind: {flushed.message}",
        "OffsetsNotMirrored",
        f"the group leaves with its native group behind: {flushed.message}",
    )


def _retry_then_warn(
    state: lifecycle.OperatorState,
    body: kopf.Body,
    retry: int,
    retrying: str,
    reason: str,
    warning: str,
) -> None:
    """A step of a group's leaving that did not finish: retried a few times (``retrying``),
    then the group goes anyway, with a Warning Event saying what is left."""
    if retry < _FLUSH_RETRIES:
        raise kopf.TemporaryError(
            retrying, min(retry_delay(retry, state.config.retry_base_seconds), 10.0)
        )
    kopf.event(body, type="Warning", reason=reason, message=warning)


async def _delete_native(state: lifecycle.OperatorState, body: kopf.Body, retry: int) -> None:
    """Delete the brokers' own group of the id (the mirror's copy of the offsets, or the ones
    adopted), after the coordinator's records and the mirror: retried a few times, then the
    group goes anyway, with a Warning saying what is left."""
    try:
        group = parse(body)
    except spec_errors.SpecError:
        return  # never reconciled as written: nothing mirrored or adopted
    left = await native_group.delete_native(state, group)
    if left is None:
        return
    _retry_then_warn(
        state,
        body,
        retry,
        f"cannot delete the native group {group.group_id}: {left}",
        "NativeGroupKept",
        f"the brokers' own group {group.group_id} was not deleted: {left}",
    )


async def _stop_pods(state: lifecycle.OperatorState, meta: Mapping[str, Any]) -> int:
    """Delete the group's StatefulSet (the garbage collector would only after the resource
    is gone, which the finalizer holds back); how many of its pods still exist."""
    namespace, name = meta["namespace"], meta["name"]
    stateful_set = await state.kube.get_or_none(kube_client.STATEFUL_SETS, namespace, name)
    if stateful_set is not None:
        references = (stateful_set.get("metadata") or {}).get("ownerReferences") or ()
        if any(reference.get("uid") == meta.get("uid") for reference in references):
            await state.kube.delete(kube_client.STATEFUL_SETS, namespace, name)
    pods = await state.kube.list(kube_client.PODS, namespace, consumer_group.selector_labels(name))
    return len(pods)
