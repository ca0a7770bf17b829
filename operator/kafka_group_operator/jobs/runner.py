"""The ``JobRunner`` port: one way to run every Spark job, whatever ``spark.mode`` says.

Every job the operator starts (a snapshot, a scheduled snapshot, the plan of a restore or
online reset, the state-topic compaction) is a ``JobRun`` handed to a runner:

* ``SparkApplicationRunner`` creates one uniquely named ``SparkApplication``
  (``sparkoperator.k8s.io/v1beta2``, built by ``manifests.spark_application``) owned by the
  resource that asked for it, and mirrors its ``applicationState`` as a ``Progress``. A run's
  result is the JSON document the job writes to ``JobRun.result_uri`` when that is storage the
  operator can read (``file://``); otherwise only success or failure is known.
* ``LocalSparkRunner`` runs ``python -m kafka_group_jobs.<job>`` on local Spark in a
  subprocess of the operator (``make demo``, tests, clusters without the spark-operator) and
  reads the job's result line. Its runs live in this process: lost, and so started again by
  their handler, when the operator restarts.

``spark.mode`` chooses: ``operator``, ``local``, or ``auto`` (a SparkApplication when the
spark-operator's CRD is installed, else local); a resource that leaves it unset gets the
chart's (``KGO_SPARK_MODE``). Runs are idempotent by name: starting a run that exists is a
no-op, so a handler that repeats a tick starts nothing twice.

A job that talks to the coordinator (its read fence; the restore's checks) gets
``--coordinator-url`` among its arguments and its group's bearer token in its environment
(``KGO_GROUP_TOKEN``, which the jobs read by default), never on a command line: a local run
from the operator's token store, a SparkApplication's driver from the group's token Secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import importlib.util
import json
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import spark as kube_spark
from kafka_group_operator.manifests import spark_application as spark_manifests
from kafka_group_records import results

MODES = ("operator", "local", "auto")
LOCAL_MASTER = "local[2]"
LOCAL_RUNNER_KEY = "kafka_group_operator_local_jobs"
DEFAULT_JOBS_IMAGE = "ghcr.io/kafka-group-operator/kafka-group-jobs:0.1.0"
TOKEN_ENV = spark_manifests.TOKEN_ENV


@dataclass(frozen=True, slots=True)
class JobOutcome:
    succeeded: bool
    result: dict[str, Any] | None = None
    reason: str = ""


class RunState(enum.Enum):
    UNKNOWN = "Unknown"  # no run of that name (never started, or a local run lost on restart)
    PENDING = "Pending"
    RUNNING = "Running"
    FINISHED = "Finished"


@dataclass(frozen=True, slots=True)
class Progress:
    state: RunState
    outcome: JobOutcome | None = None  # set when FINISHED


@dataclass(frozen=True, slots=True)
class GroupToken:
    """Where a run finds its group's bearer token: ``value`` for a local run's environment,
    the Secret ``secret``/``key`` for a SparkApplication's driver. Never shown in a repr."""

    secret: str
    key: str
    value: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class JobRun:
    """One run of a job; ``name`` is unique per run and names its SparkApplication."""

    job: str  # one of spark_application.JOBS
    name: str
    namespace: str
    arguments: tuple[str, ...]
    owner: Mapping[str, Any] | None = None  # the resource that asked; None for compaction
    spark: Mapping[str, Any] | None = None  # the resource's spec.spark overrides
    storage_claim: str | None = None  # a PVC to mount for pvc:// storage
    result_uri: str | None = None  # where a cluster run leaves its result document
    token: GroupToken | None = None  # for a job that calls the coordinator (--coordinator-url)


class JobRunner(Protocol):
    mode: str

    async def start(self, run: JobRun) -> None: ...

    async def poll(self, run: JobRun) -> Progress: ...


# ---------------------------------------------------------------------------------------
# Settings


def spark_defaults(
    env: Mapping[str, str] | None = None,
) -> tuple[str, spark_manifests.SparkSettings]:
    """The chart's Spark settings (``KGO_SPARK_*``): the default mode and the run settings."""
    environ = os.environ if env is None else env
    settings = spark_manifests.SparkSettings(
        image=environ.get("KGO_SPARK_IMAGE", DEFAULT_JOBS_IMAGE),
        service_account=environ.get("KGO_SPARK_SERVICE_ACCOUNT", "spark"),
        spark_conf=json.loads(environ.get("KGO_SPARK_CONF") or "{}"),
    )
    return environ.get("KGO_SPARK_MODE", "auto"), settings


