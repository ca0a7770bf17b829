"""Which replica runs the scheduled compaction (``jobs.compaction.schedules_here``): every
replica has the same schedule and storage, and two must never write one checkpoint at once."""

from __future__ import annotations

import pytest

from kafka_group_operator.jobs import compaction


@pytest.mark.parametrize(
    ("env", "here"),
    [
        ({}, True),  # one operator: it compacts
        ({"KGO_REPLICAS": "1", "KGO_POD_NAME": "kgo-2"}, True),
        ({"KGO_REPLICAS": "3", "KGO_POD_NAME": "kgo-0"}, True),
        ({"KGO_REPLICAS": "3", "KGO_POD_NAME": "kgo-1"}, False),
        ({"KGO_REPLICAS": "3", "KGO_POD_NAME": "kgo-10"}, False),
        ({"KGO_REPLICAS": "3", "HOSTNAME": "kafka-group-operator-0"}, True),
        ({"KGO_REPLICAS": "3", "HOSTNAME": "kafka-group-operator-2"}, False),
    ],
)
def test_only_the_first_replica_compacts(env: dict[str, str], here: bool) -> None:
    assert compaction.schedules_here(env) is here


def test_of_three_replicas_exactly_one_compacts() -> None:
    pods = [f"kafka-group-operator-{i}" for i in range(3)]
    chosen = [
        p for p in pods if compaction.schedules_here({"KGO_REPLICAS": "3", "KGO_POD_NAME": p})
    ]
    assert chosen == ["kafka-group-operator-0"]
