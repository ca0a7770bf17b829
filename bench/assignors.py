"""Assignor benchmark: our assignors against kafka-python's, on the same inputs, in one run.

Scenarios (issue 2 §6): 100 members x 1,000 partitions; 1,000 x 10,000 (100 topics x 100)
fresh, with one member joining and with ten leaving (owned = one common baseline, the
sticky fresh assignment, at generation 1); 1,000 members each on a random 20 of 100 topics;
2,000 x 100,000. Each assignor call is timed alone, warm and in-process: the median of 5
after one warm-up. A peer that takes more than a few seconds is run once, under a time
limit; where even building its input tables is out of reach it is not run, and the report
says so. Peak memory is tracemalloc's peak over one more call. Balance is max - min
partitions per member; moved counts owned partitions that left their owner.

``python -m bench assignors [--peer-timeout=SECONDS] [--only=SCENARIO,...]`` writes
``bench/results/assignors.json`` and the assignor table of ``bench/README.md``;
``--report-only`` rewrites the table from the last results.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import namedtuple
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.coordinator.assignors.sticky.user_data import StickyAssignorUserData
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from kafka_group_operator import assignors
from kafka_group_operator.assignors import api, rounds

HERE = pathlib.Path(__file__).resolve().parent
RESULT = HERE / "results" / "assignors.json"
README = HERE / "README.md"
BEGIN, END = "<!-- assignors:begin -->", "<!-- assignors:end -->"
RUNS = 5
SLOW_SECONDS = 3.0
DEFAULT_PEER_TIMEOUT = 45.0

# Our assignor -> the kafka-python assignor it is measured against. kafka-python has no
# server-side uniform assignor; its sticky assignor is the closest (balance, then stickiness).
PEERS: dict[str, str] = {
    "range": "range",
    "roundrobin": "roundrobin",
    "sticky": "sticky",
    "cooperative-sticky": "cooperative-sticky",
    "uniform": "sticky",
}
# The Java figures on 1,000 x 10,000 (ms), for the README only: not measured here.
JAVA_MS = {
    ("fresh", "cooperative-sticky"): 37,
    ("fresh", "uniform"): 7,
    ("join", "cooperative-sticky"): 43,
    ("join", "uniform"): 6,
    ("leave", "cooperative-sticky"): 75,
    ("leave", "uniform"): 9,
}
TARGET_MS = {"cooperative-sticky": 80.0, "uniform": 20.0}
LARGE_TARGET_MS = 2000.0


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    spec: api.GroupSpec
    # Peers whose input tables alone (partitions x potential consumers) are out of reach.
    skip_peers: frozenset[str] = field(default_factory=frozenset)
    skip_reason: str = ""


def topics(count: int, partitions: int) -> dict[str, int]:
    return {f"topic-{number:04d}": partitions for number in range(count)}


def group(
    members: int, counts: dict[str, int], subscribe: Callable[[int], frozenset[str]] | None = None
) -> api.GroupSpec:
    everything = frozenset(counts)
    return api.GroupSpec(
        members={
            f"member-{index:05d}": api.MemberSubscription(
                topics=subscribe(index) if subscribe else everything
            )
            for index in range(members)
        },
        partitions_per_topic=counts,
    )


def owning(spec: api.GroupSpec, baseline: api.GroupAssignment) -> api.GroupSpec:
    members = {
        member: api.MemberSubscription(
            topics=subscription.topics, owned=tuple(baseline.get(member, ())), generation=1
        )
        for member, subscription in spec.members.items()
    }
    return api.GroupSpec(members=members, partitions_per_topic=spec.partitions_per_topic)


def scenarios() -> list[Scenario]:
    fresh = group(1_000, topics(100, 100))
    baseline = assignors.get("sticky").assign(fresh)
    joined = dict(fresh.members)
    joined["member-joining"] = api.MemberSubscription(topics=frozenset(fresh.partitions_per_topic))
    left = dict(list(fresh.members.items())[10:])
    chooser = random.Random(20)
    names = sorted(topics(100, 100))
    picks = [frozenset(chooser.sample(names, 20)) for _ in range(1_000)]
    heavy = frozenset({"sticky", "cooperative-sticky"})
    return [
        Scenario("small", "100 members x 1,000 partitions", group(100, topics(10, 100))),
        Scenario("fresh", "1,000 x 10,000, fresh", fresh),
        Scenario(
            "join",
            "1,000 x 10,000, one member joins",
            owning(api.GroupSpec(joined, fresh.partitions_per_topic), baseline),
        ),
        Scenario(
            "leave",
            "1,000 x 10,000, ten members leave",
            owning(api.GroupSpec(left, fresh.partitions_per_topic), baseline),
        ),
        Scenario(
            "random-20",
            "1,000 members, each on a random 20 of 100 topics",
            group(1_000, topics(100, 100), picks.__getitem__),
        ),
        Scenario(
            "large",
            "2,000 x 100,000 (1,000 topics x 100)",
            group(2_000, topics(1_000, 100)),
            skip_peers=heavy,
            skip_reason="not run: its partition x potential-consumer tables alone hold "
            "2 x 10^8 entries",
        ),
    ]


# ---------------------------------------------------------------- kafka-python as the peer

PeerMember = namedtuple("PeerMember", "member_id group_instance_id metadata")


class PeerCluster:
    """The two ``ClusterMetadata`` methods kafka-python's assignors call."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self._partitions = {topic: set(range(count)) for topic, count in counts.items()}

    def topics(self) -> set[str]:
        return set(self._partitions)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._partitions.get(topic)


