"""``kgo`` as a user runs it: a fresh process, its exit code, stdout and stderr.

``dev`` is one ``kgo dev up`` setup (broker, coordinator, topic ``orders`` with 6 partitions
and 1000 messages, group ``shop.orders``) for a test module, stopped with ``kgo dev down``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


def kgo(*argv: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> Run:
    """``kgo ARGV...`` in a new interpreter (``python -m kafka_group_operator``)."""
    done = subprocess.run(
        [sys.executable, "-m", "kafka_group_operator", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        cwd=ROOT,
    )
    return Run(done.returncode, done.stdout, done.stderr)


EXPORT = re.compile(r"^export (\w+)=(\S+)$")


def parse_exports(text: str) -> dict[str, str]:
    """``export NAME=value`` lines (values are shell-quoted only when they need it)."""
    found = {}
    for line in text.splitlines():
        match = EXPORT.match(line)
        assert match is not None, f"not an export line: {line!r}"
        found[match.group(1)] = match.group(2)
    return found


@dataclass
class DevSetup:
    directory: Path
    env: dict[str, str]  # KGO_DEV_DIR and the member environment `kgo dev up` printed

    def kgo(self, *argv: str) -> Run:
        return kgo(*argv, env=self.env)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevSetup]:
    directory = tmp_path_factory.mktemp("kgo-dev")
    base = {"KGO_DEV_DIR": str(directory)}
    up = kgo("dev", "up", env=base)
    assert up.code == 0, up.stderr
    try:
        yield DevSetup(directory, {**base, **parse_exports(up.stdout)})
    finally:
        down = kgo("dev", "down", env=base)
        assert down.code == 0, down.stderr
