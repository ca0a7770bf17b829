"""The JobRunner port: every job kind as a SparkApplication, and the local runner's life cycle.

The SparkApplications are validated against the spark-operator's own schema; the local runner
runs the real job module in a subprocess (a run refused by its arguments, so no JVM starts).
The full local Spark runs are in ``test_online_reset`` and ``test_jobs_on_broker``.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any

import jsonschema
import pytest

from kafka_group_operator.jobs import runner, runs
from kafka_group_operator.manifests import offset_jobs
from kafka_group_operator.manifests import spark_application as spark_manifests
from tests.schemas import spark_operator

SETTINGS = spark_manifests.SparkSettings(image="registry.example/kafka-group-jobs:9.9")
NS = "shop"


def snapshot_body(name: str = "nightly", spark: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "OffsetSnapshot",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "consumerGroupRef": {"name": "payments"},
            "storage": {"uri": "pvc://snaps/offsets"},
            **({"spark": spark} if spark else {}),
        },
    }


GROUP = {
    "apiVersion": "kafkagroups.io/v1alpha1",
    "kind": "ConsumerGroup",
    "metadata": {"name": "payments", "namespace": NS, "uid": "uid-group"},
    "spec": {"topics": ["orders"]},
}


def every_job_kind() -> dict[str, runner.JobRun]:
    due = datetime.datetime(2026, 11, 22, 3, tzinfo=datetime.UTC)
    scheduled = offset_jobs.build_scheduled_snapshot(
        GROUP, {"schedule": "0 3 * * *", "storage": {"uri": "pvc://snaps/offsets"}}, due
    )
    scheduled["metadata"]["uid"] = "uid-scheduled"
    restore_arguments = offset_jobs.restore_arguments(
        "k:9092", "state", f"{NS}.payments", {"to": "earliest"}, ["orders"]
    )
    return {
        "snapshot": runs.snapshot_run(snapshot_body(), 1, "k:9092", "state", f"{NS}.payments"),
        "scheduled snapshot": runs.snapshot_run(scheduled, 1, "k:9092", "state", f"{NS}.p"),
        "restore": runs.reset_run(GROUP, "f" * 16, restore_arguments, "file:///results"),
        "online reset": runs.reset_run(
            GROUP, "0" * 16, [*restore_arguments[:-1], "--dry-run"], "pvc://results/plans"
        ),
        "compaction": runs.compaction_run("k:9092", "state", "s3a://b/ckpt", due, "kgo"),
    }


@pytest.mark.parametrize("kind", list(every_job_kind()))
def test_every_job_kind_builds_a_valid_spark_application(kind: str) -> None:
    run = every_job_kind()[kind]
    application = runner.build_application(run, SETTINGS)
    jsonschema.Draft7Validator(spark_operator.spark_application_schema()).validate(application)
    spec = application["spec"]
    assert spec["image"] == SETTINGS.image
    assert spec["mainApplicationFile"] == f"local://{SETTINGS.jobs_path}/{run.job}.py"
    assert application["metadata"]["name"] == run.name
    assert len(run.name) <= spark_manifests.MAX_NAME_LENGTH
    assert spec["arguments"] == list(run.arguments)
    owners = application["metadata"].get("ownerReferences", [])
    if run.owner is None:
        assert run.job == "compaction"
        assert not owners
    else:
        assert owners[0]["uid"] == run.owner["metadata"]["uid"]
        assert owners[0]["controller"] is True


def test_pvc_storage_is_mounted_where_the_jobs_read_it() -> None:
    application = runner.build_application(every_job_kind()["snapshot"], SETTINGS)
    (volume,) = application["spec"]["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "snaps"}
    assert application["spec"]["driver"]["volumeMounts"][0]["mountPath"] == "/mnt/kgo/snaps"


def test_run_names_are_unique_per_run() -> None:
    names = [run.name for run in every_job_kind().values()]
    assert len(set(names)) == len(names)
    again = runs.snapshot_run(snapshot_body(), 2, "k:9092", "state", "g")
    assert again.name != every_job_kind()["snapshot"].name
    # A handler repeating a tick builds the same name, so the second create is a no-op.
    assert runs.snapshot_run(snapshot_body(), 1, "k:9092", "state", "g").name == (
        every_job_kind()["snapshot"].name
    )


def test_a_reset_plan_hands_its_audit_back_through_results_storage() -> None:
    run = every_job_kind()["restore"]
    assert run.result_uri == f"file:///results/{NS}/{run.name}.json"
    assert run.arguments[-2:] == ("--audit", run.result_uri)
    assert runs.reset_run(GROUP, "f" * 16, ["--dry-run"], None).result_uri is None


def test_the_resource_spark_overrides_the_chart_defaults() -> None:
    run = runs.snapshot_run(
        snapshot_body(spark={"image": "mine:1", "executor": {"instances": 5}}), 1, "k", "s", "g"
    )
    spec = runner.build_application(run, SETTINGS)["spec"]
    assert (spec["image"], spec["executor"]["instances"]) == ("mine:1", 5)


async def test_modes_resolve_and_unknown_modes_are_refused() -> None:
    # operator and local need no API call; auto does (covered by the handler tests).
    kube: Any = None
    assert await runner.resolve_mode("local", kube) == "local"
    assert await runner.resolve_mode("operator", kube) == "operator"
    with pytest.raises(ValueError, match=r"unknown spark\.mode 'yarn'"):
        await runner.resolve_mode("yarn", kube)


def test_spark_defaults_name_the_jobs_image() -> None:
    mode, settings = runner.spark_defaults({})
    assert (mode, settings.image) == ("auto", runner.DEFAULT_JOBS_IMAGE)


async def test_a_local_run_is_unknown_running_then_finished_once() -> None:
    local = runner.LocalSparkRunner()
    # The job refuses its arguments (no --group) before any Spark starts.
    run = runner.JobRun(job="snapshot", name="bad", namespace=NS, arguments=("--bootstrap", "k:1"))
    assert (await local.poll(run)).state is runner.RunState.UNKNOWN
    await local.start(run)
    await local.start(run)  # idempotent by name
    assert len(local.tasks) == 1
    progress = await local.poll(run)
    while progress.state is runner.RunState.RUNNING:
        await asyncio.sleep(0.2)
        progress = await local.poll(run)
    assert progress.state is runner.RunState.FINISHED
    assert progress.outcome is not None
    assert not progress.outcome.succeeded
    assert "--group" in progress.outcome.reason
    # Given once: a second poll knows nothing of it.
    assert (await local.poll(run)).state is runner.RunState.UNKNOWN


async def test_a_local_run_without_java_fails_saying_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The slim operator image has no Java: the run fails at once with the way out.
    monkeypatch.setattr("shutil.which", lambda _name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    local = runner.LocalSparkRunner()
    run = runner.JobRun(job="snapshot", name="nojava", namespace=NS, arguments=())
    await local.start(run)
    progress = await local.poll(run)
    while progress.state is runner.RunState.RUNNING:
        await asyncio.sleep(0.05)
        progress = await local.poll(run)
    assert progress.outcome is not None
    assert not progress.outcome.succeeded
    assert progress.outcome.reason.startswith("local Spark needs Java in the operator's image")
    assert "spark.image" in progress.outcome.reason


async def test_stopping_the_local_runner_stops_its_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = runner.LocalSparkRunner()
    run = runner.JobRun(job="snapshot", name="forever", namespace=NS, arguments=())
    started: list[asyncio.subprocess.Process] = []
    spawned = asyncio.Event()
    real = asyncio.create_subprocess_exec

    async def spawn(*_args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        # A stand-in for the job's process that would not end by itself.
        process = await real("sleep", "600", **kwargs)
        started.append(process)
        spawned.set()
        return process

    monkeypatch.setattr("asyncio.create_subprocess_exec", spawn)
    await local.start(run)
    await asyncio.wait_for(spawned.wait(), 30)
    await local.stop()
    assert started[0].returncode is not None  # killed, not orphaned
    assert not local.tasks


TOKEN = runs.group_token("payments", "s3cret-token-value")


def test_a_run_unset_mode_is_the_operators_configured_mode() -> None:
    assert runner.chosen_mode(None, "local") == "local"
    assert runner.chosen_mode("operator", "local") == "operator"
    with pytest.raises(ValueError, match=r"unknown spark\.mode 'yarn'"):
        runner.chosen_mode(None, "yarn")


@pytest.mark.parametrize("kind", ["snapshot", "online reset"])
def test_a_group_job_asks_the_coordinator_with_the_token_by_reference(kind: str) -> None:
    url = "http://kafka-group-operator.kgo.svc:8080"
    if kind == "snapshot":
        run = runs.snapshot_run(snapshot_body(), 1, "k:9092", "state", f"{NS}.payments", url, TOKEN)
    else:
        arguments = offset_jobs.restore_arguments(
            "k:9092", "state", f"{NS}.payments", {"to": "earliest"}, ["orders"], None, url
        )
        run = runs.reset_run(GROUP, "0" * 16, arguments, "file:///results", TOKEN)
    assert run.arguments[run.arguments.index("--coordinator-url") + 1] == url
    application = runner.build_application(run, SETTINGS)
    jsonschema.Draft7Validator(spark_operator.spark_application_schema()).validate(application)
    # Only the driver calls the coordinator; it reads the token from the group's Secret.
    assert application["spec"]["driver"]["env"] == [
        {
            "name": "KGO_GROUP_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "payments-group-token", "key": "token"}},
        }
    ]
    assert "env" not in application["spec"]["executor"]
    assert "s3cret-token-value" not in json.dumps(application)
    assert "s3cret-token-value" not in repr(run)
    # A local run: the token in the process's environment, never on its command line.
    command = runner.local_command(run)
    assert command[command.index("--coordinator-url") + 1] == url
    assert "s3cret-token-value" not in " ".join(command)
    environment = runner.local_environment(run, {"PATH": "/bin", "KGO_GROUP_TOKEN": "other"})
    assert environment == {"PATH": "/bin", "KGO_GROUP_TOKEN": "s3cret-token-value"}


def test_a_run_without_a_token_inherits_none() -> None:
    run = every_job_kind()["compaction"]
    assert runner.local_environment(run, {"KGO_GROUP_TOKEN": "leaked", "A": "b"}) == {"A": "b"}


def test_the_jobs_read_the_token_from_the_variable_the_runners_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kafka_group_jobs import arguments

    monkeypatch.setenv(runner.TOKEN_ENV, "from-the-environment")
    parsed = arguments.parser("snapshot", "")
    arguments.add_coordinator(parsed, "for the test")
    args = parsed.parse_args(["--bootstrap", "k:1", "--coordinator-url", "http://c:8080"])
    coordinator = arguments.coordinator_of(args, "g")
    assert coordinator is not None
    assert coordinator.token == "from-the-environment"


def test_the_compaction_reads_up_to_the_fence_the_operator_took() -> None:
    from kafka_group_jobs import arguments, errors, fence

    due = datetime.datetime(2026, 11, 22, 3, tzinfo=datetime.UTC)
    run = runs.compaction_run("k:9092", "state", "s3a://b/ckpt", due, "kgo", {1: 40, 0: 12})
    given = run.arguments[run.arguments.index("--fenced-ends") + 1]
    assert given == '{"0":12,"1":40}'
    assert arguments.given_fence(given, 2) == fence.ReadFence(fence.COORDINATOR, {0: 12, 1: 40})
    with pytest.raises(errors.UsageError, match=r"missing: \[2\]"):
        arguments.given_fence(given, 3)
    with pytest.raises(errors.UsageError, match="must be a JSON object"):
        arguments.given_fence("[1, 2]", 2)
    # Without a fence (a replica that does not serve every partition): the last stable offset.
    assert "--fenced-ends" not in runs.compaction_run("k", "s", "s3a://b", due, "kgo").arguments
