"""``kgo generate-chart-crds [--check]``: copy the CRDs from ``crds/`` into the Helm chart.

``crds/`` is the single source; the chart's ``crds/`` directory is generated from it with a
header saying so. ``--check`` (``make verify``) fails when the chart's copy differs, so that a
CRD change can never ship in one place only.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kafka_group_operator.commands import common

CHART_CRDS = Path("charts/kafka-group-operator/crds")
SOURCE_CRDS = Path("crds")
HEADER = "# Generated from crds/{name} by `kgo generate-chart-crds`; edit the source, not this.\n"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "generate-chart-crds", help="copy crds/ into the Helm chart (or --check that it is)"
    )
    parser.add_argument("--check", action="store_true", help="only report differences")
    parser.add_argument("--root", type=Path, default=Path(), help="repository root")
    parser.set_defaults(func=run)


def expected_chart_crds(root: Path) -> dict[str, str]:
    """Chart file name -> its expected content, from the CRDs in ``crds/``."""
    sources = sorted((root / SOURCE_CRDS).glob("*.yaml"))
    return {path.name: HEADER.format(name=path.name) + path.read_text() for path in sources}


def differences(root: Path) -> list[str]:
    """Chart CRD files that are missing, stale or not generated from ``crds/``."""
    expected = expected_chart_crds(root)
    target = root / CHART_CRDS
    actual = (
        {path.name: path.read_text() for path in target.glob("*.yaml")} if target.is_dir() else {}
    )
    stale = [name for name, text in expected.items() if actual.get(name) != text]
    extra = [name for name in actual if name not in expected]
    return sorted(stale + extra)


def run(args: argparse.Namespace) -> int:
    root: Path = args.root
    if not (root / SOURCE_CRDS).is_dir():
        raise common.UsageError(f"no {SOURCE_CRDS}/ under {root.resolve()}")
    diff = differences(root)
    if args.check:
        if diff:
            raise common.CommandError(
                f"the chart's CRDs differ from {SOURCE_CRDS}/: {', '.join(diff)}; "
                "run `make generate`"
            )
        return 0
    target = root / CHART_CRDS
    target.mkdir(parents=True, exist_ok=True)
    expected = expected_chart_crds(root)
    for path in target.glob("*.yaml"):
        if path.name not in expected:
            path.unlink()
    for name, text in expected.items():
        (target / name).write_text(text)
    if diff:
        print(f"wrote {', '.join(diff)} to {CHART_CRDS}")
    return 0
