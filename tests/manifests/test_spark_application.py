"""SparkApplication bodies: exact shape, and valid against the spark-operator's published CRD."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from kafka_group_operator.manifests import spark_application
from tests.schemas import spark_operator

OWNER = {
    "apiVersion": "kafkagroups.io/v1alpha1",
    "kind": "OffsetSnapshot",
    "metadata": {"name": "payments-nightly", "namespace": "shop", "uid": "4f0c7d0e-1"},
}
DEFAULTS = spark_application.SparkSettings(
    image="ghcr.io/example/kafka-group-jobs:0.1.0", spark_conf={"spark.sql.shuffle.partitions": "8"}
)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return spark_operator.spark_application_schema()


def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not declare (the API server would prune them silently)."""
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(item, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [
            field
            for key, item in value.items()
            for field in unknown_fields(item, schema["additionalProperties"], f"{path}.{key}")
        ]
    if isinstance(value, list) and "items" in schema:
        return [
            f
            for i, item in enumerate(value)
            for f in unknown_fields(item, schema["items"], f"{path}[{i}]")
        ]
    return []


def build(**overrides: Any) -> dict[str, Any]:
    arguments = dict(
        owner=OWNER,
        job="snapshot",
        arguments=[
            "--bootstrap",
            "kafka:9092",
            "--group",
            "shop.payments",
            "--output",
            "s3a://b/p",
        ],
        settings=spark_application.overlay(DEFAULTS, {"executor": {"instances": 3}}),
    )
    arguments.update(overrides)
    return spark_application.build_spark_application(**arguments)


def test_snapshot_application_is_exactly_as_expected() -> None:
    body = build()
    labels = {
        "app.kubernetes.io/managed-by": "kafka-group-operator",
        "app.kubernetes.io/name": "kafka-group-jobs",
        "kafkagroups.io/job": "snapshot",
        "kafkagroups.io/owner": "payments-nightly",
    }
    assert body == {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {
            "name": spark_application.application_name(
                "payments-nightly", "snapshot", "4f0c7d0e-1", 0
            ),
            "namespace": "shop",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "kafkagroups.io/v1alpha1",
                    "kind": "OffsetSnapshot",
                    "name": "payments-nightly",
                    "uid": "4f0c7d0e-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": "ghcr.io/example/kafka-group-jobs:0.1.0",
            "imagePullPolicy": "IfNotPresent",
            "mainApplicationFile": "local:///opt/kafka-group-operator/kafka_group_jobs/snapshot.py",
            "arguments": [
                "--bootstrap",
                "kafka:9092",
                "--group",
                "shop.payments",
                "--output",
                "s3a://b/p",
            ],
            "sparkVersion": "4.0.1",
            "sparkConf": {
                "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile"
                "=/opt/kafka-group-operator/spark-classes.jsa -Xshare:auto",
                "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile"
                "=/opt/kafka-group-operator/spark-classes.jsa -Xshare:auto",
                "spark.default.parallelism": "3",
                "spark.sql.shuffle.partitions": "8",
            },
            "restartPolicy": {"type": "Never"},
            "timeToLiveSeconds": 3600,
            "driver": {
                "cores": 1,
                "memory": "1g",
                "serviceAccount": "spark-operator-spark",
                "labels": labels,
            },
            "executor": {"instances": 3, "cores": 1, "memory": "1g", "labels": labels},
        },
    }


@pytest.mark.parametrize("job", spark_application.JOBS)
@pytest.mark.parametrize("mounts", [False, True])
def test_applications_validate_against_the_spark_operator_crd(
    schema: dict[str, Any], job: str, mounts: bool
) -> None:
    extra: dict[str, Any] = (
        {"kafka_secret": "kafka-tls", "storage_claim": "snapshots"} if mounts else {}
    )
    body = build(job=job, **extra)
    jsonschema.Draft7Validator(schema).validate(body)
    assert unknown_fields(body, schema) == []
    if mounts:
        assert body["spec"]["arguments"][-2:] == ["--kafka-config-dir", "/etc/kafka-group/kafka"]
        assert body["spec"]["driver"]["volumeMounts"] == body["spec"]["executor"]["volumeMounts"]


def test_the_schema_check_catches_a_broken_body(schema: dict[str, Any]) -> None:
    body = build()
    body["spec"]["driver"]["cores"] = "two"
    del body["spec"]["sparkVersion"]
    body["spec"]["driver"]["cpus"] = 2
    errors = sorted(e.message for e in jsonschema.Draft7Validator(schema).iter_errors(body))
    assert any("'sparkVersion' is a required property" in e for e in errors)
    assert any("'two' is not of type 'integer'" in e for e in errors)
    assert unknown_fields(body, schema) == [".spec.driver.cpus"]


def test_names_are_unique_per_attempt_stable_per_attempt_and_short() -> None:
    names = {
        spark_application.application_name("a" * 80, "compaction", "uid", n) for n in range(50)
    }
    assert len(names) == 50
    assert all(len(name) <= 63 and name.endswith(tuple("0123456789abcdef")) for name in names)
    assert spark_application.application_name(
        "s", "restore", "u", 1
    ) == spark_application.application_name("s", "restore", "u", 1)


def test_overlay_takes_the_resource_over_the_chart() -> None:
    merged = spark_application.overlay(
        DEFAULTS,
        {
            "image": "mine:1",
            "driver": {"memory": "2g"},
            "sparkConf": {"spark.executor.extraJavaOptions": "-X"},
        },
    )
    assert (merged.image, merged.driver_memory, merged.driver_cores) == ("mine:1", "2g", 1)
    assert merged.spark_conf == {
        "spark.sql.shuffle.partitions": "8",
        "spark.executor.extraJavaOptions": "-X",
    }


def test_a_resources_java_options_replace_the_images_defaults() -> None:
    settings = spark_application.overlay(
        DEFAULTS, {"sparkConf": {"spark.executor.extraJavaOptions": "-Xss4m"}}
    )
    conf = build(settings=settings)["spec"]["sparkConf"]
    assert conf["spark.executor.extraJavaOptions"] == "-Xss4m"
    assert conf["spark.driver.extraJavaOptions"] == spark_application.JVM_OPTIONS


def test_the_default_parallelism_is_the_executors_cores_unless_the_resource_says() -> None:
    """The jobs cut their read into one task per core; on Kubernetes Spark counts the cores
    only once executors register, after the read is planned."""
    settings = spark_application.overlay(DEFAULTS, {"executor": {"instances": 3, "cores": 4}})
    assert build(settings=settings)["spec"]["sparkConf"]["spark.default.parallelism"] == "12"
    settings = spark_application.overlay(
        settings, {"sparkConf": {"spark.default.parallelism": "5"}}
    )
    assert build(settings=settings)["spec"]["sparkConf"]["spark.default.parallelism"] == "5"


@pytest.mark.parametrize(
    ("state", "phase"),
    [("", "Pending"), ("SUBMITTED", "Pending"), ("RUNNING", "Running"), ("UNKNOWN", "Running"),
     ("COMPLETED", "Succeeded"), ("FAILED", "Failed"), ("SUBMISSION_FAILED", "Failed")],
)  # fmt: skip
def test_application_states_map_to_phases(state: str, phase: str) -> None:
    application = {"status": {"applicationState": {"state": state, "errorMessage": "boom"}}}
    assert spark_application.phase_of(application) == (phase, "boom")
    assert spark_application.phase_of({}) == ("Pending", "")
