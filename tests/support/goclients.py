"""The Go Kafka clients of ``tests/goclients`` (sarama, segmentio kafka-go, franz-go), built
once per machine and source.

Two builds of one program: ``current`` (the newest sarama) and ``sarama-1.40`` (sarama 1.40.1,
the last whose consumer group commits with OffsetCommit v1, as sarama 1.22 did; built with the
tag ``sarama140``, without the long-lived member modes of ``member.go``). Modules come
from the Go module proxy into Go's own module cache; each binary is kept under
``${XDG_CACHE_HOME:-~/.cache}/kafka-group-operator/go-clients/<hash of its sources>/``, so a
machine downloads and builds once. Builds run under a file lock: parallel test workers wait
for the first instead of building twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parents[1] / "goclients"
MODFILES = {"current": "go.mod", "sarama-1.40": "sarama140.mod"}
TAGS = {"current": "", "sarama-1.40": "sarama140"}
BUILD_TIMEOUT_S = 1800
# The module's own go.mod/go.sum only (no workspace, no edits); a Go older than the module's
# fetches the newer toolchain from the module proxy; no VCS stamp (a worktree need not have one).
BUILD_ENV = {
    "GOWORK": "off",
    "GOTOOLCHAIN": "auto",
    "GOFLAGS": "-mod=readonly -buildvcs=false",
}


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kafka-group-operator" / "go-clients"


def binary(variant: str) -> Path:
    """The built program of ``variant`` (``current`` or ``sarama-1.40``)."""
    modfile = MODFILES[variant]
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the Go client tests need Go (apt-get install golang-go)")
    digest = hashlib.sha256()
    digest.update(TAGS[variant].encode() + b"\0")
    sources = sorted(p.name for p in SOURCE.glob("*.go"))
    for name in (*sources, modfile, modfile.removesuffix(".mod") + ".sum"):
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes())
    target = cache_root() / f"{variant}-{digest.hexdigest()[:16]}" / "clients"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = target.with_suffix(".partial")
            built = subprocess.run(
                [
                    go,
                    "build",
                    f"-modfile={modfile}",
                    f"-tags={TAGS[variant]}",
                    "-o",
                    str(partial),
                    ".",
                ],
                cwd=SOURCE,
                env={**os.environ, **BUILD_ENV},
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            if built.returncode != 0:
                raise RuntimeError(f"go build of {variant} failed:\n{built.stderr[-3000:]}")
            partial.rename(target)
    return target


@dataclass
class Run:
    code: int
    lines: list[dict[str, Any]]
    stderr: str


def run(variant: str, mode: str, *arguments: str, timeout: float = 150) -> Run:
    """One run of the program: its exit code, its JSON stdout lines and its stderr."""
    done = subprocess.run(
        [str(binary(variant)), mode, *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return Run(done.returncode, lines, done.stderr)
