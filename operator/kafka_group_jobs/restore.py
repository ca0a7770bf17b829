"""Restore job: reset a group's offsets to a snapshot or a computed target; plan, then write.

``python -m kafka_group_jobs.restore --bootstrap B --group G --to KIND [...] [--execute]``

Targets (``--to``), as ``kafka-consumer-groups.sh --reset-offsets`` has them: ``earliest``,
``latest``, ``offset --value N``, ``datetime --datetime ISO``, ``duration --duration PT1H``,
``shift-by --value ±N``, ``snapshot --snapshot URI``. ``--topics`` and ``--partitions t:0,1``
narrow the scope (default: every topic the group or the snapshot has offsets for).

Steps: read the group's current commits from the state topic; look the live topics' bounds up
(and offsets by time for datetime and duration); plan with ``transforms.plan_reset``, which
clamps out-of-range offsets into [earliest, latest] and marks each clamp; print the plan. As a
reset, a restore only plans unless ``--execute`` (``--dry-run`` says so explicitly); executed,
the coordinator applies the plan: the job hands it over through the coordinator's
HTTP API as one administrative commit (``memberId`` "" and epoch -1), which the coordinator
accepts only while the group is empty or its assignment is paused for a reset, so no live
member races the restore. Jobs never write the state topic: a restore that writes needs
``--coordinator-url`` and fails, before Spark starts, without one. With a coordinator the
group's partition is read up to the coordinator's read fence, else up to its last stable
offset (``fence``); the audit says which.

The result is the audit: per partition the old and the new offset, the requested one and any
clamp, plus snapshot partitions that no longer exist. It is printed as a table (with
``--json``, as the ``KGO-RESULT`` line) and written to ``--audit URI`` when given. Every clamp
and every committed offset past the log end the broker reports gets a warning.

Before Spark starts, the job checks its arguments, the snapshot's manifest (on a file system),
the broker and the state topic, and with ``--coordinator-url`` the token and, when it writes,
that the group is empty or paused: the coordinator would refuse the commit anyway.

Spark's own modules (``session``, ``transforms``, ``progress``) are imported by the functions
that run Spark, not at the top: importing pyspark alone takes a second or more, and a wrong
invocation must fail before that.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kafka_group_jobs import arguments, columns, errors, fence, snapshot, storage, topics
from kafka_group_records import partitioning

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")
COORDINATOR_TIMEOUT_S = 10
NO_COORDINATOR = (
    "a restore is applied by the coordinator, and none was named: start one (in a cluster the"
    " operator is one; locally `kgo coordinator --bootstrap B --topic T --tokens FILE`) and pass"
    " --coordinator-url URL with the group's --token, or leave out --execute to only plan"
)


class RestoreError(errors.JobError):
    """The plan could not be made or written."""


def parse_duration_ms(text: str) -> int:
    """Milliseconds of an ISO-8601 duration with days, hours, minutes and seconds."""
    match = _DURATION.match(text)
    if match is None or text in ("P", "PT"):
        raise errors.UsageError(f"not an ISO-8601 duration (PnDTnHnMnS): {text!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000


def parse_partitions(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """``["t:0,1", "u:3"]`` -> ``{"t": (0, 1), "u": (3,)}``."""
    chosen: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        topic, _, numbers = spec.rpartition(":")
        parts = numbers.split(",")
        if not topic or not all(part.strip().isdigit() for part in parts):
            raise errors.UsageError(f"--partitions: expected TOPIC:P[,P...], got {spec!r}")
        chosen[topic] = chosen.get(topic, ()) + tuple(int(n) for n in parts)
    return chosen


def plan(
    spark: SparkSession,
    bootstrap: str,
    state_topic: str,
    group_id: str,
    kind: str,
    value: int | None = None,
    at_ms: int | None = None,
    snapshot_location: str | None = None,
    scope_topics: tuple[str, ...] = (),
    scope_partitions: dict[str, tuple[int, ...]] | None = None,
    config: dict[str, str] | None = None,
    fenced: fence.ReadFence | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The rows to write, the snapshot partitions that no longer exist, and the kind of read
    fence the group's commits were read up to."""
    from kafka_group_jobs import progress, transforms

    config = config or {}
    state_partition = partitioning.partition_for(
        group_id, topics.partition_count(bootstrap, state_topic, config)
    )
    state, fenced, ranges = arguments.read_state(
        spark, bootstrap, state_topic, config, [state_partition], fenced=fenced, commits_of=group_id
    )
    # Materialized once: the state topic is read exactly once, whatever follows.
    with progress.watching(spark, f"reading {state_topic}", ranges, len(fenced.end_offsets)):
        committed = transforms.group_offsets(state, group_id).localCheckpoint()
    saved: DataFrame | None = None
    if kind == "snapshot":
        if snapshot_location is None:
            raise RestoreError("a snapshot restore needs --snapshot")
        _, saved = snapshot.read(spark, snapshot_location)
    universe = set(scope_topics) or {row.topic for row in committed.select("topic").collect()} | (
        {row.topic for row in saved.select("topic").distinct().collect()} if saved else set()
    )
    bounds = live_bounds(spark, bootstrap, sorted(universe), at_ms, config)
    rows = transforms.plan_reset(
        bounds, committed, kind, value, saved, scope_topics, scope_partitions
    ).collect()
    missing = (
        transforms.missing_partitions(
            transforms.in_scope(saved, scope_topics, scope_partitions), bounds
        ).collect()
        if saved is not None
        else []
    )
    return [row.asDict() for row in rows], [row.asDict() for row in missing], fenced.kind


