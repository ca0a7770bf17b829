"""The OffsetSnapshot handlers with the spark-operator installed: kopf against the API server
and the embedded coordinator on the real broker.

No spark-operator can run here, so this test plays it: it sets ``status.applicationState``
the way the spark-operator does, and the operator must mirror it. The local-Spark path, with an
online restore of the snapshot, is ``test_online_reset``.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
from kmock._internal import k8s

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import coordinator_port
from kafka_group_operator.jobs import compaction, runs
from kafka_group_operator.jobs import runner as job_runner
from tests.schemas import spark_operator
from tests.support import kube, topics

NS = "shop"
CG = "kafkagroups.io/v1alpha1/consumergroups"
SNAPSHOTS = "kafkagroups.io/v1alpha1/offsetsnapshots"
SPARK_APPS = "sparkoperator.k8s.io/v1beta2/sparkapplications"

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.slow]


@attrs.define(kw_only=True)
class ApiServerWithSparkOperator(kube.ApiServer):
    """The API server of a cluster where the spark-operator's CRD is installed."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources[SPARK_APPS] = k8s.KubernetesEmulator.ResourceInfo(
            kind="SparkApplication",
            singular="sparkapplication",
            namespaced=True,
            verbs=kube.VERBS,
            subresources={"status"},
        )


@pytest.fixture
def data_topic(broker: embedded.EmbeddedBroker) -> str:
    return topics.create_topic(broker.bootstrap, 2, 10)


@pytest.fixture
async def operator(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker
) -> AsyncIterator[kube.RunningOperator]:
    config = kube.operator_config_for(kmock, broker.bootstrap, retry_base_seconds=0.5)
    async with kube.RunningOperator(config) as running:
        yield running


async def create_group(api: kube.ApiServer, topic: str, bootstrap: str, **spec: Any) -> None:
    body = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": "payments", "namespace": NS},
        "spec": {
            "topics": [topic],
            "replicas": 1,
            "kafka": {"bootstrapServers": bootstrap},
            "template": {"spec": {"containers": [{"name": "consumer", "image": "consumer:1"}]}},
            **spec,
        },
    }
    await kube.api_call(
        api, "POST", f"/apis/kafkagroups.io/v1alpha1/namespaces/{NS}/consumergroups", body
    )


async def create_snapshot(
    api: kube.ApiServer,
    name: str,
    uri: str,
    mode: str | None,
    group: str = "payments",
    namespace: str = NS,
) -> None:
    """An OffsetSnapshot of the ConsumerGroup ``group`` into ``uri``, created through the API."""
    body: dict[str, Any] = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "OffsetSnapshot",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "consumerGroupRef": {"name": group},
            "storage": {"uri": uri},
            "spark": {} if mode is None else {"mode": mode},
        },
    }
    await kube.api_call(
        api, "POST", f"/apis/kafkagroups.io/v1alpha1/namespaces/{namespace}/offsetsnapshots", body
    )


async def commit(operator: kube.RunningOperator, offsets: dict[tuple[str, int], int]) -> None:
    """An administrative commit into the (memberless) group, through the embedded coordinator."""
    response = await operator.call(
        operator.state.runtime.commit_offsets(
            messages.OffsetCommitRequest(
                group_id=f"{NS}.payments",
                member_id="",
                member_epoch=messages.LEAVE_EPOCH,
                offsets={tp: messages.CommitOffset(offset) for tp, offset in offsets.items()},
            )
        )
    )
    assert not response.errors


async def set_application_state(api: kube.ApiServer, name: str, state: dict[str, str]) -> None:
    """What the spark-operator does as the application runs."""
    path = f"/apis/sparkoperator.k8s.io/v1beta2/namespaces/{NS}/sparkapplications/{name}/status"
    await kube.api_call(api, "PATCH", path, {"status": {"applicationState": state}})


def status_of(api: kube.ApiServer, resource: str, name: str) -> dict[str, Any]:
    return dict(((api.get(resource, NS, name) or {}).get("status")) or {})


