"""The benchmark runner's command line: ``python -m bench NAME [options]``, or ``all``.

The runner knows every benchmark's name and one-line description without importing it, so
``--help`` and ``--list`` start nothing, and no name prints the usage (a run of all of them
takes hours: ``all`` must be asked for by name; it runs each with its defaults, ``all
--quick`` the quick variant of each that has one). It builds the named benchmark's parser
(``NAME --help`` documents its options) and refuses unknown names, unknown options and bad
values with one line and exit status 2 before anything runs.

A benchmark is a module ``bench/<name>.py`` writing ``bench/results/<name>*.json``. ``member``
declares its options with ``add_options(parser)`` and runs with ``main(options) -> int``
(``python -m bench.member [options]`` is the same as ``python -m bench member [options]``).
The older ones parse their own argument list (``main(argv) -> int``): their options are
declared here (``LEGACY_OPTIONS``), checked the same way, and handed on as
``--name[=value]``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol, cast

PROG = "python -m bench"

# Name and one line each, in the order ``all`` runs them.
BENCHMARKS: dict[str, str] = {
    "assignors": "our assignors against kafka-python's, on the same inputs",
    "coordinator": "one coordinator shard's cost per heartbeat, join and state load",
    "state_topic": "the state topic's commit path and start-up load against Kafka-native peers",
    "rebalance": "join latency, rolling restarts and heartbeat capacity against a Kafka group",
    "jobs": "the Spark jobs (snapshot, compaction) against a single-process peer",
    "protocol": "the coordinator's Kafka listener: ConsumerGroupHeartbeats per second",
    "frames": "what the wire frame checks cost per request",
    "gateway": "a confluent-kafka consumer through kgo gateway against one reading directly",
    "join": "an unmodified confluent-kafka consumer's join, through the gateway and direct",
    "failover": "three coordinator replicas on partition Leases, one killed",
    "failover_kafka": "Kafka's own group coordinator failing over, for comparison",
    "handover": "a replica stopping gracefully: its partitions handed over, not expired",
    "takeover": "a coordinator taking over a state partition of 100,000 live keys",
    "scale": "10,000 groups and 100,000 members on three coordinator replicas",
    "member": "the member library against a plain confluent-kafka consumer, per message and batch",
}
ALL = "all"


@dataclass(frozen=True)
class LegacyOption:
    """An option of a benchmark that parses its own argument list."""

    flag: str
    help: str
    metavar: str | None = None  # None: a flag without a value
    type: Callable[[str], object] = str  # checks the value (a bad one is refused up front)
    choices: tuple[str, ...] | None = None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def _positive_ints(text: str) -> str:
    for item in text.split(","):
        _positive_int(item)
    return text


def _group_sizes(text: str) -> str:
    for item in text.split(","):
        groups, sep, members = item.partition("x")
        if not sep:
            raise argparse.ArgumentTypeError(f"not GROUPSxMEMBERS: {item!r}")
        _positive_int(groups)
        _positive_int(members)
    return text


QUICK = LegacyOption("--quick", "smaller sizes, fewer or shorter rounds")

# The groups the failover and handover benchmarks load their replicas with.
_REPLICA_LOAD = (
    LegacyOption("--groups", "groups (100)", "N", _positive_int),
    LegacyOption("--members-per-group", "members of each group (2)", "N", _positive_int),
    LegacyOption(
        "--heartbeat-interval-ms", "the members' heartbeat interval (1000)", "MS", _positive_int
    ),
)

LEGACY_OPTIONS: dict[str, tuple[LegacyOption, ...]] = {
    "assignors": (
        LegacyOption("--report-only", "re-render the README table from the last results"),
        LegacyOption(
            "--peer-timeout", "seconds the peer may take per scenario", "S", _positive_float
        ),
        LegacyOption("--only", "only these scenarios, comma-separated", "NAME,..."),
    ),
    "coordinator": (QUICK,),
    "state_topic": (
        QUICK,
        LegacyOption(
            "--broker",
            "the Kafka-native peers on Apache Kafka, one node or three",
            "KIND",
            choices=("kafka", "kafka-3"),
        ),
        LegacyOption("--heartbeat-only", "only the heartbeat-path measure"),
        LegacyOption(
            "--partitions-sweep", "ours against native at 100 committers on 50, 10 and 5 partitions"
        ),
        LegacyOption(
            "--process-transaction",
            "what one transaction per process over every state partition would give, vs native",
        ),
    ),
    "rebalance": (QUICK,),
    "jobs": (
        QUICK,
        LegacyOption(
            "--sizes", "record counts to measure, comma-separated", "N,...", _positive_ints
        ),
        LegacyOption("--loader-only", "only the checkpoint loader, at the largest size"),
        LegacyOption("--first-record-only", "only the time to the first record"),
        LegacyOption(
            "--spark-application-only",
            "only the snapshot as its SparkApplication's driver runs it, against the local path",
        ),
        LegacyOption("--no-loader", "skip the checkpoint loader"),
        LegacyOption("--no-warm", "skip the runs in an already running Spark session"),
        LegacyOption("--snapshot-only", "only the snapshot and its two peers"),
        LegacyOption(
            "--group-partitions",
            "only the snapshot and its peers, the group committing N partitions over and over",
            "N",
            _positive_int,
        ),
        LegacyOption("--merge", "merge this run's figures into the last results"),
    ),
    "protocol": (
        QUICK,
        LegacyOption("--rounds", "alternating rounds (3; 1 with --quick)", "N", _positive_int),
        LegacyOption(
            "--loop", "the coordinator's event loop (uvloop)", "LOOP", choices=("uvloop", "asyncio")
        ),
    ),
    "frames": (QUICK,),
    "gateway": (
        QUICK,
        LegacyOption("--mb", "megabytes to consume (300; 40 with --quick)", "N", _positive_int),
    ),
    "join": (LegacyOption("--rounds", "joins measured on each side", "N", _positive_int),),
    "failover": (
        *_REPLICA_LOAD,
        LegacyOption("--retry-period", "the Lease elector's round, seconds", "S", _positive_float),
    ),
    "failover_kafka": (LegacyOption("--rounds", "failovers measured", "N", _positive_int),),
    "handover": (
        *_REPLICA_LOAD,
        LegacyOption("--lease-seconds", "the partition Leases' duration (8)", "S", _positive_int),
    ),
    "takeover": (QUICK,),
    "scale": (
        QUICK,
        LegacyOption(
            "--sizes",
            "groups x members per group to load, comma-separated",
            "GxM,...",
            _group_sizes,
        ),
        LegacyOption(
            "--protocol",
            "heartbeats through the coordinator listeners (Kafka protocol), not HTTP",
            "kafka",
            choices=("kafka",),
        ),
        LegacyOption("--rates", "heartbeats per second to offer, comma-separated", "N,..."),
    ),
}


class Benchmark(Protocol):
    """What a benchmark module provides."""

    def add_options(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, options: argparse.Namespace) -> int: ...


class UsageError(Exception):
    """A command line that cannot run: one line for the user, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are raised (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


@dataclass(frozen=True)
class Invocation:
    """One benchmark to run, with its parsed options."""

    name: str
    options: argparse.Namespace


def top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run one benchmark (or all of them) and write bench/results/*.json.",
        epilog=f"'{PROG} NAME --help' shows a benchmark's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "name",
        nargs="?",
        metavar="NAME",
        help=f"a benchmark (see --list), or '{ALL}' to run every one in turn (hours)",
    )
    parser.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's options")
    return parser


def benchmark_parser(name: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of one benchmark's options (imports its module, unless it is legacy)."""
    parser = _Parser(prog=prog or f"{PROG} {name}", description=BENCHMARKS.get(name))
    if name == ALL:
        parser.description = "Every benchmark in turn, each with its defaults."
        parser.add_argument(
            "--quick", action="store_true", help="the quick variant of each that has one"
        )
    elif name in LEGACY_OPTIONS:
        for option in LEGACY_OPTIONS[name]:
            if option.metavar is None:
                parser.add_argument(option.flag, action="store_true", help=option.help)
            else:
                parser.add_argument(
                    option.flag,
                    metavar=option.metavar if option.choices is None else None,
                    type=option.type,
                    choices=option.choices,
                    help=option.help,
                )
    else:
        _module(name).add_options(parser)
    return parser


def parse(argv: Sequence[str]) -> list[Invocation] | None:
    """The benchmarks ``argv`` asks for, in order; None for ``--list`` (printed). Raises
    ``UsageError`` for anything else than a known name with its own options."""
    top = top_parser().parse_args(argv)
    if top.list:
        if top.name is not None:
            raise UsageError(f"{PROG}: --list takes no benchmark name")
        width = max(map(len, BENCHMARKS)) + 2
        for name, description in BENCHMARKS.items():
            print(f"{name:<{width}}{description}")
        return None
    if top.name is None:
        raise UsageError(
            top_parser().format_usage()
            + f"{PROG}: name a benchmark, or '{ALL}' to run every one (see {PROG} --list)"
        )
    if top.name != ALL and top.name not in BENCHMARKS:
        raise UsageError(f"{PROG}: unknown benchmark {top.name!r} (see {PROG} --list)")
    options = benchmark_parser(top.name).parse_args(top.options)
    if top.name != ALL:
        return [Invocation(top.name, options)]
    return [Invocation(name, _defaults(name, quick=options.quick)) for name in BENCHMARKS]


def _defaults(name: str, quick: bool) -> argparse.Namespace:
    parser = benchmark_parser(name)
    if quick:
        try:
            return parser.parse_args(["--quick"])
        except UsageError:
            pass  # it has no quick variant
    return parser.parse_args([])


def _module(name: str) -> Benchmark:
    return cast(Benchmark, importlib.import_module(f"bench.{name}"))


def _legacy_argv(name: str, options: argparse.Namespace) -> list[str]:
    argv = []
    for option in LEGACY_OPTIONS[name]:
        value = getattr(options, option.flag.removeprefix("--").replace("-", "_"))
        if option.metavar is None and value:
            argv.append(option.flag)
        elif option.metavar is not None and value is not None:
            argv.append(f"{option.flag}={value}")
    return argv


def run(invocation: Invocation) -> int:
    if invocation.name in LEGACY_OPTIONS:
        legacy = cast(
            Callable[[list[str]], int], importlib.import_module(f"bench.{invocation.name}").main
        )
        return legacy(_legacy_argv(invocation.name, invocation.options))
    return _module(invocation.name).main(invocation.options)


def main(argv: Sequence[str]) -> int:
    try:
        invocations = parse(argv)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
    status = 0
    for invocation in invocations or []:
        if invocations and len(invocations) > 1:
            print(f"== bench {invocation.name}", flush=True)
        status |= run(invocation)
    return status


def run_alone(name: str, argv: Sequence[str]) -> int:
    """``python -m bench.NAME [options]``: the same as ``python -m bench NAME [options]``."""
    try:
        options = benchmark_parser(name, prog=f"python -m bench.{name}").parse_args(argv)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
    return run(Invocation(name, options))
