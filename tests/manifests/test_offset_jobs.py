"""Planning of snapshots, schedules and online resets: pure functions, exact values."""

from __future__ import annotations

import datetime

import pytest

from kafka_group_operator.jobs import runner as job_runner
from kafka_group_operator.manifests import offset_jobs

UTC = datetime.UTC


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_snapshot_arguments_and_location() -> None:
    location = offset_jobs.snapshot_location("s3a://bucket/snaps/", "shop", "nightly")
    assert location == "s3a://bucket/snaps/shop/nightly"
    arguments = offset_jobs.snapshot_arguments(
        "k:9092", "state", "shop.pay", location, "2026-01-01T00:00:00Z"
    )
    assert arguments == [
        "--bootstrap", "k:9092", "--topic", "state", "--group", "shop.pay",
        "--output", "s3a://bucket/snaps/shop/nightly", "--allow-empty", "--overwrite",
        "--as-of", "2026-01-01T00:00:00Z",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("reset", "expected_tail"),
    [
        ({"to": "earliest"}, ["--to", "earliest", "--topics", "orders,refunds"]),
        (
            {"to": "offset", "offset": 7},
            ["--to", "offset", "--value", "7", "--topics", "orders,refunds"],
        ),
        (
            {"to": "shiftBy", "shiftBy": -3},
            ["--to", "shift-by", "--value", "-3", "--topics", "orders,refunds"],
        ),
        (
            {"to": "duration", "duration": "PT1H"},
            ["--to", "duration", "--duration", "PT1H", "--topics", "orders,refunds"],
        ),
        (
            {
                "to": "datetime",
                "datetime": "2026-01-01T00:00:00Z",
                "topics": [{"name": "orders", "partitions": [0, 2]}],
            },
            [
                "--to",
                "datetime",
                "--datetime",
                "2026-01-01T00:00:00Z",
                "--topics",
                "orders",
                "--partitions",
                "orders:0,2",
            ],
        ),
        (
            {"to": "snapshot", "snapshot": "nightly"},
            ["--to", "snapshot", "--snapshot", "file:///s", "--topics", "orders,refunds"],
        ),
    ],
)
def test_restore_arguments_always_plan_only(
    reset: dict[str, object], expected_tail: list[str]
) -> None:
    arguments = offset_jobs.restore_arguments(
        "k:9092", "state", "g", reset, ("orders", "refunds"), "file:///s"
    )
    assert arguments[:6] == ["--bootstrap", "k:9092", "--topic", "state", "--group", "g"]
    assert arguments[6:] == [*expected_tail, "--dry-run"]


def test_a_reset_is_pending_once_per_value() -> None:
    reset = {"to": "earliest", "dryRun": False}
    assert offset_jobs.reset_pending(reset, None)
    fingerprint = offset_jobs.reset_fingerprint(reset)
    assert offset_jobs.reset_fingerprint({"dryRun": False, "to": "earliest"}) == fingerprint
    assert offset_jobs.reset_pending(reset, {"fingerprint": fingerprint, "phase": "Running"})
    assert not offset_jobs.reset_pending(reset, {"fingerprint": fingerprint, "phase": "Done"})
    assert not offset_jobs.reset_pending(reset, {"fingerprint": fingerprint, "phase": "Failed"})
    assert offset_jobs.reset_pending(
        {"to": "latest"}, {"fingerprint": fingerprint, "phase": "Done"}
    )
    assert not offset_jobs.reset_pending(None, None)


def test_commits_of_an_audit_skip_partitions_without_a_new_offset() -> None:
    audit = {
        "partitions": [
            {"topic": "t", "partition": 0, "oldOffset": 5, "newOffset": 0, "clamp": None},
            {"topic": "t", "partition": 1, "oldOffset": None, "newOffset": None, "clamp": None},
        ]
    }
    assert offset_jobs.commits_of(audit) == {("t", 0): 0}


