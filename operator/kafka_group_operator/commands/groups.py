"""``kgo groups``: ``kafka-consumer-groups.sh`` for the groups this coordinator runs.

* ``list``: the groups (with tokens: those whose token is given; a token that opens none is
  refused).
* ``describe GROUP`` (or ``--group G`` repeated, or ``--all-groups``): per partition the
  committed offset, log end, lag and owner, as ``kafka-consumer-groups.sh --describe``;
  ``--members`` and ``--state`` views (``--state`` names the coordinator serving the group);
  ``-o json|yaml``.
* ``wait GROUP --members N``: until N members own their partitions and the group is stable.
* ``reset-offsets GROUP --to-earliest|--to-latest|--to-current|--to-offset N|--to-datetime T|
  --by-duration D|--shift-by N|--from-file F``, scoped with ``--topic t[:p,...]`` or
  ``--all-topics``: a dry run (the default) prints the plan; ``--execute`` writes it as one
  administrative commit through the coordinator, which refuses it while the group has active
  members, unless its assignment is paused (``--wait`` waits for members that stopped without
  leaving to time out). Either way the audit is printed: old → new; ``--export`` prints the
  plan as Kafka's CSV instead.
* ``delete GROUP``: the group and its offsets, refused while it has members (Kafka's
  ``--delete``); ``delete-offsets GROUP --topic T[:P,...]``: some of its offsets (Kafka's
  ``--delete-offsets``, refused for a topic a member subscribes to).
* ``export GROUP --file F`` / ``import GROUP --file F``: the CSV of
  ``kafka-consumer-groups.sh --export`` (``topic,partition,offset``); an import is a
  ``--from-file`` reset.

Kafka's spelling works too: ``kgo groups --describe --group G --bootstrap-server B`` is
``kgo groups describe G --bootstrap B`` (``cli.kafka_actions`` moves the action flag).

Everything goes through the coordinator's HTTP API; the Kafka lookups (log bounds, offsets by
time) go to ``--bootstrap``. Only the base install is needed, and no client is imported
before the arguments are checked.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_group_operator.commands import common
from kafka_group_records import resets

if TYPE_CHECKING:
    from kafka_group_operator.member import client

TopicPartition = tuple[str, int]

# Kafka's own refusal (ConsumerGroupCommand.resetOffsets), kept word for word.
NOT_INACTIVE = (
    "Assignments can only be reset if the group '{group}' is inactive, "
    "but the current state is {state}."
)
# Kafka's action flags (ConsumerGroupCommand's exactly-one-action check) and ours.
KAFKA_ACTIONS = {
    "--list": "list",
    "--describe": "describe",
    "--reset-offsets": "reset-offsets",
    "--delete": "delete",
    "--delete-offsets": "delete-offsets",
}
# How long past the last member's session --wait keeps asking whether it left.
WAIT_SLACK_S = 5.0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "groups",
        help="list, describe, reset, delete, export and import groups (like kafka-consumer-groups)",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="the groups of the coordinator")
    common.add_coordinator_options(listing)
    common.add_output_option(listing)
    listing.set_defaults(func=run_list)

    describe = actions.add_parser("describe", help="offsets, lag and owners per partition")
    common.add_group_options(describe, many=True)
    view = describe.add_mutually_exclusive_group()
    view.add_argument("--offsets", action="store_true", help="per partition (the default)")
    view.add_argument("--members", action="store_true", help="one line per member")
    view.add_argument("--state", action="store_true", help="the group's state and coordinator")
    common.add_coordinator_options(describe)
    common.add_bootstrap_option(describe)
    common.add_output_option(describe)
    describe.set_defaults(func=run_describe)

    wait = actions.add_parser("wait", help="wait until N members own their partitions")
    common.add_group_options(wait)
    wait.add_argument("--members", type=int, required=True, help="the number of members")
    common.add_coordinator_options(wait, timeout_ms=60_000)
    wait.set_defaults(func=run_wait)

    reset = actions.add_parser("reset-offsets", help="plan (default) or --execute an offset reset")
    common.add_group_options(reset)
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the log end")
    target.add_argument(
        "--to-current", action="store_true", help="the committed offset (the log end without one)"
    )
    target.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    target.add_argument(
        "--to-datetime", metavar="T", help="ISO-8601 time with its zone, e.g. 2026-11-21T12:00Z"
    )
    target.add_argument("--by-duration", metavar="D", help="ISO-8601 duration ago, e.g. PT1H")
    target.add_argument("--shift-by", type=int, metavar="N", help="committed offset + N")
    target.add_argument("--from-file", type=Path, metavar="F", help="CSV topic,partition,offset")
    _add_scope_and_mode(reset)
    reset.set_defaults(func=run_reset)

    delete = actions.add_parser("delete", help="delete groups and their offsets (no members)")
    common.add_group_options(delete, many=True)
    common.add_coordinator_options(delete)
    delete.set_defaults(func=run_delete)

    delete_offsets = actions.add_parser(
        "delete-offsets", help="delete a group's offsets of some topics or partitions"
    )
    common.add_group_options(delete_offsets)
    delete_offsets.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="T[:P,...]",
        help="a topic, or some of its partitions (repeatable; required)",
    )
    common.add_coordinator_options(delete_offsets)
    common.add_output_option(delete_offsets)
    delete_offsets.set_defaults(func=run_delete_offsets)

    export = actions.add_parser("export", help="committed offsets to CSV, as Kafka's --export")
    common.add_group_options(export)
    export.add_argument("--file", required=True, help="the CSV file to write ('-': stdout)")
    common.add_coordinator_options(export)
    export.set_defaults(func=run_export)

    imports = actions.add_parser("import", help="reset to the offsets of a CSV export")
    common.add_group_options(imports)
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
    parser.add_argument(
        "--export", action="store_true", help="print the plan as Kafka's CSV, not as a table"
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="with --execute: wait for members that stopped without leaving to time out",
    )
    common.add_coordinator_options(parser)
    common.add_bootstrap_option(parser)
    common.add_output_option(parser)


def kafka_actions(argv: Sequence[str]) -> list[str]:
    """``groups --describe --group g ...`` as ``groups describe --group g ...``: Kafka's action
    flags (exactly one, anywhere) moved to where the subcommand goes; anything else as is."""
    arguments = list(argv)
    if arguments[1:2] and not arguments[1].startswith("-"):
        return arguments
    found = [index for index, word in enumerate(arguments) if word in KAFKA_ACTIONS]
    if not found:
        return arguments
    if len(found) > 1:
        raise common.UsageError(
            "Command must include exactly one action: "
            + ", ".join(KAFKA_ACTIONS)  # Kafka's own words
        )
    action = KAFKA_ACTIONS[arguments.pop(found[0])]
    return [arguments[0], action, *arguments[1:]]


# ----------------------------------------------------------------------------------- list


def run_list(args: argparse.Namespace) -> int:
    groups = common.list_groups(args)
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


def state_of(description: Mapping[str, Any], coordinator_url: str) -> dict[str, Any]:
    """The ``--state`` view: Kafka's columns (the coordinator first) and the epochs."""
    return {
        "group": description["groupId"],
        "coordinator": coordinator_url,
        "assignor": description["assignor"],
        "state": description["state"],
        "members": len(description["members"]),
        "groupEpoch": description["groupEpoch"],
        "assignmentEpoch": description["assignmentEpoch"],
        # No lag where nothing is committed (0 would hide a client that never commits).
        "totalLag": description["totalLag"] if description["lag"] else None,
    }


