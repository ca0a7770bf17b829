"""Fixtures: a real runtime on the embedded broker, served by coordinator listeners."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.conftest import BROKERS
from tests.protocol import served
from tests.support import groups, topics

TOKENS = {"group-a": "token-a", "group-b": "token-b"}


@pytest.fixture(scope="package", params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[embedded.Broker]:
    """One broker for the package on each kind (Apache Kafka, tansu): its tests share one
    runtime and listeners on it."""
    if request.param == "kafka":
        yield request.getfixturevalue("kafka_broker")
        return
    with embedded.running_broker() as running:
        yield running


@pytest.fixture(scope="package")
def topic(broker: embedded.EmbeddedBroker) -> str:
    """A topic of 3 partitions with 5 messages each."""
    return topics.create_topic(broker.bootstrap, 3, messages_per_partition=5)


@pytest_asyncio.fixture(loop_scope="package", scope="package")
async def runtime(
    broker: embedded.EmbeddedBroker, topic: str
) -> AsyncIterator[coordinator_runtime.CoordinatorRuntime]:
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=broker.bootstrap,
        topic=f"protocol-state-{uuid.uuid4().hex[:8]}",
        partitions=2,
        metadata_interval_ms=500,
        # As Kafka's own test clusters: a new classic group rebalances without waiting 3 s.
        coordinator=coordinator_config.CoordinatorConfig(initial_rebalance_delay_ms=0),
    )
    async with groups.running(config) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="package", scope="package")
async def open_listener(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> AsyncIterator[protocol_listener.Listener]:
    """A listener without tokens: every group is open."""
    served = protocol_listener.Listener(runtime, None, protocol_listener.ListenerConfig(port=0))
    await served.start()
    yield served
    await served.stop()


@pytest_asyncio.fixture(loop_scope="package", scope="package")
async def secured_listener(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> AsyncIterator[protocol_listener.Listener]:
    """A listener requiring SASL/PLAIN with the groups' tokens (``TOKENS``)."""
    served = protocol_listener.Listener(
        runtime, tokens.GroupTokens(TOKENS), protocol_listener.ListenerConfig(port=0)
    )
    await served.start()
    yield served
    await served.stop()


@pytest_asyncio.fixture(loop_scope="package", scope="package")
async def hostile_stack(
    broker: embedded.EmbeddedBroker, topic: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[served.Stack]:
    """A ``kgo coordinator`` and two ``kgo gateway`` processes with canaries committing
    (``served.running_stack``): the target of the hostile-frame tests and the fuzzer."""
    directory = tmp_path_factory.mktemp("hostile")
    async with served.running_stack(broker.bootstrap, topic, directory) as stack:
        yield stack
