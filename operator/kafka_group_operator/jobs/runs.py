"""Pure builders of the ``JobRun`` of each job kind: snapshot, restore plan, compaction.

A scheduled snapshot is an OffsetSnapshot like any other (the schedule creates the resource),
so it runs as ``snapshot_run``. Each run's name is unique per run and valid as a
SparkApplication's name (63 characters at most); each names where a cluster run leaves its
result document, so either runner hands the same result back.

The snapshot and the restore plan read their group's state partition up to the coordinator's
read fence: they get ``--coordinator-url`` and the group's token (``group_token``: by value
for a local run's environment, by Secret for a SparkApplication). The compaction reads every
partition; the operator takes its fence from each partition's coordinator and passes the ends
(``--fenced-ends``).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from kafka_group_operator.jobs import runner
from kafka_group_operator.manifests import consumer_group as group_manifests
from kafka_group_operator.manifests import offset_jobs
from kafka_group_operator.manifests import spark_application as spark_manifests
from kafka_group_records import checkpoint

# What the snapshot job writes next to its Parquet (kafka_group_jobs.snapshot.MANIFEST_FILE;
# the operator never imports the jobs package, which needs Spark).
SNAPSHOT_MANIFEST = "manifest.json"


def group_token(group_name: str, value: str | None) -> runner.GroupToken:
    """The token of the ConsumerGroup ``group_name``: its Secret, and ``value`` when known."""
    return runner.GroupToken(
        group_manifests.token_secret_name(group_name), group_manifests.TOKEN_KEY, value
    )


def snapshot_run(
    snapshot: Mapping[str, Any],
    attempt: int,
    bootstrap: str,
    state_topic: str,
    group_id: str,
    coordinator_url: str | None = None,
    token: runner.GroupToken | None = None,
) -> runner.JobRun:
    """Attempt ``attempt`` of an OffsetSnapshot's job, owned by the OffsetSnapshot."""
    meta, spec = snapshot["metadata"], snapshot.get("spec") or {}
    uri = spec["storage"]["uri"]
    location = offset_jobs.snapshot_location(uri, meta["namespace"], meta["name"])
    arguments = offset_jobs.snapshot_arguments(
        bootstrap, state_topic, group_id, location, spec.get("asOf"), coordinator_url
    )
    return runner.JobRun(
        job="snapshot",
        name=spark_manifests.application_name(meta["name"], "snapshot", meta["uid"], attempt),
        namespace=meta["namespace"],
        arguments=tuple(arguments),
        owner=snapshot,
        spark=spec.get("spark"),
        storage_claim=runner.storage_claim_of(uri),
        result_uri=f"{location}/{SNAPSHOT_MANIFEST}",
        token=token,
    )


def reset_run(
    group: Mapping[str, Any],
    fingerprint: str,
    arguments: Sequence[str],
    results_uri: str | None,
    token: runner.GroupToken | None = None,
) -> runner.JobRun:
    """The restore job planning one value of ``spec.offsetReset``, owned by the ConsumerGroup.

    ``arguments`` are ``offset_jobs.restore_arguments`` (plan only). With ``results_uri`` the
    job also writes its plan (the audit) there, for a cluster run to hand it back.
    """
    meta = group["metadata"]
    name = spark_manifests.application_name(
        meta["name"], "restore", f"{meta['uid']}/{fingerprint}", 0
    )
    result_uri = None
    args = list(arguments)
    if results_uri:
        result_uri = f"{results_uri.rstrip('/')}/{meta['namespace']}/{name}.json"
        args += ["--audit", result_uri]
    return runner.JobRun(
        job="restore",
        name=name,
        namespace=meta["namespace"],
        arguments=tuple(args),
        owner=group,
        storage_claim=runner.storage_claim_of(result_uri),
        result_uri=result_uri,
        token=token,
    )


def compaction_run(
    bootstrap: str,
    state_topic: str,
    storage_uri: str,
    due: datetime.datetime,
    namespace: str,
    fenced_ends: Mapping[int, int] | None = None,
) -> runner.JobRun:
    """The state-topic compaction due at ``due``: no owning resource, in the operator's
    namespace, named after its time."""
    arguments = offset_jobs.compaction_arguments(
        bootstrap, state_topic, storage_uri, due, fenced_ends
    )
    output = arguments[arguments.index("--output") + 1]
    stamp = due.astimezone(datetime.UTC).isoformat()
    return runner.JobRun(
        job="compaction",
        name=spark_manifests.application_name("kgo-state", "compaction", stamp, 0),
        namespace=namespace,
        arguments=tuple(arguments),
        storage_claim=runner.storage_claim_of(storage_uri),
        result_uri=f"{output}/{checkpoint.MANIFEST_FILE}",
    )
