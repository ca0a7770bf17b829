"""Builds the Spark session the jobs run in, under ``spark-submit`` or as plain ``python -m``.

Under ``spark-submit`` (a SparkApplication) the master and resources come from the submit
command and this only names the app. Run directly (``python -m``, ``kgo snapshot``), the
master is ``DEFAULT_MASTER`` unless ``--master`` names another, and a local master starts a
local Spark whose Python workers use this interpreter, so that they import
``kafka_group_jobs`` from the same install, and whose JVM is set up to start fast: a fresh
job spends most of its time before the first record starting the JVM, not reading.

Run directly, on any master:

* no web UI unless asked for (``ui``); on a local master it listens on loopback only (the
  driver binds to 127.0.0.1);
* no console progress bar: the job reports its own progress (``progress``), one display;
* the JVM is started in a session of its own, with its output (the start-up banner, Spark's
  log, its Python workers' output) going to a log file (``spark_log``) instead of the
  terminal: Ctrl-C then reaches this process alone, instead of every Spark worker printing
  its traceback. While a job's session runs, Ctrl-C stops Spark from a thread of its own
  (``interrupted``): the job's Spark call in progress fails, the job's staged output is
  removed, and the job ends in one line with exit code 130 (``arguments.run``). Spark's own
  handler would call into the JVM on the connection the interrupted call is using, which
  py4j reports with a traceback per call. A second Ctrl-C stops waiting.

On a local master:

* ``-XX:TieredStopAtLevel=1``: the client compiler only. The server compiler's threads took
  about half the JVM's CPU time up to the first record, for code a job runs for seconds.
* A class-data-sharing archive of the classes Spark loads (``-XX:SharedArchiveFile``): they
  are mapped in already parsed and verified instead of read from the jars. The first local
  job in an environment records it at its end (``-XX:ArchiveClassesAtExit``), into
  ``$KGO_SPARK_CLASS_ARCHIVE`` or the user's cache directory, under a name keyed by the Java
  and Spark installs (another Java or Spark gets its own archive; the JVM itself also
  ignores an archive whose jars changed). ``KGO_SPARK_CLASS_ARCHIVE=off`` turns it off. The
  jobs image records its archive at build time instead (``warmup``, ``recorded_session``)
  and names it with that variable.
* The JVM's own log lines go to its log file, never to stdout, where ``--json`` puts its
  result.
* Python workers forked by ``spark_daemon``, which imports pyspark from the installed,
  compiled package instead of the distribution's zip that Spark puts first on their path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from kafka_group_jobs import errors

# A job's master when neither spark-submit nor --master gives one: the tuned local Spark.
DEFAULT_MASTER = "local[2]"
ARCHIVE_ENV = "KGO_SPARK_CLASS_ARCHIVE"
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-Xlog:disable", "-Xlog:all=warning:stderr")
# How long a job's end waits for the JVM to write the archive before leaving it unfinished.
ARCHIVE_WRITE_TIMEOUT_S = 300.0
# How long a job's JVM may take to exit once its session stopped, before it is killed.
JVM_EXIT_WAIT_S = 10.0
# A recording's temporary file this old belongs to no running job.
STALE_RECORDING_S = 24 * 3600.0


def submitted() -> bool:
    """Whether spark-submit started this process (its JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    app_name: str,
    master: str | None = None,
    record_archive: Path | None = None,
    ui: bool = False,
) -> SparkSession:
    """A session; run directly, with the settings of the module docstring.

    ``record_archive``: where the JVM writes its class archive when it exits (``job_session``
    passes it when there is none yet). ``ui``: serve Spark's web UI (on loopback on a local
    master).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    direct = not submitted()
    if master is None and direct:
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if direct:
        builder = builder.config("spark.ui.enabled", "true" if ui else "false").config(
            "spark.ui.showConsoleProgress", "false"
        )
    if master is not None and master.startswith("local"):
        # The driver (and the UI, when asked for) on loopback: nothing listens outside.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        options = list(JVM_OPTIONS)
        archive = class_archive()
        if record_archive is not None:
            # Quiet: the JVM warns of every class it leaves out (hundreds of lines).
            options += [f"-XX:ArchiveClassesAtExit={record_archive}", "-Xlog:cds*=error:stderr"]
        elif archive is not None and archive.is_file():
            options.append(f"-XX:SharedArchiveFile={archive}")
        # Small per-group tables: Spark's default of 200 shuffle partitions is pure overhead here.
        builder = (
            builder.config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.extraJavaOptions", " ".join(options))
            .config("spark.python.daemon.module", "kafka_group_jobs.spark_daemon")
        )
    if not direct:
        return builder.getOrCreate()
    started = _launch_gateway(builder)
    try:
        return builder.getOrCreate()
    except BaseException:
        # Ctrl-C (or a failure) while Spark starts: the JVM this call started, in a session
        # of its own, would outlive the job.
        if started:
            _end_jvm(JVM_EXIT_WAIT_S)
        raise


_log: Path | None = None
# The log of the JVM a job's own session started (not one it shares, as in tests).
_job_log: Path | None = None


def spark_log() -> Path | None:
    """The log file of the JVM this job started, if it started one."""
    return _job_log


def _launch_gateway(builder: SparkSession.Builder) -> bool:
    """Starts the JVM as pyspark would, but in a session of its own and with its output in a
    log file (see the module docstring); nothing when a JVM already runs in this process.
    Whether it started one.

    A Ctrl-C while the JVM starts waits until pyspark has its handle (interrupted earlier,
    pyspark would lose it and the JVM outlive the job), then ends it and raises
    ``KeyboardInterrupt``."""
    global _log
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return False
    java_home = os.environ.get("JAVA_HOME")
    if not (Path(java_home, "bin", "java").is_file() if java_home else shutil.which("java")):
        raise errors.JobError(
            "Spark needs Java (17 or newer): none on the PATH and no JAVA_HOME"
            " (apt-get install openjdk-17-jre-headless)"
        )
    conf = SparkConf(loadDefaults=False)
    for key, value in builder._options.items():
        conf.set(key, value)
    handle, name = tempfile.mkstemp(prefix="kgo-spark-", suffix=".log")
    log = os.fdopen(handle, "wb")
    _log = Path(name)
    deferred: list[int] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, frame: deferred.append(signum))
    try:
        gateway = launch_gateway(  # type: ignore[no-untyped-call]
            conf, popen_kwargs={"start_new_session": True, "stdout": log, "stderr": log}
        )
    finally:
        log.close()  # the JVM holds its own descriptor
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    SparkContext._gateway = gateway
    SparkContext._jvm = gateway.jvm
    if deferred:
        _end_jvm(JVM_EXIT_WAIT_S)
        raise KeyboardInterrupt
    return True


def forget_log() -> None:
    """Removes the JVM's log file (a job that succeeded has no use for it)."""
    global _log, _job_log
    if _log is not None:
        _log.unlink(missing_ok=True)
    _log = _job_log = None


