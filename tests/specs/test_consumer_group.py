"""The typed view of a ConsumerGroup: defaults and what the schema cannot reject."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_group_operator.manifests import group_settings
from kafka_group_operator.specs import consumer_group, errors
from tests.support import kube_schema


def _spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "topics": ["orders"],
        "kafka": {"bootstrapServers": "kafka:9092"},
        "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
    }
    spec.update(changes)
    return spec


def test_defaults_follow_the_crd() -> None:
    group = consumer_group.parse_consumer_group("orders", "shop", _spec())
    assert group.group_id == "shop.orders"
    assert group.topics == ("orders",)
    assert (group.replicas, group.assignor, group.deletion_policy) == (
        1,
        "cooperative-sticky",
        "Retain",
    )
    assert (group.session_timeout_seconds, group.rebalance_timeout_seconds) == (45, 300)
    assert (group.auto_offset_reset, group.offsets_retention_minutes) == ("latest", 10080)
    assert group.paused is False
    # The coordinator assigns unless the resource says otherwise (today's behaviour).
    assert group.assignment == "Server"
    assert group.kafka == consumer_group.KafkaConnection("kafka:9092", None)
    assert (group.mirror_to_kafka, group.mirror_interval_seconds, group.adopt) == (
        True,
        5,
        "IfEmpty",
    )


def test_explicit_fields_are_kept() -> None:
    group = consumer_group.parse_consumer_group(
        "payments",
        "shop",
        _spec(
            groupId="payments-v2",
            replicas=6,
            assignor="uniform",
            deletionPolicy="Delete",
            paused=True,
            kafka={"bootstrapServers": "a:9093,b:9093", "secretRef": {"name": "kafka-tls"}},
            offsetReset={"to": "earliest"},
            offsets={"mirrorToKafka": False, "mirrorIntervalSeconds": 60, "adopt": "Never"},
        ),
    )
    assert (group.mirror_to_kafka, group.mirror_interval_seconds, group.adopt) == (
        False,
        60,
        "Never",
    )
    assert group.group_id == "payments-v2"
    assert (group.replicas, group.assignor, group.deletion_policy, group.paused) == (
        6,
        "uniform",
        "Delete",
        True,
    )
    assert group.kafka == consumer_group.KafkaConnection("a:9093,b:9093", "kafka-tls")
    assert group.offset_reset == {"to": "earliest"}


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("x" * 53, _spec(), "longer than 52"),
        ("orders", _spec(topics=[]), "topics"),
        ("orders", _spec(topics=["a", "a"]), "more than once"),
        ("orders", _spec(topics=["bad topic"]), "legal Kafka topic"),
        ("orders", _spec(groupId="bad group"), "legal Kafka group"),
        ("orders", _spec(replicas=True), "replicas must be an integer"),
        ("orders", _spec(replicas=10001), "between 0 and 10000"),
        ("orders", _spec(assignor="magic"), "assignor must be one of"),
        ("orders", _spec(kafka={"bootstrapServers": "kafka"}), "host:port"),
        ("orders", _spec(kafka={"bootstrapServers": "k:1", "secretRef": {}}), "secretRef"),
        ("orders", _spec(template={"spec": {}}), "containers"),
        ("orders", _spec(paused="yes"), "paused"),
        ("orders", _spec(offsets=[]), "offsets must be an object"),
        ("orders", _spec(offsets={"mirrorToKafka": "yes"}), "offsets.mirrorToKafka"),
        ("orders", _spec(offsets={"mirrorIntervalSeconds": 0}), "between 1 and 3600"),
        ("orders", _spec(offsets={"adopt": "Always"}), "offsets.adopt must be one of"),
        ("orders", _spec(assignment="Leader"), "assignment must be one of"),
        ("orders", _spec(assignment="Client"), "needs clientProtocol kafka"),
        (
            "orders",
            _spec(assignment="Client", clientProtocol="kafka", paused=True),
            "paused needs assignment Server",
        ),
    ],
)
def test_invalid_specs(name: str, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidSpec, match=message) as caught:
        consumer_group.parse_consumer_group(name, "shop", spec)
    assert caught.value.reason == "InvalidSpec"


def test_client_assignment_reaches_the_coordinator_as_the_group_config() -> None:
    group = consumer_group.parse_consumer_group(
        "streams", "shop", _spec(assignment="Client", clientProtocol="kafka")
    )
    assert group.assignment == "Client"
    assert group_settings.build_group_settings(group).client_assignment is True
    server = consumer_group.parse_consumer_group("orders", "shop", _spec())
    assert group_settings.build_group_settings(server).client_assignment is False


@pytest.mark.parametrize(
    ("name", "accepted"),
    [
        ("orders", True),
        ("o", True),
        ("orders-v2", True),
        ("a" * 52, True),
        # controller-revision-hash=<name>-<10-character hash> would exceed 63 characters.
        ("a" * 53, False),
        ("orders.v2", False),  # a DNS subdomain, not a label: the Service would be refused
        ("Orders", False),
        ("2orders", False),  # DNS-1035: starts with a letter
        ("orders-", False),
    ],
)
def test_the_crd_and_the_spec_accept_the_same_names(name: str, accepted: bool) -> None:
    resource = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": _spec(),
    }
    assert (kube_schema.cel_violations("consumergroups", resource) == []) is accepted
    if accepted:
        consumer_group.parse_consumer_group(name, "shop", _spec())
    else:
        with pytest.raises(errors.InvalidSpec, match="name"):
            consumer_group.parse_consumer_group(name, "shop", _spec())


@pytest.mark.parametrize("schedule", ["0 2 * * *", "*/15 * * * *", "@daily", "0 0 29 2 *"])
def test_valid_snapshot_schedules(schedule: str) -> None:
    assert consumer_group.parse_snapshot_schedule(schedule) == schedule


@pytest.mark.parametrize(
    "schedule",
    [
        "99 99 99 99 99",  # the shape the CRD's pattern accepts, out of every range
        "0 0 30 2 *",  # never fires
        "*/0 * * * *",
        "a b c d e",
        "* * * * * * *",
        "@never",
        None,
    ],
)
def test_invalid_snapshot_schedules(schedule: Any) -> None:
    with pytest.raises(errors.InvalidSchedule) as caught:
        consumer_group.parse_snapshot_schedule(schedule)
    assert caught.value.reason == "InvalidSchedule"
    assert repr(schedule) in caught.value.message


def test_a_reset_scope_within_the_subscription_is_accepted() -> None:
    reset = {"to": "earliest", "topics": [{"name": "orders", "partitions": [0, 3]}]}
    consumer_group.check_reset_scope(reset, ["orders", "refunds"], {"orders": 4})
    consumer_group.check_reset_scope({"to": "earliest"}, ["orders"], {})  # every topic


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        ([{"name": "refunds"}], "the group does not subscribe to topic 'refunds'"),
        ([{"name": "orders", "partitions": [1, 4, 9]}], "has 4 partitions, not 4, 9"),
        ([{"name": "gone"}], "topic 'gone' does not exist"),
    ],
)
def test_a_reset_scope_beyond_the_group_is_refused(
    scope: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(errors.InvalidResetScope, match=message) as caught:
        consumer_group.check_reset_scope(
            {"to": "earliest", "topics": scope}, ["orders", "gone"], {"orders": 4}
        )
    assert caught.value.reason == "InvalidResetScope"
