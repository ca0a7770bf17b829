"""One local Spark session for every Spark test, built as a job run directly builds it (no
master given: the default, tuned local one): the JVM starts once per run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from kafka_group_jobs import session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    spark_session = session.build_session("kafka-group-jobs-tests")
    yield spark_session
    spark_session.stop()
    session.forget_log()