@pytest.mark.kmock(cls=ApiServerWithSparkOperator)
async def test_snapshot_as_a_spark_application_mirrored_and_retried(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    tmp_path: Path,
) -> None:
    await create_group(kmock, data_topic, broker.bootstrap)
    await create_snapshot(kmock, "nightly", f"file://{tmp_path}", "auto")

    first = await operator.wait_for(
        lambda: status_of(kmock, SNAPSHOTS, "nightly").get("sparkApplication"), 120
    )
    application = kmock.get(SPARK_APPS, NS, first)
    assert application is not None
    schema = spark_operator.spark_application_schema()
    jsonschema.Draft7Validator(schema).validate(application)
    owner = kmock.get(SNAPSHOTS, NS, "nightly")
    assert owner is not None
    assert application["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    arguments = application["spec"]["arguments"]
    assert arguments[arguments.index("--group") + 1] == f"{NS}.payments"
    assert arguments[arguments.index("--output") + 1] == f"file://{tmp_path}/{NS}/nightly"
    # The read fence comes from the coordinator; the driver has the group's token by reference.
    coordinator_url = operator.state.config.coordinator_url
    assert arguments[arguments.index("--coordinator-url") + 1] == coordinator_url
    assert application["spec"]["driver"]["env"] == [
        {
            "name": "KGO_GROUP_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "payments-group-token", "key": "token"}},
        }
    ]

    # The spark-operator runs it, and the driver dies.
    await set_application_state(kmock, first, {"state": "RUNNING"})
    await operator.wait_for(
        lambda: status_of(kmock, SNAPSHOTS, "nightly").get("phase") == "Running", 30
    )
    await set_application_state(
        kmock, first, {"state": "FAILED", "errorMessage": "driver OOMKilled"}
    )
    second = await operator.wait_for(
        lambda: (
            (name := status_of(kmock, SNAPSHOTS, "nightly").get("sparkApplication")) != first
            and name
        ),
        30,
    )
    status = status_of(kmock, SNAPSHOTS, "nightly")
    assert status["attempts"] == 2
    assert status["message"] == "attempt 1 of 3 failed, retrying: driver OOMKilled"

    # The second run completes; its manifest is on storage the operator can read.
    location = tmp_path / NS / "nightly"
    location.mkdir(parents=True)
    manifest = {
        "location": f"file://{location}",
        "records": 2,
        "partitions": {data_topic: [0, 1]},
        "takenAt": "2026-11-22T00:00:00.000Z",
        "checksum": "sha256:00",
    }
    (location / "manifest.json").write_text(json.dumps(manifest))
    await set_application_state(kmock, second, {"state": "COMPLETED"})
    await operator.wait_for(
        lambda: status_of(kmock, SNAPSHOTS, "nightly").get("phase") == "Succeeded", 30
    )
    status = status_of(kmock, SNAPSHOTS, "nightly")
    assert (status["records"], status["partitions"], status["checksum"]) == (2, 2, "sha256:00")
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"


@pytest.mark.kmock(cls=ApiServerWithSparkOperator)
async def test_a_snapshot_without_a_mode_runs_as_the_operator_is_configured(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The spark-operator is installed, so "auto" would create a SparkApplication; the chart
    # says local, and a snapshot that leaves spark.mode unset follows the chart.
    monkeypatch.setenv("KGO_SPARK_MODE", "local")
    await create_group(kmock, data_topic, broker.bootstrap)
    await create_snapshot(kmock, "configured", f"file://{tmp_path}", None)
    run = await operator.wait_for(lambda: status_of(kmock, SNAPSHOTS, "configured").get("run"), 60)
    assert run["mode"] == "local"
    assert kmock.get(SPARK_APPS, NS, run["name"]) is None


@pytest.mark.kmock(cls=ApiServerWithSparkOperator)
async def test_a_snapshot_of_a_missing_group_is_pending_until_the_group_exists(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    tmp_path: Path,
) -> None:
    await create_snapshot(kmock, "early", f"file://{tmp_path}", "operator")
    status = await operator.wait_for(
        lambda: (found := status_of(kmock, SNAPSHOTS, "early")).get("phase") and found, 60
    )
    assert status["phase"] == "Pending"
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "GroupNotFound")
    assert "'payments'" in ready["message"]
    assert kmock.get(SPARK_APPS, NS, "early") is None
    assert not status.get("run")
    # Retried: once the group is there, the snapshot runs without any edit.
    await create_group(kmock, data_topic, broker.bootstrap)
    await operator.wait_for(
        lambda: status_of(kmock, SNAPSHOTS, "early").get("sparkApplication"), 60
    )
    (ready,) = [
        c for c in status_of(kmock, SNAPSHOTS, "early")["conditions"] if c["type"] == "Ready"
    ]
    assert ready["reason"] == "Running"


def _ready_reason(api: kube.ApiServer, name: str) -> str | None:
    for condition in status_of(api, SNAPSHOTS, name).get("conditions") or ():
        if condition["type"] == "Ready":
            return str(condition["reason"])
    return None


@pytest.mark.kmock(cls=ApiServerWithSparkOperator)
@pytest.mark.parametrize(
    ("status", "phase", "reason"),
    [(422, "Failed", "InvalidTemplate"), (403, "Pending", "Forbidden")],
)
async def test_a_run_the_api_server_refuses_reaches_the_status(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    tmp_path: Path,
    status: int,
    phase: str,
    reason: str,
) -> None:
    refusal = kmock.reject(SPARK_APPS, status, "spec.driver.cores: Invalid value: 0")
    await create_group(kmock, data_topic, broker.bootstrap)
    await create_snapshot(kmock, "refused", f"file://{tmp_path}", "operator")
    await operator.wait_for(lambda: _ready_reason(kmock, "refused") == reason, 60)
    found = status_of(kmock, SNAPSHOTS, "refused")
    assert found["phase"] == phase
    (ready,) = [c for c in found["conditions"] if c["type"] == "Ready"]
    assert ready["status"] == "False"
    assert "spec.driver.cores" in ready["message"]
    if status == 403:
        # Retried: once the RBAC allows it, the run starts without any edit.
        kmock.rejections.remove(refusal)
        await operator.wait_for(
            lambda: status_of(kmock, SNAPSHOTS, "refused").get("sparkApplication"), 60
        )


@pytest.mark.kmock(cls=ApiServerWithSparkOperator)
async def test_a_failed_run_of_a_deleted_group_fails_with_the_reason(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    tmp_path: Path,
) -> None:
    await create_group(kmock, data_topic, broker.bootstrap)
    await create_snapshot(kmock, "orphan", f"file://{tmp_path}", "operator")
    first = await operator.wait_for(
        lambda: status_of(kmock, SNAPSHOTS, "orphan").get("sparkApplication"), 60
    )
    await kube.api_call(
        kmock, "DELETE", f"/apis/kafkagroups.io/v1alpha1/namespaces/{NS}/consumergroups/payments"
    )
    await operator.wait_for(lambda: kmock.get(CG, NS, "payments") is None, 30)
    await set_application_state(kmock, first, {"state": "FAILED", "errorMessage": "OOMKilled"})
    status = await operator.wait_for(
        lambda: (found := status_of(kmock, SNAPSHOTS, "orphan")).get("phase") == "Failed" and found,
        30,
    )
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "GroupNotFound")
    assert "OOMKilled" in status["message"]
    assert "'payments'" in status["message"]


