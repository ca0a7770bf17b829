"""What the ``kgo`` subcommands share: errors that end a command in one line, the options
every command spells the same way, tables, ``-o json|yaml`` output, and the coordinator
connection.

Options, as ``kafka-consumer-groups.sh`` spells them where it has them: the group (``GROUP``
or ``--group GROUP``), ``--bootstrap`` (alias ``--bootstrap-server``), ``--coordinator``,
``--token``, ``--timeout`` (milliseconds, as Kafka's, or with a unit: ``30s``) and
``-o/--output``. ``kgo groups`` and the Spark jobs (``kgo snapshot|restore|compact``) take
the same ones.

A command reports a failure by raising ``CommandError`` (exit code 1: something at run time
went wrong) or ``UsageError`` (exit code 2: the invocation itself is wrong, e.g. a bad
argument value or an unreadable input file). ``cli.main`` prints the message as one line,
``kgo <command>: <message>``, and never a traceback. Importing this module needs only the
base install, and imports no client: a wrong invocation fails before any is loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kafka_group_operator.member import client

DEFAULT_COORDINATOR = "http://127.0.0.1:8080"
# The coordinator's, the operator's and the jobs' default state topic.
DEFAULT_STATE_TOPIC = "kafka-group-operator.group-state"
DEFAULT_TIMEOUT_MS = 10_000
MISSING_TOKEN = "pass --token or set KGO_GROUP_TOKEN"
RETRY_BACKOFF_S = 0.2


class CommandError(Exception):
    """A command failed at run time: one line on stderr, exit code ``code``."""

    code = 1


class UsageError(CommandError):
    """The invocation is wrong (argument values, input files): exit code 2, as argparse's."""

    code = 2


# ---------------------------------------------------------------------------------- options


def add_group_options(parser: argparse.ArgumentParser, many: bool = False) -> None:
    """The group, as ``GROUP`` or as Kafka's ``--group GROUP``; with ``many``, ``--group``
    repeats and ``--all-groups`` takes every group the token may see."""
    parser.add_argument("group", nargs="?", metavar="GROUP", help="the consumer group id")
    parser.add_argument(
        "--group",
        dest="group_option",
        metavar="GROUP",
        action="append",
        default=[],
        help="the consumer group id, as kafka-consumer-groups.sh takes it"
        + (" (repeatable)" if many else ""),
    )
    if many:
        parser.add_argument(
            "--all-groups", action="store_true", help="every group the token may see"
        )
    parser.set_defaults(many_groups=many)


def groups_of(args: argparse.Namespace) -> list[str]:
    """The groups named by ``GROUP`` and ``--group`` (an empty list with ``--all-groups``)."""
    named = [*([args.group] if args.group is not None else []), *args.group_option]
    if any(not group for group in named):
        raise UsageError("the group id must not be empty")
    all_groups = bool(getattr(args, "all_groups", False))
    if all_groups and named:
        raise UsageError("--all-groups and a group name exclude each other")
    if not named and not all_groups:
        more = " or --all-groups" if args.many_groups else ""
        raise UsageError(f"name the group: GROUP or --group GROUP{more}")
    if not args.many_groups and len(set(named)) > 1:
        raise UsageError(f"one group at a time, not {', '.join(map(repr, dict.fromkeys(named)))}")
    return list(dict.fromkeys(named))


def group_of(args: argparse.Namespace) -> str:
    """The one group a single-group command acts on."""
    return groups_of(args)[0]


