"""Coordinator listener benchmark: steady ConsumerGroupHeartbeats per second from one process.

One coordinator process (the runtime on the embedded broker, its member API and its Kafka
listener, on uvloop's event loop as ``kgo coordinator`` runs them) serves 200 members in 20
groups of 10, settled (Stable) before measuring. Load processes of their own (so that the
clients' CPU is not the coordinator's) send each member's steady heartbeat (current epoch,
nothing changed) for a fixed time, in three ways on the same members in the same run:

* **kafka**: ConsumerGroupHeartbeat v1, one connection per member with one heartbeat in
  flight (as consumers heartbeat), from 3 load processes (asyncio protocols on uvloop, each
  answer read as far as its error code: the load takes as little of the shared cores as it
  can);
* **http**: the member API's ``POST /v1/groups/{group}/heartbeat``, as many requests in
  flight over keep-alive connections (the peer: the same heartbeat through the other door);
* **runtime**: ``CoordinatorRuntime.heartbeat`` called in-process by as many tasks, no I/O
  at all (the ceiling either front door can reach);
* **floor**: the kafka phase's load against a bare asyncio protocol in the coordinator
  process, on its event loop, that answers each frame with the same fixed bytes (no decode,
  no runtime): what reading a frame and writing an answer cost on this machine, the part of
  the listener's cost that no work on the listener removes;
* **ideal**: the floor again, spending on each frame, busy, the runtime's own CPU per
  heartbeat (measured in-process just before the rounds: ``ideal_work_us``): a listener whose
  decoding, dispatch and answer cost nothing. Its rate against the runtime's
  (``ideal_vs_runtime``) is the most any listener can reach in this harness, where each
  answer also wakes a load process that sleeps waiting for it.

The five run in turn, ``--rounds=N`` times (3; 1 with ``--quick``), so that each round's
ratios compare phases run back to back on a machine whose load moves; medians and ranges
over the rounds are reported. Besides the rates, the coordinator process's CPU time per
heartbeat answered in each phase: the rates share two cores with the load processes and the
machine's other work, CPU per heartbeat does not, and the runtime's over the listener's is the
rate the listener would reach against the runtime's with a core of its own. The frame check
of a steady heartbeat (``wire.bounds``) is timed in the same process and given as a share of
the listener's CPU per heartbeat (target: at most 5 %, issue 24).

Every answer is checked (error code 0 / HTTP 200). Targets: >= 5,000 heartbeats/s over the
Kafka protocol (issue 10), >= 0.6x the runtime's rate (issue 24). Writes
``bench/results/protocol.json``; ``--quick`` runs shorter; ``--loop=asyncio`` runs the
coordinator side on asyncio's own event loop instead (the load stays on uvloop).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import os
import platform
import resource
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

import uvloop
from aiohttp import web
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.static.primitive import i32Timedelta

from kafka_group_operator.api import app as api_app
from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import bounds, framing

RESULTS = Path(__file__).parent / "results" / "protocol.json"
KINDS = ("kafka", "floor", "ideal", "http", "runtime")
_SIZE, _ERROR = struct.Struct(">i"), struct.Struct(">h")
GROUPS, MEMBERS_PER_GROUP, PARTITIONS = 20, 10, 20
# Load processes, and per process: connections and heartbeats in flight on each (one per
# member, one at a time, as consumers heartbeat).
LOAD_PROCESSES = 3
CONNECTIONS, WINDOW = GROUPS * MEMBERS_PER_GROUP // LOAD_PROCESSES, 1
HEARTBEAT_INTERVAL = datetime.timedelta(seconds=30)
CLIENT_ID = "bench"

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
            CLIENT_ID,
        )
        for index, member in enumerate(members)
    ]


class _Heartbeats(asyncio.Protocol):
    """One member's connection of the load: a heartbeat in flight at a time, the next sent
    when the answer arrives, until the deadline. As lean as the client side can be (a
    protocol, no stream, the answer read as far as its error code), so that the load takes
    as little as possible of the cores it shares with the coordinator."""

    def __init__(self, frames: list[bytes], deadline: float, failures: list[int]) -> None:
        self.frames, self.deadline, self.failures = frames, deadline, failures
        self.buffer = bytearray()
        self.sent = self.answered = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        for _ in range(WINDOW):
            self._send()

    def _send(self) -> None:
        self.transport.write(self.frames[self.sent % len(self.frames)])
        self.sent += 1

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 4 and len(buffer) >= 4 + (size := _SIZE.unpack_from(buffer)[0]):
            # The size, ResponseHeader v1 (correlation id, tagged fields), then
            # throttle_time_ms (int32) and error_code (int16) of the response.
            (error,) = _ERROR.unpack_from(buffer, 13)
            del buffer[: 4 + size]
            if error:
                self.failures.append(error)
            self.answered += 1
            if time.perf_counter() < self.deadline:
                self._send()
            elif self.answered == self.sent:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answered < self.sent:
            self.failures.append(-1)  # closed by the listener with answers owed
        if not self.done.done():
            self.done.set_result(None)


async def _kafka_load(
    port: int, members: list[dict[str, Any]], duration_s: float
) -> dict[str, Any]:
    frames = _frames(members)
    failures: list[int] = []
    loop = asyncio.get_running_loop()
    deadline = time.perf_counter() + duration_s
    started = time.perf_counter()
    connections: list[_Heartbeats] = []
    for index in range(CONNECTIONS):
        mine = frames[index::CONNECTIONS]
        _, connection = await loop.create_connection(
            functools.partial(_Heartbeats, mine, deadline, failures), "127.0.0.1", port
        )
        connections.append(connection)
    await asyncio.gather(*(connection.done for connection in connections))
    elapsed = time.perf_counter() - started
    heartbeats = sum(connection.answered for connection in connections)
    return {"heartbeats": heartbeats, "seconds": round(elapsed, 3), "errors": failures[:10]}


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
    run = _http_load if kind == "http" else _kafka_load
    # uvloop: the load's own cost per heartbeat, on the cores the coordinator uses too.
    print(json.dumps(uvloop.run(run(port, members, duration))), flush=True)
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


# A ConsumerGroupHeartbeat v1 answer's shape as the load reads it: size, correlation id,
# no tagged fields, throttle_time_ms, error_code 0, then 18 bytes the load does not read.
_FLOOR_ANSWER = _SIZE.pack(29) + bytes(29)


class _Floor(asyncio.Protocol):
    """The floor: each whole frame answered with ``_FLOOR_ANSWER``, nothing decoded; after
    ``work_s`` of busy CPU for the ideal listener (see ``run``)."""

    def __init__(self, work_s: float = 0.0) -> None:
        self.work_s = work_s

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 4 and len(buffer) >= 4 + (size := _SIZE.unpack_from(buffer)[0]):
            del buffer[: 4 + size]
            if self.work_s:
                done = time.perf_counter() + self.work_s
                while time.perf_counter() < done:
                    pass
            self.transport.write(_FLOOR_ANSWER)


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
    members: list[dict[str, Any]] = []
    for g in range(GROUPS):
        group = f"bench-protocol-{uuid.uuid4().hex[:6]}-{g}"
        await runtime.configure_group(
            # A session of 5 minutes: on a loaded machine the load processes of a phase can
            # take many seconds to start, and no member may expire between its heartbeats.
            messages.GroupSettings(
                group_id=group, heartbeat_interval_ms=30_000, session_timeout_ms=300_000
            )
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
                        # As the load's heartbeats name them: a client id or address that
                        # changed would be written by the first heartbeat of a phase.
                        client_id=CLIENT_ID,
                        client_host="127.0.0.1",
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


def _cpu_seconds() -> float:
    """CPU time of this process so far (the coordinator: runtime, listener, member API and
    librdkafka's threads; the load processes are children, not counted)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _check_us() -> float:
    """The frame check (``wire.bounds``) of a steady ConsumerGroupHeartbeat v1, in this
    process: median of 7 runs of 20,000 calls, in microseconds."""
    member = {"group": "bench-protocol-abcdef-1", "member_id": "m" * 32, "epoch": 7}
    payload = _frames([member])[0][4:]
    schema = framing.request_type(68, 1)
    assert schema is not None
    # After request header v2: key, version, correlation id, client id "bench", no tags.
    offset = 8 + 2 + len("bench") + 1
    assert bounds.check(schema, payload, offset) == len(payload)
    runs = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(20_000):
            bounds.check(schema, payload, offset)
        runs.append((time.perf_counter() - started) / 20_000 * 1e6)
    return statistics.median(runs)


def _spread(values: list[float], digits: int = 2) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "range": [round(min(values), digits), round(max(values), digits)],
    }


