"""How a job fails: one line on stderr and an exit code, never a traceback.

``UsageError`` is a wrong invocation (exit 2, as ``argparse`` exits); ``JobError`` is anything
the world refused at run time (exit 1): an unreachable broker, a missing topic or snapshot, a
coordinator that rejects the token or the commit. Jobs raise these before starting Spark
whenever the check needs no Spark, so a wrong invocation fails in a second, not after the
JVM's start.
"""

from __future__ import annotations

USAGE_EXIT = 2
RUNTIME_EXIT = 1


class UsageError(ValueError):
    """The arguments are wrong: exit 2."""


class JobError(RuntimeError):
    """The job could not do its work: exit 1."""
