"""The README's command blocks, run exactly as written, as a new user types them: each test
reads its block from the README, so it fails when the README and the product drift apart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import ROOT

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def sh_block(heading: str) -> str:
    """The first ``sh`` block of the README's section ``heading``."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split(f"\n{heading}\n", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"no sh block in the README's section {heading!r}"
    return match.group(1)


def by_hand_block() -> str:
    return sh_block("## The same pieces work by hand")


def run_as_a_new_user(
    block: str, directory: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``block`` in bash (stopping at the first failure) in ``directory``, with ``kgo`` and
    this ``python`` on the PATH; whatever happened, ``kgo dev down`` afterwards."""
    (directory / "examples").symlink_to(ROOT / "examples")
    bin_dir = Path(sys.executable).parent  # holds `kgo` and this `python`
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "KGO_DEV_DIR": str(directory / "dev"),
    }
    for name in ("KGO_COORDINATOR_URL", "KGO_GROUP_TOKEN", "KAFKA_BOOTSTRAP_SERVERS"):
        env.pop(name, None)
    try:
        return subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + block],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        # Whatever happened, nothing of this test stays running.
        subprocess.run([sys.executable, "-m", "kafka_group_operator", "dev", "down"], env=env)


def test_the_by_hand_block_is_the_one_documented() -> None:
    lines = by_hand_block().splitlines()
    assert lines[0] == 'eval "$(kgo dev up)"'
    assert lines[-1] == "kgo dev down"
    assert "kgo groups describe shop.orders" in lines


def test_the_readme_by_hand_steps(tmp_path: Path) -> None:
    done = run_as_a_new_user(by_hand_block(), tmp_path, timeout=240)
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


def test_the_readme_snapshot_steps(tmp_path: Path) -> None:
    block = sh_block("## Snapshots and restore")
    assert block.splitlines()[0] == 'eval "$(kgo dev up)"'
    done = run_as_a_new_user(block, tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert (
        f"snapshot of group shop.orders written to {(tmp_path / 'backups' / 'orders-1').as_uri()}"
        in out
    )
    assert (
        "6 partitions, 0 clamped; dry run: nothing written; add --execute to write 6 offset(s)"
        in out
    )
    assert "6 partitions, 0 clamped; written through the coordinator at http://127.0.0.1:" in out
    # After the restore, the group is back at the snapshot's offsets (the describe's rows are
    # the group's last rows: the resets' audits come before).
    rows = [line.split() for line in out.splitlines() if line.startswith("shop.orders  orders")]
    assert [(row[2], row[3]) for row in rows[-6:]] == [(str(p), "100") for p in range(6)]
    assert (tmp_path / "checkpoints" / "1" / "checkpoint.json").is_file()
    checkpoint = (tmp_path / "checkpoints" / "1").as_uri()
    assert f"checkpoint of kafka-group-operator.group-state written to {checkpoint}" in out


def test_a_new_shell_finds_kgo_with_the_quick_starts_activate_line() -> None:
    block = sh_block("## Quick start")
    (activate,) = [line.split("#")[0].strip() for line in block.splitlines() if "activate" in line]
    # A new shell: none of this test's own environment's virtualenv on its PATH.
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    missing = subprocess.run(
        ["bash", "-c", "kgo --version"], cwd=ROOT, env=env, capture_output=True
    )
    assert missing.returncode == 127  # command not found, as the issue saw
    done = subprocess.run(
        ["bash", "-c", f"{activate} && kgo --version"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.split()[0]) == (0, "kgo"), done.stderr


def test_installing_in_a_cluster_is_near_the_top() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    first_install = next(i for i, line in enumerate(lines) if line.startswith("helm install"))
    assert first_install < 60, first_install
    section = sh_block("## Install in a cluster")
    assert "helm install kafka-group-operator charts/kafka-group-operator \\" in section
    # Every value the block sets is one of the chart's.
    values = yaml.safe_load((ROOT / "charts" / "kafka-group-operator" / "values.yaml").read_text())
    for setting in re.findall(r"--set ([a-zA-Z.]+)=", section):
        level = values
        for key in setting.split("."):
            assert isinstance(level, dict), setting
            assert key in level, setting
            level = level[key]


def test_the_readme_command_line_block(tmp_path: Path) -> None:
    block = sh_block("## Command line")
    assert (
        block.splitlines()[0]
        == "kgo groups list                                  # the groups your token may see"
    )
    done = run_as_a_new_user(
        'eval "$(kgo dev up)"\n' + block + "kgo dev down\n", tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert (
        "wrote 2 offset(s): one administrative commit through the coordinator" in out
    )  # the shift
    # Exported after the shift: 167 - 100 on partitions 0 and 1, the log ends elsewhere.
    assert (tmp_path / "offsets.csv").read_text() == (
        "orders,0,67\norders,1,67\norders,2,167\norders,3,167\norders,4,166\norders,5,166\n"
    )
    assert "Request succeed for deleting offsets with topic orders:0 group shop.orders" in out
    assert out.splitlines()[-1] == (
        "Deletion of requested consumer groups ('shop.orders') was successful."
    )