def class_archive() -> Path | None:
    """Where this Java and Spark's class archive is (or would be); None when turned off."""
    chosen = os.environ.get(ARCHIVE_ENV)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kafka-group-jobs" / f"spark-classes-{_install_key()}.jsa"


def _install_key() -> str:
    """A digest of the Java binary Spark starts and of Spark's jars (names, sizes, times)."""
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    digest = hashlib.sha256(f"{pyspark.__version__} {java and Path(java).resolve()}".encode())
    jars = Path(_find_spark_home(), "jars")
    with contextlib.suppress(OSError):
        for jar in sorted(jars.iterdir()):
            stat = jar.stat()
            digest.update(f"{jar.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def job_session(
    app_name: str, master: str | None = None, ui: bool = False
) -> Iterator[SparkSession]:
    """The session of one job's ``main``; stopped at the end unless it was already running.

    A job called inside a running Spark program (a test, a notebook) must not stop the
    session it shares. A job that starts a local Spark while there is no class archive yet
    records one (see the module docstring).
    """
    already_running = SparkSession.getActiveSession() is not None
    recording = None if already_running else _archive_to_record(master)
    global _job_log
    spark = build_session(app_name, master, recording, ui)
    if not already_running:
        _job_log = _log
    if ui and not already_running:
        url = spark.sparkContext.uiWebUrl
        sys.stderr.write(f"Spark's web UI: {url}\n")
        sys.stderr.flush()
    failed = False
    previous = _stop_on_interrupt(spark) if not already_running else None
    try:
        yield spark
    except BaseException:
        failed = True
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if not already_running:
            with contextlib.suppress(Exception):  # stopped already when interrupted
                spark.stop()
            archive = class_archive()
            if recording is not None and archive is not None:
                _finish_archive(recording, archive)
            else:
                _end_jvm(JVM_EXIT_WAIT_S)
            if not failed:
                forget_log()