def _by_topic(partitions: tuple[api.TopicPartition, ...]) -> list[tuple[str, list[int]]]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    return list(grouped.items())


def peer_input(name: str, spec: api.GroupSpec) -> tuple[Any, list[PeerMember]]:
    """kafka-python's view of the same group: owned partitions where each assignor reads them."""
    members = []
    for member, subscription in spec.members.items():
        topic_list = sorted(subscription.topics)
        owned = _by_topic(subscription.owned)
        generation = -1 if subscription.generation is None else subscription.generation
        if name == "sticky":
            user_data: Any = (
                StickyAssignorUserData(previous_assignment=owned, generation=generation)
                if owned
                else b""
            )
            metadata = ConsumerProtocolSubscription(
                version=1, topics=topic_list, user_data=user_data
            )
        else:
            metadata = ConsumerProtocolSubscription(
                version=3,
                topics=topic_list,
                user_data=b"",
                owned_partitions=[
                    ConsumerProtocolSubscription.TopicPartition(topic=topic, partitions=parts)
                    for topic, parts in owned
                ],
                generation_id=generation,
            )
        members.append(PeerMember(member, subscription.instance_id, metadata))
    return PeerCluster(spec.partitions_per_topic), members


def peer_assignor(name: str) -> Any:
    return {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "sticky": StickyPartitionAssignor(),
        "cooperative-sticky": CooperativeStickyAssignor(),
    }[name]


def peer_call(name: str, spec: api.GroupSpec) -> Callable[[], api.GroupAssignment]:
    assignor = peer_assignor(name)
    cluster, members = peer_input(name, spec)

    def call() -> api.GroupAssignment:
        result = assignor.assign(cluster, members)
        return {
            member: [(tp.topic, tp.partition) for tp in assignment.partitions()]
            for member, assignment in result.items()
        }

    return call


# ---------------------------------------------------------------------------- measuring


class TimeLimitError(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise TimeLimitError


def timed(
    call: Callable[[], api.GroupAssignment], limit: float | None
) -> tuple[float, api.GroupAssignment]:
    """Seconds for one call; raises TimeLimitError past ``limit``."""
    if limit is not None:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        start = time.perf_counter()
        result = call()
        return time.perf_counter() - start, result
    finally:
        if limit is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)


def peak_mib(call: Callable[[], api.GroupAssignment]) -> float:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def quality(spec: api.GroupSpec, assignment: api.GroupAssignment) -> dict[str, int]:
    counts = [len(assignment.get(member, ())) for member in spec.members]
    assigned = sum(counts)
    subscribed = {topic for subscription in spec.members.values() for topic in subscription.topics}
    total = sum(spec.partitions_per_topic[topic] for topic in subscribed)
    moved = 0
    for member, subscription in spec.members.items():
        if subscription.owned:
            moved += len(set(subscription.owned) - set(assignment.get(member, ())))
    return {
        "balance": max(counts) - min(counts),
        "moved": moved,
        "unassigned": total - assigned,
    }


