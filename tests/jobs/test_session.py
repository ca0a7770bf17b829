"""Where the local JVM's class archive lives, and which jobs record it (no Spark started)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from kafka_group_jobs import session


def test_the_archive_is_named_by_the_environment_or_kept_in_the_user_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(session.ARCHIVE_ENV, "off")
    assert session.class_archive() is None
    monkeypatch.setenv(session.ARCHIVE_ENV, str(tmp_path / "classes.jsa"))
    assert session.class_archive() == tmp_path / "classes.jsa"
    monkeypatch.delenv(session.ARCHIVE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    archive = session.class_archive()
    assert archive is not None
    assert archive.parent == tmp_path / "kafka-group-jobs"
    assert archive.name.startswith("spark-classes-")
    assert archive.suffix == ".jsa"
    assert session.class_archive() == archive  # the same installs, the same name


def test_only_a_local_job_without_an_archive_records_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    archive = tmp_path / "classes.jsa"
    monkeypatch.setenv(session.ARCHIVE_ENV, str(archive))
    monkeypatch.setattr(session.SparkSession, "_instantiatedSession", None)
    stale = tmp_path / "classes.jsa1234.part"
    stale.write_bytes(b"left by a killed job")
    old = time.time() - session.STALE_RECORDING_S - 60
    os.utime(stale, (old, old))

    assert session._archive_to_record("k8s://https://api:6443") is None
    # Under spark-submit the master is the submit command's; run directly, the default one
    # is local.
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    assert session._archive_to_record(None) is None
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")
    recording = session._archive_to_record("local[2]")
    assert recording is not None
    assert recording.parent == tmp_path
    assert recording.name.endswith(".part")
    assert not stale.exists()

    archive.write_bytes(b"recorded")
    assert session._archive_to_record("local[2]") is None
    monkeypatch.setenv(session.ARCHIVE_ENV, "off")
    assert session._archive_to_record("local[2]") is None


@pytest.mark.spark
def test_run_directly_a_job_is_on_the_tuned_local_master_with_no_ui(spark: SparkSession) -> None:
    """Without --master: local Spark tuned to start fast, no web UI (nothing listens beyond
    the driver's own ports, which are on loopback), no console bar over the job's progress,
    and the JVM's output in a log file, not on the terminal."""
    context = spark.sparkContext
    assert context.master == session.DEFAULT_MASTER == "local[2]"
    assert context.uiWebUrl is None
    conf = dict(context.getConf().getAll())
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.ui.showConsoleProgress"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert "-XX:TieredStopAtLevel=1" in conf["spark.driver.extraJavaOptions"].split()
    assert conf["spark.driver.host"] in ("127.0.0.1", "localhost")
    log = session._log
    assert log is not None
    assert "Spark" in log.read_text(errors="replace")  # its start-up lines went there
