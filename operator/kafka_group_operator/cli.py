"""``kgo``: the command line (also ``python -m kafka_group_operator``).

Each subcommand lives in its own module under ``commands/`` and exposes ``register(subparsers)``
which adds its parser and sets ``func(args) -> int``. Modules are imported lazily so that
``kgo assign`` does not pay for aiohttp, kopf or confluent-kafka.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> module under kafka_group_operator.commands
COMMANDS: dict[str, str] = {
    "assign": "assign",
    "coordinator": "coordinator",
    "demo": "demo",
    "describe": "describe",
    "generate-chart-crds": "chart",
    "operator": "kube_operator",
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kgo", description="kafka-group-operator: the Kafka consumer-group coordinator"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Import only the module of the chosen subcommand when it is known; all of them for --help.
    wanted = [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)
    for name in wanted:
        module = importlib.import_module(f"kafka_group_operator.commands.{COMMANDS[name]}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(arguments).parse_args(arguments)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
