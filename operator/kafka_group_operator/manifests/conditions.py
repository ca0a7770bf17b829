"""Status conditions in the Kubernetes convention, for every kind we own.

A condition is ``{type, status, reason, message, observedGeneration, lastTransitionTime}``;
``lastTransitionTime`` moves only when ``status`` changes, so that ``kubectl describe`` and
GitOps tools see real transitions rather than every refresh. Pure.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

READY = "Ready"
REBALANCING = "Rebalancing"
DEGRADED = "Degraded"
RESET_IN_PROGRESS = "ResetInProgress"
# Whether ``spec.snapshots`` can be followed (False with reason InvalidSchedule otherwise).
SNAPSHOTS_SCHEDULED = "SnapshotsScheduled"
# Whether the lag verdict (Burrow's rules, see coordinator.lag_health) is OK; the reason is
# the verdict itself.
LAG_HEALTHY = "LagHealthy"


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool | None  # None is "Unknown"
    reason: str
    message: str


def now_rfc3339(now: datetime.datetime | None = None) -> str:
    moment = now or datetime.datetime.now(tz=datetime.UTC)
    return moment.astimezone(datetime.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status_text(status: bool | None) -> str:
    return "Unknown" if status is None else ("True" if status else "False")


def merge_conditions(
    previous: Sequence[Mapping[str, Any]] | None,
    updates: Sequence[Condition],
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """The condition list after applying ``updates`` to ``previous``.

    Conditions not mentioned in ``updates`` are kept as they are (other handlers own them,
    e.g. ResetInProgress); the order is stable: existing types first, new ones appended.
    """
    by_type: dict[str, dict[str, Any]] = {
        str(item["type"]): dict(item) for item in previous or () if "type" in item
    }
    order = list(by_type)
    for update in updates:
        status = _status_text(update.status)
        old = by_type.get(update.type)
        changed = old is None or old.get("status") != status
        condition: dict[str, Any] = {
            "type": update.type,
            "status": status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": now
            if changed or old is None
            else old.get("lastTransitionTime", now),
        }
        if generation is not None:
            condition["observedGeneration"] = generation
        if update.type not in by_type:
            order.append(update.type)
        by_type[update.type] = condition
    return [by_type[key] for key in order]


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for condition in conditions or ():
        if condition.get("type") == type_:
            return condition
    return None
