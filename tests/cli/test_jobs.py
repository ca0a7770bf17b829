"""``kgo snapshot | restore | compact`` as a user runs them against ``kgo dev up``: the jobs
with ``kgo groups``' options, checked before Spark starts, with one progress display, the
write convention of resets (``--execute``), and Ctrl-C as one line, exit 130 and nothing left.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from kafka_group_operator import cli
from kafka_group_operator.commands import jobs
from tests.cli.conftest import ROOT, DevSetup, kgo

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.slow]

PROGRESS = re.compile(r"^reading kafka-group-operator\.group-state: \d+/\d+ partitions done, ")
SUPPORTED = "file://, pvc://, s3a://, s3://, hdfs://, gs://, abfs://, abfss://, or a path"


def test_the_jobs_are_kgo_commands() -> None:
    for name in ("snapshot", "restore", "compact"):
        assert cli.COMMANDS[name].extra == "spark"
        assert kgo(name, "--help").code == 0


def test_wrong_invocations_fail_in_one_line_before_a_job_starts(
    dev: DevSetup, tmp_path: Path
) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "manifest.json").write_text("{}")
    taken = (tmp_path / "taken").as_uri()
    missing = (tmp_path / "nothing").as_uri()
    url = dev.env["KGO_COORDINATOR_URL"]
    cases = [
        (
            ["snapshot", "shop.orders", "--location", "ftp://host/snaps"],
            2,
            f"kgo snapshot: --location ftp://host/snaps: the scheme 'ftp' is not a supported "
            f"storage ({SUPPORTED})",
        ),
        (
            ["snapshot", "shop.orders", "--location", taken],
            1,
            f"kgo snapshot: --location {taken} already exists and is not empty: choose another "
            "location, or pass --overwrite to replace it",
        ),
        (
            ["snapshot", "shop.orders", "--location", "/sys/kgo-snapshot"],
            1,
            "kgo snapshot: --location file:///sys/kgo-snapshot: cannot write in /sys: "
            "Permission denied",
        ),
        (
            [
                "snapshot",
                "shop.orders",
                "--location",
                str(tmp_path / "s"),
                "--as-of",
                "2026-11-21T12:00",
            ],
            2,
            "kgo snapshot: --as-of: the time '2026-11-21T12:00' names no zone: write "
            "2026-11-21T12:00Z for UTC or 2026-11-21T12:00+01:00 for an offset from it "
            "(kafka-consumer-groups.sh would read it as UTC, not local time)",
        ),
        (
            ["snapshot", "--group", "", "--location", str(tmp_path / "s")],
            2,
            "kgo snapshot: the group id must not be empty",
        ),
        (
            ["restore", "shop.orders", "--snapshot", missing],
            1,
            f"kgo restore: snapshot {missing} not found: no such directory",
        ),
        (
            ["restore", "shop.orders", "--to-earliest", "--execute", "--token", ""],
            2,
            f"kgo restore: the coordinator at {url} needs the group's token: pass --token or "
            "set KGO_GROUP_TOKEN",
        ),
        (
            ["compact", "--location", "ftp://host/ckpt"],
            2,
            f"kgo compact: --location ftp://host/ckpt: the scheme 'ftp' is not a supported "
            f"storage ({SUPPORTED})",
        ),
    ]
    for argv, code, message in cases:
        run = dev.kgo(*argv)
        assert (run.code, run.stdout, run.stderr) == (code, "", message + "\n"), argv
    # Checked here, in kgo, not by a job: nothing Spark was imported.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom kafka_group_operator import cli\ncode = cli.main(sys.argv[1:])\n"
            "print('pyspark' in sys.modules, 'kafka_group_jobs' in sys.modules)",
            "snapshot", "shop.orders", "--location", "ftp://host/snaps",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )  # fmt: skip
    assert probe.stdout == "False False\n"


def test_snapshot_restore_and_compact(dev: DevSetup, tmp_path: Path) -> None:
    written = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-offset", "100", "--topic", "orders",
        "--execute",
    )  # fmt: skip
    assert written.code == 0, written.stderr
    location = tmp_path / "snaps" / "orders-1"
    snapshot = dev.kgo("snapshot", "shop.orders", "--location", str(location))
    assert snapshot.code == 0, snapshot.stderr
    lines = snapshot.stdout.splitlines()
    assert lines[0] == f"snapshot of group shop.orders written to {location.as_uri()}"
    assert [line.split() for line in lines[3:]] == [
        ["orders", str(p), "100", str(end), str(end - 100)]
        for p, end in enumerate([167, 167, 167, 167, 166, 166])
    ]
    # One progress display: the job's own lines, none of Spark's.
    assert all(PROGRESS.match(line) for line in snapshot.stderr.splitlines()), snapshot.stderr
    manifest = json.loads((location / "manifest.json").read_text())
    assert (manifest["group"], manifest["records"]) == ("shop.orders", 6)
    assert sorted(p.name for p in location.parent.iterdir()) == ["orders-1"]  # no staging left

    moved = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-latest", "--topic", "orders", "--execute"
    )
    assert moved.code == 0, moved.stderr
    plan = dev.kgo("restore", "shop.orders", "--snapshot", str(location))
    assert plan.code == 0, plan.stderr
    assert plan.stdout.splitlines()[-1] == (
        "6 partitions, 0 clamped; dry run: nothing written; add --execute to write 6 offset(s)"
    )
    unchanged = dev.kgo("groups", "export", "shop.orders", "--file", "-")
    assert unchanged.stdout == "".join(
        f"orders,{p},{end}\n" for p, end in enumerate([167, 167, 167, 167, 166, 166])
    )

    executed = dev.kgo(
        "restore", "--group", "shop.orders", "--snapshot", location.as_uri(), "--execute",
        "-o", "json",
    )  # fmt: skip
    assert executed.code == 0, executed.stderr
    audit = json.loads(executed.stdout)
    assert (audit["dryRun"], audit["fence"]) == (False, "coordinator")
    assert [p["newOffset"] for p in audit["partitions"]] == [100] * 6
    back = dev.kgo("groups", "export", "shop.orders", "--file", "-")
    assert back.stdout == "".join(f"orders,{p},100\n" for p in range(6))

    checkpoint = tmp_path / "checkpoints" / "1"
    compacted = dev.kgo("compact", "--location", str(checkpoint), "-o", "json")
    assert compacted.code == 0, compacted.stderr
    assert json.loads(compacted.stdout)["fence"] == "coordinator"
    assert (checkpoint / "checkpoint.json").is_file()


def _descendants(pid: int) -> list[int]:
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        found += [int(child), *_descendants(int(child))]
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


# Ctrl-C, and a `kill` (or a container stopping): the same stop. Ctrl-C also when the
# command was started with SIGINT ignored, as a script's `&` starts it (and as this test's own
# process may have been started): kgo's handler is its own, whatever it inherited.
@pytest.mark.parametrize(
    ("signum", "inherited"),
    [
        (signal.SIGINT, signal.SIG_DFL),
        (signal.SIGINT, signal.SIG_IGN),
        (signal.SIGTERM, signal.SIG_DFL),
    ],
    ids=["sigint", "sigint-ignored-at-start", "sigterm"],
)
def test_ctrl_c_stops_the_job_in_one_line_and_leaves_nothing(
    dev: DevSetup, tmp_path: Path, signum: signal.Signals, inherited: signal.Handlers
) -> None:
    location = tmp_path / "snaps" / "interrupted"
    # Every process the job starts inherits it: none may be left once the job has ended.
    mark = uuid.uuid4().hex
    process = subprocess.Popen(
        [sys.executable, "-m", "kafka_group_operator", "snapshot", "shop.orders",
         "--location", str(location)],
        env={**os.environ, **dev.env, "KGO_TEST_MARK": mark},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
    )  # fmt: skip
    try:
        # Interrupted once the job's JVM runs: Spark is started, the case that used to print
        # a traceback per Spark worker.
        deadline = time.monotonic() + 120
        jvm = None
        while jvm is None:
            assert time.monotonic() < deadline, "the job's JVM never started"
            assert process.poll() is None, process.communicate()
            jvm = next((p for p in _descendants(process.pid) if "java" in _command(p)), None)
            time.sleep(0.1)
        process.send_signal(signum)  # SIGINT: what Ctrl-C sends to the foreground process
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert (process.returncode, stdout) == (130, "")
    lines = stderr.splitlines()
    assert lines[-1] == "kgo snapshot: interrupted: nothing written"
    assert all(PROGRESS.match(line) for line in lines[:-1]), stderr
    assert not location.exists()
    assert not location.parent.exists() or not list(location.parent.iterdir())
    # The job and its JVM are gone with it (Spark's JVM runs in a session of its own: nothing
    # ends it by itself), and so is anything else it started.
    deadline = time.monotonic() + 60
    while Path(f"/proc/{jvm}").exists() and "java" in _command(jvm):
        assert time.monotonic() < deadline, "the JVM outlived its job"
        time.sleep(0.1)
    while left := _marked(mark):
        assert time.monotonic() < deadline, f"outlived the job: {[_command(p) for p in left]}"
        time.sleep(0.1)


def _marked(mark: str) -> list[int]:
    """The processes whose environment carries ``KGO_TEST_MARK=mark``."""
    wanted = f"KGO_TEST_MARK={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_one_line_updated_in_place_on_a_terminal() -> None:
    out = Terminal()
    progress = jobs.Progress("kgo snapshot", out)
    progress.status("kgo snapshot: starting Spark")
    progress.follow(
        io.StringIO(
            "reading t: 0/2 partitions done, 0/10 records read\n"
            "warning: orders[0]: committed offset 7 is past the log end 5\n"
            "reading t: 2/2 partitions done, 10/10 records read\n"
            "kafka_group_jobs.snapshot: error: something refused\n"
        )
    )
    progress.clear()
    assert out.getvalue() == (
        "\r\x1b[Kkgo snapshot: starting Spark"
        "\r\x1b[Kkgo snapshot: reading t: 0/2 partitions done, 0/10 records read"
        "\r\x1b[Kwarning: orders[0]: committed offset 7 is past the log end 5\n"
        "\r\x1b[Kkgo snapshot: reading t: 2/2 partitions done, 10/10 records read"
        "\r\x1b[K"
    )
    assert progress.error == "something refused"
    # Not a terminal: the job's lines as they come, nothing rewritten.
    plain = io.StringIO()
    jobs.Progress("kgo snapshot", plain).follow(io.StringIO("reading t: 0/2 partitions done, x\n"))
    assert plain.getvalue() == "reading t: 0/2 partitions done, x\n"
