"""Builds the Spark session the jobs run in, under ``spark-submit`` or as plain ``python -m``.

Under ``spark-submit`` (a SparkApplication) the master and resources come from the submit
command and this only names the app. Run directly, it starts a local Spark whose Python
workers use this interpreter, so that they import ``kafka_group_jobs`` from the same install.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from pyspark.sql import SparkSession


def build_session(app_name: str, master: str | None = None) -> SparkSession:
    """A session with the state-topic data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # Small per-group tables: Spark's default of 200 shuffle partitions is pure overhead here.
        builder = (
            builder.config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
        )
    spark = builder.getOrCreate()
    # Imported here: the data source pulls in the codec and confluent-kafka.
    from kafka_group_jobs import source

    spark.dataSource.register(source.StateTopicDataSource)
    return spark


@contextlib.contextmanager
def job_session(app_name: str, master: str | None = None) -> Iterator[SparkSession]:
    """The session of one job's ``main``; stopped at the end unless it was already running.

    A job called inside a running Spark program (a test, a notebook) must not stop the
    session it shares.
    """
    already_running = SparkSession.getActiveSession() is not None
    spark = build_session(app_name, master)
    try:
        yield spark
    finally:
        if not already_running:
            spark.stop()
