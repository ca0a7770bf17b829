"""Shared fixtures: the embedded Kafka-protocol broker (tansu) on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_group_operator.embedded import broker as embedded


@pytest.fixture(scope="module")
def broker() -> Iterator[embedded.EmbeddedBroker]:
    """One in-memory broker per test module; tests use their own topic names. Not one for the
    whole run: this broker keeps every transactional and idempotent producer it ever saw in
    one document that it rewrites at each transactional step, so over a thousand tests its
    transactions slow from milliseconds to hundreds of them (and the coordinator's every
    write is a transaction). It starts in a tenth of a second."""
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
