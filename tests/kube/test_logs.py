"""The operator's log as the operator on call reads it: kopf with our handlers against the API
server, the log captured as it is emitted."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest

from kafka_group_operator.handlers import lifecycle, logs
from tests.kube import test_consumer_groups as groups
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

NS = groups.NS


def _object_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == logs.OBJECT_LOGGER]


async def test_no_op_timers_are_silent_and_handler_lines_name_their_group(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    topic: str,
    broker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    await groups.create(kmock, groups.group_body(topic, broker.bootstrap))
    await operator.wait_for(lambda: kmock.get("apps/v1/statefulsets", NS, "orders"))
    # A pod of the group comes and goes: events the pod handler looks at and leaves alone.
    await kube.api_call(kmock, "POST", groups.PODS_PATH, groups.pod("orders-0"))
    await kube.api_call(kmock, "DELETE", f"{groups.PODS_PATH}/orders-0")
    # Every timer of the group ticks at least once meanwhile (the reset timer every 3 s).
    await asyncio.sleep(7.0)
    lines = _object_lines(caplog)
    assert any("reconcile" in record.getMessage() for record in lines)
    no_op = [
        r.getMessage()
        for r in lines
        if r.getMessage().startswith("Timer ") or "'pod_event'" in r.getMessage()
    ]
    assert no_op == []
    # kopf's formatter, as `kgo operator` installs it, prefixes each with [namespace/name].
    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        logs.configure("INFO")
        (installed,) = [h for h in root.handlers if h not in before[0]]
        assert installed.formatter is not None
        for record in lines:
            text = installed.formatter.format(record)
            assert re.search(rf"\[{NS}/orders\] ", text), text
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])


async def test_the_coordinator_still_starting_is_info_not_error(
    kmock: kube.ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # No Kafka answers: the coordinator keeps starting, handlers keep being retried.
    config = kube.operator_config_for(kmock, "127.0.0.1:1", retry_base_seconds=0.5)
    async with kube.RunningOperator(config, wait_for_coordinator=False) as operator:
        await groups.create(kmock, groups.group_body("orders", "127.0.0.1:1"))
        await operator.wait_for(
            lambda: [r for r in _object_lines(caplog) if lifecycle.STARTING in r.getMessage()],
            within=30,
        )
    starting = [r for r in _object_lines(caplog) if lifecycle.STARTING in r.getMessage()]
    assert {record.levelname for record in starting} == {"INFO"}
