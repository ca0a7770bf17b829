"""The Dockerfile builds what the chart and the SparkApplications expect to find in the images.

No image can be built here, so this checks the contract between the files: every path the
Dockerfile copies exists; the operator image is slim (the operator extra only, no Java, no
pyspark) and runs a ``kgo`` command; the jobs image has Java 17, the ``spark`` extra and pyspark
of the release the SparkApplications name, Spark's entrypoint, and the job modules where the
SparkApplications point Spark; and the chart's ``spark.image`` is the jobs image that every
SparkApplication references.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import yaml

from kafka_group_operator import cli
from kafka_group_operator.jobs import runner, runs
from kafka_group_operator.manifests import offset_jobs, spark_application

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
CHART = ROOT / "charts/kafka-group-operator"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def stage(name: str) -> str:
    """The instructions of one build stage (from its FROM to the next)."""
    found = re.search(rf"^FROM \S+ AS {name}\n(.*?)(?=^FROM |\Z)", DOCKERFILE, re.M | re.S)
    assert found is not None, name
    return "\n".join(line for line in found.group(1).splitlines() if not line.startswith("#"))


def test_every_copied_path_exists() -> None:
    sources = [
        source
        for line in DOCKERFILE.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    assert sources
    assert [source for source in sources if not (ROOT / source).exists()] == []


def test_both_targets_exist_and_the_operator_runs_kgo() -> None:
    targets = re.findall(r"^FROM \S+ AS (\w+)$", DOCKERFILE, re.MULTILINE)
    assert [t for t in targets if t != "spark"] == ["operator", "jobs"]
    command = re.search(r'^CMD \["kgo", "(\w+)"\]$', stage("operator"), re.MULTILINE)
    assert command is not None
    assert command.group(1) in cli.COMMANDS


def test_the_operator_image_is_slim() -> None:
    operator = stage("operator")
    assert "pip install --no-cache-dir '.[operator]'" in operator
    for heavy in ("java", "jdk", "jre", "pyspark", "spark"):
        assert heavy not in operator.lower(), heavy


def test_the_jobs_image_has_java_17_the_spark_extra_and_the_named_spark_release() -> None:
    jobs = stage("jobs")
    assert "openjdk-17-jre-headless" in jobs
    assert re.search(r"pip install .*'\.\[operator,spark\]'", jobs)
    assert '"pyspark==${SPARK_VERSION}"' in jobs
    release = re.search(r"^ARG SPARK_VERSION=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert release is not None
    # The SparkApplications declare the release the image carries.
    assert release.group(1) == spark_application.SparkSettings(image="x").spark_version
    assert "FROM spark:${SPARK_VERSION}-scala2.13-java17-python3-ubuntu AS spark" in DOCKERFILE
    # Spark on Kubernetes starts driver and executor pods through its own entrypoint.
    assert 'ENTRYPOINT ["/opt/entrypoint.sh"]' in jobs
    assert "COPY --from=spark /opt/entrypoint.sh" in jobs


def test_the_chart_runs_a_kgo_command() -> None:
    operator = (CHART / "templates/operator-statefulset.yaml").read_text()
    args = re.search(r"args: \[kgo, ([\w-]+)", operator)
    assert args is not None
    assert args.group(1) in cli.COMMANDS
    # The operator learns the jobs image from spark.image.
    assert re.search(
        r"- name: KGO_SPARK_IMAGE\n\s+value: \{\{ \.Values\.spark\.image \| quote \}\}", operator
    )


def test_the_jobs_image_holds_the_jobs_where_spark_applications_look() -> None:
    jobs_path = spark_application.SparkSettings(image="x").jobs_path
    assert jobs_path == "/opt/kafka-group-operator/kafka_group_jobs"
    assert f"       {jobs_path}" in stage("jobs")
    for job in spark_application.JOBS:
        module = (ROOT / "operator/kafka_group_jobs" / f"{job}.py").read_text()
        # Spark runs the file itself: it must run its main when run as a script.
        assert 'if __name__ == "__main__":\n    sys.exit(main())' in module, job


def test_the_chart_defaults_name_the_images_the_dockerfile_documents() -> None:
    operator_image = f"{VALUES['image']['registry']}/{VALUES['image']['repository']}"
    assert f"-t {operator_image}:" in DOCKERFILE
    assert f"--target jobs     -t {VALUES['spark']['image']}" in DOCKERFILE
    # Without the chart's environment the operator falls back to the same image.
    assert VALUES["spark"]["image"] == runner.DEFAULT_JOBS_IMAGE


def test_every_spark_application_runs_the_charts_jobs_image() -> None:
    environment = {"KGO_SPARK_IMAGE": VALUES["spark"]["image"]}
    _, settings = runner.spark_defaults(environment)
    due = datetime.datetime(2026, 11, 22, 3, tzinfo=datetime.UTC)
    group = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "ConsumerGroup",
        "metadata": {"name": "g", "namespace": "ns", "uid": "u1"},
    }
    snapshot = {
        "apiVersion": "kafkagroups.io/v1alpha1",
        "kind": "OffsetSnapshot",
        "metadata": {"name": "s", "namespace": "ns", "uid": "u2"},
        "spec": {"consumerGroupRef": {"name": "g"}, "storage": {"uri": "s3a://b/s"}},
    }
    plan = offset_jobs.restore_arguments("k:9092", "t", "g", {"to": "latest"}, ["orders"])
    every = [
        runs.snapshot_run(snapshot, 1, "k:9092", "t", "g"),
        runs.reset_run(group, "f" * 16, plan, "s3a://b/results"),
        runs.compaction_run("k:9092", "t", "s3a://b/ckpt", due, "kgo"),
    ]
    assert {run.job for run in every} == set(spark_application.JOBS)
    for run in every:
        spec = runner.build_application(run, settings)["spec"]
        assert spec["image"] == VALUES["spark"]["image"]
        assert spec["mainApplicationFile"] == f"local://{settings.jobs_path}/{run.job}.py"


def test_the_jobs_image_records_the_class_archive_spark_applications_start_from() -> None:
    jobs = stage("jobs")
    archive = spark_application.CLASS_ARCHIVE
    assert f"ENV KGO_SPARK_CLASS_ARCHIVE={archive}\n" in jobs
    assert 'RUN python3 -m kafka_group_jobs.warmup "${KGO_SPARK_CLASS_ARCHIVE}"' in jobs
    # Recorded after the install (the jars it maps), before the image drops to Spark's user.
    assert jobs.index("pip install") < jobs.index("kafka_group_jobs.warmup") < jobs.index("USER")
    assert f"-XX:SharedArchiveFile={archive}" in spark_application.JVM_OPTIONS


def test_the_jobs_image_drops_the_distributions_python_zips() -> None:
    """Spark puts ``python/lib``'s zips first on every driver's and worker's path, and a zip
    holds no compiled bytecode: the image imports the pip-installed pyspark of the same
    release instead (tests/jobs/test_spark_application_run.py runs a job laid out so)."""
    jobs = stage("jobs")
    removal = "rm /opt/spark/python/lib/pyspark.zip /opt/spark/python/lib/py4j-*-src.zip"
    assert removal in jobs
    # Once the same release is installed, and before the warm-up records the class archive.
    pinned = jobs.index('"pyspark==${SPARK_VERSION}"')
    assert pinned < jobs.index(removal) < jobs.index("kafka_group_jobs.warmup")
