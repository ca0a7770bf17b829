"""Operator start and stop: the coordinator waits for Kafka without taking kopf down."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid

import aiohttp
import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import lifecycle
from kafka_group_operator.wire import framing
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
        kafka_port=embedded.free_port(),
        metrics_port=embedded.free_port(),
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


async def test_kgo_operator_command_runs_and_stops_cleanly(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker, topic: str
) -> None:
    """The real entry point (as the chart's Deployment runs it), stopped with SIGTERM."""
    api_port, health_port = embedded.free_port(), embedded.free_port()
    kafka_port, metrics_port = embedded.free_port(), embedded.free_port()
    environment = {
        **os.environ,
        "KGO_BOOTSTRAP_SERVERS": broker.bootstrap,
        "KGO_STATE_TOPIC": f"kgo-state-{uuid.uuid4().hex[:8]}",
        "KGO_STATE_PARTITIONS": "1",
        "KGO_API_HOST": "127.0.0.1",
        "KGO_API_PORT": str(api_port),
        "KGO_COORDINATOR_URL": f"http://127.0.0.1:{api_port}",
        "KGO_KAFKA_PORT": str(kafka_port),
        "KGO_METRICS_PORT": str(metrics_port),
        "KGO_KUBE_SERVER": str(kmock.url).rstrip("/"),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kafka_group_operator", "operator",
        f"--liveness=http://127.0.0.1:{health_port}/healthz",
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        health: dict[str, object] = {}
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"http://127.0.0.1:{health_port}/healthz") as response:
                        health = await response.json()
                        if health.get("coordinator") is True:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            assert health.get("coordinator") is True, health
            async with session.get(f"http://127.0.0.1:{api_port}/healthz") as response:
                assert response.status == 200
            # Prometheus metrics on their own port.
            async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                assert response.status == 200
                assert 'kgo_state_partitions{state="active"} 1.0' in await response.text()
            # The coordinator listener answers Kafka's ApiVersions beside the member API.
            reader, writer = await asyncio.open_connection("127.0.0.1", kafka_port)
            writer.write(framing.encode_request(ApiVersionsRequest(), 1))
            payload = await asyncio.wait_for(framing.read_frame(reader), 10)
            writer.close()
            assert payload is not None
            _, versions = framing.read_response(payload, ApiVersionsResponse)
            assert versions.error_code == 0
            body = {
                "apiVersion": "kafkagroups.io/v1alpha1",
                "kind": "ConsumerGroup",
                "metadata": {"name": "orders", "namespace": "shop"},
                "spec": {
                    "topics": [topic],
                    "kafka": {"bootstrapServers": broker.bootstrap},
                    "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
                },
            }
            groups = "/apis/kafkagroups.io/v1alpha1/namespaces/shop/consumergroups"
            async with session.post(f"{str(kmock.url).rstrip('/')}{groups}", json=body) as response:
                assert response.status == 200
        for _ in range(300):
            if kmock.get("apps/v1/statefulsets", "shop", "orders") is not None:
                break
            await asyncio.sleep(0.1)
        assert kmock.get("apps/v1/statefulsets", "shop", "orders") is not None
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output.decode()[-3000:]
    assert b"coordinator stopped" in output