def measure(
    call: Callable[[], api.GroupAssignment], spec: api.GroupSpec, limit: float | None
) -> dict[str, Any]:
    """Warm-up, then the median of RUNS; a slow call is run once and reported as such."""
    gc.collect()
    try:
        first, result = timed(call, limit)
    except TimeLimitError:
        return {"status": f"> {limit:.0f} s (stopped)", "median_ms": None, "limit_s": limit}
    except Exception as error:
        # kafka-python's round-robin breaks on unequal subscriptions; report, do not hide it.
        return {"status": f"fails: {type(error).__name__} {error}", "median_ms": None}
    if first > SLOW_SECONDS:
        report: dict[str, Any] = {"status": "slow: one run", "median_ms": first * 1e3, "runs": 1}
        report["peak_mib"] = None
    else:
        samples = [timed(call, None)[0] for _ in range(RUNS)]
        report = {"status": "ok", "median_ms": statistics.median(samples) * 1e3, "runs": RUNS}
        report["peak_mib"] = peak_mib(call)
    report.update(quality(spec, result))
    return report


def cli_cold_ms(spec: api.GroupSpec, assignor: str) -> dict[str, Any]:
    """Wall time of ``python -m kafka_group_operator assign`` in a fresh process, JSON included."""
    document = {
        "assignor": assignor,
        "partitions_per_topic": dict(spec.partitions_per_topic),
        "members": {member: {"topics": sorted(s.topics)} for member, s in spec.members.items()},
    }
    samples = []
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(document, handle)
    try:
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "kafka_group_operator", "assign", "--input", handle.name],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            samples.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        interpreter = time.perf_counter() - start
    finally:
        os.unlink(handle.name)
    return {
        "assignor": assignor,
        "input": "1,000 x 10,000, fresh",
        "median_ms": statistics.median(samples) * 1e3,
        "bare_interpreter_ms": interpreter * 1e3,
    }


# ----------------------------------------------------------------------------- reporting


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms"


