"""Member-library benchmark: ``GroupMember`` against a plain confluent-kafka ``Consumer``.

Records of 100 bytes on 4 partitions, read end to end by one member of a group that a real
coordinator (``kgo coordinator``, Kafka's default heartbeat interval and session timeout)
runs, and by a plain ``Consumer`` with the same librdkafka settings, assigned the same
partitions by hand, on the same broker in the same run:

* **messages**: ``for message in member`` against the plain per-message loop
  (``poll(timeout)``, skip ``None`` and errors);
* **batches**: ``for batch in member.batches(N, timeout)`` against plain batches
  (``consume(num_messages=N, timeout)``, errors screened out at C speed, as ours are).

The loop bodies are the same on both sides: count the records. Each round writes a fresh
topic; both sides of the round read it whole, at the same time, taking turns a chunk
(``--chunk``, 10,000 records) at a time, the one going first alternating from pair to pair,
so that both meet the same load on a shared machine. Before the timed part both fetchers get
``PREFETCH_S`` to fill their queues and both read a tenth of the records (the warm-up). A
round's ratio is ours over the peer's rate over all their timed chunks (wall clock); also
reported: the median of the chunk pairs' ratios (a chunk that the scheduler preempted, or
that waited on the broker, counts once, not by its length) and the ratio per second of the
consuming thread's CPU time (what the client's own work costs, whatever the load). The
machine's load average is sampled at every round.

Goals (issue 24): both ratios >= 0.9, on the embedded broker (tansu) and on Apache Kafka.
Writes ``bench/results/member.json`` (``--output`` elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench import runner
from kafka_group_operator.commands import demo
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.embedded import kafka
from kafka_group_operator.member import GroupMember, MemberConfig

RESULTS = Path(__file__).parent / "results" / "member.json"
PARTITIONS = 4
RECORD_BYTES = 100
MODES = ("messages", "batches")
BROKERS = ("tansu", "kafka")
GOAL = 0.9
# Kafka's defaults (group.consumer.heartbeat.interval.ms, group.consumer.session.timeout.ms).
HEARTBEAT_INTERVAL_MS = 5_000
SESSION_TIMEOUT_MS = 45_000
POLL_TIMEOUT_S = 1.0
# Both clients' fetchers may queue a whole run's records (librdkafka's defaults stop at about
# 100,000 of them here), and both wait PREFETCH_S after their first record for the queue to
# fill: a run then times the client's own work per record, not the broker's fetches (tansu on
# this shared machine serves fewer records per second than either client consumes).
QUEUE_SETTINGS = {"queued.max.messages.kbytes": "1048576", "queued.min.messages": "10000000"}
PREFETCH_S = 5.0
ASSIGN_TIMEOUT_S = 60.0


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        choices=(*BROKERS, "both"),
        default="both",
        help="tansu (embedded), kafka (Apache Kafka, one node) or both (default)",
    )
    parser.add_argument(
        "--mode",
        choices=(*MODES, "both"),
        default="both",
        help="per-message iteration, batches, or both (default)",
    )
    parser.add_argument(
        "--records", type=_positive, default=300_000, help="records per run (300,000)"
    )
    parser.add_argument("--rounds", type=_positive, default=9, help="rounds per mode (9)")
    parser.add_argument(
        "--batch-size",
        type=_positive,
        default=500,
        help="records per batch, both sides; also the member's max_poll_records (500)",
    )
    parser.add_argument(
        "--chunk",
        type=_positive,
        default=10_000,
        help="records per turn: the sides take turns a chunk at a time (10,000)",
    )
    parser.add_argument("--quick", action="store_true", help="60,000 records, 3 rounds")
    parser.add_argument("--output", type=Path, default=RESULTS, help="where to write results")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


class Rates(NamedTuple):
    """Records per second of wall-clock time, and per second of the consuming thread's CPU."""

    wall: float
    cpu: float


# ----------------------------------------------------------------------------- the topic


