"""Shared fixtures: the brokers every broker-facing test runs on.

``broker`` and ``fresh_broker`` are parametrized: each test that uses one runs on Apache Kafka
4.4 (the reference: one KRaft node per test worker, shared by the worker's modules) and on
tansu (the embedded, zero-Java broker of ``kgo demo`` and ``kgo dev``). Where tansu deviates
from Kafka, the test says so with ``@pytest.mark.tansu_deviation("why")``: its tansu case is
expected to fail (strictly: it fails the run once tansu is fixed); where a deviation pinned so
makes a test's tansu case fail only at times, ``@pytest.mark.tansu_cannot("why")`` skips that
case, saying why. ``kafka_broker`` and
``kafka_cluster`` (three nodes, replication factor 3, ``min.insync.replicas=2``) are for what
only Apache Kafka does: compaction, replication, its own tools.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.embedded import kafka
from tests.support.hang_guard import (  # noqa: F401  (hooks)
    pytest_runtest_protocol,
    pytest_unconfigure,
)

BROKERS = ("kafka", "tansu")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "tansu_deviation(reason): tansu deviates from Apache Kafka here; "
        "the test's tansu case is an expected failure",
    )
    config.addinivalue_line(
        "markers",
        "tansu_cannot(reason): a tansu deviation pinned by a tansu_deviation test makes this "
        "test's tansu case fail at times; that case is skipped, saying why",
    )
    config.addinivalue_line(
        "markers",
        "kafka_cannot(reason): the client under test cannot run against Apache Kafka 4 at "
        "all, with or without the operator; the test's Kafka case is skipped, saying why",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, mixed = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = {} if callspec is None else callspec.params
        # A module's own broker fixture is parametrized the same way (``*_broker``).
        on = {
            value for name, value in params.items() if name.endswith("broker") and value in BROKERS
        }
        if len(on) > 1:
            mixed.append(item)  # a test with both brokers runs on one kind at a time
            continue
        kept.append(item)
        cannot = item.get_closest_marker("kafka_cannot")
        if cannot is not None and "kafka" in on:
            reason = cannot.args[0] if cannot.args else cannot.kwargs["reason"]
            item.add_marker(pytest.mark.skip(reason=f"Apache Kafka 4: {reason}"))
        cannot_on_tansu = item.get_closest_marker("tansu_cannot")
        if cannot_on_tansu is not None and "tansu" in on:
            reason = (
                cannot_on_tansu.args[0]
                if cannot_on_tansu.args
                else cannot_on_tansu.kwargs["reason"]
            )
            item.add_marker(pytest.mark.skip(reason=f"tansu: {reason}"))
        deviation = item.get_closest_marker("tansu_deviation")
        if deviation is not None and "tansu" in on:
            reason = deviation.args[0] if deviation.args else deviation.kwargs["reason"]
            item.add_marker(pytest.mark.xfail(reason=f"tansu: {reason}", strict=True))
    if mixed:
        config.hook.pytest_deselected(items=mixed)
        items[:] = kept


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[kafka.KafkaCluster]:
    """One Apache Kafka node for this test worker; tests use their own topic and group names."""
    with kafka.running_kafka() as running:
        yield running


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[kafka.KafkaCluster]:
    """Three Apache Kafka nodes (each broker and controller): replication factor 3,
    ``min.insync.replicas=2``. Tests that stop nodes start them again before they end."""
    with kafka.running_kafka(3) as running:
        yield running


@pytest.fixture(scope="module", params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[embedded.Broker]:
    """The module's broker: this worker's Apache Kafka node, or a tansu of the module's own.
    Not one tansu for the whole run: it keeps every transactional and idempotent producer it
    ever saw in one document that it rewrites at each transactional step, so over a thousand
    tests its transactions slow from milliseconds to hundreds of them (and the coordinator's
    every write is a transaction). It starts in a tenth of a second."""
    if request.param == "kafka":
        yield request.getfixturevalue("kafka_broker")
        return
    with embedded.running_broker() as running:
        yield running


@pytest.fixture(params=BROKERS)
def fresh_broker(request: pytest.FixtureRequest) -> Iterator[embedded.Broker]:
    """A broker of this test's own that keeps its data across a restart: Apache Kafka on a
    temporary log folder, or tansu persisted to a loopback S3."""
    if request.param == "kafka":
        with kafka.running_kafka() as running:
            yield running
        return
    with embedded.running_broker(persistent=True) as running:
        yield running


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the broker's log to a failing test that used one."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        attached: set[int] = set()
        for name, running in funcargs.items():
            # ``broker`` may be ``kafka_broker``: each broker's log once.
            if (
                isinstance(running, embedded.EmbeddedBroker | kafka.KafkaCluster)
                and id(running) not in attached
            ):
                attached.add(id(running))
                report.sections.append((f"{name} log", running.log_tail()))
