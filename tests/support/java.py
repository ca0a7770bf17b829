"""Java test programs: Kafka's jars from Maven Central, our programs compiled with javac.

``classpath()`` returns a classpath holding the jars of ``tests/clients/java/pom.xml``
(kafka-clients, kafka-streams and connect-runtime, each at ``KAFKA_VERSION``) and the test
programs beside it, compiled. Both are cached outside the clone, under
``${XDG_CACHE_HOME:-~/.cache}/kafka-group-operator/java-clients-<version>``: the jars once per
version (``mvn dependency:copy-dependencies``, no build tool beyond that), the classes once
per version and content of the sources. A file lock makes parallel test workers share one
fetch and one compilation.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

KAFKA_VERSION = "4.4.0"
SOURCES = Path(__file__).resolve().parents[1] / "clients" / "java"


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kafka-group-operator" / f"java-clients-{KAFKA_VERSION}"


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _jars(directory: Path) -> Path:
    lib = directory / "lib"
    done = lib / ".complete"
    if done.exists():
        return lib
    if shutil.which("mvn") is None:
        raise RuntimeError("Maven (mvn) is needed to fetch the Java clients' jars")
    staging = directory / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run(
        [
            "mvn",
            "--batch-mode",
            "--quiet",
            "-f",
            str(SOURCES / "pom.xml"),
            f"-Dkafka.version={KAFKA_VERSION}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
        ],
        check=True,
        timeout=900,
    )
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    done.touch()
    return lib


def _classes(directory: Path, lib: Path) -> Path:
    sources = sorted(SOURCES.glob("*.java"))
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    classes = directory / f"classes-{digest.hexdigest()[:16]}"
    done = classes / ".complete"
    if done.exists():
        return classes
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir(parents=True)
    subprocess.run(
        [
            "javac",
            "-nowarn",
            "-d",
            str(classes),
            "-cp",
            f"{lib}/*",
            *map(str, sources),
        ],
        check=True,
        timeout=600,
    )
    done.touch()
    return classes


def classpath() -> str:
    """The jars and the compiled test programs, fetched and compiled if not cached yet."""
    directory = cache_dir()
    with _locked(directory):
        lib = _jars(directory)
        classes = _classes(directory, lib)
    return f"{classes}:{lib}/*"


def command(main: str, *args: str, heap_mb: int = 256) -> list[str]:
    """``java`` running ``main`` of the test programs: a small heap, quick start (C1 only)."""
    return [
        "java",
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Xshare:auto",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        classpath(),
        main,
        *args,
    ]