def fill_topic(group: demo.LocalGroup, records: int) -> str:
    """A fresh topic of ``records`` records of RECORD_BYTES, spread over its partitions."""
    assert group.broker is not None
    name = f"bench-member-{uuid.uuid4().hex[:8]}"
    group.create_topic(name, PARTITIONS)
    producer = Producer(
        {"bootstrap.servers": group.broker.bootstrap, "linger.ms": 20, "log_level": 4}
    )
    value = b"x" * RECORD_BYTES
    for index in range(records):
        while True:
            try:
                producer.produce(name, value, partition=index % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0, "records left unsent"
    return name


def drop_topic(group: demo.LocalGroup, name: str) -> None:
    """Free the broker's memory (tansu keeps everything in memory); best effort."""
    assert group.broker is not None
    admin = AdminClient({"bootstrap.servers": group.broker.bootstrap, "log_level": 3})
    with contextlib.suppress(Exception):
        admin.delete_topics([name])[name].result(30)


def fetcher_settings(bootstrap: str, group_id: str) -> dict[str, Any]:
    """The librdkafka settings ``GroupMember`` gives its fetcher, for the plain peer."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        **QUEUE_SETTINGS,
    }


# -------------------------------------------------------------------------------- the runs


class Side(Protocol):
    """One side of a round: ``take(count)`` runs the user's loop for about ``count`` records
    (a whole number of batches for the batch sides) and says how many it took."""

    def take(self, count: int) -> int: ...


class PlainMessages:
    def __init__(self, consumer: Consumer, batch_size: int) -> None:
        self.consumer = consumer

    def take(self, count: int) -> int:
        taken = 0
        while taken < count:
            message = self.consumer.poll(POLL_TIMEOUT_S)
            if message is None or message.error() is not None:
                continue
            taken += 1
        return taken


class PlainBatches:
    def __init__(self, consumer: Consumer, batch_size: int) -> None:
        self.consumer = consumer
        self.batch_size = batch_size

    def take(self, count: int) -> int:
        taken = 0
        while taken < count:
            batch = self.consumer.consume(self.batch_size, POLL_TIMEOUT_S)
            if any(map(Message.error, batch)):
                batch = [message for message in batch if message.error() is None]
            taken += len(batch)
        return taken


class OurMessages:
    def __init__(self, member: GroupMember, batch_size: int) -> None:
        self.messages = iter(member)

    def take(self, count: int) -> int:
        taken = 0
        for _ in self.messages:
            taken += 1
            if taken >= count:
                break
        return taken


class OurBatches:
    def __init__(self, member: GroupMember, batch_size: int) -> None:
        self.batches = member.batches(batch_size, POLL_TIMEOUT_S)

    def take(self, count: int) -> int:
        taken = 0
        for batch in self.batches:
            taken += len(batch)
            if taken >= count:
                break
        return taken


SIDES: dict[str, tuple[type[OurMessages | OurBatches], type[PlainMessages | PlainBatches]]] = {
    "messages": (OurMessages, PlainMessages),
    "batches": (OurBatches, PlainBatches),
}


def plain_consumer(group: demo.LocalGroup, topic: str) -> Consumer:
    assert group.broker is not None
    consumer = Consumer(fetcher_settings(group.broker.bootstrap, f"{group.group}.peer"))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    return consumer


@contextlib.contextmanager
def joined_member(group: demo.LocalGroup, topic: str, batch_size: int) -> Iterator[GroupMember]:
    """A member of the group subscribed to ``topic``, leaving for good afterwards."""
    assert group.broker is not None
    member = GroupMember(
        MemberConfig(
            group_id=group.group,
            coordinator_url=group.coordinator_url,
            token=group.token,
            topics=(topic,),
            bootstrap_servers=group.broker.bootstrap,
            lost_after_ms=SESSION_TIMEOUT_MS // 2,
            poll_timeout_s=POLL_TIMEOUT_S,
            max_poll_records=batch_size,
            kafka_config=QUEUE_SETTINGS,
        )
    )
    try:
        yield member
    finally:
        member.stop(permanent=True)
        member.close()


def interleaved(ours: Side, peer: Side, records: int, chunk: int) -> dict[str, Any]:
    """Both sides through the same records, a chunk at a time, taking turns (ours first in
    every other pair), so that both see the same load on this shared machine."""
    for side in (ours, peer):
        side.take(1)  # ours has joined and been assigned; both fetchers are at work
    time.sleep(PREFETCH_S)
    for side in (ours, peer):
        side.take(records // 10)  # warm-up, not timed
    totals = {"ours": [0, 0.0, 0.0], "peer": [0, 0.0, 0.0]}  # records, wall s, CPU s
    pair_ratios = []
    pairs = (records - records // 10) // chunk - 1  # a chunk to spare: batches overshoot
    for pair in range(pairs):
        order = (
            (("ours", ours), ("peer", peer)) if pair % 2 == 0 else (("peer", peer), ("ours", ours))
        )
        rate = {}
        for name, side in order:
            wall, cpu = time.perf_counter(), time.thread_time()
            taken = side.take(chunk)
            elapsed = time.perf_counter() - wall
            total = totals[name]
            total[0] += taken
            total[1] += elapsed
            total[2] += time.thread_time() - cpu
            rate[name] = taken / elapsed
        pair_ratios.append(rate["ours"] / rate["peer"])
    rates = {name: Rates(n / wall, n / cpu) for name, (n, wall, cpu) in totals.items()}
    return {
        "ours": rates["ours"],
        "peer": rates["peer"],
        "pairs": pairs,
        "pair_ratio": statistics.median(pair_ratios),
    }


def measure(
    group: demo.LocalGroup, mode: str, rounds: int, records: int, batch_size: int, chunk: int
) -> dict[str, Any]:
    ours_side, peer_side = SIDES[mode]
    rounds_out: list[dict[str, Any]] = []
    for index in range(rounds):
        topic = fill_topic(group, records)
        load = os.getloadavg()[0]
        consumer = plain_consumer(group, topic)
        try:
            with joined_member(group, topic, batch_size) as member:
                result = interleaved(
                    ours_side(member, batch_size),
                    peer_side(consumer, batch_size),
                    records,
                    chunk,
                )
        finally:
            consumer.close()
            drop_topic(group, topic)
        ours, peer = result["ours"], result["peer"]
        rounds_out.append(
            {
                "ours_per_s": round(ours.wall),
                "peer_per_s": round(peer.wall),
                "ratio": round(ours.wall / peer.wall, 3),
                "pair_ratio_median": round(result["pair_ratio"], 3),
                "ours_per_cpu_s": round(ours.cpu),
                "peer_per_cpu_s": round(peer.cpu),
                "cpu_ratio": round(ours.cpu / peer.cpu, 3),
                "chunk_pairs": result["pairs"],
                "load_1m": round(load, 2),
            }
        )
        print(
            f"  {mode} round {index + 1}/{rounds}: ours {ours.wall:,.0f}/s, "
            f"plain {peer.wall:,.0f}/s, {ours.wall / peer.wall:.2f}x "
            f"(median of the chunk pairs {result['pair_ratio']:.2f}x); "
            f"per CPU second {ours.cpu / peer.cpu:.2f}x; load {load:.1f}",
            flush=True,
        )
    return summarise(rounds_out)


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def spread(key: str, digits: int = 3) -> dict[str, Any]:
        values = [r[key] for r in rounds]
        return {
            "median": round(statistics.median(values), digits),
            "range": [min(values), max(values)],
        }

    ratio = statistics.median(r["ratio"] for r in rounds)
    return {
        "ratio": spread("ratio"),
        "pair_ratio": spread("pair_ratio_median"),
        "ours_per_s": spread("ours_per_s", 0),
        "peer_per_s": spread("peer_per_s", 0),
        "cpu_ratio": spread("cpu_ratio"),
        "ours_per_cpu_s": spread("ours_per_cpu_s", 0),
        "peer_per_cpu_s": spread("peer_per_cpu_s", 0),
        "load_1m": spread("load_1m", 2),
        "goal": f"ratio >= {GOAL}",
        "met": ratio >= GOAL,
        "rounds": rounds,
    }


@contextlib.contextmanager
def running(kind: str) -> Iterator[tuple[embedded.Broker, str]]:
    if kind == "tansu":
        with embedded.running_broker() as broker:
            yield broker, "tansu (embedded, in memory)"
    else:
        with kafka.running_kafka(1, fast=False, heap_mb=1024) as cluster:
            yield cluster, f"Apache Kafka {kafka.KAFKA_VERSION} (KRaft, one node)"


def on_broker(
    kind: str, modes: tuple[str, ...], rounds: int, records: int, batch_size: int, chunk: int
) -> dict[str, Any]:
    with running(kind) as (broker, description):
        group = demo.LocalGroup(
            group=f"bench-member-{uuid.uuid4().hex[:6]}",
            topic=f"bench-member-group-{uuid.uuid4().hex[:6]}",
            partitions=PARTITIONS,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            state_partitions=1,
        )
        group.start(broker)
        try:
            result: dict[str, Any] = {"broker": description}
            for mode in modes:
                print(f"{kind}: {mode}", flush=True)
                result[mode] = measure(group, mode, rounds, records, batch_size, chunk)
            return result
        finally:
            group.stop()


def main(options: argparse.Namespace) -> int:
    records, rounds = (60_000, 3) if options.quick else (options.records, options.rounds)
    modes = MODES if options.mode == "both" else (options.mode,)
    brokers = BROKERS if options.broker == "both" else (options.broker,)
    load_before = os.getloadavg()
    results = {
        kind: on_broker(kind, modes, rounds, records, options.batch_size, options.chunk)
        for kind in brokers
    }
    summary = {
        "benchmark": "member",
        "records_per_run": records,
        "record_bytes": RECORD_BYTES,
        "partitions": PARTITIONS,
        "batch_size": options.batch_size,
        "chunk": options.chunk,
        "rounds": rounds,
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "brokers": results,
    }
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(summary, indent=2) + "\n")
    for kind, result in results.items():
        for mode in modes:
            figures = result[mode]
            low, high = figures["ratio"]["range"]
            print(
                f"{kind} {mode}: median {figures['ratio']['median']}x (range {low}-{high}), "
                f"of the chunk pairs {figures['pair_ratio']['median']}x, "
                f"per CPU second {figures['cpu_ratio']['median']}x; goal >= {GOAL}: "
                f"{'met' if figures['met'] else 'MISSED'}"
            )
    print(f"wrote {options.output}")
    return 0


if __name__ == "__main__":
    sys.exit(runner.run_alone("member", sys.argv[1:]))
