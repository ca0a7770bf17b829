"""A last resort for a test that hangs where pytest-timeout cannot reach it.

pytest-timeout interrupts a test with a signal, whose Python handler runs only when the main
thread returns to Python: a test stuck inside a C call (a Kafka client's, a JVM bridge's) is
never interrupted, and its worker, and so the run, would wait for good. Past its timeout and a
grace period, faulthandler's own thread writes every thread's stack to stderr and ends the
process: under xdist (``tests/``) the test is reported as crashed and a new worker goes on;
the end-to-end run (one process) stops there, with the stacks, instead of at CI's deadline.
"""

from __future__ import annotations

import faulthandler
import sys
from collections.abc import Iterator

import pytest

# What the signal-based timeout gets before the hard one: a teardown after the interruption.
GRACE_S = 120.0


def _timeout_of(item: pytest.Item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value: object = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = item.config.getini("timeout")
    try:
        seconds = float(str(value))
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    timeout = _timeout_of(item)
    if timeout is not None:
        # Setup, call and teardown each get the timeout; together they stay under three.
        faulthandler.dump_traceback_later(
            3 * timeout + GRACE_S, exit=True, file=sys.__stderr__ or sys.stderr
        )
    try:
        yield
    finally:
        if timeout is not None:
            faulthandler.cancel_dump_traceback_later()
