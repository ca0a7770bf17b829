"""``kgo snapshot | restore | compact``: the Spark jobs, with ``kgo groups``' vocabulary.

* ``snapshot GROUP --location URI [--as-of T] [--overwrite]``: the group's committed offsets
  to Parquet and a manifest;
* ``restore GROUP --snapshot URI`` (or a reset target: ``--to-earliest``, ``--to-latest``,
  ``--to-offset N``, ``--to-datetime T``, ``--by-duration D``, ``--shift-by N``), scoped with
  ``--topic T[:P,...]``: plans, and writes the plan through the coordinator only with
  ``--execute``, as ``kgo groups reset-offsets`` does;
* ``compact --location URI``: the state topic reduced to a loader checkpoint.

The options are ``kgo groups``' (``GROUP`` or ``--group``, ``--bootstrap`` or
``--bootstrap-server``, ``--coordinator``, ``--token``, ``-o table|json|yaml``), plus the
state topic (``--state-topic``, default ``$KGO_STATE_TOPIC`` or the operator's), the Spark
master (``--master``, default the tuned local one) and ``--spark-ui`` (off by default).

Everything that needs no Spark is checked here, before a job starts: the arguments, the times
(with their zone), the location (its scheme, that a local one can be written and holds no
snapshot yet, unless ``--overwrite``), the coordinator's URL and the token. The job then
checks the broker, the state topic and the coordinator, still before Spark starts.

The job runs as its own module (``python -m kafka_group_jobs.<job>``, as the operator runs
it): the operator never imports Spark. It runs in a session of its own; its lines come
through here: its progress as one line updated in place on a terminal (its own lines
elsewhere), its warnings, and its error as ``kgo <command>: ...``. Ctrl-C stops it (the job
stops Spark and removes what it staged; a job that does not stop within ``STOP_GRACE_S`` is
killed and its staging removed here), then ends in one line with exit code 130.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from kafka_group_operator.commands import common
from kafka_group_records import locations, resets, results

STOP_GRACE_S = 30.0
INTERRUPTED_EXIT = 130
_JOB_ERROR = re.compile(r"^kafka_group_jobs\.\w+: error: (?P<message>.*)$")
_PROGRESS = re.compile(r"^reading .*: \d+/\d+ partitions done, ")
# The job module of each command.
JOBS = {"snapshot": "snapshot", "restore": "restore", "compact": "compaction"}


def register_snapshot(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "snapshot", help="snapshot a group's committed offsets (Spark job)"
    )
    common.add_group_options(parser)
    parser.add_argument("--location", required=True, metavar="URI", help="where to write it")
    parser.add_argument("--as-of", metavar="T", help="the offsets as they stood then (with zone)")
    parser.add_argument(
        "--allow-empty", action="store_true", help="snapshot a group without offsets too"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace what is there")
    _add_job_options(parser, coordinator="asked for the read fence (default: none)")
    parser.set_defaults(func=run_snapshot)


def register_restore(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "restore", help="plan (default) or --execute a restore of a snapshot (Spark job)"
    )
    common.add_group_options(parser)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--snapshot", metavar="URI", help="the snapshot to restore")
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the log end")
    target.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    target.add_argument("--to-datetime", metavar="T", help="ISO-8601 time with its zone")
    target.add_argument("--by-duration", metavar="D", help="ISO-8601 duration ago, e.g. PT1H")
    target.add_argument("--shift-by", type=int, metavar="N", help="committed offset + N")
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="T[:P,...]",
        help="a topic, or some of its partitions (repeatable; default: all of the group's)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the plan only (default)")
    mode.add_argument("--execute", action="store_true", help="write the plan")
    parser.add_argument("--audit", metavar="URI", help="also write the audit JSON there")
    _add_job_options(parser, coordinator="which writes the plan (needed with --execute)")
    parser.set_defaults(func=run_restore)


def register_compact(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compact", help="compact the state topic into a loader checkpoint (Spark job)"
    )
    parser.add_argument(
        "group",
        nargs="?",
        metavar="GROUP",
        help="the group whose token authenticates the read fence, with --coordinator "
        "(default: $KGO_GROUP_ID)",
    )
    parser.add_argument("--group", dest="group_option", action="append", default=[])
    parser.set_defaults(many_groups=False)
    parser.add_argument("--location", required=True, metavar="URI", help="where to write it")
    parser.add_argument("--overwrite", action="store_true", help="replace what is there")
    _add_job_options(parser, coordinator="asked for the read fence (default: none)")
    parser.set_defaults(func=run_compact)


def _add_job_options(parser: argparse.ArgumentParser, coordinator: str) -> None:
    common.add_bootstrap_option(parser)
    parser.add_argument(
        "--state-topic",
        default=os.environ.get("KGO_STATE_TOPIC") or common.DEFAULT_STATE_TOPIC,
        help=f"the coordinator's state topic (default: $KGO_STATE_TOPIC or "
        f"{common.DEFAULT_STATE_TOPIC})",
    )
    parser.add_argument(
        "--coordinator",
        default=os.environ.get("KGO_COORDINATOR_URL") or None,
        help=f"the member API URL, {coordinator}; default: $KGO_COORDINATOR_URL",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("KGO_GROUP_TOKEN"),
        help="the group's bearer token (default: $KGO_GROUP_TOKEN)",
    )
    parser.add_argument("--master", help="Spark master (default: local[2], tuned to start fast)")
    parser.add_argument(
        "--spark-ui", action="store_true", help="serve Spark's web UI (off by default)"
    )
    parser.add_argument(
        "--kafka-config", metavar="JSON", help="extra librdkafka settings, a JSON object"
    )
    common.add_output_option(parser)


# ------------------------------------------------------------------------------ arguments


def absolute(uri: str) -> str:
    """A plain path made absolute (``backups/orders-1`` is under the current directory, as
    for any command), as a ``file://`` URI; anything else as given."""
    if "://" in uri or not uri:
        return uri
    return Path(uri).resolve().as_uri()