def test_snapshot_status_and_bounded_retries() -> None:
    manifest = {
        "location": "file:///x",
        "records": 5,
        "partitions": {"a": [0, 1], "b": [3]},
        "takenAt": "2026-11-22T00:00:00.000Z",
        "checksum": "sha256:ab",
    }
    assert offset_jobs.snapshot_status(manifest) == {
        "phase": "Succeeded",
        "location": "file:///x",
        "records": 5,
        "partitions": 3,
        "takenAt": "2026-11-22T00:00:00.000Z",
        "checksum": "sha256:ab",
        "message": "",
    }
    assert offset_jobs.next_attempt(1, "boom") == (True, "attempt 1 of 3 failed, retrying: boom")
    assert offset_jobs.next_attempt(3, "boom") == (False, "failed after 3 attempts: boom")


def test_due_runs_collapse_missed_ones_and_wait_for_the_next() -> None:
    created = at("2026-11-20T10:05:00")
    assert offset_jobs.due_run("0 * * * *", None, created, at("2026-11-20T10:59:59")) is None
    assert offset_jobs.due_run("0 * * * *", None, created, at("2026-11-20T13:30:00")) == at(
        "2026-11-20T13:00:00"
    )
    last = at("2026-11-20T13:00:00")
    assert offset_jobs.due_run("0 * * * *", last, created, at("2026-11-20T13:30:00")) is None
    assert offset_jobs.due_run("@daily", last, created, at("2026-11-21T00:00:00")) == at(
        "2026-11-21T00:00:00"
    )


def test_scheduled_snapshot_body_and_pruning() -> None:
    group = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": "payments", "namespace": "shop", "uid": "u-1"},
    }
    body = offset_jobs.build_scheduled_snapshot(
        group,
        {"schedule": "@daily", "storage": {"uri": "file:///snaps"}},
        at("2026-11-21T00:00:00"),
    )
    assert body["metadata"]["name"] == "payments-202611210000"
    assert body["metadata"]["labels"] == {"kafkagroups.io/scheduled-by": "payments"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert body["spec"] == {
        "consumerGroupRef": {"name": "payments"},
        "storage": {"uri": "file:///snaps"},
    }
    existing = [
        {"metadata": {"name": f"payments-{day}", "creationTimestamp": f"2026-11-{day}T00:00:00Z"}}
        for day in ("21", "19", "20", "18")
    ]
    assert offset_jobs.snapshots_to_prune(existing, 2) == ["payments-18", "payments-19"]
    assert offset_jobs.snapshots_to_prune(existing, 7) == []


def test_job_outcomes_give_the_result_or_the_clearest_reason() -> None:
    ok = job_runner.outcome_of(0, 'log\nKGO-RESULT {"records": 3}\n', "")
    assert ok == job_runner.JobOutcome(True, {"records": 3})
    failed = job_runner.outcome_of(
        1,
        "",
        "WARN noise\nTraceback...\nkafka_group_jobs.topics.TopicError: topic 's' does not exist\n",
    )
    assert failed == job_runner.JobOutcome(
        False, reason="kafka_group_jobs.topics.TopicError: topic 's' does not exist"
    )
    assert job_runner.outcome_of(137, "", "").reason == "exit status 137"


def test_spark_defaults_come_from_the_chart_environment() -> None:
    mode, settings = job_runner.spark_defaults(
        {
            "KGO_SPARK_MODE": "local",
            "KGO_SPARK_IMAGE": "img:1",
            "KGO_SPARK_CONF": '{"spark.a": "b"}',
        }
    )
    assert (mode, settings.image, dict(settings.spark_conf)) == ("local", "img:1", {"spark.a": "b"})


def test_scheduled_compaction_runs_into_its_own_checkpoint_directory() -> None:
    due = offset_jobs.next_run("0 3 * * *", at("2026-11-21T03:00:00"))
    assert due == at("2026-11-22T03:00:00")
    assert offset_jobs.compaction_arguments("k:9092", "state", "s3a://b/ckpt/", due) == [
        "--bootstrap",
        "k:9092",
        "--topic",
        "state",
        "--output",
        "s3a://b/ckpt/checkpoint-20261122T030000Z",
        "--overwrite",
    ]


def test_snapshot_status_of_an_unreadable_manifest_leaves_counts_unknown() -> None:
    status = offset_jobs.snapshot_status({"location": "s3a://b/shop/nightly"})
    assert (status["phase"], status["location"]) == ("Succeeded", "s3a://b/shop/nightly")
    assert (status["records"], status["partitions"], status["takenAt"]) == (None, None, None)
