"""Pure planning for snapshots, scheduled snapshots and online offset resets.

Everything the OffsetSnapshot and reset handlers decide without I/O lives here: where a
snapshot is written, the job arguments, what a job's result means for status, when a
schedule is due, which old snapshots to prune, and whether an ``offsetReset`` was applied.
The handlers (``handlers.snapshots``) do the calls.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from croniter import croniter

MAX_ATTEMPTS = 3
SCHEDULED_BY_LABEL = "kafkagroups.io/scheduled-by"
# The CRD spells reset targets in camelCase; the restore job takes kafka-consumer-groups words.
RESET_KINDS = {
    "earliest": "earliest",
    "latest": "latest",
    "offset": "offset",
    "datetime": "datetime",
    "duration": "duration",
    "shiftBy": "shift-by",
    "snapshot": "snapshot",
}


def snapshot_location(storage_uri: str, namespace: str, name: str) -> str:
    """Each snapshot in its own directory: ``<uri>/<namespace>/<name>``."""
    return f"{storage_uri.rstrip('/')}/{namespace}/{name}"


def common_arguments(bootstrap: str, state_topic: str) -> list[str]:
    return ["--bootstrap", bootstrap, "--topic", state_topic]


def coordinator_arguments(coordinator_url: str | None) -> list[str]:
    """The coordinator a job asks for its read fence (the group's token is in its
    environment, never an argument)."""
    return ["--coordinator-url", coordinator_url] if coordinator_url else []


def snapshot_arguments(
    bootstrap: str,
    state_topic: str,
    group_id: str,
    location: str,
    as_of: str | None,
    coordinator_url: str | None = None,
) -> list[str]:
    arguments = [*common_arguments(bootstrap, state_topic), "--group", group_id]
    arguments += coordinator_arguments(coordinator_url)
    # The group is a ConsumerGroup's, not a typed id that may be misspelled: a group that has
    # committed nothing yet gets an empty snapshot, not a failure.
    arguments += ["--output", location, "--allow-empty"]
    # The location is this resource's own: a run retried after a failure replaces what an
    # earlier attempt left there.
    arguments.append("--overwrite")
    if as_of:
        arguments += ["--as-of", as_of]
    return arguments


def restore_arguments(
    bootstrap: str,
    state_topic: str,
    group_id: str,
    offset_reset: Mapping[str, Any],
    group_topics: Sequence[str],
    snapshot_location: str | None = None,
    coordinator_url: str | None = None,
) -> list[str]:
    """Arguments of a restore job that only plans (``--dry-run``).

    The operator applies the plan itself, through its own coordinator, while the group is
    paused; the job never writes. With ``coordinator_url`` it reads the group's current
    offsets up to the coordinator's read fence: every commit acknowledged before the pause.
    """
    kind = RESET_KINDS[str(offset_reset["to"])]
    arguments = [*common_arguments(bootstrap, state_topic), "--group", group_id, "--to", kind]
    arguments += coordinator_arguments(coordinator_url)
    if kind == "offset":
        arguments += ["--value", str(offset_reset["offset"])]
    elif kind == "shift-by":
        arguments += ["--value", str(offset_reset["shiftBy"])]
    elif kind == "datetime":
        arguments += ["--datetime", str(offset_reset["datetime"])]
    elif kind == "duration":
        arguments += ["--duration", str(offset_reset["duration"])]
    elif kind == "snapshot":
        if snapshot_location is None:
            raise ValueError("a snapshot reset needs the snapshot's location")
        arguments += ["--snapshot", snapshot_location]
    scope = offset_reset.get("topics") or []
    names = [str(item["name"]) for item in scope] or list(group_topics)
    if names:
        arguments += ["--topics", ",".join(names)]
    for item in scope:
        if item.get("partitions"):
            numbers = ",".join(str(p) for p in item["partitions"])
            arguments += ["--partitions", f"{item['name']}:{numbers}"]
    return [*arguments, "--dry-run"]


def reset_fingerprint(offset_reset: Mapping[str, Any]) -> str:
    """Identifies one value of ``spec.offsetReset``: a reset is applied once per value."""
    canonical = json.dumps(offset_reset, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def reset_pending(
    offset_reset: Mapping[str, Any] | None, last_reset: Mapping[str, Any] | None
) -> bool:
    """Whether ``offset_reset`` still has to run (it is set and differs from the last one done)."""
    if not offset_reset:
        return False
    last = last_reset or {}
    return not (
        last.get("fingerprint") == reset_fingerprint(offset_reset)
        and last.get("phase") in ("Done", "Failed")
    )


def commits_of(audit: Mapping[str, Any]) -> dict[tuple[str, int], int]:
    """The offsets a restore plan asks to write: ``(topic, partition) -> offset``."""
    return {
        (str(row["topic"]), int(row["partition"])): int(row["newOffset"])
        for row in audit.get("partitions", [])
        if row.get("newOffset") is not None
    }


def snapshot_status(result: Mapping[str, Any]) -> dict[str, Any]:
    """The OffsetSnapshot status fields of a finished snapshot job's manifest."""
    return {
        "phase": "Succeeded",
        "location": result.get("location"),
        "records": result.get("records"),
        # Unknown (None) when the manifest could not be read, as for a cluster run on S3.
        "partitions": (
            None
            if result.get("partitions") is None
            else sum(len(parts) for parts in result["partitions"].values())
        ),
        "takenAt": result.get("takenAt"),
        "checksum": result.get("checksum"),
        "message": "",
    }


