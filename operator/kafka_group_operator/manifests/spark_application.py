"""Pure builders for the Spark jobs' ``SparkApplication`` (``sparkoperator.k8s.io/v1beta2``).

One SparkApplication per run, never patched: the spark-operator kills and resubmits a running
application whose spec changes, so a retry is a new object with a new name. The name is
derived from the owner's uid and the attempt number, so a handler that runs twice for the same
attempt builds the same name and the second create is a harmless conflict.

The jobs are the ``kafka_group_jobs`` modules installed in the Spark image; the application
file is the job module itself (``<jobsPath>/<job>.py``), run by ``spark-submit`` with the same
arguments as ``python -m kafka_group_jobs.<job>``. Retries are ours (``restartPolicy: Never``).

Also here: how an application's ``status.applicationState.state`` maps onto our phases.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "sparkoperator.k8s.io/v1beta2"
KIND = "SparkApplication"
JOBS = ("snapshot", "compaction", "restore")
MANAGED_BY = "kafka-group-operator"
JOB_LABEL = "kafkagroups.io/job"
OWNER_LABEL = "kafkagroups.io/owner"
KAFKA_CONFIG_MOUNT = "/etc/kafka-group/kafka"
PVC_MOUNT_ROOT = "/mnt/kgo"  # kafka_group_jobs.storage reads pvc:// URIs from here
MAX_NAME_LENGTH = 63
# The variable the jobs read the group's bearer token from (kafka_group_jobs.arguments).
TOKEN_ENV = "KGO_GROUP_TOKEN"
# The JVM class archive the jobs image records while it is built (Dockerfile, with
# ``kafka_group_jobs.warmup``): driver and executors start from it. ``-Xshare:auto``: a JVM that
# cannot use it (another image, another class path) starts as it would without.
CLASS_ARCHIVE = "/opt/kafka-group-operator/spark-classes.jsa"
# The client compiler only, as local jobs run (kafka_group_jobs.session): on a contended core
# the server compiler's threads cost a job more than its code gains (3M records on local[2]:
# a snapshot took 95 s with the client compiler only and 151 s with both). A resource's or the
# chart's sparkConf replaces these options.
JVM_OPTIONS = f"-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={CLASS_ARCHIVE} -Xshare:auto"
DEFAULT_SPARK_CONF = {
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
    "spark.executor.extraJavaOptions": JVM_OPTIONS,
}

# applicationState.state -> our phase. UNKNOWN is transient (a lost driver pod often comes
# back), unlike Airflow's sensor which fails on it; the handler bounds how long it may last.
PHASES: dict[str, str] = {
    "": "Pending",
    "SUBMITTED": "Pending",
    "PENDING_RERUN": "Pending",
    "SUSPENDED": "Pending",
    "SUSPENDING": "Pending",
    "RESUMING": "Pending",
    "RUNNING": "Running",
    "SUCCEEDING": "Running",
    "FAILING": "Running",
    "INVALIDATING": "Running",
    "UNKNOWN": "Running",
    "COMPLETED": "Succeeded",
    "FAILED": "Failed",
    "SUBMISSION_FAILED": "Failed",
}


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """Spark settings of one run: the chart's defaults overlaid with the resource's ``spark``."""

    image: str
    spark_version: str = "4.0.1"
    jobs_path: str = "/opt/kafka-group-operator/kafka_group_jobs"
    service_account: str = "spark-operator-spark"
    image_pull_policy: str = "IfNotPresent"
    driver_cores: int = 1
    driver_memory: str = "1g"
    executor_instances: int = 2
    executor_cores: int = 1
    executor_memory: str = "1g"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    time_to_live_seconds: int = 3600


def overlay(defaults: SparkSettings, spark_spec: Mapping[str, Any] | None) -> SparkSettings:
    """``defaults`` with an OffsetSnapshot's ``spec.spark`` applied (its ``sparkConf`` merged)."""
    spec = spark_spec or {}
    driver, executor = spec.get("driver") or {}, spec.get("executor") or {}
    return SparkSettings(
        image=spec.get("image", defaults.image),
        spark_version=defaults.spark_version,
        jobs_path=defaults.jobs_path,
        service_account=spec.get("serviceAccount", defaults.service_account),
        image_pull_policy=defaults.image_pull_policy,
        driver_cores=int(driver.get("cores", defaults.driver_cores)),
        driver_memory=str(driver.get("memory", defaults.driver_memory)),
        executor_instances=int(executor.get("instances", defaults.executor_instances)),
        executor_cores=int(executor.get("cores", defaults.executor_cores)),
        executor_memory=str(executor.get("memory", defaults.executor_memory)),
        spark_conf={**defaults.spark_conf, **(spec.get("sparkConf") or {})},
        time_to_live_seconds=defaults.time_to_live_seconds,
    )


