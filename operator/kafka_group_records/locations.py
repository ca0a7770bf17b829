"""Where snapshots, checkpoints and audits are kept: storage URIs, checked without Spark.

Shared by the jobs (``kafka_group_jobs.storage``, which also writes there through Spark) and
by ``kgo snapshot|restore|compact``, which check a location before they start a job at all.

Storage URIs are those of ``OffsetSnapshot.spec.storage.uri``:

* ``file:///path`` and plain paths: the local (or shared, mounted) file system;
* ``s3a://bucket/path`` (``s3://`` is read as ``s3a://``), ``hdfs://``, ``gs://``, ``abfs://``:
  through Hadoop's connectors, whose jars must be in the Spark image;
* ``pvc://<claim>/<path>``: a PersistentVolumeClaim mounted at ``/mnt/kgo/<claim>`` in the
  driver and executors (the SparkApplication builder mounts it there).

Any other scheme is refused up front: Hadoop knows ``ftp://`` and others, which a job would
only find out about, minutes later, by timing out. A local location is checked for real (a
file is created and removed in it: permissions alone do not tell for root or a read-only
mount), and one that holds something already is refused unless it is to be overwritten.

A job writes into a staging directory beside its location (``.<name>.partial-<id>``,
``STAGING_MARK``) and moves it into place when everything is written: what a killed job
leaves is only ever such a directory, which ``staging_leftovers`` finds.

Each check returns the problem as one sentence, or None; the callers raise their own errors.
"""

from __future__ import annotations

import tempfile
import urllib.parse
from pathlib import Path

PVC_MOUNT_ROOT = "/mnt/kgo"
SCHEMES = ("file", "pvc", "s3a", "s3", "hdfs", "gs", "abfs", "abfss")
STAGING_MARK = ".partial-"


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


def scheme_problem(what: str, uri: str) -> str | None:
    """Why ``uri`` is no storage location a job can use, or None."""
    if not uri:
        return f"{what} must not be empty"
    scheme = urllib.parse.urlsplit(uri).scheme if "://" in uri else ""
    if scheme and scheme not in SCHEMES:
        supported = ", ".join(f"{name}://" for name in SCHEMES)
        return (
            f"{what} {uri}: the scheme {scheme!r} is not a supported storage ({supported}, "
            "or a path)"
        )
    return None


def writable_problem(what: str, uri: str, overwrite: bool = False) -> str | None:
    """Why a job could not write a new ``uri``: it holds something already (unless
    ``overwrite``) or cannot be written (local locations only); None when it can."""
    path = local_path(uri)
    if path is None:
        return None
    if path.exists() and not overwrite and (not path.is_dir() or any(path.iterdir())):
        return (
            f"{what} {uri} already exists and is not empty: choose another location, or pass "
            "--overwrite to replace it"
        )
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{what} {uri}: {existing} is a file, not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".kgo-probe-"):
            pass
    except OSError as error:
        return f"{what} {uri}: cannot write in {existing}: {error.strerror or error}"
    return None


def readable_problem(what: str, uri: str, name: str) -> str | None:
    """Why the file ``name`` under a local ``uri`` cannot be read (object stores: None)."""
    directory = local_path(uri)
    if directory is not None and not (directory / name).is_file():
        found = "no such directory" if not directory.exists() else f"no {name} in it"
        return f"{what} {uri} not found: {found}"
    return None


def staging_name(uri: str, run_id: str) -> str:
    """The staging location beside ``uri`` of the run ``run_id``."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    return f"{parent}/.{name}{STAGING_MARK}{run_id}"


def staging_leftovers(uri: str) -> list[Path]:
    """Staging directories a killed job left beside a local ``uri``."""
    path = local_path(uri.rstrip("/"))
    if path is None or not path.parent.is_dir():
        return []
    return sorted(path.parent.glob(f".{path.name}{STAGING_MARK}*"))