@pytest.mark.kmock(cls=kube.ApiServer)
async def test_a_reset_of_unknown_partitions_or_unsubscribed_topics_is_refused(
    kmock: kube.ApiServer, operator: kube.RunningOperator, data_topic: str, broker: Any
) -> None:
    reset = {
        "to": "earliest",
        "dryRun": False,
        "topics": [{"name": data_topic, "partitions": [0, 5]}, {"name": "elsewhere"}],
    }
    await create_group(kmock, data_topic, broker.bootstrap, offsetReset=reset)
    last = await operator.wait_for(
        lambda: (
            (found := status_of(kmock, CG, "payments").get("lastReset"))
            and found.get("stage") == "Done"
            and found
        ),
        60,
    )
    assert (last["phase"], last["reason"]) == ("Failed", "InvalidResetScope")
    assert f"topic {data_topic!r} has 2 partitions, not 5" in last["message"]
    assert "the group does not subscribe to topic 'elsewhere'" in last["message"]
    (condition,) = [
        c for c in status_of(kmock, CG, "payments")["conditions"] if c["type"] == "ResetInProgress"
    ]
    assert (condition["status"], condition["reason"]) == ("False", "InvalidResetScope")


@pytest.mark.kmock(cls=ApiServerWithSparkOperator)
async def test_an_online_reset_planned_by_a_spark_application(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan runs as a SparkApplication owned by the ConsumerGroup; its audit comes back
    through results storage and the operator writes it as one administrative commit."""
    monkeypatch.setenv("KGO_SPARK_RESULTS_URI", f"file://{tmp_path}/results")
    await create_group(kmock, data_topic, broker.bootstrap)
    await operator.wait_for(lambda: operator.state.tokens.token_for(f"{NS}.payments"), 60)
    await commit(operator, {(data_topic, 0): 7, (data_topic, 1): 9})
    reset = {"to": "offset", "offset": 3, "dryRun": False}
    path = f"/apis/kafkagroups.io/v1alpha1/namespaces/{NS}/consumergroups/payments"
    await kube.api_call(kmock, "PATCH", path, {"spec": {"offsetReset": reset}})

    def last_reset() -> dict[str, Any]:
        return dict(status_of(kmock, CG, "payments").get("lastReset") or {})

    run = await operator.wait_for(lambda: last_reset().get("run"), 60, 0.2)
    assert run["mode"] == "operator"
    application = kmock.get(SPARK_APPS, NS, run["name"])
    assert application is not None
    jsonschema.Draft7Validator(spark_operator.spark_application_schema()).validate(application)
    group = kmock.get(CG, NS, "payments")
    assert group is not None
    assert application["metadata"]["ownerReferences"][0]["uid"] == group["metadata"]["uid"]
    assert application["spec"]["mainApplicationFile"].endswith("/restore.py")
    arguments = application["spec"]["arguments"]
    assert "--dry-run" in arguments  # the job only plans
    coordinator_url = operator.state.config.coordinator_url
    assert arguments[arguments.index("--coordinator-url") + 1] == coordinator_url
    audit_uri = arguments[arguments.index("--audit") + 1]
    assert audit_uri == f"file://{tmp_path}/results/{NS}/{run['name']}.json"
    assert last_reset()["stage"] == "Planning"

    # The spark-operator runs it; the job writes its audit, then completes.
    await set_application_state(kmock, run["name"], {"state": "RUNNING"})
    audit = {
        "group": f"{NS}.payments",
        "clamped": 0,
        "partitions": [
            {"topic": data_topic, "partition": p, "oldOffset": old, "newOffset": 3}
            for p, old in ((0, 7), (1, 9))
        ],
    }
    target = tmp_path / "results" / NS / f"{run['name']}.json"
    assert audit_uri == f"file://{target}"
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(audit))
    await set_application_state(kmock, run["name"], {"state": "COMPLETED"})
    await operator.wait_for(lambda: last_reset().get("phase") in ("Done", "Failed"), 60, 0.2)
    assert last_reset()["phase"] == "Done", last_reset()
    assert last_reset()["partitions"] == audit["partitions"]
    fetched = await operator.call(
        operator.state.runtime.fetch_offsets(messages.OffsetFetchRequest(group_id=f"{NS}.payments"))
    )
    assert {tp: value.offset for tp, value in fetched.offsets.items()} == {
        (data_topic, 0): 3,
        (data_topic, 1): 3,
    }
    (condition,) = [
        c for c in status_of(kmock, CG, "payments")["conditions"] if c["type"] == "ResetInProgress"
    ]
    assert (condition["status"], condition["reason"]) == ("False", "Done")


@pytest.mark.kmock(cls=ApiServerWithSparkOperator)
async def test_a_cluster_reset_without_results_storage_fails_and_resumes(
    kmock: kube.ApiServer,
    operator: kube.RunningOperator,
    data_topic: str,
    broker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KGO_SPARK_RESULTS_URI", raising=False)
    reset = {"to": "earliest", "dryRun": False}
    await create_group(kmock, data_topic, broker.bootstrap, offsetReset=reset)
    last = await operator.wait_for(
        lambda: (
            (found := status_of(kmock, CG, "payments").get("lastReset"))
            and found.get("stage") == "Done"
            and found
        ),
        60,
    )
    assert last["phase"] == "Failed"
    assert "spark.resultsUri" in last["message"]
    (condition,) = [
        c for c in status_of(kmock, CG, "payments")["conditions"] if c["type"] == "ResetInProgress"
    ]
    assert (condition["status"], condition["reason"]) == ("False", "Failed")


@pytest.mark.kmock(cls=kube.ApiServer)
async def test_an_offset_reset_the_crd_would_refuse_is_refused_before_anything_pauses(
    kmock: kube.ApiServer, operator: kube.RunningOperator, data_topic: str, broker: Any
) -> None:
    # A server without the CRD's CEL rules lets it through; the typed view refuses it.
    reset = {"to": "offset", "dryRun": False}
    await create_group(kmock, data_topic, broker.bootstrap, offsetReset=reset)
    last = await operator.wait_for(
        lambda: (
            (found := status_of(kmock, CG, "payments").get("lastReset"))
            and found.get("stage") == "Done"
            and found
        ),
        60,
    )
    assert (last["phase"], last["reason"]) == ("Failed", "InvalidSpec")
    assert last["message"] == "offsetReset.to=offset needs offsetReset.offset"
    (condition,) = [
        c for c in status_of(kmock, CG, "payments")["conditions"] if c["type"] == "ResetInProgress"
    ]
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")


# The shape of a local run's stderr: Spark's log4j lines, the job's own error line, then what
# the JVM logs while it shuts down, stack frames included.
SPARK_STDERR = """\
26/11/23 10:31:41 WARN Utils: Your hostname, vm, resolves to a loopback address: 127.0.0.1
kafka_group_jobs.snapshot: error: [PATH_NOT_FOUND] Path does not exist: file:/backups/x.
26/11/23 10:32:07 ERROR Utils: Uncaught exception in thread shutdown-hook-0
java.lang.IllegalStateException: Shutdown hooks cannot be modified during shutdown.
\tat org.apache.spark.util.SparkShutdownHookManager.add(ShutdownHookManager.scala:195)
\tat org.apache.spark.SparkException$.internalError(SparkException.scala:92)
"""


def test_a_failed_job_reports_its_error_not_a_stack_frame() -> None:
    outcome = job_runner.outcome_of(1, "", SPARK_STDERR)
    assert not outcome.succeeded
    assert outcome.reason == "[PATH_NOT_FOUND] Path does not exist: file:/backups/x."


def test_without_an_error_line_the_java_exception_line_is_the_reason() -> None:
    stderr = SPARK_STDERR.replace("kafka_group_jobs.snapshot: error:", "26/11/23 INFO")
    reason = job_runner.outcome_of(1, "", stderr).reason
    assert reason == (
        "java.lang.IllegalStateException: Shutdown hooks cannot be modified during shutdown."
    )


def test_an_uncaught_python_exception_reports_its_line() -> None:
    script = (
        "import sys\n"
        "try:\n    {}['offsets']\n"
        "except KeyError as error:\n"
        "    raise RuntimeError('the manifest has no offsets') from error\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    # Spark keeps logging after the driver's traceback.
    stderr = run.stderr + "26/11/23 10:32:07 WARN SparkEnv: Exception while stopping\n"
    reason = job_runner.outcome_of(run.returncode, run.stdout, stderr).reason
    assert reason == "RuntimeError: the manifest has no offsets"


@pytest.mark.kmock(cls=kube.ApiServer)
async def test_the_compaction_is_fenced_by_the_operators_own_coordinator(
    kmock: kube.ApiServer, operator: kube.RunningOperator, broker: Any
) -> None:
    """No group token could ask for every partition: the operator fences through its port
    (here every partition is its own runtime's) and the job reads up to those ends
    (``--fenced-ends``), which lie past every acknowledged write."""
    from kafka_group_jobs import arguments, fence
    from kafka_group_jobs import topics as job_topics

    state_topic = operator.state.config.state_topic
    count = job_topics.partition_count(broker.bootstrap, state_topic, {})
    port = coordinator_port.port_of(operator.state)
    ends = await operator.call(compaction.fence_every_partition(port, count))
    assert sorted(ends) == list(range(count))
    due = datetime.datetime(2026, 11, 22, 3, tzinfo=datetime.UTC)
    run = runs.compaction_run(broker.bootstrap, state_topic, "file:///c", due, NS, ends)
    given = run.arguments[run.arguments.index("--fenced-ends") + 1]
    fenced = arguments.given_fence(given, count)
    assert fenced.kind == fence.COORDINATOR
    # Each end is a marker the coordinator appended: the partitions' last stable offsets are
    # past it.
    stable = job_topics.stable_ends(broker.bootstrap, state_topic, range(count), {})
    assert all(stable[p] >= end for p, end in fenced.end_offsets.items())
