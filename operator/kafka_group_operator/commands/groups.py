"""``kgo groups``: ``kafka-consumer-groups.sh`` for the groups this coordinator runs.

* ``list``: the groups (with tokens: those whose token is given).
* ``describe GROUP``: per partition the committed offset, log end, lag and owner, as
  ``kafka-consumer-groups.sh --describe``; ``--members`` and ``--state`` views; ``-o json|yaml``.
* ``wait GROUP --members N``: until N members own their partitions and the group is stable.
* ``reset-offsets GROUP --to-earliest|--to-latest|--to-offset N|--to-datetime T|
  --by-duration D|--shift-by N|--from-file F``, scoped with ``--topic t[:p,...]`` or
  ``--all-topics``: a dry run (the default) prints the plan; ``--execute`` writes it as one
  administrative commit through the coordinator, which refuses it while the group has active
  members, unless its assignment is paused. Either way the audit is printed: old → new.
* ``export GROUP --file F`` / ``import GROUP --file F``: the CSV of
  ``kafka-consumer-groups.sh --export`` (``topic,partition,offset``); an import is a
  ``--from-file`` reset.

Everything goes through the coordinator's HTTP API; the Kafka lookups (log bounds, offsets by
time) go to ``--bootstrap``. Only the base install is needed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka_group_operator.commands import common, kafka_lookup
from kafka_group_operator.coordinator import errors
from kafka_group_operator.member import client
from kafka_group_records import resets

TopicPartition = tuple[str, int]

# Kafka's own refusal (ConsumerGroupCommand.resetOffsets), kept word for word.
NOT_INACTIVE = (
    "Assignments can only be reset if the group '{group}' is inactive, "
    "but the current state is {state}."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "groups",
        help="list, describe, reset, export and import groups (like kafka-consumer-groups)",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="the groups of the coordinator")
    common.add_coordinator_options(listing)
    common.add_output_option(listing)
    listing.set_defaults(func=run_list)

    describe = actions.add_parser("describe", help="offsets, lag and owners per partition")
    describe.add_argument("group", help="the consumer group id")
    view = describe.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="one line per member")
    view.add_argument("--state", action="store_true", help="the group's state only")
    common.add_coordinator_options(describe)
    common.add_bootstrap_option(describe)
    common.add_output_option(describe)
    describe.set_defaults(func=run_describe)

    wait = actions.add_parser("wait", help="wait until N members own their partitions")
    wait.add_argument("group", help="the consumer group id")
    wait.add_argument("--members", type=int, required=True, help="the number of members")
    wait.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    common.add_coordinator_options(wait)
    wait.set_defaults(func=run_wait)

    reset = actions.add_parser("reset-offsets", help="plan (default) or --execute an offset reset")
    reset.add_argument("group", help="the consumer group id")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the log end")
    target.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    target.add_argument("--to-datetime", metavar="T", help="ISO-8601 time, UTC unless zoned")
    target.add_argument("--by-duration", metavar="D", help="ISO-8601 duration ago, e.g. PT1H")
    target.add_argument("--shift-by", type=int, metavar="N", help="committed offset + N")
    target.add_argument("--from-file", type=Path, metavar="F", help="CSV topic,partition,offset")
    _add_scope_and_mode(reset)
    reset.set_defaults(func=run_reset)

    export = actions.add_parser("export", help="committed offsets to CSV, as Kafka's --export")
    export.add_argument("group", help="the consumer group id")
    export.add_argument("--file", required=True, help="the CSV file to write ('-': stdout)")
    common.add_coordinator_options(export)
    export.set_defaults(func=run_export)

    imports = actions.add_parser("import", help="reset to the offsets of a CSV export")
    imports.add_argument("group", help="the consumer group id")
    imports.add_argument("--file", required=True, type=Path, help="the CSV file to read")
    _add_scope_and_mode(imports)
    imports.set_defaults(func=run_import)


def _add_scope_and_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="T[:P,...]",
        help="a topic, or some of its partitions (repeatable)",
    )
    parser.add_argument(
        "--all-topics", action="store_true", help="every topic the group has offsets for"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the plan only (default)")
    mode.add_argument("--execute", action="store_true", help="write the plan")
    common.add_coordinator_options(parser)
    common.add_bootstrap_option(parser)
    common.add_output_option(parser)


# ----------------------------------------------------------------------------- coordinator


@contextmanager
def coordinator(args: argparse.Namespace) -> Iterator[client.CoordinatorClient]:
    """The group's client; an unreachable coordinator is one line naming its URL."""
    try:
        connection = client.CoordinatorClient(args.coordinator, args.group, args.token)
    except ValueError as error:
        raise common.UsageError(f"--coordinator: {error}") from None
    try:
        yield connection
    except client.CoordinatorUnreachable as error:
        raise common.CommandError(
            f"cannot reach the coordinator at {args.coordinator}: {error.message}"
        ) from None
    finally:
        connection.close()


