"""Gateway benchmark: a confluent-kafka consumer reading through ``kgo gateway`` vs directly.

The embedded broker holds one topic of ``PARTITIONS`` partitions filled with ``--mb``
megabytes of 10 KB records. Three processes of their own: the broker, ``kgo coordinator``
(with its Kafka listener, which the gateway needs for the bootstrap port's ApiVersions and
any group API) and ``kgo gateway``, as it runs in a pod. The consumer is the same
confluent-kafka ``Consumer`` both ways, assigned every partition from the earliest offset
(the fetch path, which is what the gateway adds to), reading until it has every record:

* **direct**: bootstrapped at the broker;
* **gateway**: bootstrapped at the gateway, so every Fetch goes through its broker port.

Rounds alternate direct/gateway; the best of each and the median of the rounds' ratios are
reported (the machine is shared, and its load moves the figures by 2x within a run).
Target (issue 10): gateway throughput >= 0.8x direct. Writes ``bench/results/gateway.json``;
``--mb=N`` sets the data size (default 300 MB: the whole run stays under two minutes on a
busy two-core machine; the issue's 1 GB takes proportionally longer), ``--quick`` uses 40 MB.

Added latency: ``LATENCY_SAMPLES`` sequential ApiVersions round trips (a small request, the
first of every client connection; on a broker port the gateway rewrites its reply once per
reply and request version and serves the kept bytes after that) directly and through the
gateway's port of the same broker; the added p50/p99 are the differences.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.wire import framing

RESULTS = Path(__file__).parent / "results" / "gateway.json"
PARTITIONS = 4
RECORD_BYTES = 10 * 1024
ROUNDS = 5
LATENCY_SAMPLES = 3000


def fill(bootstrap: str, topic: str, megabytes: int) -> int:
    """``megabytes`` of records spread over the partitions; the number of records."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    count = megabytes * 1024 * 1024 // RECORD_BYTES
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000})
    payload = os.urandom(RECORD_BYTES)
    for index in range(count):
        while True:
            try:
                producer.produce(topic, payload, partition=index % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0, "records left unsent"
    return count


def consume(bootstrap: str, topic: str, count: int) -> dict[str, float]:
    """Read every record of ``topic`` from the earliest offset; seconds and MB/s."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",  # assign() only: never joins
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        received = size = 0
        start = time.perf_counter()
        first: float | None = None
        deadline = time.monotonic() + 300
        while received < count:
            assert time.monotonic() < deadline, f"only {received} of {count} records"
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    if first is None:
                        first = time.perf_counter()
                        first_size = len(message.value() or b"")
                    received += 1
                    size += len(message.value() or b"")
        end = time.perf_counter()
    finally:
        consumer.close()
    assert first is not None
    # Throughput from the first record on: the fetch path, without the client's start-up
    # (bootstrap, metadata), which is reported apart.
    return {
        "seconds": round(end - start, 3),
        "first_record_s": round(first - start, 3),
        "mb_per_s": round((size - first_size) / (end - first) / 1e6, 1),
    }


def round_trips(address: tuple[str, int], samples: int) -> dict[str, float]:
    """p50/p99 in ms of sequential ApiVersions v3 round trips on one connection."""
    from kio.schema.api_versions.v3.request import ApiVersionsRequest

    request = ApiVersionsRequest(client_software_name="bench", client_software_version="1")
    times = []
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for index in range(samples):
            frame = framing.encode_request(request, index)
            start = time.perf_counter()
            sock.sendall(frame)
            size = int.from_bytes(_recv(sock, 4), "big")
            _recv(sock, size)
            times.append(time.perf_counter() - start)
    times.sort()
    return {
        "p50_ms": round(times[len(times) // 2] * 1000, 3),
        "p99_ms": round(times[int(len(times) * 0.99)] * 1000, 3),
    }


def _recv(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def start_kgo(*argv: str, port: int) -> subprocess.Popen[bytes]:
    """``kgo <argv>`` in a process of its own, once it listens on ``port``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kafka_group_operator", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"kgo {argv[0]} exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return process
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"kgo {argv[0]} does not listen on {port}")


