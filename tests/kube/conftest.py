"""Fixtures of the operator tests: the API server (kmock + our additions), a topic, the operator."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kafka_group_operator.embedded import broker as embedded
from tests.support import kube, topics


@pytest.fixture
def topic(broker: embedded.EmbeddedBroker) -> str:
    """A fresh 4-partition topic for the group to consume."""
    return topics.create_topic(broker.bootstrap, 4)


@pytest.fixture
async def operator(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker
) -> AsyncIterator[kube.RunningOperator]:
    config = kube.operator_config_for(
        kmock,
        broker.bootstrap,
        status_interval_seconds=0.2,
        retry_base_seconds=0.5,
        kafka_probe_timeout_seconds=2.0,
    )
    async with kube.RunningOperator(config) as running:
        yield running
