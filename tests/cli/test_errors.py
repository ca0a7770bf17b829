"""Every wrong invocation of ``kgo`` ends in one line on stderr and an exit code: 2 for a
usage error, 1 for a failure at run time; never a traceback, never a flood of client logs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import ROOT, DevSetup, kgo

USAGE, RUNTIME = 2, 1
BAD_CSV = "orders,0,12\norders,one,13\n"

# (argv, exit code, the whole stderr line as a regular expression); "{tmp}" is a directory of
# this test's own holding bad.csv and bad-groups.json.
WITHOUT_SERVICES: list[tuple[list[str], int, str]] = [
    ([], USAGE, r"kgo: the following arguments are required: COMMAND \(see 'kgo --help'\)"),
    (["nosuch"], USAGE, r"kgo: argument COMMAND: invalid choice: 'nosuch' \(choose from .*"),
    (["--nosuch"], USAGE, r"kgo: the following arguments are required: COMMAND .*"),
    (["describe"], USAGE, r"kgo describe: name the group: GROUP or --group GROUP"),
    (["describe", "--group", ""], USAGE, r"kgo describe: the group id must not be empty"),
    (
        ["describe", "a", "--group", "b"],
        USAGE,
        r"kgo describe: one group at a time, not 'a', 'b'",
    ),
    (
        ["describe", "g", "--json"],
        USAGE,
        r"kgo: unrecognized arguments: --json \(see 'kgo --help'\)",
    ),
    (
        ["describe", "g", "--coordinator", "ftp://x"],
        USAGE,
        r"kgo describe: --coordinator: not an http\(s\) URL: 'ftp://x'",
    ),
    (
        ["describe", "g", "--coordinator", "http://127.0.0.1:1"],
        RUNTIME,
        r"kgo describe: cannot reach the coordinator at http://127.0.0.1:1: .*refused",
    ),
    (["groups"], USAGE, r"kgo groups: the following arguments are required: ACTION .*"),
    (["groups", "drop", "g"], USAGE, r"kgo groups: argument ACTION: invalid choice: 'drop' .*"),
    (
        ["groups", "list", "--coordinator", "notaurl"],
        USAGE,
        r"kgo groups list: --coordinator: not an http\(s\) URL: 'notaurl'",
    ),
    (
        ["groups", "list", "--coordinator", "http://127.0.0.1:1"],
        RUNTIME,
        r"kgo groups list: cannot reach the coordinator at http://127.0.0.1:1: .*refused",
    ),
    (
        ["groups", "describe", "g", "--members", "--state"],
        USAGE,
        r"kgo groups describe: argument --state: not allowed with argument --members .*",
    ),
    (
        ["groups", "describe", "g", "-o", "xml"],
        USAGE,
        r"kgo groups describe: argument -o/--output: invalid choice: 'xml' .*",
    ),
    (
        ["groups", "reset-offsets", "g", "--topic", "orders"],
        USAGE,
        r"kgo groups reset-offsets: one of the arguments --to-earliest --to-latest --to-current "
        r"--to-offset "
        r"--to-datetime --by-duration --shift-by --from-file is required .*",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-earliest"],
        USAGE,
        r"kgo groups reset-offsets: name the partitions: --topic T\[:P,...\] or --all-topics",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-earliest", "--to-latest", "--topic", "t"],
        USAGE,
        r"kgo groups reset-offsets: argument --to-latest: not allowed with argument "
        r"--to-earliest .*",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-earliest", "--topic", "t", "--dry-run", "--execute"],
        USAGE,
        r"kgo groups reset-offsets: argument --execute: not allowed with argument --dry-run .*",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-earliest", "--topic", "orders:x"],
        USAGE,
        r"kgo groups reset-offsets: --topic: expected TOPIC:P\[,P...\] with partition numbers, "
        r"got 'orders:x'",
    ),
    (
        ["groups", "reset-offsets", "g", "--by-duration", "1h", "--topic", "t"],
        USAGE,
        r"kgo groups reset-offsets: not an ISO-8601 duration \(PnDTnHnMnS\): '1h'",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-datetime", "yesterday", "--topic", "t"],
        USAGE,
        r"kgo groups reset-offsets: not an ISO-8601 time \(e.g. 2026-11-21T12:00:00Z\): "
        r"'yesterday'",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-offset", "-5", "--topic", "t"],
        USAGE,
        r"kgo groups reset-offsets: --to-offset must not be negative",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-offset", "five", "--topic", "t"],
        USAGE,
        r"kgo groups reset-offsets: argument --to-offset: invalid int value: 'five' .*",
    ),
    (
        ["groups", "reset-offsets", "g", "--from-file", "{tmp}/missing.csv"],
        USAGE,
        r"kgo groups reset-offsets: cannot read {tmp}/missing.csv: No such file or directory",
    ),
    (
        ["groups", "import", "g", "--file", "{tmp}/bad.csv"],
        USAGE,
        r"kgo groups import: {tmp}/bad.csv: line 2: partition and offset must be numbers: "
        r"'orders,one,13'",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-earliest", "--topic", "t", "--bootstrap", ""],
        USAGE,
        r"kgo groups reset-offsets: --bootstrap is required \(or set KAFKA_BOOTSTRAP_SERVERS\)",
    ),
    (
        ["groups", "wait", "g", "--members", "-1"],
        USAGE,
        r"kgo groups wait: --members must be >= 0",
    ),
    (
        ["groups", "wait", "g", "--members", "1", "--timeout", "soon"],
        USAGE,
        r"kgo groups wait: argument --timeout: not a duration \(5000, 5000ms, 30s, 2m\): "
        r"'soon' .*",
    ),
    (
        ["groups", "describe"],
        USAGE,
        r"kgo groups describe: name the group: GROUP or --group GROUP or --all-groups",
    ),
    (
        ["groups", "describe", "g", "--all-groups"],
        USAGE,
        r"kgo groups describe: --all-groups and a group name exclude each other",
    ),
    (
        ["groups", "--describe", "--delete", "--group", "g"],
        USAGE,
        r"kgo groups: Command must include exactly one action: --list, --describe, "
        r"--reset-offsets, --delete, --delete-offsets",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-datetime", "2026-11-21T12:00:00", "--topic", "t"],
        USAGE,
        r"kgo groups reset-offsets: the time '2026-11-21T12:00:00' names no zone: write "
        r"2026-11-21T12:00:00Z for UTC or 2026-11-21T12:00:00\+01:00 for an offset from it "
        r"\(kafka-consumer-groups.sh would read it as UTC, not local time\)",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-earliest", "--topic", "t", "--wait"],
        USAGE,
        r"kgo groups reset-offsets: --wait waits to write: it needs --execute",
    ),
    (
        ["groups", "reset-offsets", "g", "--to-earliest", "--topic", "t", "--export", "-o", "json"],
        USAGE,
        r"kgo groups reset-offsets: --export prints Kafka's CSV: it excludes -o",
    ),
    (
        ["groups", "delete-offsets", "g"],
        USAGE,
        r"kgo groups delete-offsets: name the offsets to delete: --topic T\[:P,...\]",
    ),
    (
        ["coordinator", "--bootstrap", "127.0.0.1:1", "--tokens", "{tmp}/tokens.json"],
        USAGE,
        r"kgo coordinator: cannot read the tokens file {tmp}/tokens.json: \[Errno 2\] "
        r"No such file or directory: '{tmp}/tokens.json'",
    ),
    (
        ["coordinator", "--bootstrap", "127.0.0.1:1", "--groups", "{tmp}/bad-groups.json"],
        USAGE,
        r"kgo coordinator: {tmp}/bad-groups.json must hold a JSON object \{group: settings\}",
    ),
    (
        ["coordinator", "--bootstrap", "127.0.0.1:1", "--log-level", "loud"],
        USAGE,
        r"kgo coordinator: argument --log-level: invalid choice: 'LOUD' .*",
    ),
    (
        ["coordinator", "--bootstrap", "127.0.0.1:1", "--port", "70000"],
        USAGE,
        r"kgo coordinator: --port must be between 1 and 65535, not 70000",
    ),
    (
        # Checked before the runtime starts: one line, not its clients' connection errors.
        ["coordinator", "--bootstrap", "127.0.0.1:1"],
        RUNTIME,
        r"kgo coordinator: cannot read metadata from Kafka at 127.0.0.1:1: "
        r"Failed to get metadata: Local: Broker transport failure",
    ),
    (
        ["generate-chart-crds", "--root", "{tmp}"],
        USAGE,
        r"kgo generate-chart-crds: no crds/ under {tmp}",
    ),
    (["dev"], USAGE, r"kgo dev: the following arguments are required: ACTION .*"),
    (
        ["dev", "up", "--partitions", "0"],
        USAGE,
        r"kgo dev up: --partitions must be >= 1 and --messages >= 0",
    ),
]


def assert_one_line(argv: list[str], code: int, pattern: str, env: dict[str, str]) -> None:
    run = kgo(*argv, env=env)
    assert "Traceback" not in run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert re.fullmatch(pattern, run.stderr.rstrip("\n")), run.stderr
    assert (run.code, run.stdout) == (code, "")


@pytest.mark.parametrize(
    ("argv", "code", "pattern"),
    [pytest.param(*case, id=" ".join(case[0]) or "(none)") for case in WITHOUT_SERVICES],
)
def test_wrong_invocation(argv: list[str], code: int, pattern: str, tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text(BAD_CSV)
    (tmp_path / "bad-groups.json").write_text("[1, 2]")
    tmp = str(tmp_path)
    env = {"KGO_DEV_DIR": tmp, "KAFKA_BOOTSTRAP_SERVERS": "", "KGO_COORDINATOR_URL": ""}
    assert_one_line(
        [arg.replace("{tmp}", tmp) for arg in argv],
        code,
        pattern.replace("{tmp}", re.escape(tmp)),
        env,
    )


# Against a running `kgo dev up`: its environment, with the changes given.
WITH_SERVICES: list[tuple[list[str], int, str]] = [
    (
        # Whether other.group exists is told only to its token's holder; the token's own
        # group is named, which is the caller's to know.
        ["groups", "describe", "other.group"],
        RUNTIME,
        r"kgo groups describe: GROUP_AUTHORIZATION_FAILED: the token is not valid for group "
        r"'other.group' \(this token is for 'shop.orders'\)",
    ),
    (
        ["groups", "describe", "shop.orders", "--token", "wrong"],
        RUNTIME,
        r"kgo groups describe: GROUP_AUTHORIZATION_FAILED: the token is not valid for group "
        r"'shop.orders'",
    ),
    (
        ["groups", "export", "shop.orders", "--file", "-"],
        RUNTIME,
        r"kgo groups export: group 'shop.orders' has no committed offsets",
    ),
    (
        ["groups", "reset-offsets", "shop.orders", "--to-earliest", "--topic", "nosuch"],
        RUNTIME,
        r"kgo groups reset-offsets: topic 'nosuch' does not exist",
    ),
    (
        ["groups", "reset-offsets", "shop.orders", "--to-earliest", "--topic", "orders:2,99"],
        RUNTIME,
        r"kgo groups reset-offsets: topic 'orders' has no partition 99",
    ),
    (
        ["groups", "reset-offsets", "shop.orders", "--shift-by", "5", "--topic", "orders"],
        RUNTIME,
        r"kgo groups reset-offsets: Cannot shift offset for partition orders-0 since there is "
        r"no current committed offset",
    ),
    (
        ["groups", "wait", "shop.orders", "--members", "2", "--timeout", "1s"],
        RUNTIME,
        r"kgo groups wait: group shop.orders did not settle with 2 member\(s\) within 1s "
        r"\(last: 0 member\(s\), state Empty\)",
    ),
    (
        # A wrong token opens no group: refused, not an empty list.
        ["groups", "list", "--token", "wrong"],
        RUNTIME,
        r"kgo groups list: GROUP_AUTHORIZATION_FAILED: the token is not valid for any group "
        r"this coordinator serves",
    ),
    (
        ["groups", "list", "--token", ""],
        RUNTIME,
        r"kgo groups list: the coordinator at http://127.0.0.1:\d+ needs a token: pass --token "
        r"or set KGO_GROUP_TOKEN",
    ),
    (
        ["describe", "shop.orders", "--token", ""],
        RUNTIME,
        r"kgo describe: the coordinator at http://127.0.0.1:\d+ needs a token: pass --token "
        r"or set KGO_GROUP_TOKEN",
    ),
]


@pytest.mark.broker
@pytest.mark.parametrize(
    ("argv", "code", "pattern"),
    [pytest.param(*case, id=" ".join(case[0])) for case in WITH_SERVICES],
)
def test_wrong_invocation_against_a_running_group(
    argv: list[str], code: int, pattern: str, dev: DevSetup
) -> None:
    assert_one_line(argv, code, pattern, dev.env)


@pytest.mark.broker
def test_an_unreachable_bootstrap_is_one_line_not_a_flood_of_client_logs(dev: DevSetup) -> None:
    run = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-earliest", "--topic", "orders",
        "--bootstrap", "127.0.0.1:1",
    )  # fmt: skip
    assert run.code == RUNTIME
    assert run.stdout == ""
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith(
        "kgo groups reset-offsets: cannot read metadata from Kafka at 127.0.0.1:1: "
    )


def test_the_example_consumer_without_its_environment_is_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KGO_", "KAFKA_"))}
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "consumer.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (run.returncode, run.stdout, run.stderr) == (
        1,
        "",
        "consumer: environment variable KGO_GROUP_ID is not set\n",
    )


# Modules that take a second or more to import; a wrong invocation must fail before any.
HEAVY = ("kopf", "aiohttp", "kubernetes_asyncio", "pyspark", "confluent_kafka", "uvloop")
PROBE = """
import sys
from kafka_group_operator import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as exit:  # argparse's errors
    code = exit.code
print(" ".join(name for name in {heavy!r} if name in sys.modules))
sys.exit(code)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["operator", "--nosuch"],
        ["coordinator", "--bootstrap", "127.0.0.1:1", "--port", "70000"],
        ["gateway", "--nosuch"],
        ["dev", "up", "--partitions", "0"],
        ["groups", "reset-offsets", "g", "--to-datetime", "2026-11-21T12:00", "--topic", "t"],
        ["groups", "describe"],
        ["describe", "--group", ""],
    ],
    ids=" ".join,
)
def test_a_wrong_invocation_fails_before_any_heavy_import(argv: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == USAGE, run.stderr
    assert run.stdout == "\n", f"imported before failing: {run.stdout}"
