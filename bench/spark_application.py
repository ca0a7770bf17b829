"""A SparkApplication run the way its driver pod runs it, on a local master.

The spark-operator submits a ``SparkApplication`` (``manifests.spark_application``) with
``spark-submit`` in cluster mode; the driver pod then runs the image's entrypoint, which runs
``spark-submit --deploy-mode client`` on the application file with the application's
``arguments`` and every ``sparkConf`` entry, the driver's cores and memory as Spark settings,
and the driver's environment. ``submit_command`` builds that command for a local master:
the same application file (``local://`` paths of the jobs image mapped to this install of
``kafka_group_jobs``), the same arguments, the same Spark settings (the image's JVM flags
included, with the image's class archive path mapped to a local one), in client mode. Only
the master differs: executors are threads of the driver's JVM.

Spark can be laid out as the jobs image lays it out (``image_spark_home``): without the
distribution's Python zips, which the Dockerfile removes so that drivers and workers import
the installed, compiled pyspark.

What it shows: that the application the operator builds runs (its file, its arguments,
its settings, Spark as the image lays it out) and what its settings cost against the jobs'
own local path (``bench.jobs``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyspark

import kafka_group_jobs
from kafka_group_operator.manifests import spark_application

LOCAL_SCHEME = "local://"


def spark_home() -> Path:
    """The Spark of this pyspark install."""
    return Path(pyspark.__file__).parent


def image_spark_home(directory: Path) -> Path:
    """This install's Spark as the jobs image lays it out: everything but ``python/`` (the
    distribution's ``pyspark.zip`` and py4j's zip, which the Dockerfile removes), as symbolic
    links in ``directory``."""
    view = directory / "spark-home"
    view.mkdir(parents=True)
    for entry in spark_home().iterdir():
        if entry.name != "python":
            (view / entry.name).symlink_to(entry)
    return view


def local_file(uri: str, jobs_path: str) -> str:
    """The file a ``local://`` URI of the jobs image names, in this install."""
    if not uri.startswith(LOCAL_SCHEME):
        raise ValueError(f"not a file of the image: {uri!r}")
    path = uri.removeprefix(LOCAL_SCHEME)
    prefix = jobs_path.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path!r} is not under the image's jobs path {jobs_path!r}")
    return str(Path(kafka_group_jobs.__file__).parent / path.removeprefix(prefix))


def submit_command(
    application: Mapping[str, Any],
    *,
    master: str = "local[2]",
    class_archive: Path | None = None,
    jobs_path: str = spark_application.SparkSettings(image="").jobs_path,
    home: Path | None = None,
) -> list[str]:
    """The driver's ``spark-submit`` for ``application``, on ``master``, from the Spark at
    ``home`` (this install's by default; its environment must name the same, see
    ``driver_environment``).

    ``class_archive``: the local file standing for the image's class archive (where
    ``kafka_group_jobs.warmup`` recorded one); the settings name the image's path, which
    does not exist here."""
    spec = application["spec"]
    if spec.get("type") != "Python":
        raise ValueError(f"not a Python application: {spec.get('type')!r}")
    driver = spec.get("driver") or {}
    conf = {str(key): str(value) for key, value in (spec.get("sparkConf") or {}).items()}
    if class_archive is not None:
        conf = {
            key: value.replace(spark_application.CLASS_ARCHIVE, str(class_archive))
            for key, value in conf.items()
        }
    if "cores" in driver:
        conf["spark.driver.cores"] = str(driver["cores"])
    if "memory" in driver:
        conf["spark.driver.memory"] = str(driver["memory"])
    command = [
        str((home or spark_home()) / "bin" / "spark-submit"),
        *("--master", master, "--deploy-mode", "client"),
        *("--name", str(application["metadata"]["name"])),
    ]
    for key, value in sorted(conf.items()):
        command += ["--conf", f"{key}={value}"]
    return [
        *command,
        local_file(str(spec["mainApplicationFile"]), jobs_path),
        *(str(argument) for argument in spec.get("arguments") or ()),
    ]


def driver_environment(
    application: Mapping[str, Any],
    secrets: Mapping[tuple[str, str], str],
    base: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> dict[str, str]:
    """The driver's environment: ``base`` (this process's), plus the application's driver
    ``env``, each ``secretKeyRef`` read from ``secrets`` by (Secret, key), as the kubelet would;
    the job's Python workers run this interpreter, as the image's run its own. ``home``: the
    Spark to run (``SPARK_HOME``, as the image sets it)."""
    environment = dict(os.environ if base is None else base)
    if home is not None:
        environment["SPARK_HOME"] = str(home)
    environment["PYSPARK_PYTHON"] = environment["PYSPARK_DRIVER_PYTHON"] = sys.executable
    for variable in (application["spec"].get("driver") or {}).get("env") or ():
        if "value" in variable:
            environment[variable["name"]] = str(variable["value"])
            continue
        reference = variable["valueFrom"]["secretKeyRef"]
        environment[variable["name"]] = secrets[(reference["name"], reference["key"])]
    return environment
