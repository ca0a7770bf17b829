"""ConsumerGroup status and conditions, computed purely from the coordinator's description."""

from __future__ import annotations

from typing import Any

from kafka_group_operator.coordinator import lag_health, messages
from kafka_group_operator.manifests import conditions, group_status
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors
from tests.support import kube_schema

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def _group(**changes: Any) -> specs.ConsumerGroupSpec:
    spec: dict[str, Any] = {
        "topics": ["orders"],
        "replicas": 2,
        "kafka": {"bootstrapServers": "kafka:9092"},
        "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
    }
    spec.update(changes)
    return specs.parse_consumer_group("orders", "shop", spec)


def _member(instance: str, state: str, partitions: frozenset[int]) -> messages.MemberDescription:
    return messages.MemberDescription(
        member_id=f"uid-{instance}",
        instance_id=instance,
        rack_id=None,
        member_epoch=4,
        state=state,
        subscribed_topic_names=("orders",),
        assignment={"orders": partitions},
        target_assignment={"orders": partitions},
        partitions_pending_revocation={},
    )


def _description(state: str, *members: messages.MemberDescription) -> messages.GroupDescription:
    return messages.GroupDescription(
        group_id="shop.orders",
        state=state,
        group_epoch=4,
        assignment_epoch=4,
        assignor="cooperative-sticky",
        members=members,
    )


STABLE = _description(
    "stable",
    _member("orders-1", "stable", frozenset({2, 3})),
    _member("orders-0", "stable", frozenset({0, 1})),
)
LAG = {("orders", 0): 5, ("orders", 1): 0, ("orders", 2): 7, ("orders", 3): -1}


def _by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {condition["type"]: condition for condition in status["conditions"]}


def test_stable_group_status() -> None:
    status = group_status.build_group_status(_group(), 3, STABLE, LAG, None, T0)
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "observedGeneration": 3,
        "groupId": "shop.orders",
        "state": "Stable",
        "groupEpoch": 4,
        "assignmentEpoch": 4,
        "replicas": 2,
        "readyMembers": 2,
        "labelSelector": "kafkagroups.io/consumer-group=orders",
        "tokenSecret": "orders-group-token",
        "members": [
            {
                "instanceId": "orders-0",
                "memberId": "uid-orders-0",
                "epoch": 4,
                "state": "stable",
                "partitions": 2,
                "lag": 5,
            },
            {
                "instanceId": "orders-1",
                "memberId": "uid-orders-1",
                "epoch": 4,
                "state": "stable",
                "partitions": 2,
                "lag": 7,
            },
        ],
        # A negative lag (a commit past the log end seen through a stale watermark) counts 0.
        "lag": {"total": 12, "max": 7, "topics": {"orders": 12}},
    }
    conditions_by_type = _by_type(status)
    assert conditions_by_type["Ready"] == {
        "type": "Ready",
        "status": "True",
        "reason": "GroupStable",
        "message": "2 of 2 members own their target",
        "lastTransitionTime": T0,
        "observedGeneration": 3,
    }
    assert conditions_by_type["Rebalancing"]["status"] == "False"
    assert conditions_by_type["Degraded"]["status"] == "False"


def test_status_is_accepted_and_not_pruned_by_the_crd() -> None:
    status = group_status.build_group_status(_group(), 3, STABLE, LAG, None, T0)
    resource = {**kube_schema.examples("ConsumerGroup")[0], "status": status}
    kube_schema.validate("consumergroups", resource)
    assert list(kube_schema.pruned_paths(kube_schema.schema_of("consumergroups"), resource)) == []


def test_rebalancing_and_missing_members() -> None:
    reconciling = _description(
        "reconciling", _member("orders-0", "unrevoked_partitions", frozenset({0}))
    )
    status = group_status.build_group_status(_group(), 3, reconciling, {}, None, T0)
    by_type = _by_type(status)
    assert status["state"] == "Reconciling"
    assert status["readyMembers"] == 0
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == ("False", "Rebalancing")
    assert by_type["Rebalancing"]["status"] == "True"
    assert (by_type["Degraded"]["status"], by_type["Degraded"]["reason"]) == (
        "True",
        "MembersMissing",
    )


def test_paused_and_scaled_to_zero_are_ready() -> None:
    paused = group_status.build_group_status(_group(paused=True), 1, None, {}, None, T0)
    assert paused["state"] == "Paused"
    assert _by_type(paused)["Ready"]["reason"] == "Paused"
    zero = group_status.build_group_status(_group(replicas=0), 1, None, {}, None, T0)
    assert zero["state"] == "Empty"
    assert (_by_type(zero)["Ready"]["status"], _by_type(zero)["Ready"]["reason"]) == (
        "True",
        "ScaledToZero",
    )


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = group_status.build_group_status(_group(), 1, STABLE, {}, None, T0)
    same = group_status.build_group_status(_group(), 2, STABLE, {}, first["conditions"], T1)
    assert _by_type(same)["Ready"]["lastTransitionTime"] == T0
    assert _by_type(same)["Ready"]["observedGeneration"] == 2
    changed = group_status.build_group_status(
        _group(replicas=3), 3, STABLE, {}, same["conditions"], T1
    )
    assert _by_type(changed)["Ready"]["status"] == "False"
    assert _by_type(changed)["Ready"]["lastTransitionTime"] == T1


def test_conditions_of_others_are_kept() -> None:
    previous = [{"type": "ResetInProgress", "status": "True", "reason": "Revoking", "message": "m"}]
    status = group_status.build_group_status(_group(), 1, STABLE, {}, previous, T0)
    assert [c["type"] for c in status["conditions"]] == [
        "ResetInProgress",
        "Ready",
        "Rebalancing",
        "Degraded",
    ]
    assert status["conditions"][0] == previous[0]


