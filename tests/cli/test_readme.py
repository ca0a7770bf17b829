"""The README's "by hand" section, run exactly as written: the test reads its code block, so
it fails when the README and the product drift apart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import ROOT

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def by_hand_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The same pieces work by hand", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no sh block in the README's by-hand section"
    return match.group(1)


def test_the_by_hand_block_is_the_one_documented() -> None:
    lines = by_hand_block().splitlines()
    assert lines[0] == 'eval "$(kgo dev up)"'
    assert lines[-1] == "kgo dev down"
    assert "kgo groups describe shop.orders" in lines


def test_the_readme_by_hand_steps(tmp_path: Path) -> None:
    # A scratch directory of its own (the consumers' logs land there), with the examples.
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = Path(sys.executable).parent  # holds `kgo` and this `python`
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "KGO_DEV_DIR": str(tmp_path / "dev"),
    }
    script = "set -euo pipefail\n" + by_hand_block()
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        # Whatever happened, nothing of this test stays running.
        subprocess.run([sys.executable, "-m", "kafka_group_operator", "dev", "down"], env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"group shop\.orders: 2 member\(s\), state Stable, epoch \d+", lines[0])
    assert lines[1].split() == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "MEMBER-ID",
        "INSTANCE-ID",
        "HOST",
    ]
    rows = [line.split() for line in lines[2:]]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("shop.orders", "orders", str(p)) for p in range(6)
    ]
    # 1000 messages round-robin over 6 partitions: the log ends `kgo dev up` produced.
    assert [row[4] for row in rows] == ["167", "167", "167", "167", "166", "166"]
    owners = [row[7] for row in rows]
    assert sorted(owners) == ["orders-0"] * 3 + ["orders-1"] * 3
    assert {row[8] for row in rows} == {"127.0.0.1"}
    assert done.stderr.splitlines()[-1].startswith("kgo dev: stopped the coordinator (pid ")
