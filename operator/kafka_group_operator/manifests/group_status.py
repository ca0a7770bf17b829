"""The ``status`` of a ConsumerGroup, computed from what the coordinator reports.

Pure: the coordinator's ``GroupDescription``, the per-partition lag, the lag verdict and the
spec in; the status dict (state, epochs, members, lag and its verdict, conditions) out. The
handlers patch it as it is.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from kafka_group_operator.coordinator import lag_health, messages
from kafka_group_operator.manifests import conditions, consumer_group
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors

# The coordinator's state names (any case) -> the CRD's ``status.state`` enum. A classic
# group's (``spec.assignment: Client``) rebalance reads as its consumer-group counterpart:
# members joining is Assigning, members waiting for the leader's assignment Reconciling.
_STATES = {
    "empty": "Empty",
    "assigning": "Assigning",
    "reconciling": "Reconciling",
    "stable": "Stable",
    "paused": "Paused",
    "dead": "Dead",
    "preparingrebalance": "Assigning",
    "completingrebalance": "Reconciling",
}
_REBALANCING_STATES = ("Assigning", "Reconciling")
# The conditions ``build_group_status`` computes; the others in ``status`` are other writers'.
STATUS_CONDITIONS = frozenset(
    {conditions.READY, conditions.REBALANCING, conditions.DEGRADED, conditions.LAG_HEALTHY}
)
# At most this many partitions are listed under ``status.lag.verdict.partitions`` (the worst
# ones), so that the status of a group with thousands of partitions stays small.
MAX_VERDICT_PARTITIONS = 10
# ... and named in the LagHealthy condition's message.
_MESSAGE_PARTITIONS = 3


def group_state(description: messages.GroupDescription | None, paused: bool) -> str:
    if paused:
        return "Paused"
    if description is None:
        return "Empty"
    return _STATES.get(description.state.lower(), "Unknown")


def is_ready_member(member: messages.MemberDescription) -> bool:
    """A member is ready when it heartbeats in the current epoch and owns its target."""
    return member.state.lower() == "stable"


def build_lag(
    lag: Mapping[tuple[str, int], int], verdict: lag_health.GroupVerdict | None = None
) -> dict[str, Any]:
    per_topic: dict[str, int] = {}
    for (topic, _), value in lag.items():
        per_topic[topic] = per_topic.get(topic, 0) + max(value, 0)
    values = [max(value, 0) for value in lag.values()]
    built: dict[str, Any] = {
        "total": sum(values),
        "max": max(values, default=0),
        "topics": per_topic,
    }
    if verdict is not None:
        built["verdict"] = build_verdict(verdict)
    return built


def _commit_time(timestamp_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
    return conditions.now_rfc3339(moment)


def build_verdict(verdict: lag_health.GroupVerdict) -> dict[str, Any]:
    """``status.lag.verdict``: the group's verdict and its partitions that are not OK, the
    worst first, at most ``MAX_VERDICT_PARTITIONS`` of them."""
    unhealthy = [p for p in verdict.partitions if p.verdict is not lag_health.Verdict.OK]
    return {
        "status": verdict.verdict.name,
        "evaluatedPartitions": len(verdict.partitions),
        "unhealthyPartitions": len(unhealthy),
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "status": p.verdict.name,
                "lag": p.current_lag,
                "offset": p.offset,
                "lastCommit": _commit_time(p.commit_timestamp_ms),
            }
            for p in unhealthy[:MAX_VERDICT_PARTITIONS]
        ],
    }


def lag_condition(verdict: lag_health.GroupVerdict) -> conditions.Condition:
    """``LagHealthy``: True for OK, Unknown before any commit, False otherwise; the reason
    is the verdict."""
    name = verdict.verdict.name
    if verdict.verdict is lag_health.Verdict.NOTFOUND:
        return conditions.Condition(
            conditions.LAG_HEALTHY, None, name, "the group has no committed offset to evaluate"
        )
    if verdict.verdict is lag_health.Verdict.OK:
        return conditions.Condition(
            conditions.LAG_HEALTHY,
            True,
            name,
            f"{len(verdict.partitions)} committed partition(s), none stopped, stalled, "
            "rewound or falling behind",
        )
    unhealthy = [p for p in verdict.partitions if p.verdict is not lag_health.Verdict.OK]
    named = ", ".join(
        f"{p.topic}/{p.partition} {p.verdict.name} (lag {p.current_lag})"
        for p in unhealthy[:_MESSAGE_PARTITIONS]
    )
    more = len(unhealthy) - _MESSAGE_PARTITIONS
    suffix = f" and {more} more" if more > 0 else ""
    return conditions.Condition(
        conditions.LAG_HEALTHY, False, name, f"{len(unhealthy)} partition(s): {named}{suffix}"
    )


def build_members(
    description: messages.GroupDescription | None, lag: Mapping[tuple[str, int], int]
) -> list[dict[str, Any]]:
    if description is None:
        return []
    members = []
    for member in description.members:
        owned = [(topic, p) for topic, parts in member.assignment.items() for p in parts]
        entry: dict[str, Any] = {
            "memberId": member.member_id,
            "epoch": member.member_epoch,
            "state": member.state,
            "partitions": len(owned),
            "lag": sum(max(lag.get(tp, 0), 0) for tp in owned),
        }
        if member.instance_id is not None:
            entry["instanceId"] = member.instance_id
        members.append(entry)
    members.sort(key=lambda entry: (str(entry.get("instanceId", "")), str(entry["memberId"])))
    return members


def build_group_status(
    group: specs.ConsumerGroupSpec,
    generation: int | None,
    description: messages.GroupDescription | None,
    lag: Mapping[tuple[str, int], int],
    previous_conditions: Sequence[Mapping[str, Any]] | None,
    now: str,
    observed_replicas: int | None = None,
    verdict: lag_health.GroupVerdict | None = None,
) -> dict[str, Any]:
    """The full status of a group that is reconciled and coordinated.

    ``observed_replicas`` is the StatefulSet's own count of pods (what autoscalers read
    through the scale subresource); until it reports one, the desired count stands in.
    ``verdict``, when given, is published as ``lag.verdict`` and the LagHealthy condition.
    """
    state = group_state(description, group.paused)
    members = build_members(description, lag)
    ready = sum(1 for m in description.members if is_ready_member(m)) if description else 0
    updates = _conditions_for(group, state, ready, len(members))
    if verdict is not None:
        updates.append(lag_condition(verdict))
    return {
        "observedGeneration": generation,
        "groupId": group.group_id,
        "state": state,
        "groupEpoch": description.group_epoch if description else 0,
        "assignmentEpoch": description.assignment_epoch if description else 0,
        "replicas": group.replicas if observed_replicas is None else observed_replicas,
        "readyMembers": ready,
        "labelSelector": consumer_group.label_selector(group.name),
        "tokenSecret": consumer_group.token_secret_name(group.name),
        "members": members,
        "lag": build_lag(lag, verdict),
        "conditions": conditions.merge_conditions(previous_conditions, updates, generation, now),
    }


def build_error_status(
    error: errors.SpecError,
    generation: int | None,
    previous_conditions: Sequence[Mapping[str, Any]] | None,
    now: str,
    group_id: str | None = None,
) -> dict[str, Any]:
    """The status of a group whose spec cannot be honoured (Ready=False, Degraded=True).

    ``group_id``, the id the resource names (its default when ``spec.groupId`` is unset),
    goes into ``status.groupId`` as for a reconciled group: ``-o wide`` shows which id a
    refused resource (a second claimant, say) is about."""
    updates = [
        conditions.Condition(conditions.READY, False, error.reason, error.message),
        conditions.Condition(conditions.DEGRADED, True, error.reason, error.message),
    ]
    status: dict[str, Any] = {"observedGeneration": generation}
    if group_id is not None:
        status["groupId"] = group_id
    status["conditions"] = conditions.merge_conditions(
        previous_conditions, updates, generation, now
    )
    return status


def _conditions_for(
    group: specs.ConsumerGroupSpec, state: str, ready: int, members: int
) -> list[conditions.Condition]:
    rebalancing = state in _REBALANCING_STATES
    wanted = group.replicas
    if state == "Paused":
        ready_condition = conditions.Condition(
            conditions.READY, True, "Paused", "spec.paused is set: no partition is assigned"
        )
    elif wanted == 0:
        ready_condition = conditions.Condition(
            conditions.READY, True, "ScaledToZero", "the group has no replicas"
        )
    elif state == "Stable" and ready >= wanted:
        ready_condition = conditions.Condition(
            conditions.READY, True, "GroupStable", f"{ready} of {wanted} members own their target"
        )
    elif rebalancing:
        ready_condition = conditions.Condition(
            conditions.READY, False, "Rebalancing", f"{ready} of {wanted} members are ready"
        )
    else:
        ready_condition = conditions.Condition(
            conditions.READY, False, "MembersNotReady", f"{ready} of {wanted} members are ready"
        )
    rebalancing_condition = conditions.Condition(
        conditions.REBALANCING,
        rebalancing,
        "AssignmentInProgress" if rebalancing else "AssignmentReconciled",
        f"the group is {state}",
    )
    missing = max(wanted - members, 0)
    degraded_condition = conditions.Condition(
        conditions.DEGRADED,
        missing > 0 and state != "Paused",
        "MembersMissing" if missing > 0 else "AllMembersPresent",
        f"{members} of {wanted} members are in the group",
    )
    return [ready_condition, rebalancing_condition, degraded_condition]
