"""``python -m bench``'s command line: what it refuses, lists and documents, and what it
hands each benchmark. Nothing here runs a benchmark: parsing is all that is exercised."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench import runner

BENCH = Path(runner.__file__).parent
# spark_kafka: the jobs benchmark's second peer, run by it; spark_application: how it runs a
# SparkApplication locally.
NOT_BENCHMARKS = {"__init__", "__main__", "runner", "spark_kafka", "spark_application"}


def test_every_benchmark_module_is_known_and_every_known_one_exists() -> None:
    modules = {path.stem for path in BENCH.glob("*.py")} - NOT_BENCHMARKS
    assert modules == set(runner.BENCHMARKS)


@pytest.mark.parametrize("name", sorted(runner.BENCHMARKS))
def test_each_benchmark_documents_every_option_it_takes(name: str) -> None:
    parser = runner.benchmark_parser(name)
    options = [action for action in parser._actions if action.option_strings]
    assert [a for a in options if not a.help] == []
    if name in runner.LEGACY_OPTIONS:
        # A benchmark that parses its own argument list reads every flag declared for it.
        source = (BENCH / f"{name}.py").read_text()
        for option in runner.LEGACY_OPTIONS[name]:
            assert option.flag in source, f"{name} does not read {option.flag}"
    else:
        assert callable(runner._module(name).main)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "name a benchmark"),
        (["nope"], "unknown benchmark 'nope'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["member", "--bogus"], "unrecognized arguments: --bogus"),
        (["member", "--records", "0"], "must be at least 1"),
        (["member", "--broker", "zookeeper"], "invalid choice"),
        (["jobs", "--sizes=10,x"], "not a whole number"),
        (["join", "--rounds", "-1"], "--rounds"),
        (["scale", "--protocol=http"], "invalid choice"),
        (["state_topic", "--broker=kafka-5"], "invalid choice"),
        (["all", "--records", "10"], "unrecognized arguments"),
        (["--list", "member"], "--list takes no benchmark name"),
    ],
)
def test_what_cannot_run_is_refused_with_one_line_and_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert runner.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err
    # One line; with no name at all, the usage line first.
    assert len(err.splitlines()) == (2 if argv == [] else 1), err


def test_no_name_prints_the_usage_and_runs_nothing() -> None:
    process = subprocess.run(
        [sys.executable, "-m", "bench"],
        cwd=BENCH.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 2
    assert process.stdout == ""
    assert process.stderr.startswith("usage: python -m bench")


def test_list_prints_every_benchmark_with_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(runner.BENCHMARKS)
    assert all(runner.BENCHMARKS[line.split()[0]] in line for line in lines)


@pytest.mark.parametrize("argv", [["--help"], ["member", "--help"], ["failover", "--help"]])
def test_help_prints_and_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        runner.main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {' '.join([runner.PROG, *argv[:-1]])}")
    if argv == ["failover", "--help"]:
        for flag in ("--groups", "--members-per-group", "--heartbeat-interval-ms"):
            assert flag in out


def test_a_benchmark_gets_its_parsed_options() -> None:
    (invocation,) = runner.parse(["member", "--broker", "kafka", "--records=1000", "--quick"]) or []
    assert invocation.name == "member"
    assert invocation.options.broker == "kafka"
    assert invocation.options.records == 1000
    assert invocation.options.quick is True
    assert invocation.options.mode == "both"


@pytest.mark.parametrize(
    ("argv", "handed_on"),
    [
        (["jobs"], []),
        (
            ["jobs", "--quick", "--sizes", "1000,2000", "--no-warm"],
            ["--quick", "--sizes=1000,2000", "--no-warm"],
        ),
        (
            ["scale", "--sizes=10x2,20x3", "--protocol", "kafka"],
            ["--sizes=10x2,20x3", "--protocol=kafka"],
        ),
        (["failover", "--groups", "7", "--retry-period=0.5"], ["--groups=7", "--retry-period=0.5"]),
        (["state_topic", "--broker=kafka-3", "--quick"], ["--quick", "--broker=kafka-3"]),
    ],
)
def test_a_benchmark_that_parses_its_own_arguments_gets_them_checked_and_in_its_syntax(
    argv: list[str], handed_on: list[str]
) -> None:
    (invocation,) = runner.parse(argv) or []
    assert runner._legacy_argv(invocation.name, invocation.options) == handed_on


def test_all_runs_every_benchmark_with_its_defaults_or_its_quick_variant() -> None:
    invocations = runner.parse(["all", "--quick"]) or []
    assert [i.name for i in invocations] == list(runner.BENCHMARKS)
    options = {i.name: i.options for i in invocations}
    assert options["member"].quick is True
    assert runner._legacy_argv("jobs", options["jobs"]) == ["--quick"]
    # No quick variant: its defaults.
    assert runner._legacy_argv("failover", options["failover"]) == []
    assert isinstance(options["failover"], argparse.Namespace)