def chosen_mode(requested: str | None, configured: str) -> str:
    """The mode a run asks for, else the operator's configured one (the chart's spark.mode)."""
    mode = requested or configured
    if mode not in MODES:
        raise ValueError(f"unknown spark.mode {mode!r}; expected one of {', '.join(MODES)}")
    return mode


def kafka_arguments(env: Mapping[str, str] | None = None) -> list[str]:
    # The operator's own Kafka settings dir (a mounted Secret): passed by path, never by value.
    config_dir = (os.environ if env is None else env).get("KGO_KAFKA_CONFIG_DIR")
    return ["--kafka-config-dir", config_dir] if config_dir else []


def storage_claim_of(uri: str | None) -> str | None:
    """The PVC a ``pvc://<claim>/...`` URI names, to mount into the driver and executors."""
    if not uri or not uri.startswith("pvc://"):
        return None
    return uri.removeprefix("pvc://").split("/")[0] or None


async def resolve_mode(mode: str, kube: kube_client.KubeClient) -> str:
    """``operator`` or ``local``: ``auto`` is operator when the spark-operator is installed."""
    if mode not in MODES:
        raise ValueError(f"unknown spark.mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "auto":
        installed = await kube_spark.spark_operator_installed(kube)
        return "operator" if installed else "local"
    return mode


async def runner_for(mode: str | None, kube: kube_client.KubeClient, memo: Any) -> JobRunner:
    """The runner ``mode`` (or, when None, the chart's ``spark.mode``) chooses."""
    default_mode, settings = spark_defaults()
    resolved = await resolve_mode(chosen_mode(mode, default_mode), kube)
    if resolved == "operator":
        return SparkApplicationRunner(kube, settings)
    return local_runner_of(memo)


def runner_named(mode: str, kube: kube_client.KubeClient, memo: Any) -> JobRunner:
    """The runner of a run already started in ``mode`` (as its status recorded it)."""
    if mode == "operator":
        return SparkApplicationRunner(kube, spark_defaults()[1])
    return local_runner_of(memo)


# ---------------------------------------------------------------------------------------
# Results and failures

# What kafka_group_jobs.arguments.run prints for every failure it expects.
_JOB_ERROR = re.compile(r"^kafka_group_jobs\.\w+: error: (?P<message>.+)$")
# A Python or Java exception line ("pkg.SomeError: message", "Caused by: java.io.X: ..."),
# never a stack frame ("\tat org.apache...Exception..." is indented, log lines start with a date).
_EXCEPTION_LINE = re.compile(
    r"^(?:Caused by: )?(?:[A-Za-z_][\w$]*\.)*[A-Za-z_][\w$]*(?:Error|Exception|Exit)\w*(?::\s.*)?$"
)


def outcome_of(returncode: int, stdout: str, stderr: str) -> JobOutcome:
    """A job's result line (``kafka_group_records.results``), or the clearest reason it
    failed (see ``failure_reason``)."""
    if returncode == 0:
        try:
            result = results.parse_result(stdout)
        except results.ResultError as error:
            return JobOutcome(False, reason=str(error))
        if result is not None:
            return JobOutcome(True, result)
    return JobOutcome(False, reason=failure_reason(returncode, stderr)[:500])


def failure_reason(returncode: int, stderr: str) -> str:
    """The exception's message, not whatever the JVM logged last.

    In order: the job's own ``error:`` line; else the exception line that ends the last
    Python traceback; else the last Python or Java exception line; else the last line.
    """
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if match := _JOB_ERROR.match(line):
            return match["message"]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if starts:
        for line in lines[starts[-1] + 1 :]:
            if not line[0].isspace():
                return line
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1].strip() if lines else f"exit status {returncode}"


