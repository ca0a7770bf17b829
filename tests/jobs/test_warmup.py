"""The jobs image's class archive is recorded by a real local Spark running the jobs' path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def warmup(archive: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kafka_group_jobs.warmup", str(archive)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.timeout(900)
def test_warmup_records_a_readable_archive_and_never_overwrites_one(tmp_path: Path) -> None:
    archive = tmp_path / "image" / "spark-classes.jsa"
    done = warmup(archive)
    assert done.returncode == 0, done.stderr[-3000:]
    # 7 topics x 13 partitions: the newest commit of each key survived the aggregation.
    assert done.stdout.strip().endswith("MiB, 91 rows)"), done.stdout
    # Spark's classes: tens of MiB (an empty dynamic archive is a few KiB).
    assert archive.stat().st_size > 20 << 20
    assert archive.stat().st_mode & 0o777 == 0o644
    assert [path.name for path in archive.parent.iterdir()] == [archive.name]

    again = warmup(archive)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: {archive} exists; the JVM records only into a new file"
    ]


def test_warmup_says_in_one_line_where_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = warmup(blocker / "spark-classes.jsa")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"error: cannot record the class archive at {blocker}/")