_interrupted = threading.Event()


def interrupted() -> bool:
    """Whether Ctrl-C stopped this job's Spark (see the module docstring)."""
    return _interrupted.is_set()


def _stop_on_interrupt(spark: SparkSession) -> Any:
    """Installs the job's SIGINT handler (main thread only); returns the one it replaces."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _interrupted.clear()

    def stop(signum: int, frame: object) -> None:
        if _interrupted.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting for Spark
        _interrupted.set()
        threading.Thread(target=_stop_quietly, args=(spark,), name="kgo-interrupt").start()

    return signal.signal(signal.SIGINT, stop)


def _stop_quietly(spark: SparkSession) -> None:
    with contextlib.suppress(Exception):
        spark.sparkContext.cancelAllJobs()
    with contextlib.suppress(Exception):
        spark.stop()


@contextlib.contextmanager
def recorded_session(app_name: str, archive: Path) -> Iterator[SparkSession]:
    """A local session whose JVM records its class archive into ``archive`` as it ends (the
    jobs image's, at build time: ``warmup``)."""
    if SparkSession._instantiatedSession is not None:
        raise RuntimeError("a JVM already runs in this process: its options are set")
    handle, name = tempfile.mkstemp(prefix=archive.name, suffix=".part", dir=archive.parent)
    os.close(handle)
    recording = Path(name)
    spark = build_session(app_name, "local[2]", recording)
    try:
        yield spark
    finally:
        spark.stop()
        _finish_archive(recording, archive)


def _archive_to_record(master: str | None) -> Path | None:
    """A temporary name next to the missing archive, when this job should record it."""
    if master is None and not submitted():
        master = DEFAULT_MASTER
    if master is None or not master.startswith("local"):
        return None
    if SparkSession._instantiatedSession is not None:
        return None  # a JVM already runs in this process: its options are set
    archive = class_archive()
    if archive is None or archive.exists():
        return None
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        # What a killed recording left (its JVM still wrote it as it exited).
        for stale in archive.parent.glob(f"{archive.name}*.part"):
            if time.time() - stale.stat().st_mtime > STALE_RECORDING_S:
                stale.unlink(missing_ok=True)
        handle, name = tempfile.mkstemp(prefix=archive.name, suffix=".part", dir=archive.parent)
        os.close(handle)
    except OSError:
        return None  # nowhere to write it: the jobs run as well without
    return Path(name)


def _finish_archive(recording: Path, archive: Path) -> None:
    """Ends the JVM (it writes the archive as it exits) and puts the archive in place."""
    try:
        if _end_jvm(ARCHIVE_WRITE_TIMEOUT_S) == 0 and recording.stat().st_size > 0:
            recording.replace(archive)
    finally:
        recording.unlink(missing_ok=True)


def _end_jvm(wait_s: float) -> int | None:
    """Ends the gateway's JVM, which exits when its stdin closes, and kills it if it has not
    within ``wait_s``; its exit code (None: killed, or no JVM). It runs in a session of its
    own, so nothing else ends it: a JVM left running outlives the job for good. This
    process's later sessions, if any, start a new one."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if process is None:
        return None
    with contextlib.suppress(Exception):
        gateway.shutdown()  # type: ignore[union-attr]
    with contextlib.suppress(OSError):
        process.stdin.close()
    SparkContext._gateway = None
    SparkContext._jvm = None
    try:
        code: int = process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None
    return code
