"""``kgo describe GROUP --coordinator URL``: print a group as its coordinator sees it."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from kafka_group_operator.commands import common


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "describe", help="describe a consumer group: state, epochs, members, partitions, lag"
    )
    common.add_group_options(parser)
    common.add_coordinator_options(parser)
    common.add_output_option(parser)
    parser.set_defaults(func=run)


def render(
    description: Mapping[str, Any], committed: Mapping[tuple[str, int], int] | None = None
) -> str:
    """A readable table of a group description (the member API's JSON). Lag is shown only
    where it is known: ``-`` for a group or member without a committed offset (a lag of 0
    would hide a client that never commits); given ``committed`` (the group's offsets), a
    group without any says so."""
    lag_by_partition = {(e["topic"], e["partition"]): e["lag"] for e in description["lag"]}
    total = description["totalLag"] if lag_by_partition else "-"
    if committed is not None and not committed:
        total = "- (nothing committed)"
    lines = [
        f"group {description['groupId']}  state {description['state']}  "
        f"epoch {description['groupEpoch']} (assignment {description['assignmentEpoch']})  "
        f"assignor {description['assignor']}  total lag {total}",
        f"{'INSTANCE':<22} {'EPOCH':>5} {'STATE':<22} {'#':>3} {'LAG':>7}  PARTITIONS",
    ]
    members = sorted(description["members"], key=lambda m: m["instanceId"] or m["memberId"])
    for member in members:
        owned = member["assignment"]
        known = [
            max(lag_by_partition[(topic, p)], 0)
            for topic, partitions in owned.items()
            for p in partitions
            if (topic, p) in lag_by_partition
        ]
        lag = sum(known) if known else "-"
        pending = member["partitionsPendingRevocation"]
        partitions = common.compact_partitions(owned) + (
            f"  revoking {common.compact_partitions(pending)}" if pending else ""
        )
        lines.append(
            f"{(member['instanceId'] or member['memberId'])[:22]:<22} "
            f"{member['memberEpoch']:>5} {member['state'][:22]:<22} "
            f"{sum(len(p) for p in owned.values()):>3} {lag:>7}  {partitions}"
        )
    if not members:
        lines.append("(no members)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # The same connection handling as `kgo groups`: a bad URL or a coordinator that does not
    # answer is one line; the coordinator's own errors (unknown group, bad token) too.
    group = common.group_of(args)
    with common.coordinator(args, group) as coordinator:
        description = coordinator.describe()
        if args.output != "table":
            print(common.dump(description, args.output))
            return 0
        committed = coordinator.fetch()
    print(render(description, committed))
    return 0
