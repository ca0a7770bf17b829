"""Where jobs write: storage URIs to Spark paths, and small JSON documents next to the Parquet.

Storage URIs, the schemes a job takes and the checks a location passes before Spark starts
are ``kafka_group_records.locations``' (shared with ``kgo snapshot|restore|compact``, which
check before they start a job at all).

JSON documents (manifests, checkpoints, audits) go through Hadoop's ``FileSystem`` API, so they
land wherever the Parquet lands, whatever the scheme.

A job writes into a staging directory beside its location (``.<name>.partial-<id>``) and
moves it into place only once everything is written (``staged``): a job that fails or is
interrupted leaves nothing at its location, and an overwritten snapshot stays whole until the
new one replaces it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from kafka_group_jobs import errors
from kafka_group_records import locations

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PVC_MOUNT_ROOT = locations.PVC_MOUNT_ROOT
spark_path = locations.spark_path
local_path = locations.local_path


def check_scheme(what: str, uri: str) -> None:
    """Before Spark: ``uri`` is a path or names a supported scheme."""
    problem = locations.scheme_problem(what, uri)
    if problem is not None:
        raise errors.UsageError(problem)


def check_readable(what: str, uri: str, name: str) -> None:
    """Before Spark: the file ``name`` under a local ``uri`` exists (object stores: unchecked)."""
    check_scheme(what, uri)
    problem = locations.readable_problem(what, uri, name)
    if problem is not None:
        raise errors.JobError(problem)


def check_writable(uri: str, overwrite: bool = False, what: str = "output") -> None:
    """Before Spark: a local ``uri`` is, or can be made, a writable directory, and holds
    nothing yet unless ``overwrite``. Object stores are checked by Spark (``staged``)."""
    check_scheme(what, uri)
    problem = locations.writable_problem(what, uri, overwrite)
    if problem is not None:
        raise errors.JobError(problem)


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


@contextlib.contextmanager
def staged(spark: SparkSession, uri: str, overwrite: bool = False) -> Iterator[str]:
    """A staging location beside ``uri`` to write into; moved to ``uri`` when the block ends,
    removed when it raises (or is interrupted). ``uri`` that exists and holds something is
    refused unless ``overwrite``, whose old content goes only once the new one is whole."""
    path, fs = _hadoop(spark, uri)
    if fs.exists(path) and not overwrite:
        listing = fs.listStatus(path) if fs.getFileStatus(path).isDirectory() else [path]
        if len(listing):
            raise errors.JobError(
                f"{uri} already exists and is not empty: choose another location, or pass "
                "--overwrite to replace it"
            )
    staging_uri = locations.staging_name(uri, uuid.uuid4().hex[:12])
    staging, _ = _hadoop(spark, staging_uri)
    try:
        yield staging_uri
        if fs.exists(path):
            fs.delete(path, True)
        fs.mkdirs(path.getParent())
        if not fs.rename(staging, path):
            raise errors.JobError(f"could not move the written {staging_uri} to {uri}")
    except BaseException:
        with contextlib.suppress(Exception):
            fs.delete(staging, True)
        raise


def write_json(spark: SparkSession, uri: str, document: Any) -> None:
    """Writes ``document`` as pretty JSON to ``uri`` (replacing it)."""
    data = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
    path, fs = _hadoop(spark, uri)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()


def read_json(spark: SparkSession, uri: str) -> Any:
    path, fs = _hadoop(spark, uri)
    stream = fs.open(path)
    try:
        text = _jvm(spark).org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
    return json.loads(text)


def offsets_checksum(rows: Iterable[tuple[str, int, int]]) -> str:
    """``sha256:`` of the sorted ``topic<TAB>partition<TAB>offset`` lines: order-independent."""
    digest = hashlib.sha256()
    for topic, partition, offset in sorted(rows):
        digest.update(f"{topic}\t{partition}\t{offset}\n".encode())
    return "sha256:" + digest.hexdigest()


def _jvm(spark: SparkSession) -> Any:
    jvm = spark.sparkContext._jvm
    if jvm is None:  # only a stopped context has none
        raise RuntimeError("the Spark session is stopped")
    return jvm


def _hadoop(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    jvm = _jvm(spark)
    path = jvm.org.apache.hadoop.fs.Path(spark_path(uri))
    return path, path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