def read_result(uri: str | None) -> dict[str, Any] | None:
    """A cluster run's result document, when its storage is a file system the operator sees."""
    if not uri or not uri.startswith("file://"):
        return None
    try:
        found = json.loads(Path(uri.removeprefix("file://")).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


# ---------------------------------------------------------------------------------------
# Local Spark in a subprocess


def local_command(run: JobRun) -> list[str]:
    """The command line of ``run`` on local Spark (no secret on it: see ``local_environment``)."""
    return [
        sys.executable,
        "-m",
        f"kafka_group_jobs.{run.job}",
        *run.arguments,
        *kafka_arguments(),
        "--master",
        LOCAL_MASTER,
        "--json",  # the result as one result line, for outcome_of
    ]


def local_environment(run: JobRun, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of ``run``'s process: the operator's, plus the group's token."""
    environment = dict(os.environ if base is None else base)
    environment.pop(TOKEN_ENV, None)  # never another group's token
    if run.token is not None and run.token.value:
        environment[TOKEN_ENV] = run.token.value
    return environment


async def run_local_job(command: Sequence[str], environment: Mapping[str, str]) -> JobOutcome:
    """Runs a job's ``local_command`` and waits for it."""
    process = await asyncio.create_subprocess_exec(
        *command,
        env=dict(environment),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await process.communicate()
    except asyncio.CancelledError:
        # The operator is stopping: its local runs (and their JVMs) stop with it.
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    return outcome_of(
        process.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")
    )


def _java_found() -> bool:
    # Where Spark's launcher looks: JAVA_HOME, else the PATH.
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return True
    return shutil.which("java") is not None


async def _refused(outcome: JobOutcome) -> JobOutcome:
    return outcome


@dataclass
class LocalSparkRunner:
    """Local runs of this operator process, by run name."""

    mode: str = "local"
    tasks: dict[str, asyncio.Task[JobOutcome]] = field(default_factory=dict)

    async def start(self, run: JobRun) -> None:
        if run.name not in self.tasks:
            lacking = self.missing()
            job = (
                run_local_job(local_command(run), local_environment(run))
                if lacking is None
                else _refused(JobOutcome(False, reason=lacking))
            )
            self.tasks[run.name] = asyncio.create_task(job, name=run.name)

    @staticmethod
    def missing() -> str | None:
        """What this process lacks to run local Spark (the slim operator image has neither)."""
        lacking = [
            what
            for what, found in (
                ("pyspark", importlib.util.find_spec("pyspark") is not None),
                ("Java", _java_found()),
            )
            if not found
        ]
        if not lacking:
            return None
        return (
            f"local Spark needs {' and '.join(lacking)} in the operator's image: run the "
            "operator from the jobs image (spark.image), or install the spark-operator and "
            "use spark.mode operator"
        )

    async def poll(self, run: JobRun) -> Progress:
        """The run's progress; a finished run's outcome is given once, then forgotten."""
        task = self.tasks.get(run.name)
        if task is None:
            return Progress(RunState.UNKNOWN)
        if not task.done():
            return Progress(RunState.RUNNING)
        del self.tasks[run.name]
        if task.cancelled():
            return Progress(RunState.FINISHED, JobOutcome(False, reason="the run was cancelled"))
        error = task.exception()
        if error is not None:
            outcome = JobOutcome(False, reason=f"could not run the job: {error}")
            return Progress(RunState.FINISHED, outcome)
        return Progress(RunState.FINISHED, task.result())

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()


def local_runner_of(memo: Any) -> LocalSparkRunner:
    runner = memo.get(LOCAL_RUNNER_KEY)
    if not isinstance(runner, LocalSparkRunner):
        runner = LocalSparkRunner()
        memo[LOCAL_RUNNER_KEY] = runner
    return runner


# ---------------------------------------------------------------------------------------
# SparkApplication


def build_application(run: JobRun, defaults: spark_manifests.SparkSettings) -> dict[str, Any]:
    """The SparkApplication of ``run``: the jobs image, the run's name, owned by its owner."""
    return spark_manifests.build_spark_application(
        owner=run.owner,
        name=run.name,
        namespace=run.namespace,
        job=run.job,
        arguments=run.arguments,
        settings=spark_manifests.overlay(defaults, run.spark),
        storage_claim=run.storage_claim,
        token_secret=None if run.token is None else (run.token.secret, run.token.key),
    )


@dataclass
class SparkApplicationRunner:
    kube: kube_client.KubeClient
    defaults: spark_manifests.SparkSettings
    mode: str = "operator"

    async def start(self, run: JobRun) -> None:
        # A repeated start finds the application of that name and leaves it be.
        await kube_spark.create_application(self.kube, build_application(run, self.defaults))

    async def poll(self, run: JobRun) -> Progress:
        application = await kube_spark.get_application(self.kube, run.namespace, run.name)
        if application is None:
            return Progress(RunState.UNKNOWN)
        phase, error = spark_manifests.phase_of(application)
        if phase == "Pending":
            return Progress(RunState.PENDING)
        if phase == "Running":
            return Progress(RunState.RUNNING)
        if phase == "Succeeded":
            return Progress(RunState.FINISHED, JobOutcome(True, read_result(run.result_uri)))
        reason = error or f"SparkApplication {run.name} failed"
        return Progress(RunState.FINISHED, JobOutcome(False, reason=reason))