def live_bounds(
    spark: SparkSession,
    bootstrap: str,
    topic_names: list[str],
    at_ms: int | None,
    config: dict[str, str],
) -> DataFrame:
    """``(topic, partition, earliest_offset, latest_offset, time_offset)`` of live partitions."""
    found = topics.topic_partitions(bootstrap, topic_names, config)
    marks = topics.watermarks(bootstrap, found, config)
    by_time = topics.offsets_for_time(bootstrap, found, at_ms, config) if at_ms is not None else {}
    return spark.createDataFrame(
        [(t, p, low, high, by_time.get((t, p))) for (t, p), (low, high) in marks.items()],
        "topic STRING, partition INT, earliest_offset BIGINT, latest_offset BIGINT,"
        " time_offset BIGINT",
    )


def _coordinator_request(
    url: str, group_id: str, token: str | None, path: str = "", body: Any = None
) -> dict[str, Any]:
    """One call of the coordinator's group API; every failure is one ``RestoreError`` line."""
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/groups/{urllib.parse.quote(group_id, safe='')}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="GET" if body is None else "POST",
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=COORDINATOR_TIMEOUT_S) as response:
            reply: dict[str, Any] = json.loads(response.read() or b"{}")
            return reply
    except urllib.error.HTTPError as error:
        try:
            detail = json.loads(error.read() or b"{}")
        except ValueError:
            detail = {}
        name = detail.get("error", f"HTTP {error.code}") if isinstance(detail, dict) else ""
        message = detail.get("message", "") if isinstance(detail, dict) else ""
        if error.code == 401:
            raise RestoreError(
                f"the coordinator at {url} needs the token of group {group_id!r}:"
                " pass --token or set KGO_GROUP_TOKEN"
            ) from None
        if error.code == 403:
            raise RestoreError(
                f"the coordinator at {url} refused the token for group {group_id!r} ({name})"
            ) from None
        raise _HttpRefusal(error.code, name, message) from None
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise RestoreError(f"cannot reach the coordinator at {url}: {reason}") from None


class _HttpRefusal(RestoreError):
    def __init__(self, status: int, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}" if message else name)
        self.status, self.name = status, name


def check_coordinator(url: str, group_id: str, token: str | None, writing: bool) -> None:
    """Before Spark: the coordinator answers, takes the token, and (when ``writing``) would
    take an administrative commit: the group is empty, unknown, or paused for a reset."""
    try:
        description = _coordinator_request(url, group_id, token)
    except _HttpRefusal as refusal:
        if refusal.name == "GROUP_ID_NOT_FOUND":
            return  # no members and no offsets yet: a commit creates them
        raise RestoreError(
            f"the coordinator at {url} refused to describe {group_id!r}: {refusal}"
        ) from None
    members = description.get("members") or []
    state = description.get("state")
    if writing and members and state != "Paused":
        raise RestoreError(
            f"group {group_id!r} has {len(members)} active members (state {state}): the"
            " coordinator takes a restore only while the group is empty or paused for a"
            " reset; stop the members (scale to 0) or pause the group, then retry"
        )