def test_error_status() -> None:
    error = errors.UnknownTopic("topic(s) orders do not exist on kafka:9092")
    status = group_status.build_error_status(error, 5, None, T0)
    assert status["observedGeneration"] == 5
    assert "groupId" not in status
    # The id the resource names, when known, as a reconciled group's status has it.
    named = group_status.build_error_status(error, 5, None, T0, "shop.orders")
    assert named["groupId"] == "shop.orders"
    assert named["conditions"] == status["conditions"]
    assert status["conditions"] == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "UnknownTopic",
            "message": error.message,
            "lastTransitionTime": T0,
            "observedGeneration": 5,
        },
        {
            "type": "Degraded",
            "status": "True",
            "reason": "UnknownTopic",
            "message": error.message,
            "lastTransitionTime": T0,
            "observedGeneration": 5,
        },
    ]


def test_find_and_unknown_status() -> None:
    merged = conditions.merge_conditions(
        None, [conditions.Condition("Ready", None, "Starting", "m")], None, T0
    )
    assert merged == [
        {
            "type": "Ready",
            "status": "Unknown",
            "reason": "Starting",
            "message": "m",
            "lastTransitionTime": T0,
        }
    ]
    assert conditions.find(merged, "Ready") == merged[0]
    assert conditions.find(merged, "Degraded") is None


def test_replicas_come_from_the_stateful_set_once_it_reports() -> None:
    desired = group_status.build_group_status(_group(replicas=3), 1, STABLE, {}, None, T0)
    assert desired["replicas"] == 3
    observed = group_status.build_group_status(
        _group(replicas=3), 1, STABLE, {}, None, T0, observed_replicas=2
    )
    assert observed["replicas"] == 2


def _lag_verdict(*partitions: tuple[int, lag_health.Verdict, int]) -> lag_health.GroupVerdict:
    """A verdict over partitions of ``orders`` given as (partition, verdict, lag)."""
    listed = tuple(
        lag_health.PartitionVerdict("orders", p, v, lag, 100 + p, 1_767_225_600_000)
        for p, v, lag in partitions
    )
    return lag_health.GroupVerdict(lag_health.group_verdict(v for _, v, _ in partitions), listed)


def test_lag_verdict_and_condition() -> None:
    stopped = _lag_verdict(
        (1, lag_health.Verdict.STOP, 40),
        (3, lag_health.Verdict.WARNING, 9),
        (0, lag_health.Verdict.OK, 0),
    )
    status = group_status.build_group_status(_group(), 3, STABLE, LAG, None, T0, verdict=stopped)
    assert status["lag"]["verdict"] == {
        "status": "ERROR",
        "evaluatedPartitions": 3,
        "unhealthyPartitions": 2,
        "partitions": [
            {
                "topic": "orders",
                "partition": 1,
                "status": "STOP",
                "lag": 40,
                "offset": 101,
                "lastCommit": "2026-01-01T00:00:00Z",
            },
            {
                "topic": "orders",
                "partition": 3,
                "status": "WARNING",
                "lag": 9,
                "offset": 103,
                "lastCommit": "2026-01-01T00:00:00Z",
            },
        ],
    }
    healthy = _by_type(status)["LagHealthy"]
    assert (healthy["status"], healthy["reason"]) == ("False", "ERROR")
    assert healthy["message"] == "2 partition(s): orders/1 STOP (lag 40), orders/3 WARNING (lag 9)"
    resource = {**kube_schema.examples("ConsumerGroup")[0], "status": status}
    kube_schema.validate("consumergroups", resource)
    assert list(kube_schema.pruned_paths(kube_schema.schema_of("consumergroups"), resource)) == []

    ok = _lag_verdict((0, lag_health.Verdict.OK, 3))
    status = group_status.build_group_status(
        _group(), 3, STABLE, LAG, status["conditions"], T1, verdict=ok
    )
    healthy = _by_type(status)["LagHealthy"]
    assert (healthy["status"], healthy["reason"], healthy["lastTransitionTime"]) == (
        "True",
        "OK",
        T1,
    )
    assert status["lag"]["verdict"]["partitions"] == []


def test_lag_verdict_before_any_commit_is_unknown() -> None:
    verdict = lag_health.GroupVerdict(lag_health.Verdict.NOTFOUND, ())
    status = group_status.build_group_status(_group(), 3, None, {}, None, T0, verdict=verdict)
    healthy = _by_type(status)["LagHealthy"]
    assert (healthy["status"], healthy["reason"]) == ("Unknown", "NOTFOUND")
    assert status["lag"]["verdict"]["status"] == "NOTFOUND"


def test_lag_verdict_lists_a_bounded_number_of_partitions() -> None:
    many = _lag_verdict(*((p, lag_health.Verdict.STALL, 1000 - p) for p in range(25)))
    verdict = group_status.build_verdict(many)
    assert verdict["unhealthyPartitions"] == 25
    assert [p["partition"] for p in verdict["partitions"]] == list(range(10))
    assert group_status.lag_condition(many).message.endswith("and 22 more")


def test_a_classic_group_rebalancing_reads_as_assigning_then_reconciling() -> None:
    def described(state: str) -> messages.GroupDescription:
        return messages.GroupDescription(
            "g", state, 3, 3, "range", (), group_type="classic", protocol_type="consumer"
        )

    assert group_status.group_state(described("PreparingRebalance"), False) == "Assigning"
    assert group_status.group_state(described("CompletingRebalance"), False) == "Reconciling"
    assert group_status.group_state(described("Stable"), False) == "Stable"
