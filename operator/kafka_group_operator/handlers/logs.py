"""The operator's log, for the operator on call: a line says something happened.

* Each handler line carries its resource as ``[namespace/name]`` (kopf's per-object logger,
  formatted by kopf's prefixing formatter, which ``configure`` installs).
* kopf logs "Timer '...' succeeded." at every tick of every timer of every resource, and
  "Handler '...' succeeded." at every event of every watched pod; a timer or an event handler
  that did something says so itself, so those lines are dropped.
* A handler that runs while the embedded coordinator starts is retried (``kopf.TemporaryError``
  with ``lifecycle.STARTING``); that is expected, so kopf's ERROR line about it becomes INFO.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import kopf

from kafka_group_operator.handlers import lifecycle

# kopf's logger of per-object lines (kopf._core.actions.loggers).
OBJECT_LOGGER = "kopf.objects"
_SUCCEEDED = re.compile(r"^(?P<kind>Timer|Handler) '(?P<id>[^']*)' succeeded\.$")


class QuietExpected(logging.Filter):
    """Drops no-op timer and event-handler lines; the coordinator-is-starting retries at INFO.

    ``event_handlers`` are the ids of the handlers of watched events (kopf.on.event).
    """

    def __init__(self, event_handlers: frozenset[str]) -> None:
        super().__init__()
        self.event_handlers = event_handlers

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        succeeded = _SUCCEEDED.match(message) if record.levelno == logging.INFO else None
        if succeeded and (succeeded["kind"] == "Timer" or succeeded["id"] in self.event_handlers):
            return False
        if record.levelno >= logging.ERROR and message.endswith(
            f"failed temporarily: {lifecycle.STARTING}"
        ):
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def install_filter() -> None:
    """Put ``QuietExpected`` on kopf's per-object logger, once per process.

    It may first run before every handler module is imported (``configure`` runs before the
    operator loads its handlers), so a later call refreshes the ids of the event handlers.
    """
    target = logging.getLogger(OBJECT_LOGGER)
    watching = kopf.get_default_registry()._watching.get_all_handlers()
    event_handlers = frozenset(str(handler.id) for handler in watching)
    for found in target.filters:
        if isinstance(found, QuietExpected):
            found.event_handlers = event_handlers
            return
    target.addFilter(QuietExpected(event_handlers))


def configure(level: str) -> None:
    """The process's logging as ``kgo operator`` runs it: kopf's format with the prefix."""
    name = level.upper()
    kopf.configure(
        debug=name == "DEBUG",
        quiet=name in ("WARNING", "ERROR", "CRITICAL"),
        log_format=kopf.LogFormat.FULL,
        log_prefix=True,
    )
    logging.getLogger().setLevel(name)
    install_filter()


@kopf.on.startup()
async def quiet_expected_lines(**_: Any) -> None:
    # Also where the operator runs without ``configure`` (embedded, in tests).
    install_filter()