def write_through_coordinator(
    url: str, group_id: str, token: str | None, rows: list[dict[str, Any]]
) -> None:
    """One administrative commit through the coordinator's HTTP API; raises on any error."""
    body = {
        "memberId": "",
        "memberEpoch": -1,
        "offsets": [
            {"topic": row["topic"], "partition": row["partition"], "offset": row["new_offset"]}
            for row in rows
        ],
    }
    try:
        reply = _coordinator_request(url, group_id, token, "/offsets", body)
    except _HttpRefusal as refusal:
        raise RestoreError(f"the coordinator refused the commit: {refusal}") from None
    if reply.get("errors"):
        rejected = ", ".join(
            f"{entry['topic']}[{entry['partition']}] {entry['error']}" for entry in reply["errors"]
        )
        raise RestoreError(f"the coordinator rejected partitions: {rejected}")


def audit(
    group_id: str,
    target: dict[str, Any],
    rows: list[dict[str, Any]],
    missing: list[dict[str, Any]],
    dry_run: bool,
    read_fence: str = fence.LAST_STABLE_OFFSET,
) -> dict[str, Any]:
    return {
        "group": group_id,
        "target": target,
        "dryRun": dry_run,
        "fence": read_fence,
        "at": arguments.iso_time(topics.now_ms()),
        "partitions": [
            {
                "topic": row["topic"],
                "partition": row["partition"],
                "oldOffset": row["current_offset"],
                "newOffset": row["new_offset"],
                "requestedOffset": row["requested_offset"],
                "clamp": row["clamp"],
            }
            for row in rows
        ],
        "clamped": sum(1 for row in rows if row["clamp"]),
        "missingPartitions": [
            {"topic": row["topic"], "partition": row["partition"], "offset": row["offset"]}
            for row in missing
        ],
        "warnings": warnings(rows),
    }


def warnings(rows: list[dict[str, Any]]) -> list[str]:
    """One line per clamp and per committed offset past the log end the broker reports."""
    found = []
    for row in rows:
        where = f"{row['topic']}[{row['partition']}]"
        current, latest = row["current_offset"], row["latest_offset"]
        if current is not None and current > latest:
            found.append(
                f"{where}: committed offset {current} is past the log end {latest} the broker"
                " reports: either the broker reports a wrong log end (some do after batched"
                " produces) or the partition lost records"
            )
        if row["clamp"] == "latest":
            found.append(
                f"{where}: requested offset {row['requested_offset']} is past the log end"
                f" {latest} the broker reports: clamped to {row['new_offset']}. If the partition"
                " does hold that offset, the broker reports a wrong log end: check before"
                " applying"
            )
        elif row["clamp"] == "earliest":
            found.append(
                f"{where}: requested offset {row['requested_offset']} is before the log start"
                f" {row['earliest_offset']} (deleted by retention): clamped to {row['new_offset']}"
            )
    return found


