"""Where jobs write: storage URIs to Spark paths, and small JSON documents next to the Parquet.

Storage URIs are those of ``OffsetSnapshot.spec.storage.uri``:

* ``file:///path`` and plain paths: the local (or shared, mounted) file system;
* ``s3a://bucket/path`` (``s3://`` is read as ``s3a://``): needs the hadoop-aws jars in the
  Spark image;
* ``pvc://<claim>/<path>``: a PersistentVolumeClaim mounted at ``/mnt/kgo/<claim>`` in the
  driver and executors (the SparkApplication builder mounts it there).

JSON documents (manifests, checkpoints, audits) go through Hadoop's ``FileSystem`` API, so they
land wherever the Parquet lands, whatever the scheme.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_group_jobs import errors

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PVC_MOUNT_ROOT = "/mnt/kgo"


def spark_path(uri: str) -> str:
    """The Hadoop path of a storage URI."""
    if uri.startswith("pvc://"):
        return "file:" + PVC_MOUNT_ROOT + "/" + uri.removeprefix("pvc://").lstrip("/")
    if uri.startswith("s3://"):
        return "s3a://" + uri.removeprefix("s3://")
    if "://" not in uri:
        return "file:" + uri
    return uri


def local_path(uri: str) -> Path | None:
    """The file-system path of a ``file:``, plain or ``pvc://`` URI; None for object stores."""
    path = spark_path(uri)
    if not path.startswith("file:"):
        return None
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(path).path))


def check_readable(what: str, uri: str, name: str) -> None:
    """Before Spark: the file ``name`` under a local ``uri`` exists (object stores: unchecked)."""
    directory = local_path(uri)
    if directory is not None and not (directory / name).is_file():
        found = "no such directory" if not directory.exists() else f"no {name} in it"
        raise errors.JobError(f"{what} {uri} not found: {found}")


def check_writable(uri: str) -> None:
    """Before Spark: a local ``uri`` is, or can be made, a writable directory."""
    path = local_path(uri)
    if path is None:
        return
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise errors.JobError(f"{uri}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise errors.JobError(f"{uri}: {existing} is not writable")


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


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
