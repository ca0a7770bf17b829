"""The README's plain confluent-kafka consumer ("Using your existing Kafka clients"), run as
written through a gateway: it joins the operator's group, commits every record and stops on
SIGTERM. The test reads the code block, so README and product cannot drift apart."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid

import pytest

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from tests.cli.conftest import ROOT
from tests.protocol.test_kip848 import topic_id
from tests.support import topics

SECTION = "## Using your existing Kafka clients"


def readme_consumer() -> str:
    section = (ROOT / "README.md").read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python block in the README's section"
    return match.group(1)


def test_the_example_imports_nothing_of_ours() -> None:
    code = readme_consumer()
    imports = re.findall(r"^(?:from|import) (\w+)", code, re.MULTILINE)
    assert imports == ["os", "signal", "threading", "confluent_kafka"]
    assert 'consumer.subscribe(["invoices"])' in code


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="package")
async def test_the_readme_consumer_through_the_gateway(
    broker: embedded.EmbeddedBroker, runtime: coordinator_runtime.CoordinatorRuntime
) -> None:
    topic = topics.create_topic(broker.bootstrap, 2, messages_per_partition=4)
    await topic_id(runtime, topic)
    group, token = f"readme-{uuid.uuid4().hex[:6]}", "readme-token"
    listener = protocol_listener.Listener(
        runtime, tokens.GroupTokens({group: token}), protocol_listener.ListenerConfig(port=0)
    )
    await listener.start()
    gateway = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", listener.port),
            coordinator_security=kafka_connection.Security(
                sasl=kafka_connection.Sasl("PLAIN", group, token)
            ),
            port=0,
        )
    )
    await gateway.start()
    code = readme_consumer().replace('["invoices"]', f'["{topic}"]')
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        env={
            **os.environ,
            # What the operator injects into the application container.
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{gateway.port}",
            "KAFKA_GROUP_ID": group,
            "KAFKA_GROUP_INSTANCE_ID": "invoices-0",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        committed: dict[tuple[str, int], int] = {}
        for _ in range(600):
            fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
            committed = {tp: o.offset for tp, o in fetched.offsets.items()}
            if committed == {(topic, 0): 4, (topic, 1): 4} or process.returncode is not None:
                break
            await asyncio.sleep(0.1)
        assert committed == {(topic, 0): 4, (topic, 1): 4}
        process.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, stderr.decode()
        printed = sorted(stdout.decode().splitlines())
        assert printed == sorted(f"{p} {o} b'm{o}'" for p in range(2) for o in range(4))
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await gateway.stop()
        await listener.stop()
