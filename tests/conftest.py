"""Shared fixtures: the embedded Kafka-protocol broker (tansu) on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_group_operator.embedded import broker as embedded


@pytest.fixture(scope="session")
def broker() -> Iterator[embedded.EmbeddedBroker]:
    """One in-memory broker for the whole run; tests use their own topic names."""
    with embedded.running_broker() as running:
        yield running


@pytest.fixture
def fresh_broker() -> Iterator[embedded.EmbeddedBroker]:
    """A broker of this test's own, persisted to a loopback S3 so it survives restarts."""
    with embedded.running_broker(persistent=True) as running:
        yield running


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the broker's log to a failing test that used one."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        for name in ("broker", "fresh_broker"):
            running = funcargs.get(name)
            if isinstance(running, embedded.EmbeddedBroker):
                report.sections.append((f"{name} log", running.log_tail()))
