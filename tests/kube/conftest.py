"""Fixtures of the operator tests: the API server (kmock + our additions), a topic, the operator."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config as operator_config
from tests.support import kube


@pytest.fixture
def topic(broker: embedded.EmbeddedBroker) -> str:
    """A fresh 4-partition topic for the group to consume."""
    name = f"orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, 4, 1)])[name].result(10)
    return name


@pytest.fixture
async def operator(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker
) -> AsyncIterator[kube.RunningOperator]:
    port = embedded.free_port()
    config = operator_config.OperatorConfig(
        bootstrap_servers=broker.bootstrap,
        state_topic=f"kgo-state-{uuid.uuid4().hex[:8]}",
        state_partitions=2,
        api_host="127.0.0.1",
        api_port=port,
        coordinator_url=f"http://127.0.0.1:{port}",
        status_interval_seconds=0.2,
        retry_base_seconds=0.5,
        kafka_probe_timeout_seconds=2.0,
        kube_server=str(kmock.url).rstrip("/"),
    )
    async with kube.RunningOperator(config) as running:
        yield running
