"""Coordinator state-machine benchmark: what one shard costs per heartbeat, join and load.

In-process, no I/O: the sans-IO ``CoordinatorShard`` alone, warm; loads are the median of
five runs, joins (and their peer) the fastest of nine, heartbeats the fastest of 30 samples
(see ``steady_heartbeat_us``): on a shared machine the fastest run is the code's cost.

* **steady heartbeat**: a STABLE member heartbeats with what it owns (no records, no
  assignment in the reply). Peer: the same heartbeat in a 10-member group. A ratio near 1
  at 10,000 members is the O(1) claim: nothing on this path scans the group.
* **join**: one member joins a stable group of N (group-epoch bump, assignor run, target
  records, reconciliation of the newcomer). Peer: the assignor call alone on the same
  input, so the ratio is the coordinator's overhead around the assignor.
* **load**: replaying a stable group's records into a fresh shard (what start-up does per
  group), in records per second.

Groups are built by replaying records (as a load does), each member owning 10 partitions of
one topic. Writes ``bench/results/coordinator.json``. ``--quick`` uses smaller groups.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka_group_operator import assignors
from kafka_group_operator.assignors import api as assignor_api
from kafka_group_operator.coordinator import group_state, messages, records, shard
from kafka_group_records import records as schema

RESULTS = Path(__file__).parent / "results" / "coordinator.json"
GROUP = "bench"
TOPIC = "events"
TOPIC_ID = schema.topic_id_for_name(TOPIC)
PARTITIONS_PER_MEMBER = 10


def stable_group_records(members: int, assignor: str) -> list[schema.Record]:
    """Records of a settled group: every member STABLE at epoch 1 with 10 partitions."""
    log = [
        records.new_group_config_record(
            GROUP, schema.GroupConfigValue(assignor=assignor, topics=(TOPIC,))
        ),
        records.new_group_epoch_record(GROUP, 1),
        records.new_partition_metadata_record(
            GROUP,
            [schema.TopicMetadata(TOPIC_ID, TOPIC, members * PARTITIONS_PER_MEMBER)],
        ),
    ]
    for index in range(members):
        member_id = f"member-{index:05d}"
        owned = {
            TOPIC_ID: frozenset(
                range(index * PARTITIONS_PER_MEMBER, (index + 1) * PARTITIONS_PER_MEMBER)
            )
        }
        log.append(
            records.new_member_subscription_record(
                GROUP,
                member_id,
                schema.ConsumerGroupMemberMetadataValue(
                    instance_id=f"{GROUP}-{index}", subscribed_topic_names=(TOPIC,)
                ),
            )
        )
        log.append(records.new_target_assignment_record(GROUP, member_id, owned))
        log.append(
            records.new_current_assignment_record(
                GROUP,
                member_id,
                member_epoch=1,
                previous_member_epoch=0,
                state=group_state.MemberState.STABLE,
                assigned=owned,
                pending_revocation={},
            )
        )
    log.append(records.new_target_assignment_epoch_record(GROUP, 1))
    return log


def loaded(log: list[schema.Record]) -> shard.CoordinatorShard:
    coordinator = shard.CoordinatorShard()
    for record in log:
        coordinator.replay(record)
    coordinator.on_loaded(0)
    return coordinator


def timings(action: Callable[[], object], repeat: int, number: int = 1) -> list[float]:
    action()  # warm-up
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            action()
        samples.append((time.perf_counter() - start) / number)
    return samples


def median_seconds(action: Callable[[], object], repeat: int, number: int = 1) -> float:
    return statistics.median(timings(action, repeat, number))


def steady_heartbeat_us(members: int) -> float:
    coordinator = loaded(stable_group_records(members, "uniform"))
    requests = [
        messages.HeartbeatRequest(
            GROUP,
            f"member-{index:05d}",
            1,
            subscribed_topic_names=(TOPIC,),
            owned_partitions={
                TOPIC: frozenset(
                    range(index * PARTITIONS_PER_MEMBER, (index + 1) * PARTITIONS_PER_MEMBER)
                )
            },
        )
        for index in range(0, members, max(1, members // 10))
    ]
    clock = iter(range(1, 10**9))

    def beat() -> None:
        for request in requests:
            result = coordinator.heartbeat(request, next(clock))
            assert not result.records
            assert result.response.assignment is None

    # A heartbeat costs microseconds, less than a scheduler time slice: the fastest of many
    # samples is its cost, the others measure the other processes on the machine.
    return min(timings(beat, repeat=30, number=100)) / len(requests) * 1e6


def join(members: int, assignor: str) -> dict[str, Any]:
    coordinator = loaded(stable_group_records(members, assignor))
    request = messages.HeartbeatRequest(
        GROUP, "newcomer", 0, instance_id=f"{GROUP}-new", subscribed_topic_names=(TOPIC,)
    )
    join_s = min(timings(lambda: coordinator.heartbeat(request, 1), repeat=9))

    owned_by = {
        f"member-{index:05d}": tuple(
            (TOPIC, p)
            for p in range(index * PARTITIONS_PER_MEMBER, (index + 1) * PARTITIONS_PER_MEMBER)
        )
        for index in range(members)
    }
    spec_members = {
        member_id: assignor_api.MemberSubscription(
            frozenset({TOPIC}), owned, 1, None, f"{GROUP}-{member_id[-5:]}"
        )
        for member_id, owned in owned_by.items()
    }
    spec_members["newcomer"] = assignor_api.MemberSubscription(
        frozenset({TOPIC}), (), 1, None, f"{GROUP}-new"
    )
    spec = assignor_api.GroupSpec(spec_members, {TOPIC: members * PARTITIONS_PER_MEMBER})
    algorithm = assignors.ASSIGNORS[assignor]
    assignor_s = min(timings(lambda: algorithm.assign(spec), repeat=9))
    return {
        "members": members,
        "assignor": assignor,
        "join_ms": round(join_s * 1e3, 3),
        "assignor_alone_ms": round(assignor_s * 1e3, 3),
        "ratio": round(join_s / assignor_s, 2),
    }


def load(members: int) -> dict[str, Any]:
    log = stable_group_records(members, "uniform")
    seconds = median_seconds(lambda: loaded(log), repeat=5)
    return {
        "members": members,
        "records": len(log),
        "load_ms": round(seconds * 1e3, 2),
        "records_per_s": round(len(log) / seconds),
    }


def committed_offsets_records(groups: int, partitions: int, commits: int) -> list[schema.Record]:
    """Offset commits of ``groups`` member-less groups, each partition committed ``commits``
    times, interleaved as commits arrive: what most of a state topic holds."""
    log = []
    for round_index in range(commits):
        for group_index in range(groups):
            for partition in range(partitions):
                log.append(
                    records.new_offset_commit_record(
                        f"offsets-{group_index:04d}",
                        TOPIC,
                        partition,
                        messages.CommitOffset(round_index * 1_000 + partition),
                        1_000 + round_index,
                    )
                )
    return log


def load_offsets(groups: int, partitions: int, commits: int) -> dict[str, Any]:
    log = committed_offsets_records(groups, partitions, commits)
    seconds = median_seconds(lambda: loaded(log), repeat=5)
    return {
        "groups": groups,
        "live_keys": groups * partitions,
        "records": len(log),
        "load_ms": round(seconds * 1e3, 2),
        "records_per_s": round(len(log) / seconds),
    }


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    sizes = (10, 1_000) if quick else (10, 1_000, 10_000)
    join_sizes = (10, 100) if quick else (10, 100, 1_000)
    peer = steady_heartbeat_us(10)
    heartbeats = []
    for members in sizes:
        micros = steady_heartbeat_us(members) if members != 10 else peer
        heartbeats.append(
            {"members": members, "heartbeat_us": round(micros, 1), "ratio": round(micros / peer, 2)}
        )
        print(f"steady heartbeat, {members} members: {micros:.1f} us ({micros / peer:.2f}x)")
    joins = []
    for assignor in ("uniform", "cooperative-sticky"):
        for members in join_sizes:
            figures = join(members, assignor)
            joins.append(figures)
            print(
                f"join into {members} ({assignor}): {figures['join_ms']} ms, "
                f"assignor alone {figures['assignor_alone_ms']} ms ({figures['ratio']}x)"
            )
    loads = [load(members) for members in sizes]
    for figures in loads:
        print(f"load {figures['members']} members: {figures['records_per_s']} records/s")
    offset_loads = [load_offsets(100, 100, 2 if quick else 10)]
    for figures in offset_loads:
        print(
            f"load {figures['records']} offset records ({figures['live_keys']} live keys): "
            f"{figures['records_per_s']} records/s"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "steady_heartbeat": heartbeats,
                "join": joins,
                "load": loads,
                "load_offsets": offset_loads,
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
