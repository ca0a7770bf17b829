"""The ``status`` of a ConsumerGroup, computed from what the coordinator reports.

Pure: the coordinator's ``GroupDescription``, the per-partition lag and the spec in; the
status dict (state, epochs, members, lag, conditions) out. The handlers patch it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kafka_group_operator.coordinator import messages
from kafka_group_operator.manifests import conditions, consumer_group
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors

# The coordinator's state names (any case) -> the CRD's ``status.state`` enum.
_STATES = {
    "empty": "Empty",
    "assigning": "Assigning",
    "reconciling": "Reconciling",
    "stable": "Stable",
    "paused": "Paused",
    "dead": "Dead",
}
_REBALANCING_STATES = ("Assigning", "Reconciling")


def group_state(description: messages.GroupDescription | None, paused: bool) -> str:
    if paused:
        return "Paused"
    if description is None:
        return "Empty"
    return _STATES.get(description.state.lower(), "Unknown")


def is_ready_member(member: messages.MemberDescription) -> bool:
    """A member is ready when it heartbeats in the current epoch and owns its target."""
    return member.state.lower() == "stable"


def build_lag(lag: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    per_topic: dict[str, int] = {}
    for (topic, _), value in lag.items():
        per_topic[topic] = per_topic.get(topic, 0) + max(value, 0)
    values = [max(value, 0) for value in lag.values()]
    return {"total": sum(values), "max": max(values, default=0), "topics": per_topic}


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
) -> dict[str, Any]:
    """The full status of a group that is reconciled and coordinated.

    ``observed_replicas`` is the StatefulSet's own count of pods (what autoscalers read
    through the scale subresource); until it reports one, the desired count stands in.
    """
    state = group_state(description, group.paused)
    members = build_members(description, lag)
    ready = sum(1 for m in description.members if is_ready_member(m)) if description else 0
    updates = _conditions_for(group, state, ready, len(members))
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
        "lag": build_lag(lag),
        "conditions": conditions.merge_conditions(previous_conditions, updates, generation, now),
    }


def build_error_status(
    error: errors.SpecError,
    generation: int | None,
    previous_conditions: Sequence[Mapping[str, Any]] | None,
    now: str,
) -> dict[str, Any]:
    """The status of a group whose spec cannot be honoured (Ready=False, Degraded=True)."""
    updates = [
        conditions.Condition(conditions.READY, False, error.reason, error.message),
        conditions.Condition(conditions.DEGRADED, True, error.reason, error.message),
    ]
    return {
        "observedGeneration": generation,
        "conditions": conditions.merge_conditions(previous_conditions, updates, generation, now),
    }


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
