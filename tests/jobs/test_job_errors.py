"""Wrong invocations of the jobs, as a user types them: one stderr line and an exit code.

Each job runs as ``python -m kafka_group_jobs.<job>``, the way spark-submit, the operator and
people run it. Usage errors exit 2, runtime errors 1, with exactly one line on stderr and
nothing on stdout. None of these starts Spark: a JVM a job starts writes its output to a log
file in the temporary directory, which a failure keeps, so ``run_job`` fails if one appears in
the job's own temporary directory (a check that came too late).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_group_jobs import fence, progress, source, topics
from kafka_group_operator.commands import demo
from kafka_group_operator.embedded import broker as embedded

REFUSED = "127.0.0.1:1"  # nothing listens on port 1 of loopback


def run_job(job: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """The job in a new interpreter, with a temporary directory of its own: no Spark log may
    appear in it (Spark was never started)."""
    with tempfile.TemporaryDirectory(prefix="kgo-job-") as scratch:
        done = subprocess.run(
            [sys.executable, "-m", f"kafka_group_jobs.{job}", *arguments],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "TMPDIR": scratch},
        )
        assert not list(Path(scratch).glob("kgo-spark-*")), "Spark was started"
    return done


def assert_one_line(
    done: subprocess.CompletedProcess[str], job: str, message: str, code: int
) -> None:
    assert (done.returncode, done.stdout, done.stderr) == (
        code,
        "",
        f"kafka_group_jobs.{job}: error: {message}\n",
    )


WITHOUT_BROKER: list[tuple[str, list[str], str, int]] = [
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "snapshot"],
        "--to snapshot needs --snapshot URI",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--to", "earliest"],
        "the following arguments are required: --group",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "earliest", "--dryrun"],
        "unrecognized arguments: --dryrun",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "offset"],
        "--to offset needs --value",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "shift-by", "--value", "x"],
        "argument --value: invalid int value: 'x'",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "datetime", "--datetime", "yesterday"],
        "not an ISO-8601 time: 'yesterday'",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "duration", "--duration", "1h"],
        "not an ISO-8601 duration (PnDTnHnMnS): '1h'",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "earliest", "--partitions", "orders"],
        "--partitions: expected TOPIC:P[,P...], got 'orders'",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "earliest", "--kafka-config", "{x"],
        "--kafka-config is not JSON: Expecting property name enclosed in double quotes:"
        " line 1 column 2 (char 1)",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "latest", "--coordinator-url", "c:80"],
        "--coordinator-url: not an http(s) URL: c:80",
        2,
    ),
    (
        "restore",
        ["--bootstrap", "broker:x", "--group", "g", "--to", "latest"],
        "--bootstrap: 'broker:x' is not HOST:PORT",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "earliest", "--dry-run"],
        "cannot reach any Kafka bootstrap server (127.0.0.1:1: Connection refused)",
        1,
    ),
    (
        # Only the coordinator writes the state topic: no fallback that appends commits.
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "earliest", "--execute"],
        "a restore is applied by the coordinator, and none was named: start one (in a cluster"
        " the operator is one; locally `kgo coordinator --bootstrap B --topic T --tokens FILE`)"
        " and pass --coordinator-url URL with the group's --token, or leave out --execute to"
        " only plan",
        1,
    ),
    (
        "compaction",
        ["--bootstrap", REFUSED, "--output", "file:///ckpt", "--coordinator-url", "http://c:80"],
        "--coordinator-url needs --group: its token authenticates",
        2,
    ),
    (
        "snapshot",
        ["--bootstrap", REFUSED, "--group", "g", "--output", "file:///snaps/x", "--as-of", "now"],
        "not an ISO-8601 time: 'now'",
        2,
    ),
    (
        "snapshot",
        ["--bootstrap", REFUSED, "--group", "g"],
        "the following arguments are required: --output",
        2,
    ),
    (
        # Hadoop knows ftp://, and a job found out minutes later by timing out.
        "snapshot",
        ["--bootstrap", REFUSED, "--group", "g", "--output", "ftp://host/snaps"],
        "output ftp://host/snaps: the scheme 'ftp' is not a supported storage (file://, pvc://,"
        " s3a://, s3://, hdfs://, gs://, abfs://, abfss://, or a path)",
        2,
    ),
    (
        # Writable by permissions (as root), not in fact: the check writes.
        "snapshot",
        ["--bootstrap", REFUSED, "--group", "g", "--output", "file:///sys/kgo-snapshot"],
        "output file:///sys/kgo-snapshot: cannot write in /sys: Permission denied",
        1,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "g", "--to", "latest", "--dry-run", "--execute"],
        "argument --execute: not allowed with argument --dry-run",
        2,
    ),
    (
        "snapshot",
        ["--bootstrap", REFUSED, "--group", "", "--output", "file:///snaps/x"],
        "--group must not be empty",
        2,
    ),
    (
        "snapshot",
        ["--bootstrap", REFUSED, "--group", "g" * 40_000, "--output", "file:///snaps/x"],
        "--group is not a Kafka group id: string of 40000 bytes exceeds Kafka's 32767",
        2,
    ),
    (
        "restore",
        ["--bootstrap", REFUSED, "--group", "\udcff", "--to", "latest", "--dry-run"],
        "--group is not a Kafka group id: string is not encodable as UTF-8: surrogates not allowed",
        2,
    ),
    (
        "compaction",
        ["--bootstrap", REFUSED, "--output", "file:///c", "--kafka-config-dir", "/no/such/dir"],
        "--kafka-config-dir: no directory /no/such/dir",
        2,
    ),
    (
        # Retention is the coordinator's rule alone: compaction takes none.
        "compaction",
        ["--bootstrap", REFUSED, "--output", "file:///c", "--default-retention-ms", "1"],
        "unrecognized arguments: --default-retention-ms 1",
        2,
    ),
]


@pytest.mark.parametrize(
    ("job", "arguments", "message", "code"),
    WITHOUT_BROKER,
    ids=[f"{job}:{message[:40]}" for job, _, message, _ in WITHOUT_BROKER],
)
def test_a_wrong_invocation_is_one_line_and_an_exit_code(
    job: str, arguments: list[str], message: str, code: int
) -> None:
    assert_one_line(run_job(job, *arguments), job, message, code)


def test_a_snapshot_path_that_does_not_exist_fails_before_spark(tmp_path: Path) -> None:
    missing = (tmp_path / "nightly").as_uri()
    done = run_job(
        "restore", "--bootstrap", REFUSED, "--group", "g", "--to", "snapshot", "--snapshot", missing
    )
    assert_one_line(done, "restore", f"snapshot {missing} not found: no such directory", 1)
    (tmp_path / "nightly").mkdir()
    done = run_job(
        "restore", "--bootstrap", REFUSED, "--group", "g", "--to", "snapshot", "--snapshot", missing
    )
    assert_one_line(done, "restore", f"snapshot {missing} not found: no manifest.json in it", 1)


def test_an_output_under_a_file_fails_before_spark(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    output = (tmp_path / "taken" / "snap").as_uri()
    done = run_job("snapshot", "--bootstrap", REFUSED, "--group", "g", "--output", output)
    assert_one_line(
        done, "snapshot", f"output {output}: {tmp_path / 'taken'} is a file, not a directory", 1
    )


def test_a_snapshot_is_never_overwritten_unless_asked(tmp_path: Path) -> None:
    (tmp_path / "nightly").mkdir()
    (tmp_path / "nightly" / "manifest.json").write_text("{}")
    output = (tmp_path / "nightly").as_uri()
    snapshot = ["--bootstrap", REFUSED, "--group", "g", "--output", output]
    assert_one_line(
        run_job("snapshot", *snapshot),
        "snapshot",
        f"output {output} already exists and is not empty: choose another location, or pass"
        " --overwrite to replace it",
        1,
    )
    # Asked for, the location passes: the next check (the broker) is what fails here.
    assert_one_line(
        run_job("snapshot", *snapshot, "--overwrite"),
        "snapshot",
        "cannot reach any Kafka bootstrap server (127.0.0.1:1: Connection refused)",
        1,
    )
    assert (tmp_path / "nightly" / "manifest.json").read_text() == "{}"


@pytest.mark.broker
def test_a_missing_state_topic_is_one_line(broker: embedded.EmbeddedBroker, tmp_path: Path) -> None:
    done = run_job(
        "snapshot",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        "no-such-state-topic",
        "--group",
        "g",
        "--output",
        (tmp_path / "s").as_uri(),
    )
    assert_one_line(done, "snapshot", "topic 'no-such-state-topic' does not exist", 1)


@pytest.fixture
def coordinated(broker: embedded.EmbeddedBroker, tmp_path: Path) -> Iterator[demo.LocalGroup]:
    """A standalone coordinator serving one group on the shared broker (no member yet)."""
    suffix = uuid.uuid4().hex[:8]
    group = demo.LocalGroup(
        group=f"payments-{suffix}",
        topic=f"orders-{suffix}",
        partitions=2,
        state_partitions=2,
        directory=tmp_path / "group",
    )
    group.directory.mkdir()
    group.start(broker)
    try:
        yield group
    finally:
        group.stop()


def restore_through(group: demo.LocalGroup, *extra: str) -> subprocess.CompletedProcess[str]:
    assert group.broker is not None
    return run_job(
        "restore",
        "--bootstrap", group.broker.bootstrap, "--topic", group.state_topic,
        "--group", group.group, "--to", "earliest", "--topics", group.topic,
        "--coordinator-url", group.coordinator_url, *extra,
    )  # fmt: skip


@pytest.mark.broker
def test_the_coordinator_refuses_before_spark_starts(coordinated: demo.LocalGroup) -> None:
    group = coordinated
    assert_one_line(
        restore_through(group, "--token", "not-the-token"),
        "restore",
        f"the coordinator at {group.coordinator_url} refused the token for group"
        f" {group.group!r} (GROUP_AUTHORIZATION_FAILED)",
        1,
    )
    assert_one_line(
        restore_through(group),
        "restore",
        f"the coordinator at {group.coordinator_url} needs the token of group {group.group!r}:"
        " pass --token or set KGO_GROUP_TOKEN",
        1,
    )
    group.start_member("orders-0")
    group.wait_settled({"orders-0"}, timeout=60)
    assert_one_line(
        restore_through(group, "--token", group.token, "--execute"),
        "restore",
        f"group {group.group!r} has 1 active members (state Stable): the coordinator takes a"
        " restore only while the group is empty or paused for a reset; stop the members (scale"
        " to 0) or pause the group, then retry",
        1,
    )


@contextlib.contextmanager
def not_kafka() -> Iterator[str]:
    """A loopback port that accepts connections and closes them at once: no Kafka behind it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                connection, _ = server.accept()
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        server.close()