def _location(what: str, uri: str, overwrite: bool) -> None:
    problem = locations.scheme_problem(what, uri)
    if problem is not None:
        raise common.UsageError(problem)
    problem = locations.writable_problem(what, uri, overwrite)
    if problem is not None:
        raise common.CommandError(problem)


def _time(option: str, text: str) -> str:
    """A time with its zone (``resets.parse_time_ms``), as the job reads it: UTC, ``Z``."""
    try:
        moment = resets.parse_time_ms(text)
    except ValueError as error:
        raise common.UsageError(f"{option}: {error}") from None
    from datetime import UTC, datetime

    return (
        datetime.fromtimestamp(moment / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _coordinator(args: argparse.Namespace, needed: bool) -> list[str]:
    """The job's ``--coordinator-url``, checked: an http(s) URL, with the group's token."""
    url: str | None = args.coordinator
    if not url:
        if needed:
            url = common.DEFAULT_COORDINATOR
        else:
            return []
    if not re.match(r"^https?://[^/]", url):
        raise common.UsageError(f"--coordinator: not an http(s) URL: {url!r}")
    if not args.token:
        raise common.UsageError(
            f"the coordinator at {url} needs the group's token: {common.MISSING_TOKEN}"
        )
    return ["--coordinator-url", url]


def _common(args: argparse.Namespace) -> list[str]:
    argv = ["--bootstrap", common.required_bootstrap(args), "--topic", args.state_topic]
    if args.master:
        argv += ["--master", args.master]
    if args.spark_ui:
        argv.append("--spark-ui")
    if args.kafka_config:
        argv += ["--kafka-config", args.kafka_config]
    if args.output != "table":
        argv.append("--json")
    return argv


def snapshot_argv(args: argparse.Namespace) -> list[str]:
    group = common.group_of(args)
    args.location = absolute(args.location)
    argv = [*_common(args), "--group", group, "--output", args.location]
    _location("--location", args.location, args.overwrite)
    if args.as_of:
        argv += ["--as-of", _time("--as-of", args.as_of)]
    if args.allow_empty:
        argv.append("--allow-empty")
    if args.overwrite:
        argv.append("--overwrite")
    return argv + _coordinator(args, needed=False)


def restore_argv(args: argparse.Namespace) -> list[str]:
    group = common.group_of(args)
    argv = [*_common(args), "--group", group]
    if args.snapshot is not None:
        args.snapshot = absolute(args.snapshot)
        problem = locations.scheme_problem("--snapshot", args.snapshot)
        if problem is not None:
            raise common.UsageError(problem)
        problem = locations.readable_problem("snapshot", args.snapshot, "manifest.json")
        if problem is not None:
            raise common.CommandError(problem)
        argv += ["--to", "snapshot", "--snapshot", args.snapshot]
    elif args.to_earliest or args.to_latest:
        argv += ["--to", "earliest" if args.to_earliest else "latest"]
    elif args.to_offset is not None:
        if args.to_offset < 0:
            raise common.UsageError("--to-offset must not be negative")
        argv += ["--to", "offset", "--value", str(args.to_offset)]
    elif args.shift_by is not None:
        argv += ["--to", "shift-by", "--value", str(args.shift_by)]
    elif args.to_datetime is not None:
        argv += ["--to", "datetime", "--datetime", _time("--to-datetime", args.to_datetime)]
    else:
        try:
            resets.parse_duration_ms(args.by_duration)
        except ValueError as error:
            raise common.UsageError(str(error)) from None
        argv += ["--to", "duration", "--duration", args.by_duration]
    whole: list[str] = []
    for spec in args.topic:
        try:
            topic, partitions = resets.parse_topic_scope(spec)
        except ValueError as error:
            raise common.UsageError(f"--topic: {error}") from None
        if partitions is None:
            whole.append(topic)
        else:
            argv += ["--partitions", f"{topic}:{','.join(map(str, partitions))}"]
            whole.append(topic)
    if whole:
        argv += ["--topics", ",".join(dict.fromkeys(whole))]
    if args.audit:
        args.audit = absolute(args.audit)
        _location("--audit", args.audit, overwrite=True)
        argv += ["--audit", args.audit]
    argv.append("--execute" if args.execute else "--dry-run")
    return argv + _coordinator(args, needed=args.execute)


def compact_argv(args: argparse.Namespace) -> list[str]:
    args.location = absolute(args.location)
    argv = [*_common(args), "--output", args.location]
    _location("--location", args.location, args.overwrite)
    if args.overwrite:
        argv.append("--overwrite")
    fence = _coordinator(args, needed=False)
    if fence:
        if args.group is None and not args.group_option:
            # The group `kgo dev up` exports, whose token KGO_GROUP_TOKEN is.
            args.group = os.environ.get("KGO_GROUP_ID") or None
        if args.group is None and not args.group_option:
            raise common.UsageError(
                "--coordinator takes the group whose token authenticates the read fence: "
                "GROUP or --group GROUP"
            )
        argv += ["--group", common.group_of(args), *fence]
    return argv


# ------------------------------------------------------------------------------- running


def run_snapshot(args: argparse.Namespace) -> int:
    return run_job(args, "snapshot", snapshot_argv(args), args.location)


def run_restore(args: argparse.Namespace) -> int:
    return run_job(args, "restore", restore_argv(args), None)


def run_compact(args: argparse.Namespace) -> int:
    return run_job(args, "compact", compact_argv(args), args.location)


class Progress:
    """The job's lines on stderr: progress on one line updated in place on a terminal (its own
    lines otherwise), everything else as it comes; the job's error line kept for the end."""

    def __init__(self, command: str, out: IO[str]) -> None:
        self.command = command
        self.out = out
        self.live = out.isatty()
        self.shown = False
        self.error: str | None = None
        self.quiet = threading.Event()  # after Ctrl-C: the job's last words are not shown
        self.lock = threading.Lock()

    def status(self, text: str) -> None:
        with self.lock:
            if self.live:
                self.out.write(f"\r\x1b[K{text}")
                self.out.flush()
                self.shown = True

    def line(self, text: str) -> None:
        with self.lock:
            if self.shown:
                self.out.write("\r\x1b[K")
                self.shown = False
            self.out.write(text + "\n")
            self.out.flush()

    def clear(self) -> None:
        with self.lock:
            if self.shown:
                self.out.write("\r\x1b[K")
                self.out.flush()
                self.shown = False

    def follow(self, stream: IO[str]) -> None:
        for raw in stream:
            text = raw.rstrip("\n")
            if self.quiet.is_set():
                continue
            error = _JOB_ERROR.match(text)
            if error is not None:
                self.error = error.group("message")
            elif _PROGRESS.match(text) and self.live:
                self.status(f"{self.command}: {text}")
            elif text:
                self.line(text)


def run_job(
    args: argparse.Namespace, command: str, argv: Sequence[str], location: str | None
) -> int:
    """Runs ``python -m kafka_group_jobs.<job> ARGV`` and reports as described above."""
    env = dict(os.environ)
    if getattr(args, "token", None):
        env["KGO_GROUP_TOKEN"] = args.token  # in the environment, never on a command line
    progress = Progress(f"kgo {command}", sys.stderr)
    progress.status(f"kgo {command}: starting Spark")
    # SIGTERM (a `kill`, a container stopping) stops the job as Ctrl-C does: the job runs in a
    # session of its own, and would otherwise go on without anyone to wait for it. Ctrl-C's
    # handler is set too (as `kgo dev up` sets its own), before the job starts, which then
    # starts with Ctrl-C's default: a process started with SIGINT ignored (from a script's
    # `&`), and everything it starts, would otherwise go on through a Ctrl-C.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = (
        {signum: signal.signal(signum, _terminated) for signum in (signal.SIGTERM, signal.SIGINT)}
        if main_thread
        else {}
    )
    process: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", f"kafka_group_jobs.{JOBS[command]}", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            # A session of its own: Ctrl-C reaches this process, which stops the job in order.
            start_new_session=True,
        )
        assert process.stdout is not None
        assert process.stderr is not None
        reader = threading.Thread(target=progress.follow, args=(process.stderr,), daemon=True)
        reader.start()
        stdout = process.stdout.read()
        process.wait()
    except KeyboardInterrupt:
        progress.quiet.set()
        progress.clear()
        if process is not None:
            _stop(process, location)
        raise _Interrupted(_interrupted(args, command)) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if reader is not None:
            reader.join(10)
        progress.clear()
    if process.returncode == INTERRUPTED_EXIT:  # stopped by a signal sent to it directly
        raise _Interrupted(_interrupted(args, command))
    if process.returncode != 0:
        message = progress.error or f"the job exited with code {process.returncode}"
        failure = (
            common.UsageError(message) if process.returncode == 2 else common.CommandError(message)
        )
        raise failure
    if args.output == "table":
        sys.stdout.write(stdout)
        return 0
    result = results.parse_result(stdout)
    if result is None:
        raise common.CommandError("the job printed no result")
    print(common.dump(result, args.output))
    return 0


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _Interrupted(common.CommandError):
    code = INTERRUPTED_EXIT


def _interrupted(args: argparse.Namespace, command: str) -> str:
    if command == "restore" and getattr(args, "execute", False):
        group = common.group_of(args)
        return (
            "interrupted: a restore is written whole or not at all; "
            f"'kgo groups describe {group}' shows which"
        )
    return "interrupted: nothing written"


def _stop(process: subprocess.Popen[str], location: str | None) -> None:
    """Ctrl-C: the job stops Spark and removes its staging; killed if it does not in time."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    try:
        process.wait(STOP_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        # Spark's JVM runs in a session of its own, out of the job's process group: found
        # first, while it is still the job's child.
        below = _descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
    if location is not None:
        for leftover in locations.staging_leftovers(location):
            _remove(leftover)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), ()):
            found.append(child)
            pending.append(child)
    return found


def _remove(path: Path) -> None:
    import shutil

    with contextlib.suppress(OSError):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
