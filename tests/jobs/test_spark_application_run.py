"""The SparkApplication the operator builds for an OffsetSnapshot, run as its driver pod runs
it: ``spark-submit --deploy-mode client`` on the application file, with the application's
arguments, Spark settings and driver environment (``bench.spark_application``), on a local
master against a real broker and coordinator.

The other job tests call the jobs' ``main`` or ``python -m``; this is the only one that runs
what a SparkApplication names: the job module as a script, its arguments with no ``--json``
(the result is the manifest at the location), the image's JVM flags with its class archive
missing, the group's token taken from the Secret the driver's ``env`` refers to, and Spark
laid out as the jobs image lays it out: without the distribution's Python zips (removed by
the Dockerfile), so the driver and its Python workers import the installed pyspark.

On Apache Kafka only: what is tested is the application's shape; the job's reading on both
brokers is ``test_jobs_on_broker``'s.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench import spark_application as local_submit
from kafka_group_jobs import snapshot
from kafka_group_operator.commands import demo
from kafka_group_operator.embedded import kafka
from kafka_group_operator.jobs import runner, runs
from kafka_group_operator.manifests import spark_application as spark_manifests

pytestmark = [pytest.mark.broker, pytest.mark.slow]

NAMESPACE = "shop"


def offset_snapshot(location: Path) -> dict[str, object]:
    return {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "OffsetSnapshot",
        "metadata": {"name": "nightly", "namespace": NAMESPACE, "uid": "uid-nightly"},
        "spec": {"consumerGroupRef": {"name": "payments"}, "storage": {"uri": location.as_uri()}},
    }


def test_an_offset_snapshot_s_spark_application_runs_and_matches_the_coordinator(
    kafka_broker: kafka.KafkaCluster, tmp_path: Path, spark: SparkSession
) -> None:
    (tmp_path / "group").mkdir()
    group = demo.LocalGroup(
        group="payments-sa", topic="payments-sa", partitions=3, directory=tmp_path / "group"
    )
    group.start(kafka_broker)
    try:
        assert group.broker is not None
        producer = demo.Producer(group.broker.bootstrap, group.topic, group.partitions, rate=200)
        producer.start()
        group.start_member("payments-0")
        coordinator = group.client()
        deadline = time.monotonic() + 60
        while len(coordinator.fetch()) < group.partitions:
            assert time.monotonic() < deadline, "the member committed no offsets"
            time.sleep(0.2)
        group.stop_members(["payments-0"])
        producer.stop()
        committed = coordinator.fetch()

        token = runs.group_token("payments", group.token)
        run = runs.snapshot_run(
            offset_snapshot(tmp_path / "snapshots"),
            1,
            group.broker.bootstrap,
            group.state_topic,
            group.group,
            coordinator_url=group.coordinator_url,
            token=token,
        )
        application = runner.build_application(
            run, spark_manifests.SparkSettings(image="registry.example/kafka-group-jobs:1")
        )
        # The token reaches the driver by reference only.
        assert group.token not in json.dumps(application)
        home = local_submit.image_spark_home(tmp_path)
        done = subprocess.run(
            local_submit.submit_command(application, home=home),
            env=local_submit.driver_environment(
                application, {(token.secret, token.key): group.token}, home=home
            ),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    finally:
        group.stop()

    # What the operator reads back as the run's result: the manifest at the location.
    manifest = runner.read_result(run.result_uri)
    assert manifest is not None, (done.stdout + done.stderr)[-4000:]
    assert manifest["records"] == len(committed)
    # Read up to the coordinator's own read fence, through its token.
    assert manifest["stateTopic"]["fence"] == "coordinator"
    _, frame = snapshot.read(spark, manifest["location"])
    assert {(row.topic, row.partition): row.offset for row in frame.collect()} == committed
