"""A last resort for a test that hangs where pytest-timeout cannot reach it.

pytest-timeout interrupts a test with a signal, whose Python handler runs only when the main
thread returns to Python: a test stuck inside a C call (a Kafka client's, a JVM bridge's) is
never interrupted, and its worker, and so the run, would wait for good. Past its timeout and a
grace period, faulthandler's own thread writes every thread's stack and ends the process:
under xdist (``tests/``) the test is reported as crashed and the run stops (``make test``
replaces no crashed worker: with ``--dist loadfile`` a new worker is handed the crashed
test's file and runs the stuck test again, crash after crash); the end-to-end run (one
process) stops there. Either way at the test's deadline, not at CI's.

The stacks go to a file of the process's own in ``STACKS_DIR_ENV``'s directory (else
``.pytest_cache/hang-stacks`` under the root), headed by the test's node id, not to stderr:
pytest captures a test's stderr, and what a process ended this way had captured is never
shown. A process that ends normally removes its file, so what is left names the test each
ended process was running (the stacks too, when the guard ended it); ``make test`` prints it
after a failed run.
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest

# What the signal-based timeout gets before the hard one: a teardown after the interruption.
GRACE_S = 120.0
# Where the files of the stacks go (see the module docstring).
STACKS_DIR_ENV = "KGO_HANG_STACKS_DIR"

_stacks: TextIO | None = None


def _stacks_file(config: pytest.Config) -> TextIO:
    global _stacks
    if _stacks is None:
        configured = os.environ.get(STACKS_DIR_ENV)
        directory = (
            Path(configured) if configured else config.rootpath / ".pytest_cache" / "hang-stacks"
        )
        directory.mkdir(parents=True, exist_ok=True)
        _stacks = (directory / f"{os.getpid()}.txt").open("w", encoding="utf-8")
    return _stacks


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
        limit_s = 3 * timeout + GRACE_S
        stacks = _stacks_file(item.config)
        stacks.seek(0)
        stacks.truncate()
        stacks.write(f"hang guard: {item.nodeid} (ended past {limit_s:.0f} s, if stacks follow)\n")
        stacks.flush()
        faulthandler.dump_traceback_later(limit_s, exit=True, file=stacks)
    try:
        yield
    finally:
        if timeout is not None:
            faulthandler.cancel_dump_traceback_later()


def pytest_unconfigure(config: pytest.Config) -> None:
    """A process that ends normally leaves no file."""
    global _stacks
    if _stacks is not None:
        faulthandler.cancel_dump_traceback_later()
        _stacks.close()
        Path(_stacks.name).unlink(missing_ok=True)
        _stacks = None