def next_attempt(attempts: int, reason: str) -> tuple[bool, str]:
    """After a failed attempt number ``attempts`` (1-based): retry?, and the message to show."""
    if attempts < MAX_ATTEMPTS:
        return True, f"attempt {attempts} of {MAX_ATTEMPTS} failed, retrying: {reason}"
    return False, f"failed after {attempts} attempts: {reason}"


def compaction_arguments(
    bootstrap: str,
    state_topic: str,
    storage_uri: str,
    at: datetime.datetime,
    fenced_ends: Mapping[int, int] | None = None,
) -> list[str]:
    """Arguments of a scheduled compaction: each run checkpoints into its own directory.

    ``fenced_ends`` is the read fence the operator took over every state partition, each from
    the replica whose Lease holds it (through the internal API: no group token is needed for
    it); without one the job reads up to the last stable offsets.
    """
    stamp = at.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    location = f"{storage_uri.rstrip('/')}/checkpoint-{stamp}"
    arguments = [*common_arguments(bootstrap, state_topic), "--output", location, "--overwrite"]
    if fenced_ends is not None:
        ends = {str(partition): end for partition, end in sorted(fenced_ends.items())}
        arguments += ["--fenced-ends", json.dumps(ends, separators=(",", ":"))]
    return arguments


def next_run(schedule: str, after: datetime.datetime) -> datetime.datetime:
    """The first scheduled time strictly after ``after``."""
    found: datetime.datetime = croniter(schedule, after).get_next(datetime.datetime)
    return found


# ---------------------------------------------------------------------------------------
# Scheduled snapshots (ConsumerGroup.spec.snapshots), modelled on ScheduledSparkApplication


def due_run(
    schedule: str,
    last_run: datetime.datetime | None,
    created: datetime.datetime,
    now: datetime.datetime,
) -> datetime.datetime | None:
    """The latest scheduled time in ``(last_run or created, now]``, or None when none is due.

    Missed runs collapse into one, as a CronJob with ``concurrencyPolicy: Forbid`` would.
    """
    start = last_run or created
    iterator = croniter(schedule, start)
    due = None
    while True:
        candidate: datetime.datetime = iterator.get_next(datetime.datetime)
        if candidate > now:
            return due
        due = candidate


def scheduled_snapshot_name(group_name: str, at: datetime.datetime) -> str:
    stamp = at.astimezone(datetime.UTC).strftime("%Y%m%d%H%M")
    return f"{group_name[: 63 - len(stamp) - 1]}-{stamp}"


def build_scheduled_snapshot(
    group: Mapping[str, Any], snapshots: Mapping[str, Any], at: datetime.datetime
) -> dict[str, Any]:
    """The OffsetSnapshot a schedule creates at ``at``, owned by its ConsumerGroup."""
    meta = group["metadata"]
    spec: dict[str, Any] = {
        "consumerGroupRef": {"name": meta["name"]},
        "storage": dict(snapshots["storage"]),
    }
    if snapshots.get("spark"):
        spec["spark"] = dict(snapshots["spark"])
    return {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "OffsetSnapshot",
        "metadata": {
            "name": scheduled_snapshot_name(meta["name"], at),
            "namespace": meta["namespace"],
            "labels": {SCHEDULED_BY_LABEL: meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": group["apiVersion"],
                    "kind": group["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def snapshots_to_prune(existing: Sequence[Mapping[str, Any]], history_limit: int) -> list[str]:
    """Names of the oldest scheduled snapshots beyond ``history_limit`` (newest are kept)."""
    ordered = sorted(
        existing,
        key=lambda item: (
            item["metadata"].get("creationTimestamp", ""),
            item["metadata"]["name"],
        ),
    )
    surplus = max(len(ordered) - history_limit, 0)
    return [item["metadata"]["name"] for item in ordered[:surplus]]