def list_groups(url: str, token: str | None) -> list[dict[str, Any]]:
    """``GET /v1/groups``, with the coordinator's errors as the member client raises them."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise common.UsageError(f"--coordinator: not an http(s) URL: {url!r}")
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/groups")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        try:
            body = json.loads(error.read())
            name, message = str(body["error"]), str(body["message"])
        except (ValueError, KeyError, TypeError):
            raise common.CommandError(f"HTTP {error.code} from {url}") from None
        raise errors.BY_NAME.get(name, errors.CoordinatorError)(message) from None
    except OSError as error:  # URLError, refused, timed out
        reason = getattr(error, "reason", error)
        raise common.CommandError(f"cannot reach the coordinator at {url}: {reason}") from None
    try:
        groups: list[dict[str, Any]] = json.loads(raw)["groups"]
    except (ValueError, KeyError, TypeError):
        raise common.CommandError(f"unexpected reply from {url}: {raw[:80]!r}") from None
    return groups


def run_list(args: argparse.Namespace) -> int:
    groups = list_groups(args.coordinator, args.token)
    if args.output != "table":
        print(common.dump(groups, args.output))
        return 0
    rows = [
        (g["groupId"], g["state"], g["members"], g["groupEpoch"], g["assignor"]) for g in groups
    ]
    print(common.table(("GROUP", "STATE", "MEMBERS", "EPOCH", "ASSIGNOR"), rows))
    return 0


# ------------------------------------------------------------------------------ describe


def partition_rows(
    description: Mapping[str, Any],
    committed: Mapping[TopicPartition, int],
    log_ends: Mapping[TopicPartition, int] | None,
) -> list[dict[str, Any]]:
    """One row per partition the group owns or has committed, like Kafka's --describe.

    Without ``log_ends`` (no bootstrap) the log end is the committed offset plus the lag the
    coordinator reports, and unknown for a partition without a commit.
    """
    lag = {(e["topic"], e["partition"]): e["lag"] for e in description["lag"]}
    owners: dict[TopicPartition, Mapping[str, Any]] = {}
    for member in description["members"]:
        for topic, partitions in member["assignment"].items():
            for partition in partitions:
                owners[(topic, partition)] = member
    rows = []
    for topic, partition in sorted(set(owners) | set(committed)):
        current = committed.get((topic, partition))
        if log_ends is not None:
            end = log_ends.get((topic, partition))
        else:
            known = current is not None and (topic, partition) in lag
            end = current + lag[(topic, partition)] if current is not None and known else None
        owner = owners.get((topic, partition), {})
        rows.append(
            {
                "group": description["groupId"],
                "topic": topic,
                "partition": partition,
                "currentOffset": current,
                "logEndOffset": end,
                "lag": None if current is None or end is None else max(end - current, 0),
                "memberId": owner.get("memberId"),
                "instanceId": owner.get("instanceId"),
                "host": owner.get("clientHost") or None,
            }
        )
    return rows


def run_describe(args: argparse.Namespace) -> int:
    with coordinator(args) as connection:
        description = connection.describe()
        committed = {} if args.members else connection.fetch()
    group = description["groupId"]
    if args.state:
        state = {
            "group": group,
            "state": description["state"],
            "groupEpoch": description["groupEpoch"],
            "assignmentEpoch": description["assignmentEpoch"],
            "assignor": description["assignor"],
            "members": len(description["members"]),
            # No lag where nothing is committed (0 would hide a client that never commits).
            "totalLag": description["totalLag"] if description["lag"] else None,
        }
        if args.output != "table":
            print(common.dump(state, args.output))
            return 0
        headers = ("GROUP", "STATE", "EPOCH", "ASSIGNMENT-EPOCH", "ASSIGNOR", "#MEMBERS", "LAG")
        print(common.table(headers, [tuple(state.values())]))
        return 0
    if args.members:
        members = [
            {
                "group": group,
                "memberId": m["memberId"],
                "instanceId": m["instanceId"],
                "host": m.get("clientHost") or None,
                "epoch": m["memberEpoch"],
                "state": m["state"],
                "partitions": sum(len(p) for p in m["assignment"].values()),
                "assignment": m["assignment"],
                "revoking": m["partitionsPendingRevocation"],
            }
            for m in description["members"]
        ]
        if args.output != "table":
            print(common.dump(members, args.output))
            return 0
        if not members:
            print(f"Consumer group '{group}' has no active members.")
            return 0
        headers = ("GROUP", "MEMBER-ID", "INSTANCE-ID", "HOST", "EPOCH", "STATE", "#PARTITIONS")
        member_rows = [
            (
                group,
                m["memberId"],
                m["instanceId"],
                m["host"],
                m["epoch"],
                m["state"],
                m["partitions"],
                common.compact_partitions(m["assignment"]),
            )
            for m in members
        ]
        print(common.table((*headers, "ASSIGNMENT"), member_rows))
        return 0
    log_ends = None
    if args.bootstrap:
        owned = {
            (topic, p)
            for m in description["members"]
            for topic, partitions in m["assignment"].items()
            for p in partitions
        }
        with kafka_lookup.lookup(args.bootstrap) as kafka:
            bounds = kafka.bounds(sorted(owned | set(committed)))
        log_ends = {tp: high for tp, (_, high) in bounds.items()}
    rows = partition_rows(description, committed, log_ends)
    if args.output != "table":
        print(common.dump(rows, args.output))
        return 0
    if not description["members"]:
        print(f"Consumer group '{group}' has no active members.\n")
    if not committed:
        print(f"Consumer group '{group}' has no committed offsets.\n")
    partition_headers = (
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "MEMBER-ID",
        "INSTANCE-ID",
        "HOST",
    )
    print(common.table(partition_headers, [tuple(row.values()) for row in rows]))
    return 0


# ---------------------------------------------------------------------------------- wait


def settled(description: Mapping[str, Any], members: int) -> bool:
    """``members`` members, every one stable with nothing left to revoke or receive."""
    present = description["members"]
    return (
        len(present) == members
        and str(description["state"]).lower() == "stable"
        and all(
            m["state"] == "STABLE"
            and not m["partitionsPendingRevocation"]
            and m["assignment"] == m["targetAssignment"]
            for m in present
        )
    )


def run_wait(args: argparse.Namespace) -> int:
    if args.members < 0 or args.timeout <= 0:
        raise common.UsageError("--members must be >= 0 and --timeout > 0")
    deadline = time.monotonic() + args.timeout
    last = "no answer yet"
    with coordinator(args) as connection:
        while time.monotonic() < deadline:
            try:
                description = connection.describe()
            except (errors.GroupIdNotFound, errors.CoordinatorLoadInProgress) as error:
                last = error.name
            else:
                if settled(description, args.members):
                    print(
                        f"group {args.group}: {args.members} member(s), state "
                        f"{description['state']}, epoch {description['groupEpoch']}"
                    )
                    return 0
                last = f"{len(description['members'])} member(s), state {description['state']}"
            time.sleep(0.25)
    raise common.CommandError(
        f"group {args.group} did not settle with {args.members} member(s) within "
        f"{args.timeout:g}s (last: {last})"
    )


# ------------------------------------------------------------------------- reset, import


def _target(args: argparse.Namespace) -> tuple[str, int | None, int | None]:
    """The reset kind, its value and its time (ms) from the mutually exclusive options."""
    try:
        if args.to_earliest:
            return "earliest", None, None
        if args.to_latest:
            return "latest", None, None
        if args.to_offset is not None:
            if args.to_offset < 0:
                raise ValueError("--to-offset must not be negative")
            return "offset", args.to_offset, None
        if args.shift_by is not None:
            return "shift-by", args.shift_by, None
        if args.to_datetime is not None:
            return "datetime", None, resets.parse_time_ms(args.to_datetime)
        if args.by_duration is not None:
            duration = resets.parse_duration_ms(args.by_duration)
            return "duration", None, time.time_ns() // 1_000_000 - duration
    except ValueError as error:
        raise common.UsageError(str(error)) from None
    return "file", None, None


def _read_file(path: Path, group: str) -> dict[TopicPartition, int]:
    try:
        with path.open() as lines:
            offsets = resets.parse_csv(lines, group)
    except OSError as error:
        raise common.UsageError(f"cannot read {path}: {error.strerror or error}") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise common.UsageError(f"{path}: {error}") from None
    if not offsets:
        raise common.UsageError(f"{path} holds no offsets of group {group!r}")
    return offsets


def _scope(args: argparse.Namespace) -> dict[str, tuple[int, ...] | None]:
    scope: dict[str, tuple[int, ...] | None] = {}
    for spec in args.topic:
        try:
            topic, partitions = resets.parse_topic_scope(spec)
        except ValueError as error:
            raise common.UsageError(f"--topic: {error}") from None
        known = scope.get(topic, ())
        scope[topic] = None if partitions is None or known is None else (*known, *partitions)
    return scope


def reset(
    args: argparse.Namespace,
    kind: str,
    value: int | None,
    at_ms: int | None,
    file_offsets: dict[TopicPartition, int] | None,
) -> int:
    scope = _scope(args)
    if file_offsets is None and not scope and not args.all_topics:
        raise common.UsageError("name the partitions: --topic T[:P,...] or --all-topics")
    if scope and args.all_topics:
        raise common.UsageError("--topic and --all-topics exclude each other")
    bootstrap = common.required_bootstrap(args)
    with coordinator(args) as connection:
        committed = connection.fetch()
        if file_offsets is not None and not scope:
            # The file's partitions, each of which must exist, as Kafka's --from-file.
            scope = {
                topic: tuple(p for t, p in sorted(file_offsets) if t == topic)
                for topic in sorted({topic for topic, _ in file_offsets})
            }
        elif args.all_topics:
            scope = dict.fromkeys(sorted({topic for topic, _ in committed}))
            if not scope:
                raise common.CommandError(f"group {args.group!r} has no committed offsets")
        with kafka_lookup.lookup(bootstrap) as kafka:
            existing = kafka.partitions(scope)
            chosen = []
            for topic, partitions in existing.items():
                wanted = scope[topic]
                unknown = sorted(set(wanted or ()) - set(partitions))
                if unknown:
                    raise common.CommandError(
                        f"topic {topic!r} has no partition {', '.join(map(str, unknown))}"
                    )
                chosen += [(topic, p) for p in (wanted or partitions)]
            bounds = kafka.bounds(sorted(set(chosen)))
            by_time = kafka.offsets_for_time(sorted(bounds), at_ms) if at_ms is not None else None
        try:
            plan = resets.plan_reset(kind, bounds, committed, value, by_time, file_offsets)
        except ValueError as error:
            raise common.CommandError(str(error)) from None
        if not plan:
            raise common.CommandError(
                "nothing to reset: no partition in scope has an offset to move"
            )
        if args.execute:
            offsets = {(p.topic, p.partition): p.new for p in plan}
            try:
                refused = connection.commit("", -1, offsets)
            except errors.UnknownMemberId:
                state = connection.describe()["state"]
                raise common.CommandError(
                    NOT_INACTIVE.format(group=args.group, state=state)
                    + " Stop its members or pause the group first."
                ) from None
            if refused:
                listed = ", ".join(f"{t}:{p} {name}" for (t, p), name in sorted(refused.items()))
                raise common.CommandError(f"the coordinator refused {listed}")
        members = 0 if args.execute else len(connection.describe()["members"])
    print_audit(args, plan, members)
    return 0


def print_audit(
    args: argparse.Namespace, plan: Sequence[resets.PlannedOffset], members: int
) -> None:
    if args.output != "table":
        print(
            common.dump(
                {
                    "group": args.group,
                    "executed": bool(args.execute),
                    "partitions": [
                        {
                            "topic": p.topic,
                            "partition": p.partition,
                            "oldOffset": p.current,
                            "requestedOffset": p.requested,
                            "newOffset": p.new,
                            "clamp": p.clamp,
                        }
                        for p in plan
                    ],
                },
                args.output,
            )
        )
        return
    rows = [
        (args.group, p.topic, p.partition, p.current, "→", p.new, p.requested, p.clamp or "")
        for p in plan
    ]
    headers = ("GROUP", "TOPIC", "PARTITION", "OLD-OFFSET", "", "NEW-OFFSET", "REQUESTED", "CLAMP")
    print(common.table(headers, rows))
    for p in plan:
        if p.clamp:
            bound = "latest" if p.clamp == "latest" else "earliest"
            print(
                f"warning: {p.topic}:{p.partition} requested {p.requested} is out of range; "
                f"set to the {bound} offset {p.new}",
                file=sys.stderr,
            )
    if args.execute:
        print(f"wrote {len(plan)} offset(s): one administrative commit through the coordinator")
    else:
        busy = (
            f"; the group has {members} active member(s), so --execute is refused until it is "
            "empty or paused"
            if members
            else ""
        )
        print(f"dry run: nothing written; add --execute to write {len(plan)} offset(s){busy}")


def run_reset(args: argparse.Namespace) -> int:
    kind, value, at_ms = _target(args)
    file_offsets = _read_file(args.from_file, args.group) if kind == "file" else None
    return reset(args, kind, value, at_ms, file_offsets)


def run_import(args: argparse.Namespace) -> int:
    return reset(args, "file", None, None, _read_file(args.file, args.group))


# ---------------------------------------------------------------------------------- export


def run_export(args: argparse.Namespace) -> int:
    with coordinator(args) as connection:
        committed = connection.fetch()
    if not committed:
        raise common.CommandError(f"group {args.group!r} has no committed offsets")
    text = resets.format_csv(committed)
    if args.file == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(args.file).write_text(text)
    except OSError as error:
        raise common.UsageError(f"cannot write {args.file}: {error.strerror or error}") from None
    print(f"exported {len(committed)} offset(s) of group {args.group} to {args.file}")
    return 0
