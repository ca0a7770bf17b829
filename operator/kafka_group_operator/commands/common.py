"""What the ``kgo`` subcommands share: errors that end a command in one line, coordinator
options, tables and ``-o json|yaml`` output.

A command reports a failure by raising ``CommandError`` (exit code 1: something at run time
went wrong) or ``UsageError`` (exit code 2: the invocation itself is wrong, e.g. a bad
argument value or an unreadable input file). ``cli.main`` prints the message as one line,
``kgo <command>: <message>``, and never a traceback. Importing this module needs only the
base install.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any


class CommandError(Exception):
    """A command failed at run time: one line on stderr, exit code ``code``."""

    code = 1


class UsageError(CommandError):
    """The invocation is wrong (argument values, input files): exit code 2, as argparse's."""

    code = 2


def add_coordinator_options(parser: argparse.ArgumentParser) -> None:
    """``--coordinator`` and ``--token``, defaulting to the environment ``kgo dev up`` prints."""
    parser.add_argument(
        "--coordinator",
        default=os.environ.get("KGO_COORDINATOR_URL", "http://127.0.0.1:8080"),
        help="the member API URL (default: $KGO_COORDINATOR_URL or http://127.0.0.1:8080)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("KGO_GROUP_TOKEN"),
        help="the group's bearer token (default: $KGO_GROUP_TOKEN)",
    )


def add_bootstrap_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)",
    )


def required_bootstrap(args: argparse.Namespace) -> str:
    bootstrap: str | None = args.bootstrap
    if not bootstrap:
        raise UsageError("--bootstrap is required (or set KAFKA_BOOTSTRAP_SERVERS)")
    return bootstrap


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


def add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="output format (default: table)",
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
