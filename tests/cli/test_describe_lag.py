"""``kgo describe`` and ``kgo groups describe`` on a group that never committed: no lag is
shown (``-``), and they say nothing is committed; a lag of 0 there once hid a client whose
commits never arrived. Against a ``kgo dev up`` group, then after a commit."""

from __future__ import annotations

import json

import pytest

from tests.cli.conftest import DevSetup
from tests.cli.test_groups import LOG_ENDS, table

pytestmark = pytest.mark.broker


def test_a_group_that_never_committed_shows_no_lag(dev: DevSetup) -> None:
    described = dev.kgo("describe", "shop.orders")
    assert described.code == 0, described.stderr
    first = described.stdout.splitlines()[0]
    assert first.endswith("total lag - (nothing committed)"), first
    assert "total lag 0" not in described.stdout

    partitions = dev.kgo("groups", "describe", "shop.orders")
    assert partitions.code == 0, partitions.stderr
    assert "Consumer group 'shop.orders' has no committed offsets." in partitions.stdout
    rows = [row for row in table(partitions.stdout) if row and row[0] == "shop.orders"]
    assert all(row[3] == "-" and row[5] == "-" for row in rows), rows  # CURRENT-OFFSET, LAG

    state = dev.kgo("groups", "describe", "shop.orders", "--state")
    assert table(state.stdout)[1][-1] == "-"
    as_json = json.loads(
        dev.kgo("groups", "describe", "shop.orders", "--state", "-o", "json").stdout
    )
    assert as_json["totalLag"] is None


def test_after_a_commit_the_lag_is_shown(dev: DevSetup) -> None:
    reset = dev.kgo(
        "groups", "reset-offsets", "shop.orders", "--to-offset", "100", "--topic", "orders",
        "--execute",
    )  # fmt: skip
    assert reset.code == 0, reset.stderr
    expected = sum(end - 100 for end in LOG_ENDS.values())
    partitions = dev.kgo("groups", "describe", "shop.orders")
    assert "has no committed offsets" not in partitions.stdout
    # The coordinator reads log ends in the background: the first describe may not know them.
    for _ in range(50):
        described = dev.kgo("describe", "shop.orders")
        if described.stdout.splitlines()[0].endswith(f"total lag {expected}"):
            break
    else:
        raise AssertionError(described.stdout)