def _row(scenario: str, name: str, row: dict[str, Any]) -> str:
    ours, peer = row["ours"], row["peer"]
    if peer["median_ms"] is None:
        peer_time = peer["status"]
        limit = peer.get("limit_s")
        # A peer stopped at its time limit still gives a lower bound on the ratio.
        ratio = f"> {limit * 1e3 / ours['median_ms']:,.0f}x" if limit else "—"
    else:
        peer_time = _ms(peer["median_ms"]) + (" (one run)" if peer.get("runs") == 1 else "")
        ratio = f"{peer['median_ms'] / ours['median_ms']:,.0f}x"
    peer_quality = (
        f"{peer['balance']} / {peer['moved']}" if peer.get("balance") is not None else "—"
    )
    settled = f" (settled {ours['settled_balance']})" if "settled_balance" in ours else ""
    memory = f"{ours['peak_mib']:.1f}" if ours.get("peak_mib") is not None else "—"
    java = JAVA_MS.get((scenario, name))
    target = TARGET_MS.get(name) if scenario in ("fresh", "join", "leave") else None
    if scenario == "large":
        target = LARGE_TARGET_MS
    goal = f" (≤ {target:.0f})" if target else ""
    java_text = f"{java} ms" if java else ""
    return (
        f"| {name} | {_ms(ours['median_ms'])}{goal} | {peer['name']}: {peer_time} | {ratio} | "
        f"{memory} | {ours['balance']}{settled} / {ours['moved']} | {peer_quality} | {java_text} |"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "## assignors (`python -m bench assignors`)",
        "",
        "Each assignor call alone, in-process and warm: median of 5 after a warm-up. The peer is",
        "kafka-python's assignor of the same name on the same input (for `uniform`, its sticky",
        "assignor: it has no server-side one); a peer slower than a few seconds runs once under a",
        f"{report['peer_timeout_s']:.0f} s limit. Memory is tracemalloc's peak (MiB); balance is "
        "max - min per",
        "member; moved counts owned partitions that changed owner. `cooperative-sticky` "
        "withholds moving",
        "partitions for one round, so its balance is also shown once settled. Java: Kafka's own "
        "assignors",
        "as quoted in the issue (same input sizes), not measured here. Incremental scenarios "
        "start from one",
        "common baseline (the sticky fresh assignment, generation 1) for every assignor.",
        "",
    ]
    for scenario in report["scenarios"]:
        lines += [
            f"**{scenario['title']}**",
            "",
            "| assignor | ours | peer | peer / ours | peak MiB | balance / moved "
            "| peer balance / moved | Java |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [_row(scenario["name"], name, row) for name, row in scenario["rows"].items()]
        lines.append("")
    cli = report["cli"]
    lines.append(
        f"CLI cold start (`python -m kafka_group_operator assign`, {cli['assignor']}, "
        f"{cli['input']}, JSON in and out): {_ms(cli['median_ms'])}, of which "
        f"{_ms(cli['bare_interpreter_ms'])} is the bare interpreter."
    )
    lines.append("")
    verdicts = report["targets"]
    reached = [text for text, ok in verdicts.items() if ok]
    missed = [text for text, ok in verdicts.items() if not ok]
    lines.append("Targets reached: " + ("; ".join(reached) if reached else "none") + ".")
    if missed:
        lines.append("")
        lines.append("Targets missed: " + "; ".join(missed) + ".")
    return "\n".join(lines)


def update_readme(section: str) -> None:
    text = README.read_text()
    block = f"{BEGIN}\n{section}\n{END}"
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        _, after = rest.split(END, 1)
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    README.write_text(text)


def targets(report: dict[str, Any]) -> dict[str, bool]:
    by_name = {scenario["name"]: scenario["rows"] for scenario in report["scenarios"]}
    verdicts: dict[str, bool] = {}
    for name, limit in TARGET_MS.items():
        measured = [
            by_name[s][name]["ours"]["median_ms"]
            for s in ("fresh", "join", "leave")
            if s in by_name
        ]
        if measured:
            verdicts[
                f"{name} ≤ {limit:.0f} ms on 1,000 x 10,000 (worst {max(measured):.1f} ms)"
            ] = max(measured) <= limit
    if "large" in by_name:
        worst = max(row["ours"]["median_ms"] for row in by_name["large"].values())
        verdicts[f"2,000 x 100,000 under 2 s (slowest {worst:,.0f} ms)"] = worst < LARGE_TARGET_MS
    worse = []
    for scenario, rows in by_name.items():
        for name, row in rows.items():
            ours, peer = row["ours"], row["peer"]
            if peer.get("balance") is None or name == "uniform":
                continue
            ours_balance = ours.get("settled_balance", ours["balance"])
            if ours_balance > peer["balance"] or ours["moved"] > peer["moved"]:
                worse.append(f"{scenario}/{name}")
    verdicts[
        "balance and stickiness never worse than the peer's"
        + (f" (worse: {', '.join(worse)})" if worse else "")
    ] = not worse
    return verdicts


def main(argv: list[str]) -> int:
    limit = DEFAULT_PEER_TIMEOUT
    only: set[str] | None = None
    for arg in argv:
        if arg == "--report-only":
            # Re-render the README table from the last results without measuring again.
            update_readme(markdown(json.loads(RESULT.read_text())))
            return 0
        if arg.startswith("--peer-timeout="):
            limit = float(arg.split("=", 1)[1])
        elif arg.startswith("--only="):
            only = set(arg.split("=", 1)[1].split(","))
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "peer": "kafka-python",
        "peer_timeout_s": limit,
        "scenarios": [],
    }
    cases = scenarios()
    # The inputs live for the whole run: keep full collections from rescanning them.
    gc.collect()
    gc.freeze()
    for scenario in cases:
        if only is not None and scenario.name not in only:
            continue
        print(f"-- {scenario.title}", flush=True)
        rows: dict[str, Any] = {}
        # uniform and sticky share kafka-python's sticky assignor as their peer: run it once.
        peers: dict[str, dict[str, Any]] = {}
        for name in sorted(assignors.ASSIGNORS):
            assignor = assignors.get(name)
            spec = scenario.spec
            ours = measure(lambda a=assignor, s=spec: a.assign(s), spec, None)
            if name == "cooperative-sticky":
                ours["settled_balance"] = quality(spec, rounds.settle(assignor, spec)[-1])[
                    "balance"
                ]
            peer_name = PEERS[name]
            if peer_name in scenario.skip_peers:
                peer: dict[str, Any] = {"status": scenario.skip_reason, "median_ms": None}
            elif peer_name in peers:
                peer = dict(peers[peer_name])
            else:
                peer = peers[peer_name] = measure(peer_call(peer_name, spec), spec, limit)
            peer["name"] = peer_name
            rows[name] = {"ours": ours, "peer": peer}
            peer_text = _ms(peer["median_ms"]) if peer["median_ms"] else peer["status"]
            print(
                f"   {name:<20} ours {_ms(ours['median_ms']):>10}   peer {peer_name}: {peer_text}"
            )
        report["scenarios"].append({"name": scenario.name, "title": scenario.title, "rows": rows})
    fresh = next(s for s in cases if s.name == "fresh")
    report["cli"] = cli_cold_ms(fresh.spec, "cooperative-sticky")
    if only is None:
        report["targets"] = targets(report)
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        update_readme(markdown(report))
        print(markdown(report))
    else:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0
