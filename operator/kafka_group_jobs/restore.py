"""Restore job: reset a group's offsets to a snapshot or a computed target; plan, then write.

``python -m kafka_group_jobs.restore --bootstrap B --group G --to KIND [...] [--dry-run]``

Targets (``--to``), as ``kafka-consumer-groups.sh --reset-offsets`` has them: ``earliest``,
``latest``, ``offset --value N``, ``datetime --datetime ISO``, ``duration --duration PT1H``,
``shift-by --value ±N``, ``snapshot --snapshot URI``. ``--topics`` and ``--partitions t:0,1``
narrow the scope (default: every topic the group or the snapshot has offsets for).

Steps: read the group's current commits from the state topic; look the live topics' bounds up
(and offsets by time for datetime and duration); plan with ``transforms.plan_reset``, which
clamps out-of-range offsets into [earliest, latest] and marks each clamp; print the plan. Unless
``--dry-run``, write the commits:

* through the coordinator's HTTP API as an administrative commit (``memberId`` "" and epoch
  -1) when ``--coordinator-url`` is given; the coordinator accepts it only while the group is
  empty or its assignment is paused for a reset, so no live member races the restore;
* else as offset-commit records appended straight to the group's state partition, which is
  right only while no coordinator serves the group (it would not see them until it reloads).

The result (``KGO-RESULT``, and ``--audit URI`` when given) is the audit: per partition the
old and the new offset, the requested one and any clamp, plus snapshot partitions that no
longer exist.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from kafka_group_jobs import arguments, session, snapshot, storage, topics, transforms
from kafka_group_records import codec, partitioning, records

_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


class RestoreError(RuntimeError):
    """The plan could not be made or written."""


def parse_duration_ms(text: str) -> int:
    """Milliseconds of an ISO-8601 duration with days, hours, minutes and seconds."""
    match = _DURATION.match(text)
    if match is None or text in ("P", "PT"):
        raise ValueError(f"not an ISO-8601 duration (PnDTnHnMnS): {text!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000


def parse_partitions(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """``["t:0,1", "u:3"]`` -> ``{"t": (0, 1), "u": (3,)}``."""
    chosen: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        topic, _, numbers = spec.rpartition(":")
        if not topic or not numbers:
            raise ValueError(f"expected TOPIC:P[,P...], got {spec!r}")
        chosen[topic] = chosen.get(topic, ()) + tuple(int(n) for n in numbers.split(","))
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
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows to write and the snapshot partitions that no longer exist."""
    config = config or {}
    state_partition = partitioning.partition_for(
        group_id, topics.partition_count(bootstrap, state_topic, config)
    )
    state, _ = arguments.read_state(spark, bootstrap, state_topic, config, [state_partition])
    # Materialized once: the state topic is read exactly once, whatever follows.
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
    return [row.asDict() for row in rows], [row.asDict() for row in missing]


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
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/groups/{urllib.parse.quote(group_id, safe='')}/offsets",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            reply = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        raise RestoreError(f"coordinator refused the commit: {error.read().decode()}") from error
    if reply.get("errors"):
        raise RestoreError(f"coordinator rejected partitions: {reply['errors']}")


def write_to_state_topic(
    bootstrap: str,
    state_topic: str,
    group_id: str,
    rows: list[dict[str, Any]],
    config: dict[str, str],
) -> None:
    """Offset-commit records appended to the group's state partition (no coordinator running)."""
    partition = partitioning.partition_for(
        group_id, topics.partition_count(bootstrap, state_topic, config)
    )
    now = topics.now_ms()
    messages = []
    for row in rows:
        record = records.Record(
            records.OffsetCommitKey(group_id, row["topic"], row["partition"]),
            records.OffsetCommitValue(offset=row["new_offset"], commit_timestamp=now),
        )
        key, value = codec.encode_record(record)
        messages.append((partition, key, value))
    topics.produce(bootstrap, state_topic, messages, config)


def audit(
    group_id: str,
    target: dict[str, Any],
    rows: list[dict[str, Any]],
    missing: list[dict[str, Any]],
    dry_run: bool,
) -> dict[str, Any]:
    return {
        "group": group_id,
        "target": target,
        "dryRun": dry_run,
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
    }


def main(argv: list[str] | None = None) -> int:
    parser = arguments.parser("Reset or restore a consumer group's committed offsets.")
    parser.add_argument("--group", required=True)
    parser.add_argument("--to", required=True, choices=transforms.RESET_KINDS)
    parser.add_argument("--value", type=int, help="the offset, or the shift")
    parser.add_argument("--datetime", help="ISO-8601 time (UTC unless it names a zone)")
    parser.add_argument("--duration", help="ISO-8601 duration back from now, e.g. PT1H")
    parser.add_argument("--snapshot", help="storage URI of a snapshot")
    parser.add_argument("--topics", default="", help="comma-separated topics in scope")
    parser.add_argument("--partitions", action="append", default=[], help="TOPIC:P[,P...]")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    parser.add_argument("--coordinator-url", help="commit through the coordinator's HTTP API")
    parser.add_argument("--token", default=os.environ.get("KGO_GROUP_TOKEN"))
    parser.add_argument("--audit", help="storage URI to write the audit JSON to")
    args = parser.parse_args(argv)
    at_ms = None
    if args.to == "datetime":
        if not args.datetime:
            parser.error("--to datetime needs --datetime")
        at_ms = arguments.parse_time_ms(args.datetime)
    elif args.to == "duration":
        if not args.duration:
            parser.error("--to duration needs --duration")
        at_ms = topics.now_ms() - parse_duration_ms(args.duration)
    config = arguments.kafka_config(args)
    scope = tuple(t for t in args.topics.split(",") if t)
    target = {
        "to": args.to,
        **{
            name: getattr(args, name)
            for name in ("value", "datetime", "duration", "snapshot")
            if getattr(args, name) is not None
        },
    }
    with session.job_session("kafka-group-restore", args.master) as spark:
        rows, missing = plan(
            spark,
            args.bootstrap,
            args.topic,
            args.group,
            args.to,
            args.value,
            at_ms,
            args.snapshot,
            scope,
            parse_partitions(args.partitions) or None,
            config,
        )
        report = audit(args.group, target, rows, missing, args.dry_run)
        if not args.dry_run and rows:
            if args.coordinator_url:
                write_through_coordinator(args.coordinator_url, args.group, args.token, rows)
            else:
                write_to_state_topic(args.bootstrap, args.topic, args.group, rows, config)
        if args.audit:
            storage.write_json(spark, args.audit, report)
    arguments.emit_result(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
