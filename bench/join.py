"""Join-latency benchmark: an unmodified confluent-kafka consumer, from ``subscribe()`` to
its first record, in a group of the operator's coordinator (through ``kgo gateway``) and in a
native group of the broker.

The embedded broker holds one topic of ``PARTITIONS`` partitions with a record in each.
Beside it, in processes of their own as in a pod: ``kgo coordinator`` with its Kafka
listener, and ``kgo gateway`` in front of both. Each run is a fresh group (nothing committed,
``auto.offset.reset=earliest``) and a fresh ``Consumer`` with the client's defaults
otherwise; the time is from ``subscribe()`` to the first record ``poll()`` returns:

* **consumer**: ``group.protocol=consumer`` (KIP-848) through the gateway, into a group of
  the operator's coordinator (target <= 1 s);
* **classic**: ``group.protocol=classic``, ``cooperative-sticky``, through the gateway, into
  a group of the operator's coordinator (target <= 2 s);
* **native**: the same classic client bootstrapped at the broker, in the broker's own group
  (the peer).

The kinds alternate within each round (the machine's load moves the figures); the median and
the max of each are reported, and each kind's median against the native one. Writes
``bench/results/join.json``; ``--rounds=N`` (default 3) sets the number of runs of each.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.gateway import coordinator_and_gateway
from kafka_group_operator.embedded import broker as embedded

RESULTS = Path(__file__).parent / "results" / "join.json"
PARTITIONS = 3
ROUNDS = 3
# A run that has not consumed by then is reported as failed (the native group's join can
# take tens of seconds on a loaded machine).
RUN_TIMEOUT_S = 90.0

KINDS = {
    "consumer": {"group.protocol": "consumer"},
    "classic": {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
    },
    "native": {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
    },
}
TARGETS_S = {"consumer": 1.0, "classic": 2.0}


def fill(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(PARTITIONS):
        producer.produce(topic, b"record", partition=partition)
    assert producer.flush(30) == 0, "records left unsent"


def join(bootstrap: str, topic: str, settings: dict[str, str]) -> float:
    """Seconds from ``subscribe()`` to the first record of a fresh group."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-join-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "log_level": 0,
            **settings,
        }
    )
    try:
        start = time.perf_counter()
        consumer.subscribe([topic])
        while time.perf_counter() - start < RUN_TIMEOUT_S:
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                return time.perf_counter() - start
        raise RuntimeError(f"no record within {RUN_TIMEOUT_S} s")
    finally:
        consumer.close()


def run(rounds: int) -> dict[str, Any]:
    with embedded.running_broker() as broker:
        topic = f"bench-join-{uuid.uuid4().hex[:6]}"
        fill(broker.bootstrap, topic)
        with coordinator_and_gateway(broker.bootstrap, "bench-join") as gateway_port:
            bootstraps = {
                "consumer": f"127.0.0.1:{gateway_port}",
                "classic": f"127.0.0.1:{gateway_port}",
                "native": broker.bootstrap,
            }
            runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for round_ in range(rounds):
                for kind, settings in KINDS.items():
                    seconds = round(join(bootstraps[kind], topic, settings), 3)
                    runs[kind].append(seconds)
                    print(f"  round {round_} {kind}: {seconds} s", flush=True)
    medians = {kind: round(statistics.median(times), 3) for kind, times in runs.items()}
    return {
        "benchmark": "join",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
        },
        "client": "confluent-kafka (librdkafka) defaults, auto.offset.reset=earliest",
        "partitions": PARTITIONS,
        "runs_s": runs,
        "median_s": medians,
        "max_s": {kind: max(times) for kind, times in runs.items()},
        "median_vs_native": {
            kind: round(medians[kind] / medians["native"], 3) for kind in TARGETS_S
        },
        "targets_s": TARGETS_S,
        "met": {kind: max(runs[kind]) <= target for kind, target in TARGETS_S.items()},
    }


def main(argv: list[str]) -> int:
    rounds = ROUNDS
    for arg in argv:
        if arg.startswith("--rounds="):
            rounds = int(arg.removeprefix("--rounds="))
    result = run(rounds)
    print(json.dumps({k: result[k] for k in ("median_s", "max_s", "median_vs_native", "met")}))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
