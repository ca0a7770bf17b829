"""Scale: 10,000 groups and 100,000 members on three coordinator replicas.

Setup, on the embedded broker: a data topic of 10 partitions that every group subscribes to,
and three ``kgo coordinator`` processes splitting a 50-partition state topic with
``--partitions`` (0-16, 17-33, 34-49), as three replicas with fixed partition sets do.

**How the members join.** A group of N members is formed by the coordinator's own handlers,
the sans-IO ``CoordinatorShard``, in this process: the group is configured (30 min session
timeout, 60 s heartbeat interval: members that heartbeat slowly), its N members join
(``heartbeat`` at epoch 0, subscribed to the data topic) and heartbeat, acknowledging what
they were given, until a whole round changes nothing (the group is Stable, every member at
the group's epoch owning its target); each step's records are replayed into the shard, as
the runtime does once they are committed. The records are produced to the group's state
partition. Groups form alike, so one group is formed with a placeholder id of the same
length and every group's records are that template with its own id put in (member ids
embed the group id; the first group is also formed directly and must give the same bytes).
The three replicas then start and load the topic: their memory holds exactly the groups the
joins left. Joining through the replicas over HTTP would give the same state, but each join
and each reconciliation step is a transaction on the state partition, and the embedded
broker (tansu) commits a few hundred transactions per second in all (``bench
state_topic``): a 10-member group's formation is 40 heartbeats, 29 of which write, plus its
configuration, so 300,000 transactions for 10,000 groups, 12 to 23 minutes at 220 to 430 a
second for the largest size alone. The joins are not what is measured.

**Memory.** The replicas' resident memory (``VmRSS``, summed over the three) once they have
loaded and run for 3 s, at several sizes (groups x members per group: 1,000 x 10, 3,000 x 1,
1,000 x 30, 3,000 x 10, 10,000 x 10: the mixed shapes tell a group's cost from a member's),
each size on a state topic of its own with three fresh replicas, fitted by least squares to
``fixed + per_group * groups + per_member * members``. RSS after a load includes what the
load left in the allocator's free lists; at the largest size it is read again after the
heartbeats.

**Heartbeats.** At the largest size, two load processes (the minimal HTTP/1.1 client of
``bench.rebalance._heartbeat_load``, paced to a rate instead of flat out) send steady
heartbeats (current epoch, nothing changes) of all the members, each member's in turn, at
increasing total rates: 3 s of warm-up, then 12 s measured, over 24 keep-alive connections
per replica and load process, each heartbeat straight to the replica serving its group.
Latency is from the request's write to the whole reply read; the time a heartbeat waited
for a free connection is reported apart, and so are the cores the replicas, the broker and
the load processes used over each span (their CPU time), and over 5 s without heartbeats.
Before the rates, 20 s at 100/s are reported apart: the first heartbeats after a load meet
each replica's first full garbage collection of what it loaded.
A rate is sustained when the replies within the measured span reach 95% of the rate
offered, no heartbeat fails, and the p99 wait for a connection stays under 100 ms (no
standing queue). The highest sustained rate is the steady rate this machine carries; each
member then heartbeats every members / rate seconds.
KIP-848's default 5 s interval for 100,000 members (20,000 heartbeats/s) is beyond two
shared cores that also run the broker and the load processes.

``--protocol=kafka`` sends the heartbeats to the replicas' coordinator listeners instead:
ConsumerGroupHeartbeat v0, as a KIP-848 consumer sends its steady heartbeat, each encoded
once (with no client id: the members were formed with none, and a member whose client id
changes is rewritten, a transaction, at its heartbeat), at rates from 1,000/s up to
20,000/s; results in ``bench/results/scale-kafka.json``.

Target (issue 13): heartbeat p99 <= 50 ms at the steady rate; memory per group and per
member reported. Writes ``bench/results/scale.json``; ``--quick`` runs small sizes, shorter;
``--sizes=GROUPSxMEMBERS,...`` other sizes (the last one gets the heartbeats);
``--rates=RATE,...`` these heartbeat rates only, each run whether or not the one before was
sustained. Each rate's row also gives the replicas' CPU per heartbeat answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kafka_group_operator.coordinator import messages, shard
from kafka_group_operator.embedded import broker as embedded
from kafka_group_records import codec, partitioning

RESULTS = Path(__file__).parent / "results" / "scale.json"
# ``--protocol=kafka``: the heartbeats on the coordinator listeners.
RESULTS_KAFKA = Path(__file__).parent / "results" / "scale-kafka.json"
STATE_PARTITIONS = 50
SPLIT = ("0-16", "17-33", "34-49")
DATA_TOPIC = "scale-orders"
DATA_PARTITIONS = 10
SESSION_TIMEOUT_MS = 1_800_000
HEARTBEAT_INTERVAL_MS = 60_000
SIZES = ((1_000, 10), (3_000, 1), (1_000, 30), (3_000, 10), (10_000, 10))
QUICK_SIZES = ((100, 10), (300, 1), (100, 30), (300, 10), (1_000, 10))
RATES = (100, 250, 500, 1_000, 2_000, 3_000, 4_000, 6_000)
# Up to KIP-848's 5 s interval for 100,000 members: 20,000/s.
KAFKA_RATES = (1_000, 2_000, 4_000, 6_667, 10_000, 13_333, 20_000)
IDLE_S = 5.0
PRIME_RATE = 100
PRIME_S = 20.0
# The member API records each member's address: the load processes' is this one, and a
# member formed with another would be rewritten (one transaction) at its first heartbeat.
CLIENT_HOST = "127.0.0.1"
LOAD_PROCESSES = 2
CONNECTIONS = 24  # per replica and load process
WARMUP_S = 3.0
MEASURE_S = 12.0
SUSTAINED = 0.95
MAX_WAIT_P99_MS = 100.0
TARGET_P99_MS = 50.0


def _replica_of(partition: int) -> int:
    for index, spec in enumerate(SPLIT):
        low, high = (int(x) for x in spec.split("-"))
        if low <= partition <= high:
            return index
    raise ValueError(partition)


# ------------------------------------------------------------------------- forming groups


def _topic_id(bootstrap: str, name: str) -> str | None:
    """The topic id as the runtime reads it (``CoordinatorRuntime._describe_topic_ids``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        described = admin.describe_topics(TopicCollection([name]))[name].result(30)
    except KafkaException:
        return None
    topic_id = getattr(described, "topic_id", None)
    if topic_id is None:
        return None
    most = topic_id.get_most_significant_bits() & (2**64 - 1)
    least = topic_id.get_least_significant_bits() & (2**64 - 1)
    return str(uuid.UUID(int=(most << 64) | least)) if most or least else None


def _group_id(per_group: int, index: int | None) -> str:
    """Group ids of one length (the template's placeholder is ``index`` None)."""
    return f"scale-{per_group}-{'TTTTT' if index is None else f'{index:05d}'}"


def _form_group(
    group: str, members: int, topics: dict[str, messages.TopicInfo], now_ms: int
) -> tuple[list[tuple[bytes, bytes | None]], list[tuple[str, int]]]:
    """The records a group's formation writes, and each member's (id, epoch) once stable."""
    state = shard.CoordinatorShard(None)
    written: list[Any] = []

    def apply(outcome: Any) -> Any:
        # As the runtime does once the records are committed: replayed into the shard.
        for record in outcome.records:
            state.replay(record)
        written.extend(outcome.records)
        return outcome

    apply(state.update_topics(topics, now_ms))
    settings = messages.GroupSettings(
        group,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        topics=(DATA_TOPIC,),
    )
    apply(state.configure_group(settings, now_ms))
    ids = [f"{group}-member-{index}" for index in range(members)]
    epochs: dict[str, int] = {}
    owned: dict[str, dict[str, frozenset[int]]] = {}
    for member_id in ids:
        outcome = apply(
            state.heartbeat(
                messages.HeartbeatRequest(
                    group,
                    member_id,
                    0,
                    rebalance_timeout_ms=60_000,
                    subscribed_topic_names=(DATA_TOPIC,),
                    client_host=CLIENT_HOST,
                ),
                now_ms,
            )
        )
        epochs[member_id] = outcome.response.member_epoch
        owned[member_id] = dict(outcome.response.assignment or {})
    # Each member acknowledges what it was given until a whole round changes nothing.
    for _ in range(20):
        changed = False
        for member_id in ids:
            outcome = apply(
                state.heartbeat(
                    messages.HeartbeatRequest(
                        group,
                        member_id,
                        epochs[member_id],
                        owned_partitions=owned[member_id],
                        client_host=CLIENT_HOST,
                    ),
                    now_ms,
                )
            )
            response = outcome.response
            if outcome.records or response.member_epoch != epochs[member_id]:
                changed = True
            if response.assignment is not None and dict(response.assignment) != owned[member_id]:
                owned[member_id] = dict(response.assignment)
                changed = True
            epochs[member_id] = response.member_epoch
        if not changed:
            break
    else:
        raise RuntimeError(f"group {group} did not settle")
    description = state.describe_group(group)
    assert description.state == "Stable", f"{group} is {description.state}"
    return [codec.encode_record(r) for r in written], [(m, epochs[m]) for m in ids]


def form_groups(
    bootstrap: str, state_topic: str, groups: int, per_group: int
) -> list[tuple[str, str, int]]:
    """Forms ``groups`` groups of ``per_group`` members into ``state_topic``; the members as
    (group, member id, epoch)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(state_topic, STATE_PARTITIONS, 1, config={"cleanup.policy": "compact"})]
    )[state_topic].result(30)
    topics = {
        DATA_TOPIC: messages.TopicInfo(
            DATA_TOPIC, DATA_PARTITIONS, _topic_id(bootstrap, DATA_TOPIC)
        )
    }
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
        }
    )
    now_ms = time.time_ns() // 1_000_000
    # Every group forms alike: the shard's records for one group differ from another's only
    # by the group id, which member ids embed too. One group is formed with a placeholder id
    # of the same length, and each group's records are that template with its id put in:
    # forming each group anew would give the same bytes (checked on the first), at a few
    # hundredths of a second per group on this machine, minutes for 10,000.
    placeholder = _group_id(per_group, None)
    template, formed = _form_group(placeholder, per_group, topics, now_ms)
    old = placeholder.encode()
    members: list[tuple[str, str, int]] = []
    for index in range(groups):
        group = _group_id(per_group, index)
        new = group.encode()
        encoded = [
            (key.replace(old, new), None if value is None else value.replace(old, new))
            for key, value in template
        ]
        if index == 0:
            direct, _ = _form_group(group, per_group, topics, now_ms)
            assert direct == encoded, "a group formed from the template differs"
        partition = partitioning.partition_for(group, STATE_PARTITIONS)
        for key, value in encoded:
            while True:
                try:
                    producer.produce(state_topic, value, key, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
        members.extend(
            (group, member_id.replace(placeholder, group), epoch) for member_id, epoch in formed
        )
    assert producer.flush(120) == 0
    return members


# ------------------------------------------------------------------------------ replicas


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuShares:
    """Cores used by each kind of process (replicas, broker, load) over a span."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self.mark()

    def mark(self) -> None:
        self.started = time.monotonic()
        self.before = {kind: [_cpu_seconds(p) for p in pids] for kind, pids in self.pids.items()}

    def cores(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        return {
            kind: round(
                sum(_cpu_seconds(p) - b for p, b in zip(pids, self.before[kind], strict=True))
                / elapsed,
                2,
            )
            for kind, pids in self.pids.items()
        }


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Replicas:
    """Three ``kgo coordinator`` processes, each serving its third of the state topic."""

    def __init__(self, bootstrap: str, state_topic: str, work: Path, kafka: bool = False) -> None:
        self.ports = [embedded.free_port() for _ in SPLIT]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        # With ``kafka``, each replica's coordinator listener too (the Kafka protocol).
        self.kafka_ports = [embedded.free_port() for _ in SPLIT] if kafka else []
        self.logs = [work / f"{state_topic}-{index}.log" for index in range(len(SPLIT))]
        self.processes: list[subprocess.Popen[bytes]] = []
        for index, served in enumerate(SPLIT):
            argv = [
                sys.executable, "-m", "kafka_group_operator", "coordinator",
                "--bootstrap", bootstrap, "--port", str(self.ports[index]),
                "--topic", state_topic, "--state-partitions", str(STATE_PARTITIONS),
                "--partitions", served, "--log-level", "WARNING",
            ]  # fmt: skip
            if kafka:
                argv += ["--kafka-port", str(self.kafka_ports[index])]
            with self.logs[index].open("ab") as log:
                self.processes.append(
                    subprocess.Popen(
                        argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )

    def wait_ready(self, timeout_s: float = 300) -> float:
        """Until every replica has loaded its partitions (it prints ``ready on``); seconds."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            for process, log in zip(self.processes, self.logs, strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"kgo coordinator exited ({process.returncode}); see {log}")
            if all("ready on" in log.read_text(errors="replace") for log in self.logs):
                return time.monotonic() - started
            time.sleep(0.1)
        raise TimeoutError("the replicas did not load in time")

    def rss(self) -> list[int]:
        return [_rss_bytes(process.pid) for process in self.processes]

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# ------------------------------------------------------------------------ heartbeat load


def _heartbeat_load(
    urls: list[str],
    members: list[tuple[str, str, int]],
    connection: Any,
    processes: int,
    kafka_ports: list[int] | None = None,
) -> None:
    """Runs in its own process: steady heartbeats of ``members`` at the rates it is sent.

    As ``bench.rebalance._heartbeat_load``: minimal HTTP/1.1 over asyncio streams, so that
    the load costs the shared cores as little as possible; each request is encoded once.
    With ``kafka_ports``, ConsumerGroupHeartbeat v0 on each replica's coordinator listener
    instead, as a KIP-848 consumer sends its steady heartbeat (every optional field null),
    encoded once with kio; a reply is read only as far as its error code and whether it
    carries an assignment.
    Commands on ``connection``: ``(rate, warmup_s, measure_s)`` for this process's share of
    a rate, answered with its samples; ``None`` to stop.
    """
    requests: list[tuple[int, bytes]] = []
    for group, member_id, epoch in members:
        replica = _replica_of(partitioning.partition_for(group, STATE_PARTITIONS))
        if kafka_ports:
            requests.append((replica, _kafka_heartbeat(group, member_id, epoch)))
            continue
        host = urls[replica].removeprefix("http://")
        body = json.dumps({"memberId": member_id, "memberEpoch": epoch}).encode()
        head = (
            f"POST /v1/groups/{group}/heartbeat HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        requests.append((replica, head + body))

    async def session(command: tuple[float, float, float]) -> dict[str, Any]:
        rate, warmup_s, measure_s = command
        queues: list[asyncio.Queue[tuple[int, float]]] = [asyncio.Queue() for _ in urls]
        latencies: list[float] = []
        waits: list[float] = []
        errors: dict[str, int] = {}
        changed = 0
        in_window = 0  # answered before the measured span ended
        started = time.monotonic()
        measure_from = started + warmup_s
        stop_at = measure_from + measure_s
        backlog = 0

        async def worker(replica: int) -> None:
            nonlocal changed, in_window
            host, port = urls[replica].removeprefix("http://").split(":")
            if kafka_ports:
                port = str(kafka_ports[replica])
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                while True:
                    index, due = await queues[replica].get()
                    try:
                        sent = time.monotonic()
                        writer.write(requests[index][1])
                        if kafka_ports:
                            size = int.from_bytes(await reader.readexactly(4), "big")
                            body = await reader.readexactly(size)
                        else:
                            headers = await reader.readuntil(b"\r\n\r\n")
                            length = int(
                                headers.lower().split(b"content-length:")[1].split(b"\r\n")[0]
                            )
                            body = await reader.readexactly(length)
                        done = time.monotonic()
                    finally:
                        queues[replica].task_done()
                    if due < measure_from or due >= stop_at:
                        continue
                    if kafka_ports:
                        error, assigned = _kafka_outcome(body)
                        if error:
                            errors[error] = errors.get(error, 0) + 1
                            continue
                        changed += assigned
                    elif not headers.startswith(b"HTTP/1.1 200"):
                        name = str(json.loads(body).get("error", headers[:12]))
                        errors[name] = errors.get(name, 0) + 1
                        continue
                    elif b'"assignment"' in body:
                        changed += 1
                    latencies.append(done - sent)
                    waits.append(sent - due)
                    if done < stop_at:
                        in_window += 1
            finally:
                writer.close()

        workers = [
            asyncio.create_task(worker(replica))
            for replica in range(len(urls))
            for _ in range(CONNECTIONS)
        ]
        share = rate / processes
        sent_count = 0
        cursor = 0
        while (now := time.monotonic()) < stop_at:
            due_count = int((now - started) * share)
            while sent_count < due_count:
                due = started + sent_count / share
                queues[requests[cursor][0]].put_nowait((cursor, due))
                cursor = (cursor + 1) % len(requests)
                sent_count += 1
            backlog = max(backlog, sum(q.qsize() for q in queues))
            await asyncio.sleep(0.002)
        # The last heartbeats of the measured span are answered before the figures are taken.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(q.join() for q in queues)), 10)
        for task in workers:
            task.cancel()
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
        # Each worker ends cancelled; anything else ended a connection early.
        failures = sorted(
            {
                repr(o)
                for o in outcomes
                if isinstance(o, BaseException) and not isinstance(o, asyncio.CancelledError)
            }
        )
        return {
            "latencies": latencies,
            "waits": waits,
            "errors": errors,
            "assignment_changes": changed,
            "answered_in_window": in_window,
            "max_backlog": backlog,
            "unanswered": int(measure_s * share) - len(latencies) - sum(errors.values()),
            "connection_failures": failures,
        }

    while True:
        command = connection.recv()
        if command is None:
            return
        connection.send(asyncio.run(session(command)))


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def _kafka_heartbeat(group: str, member_id: str, epoch: int) -> bytes:
    """A steady ConsumerGroupHeartbeat v0 frame: nothing changed, every optional field null."""
    from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest
    from kio.schema.types import GroupId
    from kio.static.primitive import i32, i32Timedelta

    from kafka_group_operator.wire import framing

    return framing.encode_request(
        ConsumerGroupHeartbeatRequest(
            group_id=GroupId(group),
            member_id=member_id,
            member_epoch=i32(epoch),
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=-1)),
            topic_partitions=None,
        ),
        0,
        # No client id: the members were formed with none (the member API records ""), and
        # a member whose client id changed is rewritten (a transaction) at its heartbeat.
        None,
    )


def _kafka_outcome(payload: bytes) -> tuple[str | None, int]:
    """(error name or None, 1 if an assignment came) of a ConsumerGroupHeartbeat v0 reply.

    ResponseHeader v1: correlation id (int32), tagged fields (none: one 0 byte); the body:
    throttle_time_ms (int32), error_code (int16), error_message and member_id (compact
    nullable strings: an unsigned varint length + 1, 0 for null), member_epoch and
    heartbeat_interval_ms (int32 each), then the assignment (a nullable struct: -1 for null).
    """
    from kio.schema.errors import ErrorCode

    (error,) = struct.unpack_from(">h", payload, 9)
    if error:
        return ErrorCode(error).name.upper(), 0
    offset = 11
    for _ in range(2):  # error_message, member_id
        length, shift = 0, 0
        while True:
            byte = payload[offset]
            offset += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        offset += max(length - 1, 0)
    offset += 8
    return None, 0 if payload[offset] == 0xFF else 1


def heartbeat_rates(
    urls: list[str],
    members: list[tuple[str, str, int]],
    rates: tuple[int, ...],
    quick: bool,
    pids: dict[str, list[int]],
    kafka_ports: list[int] | None = None,
    stop_when_not_sustained: bool = True,
) -> tuple[dict[str, float], dict[str, Any], list[dict[str, Any]]]:
    context = multiprocessing.get_context("spawn")
    pipes, processes = [], []
    for index in range(LOAD_PROCESSES):
        parent, child = context.Pipe()
        share = members[index::LOAD_PROCESSES]
        process = context.Process(
            target=_heartbeat_load,
            args=(urls, share, child, LOAD_PROCESSES, kafka_ports),
            daemon=True,
        )
        process.start()
        pipes.append(parent)
        processes.append(process)
    measure_s = 5.0 if quick else MEASURE_S
    found: list[dict[str, Any]] = []
    # The cores each kind of process takes with no heartbeat at all, for comparison.
    shares = CpuShares({**pids, "load": [p.pid for p in processes if p.pid is not None]})
    time.sleep(IDLE_S)
    idle = shares.cores()
    print(f"    idle: cores used {json.dumps(idle)}", flush=True)
    try:
        # The first heartbeats after a load meet each replica's first full garbage
        # collection of the state it loaded (about a second on this machine): reported apart,
        # and not taken as the rate's limit.
        shares.mark()
        for pipe in pipes:
            pipe.send((float(PRIME_RATE), 0.0, PRIME_S))
        parts = [pipe.recv() for pipe in pipes]
        primed = [x for part in parts for x in part["latencies"]]
        after_load = {
            "offered_per_s": PRIME_RATE,
            "seconds": PRIME_S,
            "p50_ms": round(_percentile(primed, 0.50) * 1000, 2),
            "p99_ms": round(_percentile(primed, 0.99) * 1000, 2),
            "max_ms": round(max(primed, default=0.0) * 1000, 1),
            "errors": sum(sum(part["errors"].values()) for part in parts),
            "cores_used": shares.cores(),
        }
        print(f"    after the load: {json.dumps(after_load)}", flush=True)
        for rate in rates:
            load_before = os.getloadavg()
            shares.mark()
            for pipe in pipes:
                pipe.send((float(rate), WARMUP_S, measure_s))
            parts = [pipe.recv() for pipe in pipes]
            latencies = [x for part in parts for x in part["latencies"]]
            waits = [x for part in parts for x in part["waits"]]
            errors: dict[str, int] = {}
            for part in parts:
                for name, count in part["errors"].items():
                    errors[name] = errors.get(name, 0) + count
            achieved = sum(part["answered_in_window"] for part in parts) / measure_s
            wait_p99_ms = _percentile(waits, 0.99) * 1000
            row = {
                "offered_per_s": rate,
                "answered_per_s": round(achieved),
                "interval_s_for_all_members": round(len(members) / rate, 1),
                "p50_ms": round(_percentile(latencies, 0.50) * 1000, 2),
                "p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
                "max_ms": round(max(latencies, default=0.0) * 1000, 1),
                "wait_for_connection_p99_ms": round(wait_p99_ms, 2),
                "errors": errors,
                "assignment_changes": sum(part["assignment_changes"] for part in parts),
                "max_backlog": sum(part["max_backlog"] for part in parts),
                "unanswered": sum(part["unanswered"] for part in parts),
                "connection_failures": sorted(
                    {f for part in parts for f in part["connection_failures"]}
                ),
                # Kept up: answered as fast as offered, without a standing queue of
                # heartbeats waiting for a connection (which would grow without bound).
                "sustained": achieved >= SUSTAINED * rate
                and wait_p99_ms <= MAX_WAIT_P99_MS
                and not errors,
                "load_average_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                "cores_used": shares.cores(),
            }
            # The replicas' CPU per heartbeat answered: what a rate costs, whatever the load.
            row["replicas_cpu_ms_per_heartbeat"] = round(
                row["cores_used"]["replicas"] / max(achieved, 1) * 1000, 3
            )
            print(f"    {json.dumps(row)}", flush=True)
            found.append(row)
            if not row["sustained"] and stop_when_not_sustained:
                break
    finally:
        for pipe in pipes:
            pipe.send(None)
        for process in processes:
            process.join(30)
    return idle, after_load, found


# ---------------------------------------------------------------------------------- fit


def linear_fit(points: list[tuple[float, float, float]]) -> tuple[float, float, float, float]:
    """Least squares of ``y = fixed + a * groups + b * members`` over (groups, members, y):
    (fixed, a, b, r squared), by the normal equations."""
    rows = [(1.0, g, m) for g, m, _ in points]
    ys = [y for _, _, y in points]
    matrix = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    vector = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]
    # Gaussian elimination with partial pivoting on the 3x3 system.
    augmented = [matrix[i] + [vector[i]] for i in range(3)]
    for column in range(3):
        pivot = max(range(column, 3), key=lambda r: abs(augmented[r][column]))
        augmented[column], augmented[pivot] = augmented[pivot], augmented[column]
        for row in range(3):
            if row != column:
                factor = augmented[row][column] / augmented[column][column]
                augmented[row] = [
                    a - factor * b for a, b in zip(augmented[row], augmented[column], strict=True)
                ]
    fixed, per_group, per_member = (augmented[i][3] / augmented[i][i] for i in range(3))
    mean = sum(ys) / len(ys)
    predicted = [fixed + per_group * g + per_member * m for g, m, _ in points]
    residual = sum((y - p) ** 2 for y, p in zip(ys, predicted, strict=True))
    total = sum((y - mean) ** 2 for y in ys)
    return fixed, per_group, per_member, 1 - residual / total if total else 1.0


# --------------------------------------------------------------------------------- main


def run(
    quick: bool,
    sizes: tuple[tuple[int, int], ...],
    kafka: bool = False,
    rates_asked: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kgo-scale-"))
    print(f"coordinator logs in {work}", flush=True)
    memory: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []
    idle: dict[str, float] = {}
    after_load: dict[str, Any] = {}
    with embedded.running_broker() as broker:
        bootstrap = broker.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(DATA_TOPIC, DATA_PARTITIONS, 1)])[DATA_TOPIC].result(30)
        for number, (groups, per_group) in enumerate(sizes):
            state_topic = f"scale-state-{groups}x{per_group}"
            started = time.monotonic()
            members = form_groups(bootstrap, state_topic, groups, per_group)
            formed_s = time.monotonic() - started
            replicas = Replicas(bootstrap, state_topic, work, kafka)
            try:
                load_s = replicas.wait_ready()
                time.sleep(3)  # the replicas' first metadata polls and timers
                rss = replicas.rss()
                row: dict[str, Any] = {
                    "groups": groups,
                    "members": len(members),
                    "members_per_group": per_group,
                    "formed_s": round(formed_s, 1),
                    "replicas_load_s": round(load_s, 1),
                    "rss_bytes": rss,
                    "rss_total_mib": round(sum(rss) / 2**20, 1),
                    "load_average_1m": round(os.getloadavg()[0], 2),
                }
                print(f"  {json.dumps(row)}", flush=True)
                if number == len(sizes) - 1:
                    print("  heartbeats", flush=True)
                    assert broker.process is not None
                    pids = {
                        "replicas": [p.pid for p in replicas.processes],
                        "broker": [broker.process.pid],
                    }
                    idle, after_load, rates = heartbeat_rates(
                        replicas.urls,
                        members,
                        rates_asked or (KAFKA_RATES if kafka else RATES),
                        quick,
                        pids,
                        replicas.kafka_ports or None,
                        stop_when_not_sustained=rates_asked is None,
                    )
                    rss_after = replicas.rss()
                    row["rss_after_heartbeats_bytes"] = rss_after
                    row["rss_after_heartbeats_total_mib"] = round(sum(rss_after) / 2**20, 1)
                memory.append(row)
            finally:
                replicas.stop()
    fit: dict[str, Any] = {"model": "rss_total = fixed + per_group * groups + per_member * members"}
    try:
        fixed, per_group, per_member, r2 = linear_fit(
            [(row["groups"], row["members"], float(sum(row["rss_bytes"]))) for row in memory]
        )
        fit |= {
            "fixed_mib": round(fixed / 2**20, 1),
            "per_group_bytes": round(per_group),
            "per_member_bytes": round(per_member),
            "r_squared": round(r2, 4),
        }
    except ZeroDivisionError:  # fewer sizes than the model's three constants
        fit["note"] = "too few sizes for a fit"
    sustained = [row for row in rates if row["sustained"]]
    best = max(sustained, key=lambda row: row["offered_per_s"]) if sustained else None
    largest = memory[-1]
    return {
        "benchmark": "scale",
        "quick": quick,
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "broker": "tansu (embedded, in-memory storage)",
        "replicas": len(SPLIT),
        "state_partitions": STATE_PARTITIONS,
        "partition_split": list(SPLIT),
        "data_topic_partitions": DATA_PARTITIONS,
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
        "memory": memory,
        "memory_fit": fit,
        "heartbeats": {
            "protocol": "kafka (ConsumerGroupHeartbeat v0)" if kafka else "http (member API)",
            "groups": largest["groups"],
            "members": largest["members"],
            "load_processes": LOAD_PROCESSES,
            "connections_per_replica_and_process": CONNECTIONS,
            "warmup_s": WARMUP_S,
            "measured_s": 5.0 if quick else MEASURE_S,
            "cores_used_without_heartbeats": idle,
            "first_heartbeats_after_the_load": after_load,
            "rates": rates,
            "highest_sustained": best,
        },
        "targets": {
            "heartbeat_p99_ms": {
                "target": f"<= {TARGET_P99_MS}",
                "measured": None if best is None else best["p99_ms"],
                "at_rate_per_s": None if best is None else best["offered_per_s"],
            },
        },
    }


def main(argv: list[str]) -> int:
    load_before = [round(x, 2) for x in os.getloadavg()]
    quick = "--quick" in argv
    sizes = QUICK_SIZES if quick else SIZES
    for arg in argv:
        if arg.startswith("--sizes="):
            # GROUPSxMEMBERS,...: the last one also gets the heartbeats.
            sizes = tuple(
                (int(g), int(m))
                for g, m in (item.split("x") for item in arg.split("=", 1)[1].split(","))
            )
    kafka = "--protocol=kafka" in argv
    rates: tuple[int, ...] | None = None
    for arg in argv:
        if arg.startswith("--rates="):
            # RATE,...: these heartbeat rates only (each is run even if one before is not
            # sustained), e.g. a before/after comparison at one rate.
            rates = tuple(int(rate) for rate in arg.split("=", 1)[1].split(","))
    result = run(quick, sizes, kafka, rates)
    result["load_average_start"] = load_before
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    results = RESULTS_KAFKA if kafka else RESULTS
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("memory_fit", "targets")}, indent=2))
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