async def run(quick: bool, workdir: Path, rounds: int) -> dict[str, Any]:
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
        floor: asyncio.Server | None = None
        ideal: asyncio.Server | None = None
        try:
            for _ in range(100):
                if runtime.known_topics().get(topic) is not None:
                    break
                await asyncio.sleep(0.1)
            await kafka.start()
            await runner.setup()
            http_port = embedded.free_port()
            await web.TCPSite(runner, "127.0.0.1", http_port).start()
            floor = await asyncio.get_running_loop().create_server(_Floor, "127.0.0.1", 0)
            floor_port: int = floor.sockets[0].getsockname()[1]
            members = await _settled_members(runtime, topic)
            # The ideal listener: the floor, spending on each frame the runtime's own CPU per
            # heartbeat (measured here first), as a listener whose decoding, dispatch and
            # answer cost nothing would. What it reaches against the runtime is the most any
            # listener can in this harness, where each answer also wakes a sleeping client.
            cpu = _cpu_seconds()
            calibration = await _runtime_load(runtime, members, duration / 3)
            ideal_work_s = (_cpu_seconds() - cpu) / calibration["heartbeats"]
            ideal = await asyncio.get_running_loop().create_server(
                lambda: _Floor(ideal_work_s), "127.0.0.1", 0
            )
            ideal_port: int = ideal.sockets[0].getsockname()[1]
            measured_rounds: list[dict[str, Any]] = []
            # Interleaved: the machine's load moves between phases, and each round's ratio
            # compares phases run back to back.
            for round_ in range(rounds):
                measured_round: dict[str, Any] = {}
                for kind in KINDS:
                    cpu = _cpu_seconds()
                    if kind == "runtime":
                        measured = await _runtime_load(runtime, members, duration)
                    else:
                        port = {
                            "kafka": kafka.port,
                            "floor": floor_port,
                            "ideal": ideal_port,
                        }.get(kind, http_port)
                        measured = await _load_process(kind, port, members, workdir, duration)
                    measured["cpu_us_per_heartbeat"] = round(
                        (_cpu_seconds() - cpu) / measured["heartbeats"] * 1e6, 1
                    )
                    measured["load_average_1m"] = round(os.getloadavg()[0], 2)
                    print(f"  round {round_} {kind}: {json.dumps(measured)}", flush=True)
                    assert not measured["errors"], measured
                    measured_round[kind] = measured
                measured_rounds.append(measured_round)
            for member in members:  # nothing changed: every member is still at its epoch
                assert member["epoch"] > 0
        finally:
            if floor is not None:
                floor.close()
            if ideal is not None:
                ideal.close()
            await kafka.stop()
            await runner.cleanup()
            await runtime.stop()
    check_us = _check_us()

    def each(kind: str, key: str) -> list[float]:
        return [float(r[kind][key]) for r in measured_rounds]

    kafka_cpu = each("kafka", "cpu_us_per_heartbeat")
    kafka_rates = each("kafka", "per_second")
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
        "rounds": measured_rounds,
        "heartbeats_per_s": {kind: _spread(each(kind, "per_second"), 1) for kind in KINDS},
        "cpu_us_per_heartbeat": {
            kind: _spread(each(kind, "cpu_us_per_heartbeat"), 1) for kind in KINDS
        },
        # Each round's ratio, of phases run back to back.
        "kafka_vs_runtime": _spread(
            [k / r for k, r in zip(kafka_rates, each("runtime", "per_second"), strict=True)]
        ),
        "kafka_vs_http": _spread(
            [k / h for k, h in zip(kafka_rates, each("http", "per_second"), strict=True)]
        ),
        # The runtime's CPU per heartbeat over the listener's: the rate the listener reaches
        # against the runtime's, each with a core of its own (the machine's load and the
        # load processes' share of the cores left out).
        "kafka_vs_runtime_cpu": _spread(
            [r / k for k, r in zip(kafka_cpu, each("runtime", "cpu_us_per_heartbeat"), strict=True)]
        ),
        # The ideal listener's rate against the runtime's (each round's, back to back): the
        # most any listener reaches in this harness.
        "ideal_work_us": round(ideal_work_s * 1e6, 1),
        "ideal_vs_runtime": _spread(
            [
                i / r
                for i, r in zip(
                    each("ideal", "per_second"), each("runtime", "per_second"), strict=True
                )
            ]
        ),
        # The floor's CPU per heartbeat over the listener's: the share of the listener's cost
        # that is reading a frame and writing its answer.
        "floor_share_of_kafka_cpu": _spread(
            [f / k for k, f in zip(kafka_cpu, each("floor", "cpu_us_per_heartbeat"), strict=True)]
        ),
        "frame_check": {
            "check_us": round(check_us, 2),
            "share_of_listener_cpu_per_heartbeat": round(
                check_us / statistics.median(kafka_cpu), 4
            ),
            "target": "<= 0.05",
        },
        "targets": {
            "kafka_heartbeats_per_s": {
                "target": ">= 5000",
                "measured": round(statistics.median(kafka_rates), 1),
            },
            "kafka_vs_runtime": {
                "target": ">= 0.6",
                "measured": round(
                    statistics.median(
                        [
                            k / r
                            for k, r in zip(kafka_rates, each("runtime", "per_second"), strict=True)
                        ]
                    ),
                    2,
                ),
            },
        },
    }


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--load":
        return load_main(argv[1:])
    quick = "--quick" in argv
    rounds = 1 if quick else 3
    for arg in argv:
        if arg.startswith("--rounds="):
            rounds = int(arg.split("=", 1)[1])
    import tempfile

    loop = "asyncio" if "--loop=asyncio" in argv else "uvloop"
    with tempfile.TemporaryDirectory() as workdir:
        factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            result = runner.run(run(quick, Path(workdir), rounds))
    result["coordinator_event_loop"] = loop
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
