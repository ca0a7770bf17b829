"""The Dockerfile builds what the chart and the SparkApplications expect to find in the images.

No image can be built here, so this checks the contract between the files: every path the
Dockerfile copies exists, the operator image's command is one ``kgo`` has, and the jobs image
puts the job modules where ``build_spark_application`` points Spark.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kafka_group_operator import cli
from kafka_group_operator.manifests import spark_application

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_every_copied_path_exists() -> None:
    sources = [
        source
        for line in DOCKERFILE.splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    ]
    assert sources
    assert [source for source in sources if not (ROOT / source).exists()] == []


def test_both_targets_exist_and_the_operator_runs_kgo() -> None:
    targets = re.findall(r"^FROM \S+ AS (\w+)$", DOCKERFILE, re.MULTILINE)
    assert targets == ["operator", "jobs"]
    command = re.search(r'^CMD \["kgo", "(\w+)"\]$', DOCKERFILE, re.MULTILINE)
    assert command is not None
    assert command.group(1) in cli.COMMANDS


def test_the_chart_runs_a_kgo_command() -> None:
    deployment = (
        ROOT / "charts/kafka-group-operator/templates/operator-deployment.yaml"
    ).read_text()
    args = re.search(r"args: \[kgo, ([\w-]+)", deployment)
    assert args is not None
    assert args.group(1) in cli.COMMANDS


def test_the_jobs_image_holds_the_jobs_where_spark_applications_look() -> None:
    jobs_path = spark_application.SparkSettings(image="x").jobs_path
    assert jobs_path == "/opt/kafka-group-operator/kafka_group_jobs"
    assert f"       {jobs_path}" in DOCKERFILE
    for job in ("snapshot", "compaction", "restore"):
        assert (ROOT / "operator/kafka_group_jobs" / f"{job}.py").exists()


def test_the_chart_defaults_name_the_images_the_dockerfile_documents() -> None:
    values = yaml.safe_load((ROOT / "charts/kafka-group-operator/values.yaml").read_text())
    operator_image = f"{values['image']['registry']}/{values['image']['repository']}"
    assert f"-t {operator_image}:" in DOCKERFILE
    assert f"-t {values['spark']['image']}" in DOCKERFILE
