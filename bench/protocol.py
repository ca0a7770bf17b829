"""Coordinator listener benchmark: steady ConsumerGroupHeartbeats per second from one process.

One coordinator process (the runtime on the embedded broker, its member API and its Kafka
listener) serves 200 members in 20 groups of 10, settled (Stable) before measuring. Load
processes of their own (so that the clients' CPU is not the coordinator's) send each member's
steady heartbeat (current epoch, nothing changed) for a fixed time, in three ways on the
same members in the same run:

* **kafka**: ConsumerGroupHeartbeat v1, one connection per member with one heartbeat in
  flight (as consumers heartbeat), from 3 load processes;
* **http**: the member API's ``POST /v1/groups/{group}/heartbeat``, as many requests in
  flight over keep-alive connections (the peer: the same heartbeat through the other door);
* **runtime**: ``CoordinatorRuntime.heartbeat`` called in-process by as many tasks, no I/O
  at all (the ceiling either front door can reach).

Each is run twice, interleaved, and the better run of each is kept.

Every answer is checked (error code 0 / HTTP 200). Target (issue 10): >= 5,000 heartbeats/s
over the Kafka protocol. Writes ``bench/results/protocol.json``; ``--quick`` runs shorter.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.static.primitive import i32Timedelta

from kafka_group_operator.api import app as api_app
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import framing

RESULTS = Path(__file__).parent / "results" / "protocol.json"
GROUPS, MEMBERS_PER_GROUP, PARTITIONS = 20, 10, 20
# Load processes, and per process: connections and heartbeats in flight on each (one per
# member, one at a time, as consumers heartbeat).
LOAD_PROCESSES = 3
CONNECTIONS, WINDOW = GROUPS * MEMBERS_PER_GROUP // LOAD_PROCESSES, 1
HEARTBEAT_INTERVAL = datetime.timedelta(seconds=30)

# ---------------------------------------------------------------------------- load process


def _frames(members: list[dict[str, Any]]) -> list[bytes]:
    unchanged = i32Timedelta.parse(datetime.timedelta(milliseconds=-1))
    return [
        framing.encode_request(
            ConsumerGroupHeartbeatRequest(
                group_id=member["group"],
                member_id=member["member_id"],
                member_epoch=member["epoch"],
                rebalance_timeout=unchanged,
                topic_partitions=None,
            ),
            index,
            "bench",
        )
        for index, member in enumerate(members)
    ]


async def _kafka_load(
    port: int, members: list[dict[str, Any]], duration_s: float
) -> dict[str, Any]:
    frames = _frames(members)
    counts = [0] * CONNECTIONS
    failures: list[int] = []
    deadline = time.perf_counter() + duration_s

    async def connection(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        mine = frames[index::CONNECTIONS]
        sent = 0
        for _ in range(WINDOW):
            writer.write(mine[sent % len(mine)])
            sent += 1
        while True:
            payload = await framing.read_frame(reader, 1 << 20)
            assert payload is not None
            # ResponseHeader v1 (correlation id, tagged fields), then throttle_time_ms
            # (int32) and error_code (int16) of ConsumerGroupHeartbeatResponse v1.
            (error,) = struct.unpack_from(">h", payload, 9)
            if error:
                failures.append(error)
            counts[index] += 1
            if time.perf_counter() < deadline:
                writer.write(mine[sent % len(mine)])
                sent += 1
            elif counts[index] == sent:
                break
        writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection(i) for i in range(CONNECTIONS)))
    elapsed = time.perf_counter() - started
    return {"heartbeats": sum(counts), "seconds": round(elapsed, 3), "errors": failures[:10]}


async def _http_load(port: int, members: list[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    import aiohttp

    count, failures = 0, []
    deadline = time.perf_counter() + duration_s
    connector = aiohttp.TCPConnector(limit=CONNECTIONS * WINDOW)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(index: int) -> None:
            nonlocal count
            mine = members[index :: CONNECTIONS * WINDOW] or members
            sent = 0
            while time.perf_counter() < deadline:
                member = mine[sent % len(mine)]
                sent += 1
                body = {"memberId": member["member_id"], "memberEpoch": member["epoch"]}
                url = f"http://127.0.0.1:{port}/v1/groups/{member['group']}/heartbeat"
                async with session.post(url, json=body) as response:
                    await response.read()
                    if response.status != 200:
                        failures.append(response.status)
                count += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(CONNECTIONS * WINDOW)))
        elapsed = time.perf_counter() - started
    return {"heartbeats": count, "seconds": round(elapsed, 3), "errors": failures[:10]}


def load_main(argv: list[str]) -> int:
    kind, port, members_file, duration = argv[0], int(argv[1]), argv[2], float(argv[3])
    members = json.loads(Path(members_file).read_text())
    run = _kafka_load if kind == "kafka" else _http_load
    print(json.dumps(asyncio.run(run(port, members, duration))), flush=True)
    return 0


# ----------------------------------------------------------------------- coordinator side


async def _load_process(
    kind: str, port: int, members: list[dict[str, Any]], workdir: Path, duration_s: float
) -> dict[str, Any]:
    """The load of ``kind`` from LOAD_PROCESSES processes, each with its share of members."""

    async def one(index: int) -> dict[str, Any]:
        members_file = workdir / f"members-{index}.json"
        members_file.write_text(json.dumps(members[index::LOAD_PROCESSES]))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.protocol", "--load", kind, str(port),
            str(members_file), str(duration_s),
            stdout=asyncio.subprocess.PIPE,
            cwd=Path(__file__).parent.parent,
        )  # fmt: skip
        output, _ = await process.communicate()
        assert process.returncode == 0, output
        loaded: dict[str, Any] = json.loads(output.decode().strip().splitlines()[-1])
        return loaded

    parts = await asyncio.gather(*(one(i) for i in range(LOAD_PROCESSES)))
    heartbeats = sum(part["heartbeats"] for part in parts)
    seconds = max(part["seconds"] for part in parts)
    return {
        "heartbeats": heartbeats,
        "seconds": seconds,
        "errors": [error for part in parts for error in part["errors"]][:10],
        "per_second": round(heartbeats / seconds, 1),
    }


async def _runtime_load(
    runtime: coordinator_runtime.CoordinatorRuntime,
    members: list[dict[str, Any]],
    duration_s: float,
) -> dict[str, Any]:
    count, failures = 0, []
    deadline = time.perf_counter() + duration_s

    async def worker(index: int) -> None:
        nonlocal count
        mine = members[index :: CONNECTIONS * WINDOW] or members
        sent = 0
        while time.perf_counter() < deadline:
            member = mine[sent % len(mine)]
            sent += 1
            try:
                await runtime.heartbeat(
                    messages.HeartbeatRequest(
                        group_id=member["group"],
                        member_id=member["member_id"],
                        member_epoch=member["epoch"],
                    )
                )
            except Exception as error:
                failures.append(type(error).__name__)
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(CONNECTIONS * WINDOW)))
    elapsed = time.perf_counter() - started
    return {
        "heartbeats": count,
        "seconds": round(elapsed, 3),
        "errors": failures[:10],
        "per_second": round(count / elapsed, 1),
    }


async def _settled_members(
    runtime: coordinator_runtime.CoordinatorRuntime, topic: str
) -> list[dict[str, Any]]:
    members = []
    for g in range(GROUPS):
        group = f"bench-protocol-{uuid.uuid4().hex[:6]}-{g}"
        await runtime.configure_group(
            messages.GroupSettings(group_id=group, heartbeat_interval_ms=30_000)
        )
        ids = [uuid.uuid4().hex for _ in range(MEMBERS_PER_GROUP)]
        epochs = dict.fromkeys(ids, 0)
        owned: dict[str, messages.Assignment] = {m: {} for m in ids}
        for _ in range(40):
            for member_id in ids:
                response = await runtime.heartbeat(
                    messages.HeartbeatRequest(
                        group_id=group,
                        member_id=member_id,
                        member_epoch=epochs[member_id],
                        rebalance_timeout_ms=60_000,
                        subscribed_topic_names=(topic,) if epochs[member_id] == 0 else None,
                        owned_partitions=owned[member_id],
                    )
                )
                epochs[member_id] = response.member_epoch
                if response.assignment is not None:
                    owned[member_id] = response.assignment
            if (await runtime.describe_group(group)).state == "Stable":
                break
        described = await runtime.describe_group(group)
        assert described.state == "Stable", described
        members.extend(
            {"group": group, "member_id": m.member_id, "epoch": m.member_epoch}
            for m in described.members
        )
    return members


async def run(quick: bool, workdir: Path) -> dict[str, Any]:
    duration = 2.0 if quick else 6.0
    with embedded.running_broker() as broker:
        topic = f"bench-protocol-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
        runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=broker.bootstrap,
                topic=f"bench-protocol-state-{uuid.uuid4().hex[:8]}",
                partitions=10,
                metadata_interval_ms=500,
            )
        )
        await runtime.start()
        kafka = protocol_listener.Listener(runtime, None, protocol_listener.ListenerConfig(port=0))
        runner = web.AppRunner(api_app.build_app(runtime, None), access_log=None)
        try:
            for _ in range(100):
                if runtime.known_topics().get(topic) is not None:
                    break
                await asyncio.sleep(0.1)
            await kafka.start()
            await runner.setup()
            http_port = embedded.free_port()
            await web.TCPSite(runner, "127.0.0.1", http_port).start()
            members = await _settled_members(runtime, topic)
            results: dict[str, Any] = {}
            # Interleaved twice: the machine's load moves between phases.
            for round_ in range(1 if quick else 2):
                for kind in ("kafka", "http", "runtime"):
                    if kind == "runtime":
                        measured = await _runtime_load(runtime, members, duration)
                    else:
                        port = kafka.port if kind == "kafka" else http_port
                        measured = await _load_process(kind, port, members, workdir, duration)
                    print(f"  round {round_} {kind}: {json.dumps(measured)}", flush=True)
                    assert not measured["errors"], measured
                    best = results.get(kind)
                    if best is None or measured["per_second"] > best["per_second"]:
                        results[kind] = measured
            for member in members:  # nothing changed: every member is still at its epoch
                assert member["epoch"] > 0
        finally:
            await kafka.stop()
            await runner.cleanup()
            await runtime.stop()
    kafka_rate = results["kafka"]["per_second"]
    return {
        "benchmark": "protocol",
        "quick": quick,
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            # Other work on the machine while this ran (1-minute load average at the end).
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        "broker": "tansu (embedded, in-memory storage)",
        "members": len(members),
        "groups": GROUPS,
        "load_processes": LOAD_PROCESSES,
        "connections_per_load_process": CONNECTIONS,
        "in_flight_per_connection": WINDOW,
        "duration_s": duration,
        "best_of_rounds": results,
        "kafka_vs_http": round(kafka_rate / results["http"]["per_second"], 2),
        "kafka_vs_runtime": round(kafka_rate / results["runtime"]["per_second"], 2),
        "targets": {"kafka_heartbeats_per_s": {"target": ">= 5000", "measured": kafka_rate}},
    }


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--load":
        return load_main(argv[1:])
    quick = "--quick" in argv
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        result = asyncio.run(run(quick, Path(workdir)))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
