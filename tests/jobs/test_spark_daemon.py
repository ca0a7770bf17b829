"""Where a local job's Python workers import pyspark from (``spark_daemon``)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from kafka_group_jobs import spark_daemon


def _package(root: Path) -> Path:
    """A pyspark package laid out as pip installs it: its own distribution's zip inside."""
    (root / "pyspark" / "python" / "lib").mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("")
    with zipfile.ZipFile(root / "pyspark" / "python" / "lib" / "pyspark.zip", "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
    return root / "pyspark" / "python" / "lib" / "pyspark.zip"


def test_the_installed_package_s_own_zip_is_dropped(tmp_path: Path) -> None:
    own = _package(tmp_path / "site")
    py4j = str(own.parent / "py4j-src.zip")
    path = [str(own), py4j, "", str(tmp_path / "site")]
    assert spark_daemon.installed_first(path) == [py4j, "", str(tmp_path / "site")]


def test_another_distribution_s_zip_is_kept(tmp_path: Path) -> None:
    """A Spark of its own (``SPARK_HOME``) may be another release than a pyspark installed
    beside it: its zip stays first."""
    _package(tmp_path / "site")
    other = _package(tmp_path / "spark-home")
    path = [str(other), str(tmp_path / "site")]
    assert spark_daemon.installed_first(path) == path


def test_a_zip_with_no_installed_package_is_kept(tmp_path: Path) -> None:
    own = _package(tmp_path / "spark-home")
    path = [str(own), str(tmp_path / "elsewhere")]
    assert spark_daemon.installed_first(path) == path


def test_the_installed_zip_is_dropped_however_the_path_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By a link or relative to the working directory, as imports resolve entries."""
    own = _package(tmp_path / "site")
    (tmp_path / "linked").symlink_to(own.parent, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    linked, relative = (
        str(tmp_path / "linked" / "pyspark.zip"),
        "site/pyspark/python/lib/pyspark.zip",
    )
    assert spark_daemon.installed_first([linked, relative, "site"]) == ["site"]


def _origin(_: object) -> list[str]:
    import pyspark as worker_pyspark

    return [str(worker_pyspark.__file__)]


@pytest.mark.spark
def test_a_local_job_s_workers_import_the_installed_compiled_pyspark(spark: SparkSession) -> None:
    """Spark puts the distribution's ``pyspark.zip`` first on a worker's path; from a zip
    every worker compiles pyspark again. The job's workers import the installed package."""
    installed = Path(pyspark.__file__).parent
    assert (installed / "python" / "lib" / "pyspark.zip").is_file()  # pip's layout: the case
    origins = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_origin).collect()
    assert origins
    assert all(Path(origin).parent == installed for origin in origins), origins