def test_the_kafka_clients_own_log_is_one_summary_not_a_flood(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """librdkafka logs every failed attempt to stderr itself; the jobs' clients do not."""
    with not_kafka() as bootstrap, pytest.raises(topics.TopicError) as failure:
        topics.partition_count(bootstrap, "state", {"socket.connection.setup.timeout.ms": "1000"})
    # Only lines naming this address count: clients of brokers that earlier tests in this
    # process stopped may still be reconnecting on the same stderr.
    assert not re.search(rf"{re.escape(bootstrap)}\b", capfd.readouterr().err)
    message = str(failure.value)
    assert "\n" not in message
    assert message.startswith("cannot describe topic 'state': ")
    assert " (the Kafka client logged " in message
    assert " lines; the last: " in message


def test_a_wrong_invocation_fails_before_pyspark_is_even_imported() -> None:
    """Importing pyspark takes a second or more: the checks come first."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kafka_group_jobs.restore", "--bootstrap",
         REFUSED, "--group", "g", "--to", "latest"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    imported = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert any("confluent_kafka" in line for line in imported)  # the check did import the client
    assert not [line for line in imported if "pyspark" in line]


def test_progress_counts_finished_ranges_and_partitions() -> None:
    ranges = [
        source.OffsetRange(0, 0, 100),
        source.OffsetRange(0, 100, 150),
        source.OffsetRange(2, 10, 40),
    ]
    # Partition 1 has no records: done from the start.
    assert progress.progress_line("reading s", ranges, set(), 3) == (
        "reading s: 1/3 partitions done, 0/180 records read"
    )
    assert progress.progress_line("reading s", ranges, {0, 2}, 3) == (
        "reading s: 2/3 partitions done, 130/180 records read"
    )
    assert progress.progress_line("reading s", ranges, {0, 1, 2}, 3) == (
        "reading s: 3/3 partitions done, 180/180 records read"
    )


@pytest.mark.broker
def test_a_read_fence_the_coordinator_refuses_fails_before_spark_starts(
    coordinated: demo.LocalGroup, tmp_path: Path
) -> None:
    """The fence is taken before Spark starts: a wrong token is one line, exit 1."""
    group = coordinated
    assert group.broker is not None
    done = run_job(
        "snapshot",
        "--bootstrap", group.broker.bootstrap, "--topic", group.state_topic,
        "--group", group.group, "--output", (tmp_path / "s").as_uri(),
        "--coordinator-url", group.coordinator_url, "--token", "not-the-token",
    )  # fmt: skip
    assert_one_line(
        done,
        "snapshot",
        f"the coordinator at {group.coordinator_url} refused a read fence:"
        f" GROUP_AUTHORIZATION_FAILED: the token is not valid for group {group.group!r}",
        1,
    )


@pytest.mark.broker
def test_a_job_talks_to_the_coordinator_that_serves_its_group(
    coordinated: demo.LocalGroup,
) -> None:
    """A coordinator serving every partition names itself; a refused look-up keeps the URL
    (the job's real call then says why)."""
    group = coordinated
    given = fence.Coordinator(group.coordinator_url, group.group, group.token)
    assert fence.locate(given) == given
    refused = fence.Coordinator(group.coordinator_url, group.group, "not-the-token")
    assert fence.locate(refused) == refused
    nowhere = fence.Coordinator("http://127.0.0.1:9", group.group, group.token)
    assert fence.locate(nowhere) == nowhere


def test_a_coordinator_that_names_itself_is_reached_at_its_own_address() -> None:
    """Behind the chart's load-balanced Service, the replica that answers "I serve this
    group" is not the one the job's next connection reaches: the job uses the address the
    replica gave, not the Service's (on a real cluster every snapshot failed on
    NOT_COORDINATOR before)."""

    class Replica(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(
                {"partition": 7, "url": "http://replica-1.example:8080", "self": True}
            )
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Replica)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        service = fence.Coordinator(f"http://127.0.0.1:{server.server_port}", "g", "token")
        assert fence.locate(service) == fence.Coordinator(
            "http://replica-1.example:8080", "g", "token"
        )
    finally:
        server.shutdown()
        server.server_close()