def application_name(owner_name: str, job: str, owner_uid: str, attempt: int) -> str:
    """``<owner>-<job>-<hash>``, unique per owner and attempt, at most 63 characters."""
    digest = hashlib.sha256(f"{owner_uid}/{job}/{attempt}".encode()).hexdigest()[:8]
    suffix = f"-{job}-{digest}"
    return owner_name[: MAX_NAME_LENGTH - len(suffix)].rstrip("-.") + suffix


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    metadata = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_spark_application(
    *,
    owner: Mapping[str, Any] | None,
    job: str,
    arguments: Sequence[str],
    settings: SparkSettings,
    attempt: int = 0,
    kafka_secret: str | None = None,
    storage_claim: str | None = None,
    name: str | None = None,
    namespace: str | None = None,
    token_secret: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The SparkApplication running ``job`` with ``arguments``, owned by ``owner``.

    Named ``name`` (a run's unique name) or else after the owner and ``attempt``; in
    ``namespace`` or else the owner's. A run with no owning resource (the state-topic
    compaction) has no owner reference and needs both ``name`` and ``namespace``.

    ``kafka_secret`` (TLS/SASL settings, one file per librdkafka property) is mounted into the
    driver and executors and passed as ``--kafka-config-dir``; ``storage_claim`` mounts a PVC
    for ``pvc://`` storage. ``token_secret`` (a Secret's name and key) gives the driver the
    group's bearer token as ``KGO_GROUP_TOKEN``, by reference: the token is in no argument and
    in no field of the application (only the driver calls the coordinator).
    """
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; expected one of {', '.join(JOBS)}")
    meta = owner["metadata"] if owner is not None else {}
    if name is None:
        if owner is None:
            raise ValueError("a SparkApplication with no owner needs a name")
        name = application_name(meta["name"], job, meta["uid"], attempt)
    namespace = namespace or meta.get("namespace")
    if not namespace:
        raise ValueError("a SparkApplication needs a namespace")
    labels = {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/name": "kafka-group-jobs",
        JOB_LABEL: job,
        OWNER_LABEL: meta.get("name", MANAGED_BY),
    }
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    args = list(arguments)
    if kafka_secret:
        volumes.append({"name": "kafka-config", "secret": {"secretName": kafka_secret}})
        mounts.append({"name": "kafka-config", "mountPath": KAFKA_CONFIG_MOUNT, "readOnly": True})
        args += ["--kafka-config-dir", KAFKA_CONFIG_MOUNT]
    if storage_claim:
        volumes.append({"name": "storage", "persistentVolumeClaim": {"claimName": storage_claim}})
        mounts.append({"name": "storage", "mountPath": f"{PVC_MOUNT_ROOT}/{storage_claim}"})
    driver: dict[str, Any] = {
        "cores": settings.driver_cores,
        "memory": settings.driver_memory,
        "serviceAccount": settings.service_account,
        "labels": dict(labels),
    }
    executor: dict[str, Any] = {
        "instances": settings.executor_instances,
        "cores": settings.executor_cores,
        "memory": settings.executor_memory,
        "labels": dict(labels),
    }
    if token_secret is not None:
        secret, key = token_secret
        driver["env"] = [
            {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        ]
    if mounts:
        driver["volumeMounts"] = mounts
        executor["volumeMounts"] = [dict(mount) for mount in mounts]
    spec: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "mainApplicationFile": f"local://{settings.jobs_path.rstrip('/')}/{job}.py",
        "arguments": args,
        "sparkVersion": settings.spark_version,
        "sparkConf": {
            **DEFAULT_SPARK_CONF,
            # The executors' cores, known before any executor registers: the jobs cut their
            # read into one task per core (kafka_group_jobs.arguments.records_per_split).
            "spark.default.parallelism": str(settings.executor_instances * settings.executor_cores),
            **settings.spark_conf,
        },
        "restartPolicy": {"type": "Never"},
        "timeToLiveSeconds": settings.time_to_live_seconds,
        "driver": driver,
        "executor": executor,
    }
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            **({"ownerReferences": [owner_reference(owner)]} if owner is not None else {}),
        },
        "spec": spec,
    }


def phase_of(application: Mapping[str, Any]) -> tuple[str, str]:
    """Our phase for an application, and its error message (empty when none)."""
    state = (application.get("status") or {}).get("applicationState") or {}
    return PHASES.get(str(state.get("state", "")), "Running"), str(state.get("errorMessage", ""))
