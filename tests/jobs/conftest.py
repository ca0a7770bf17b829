"""One local Spark session (``local[2]``) for every Spark test: the JVM starts once per run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from kafka_group_jobs import session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    spark_session = session.build_session("kafka-group-jobs-tests", master="local[2]")
    yield spark_session
    spark_session.stop()