def _gateway_broker_port(gateway_port: int) -> int:
    """The gateway's local port of the broker, from a Metadata reply through it."""
    from kio.schema.metadata.v12.request import MetadataRequest
    from kio.schema.metadata.v12.response import MetadataResponse

    request = MetadataRequest(
        topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    with socket.create_connection(("127.0.0.1", gateway_port)) as sock:
        sock.sendall(framing.encode_request(request, 1))
        size = int.from_bytes(_recv(sock, 4), "big")
        _, response = framing.read_response(_recv(sock, size), MetadataResponse)
    return int(response.brokers[0].port)


@contextlib.contextmanager
def coordinator_and_gateway(bootstrap: str, name: str) -> Iterator[int]:
    """A ``kgo coordinator`` with its Kafka listener and a ``kgo gateway`` in front of
    ``bootstrap``, both stopped on exit; yields the gateway's port."""
    api_port, kafka_port, gateway_port = (embedded.free_port() for _ in range(3))
    coordinator = start_kgo(
        "coordinator",
        "--bootstrap",
        bootstrap,
        "--port",
        str(api_port),
        "--kafka-port",
        str(kafka_port),
        "--state-partitions",
        "2",
        "--topic",
        f"{name}-state-{uuid.uuid4().hex[:6]}",
        port=kafka_port,
    )
    try:
        gateway = start_kgo(
            "gateway",
            "--bootstrap",
            bootstrap,
            "--coordinator",
            f"127.0.0.1:{kafka_port}",
            "--port",
            str(gateway_port),
            port=gateway_port,
        )
        try:
            yield gateway_port
        finally:
            _stop(gateway)
    finally:
        _stop(coordinator)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def run(megabytes: int) -> dict[str, Any]:
    with embedded.running_broker() as broker:
        topic = f"bench-gateway-{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        count = fill(broker.bootstrap, topic, megabytes)
        print(f"  {count} records in {time.perf_counter() - started:.1f} s", flush=True)
        with coordinator_and_gateway(broker.bootstrap, "bench-gateway") as gateway_port:
            rounds: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
            for round_ in range(ROUNDS):
                for kind, bootstrap in (
                    ("direct", broker.bootstrap),
                    ("gateway", f"127.0.0.1:{gateway_port}"),
                ):
                    measured = consume(bootstrap, topic, count)
                    rounds[kind].append(measured)
                    print(f"  round {round_} {kind}: {json.dumps(measured)}", flush=True)
            # The broker ports exist now (the consumers' metadata opened them).
            broker_port = _gateway_broker_port(gateway_port)
            host, port = broker.bootstrap.rsplit(":", 1)
            latency: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
            for _ in range(2):
                latency["direct"].append(round_trips((host, int(port)), LATENCY_SAMPLES))
                latency["gateway"].append(round_trips(("127.0.0.1", broker_port), LATENCY_SAMPLES))
            print(f"  latency: {json.dumps(latency)}", flush=True)
    best = {kind: max(r["mb_per_s"] for r in runs) for kind, runs in rounds.items()}
    ratios = [
        round(g["mb_per_s"] / d["mb_per_s"], 2)
        for d, g in zip(rounds["direct"], rounds["gateway"], strict=True)
    ]
    fastest = {kind: min(runs, key=lambda r: r["p99_ms"]) for kind, runs in latency.items()}
    return {
        "benchmark": "gateway",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
        },
        "data": {
            "megabytes": megabytes,
            "records": count,
            "record_bytes": RECORD_BYTES,
            "partitions": PARTITIONS,
        },
        "rounds": rounds,
        "best_mb_per_s": best,
        "gateway_vs_direct": round(best["gateway"] / best["direct"], 2),
        # Each round's gateway run against the direct run just before it: the machine's load
        # moves less within a round than across the whole run.
        "per_round_ratios": ratios,
        "median_round_ratio": statistics.median(ratios),
        "target": ">= 0.8",
        "latency_samples": LATENCY_SAMPLES,
        "latency": latency,
        "added_p50_ms": round(fastest["gateway"]["p50_ms"] - fastest["direct"]["p50_ms"], 3),
        "added_p99_ms": round(fastest["gateway"]["p99_ms"] - fastest["direct"]["p99_ms"], 3),
        "latency_target": "added p99 <= 1 ms",
    }


def main(argv: list[str]) -> int:
    megabytes = 40 if "--quick" in argv else 300
    for arg in argv:
        if arg.startswith("--mb="):
            megabytes = int(arg.removeprefix("--mb="))
    result = run(megabytes)
    summary = (
        "best_mb_per_s",
        "gateway_vs_direct",
        "median_round_ratio",
        "added_p50_ms",
        "added_p99_ms",
    )
    print(json.dumps({k: result[k] for k in summary}))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
