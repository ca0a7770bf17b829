"""Operator start and stop: the coordinator waits for Kafka without taking kopf down."""

from __future__ import annotations

import asyncio

import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import lifecycle
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]


async def test_the_coordinator_starts_once_kafka_is_up(kmock: kube.ApiServer) -> None:
    late = embedded.EmbeddedBroker()  # not started yet
    port = embedded.free_port()
    config = operator_config.OperatorConfig(
        bootstrap_servers=late.bootstrap,
        state_topic="kgo-state-late",
        state_partitions=1,
        api_host="127.0.0.1",
        api_port=port,
        coordinator_url=f"http://127.0.0.1:{port}",
        kube_server=str(kmock.url).rstrip("/"),
    )
    async with kube.RunningOperator(config, wait_for_coordinator=False) as operator:
        await asyncio.sleep(2)
        # kopf runs (its liveness endpoint would answer); the coordinator keeps retrying.
        assert operator.error is None
        assert lifecycle.started(operator.memo) is None
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)  # not ready for members yet
        await asyncio.to_thread(late.start)
        try:
            await operator.wait_for(
                lambda: lifecycle.started(operator.memo) is not None,
                within=60,
            )
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
        finally:
            late.stop()