def report(document: dict[str, Any], written_to: str | None) -> list[str]:
    """The audit for people: the target, one table row per partition, and what was written."""
    target = document["target"]
    detail = "".join(f" {value}" for name, value in target.items() if name != "to")
    lines = [f"restore plan for group {document['group']}: to {target['to']}{detail}"]
    partitions = document["partitions"]
    if partitions:
        lines += arguments.table(
            ("topic", "partition", "old", "requested", "new", "clamp"),
            [
                (
                    row["topic"],
                    row["partition"],
                    row["oldOffset"],
                    row["requestedOffset"],
                    row["newOffset"],
                    row["clamp"],
                )
                for row in partitions
            ],
        )
    for row in document["missingPartitions"]:
        lines.append(
            f"  not restored: {row['topic']}[{row['partition']}] (offset {row['offset']} in the"
            " snapshot) no longer exists in Kafka"
        )
    outcome = (
        f"dry run: nothing written; add --execute to write {len(partitions)} offset(s)"
        if document["dryRun"] and partitions
        else "dry run: nothing written"
        if document["dryRun"]
        else f"written {written_to}"
        if written_to
        else "nothing to write"
    )
    lines.append(f"{len(partitions)} partitions, {document['clamped']} clamped; {outcome}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return arguments.run("restore", _main, argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = arguments.parser("restore", "Reset or restore a consumer group's committed offsets.")
    parser.add_argument("--group", required=True)
    parser.add_argument("--to", required=True, choices=columns.RESET_KINDS)
    parser.add_argument("--value", type=int, help="the offset, or the shift")
    parser.add_argument("--datetime", help="ISO-8601 time (UTC unless it names a zone)")
    parser.add_argument("--duration", help="ISO-8601 duration back from now, e.g. PT1H")
    parser.add_argument("--snapshot", help="storage URI of a snapshot")
    parser.add_argument("--topics", default="", help="comma-separated topics in scope")
    parser.add_argument("--partitions", action="append", default=[], help="TOPIC:P[,P...]")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the plan only (the default)")
    mode.add_argument("--execute", action="store_true", help="write the plan (as resets do)")
    arguments.add_coordinator(parser, "which applies the plan (needed with --execute)")
    parser.add_argument("--audit", help="storage URI to write the audit JSON to")
    args = parser.parse_args(argv)
    arguments.check_group(args.group)
    at_ms = None
    if args.to in ("offset", "shift-by") and args.value is None:
        raise errors.UsageError(f"--to {args.to} needs --value")
    if args.to == "snapshot" and not args.snapshot:
        raise errors.UsageError("--to snapshot needs --snapshot URI")
    if args.to == "datetime":
        if not args.datetime:
            raise errors.UsageError("--to datetime needs --datetime")
        at_ms = arguments.parse_time_ms(args.datetime)
    elif args.to == "duration":
        if not args.duration:
            raise errors.UsageError("--to duration needs --duration")
        at_ms = topics.now_ms() - parse_duration_ms(args.duration)
    coordinator = arguments.coordinator_of(args, args.group)
    scope = tuple(t for t in args.topics.split(",") if t)
    partitions = parse_partitions(args.partitions) or None
    config = arguments.kafka_config(args)
    if args.to == "snapshot":
        storage.check_readable("snapshot", args.snapshot, snapshot.MANIFEST_FILE)
    if args.audit:
        storage.check_scheme("--audit", args.audit)
    topics.bootstrap_servers(args.bootstrap)  # a wrong --bootstrap is a usage error first
    if coordinator is None and args.execute:
        raise RestoreError(NO_COORDINATOR)
    arguments.check_state_topic(args.bootstrap, args.topic, config)
    if coordinator is not None:
        check_coordinator(coordinator.url, args.group, args.token, args.execute)
    fenced = arguments.take_fence(args.bootstrap, args.topic, config, coordinator, args.group)
    target = {
        "to": args.to,
        **{
            name: getattr(args, name)
            for name in ("value", "datetime", "duration", "snapshot")
            if getattr(args, name) is not None
        },
    }
    written_to = None
    from kafka_group_jobs import session  # only now: see the module docstring

    with session.job_session("kafka-group-restore", args.master, args.spark_ui) as spark:
        rows, missing, read_fence = plan(
            spark,
            args.bootstrap,
            args.topic,
            args.group,
            args.to,
            args.value,
            at_ms,
            args.snapshot,
            scope,
            partitions,
            config,
            fenced,
        )
        document = audit(args.group, target, rows, missing, not args.execute, read_fence)
        if args.execute and rows and coordinator is not None:
            write_through_coordinator(coordinator.url, args.group, args.token, rows)
            written_to = f"through the coordinator at {coordinator.url}"
        if args.audit:
            storage.write_json(spark, args.audit, document)
    if args.json:
        arguments.emit_result(document)
    else:
        arguments.say(*report(document, written_to))
    for warning in document["warnings"]:
        arguments.warn(warning)
    arguments.note_client_warnings()
    return 0


if __name__ == "__main__":
    sys.exit(main())
