"""The Go clients through the gateway, on Apache Kafka 4.4: franz-go and sarama (the versions
of ``tests/goclients/go.mod``, from the Go module proxy), each member a process of its own
(``tests/goclients/member.go``) running the scenario the Java consumer runs
(``tests.support.client_scenario``).

Configurations:

- franz-go (``kgo``), classic: ``CooperativeStickyBalancer`` in a group whose resource lets
  the leader assign (``spec.assignment: Client``), as static members (``kgo.InstanceID``),
  and in one the coordinator assigns (``Server``), dynamic; KIP-848
  (``kgo.ServerSideBalancer``): the sticky balancer, which asks for the ``uniform`` server
  assignor, static, and the range one, dynamic;
- sarama, classic: ``BalanceStrategySticky`` (eager) with ``Client``, static
  (``Consumer.Group.InstanceId``); ``BalanceStrategyRange`` with ``Server``, dynamic; and
  sarama's cooperative-sticky strategy with ``Client``, dynamic. sarama's ``Version`` is
  Kafka 4.0 (configured for Kafka 0.10 it would fetch with v2/v3, which Kafka 4 no longer
  serves).

sarama differs from the Java consumer where its API does: its handler's ``Setup`` and
``Cleanup`` are the eager rebalance listener (``lost`` is a session ended by
``UNKNOWN_MEMBER_ID``/``ILLEGAL_GENERATION``, read from the session's cause), its
asynchronous commits are its auto-commit of marked offsets, a pause applies from its next
fetch request, and it has no seek inside a session: ``ResetOffset`` and a commit, then a new
session (a rebalance), replay the partition. franz-go's restarted static leader balances
although KIP-814 tells it to skip, and rejoins when its plan differs from the one it is given:
one rebalance in which nothing moves, as on Kafka itself.

Each configuration's timings (first assignment, rebalances, moves) are appended to
``GO_MATRIX_REPORT`` when that variable names a file; ``GO_TEST_LOGS`` names a directory for
the members' stderr.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from kafka_group_operator.embedded import kafka as embedded_kafka
from kafka_group_operator.protocol import gateway as protocol_gateway
from tests.support import client_scenario, goclients

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="package")]

Config = client_scenario.Config

COOPERATIVE = "cooperative-sticky"
# Named after the client: franz-... runs mode franz-member, sarama-... sarama-member. The
# assignor is the client's balancer.
CONFIGS = [
    Config("franz-cooperative-sticky-client", "classic", COOPERATIVE, "Client", True),
    Config("franz-cooperative-sticky-server", "classic", COOPERATIVE, "Server", False),
    Config("franz-consumer-uniform", "consumer", "sticky", "Server", True),
    Config("franz-consumer-range", "consumer", "range", "Server", False),
    Config("sarama-sticky-client", "classic", "sticky", "Client", True),
    Config("sarama-range-server", "classic", "range", "Server", False),
    Config("sarama-cooperative-sticky-client", "classic", COOPERATIVE, "Client", False),
]
# A frozen member's commits fail once it is fenced (Kafka's error names); nothing else may.
ALLOWED_ERRORS = (
    "UNKNOWN_MEMBER_ID",
    "ILLEGAL_GENERATION",
    "REBALANCE_IN_PROGRESS",
    "FENCED_MEMBER_EPOCH",
    "STALE_MEMBER_EPOCH",
)


@pytest.fixture(scope="module")
def program() -> Path:
    """The Go programs, built once per machine and source (cached)."""
    return goclients.binary("current")


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def go_stack(
    kafka_broker: embedded_kafka.KafkaCluster,
) -> AsyncIterator[client_scenario.Stack]:
    async with client_scenario.stack(kafka_broker.bootstrap, "go") as running:
        yield running


def start(
    program: Path,
    gateway: protocol_gateway.Gateway,
    group: str,
    topic: str,
    config: Config,
    instance: str,
) -> client_scenario.Member:
    logs = os.environ.get("GO_TEST_LOGS")
    log_path = None
    if logs:
        log_path = os.path.join(logs, f"{config.name}-{instance}-{uuid.uuid4().hex[:6]}.log")
    return client_scenario.Member(
        [
            str(program),
            config.name.split("-")[0] + "-member",
            "-bootstrap",
            f"127.0.0.1:{gateway.port}",
            "-group",
            group,
            "-topic",
            topic,
            "-instance",
            instance if config.static else "",
            "-balancer",
            config.assignor,
            "-protocol",
            config.protocol,
            "-session",
            f"{client_scenario.SESSION_MS}ms",
        ],
        log_path,
    )


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
async def test_go_consumer_scenario(
    config: Config, program: Path, go_stack: client_scenario.Stack
) -> None:
    await client_scenario.run_case(
        config,
        go_stack,
        "go",
        lambda group, topic, instance: start(
            program, go_stack.gateway, group, topic, config, instance
        ),
        ALLOWED_ERRORS,
        os.environ.get("GO_MATRIX_REPORT"),
    )