def add_coordinator_options(
    parser: argparse.ArgumentParser, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> None:
    """``--coordinator``, ``--token`` and ``--timeout``, defaulting to the environment
    ``kgo dev up`` prints."""
    parser.add_argument(
        "--coordinator",
        default=os.environ.get("KGO_COORDINATOR_URL") or DEFAULT_COORDINATOR,
        help=f"the member API URL (default: $KGO_COORDINATOR_URL or {DEFAULT_COORDINATOR})",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("KGO_GROUP_TOKEN"),
        help="the group's bearer token (default: $KGO_GROUP_TOKEN)",
    )
    add_timeout_option(parser, timeout_ms)


def add_timeout_option(
    parser: argparse.ArgumentParser, default_ms: int = DEFAULT_TIMEOUT_MS
) -> None:
    parser.add_argument(
        "--timeout",
        type=timeout_ms,
        default=default_ms,
        metavar="MS",
        help="how long to wait for each answer, in milliseconds as Kafka's tools take it, "
        f"or with a unit (30s, 2m) (default: {default_ms})",
    )


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0}


def timeout_ms(text: str) -> int:
    """``5000`` (milliseconds, Kafka's ``--timeout``), ``5000ms``, ``30s`` or ``2m``."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration (5000, 5000ms, 30s, 2m): {text!r}")
    value = float(match.group(1)) * _UNIT_MS[match.group(2) or "ms"]
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 ms, not {text!r}")
    return int(value)


def add_bootstrap_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        "--bootstrap-server",
        dest="bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)",
    )


def required_bootstrap(args: argparse.Namespace) -> str:
    bootstrap: str | None = args.bootstrap
    if not bootstrap:
        raise UsageError("--bootstrap is required (or set KAFKA_BOOTSTRAP_SERVERS)")
    return bootstrap


def add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="output format (default: table)",
    )


# ----------------------------------------------------------------------------------- output


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart, like ``kafka-consumer-groups.sh``'s tables."""
    cells = [[str(header) for header in headers]] + [
        ["-" if value is None else str(value) for value in row] for row in rows
    ]
    widths = [max(len(row[index]) for row in cells) for index in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def dump(value: Mapping[str, Any] | Sequence[Any], output: str) -> str:
    """``value`` as JSON or YAML text (YAML needs PyYAML, part of the 'operator' extra)."""
    if output == "json":
        return json.dumps(value, indent=2)
    try:
        import yaml
    except ImportError:
        raise CommandError(
            "-o yaml needs PyYAML: pip install 'kafka-group-operator[operator]' (or use -o json)"
        ) from None
    text: str = yaml.safe_dump(value, sort_keys=False).rstrip("\n")
    return text


def compact_partitions(assignment: Mapping[str, Sequence[int]]) -> str:
    """``{"orders": [0, 1, 2, 5]}`` as ``orders[0-2,5]``."""
    parts = []
    for topic, partitions in sorted(assignment.items()):
        ranges: list[str] = []
        for partition in sorted(partitions):
            if ranges and ranges[-1].split("-")[-1] == str(partition - 1):
                ranges[-1] = f"{ranges[-1].split('-')[0]}-{partition}"
            else:
                ranges.append(str(partition))
        parts.append(f"{topic}[{','.join(ranges)}]")
    return " ".join(parts) or "-"


# ------------------------------------------------------------------------------ coordinator


def not_found(group: str) -> CommandError:
    """Kafka's words (ConsumerGroupCommand) for a group the caller may know does not exist."""
    return CommandError(f"Consumer group '{group}' does not exist.")


@contextmanager
def coordinator(args: argparse.Namespace, group: str) -> Iterator[client.CoordinatorClient]:
    """The group's client. An unreachable coordinator is one line naming its URL; a missing
    token says how to give one; an unknown group, in Kafka's words."""
    from kafka_group_operator.coordinator import errors
    from kafka_group_operator.member import client

    try:
        connection = _retrying(client.CoordinatorClient)(
            args.coordinator, group, args.token, timeout_s=args.timeout / 1000
        )
    except ValueError as error:
        raise UsageError(f"--coordinator: {error}") from None
    try:
        yield connection
    except client.CoordinatorUnreachable as error:
        raise CommandError(
            f"cannot reach the coordinator at {args.coordinator}: {error.message}"
        ) from None
    except errors.GroupIdNotFound:
        raise not_found(group) from None
    except errors.GroupAuthorizationFailed as error:
        raise authorization_failure(args, group, error) from None
    finally:
        connection.close()


def _retrying(base: type[client.CoordinatorClient]) -> type[client.CoordinatorClient]:
    """``base`` whose requests are retried, within ``--timeout``, while the coordinator says to
    retry (its partition is loading, or it moved), as Kafka's admin client retries; a
    coordinator that cannot be reached at all is reported at once."""
    import time

    from kafka_group_operator.coordinator import errors
    from kafka_group_operator.member import client

    retriable = (
        errors.CoordinatorLoadInProgress,
        errors.NotCoordinator,
        errors.CoordinatorNotAvailable,
    )

    class Retrying(base):  # type: ignore[valid-type,misc]
        def request(
            self, method: str, path: str, body: Any = None, deadline: float | None = None
        ) -> dict[str, Any]:
            until = time.monotonic() + self._timeout_s if deadline is None else deadline
            while True:
                try:
                    reply: dict[str, Any] = super().request(method, path, body, deadline)
                    return reply
                except retriable as error:
                    if isinstance(error, client.CoordinatorUnreachable):
                        raise
                    if time.monotonic() + RETRY_BACKOFF_S > until:
                        raise
                time.sleep(RETRY_BACKOFF_S)

    return Retrying


def authorization_failure(
    args: argparse.Namespace, group: str | None, error: Exception
) -> CommandError:
    """The coordinator refused the token: none given, or not this group's. A coordinator with
    tokens tells whether a group exists only to its token's holder, so a wrong token for an
    unknown group is refused the same way; the groups the token does open are named."""
    if not args.token:
        return CommandError(f"the coordinator at {args.coordinator} needs a token: {MISSING_TOKEN}")
    message = f"GROUP_AUTHORIZATION_FAILED: {getattr(error, 'message', error)}"
    if group is None:
        return CommandError(message)
    try:
        opened = [listed["groupId"] for listed in list_groups(args)]
    except CommandError:
        opened = []
    if opened:
        names = ", ".join(repr(name) for name in opened)
        message += f" (this token is for {names})"
    return CommandError(message)


def list_groups(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``GET /v1/groups``, with the coordinator's errors as the member client raises them."""
    import urllib.error
    import urllib.parse
    import urllib.request

    from kafka_group_operator.coordinator import errors

    url = args.coordinator
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(f"--coordinator: not an http(s) URL: {url!r}")
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/groups")
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout / 1000) as response:
            raw = response.read()
    except urllib.error.HTTPError as error:
        try:
            body = json.loads(error.read())
            name, message = str(body["error"]), str(body["message"])
        except (ValueError, KeyError, TypeError):
            raise CommandError(f"HTTP {error.code} from {url}") from None
        failure = errors.BY_NAME.get(name, errors.CoordinatorError)(message)
        if isinstance(failure, errors.GroupAuthorizationFailed):
            raise authorization_failure(args, None, failure) from None
        raise failure from None
    except OSError as error:  # URLError, refused, timed out
        reason = getattr(error, "reason", error)
        raise CommandError(f"cannot reach the coordinator at {url}: {reason}") from None
    try:
        groups: list[dict[str, Any]] = json.loads(raw)["groups"]
    except (ValueError, KeyError, TypeError):
        raise CommandError(f"unexpected reply from {url}: {raw[:80]!r}") from None
    return groups


# --event-loop of the long-running commands: uvloop's (the default) or asyncio's own.
EVENT_LOOPS = ("uvloop", "asyncio")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop ``--event-loop`` names: uvloop's by default (a steady heartbeat on the
    Kafka listener costs less CPU on it: bench/protocol), or asyncio's own."""
    if name == "asyncio":
        return asyncio.new_event_loop
    import uvloop

    return uvloop.new_event_loop