def coordinator_url(connection: client.CoordinatorClient) -> str:
    """The member-API URL of the coordinator serving the group (Kafka's COORDINATOR column):
    the one its coordinator lookup names, else the one that answered."""
    found = connection.request("GET", "/coordinator")
    url = found.get("url")
    return url if isinstance(url, str) and url else connection.coordinator_url


def member_rows(description: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "group": description["groupId"],
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


def describe_one(args: argparse.Namespace, group: str) -> tuple[list[dict[str, Any]], str]:
    """One group's rows (of the chosen view) and its table."""
    from kafka_group_operator.commands import kafka_lookup

    with common.coordinator(args, group) as connection:
        description = connection.describe()
        if args.state:
            state = state_of(description, coordinator_url(connection))
            state_headers = (
                "GROUP", "COORDINATOR", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS", "EPOCH",
                "ASSIGNMENT-EPOCH", "LAG",
            )  # fmt: skip
            return [state], common.table(state_headers, [tuple(state.values())])
        committed = {} if args.members else connection.fetch()
    if args.members:
        members = member_rows(description)
        if not members:
            return members, f"Consumer group '{group}' has no active members."
        member_headers = (
            "GROUP", "MEMBER-ID", "INSTANCE-ID", "HOST", "EPOCH", "STATE", "#PARTITIONS",
            "ASSIGNMENT",
        )  # fmt: skip
        member_table = [
            (
                m["group"], m["memberId"], m["instanceId"], m["host"], m["epoch"], m["state"],
                m["partitions"], common.compact_partitions(m["assignment"]),
            )
            for m in members
        ]  # fmt: skip
        return members, common.table(member_headers, member_table)
    log_ends = None
    if args.bootstrap:
        owned = {
            (topic, p)
            for m in description["members"]
            for topic, partitions in m["assignment"].items()
            for p in partitions
        }
        with kafka_lookup.lookup(args.bootstrap, args.timeout / 1000) as kafka:
            bounds = kafka.bounds(sorted(owned | set(committed)))
        log_ends = {tp: high for tp, (_, high) in bounds.items()}
    rows = partition_rows(description, committed, log_ends)
    headers = (
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER-ID",
        "INSTANCE-ID", "HOST",
    )  # fmt: skip
    text = common.table(headers, [tuple(row.values()) for row in rows])
    if not committed:
        text = f"Consumer group '{group}' has no committed offsets.\n\n{text}"
    if not description["members"]:
        text = f"Consumer group '{group}' has no active members.\n\n{text}"
    return rows, text


def run_describe(args: argparse.Namespace) -> int:
    named = common.groups_of(args)
    groups = named or [g["groupId"] for g in common.list_groups(args)]
    found: list[dict[str, Any]] = []
    tables: list[str] = []
    failed = 0
    for group in groups:
        try:
            rows, text = describe_one(args, group)
        except common.CommandError as error:
            if len(groups) == 1:
                raise
            # As Kafka's tool: the error of one group does not hide the others.
            print(f"kgo groups describe: {error}", file=sys.stderr)
            failed += 1
            continue
        found += rows
        tables.append(text)
    if args.output != "table":
        single = len(named) == 1 and args.state
        print(common.dump(found[0] if single else found, args.output))
    else:
        print("\n\n".join(tables))
    return 1 if failed else 0


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
    group = common.group_of(args)
    if args.members < 0:
        raise common.UsageError("--members must be >= 0")
    from kafka_group_operator.coordinator import errors

    deadline = time.monotonic() + args.timeout / 1000
    last = "no answer yet"
    with common.coordinator(args, group) as connection:
        while time.monotonic() < deadline:
            try:
                description = connection.describe()
            except (errors.GroupIdNotFound, errors.CoordinatorLoadInProgress) as error:
                last = error.name
            else:
                if settled(description, args.members):
                    print(
                        f"group {group}: {args.members} member(s), state "
                        f"{description['state']}, epoch {description['groupEpoch']}"
                    )
                    return 0
                last = f"{len(description['members'])} member(s), state {description['state']}"
            time.sleep(0.25)
    raise common.CommandError(
        f"group {group} did not settle with {args.members} member(s) within "
        f"{args.timeout / 1000:g}s (last: {last})"
    )


# ------------------------------------------------------------------------- reset, import


def _target(args: argparse.Namespace) -> tuple[str, int | None, int | None]:
    """The reset kind, its value and its time (ms) from the mutually exclusive options."""
    try:
        if args.to_earliest:
            return "earliest", None, None
        if args.to_latest:
            return "latest", None, None
        if args.to_current:
            return "current", None, None
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


def _scope(specs: Sequence[str]) -> dict[str, tuple[int, ...] | None]:
    scope: dict[str, tuple[int, ...] | None] = {}
    for spec in specs:
        try:
            topic, partitions = resets.parse_topic_scope(spec)
        except ValueError as error:
            raise common.UsageError(f"--topic: {error}") from None
        known = scope.get(topic, ())
        scope[topic] = None if partitions is None or known is None else (*known, *partitions)
    return scope


def _check_mode(args: argparse.Namespace) -> None:
    if args.wait and not args.execute:
        raise common.UsageError("--wait waits to write: it needs --execute")
    if args.export and args.output != "table":
        raise common.UsageError("--export prints Kafka's CSV: it excludes -o")


def reset(
    args: argparse.Namespace,
    group: str,
    kind: str,
    value: int | None,
    at_ms: int | None,
    file_offsets: dict[TopicPartition, int] | None,
) -> int:
    scope = _scope(args.topic)
    if file_offsets is None and not scope and not args.all_topics:
        raise common.UsageError("name the partitions: --topic T[:P,...] or --all-topics")
    if scope and args.all_topics:
        raise common.UsageError("--topic and --all-topics exclude each other")
    _check_mode(args)
    bootstrap = common.required_bootstrap(args)
    from kafka_group_operator.commands import kafka_lookup
    from kafka_group_operator.coordinator import errors

    with common.coordinator(args, group) as connection:
        try:
            committed = connection.fetch()
        except errors.GroupIdNotFound:
            # As Kafka's tool: a group that does not exist yet may be given its first
            # offsets (the commit creates it), e.g. before its consumers start.
            committed = {}
        if file_offsets is not None and not scope:
            # The file's partitions, each of which must exist, as Kafka's --from-file.
            scope = {
                topic: tuple(p for t, p in sorted(file_offsets) if t == topic)
                for topic in sorted({topic for topic, _ in file_offsets})
            }
        elif args.all_topics:
            scope = dict.fromkeys(sorted({topic for topic, _ in committed}))
            if not scope:
                raise common.CommandError(f"group {group!r} has no committed offsets")
        with kafka_lookup.lookup(bootstrap, args.timeout / 1000) as kafka:
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
            by_time = kafka.offsets_for_time(bounds, at_ms) if at_ms is not None else None
        try:
            plan = resets.plan_reset(kind, bounds, committed, value, by_time, file_offsets)
        except ValueError as error:
            raise common.CommandError(str(error)) from None
        if not plan:
            raise common.CommandError(
                "nothing to reset: no partition in scope has an offset to move"
            )
        if args.execute:
            write(args, group, connection, {(p.topic, p.partition): p.new for p in plan})
        members = 0 if args.execute or not committed else len(connection.describe()["members"])
    print_audit(args, group, plan, members)
    return 0


def write(
    args: argparse.Namespace,
    group: str,
    connection: client.CoordinatorClient,
    offsets: Mapping[TopicPartition, int],
) -> None:
    """One administrative commit; refused while the group has members (with ``--wait``,
    retried until members that stopped without leaving have timed out)."""
    from kafka_group_operator.coordinator import errors

    waited_until: float | None = None
    while True:
        try:
            refused = connection.commit("", -1, offsets)
            break
        except errors.UnknownMemberId:
            description = connection.describe()
        if not args.wait:
            raise common.CommandError(refusal(group, description, waited=False))
        left = [m.get("sessionExpiresInMs") for m in description["members"]]
        if waited_until is None:
            # Members that stopped without leaving are gone one session after their last
            # heartbeat; one still there after that much waiting is alive.
            longest = max([ms for ms in left if isinstance(ms, int)] or [0])
            session = description.get("sessionTimeoutMs") or 0
            waited_until = time.monotonic() + max(longest, session) / 1000 + WAIT_SLACK_S
            print(
                f"waiting up to {waited_until - time.monotonic():.0f} s for the "
                f"{len(left)} member(s) of {group} to time out",
                file=sys.stderr,
            )
        elif time.monotonic() > waited_until:
            raise common.CommandError(refusal(group, description, waited=True))
        time.sleep(0.5)
    if refused:
        listed = ", ".join(f"{t}:{p} {name}" for (t, p), name in sorted(refused.items()))
        raise common.CommandError(f"the coordinator refused {listed}")


def refusal(group: str, description: Mapping[str, Any], waited: bool) -> str:
    """Kafka's refusal, and what the members' sessions say about waiting."""
    members = description["members"]
    head = NOT_INACTIVE.format(group=group, state=description["state"])
    session = description.get("sessionTimeoutMs")
    session_text = f"{session / 1000:g} s" if isinstance(session, int) else "its session timeout"
    if waited:
        return (
            f"{head} Its {len(members)} member(s) still heartbeat after the session timeout "
            f"({session_text}): stop them or pause the group first."
        )
    left = [
        m["sessionExpiresInMs"] for m in members if isinstance(m.get("sessionExpiresInMs"), int)
    ]
    until = f"within {max(left) / 1000:.1f} s" if left else f"{session_text} after"
    return (
        f"{head} Stop its {len(members)} member(s) or pause the group first; members stopped "
        f"without leaving stay until their session times out ({until} unless they heartbeat "
        f"again; the session timeout is {session_text}): --wait retries until then."
    )


def print_audit(
    args: argparse.Namespace, group: str, plan: Sequence[resets.PlannedOffset], members: int
) -> None:
    warnings = [
        f"warning: {p.topic}:{p.partition} requested {p.requested} is out of range; "
        f"set to the {'latest' if p.clamp == 'latest' else 'earliest'} offset {p.new}"
        for p in plan
        if p.clamp
    ]
    if args.execute:
        outcome = f"wrote {len(plan)} offset(s): one administrative commit through the coordinator"
    else:
        busy = (
            f"; the group has {members} active member(s), so --execute is refused until it is "
            "empty or paused"
            if members
            else ""
        )
        outcome = f"dry run: nothing written; add --execute to write {len(plan)} offset(s){busy}"
    if args.export:
        # Kafka prints the plan's CSV with println: the rows, then an empty line.
        print(resets.format_csv({(p.topic, p.partition): p.new for p in plan}))
        for line in [*warnings, outcome]:
            print(line, file=sys.stderr)
        return
    if args.output != "table":
        print(
            common.dump(
                {
                    "group": group,
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
        for line in warnings:
            print(line, file=sys.stderr)
        return
    rows = [
        (group, p.topic, p.partition, p.current, "→", p.new, p.requested, p.clamp or "")
        for p in plan
    ]
    headers = ("GROUP", "TOPIC", "PARTITION", "OLD-OFFSET", "", "NEW-OFFSET", "REQUESTED", "CLAMP")
    print(common.table(headers, rows))
    for line in warnings:
        print(line, file=sys.stderr)
    print(outcome)


def run_reset(args: argparse.Namespace) -> int:
    group = common.group_of(args)
    kind, value, at_ms = _target(args)
    file_offsets = _read_file(args.from_file, group) if kind == "file" else None
    return reset(args, group, kind, value, at_ms, file_offsets)


def run_import(args: argparse.Namespace) -> int:
    group = common.group_of(args)
    return reset(args, group, "file", None, None, _read_file(args.file, group))


# ---------------------------------------------------------------------------------- delete


def run_delete(args: argparse.Namespace) -> int:
    """Kafka's ``--delete``: each group with its offsets; one that has members is refused."""
    from kafka_group_operator.coordinator import errors

    named = common.groups_of(args)
    groups = named or [g["groupId"] for g in common.list_groups(args)]
    deleted: list[str] = []
    failed: list[str] = []
    for group in groups:
        try:
            with common.coordinator(args, group) as connection:
                connection.request("DELETE", "")
        except (common.CommandError, errors.CoordinatorError) as error:
            reason = (
                f"{error.name}: {error.message}"
                if isinstance(error, errors.CoordinatorError)
                else str(error)
            )
            failed.append(f"group '{group}' could not be deleted: {reason}")
            continue
        deleted.append(group)
    if deleted:
        # Kafka's words (ConsumerGroupCommand.deleteGroups).
        names = ", ".join(deleted)
        print(f"Deletion of requested consumer groups ('{names}') was successful.")
    if failed:
        if len(failed) == 1 and not deleted:
            raise common.CommandError(failed[0])
        for line in failed:
            print(f"kgo groups delete: {line}", file=sys.stderr)
        return 1
    return 0


def run_delete_offsets(args: argparse.Namespace) -> int:
    """Kafka's ``--delete-offsets``: the group's offsets of the partitions named; a topic
    named without partitions means every partition the group has an offset for."""
    from kafka_group_operator.coordinator import errors

    group = common.group_of(args)
    scope = _scope(args.topic)
    if not scope:
        raise common.UsageError("name the offsets to delete: --topic T[:P,...]")
    with common.coordinator(args, group) as connection:
        committed = connection.fetch()
        partitions = sorted(
            {(t, p) for t, p in committed if t in scope and scope[t] is None}
            | {(t, p) for t, chosen in scope.items() for p in chosen or ()}
        )
        statuses: dict[TopicPartition, str] = {}
        if partitions:
            query = "&".join(f"partition={_quote(t)}:{p}" for t, p in partitions)
            try:
                reply = connection.request("DELETE", f"/offsets?{query}")
            except errors.NonEmptyGroup:
                raise common.CommandError(
                    f"Deleting offsets of a consumer group '{group}' is forbidden if the "
                    "group is not empty."
                ) from None
            refused = {(e["topic"], e["partition"]): e["error"] for e in reply["errors"]}
            statuses = {tp: refused.get(tp, "Successful") for tp in partitions}
    # A whole topic the group has no offset of: said, rather than silently nothing deleted.
    missing = [
        topic
        for topic, chosen in sorted(scope.items())
        if chosen is None and all(t != topic for t, _ in partitions)
    ]
    rows = [
        {"topic": t, "partition": p, "status": status} for (t, p), status in statuses.items()
    ] + [{"topic": t, "partition": None, "status": "no committed offsets"} for t in missing]
    errored = [row for row in rows if row["status"] != "Successful"]
    if args.output != "table":
        print(common.dump(rows, args.output))
    else:
        if not errored:
            # Kafka's words (ConsumerGroupCommand.deleteOffsets).
            print(
                f"Request succeed for deleting offsets with topic {', '.join(args.topic)} "
                f"group {group}\n"
            )
        print(
            common.table(
                ("TOPIC", "PARTITION", "STATUS"),
                [
                    (
                        row["topic"],
                        "Not Provided" if row["partition"] is None else row["partition"],
                        row["status"]
                        if row["status"] == "Successful"
                        else f"Error: {row['status']}",
                    )
                    for row in rows
                ],
            )
        )
    if errored:
        print("kgo groups delete-offsets: some offsets were not deleted", file=sys.stderr)
        return 1
    return 0


def _quote(topic: str) -> str:
    import urllib.parse

    return urllib.parse.quote(topic, safe="")


# ---------------------------------------------------------------------------------- export


def run_export(args: argparse.Namespace) -> int:
    group = common.group_of(args)
    with common.coordinator(args, group) as connection:
        committed = connection.fetch()
    if not committed:
        raise common.CommandError(f"group {group!r} has no committed offsets")
    text = resets.format_csv(committed)
    if args.file == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(args.file).write_text(text)
    except OSError as error:
        raise common.UsageError(f"cannot write {args.file}: {error.strerror or error}") from None
    print(f"exported {len(committed)} offset(s) of group {group} to {args.file}")
    return 0
