"""Read fences: where a job stops reading each state partition, and who said so.

A job reads the state topic up to a fixed end per partition, so that every action on its
frame sees the same records. Jobs never write the state topic (only the coordinator does),
so a job does not append load markers itself:

* with a coordinator (``--coordinator-url``), the job asks it for a fence:
  ``POST /v1/groups/{group}/read-fence`` (the group's bearer token; ``allPartitions`` for
  every partition). The coordinator appends a load marker to each partition through its own
  writer and returns the markers' offsets: everything it acknowledged before the call lies
  below them. The fence is ``"coordinator"``.
* without one (offline use of the CLI), the job reads up to the partitions' last stable
  offsets (``topics.stable_ends``): the end a ``read_committed`` reader reaches. The fence is
  ``"last-stable-offset"``. It is only as exact as the broker's answer: Kafka's is, but some
  Kafka-protocol brokers (tansu, the test broker) report an end short of the last records
  after batched produces. A short end never makes a checkpoint wrong (the loader reads the
  log from wherever the checkpoint ends), only a snapshot older; a coordinator's fence is
  exact on any broker.

The kind of fence goes into every manifest a job writes, so a reader knows which it was.

When several coordinators split the groups (the operator's replicas), ``--coordinator-url``
may lead to one that does not serve the group: ``locate`` asks it first which one does
(``GET /v1/groups/{group}/coordinator``, as Kafka's FindCoordinator) and the job talks to that
one at the address it names, even when it names itself: behind the chart's Service the next
connection may reach another replica.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kafka_group_jobs import errors, topics

COORDINATOR = "coordinator"
LAST_STABLE_OFFSET = "last-stable-offset"
TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class Coordinator:
    """A running coordinator's HTTP API and the group whose token authenticates the call."""

    url: str
    group: str
    token: str | None


@dataclass(frozen=True, slots=True)
class ReadFence:
    kind: str  # COORDINATOR or LAST_STABLE_OFFSET
    end_offsets: dict[int, int]  # partition -> exclusive end


def locate(coordinator: Coordinator) -> Coordinator:
    """The coordinator that serves ``coordinator.group``, as the given one names it.

    Lenient: any failure keeps the given URL, whose own answer to the job's real call then
    says what is wrong (a refused token, no coordinator there).
    """
    group = urllib.parse.quote(coordinator.group, safe="")
    call = urllib.request.Request(
        f"{coordinator.url.rstrip('/')}/v1/groups/{group}/coordinator",
        headers={"Accept": "application/json"},
    )
    if coordinator.token:
        call.add_header("Authorization", f"Bearer {coordinator.token}")
    try:
        with urllib.request.urlopen(call, timeout=TIMEOUT_S) as response:
            reply: Any = json.loads(response.read() or b"{}")
    except (OSError, ValueError):
        return coordinator
    # Its own address even when it serves the group itself ("self"): the given URL may be a
    # load-balanced Service, whose next connection reaches another replica.
    url = reply.get("url") if isinstance(reply, dict) else None
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return coordinator
    return Coordinator(url, coordinator.group, coordinator.token)


def obtain(
    bootstrap: str,
    topic: str,
    partitions: Collection[int],
    config: dict[str, str],
    coordinator: Coordinator | None = None,
    all_partitions: bool = False,
) -> ReadFence:
    """The fence over ``partitions`` of ``topic``: from the coordinator when one is given
    (``all_partitions``: every partition of the topic, else the coordinator's group's)."""
    if coordinator is None:
        ends = topics.stable_ends(bootstrap, topic, partitions, config)
        return ReadFence(LAST_STABLE_OFFSET, ends)
    ends = request(coordinator, all_partitions)
    missing = sorted(set(partitions) - set(ends))
    if missing:
        raise errors.JobError(
            f"the coordinator at {coordinator.url} fenced no end for state partitions {missing}"
            f" of {topic!r}: does it serve this state topic?"
        )
    return ReadFence(COORDINATOR, {partition: ends[partition] for partition in partitions})


def request(coordinator: Coordinator, all_partitions: bool) -> dict[int, int]:
    """``POST /v1/groups/{group}/read-fence``; every failure is one ``JobError`` line."""
    group = urllib.parse.quote(coordinator.group, safe="")
    call = urllib.request.Request(
        f"{coordinator.url.rstrip('/')}/v1/groups/{group}/read-fence",
        data=json.dumps({"allPartitions": all_partitions}).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="POST",
    )
    if coordinator.token:
        call.add_header("Authorization", f"Bearer {coordinator.token}")
    try:
        with urllib.request.urlopen(call, timeout=TIMEOUT_S) as response:
            reply: Any = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        raise errors.JobError(
            f"the coordinator at {coordinator.url} refused a read fence: {_refusal(error)}"
        ) from None
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise errors.JobError(
            f"cannot reach the coordinator at {coordinator.url} for a read fence: {reason}"
        ) from None
    try:
        return {int(p): int(offset) for p, offset in reply["endOffsets"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise errors.JobError(
            f"the coordinator at {coordinator.url} answered a read fence without endOffsets"
        ) from None


def _refusal(error: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(error.read() or b"{}")
    except ValueError:
        detail = None
    if not isinstance(detail, dict):
        return f"HTTP {error.code}"
    name = detail.get("error", f"HTTP {error.code}")
    message = detail.get("message")
    return f"{name}: {message}" if message else str(name)
