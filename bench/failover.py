"""Coordinator failover: three ``kgo coordinator`` replicas on partition Leases, one SIGKILLed.

Setup: the embedded broker; the Kubernetes test double (``tests.support.kube.ApiServer``)
serving the Leases, in a process of its own; three ``kgo coordinator --lease-namespace``
processes with a 3 s Lease (renew deadline 2 s, an election round every 0.5 s) sharing one
state topic of 12 partitions. ``N`` groups of ``M`` members each (a load generator speaking
the member API over HTTP, as the member library does: it follows ``NOT_COORDINATOR`` hints
and, when the coordinator it follows is gone, asks the next replica, as a Service would send
it) heartbeat every ``I`` ms (at once when their coordinator closes their connection, and
retrying after an error, as the member library does: from 0.1 s, doubling, at most 1 s
apart, jittered) and commit their
partitions' offsets after a heartbeat once two seconds have passed since their last commit.

Measured, once the Leases and the assignments are settled: SIGKILL the replica holding the
most partitions, then

- the time from the kill to the last affected group's first successful heartbeat (a group is
  affected when the killed replica coordinated it), in seconds and as a multiple of the Lease
  duration; the same over the groups that met the outage (a heartbeat of theirs failed after
  the kill), whose first success is when a coordinator answered again rather than when their
  next heartbeat was due;
- acknowledged commits lost: after the failover, each group's committed offsets are fetched
  from its new coordinator; a partition whose offset is below the highest one ever
  acknowledged counts (must be 0);
- partitions moved: (member, partition) pairs of the assignment before the kill that the
  member no longer owns after it, plus members fenced or forgotten (must be 0).

Peer in the same run, same groups and load: a single replica (no Leases, every partition)
killed the same way and restarted at once, as Kubernetes restarts a pod in place (a lower
bound: scheduling, image pull and the container's start are not counted).

Options (``--name=value``): ``--groups`` (100), ``--members-per-group`` (2),
``--heartbeat-interval-ms`` (1000; KIP-848's default ``group.consumer.heartbeat.interval.ms``
is 5000), ``--lease-seconds`` (3), ``--retry-period`` (the elector's round, a sixth of the
Lease), ``--results`` (a file instead of ``results/failover.json``), ``--no-peer``. The
coordinators log at INFO: their logs (the directory is printed) say when each partition was
taken and loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import group_member
from kafka_group_records import partitioning

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "failover.json"
LEASE_SECONDS = 3
# The test double answers a Lease request in tens of milliseconds (the real API server in
# about one): 12 partitions keep the three electors within its capacity at the replicas'
# default round, a sixth of the Lease (runs at 0.5 s logged no stall of it).
STATE_PARTITIONS = 12
RETRY_PERIOD_S = LEASE_SECONDS / 6
REPLICAS = 3
TOPIC_PARTITIONS = 4
SESSION_TIMEOUT_MS = 30_000
COMMIT_EVERY_S = 2.0


@dataclass(frozen=True)
class Options:
    """What runs: ``--groups=N``, ``--members-per-group=M``, ``--heartbeat-interval-ms=I``,
    ``--retry-period=S`` (the elector's round, seconds)."""

    groups: int = 100
    members_per_group: int = 2
    heartbeat_interval_ms: int = 1000
    retry_period_s: float = RETRY_PERIOD_S
    lease_seconds: int = LEASE_SECONDS
    results: Path = RESULTS
    # Without the peer (a single replica restarted in place).
    no_peer: bool = False

    @classmethod
    def parse(cls, argv: list[str]) -> Options:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m bench failover")
        parser.add_argument("--groups", type=int, default=cls.groups)
        parser.add_argument("--members-per-group", type=int, default=cls.members_per_group)
        parser.add_argument("--heartbeat-interval-ms", type=int, default=cls.heartbeat_interval_ms)
        parser.add_argument(
            "--lease-seconds", type=int, default=cls.lease_seconds, help="the Lease's duration"
        )
        parser.add_argument(
            "--retry-period", type=float, help="the elector's round (default: a sixth of the Lease)"
        )
        parser.add_argument("--results", type=Path, default=cls.results)
        parser.add_argument("--no-peer", action="store_true")
        args = parser.parse_args(argv)
        return cls(
            args.groups,
            args.members_per_group,
            args.heartbeat_interval_ms,
            args.retry_period if args.retry_period is not None else args.lease_seconds / 6,
            args.lease_seconds,
            args.results,
            args.no_peer,
        )


RETRY_S = 0.1
CALL_TIMEOUT_S = 5.0
NAMESPACE = "kgo-bench"
PREFIX = "kgo-partition"


@dataclass
class Member:
    group: str
    instance: int
    urls: list[str]
    url: str
    member_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    epoch: int = 0
    assignment: frozenset[int] = frozenset()
    # The assignment last acknowledged to the coordinator (sent as ownedPartitions).
    owned: frozenset[int] | None = None
    fenced: int = 0
    # time.monotonic() of the first successful heartbeat after the mark (the kill).
    answered_after_mark: float | None = None
    # Whether a heartbeat failed after the mark: the member met the outage (otherwise its
    # first heartbeat after the kill was its next scheduled one, and it answered).
    failed_after_mark: bool = False
    # Its heartbeats after the mark until the first success: (sent, answered, outcome), the
    # times in seconds after the mark (what the slowest groups met, in the results).
    trace: list[tuple[float, float, str]] = field(default_factory=list)
    acknowledged: dict[int, int] = field(default_factory=dict)
    last_commit: float = 0.0
    # The member's keep-alive connection and the replica it is open to.
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    connected_to: str = ""
    # No early heartbeat for a closed connection before this instant (once per interval).
    early_allowed_at: float = 0.0

    def disconnect(self) -> None:
        if self.connection is not None:
            self.connection[1].close()
        self.connection = None


class Load:
    """Members heartbeating and committing through the member API."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        members: list[Member],
        topic: str,
        heartbeat_interval_ms: int,
    ):
        self.session = session
        self.members = members
        self.topic = topic
        self.interval_s = heartbeat_interval_ms / 1000
        self.mark: float | None = None
        self.stopped = False
        self.errors: dict[str, int] = {}
        self.acknowledged = 0
        self.next_offset = 0
        # Seconds each answered call took, by path, since the last progress line.
        self.latencies: dict[str, list[float]] = {}

    async def _post(self, member: Member, path: str, payload: bytes) -> tuple[int, Any]:
        """One request on the member's own keep-alive connection: (status, decoded body).

        Minimal HTTP/1.1 over asyncio streams, as ``bench.rebalance`` and ``bench.scale``:
        the load shares two cores with three replicas, the broker and the Lease server, and
        a general client (aiohttp's took a whole core for 800 requests/s here) would make the
        load generator's own event loop the bottleneck, its late replies counting as
        timeouts against the coordinators.
        """
        if member.connection is None or member.connected_to != member.url:
            member.disconnect()
            host, port = member.url.removeprefix("http://").split(":")
            member.connection = await asyncio.open_connection(host, int(port))
            member.connected_to = member.url
        reader, writer = member.connection
        host = member.url.removeprefix("http://")
        writer.write(
            f"POST /v1/groups/{member.group}{path} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        headers = await reader.readuntil(b"\r\n\r\n")
        length = int(headers.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return int(headers[9:12]), json.loads(await reader.readexactly(length))

    async def call(self, member: Member, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the member's coordinator, following one hint; raises on failure."""
        payload = json.dumps(body).encode()
        for _ in range(2):
            try:
                started = time.monotonic()
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    status, reply = await self._post(member, path, payload)
                self.latencies.setdefault(path, []).append(time.monotonic() - started)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as error:
                member.disconnect()
                # Gone: ask the next replica, as a Service would route the next connection.
                others = [u for u in member.urls if u != member.url]
                member.url = others[member.instance % len(others)] if others else member.url
                raise RuntimeError("UNREACHABLE") from error
            if status == 200:
                return dict(reply)
            name = reply.get("error", f"HTTP {status}") if isinstance(reply, dict) else ""
            if name == "NOT_COORDINATOR":
                hint = (reply.get("coordinator") or {}).get("url")
                if hint and hint != member.url:
                    member.url = hint
                    continue
            raise RuntimeError(name)
        raise RuntimeError("NOT_COORDINATOR")

    async def heartbeat(self, member: Member) -> None:
        body: dict[str, Any] = {"memberId": member.member_id, "memberEpoch": member.epoch}
        if member.epoch == 0:
            body["subscribedTopicNames"] = [self.topic]
            body["rebalanceTimeoutMs"] = 10_000
        elif member.owned != member.assignment:
            body["ownedPartitions"] = {self.topic: sorted(member.assignment)}
        reply = await self.call(member, "/heartbeat", body)
        member.owned = member.assignment
        member.epoch = int(reply["memberEpoch"])
        if "assignment" in reply:
            member.assignment = frozenset(int(p) for p in reply["assignment"].get(self.topic, []))
        if self.mark is not None and member.answered_after_mark is None:
            member.answered_after_mark = time.monotonic()

    async def commit(self, member: Member) -> None:
        if not member.assignment:
            return
        # One counter for every member: a partition's offsets only grow, whoever commits.
        self.next_offset += 1
        offset = self.next_offset
        sent = member.assignment
        offsets = [{"topic": self.topic, "partition": p, "offset": offset} for p in sorted(sent)]
        reply = await self.call(
            member,
            "/offsets",
            {"memberId": member.member_id, "memberEpoch": member.epoch, "offsets": offsets},
        )
        # The reply lists only the partitions that failed.
        failed = {int(entry["partition"]) for entry in reply["errors"]}
        for partition in sent - failed:
            member.acknowledged[partition] = max(member.acknowledged.get(partition, 0), offset)
        self.acknowledged += len(sent - failed)

    def _traced(self, member: Member, started: float, outcome: str) -> None:
        assert self.mark is not None
        if member.trace and member.trace[-1][2] == "OK":
            return  # traced until the first success only
        member.trace.append(
            (round(started - self.mark, 3), round(time.monotonic() - self.mark, 3), outcome)
        )

    async def run_member(self, member: Member) -> None:
        # Spread the members over the interval.
        await asyncio.sleep((hash(member.member_id) % 1000) / 1000 * self.interval_s)
        backoff = group_member.BACKOFF_INITIAL_S
        while not self.stopped:
            started = time.monotonic()
            try:
                await self.heartbeat(member)
            except RuntimeError as error:
                name = str(error)
                self.errors[name] = self.errors.get(name, 0) + 1
                if self.mark is not None:
                    member.failed_after_mark = True
                    self._traced(member, started, name)
                if name in ("FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID"):
                    member.fenced += 1
                    member.epoch, member.assignment, member.owned = 0, frozenset(), None
                # As the member library retries a coordinator moving or loading (KIP-580:
                # doubling from 0.1 s, at most 1 s apart, 20% jitter either way).
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, group_member.COORDINATOR_MOVING_BACKOFF_MAX_S)
                continue
            if self.mark is not None and member.failed_after_mark:
                self._traced(member, started, "OK")
            backoff = group_member.BACKOFF_INITIAL_S
            if started - member.last_commit >= COMMIT_EVERY_S:
                member.last_commit = started
                with contextlib.suppress(RuntimeError):
                    await self.commit(member)
            await self.idle(member, max(0.0, self.interval_s - (time.monotonic() - started)))

    async def idle(self, member: Member, seconds: float) -> None:
        """Wait ``seconds`` for the next heartbeat, or less when the coordinator closes the
        connection, as the member library's heartbeat thread does: at most once per interval,
        and the connection is then dropped (the next heartbeat opens a new one)."""
        now = time.monotonic()
        if member.connection is None or now < member.early_allowed_at:
            await asyncio.sleep(seconds)
            return
        try:
            async with asyncio.timeout(seconds):
                # b"" once closed; bytes nobody asked for leave the connection unusable too.
                await member.connection[0].read(1)
        except TimeoutError:
            return
        member.disconnect()
        member.early_allowed_at = now + self.interval_s


async def _progress(load: Load, every_s: float = 10.0) -> None:
    """A line every ``every_s``: the calls' latencies and the errors since the last line."""
    errors: dict[str, int] = {}
    while True:
        await asyncio.sleep(every_s)
        parts = []
        for path, seconds in sorted(load.latencies.items()):
            seconds.sort()
            p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
            parts.append(
                f"{path} {len(seconds)} p50 {statistics.median(seconds) * 1000:.0f} ms"
                f" p99 {p99 * 1000:.0f} ms max {seconds[-1] * 1000:.0f} ms"
            )
        load.latencies = {}
        if any(v < errors.get(k, 0) for k, v in load.errors.items()) or set(errors) - set(
            load.errors
        ):
            errors = {}  # the counts were cleared at the kill
        new = {k: v - errors.get(k, 0) for k, v in load.errors.items() if v != errors.get(k, 0)}
        errors = dict(load.errors)
        joined = sum(1 for m in load.members if m.assignment)
        print(
            f"{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}: {'; '.join(parts)};"
            f" errors {new}; members holding partitions {joined}",
            flush=True,
        )


def _groups(count: int, suffix: str) -> list[str]:
    return [f"failover-{suffix}-{index}" for index in range(count)]


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "kafka_group_operator", "coordinator", *argv],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _start(argv: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """``kgo coordinator <argv>``, once it listens on ``port``."""
    process = _spawn(argv, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kgo coordinator exited ({process.returncode}); see {log}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return process
        except OSError:
            await asyncio.sleep(0.2)
    raise RuntimeError(f"kgo coordinator does not listen on {port}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _holders(api: Any) -> dict[int, str | None]:
    from kafka_group_operator.kube import leases

    found = await asyncio.gather(
        *(
            leases.read(api, NAMESPACE, leases.lease_name(PREFIX, p))
            for p in range(STATE_PARTITIONS)
        )
    )
    return {p: (lease.holder if lease is not None else None) for p, lease in enumerate(found)}


async def _settled(load: Load, seconds: float, limit: float) -> None:
    """Until every group's partitions are all assigned and nothing changed for ``seconds``."""
    deadline = time.monotonic() + limit
    last = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        now = {(m.group, m.instance): (m.assignment, m.epoch) for m in load.members}
        assigned: dict[str, int] = {}
        for m in load.members:
            assigned[m.group] = assigned.get(m.group, 0) + len(m.assignment)
        groups_whole = all(count == TOPIC_PARTITIONS for count in assigned.values())
        if now != last or not groups_whole:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
        await asyncio.sleep(0.25)
    sample = [(m.group, m.epoch, sorted(m.assignment)) for m in load.members[:6]]
    raise TimeoutError(f"the assignments did not settle: {sample}, errors {load.errors}")


async def _served_again(
    session: aiohttp.ClientSession, urls: list[str], group: str, since: float
) -> float:
    """Seconds from ``since`` until ``group``'s coordinator answers a fetch of its offsets:
    when the group is served again, whatever its members' heartbeat schedule. Asked every
    50 ms, following hints, trying the replicas in turn as a Service would."""
    url = urls[0]
    turn = 0
    while True:
        try:
            async with session.get(
                f"{url}/v1/groups/{group}/offsets", timeout=aiohttp.ClientTimeout(total=3)
            ) as response:
                reply = await response.json(content_type=None)
            if response.status == 200:
                return time.monotonic() - since
            hint = (reply.get("coordinator") or {}).get("url") if isinstance(reply, dict) else None
            if hint and hint != url:
                url = hint
                continue
        except (TimeoutError, aiohttp.ClientError, ValueError):
            turn += 1
            url = urls[turn % len(urls)]
        await asyncio.sleep(0.05)


async def _fetch_committed(load: Load, member: Member) -> dict[int, int]:
    for _ in range(50):
        url = f"{member.url}/v1/groups/{member.group}/offsets"
        try:
            async with load.session.get(url) as response:
                reply = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError):
            member.url = member.urls[0]
            await asyncio.sleep(RETRY_S)
            continue
        if response.status == 200:
            return {int(e["partition"]): int(e["offset"]) for e in reply["offsets"]}
        hint = (reply.get("coordinator") or {}).get("url") if isinstance(reply, dict) else None
        if hint:
            member.url = hint
        await asyncio.sleep(RETRY_S)
    raise RuntimeError(f"cannot fetch the offsets of {member.group}")


async def _scenario(
    bootstrap: str,
    options: Options,
    leased: bool,
    api_url: str | None,
    api: Any,
    work: Path,
) -> dict[str, Any]:
    groups = options.groups
    suffix = uuid.uuid4().hex[:6]
    topic = f"failover-orders-{suffix}"
    embedded_topic(bootstrap, topic)
    state_topic = f"failover-state-{suffix}"
    names = _groups(groups, suffix)
    settings = {
        g: {
            "sessionTimeoutMs": SESSION_TIMEOUT_MS,
            "heartbeatIntervalMs": options.heartbeat_interval_ms,
            "topics": [topic],
        }
        for g in names
    }
    groups_file = work / f"groups-{suffix}.json"
    groups_file.write_text(json.dumps(settings))
    count = REPLICAS if leased else 1
    ports = [embedded.free_port() for _ in range(count)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]

    def argv(index: int) -> list[str]:
        common = [
            "--bootstrap", bootstrap, "--port", str(ports[index]), "--topic", state_topic,
            "--state-partitions", str(STATE_PARTITIONS), "--groups", str(groups_file),
            "--log-level", "INFO",
        ]  # fmt: skip
        if not leased:
            return common
        return [
            *common,
            "--advertised-url", urls[index], "--lease-namespace", NAMESPACE,
            "--lease-replicas", ",".join(urls), "--lease-prefix", PREFIX,
            "--lease-duration", str(options.lease_seconds), "--kube-server", str(api_url),
            "--lease-retry-period", str(options.retry_period_s),
        ]  # fmt: skip

    logs = [work / f"coordinator-{suffix}-{i}.log" for i in range(count)]
    processes = list(
        await asyncio.gather(*(_start(argv(i), ports[i], logs[i]) for i in range(count)))
    )
    timeout = aiohttp.ClientTimeout(total=5)
    connector = aiohttp.TCPConnector(limit=0)
    try:
        if leased:
            # The Leases spread evenly: 8 partitions each, for two retry periods running.
            deadline = time.monotonic() + 60
            while True:
                holders = await _holders(api)
                shares = [list(holders.values()).count(url) for url in urls]
                if max(shares) - min(shares) <= 1 and None not in holders.values():
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the leases did not spread: {shares}")
                await asyncio.sleep(0.5)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            members = [
                Member(g, i, urls, urls[(n + i) % count])
                for n, g in enumerate(names)
                for i in range(options.members_per_group)
            ]
            by_group: dict[str, list[Member]] = {}
            for m in members:
                by_group.setdefault(m.group, []).append(m)
            load = Load(session, members, topic, options.heartbeat_interval_ms)
            tasks = [asyncio.create_task(load.run_member(m)) for m in members]
            tasks.append(asyncio.create_task(_progress(load)))
            try:
                await _settled(load, seconds=3, limit=180)
                before = {(m.group, m.instance): m.assignment for m in members}
                fenced_before = sum(m.fenced for m in members)
                await asyncio.sleep(3)  # steady commits
                if leased:
                    holders = await _holders(api)
                    held = {url: list(holders.values()).count(url) for url in urls}
                    victim = max(range(count), key=lambda i: held[urls[i]])
                    victim_partitions = {p for p, h in holders.items() if h == urls[victim]}
                else:
                    victim, victim_partitions = 0, set(range(STATE_PARTITIONS))
                affected = {
                    g for g in names
                    if partitioning.partition_for(g, STATE_PARTITIONS) in victim_partitions
                }  # fmt: skip
                load.errors.clear()
                load_average = os.getloadavg()
                killed_at = time.monotonic()
                load.mark = killed_at
                processes[victim].send_signal(signal.SIGKILL)
                # The kill itself is in no coordinator's log: this line times their lines.
                now = time.time()
                print(
                    f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"
                    f" killed replica {victim} holding {sorted(victim_partitions)}",
                    flush=True,
                )
                # One group per partition lost: when is it served again?
                probes = [
                    asyncio.create_task(
                        _served_again(
                            session,
                            urls,
                            next(
                                g
                                for g in names
                                if partitioning.partition_for(g, STATE_PARTITIONS) == partition
                            ),
                            killed_at,
                        )
                    )
                    for partition in sorted(victim_partitions)
                ]
                processes[victim].wait()
                if not leased:
                    processes[victim] = await _start(argv(victim), ports[victim], logs[victim])
                # Until every affected group has answered again, then a while longer.
                deadline = killed_at + 120
                while time.monotonic() < deadline:
                    if all(any(m.answered_after_mark for m in by_group[g]) for g in affected):
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(5)
                served_again = await asyncio.wait_for(asyncio.gather(*probes), 60)
                after = {(m.group, m.instance): m.assignment for m in members}
                errors_during = dict(load.errors)
            finally:
                load.stopped = True
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for m in members:
                    m.disconnect()
            group_first = [
                min(m.answered_after_mark or float("inf") for m in by_group[g]) - killed_at
                for g in affected
            ]
            # The groups that met the outage: a member's heartbeat failed after the kill.
            # Their first success is when the coordinator answered again, not the members'
            # schedule (which decides it for a group whose next heartbeat came late enough).
            met_outage = [
                min(m.answered_after_mark or float("inf") for m in by_group[g]) - killed_at
                for g in affected
                if any(m.failed_after_mark for m in by_group[g])
            ]
            member_first = [
                (m.answered_after_mark or float("inf")) - killed_at
                for m in members
                if m.group in affected
            ]
            slowest = sorted(
                affected,
                key=lambda g: min(m.answered_after_mark or float("inf") for m in by_group[g]),
            )[-3:]
            moved = sum(len(before[key] - after[key]) for key in before)
            fenced = sum(m.fenced for m in members) - fenced_before
            lost = 0
            checked = 0
            for g in names:
                committed = await _fetch_committed(load, by_group[g][0])
                for m in by_group[g]:
                    for partition, offset in m.acknowledged.items():
                        checked += 1
                        if committed.get(partition, -1) < offset:
                            lost += 1
            return {
                "replicas": count,
                "leases": leased,
                "killed_partitions": len(victim_partitions),
                "affected_groups": len(affected),
                "recovery_seconds_last_group": round(max(group_first), 3),
                "recovery_seconds_median_group": round(statistics.median(group_first), 3),
                "recovery_seconds_last_member": round(max(member_first), 3),
                "recovery_in_lease_durations": round(max(group_first) / options.lease_seconds, 2),
                # When the coordinator was back, whatever the members' schedule: the kill to
                # the last lost partition's first answer to a fetch of one of its groups.
                "served_again_seconds_last_partition": round(max(served_again), 3),
                "served_again_seconds_by_partition": [round(x, 3) for x in served_again],
                "groups_that_met_the_outage": len(met_outage),
                "recovery_seconds_last_group_that_met_the_outage": (
                    round(max(met_outage), 3) if met_outage else None
                ),
                "recovery_seconds_median_group_that_met_the_outage": (
                    round(statistics.median(met_outage), 3) if met_outage else None
                ),
                "load_average_at_kill": [round(x, 2) for x in load_average],
                "commits_acknowledged": load.acknowledged,
                "acknowledged_offsets_checked": checked,
                "acknowledged_commits_lost": lost,
                "partitions_moved": moved,
                "members_fenced": fenced,
                "errors_during_failover": errors_during,
                # The three affected groups that answered last: each member's heartbeats
                # from the kill to its first success, as (sent, answered, outcome) in seconds.
                "slowest_groups_heartbeats": {g: [m.trace for m in by_group[g]] for g in slowest},
            }
    finally:
        for process in processes:
            _stop(process)


def embedded_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not in __all__
        AdminClient,
        NewTopic,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])
    for future in futures.values():
        future.result(30)


def serve_leases(port: int) -> None:
    """In a process of its own: the Kubernetes test double (``tests.support.kube``) on ``port``."""
    sys.path.insert(0, str(ROOT))
    import datetime
    import gc

    from kmock._internal import apps
    from tests.support import kube as kube_support

    collecting: list[float] = []

    def timed_collection(phase: str, info: dict[str, Any]) -> None:
        # Says when the test double itself stalls, to tell its pauses from the replicas'.
        if phase == "start":
            collecting[:] = [time.monotonic()]
        elif collecting and time.monotonic() - collecting[0] > 0.2:
            _stamp(f"test double: generation {info['generation']} garbage collection took "
                   f"{time.monotonic() - collecting[0]:.2f} s")  # fmt: skip

    def _stamp(message: str) -> None:
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
        print(f"{now} {message}", file=sys.stderr, flush=True)

    gc.callbacks.append(timed_collection)
    # The test double stands in for the API server, which has machines of its own. On this
    # shared machine, at load averages of 10 and more, its event loop stalled 0.5 to 1.4 s
    # every few seconds with no collection behind it (CPU it did not get), and every replica
    # missed its renew deadline at once after the longest stalls. So it gets the CPU first;
    # without the privilege to raise its priority it runs as before.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)

    async def serve() -> None:
        async with kube_support.ApiServer() as server, apps.Server(server, port=port):
            frozen = time.monotonic()
            while True:
                if time.monotonic() - frozen > 5:
                    # The test double's history of Lease changes only grows: frozen, it is
                    # not walked by every full collection again (those took up to a second
                    # late in a 1,000-group run, stalling every replica's renewals at once).
                    gc.freeze()
                    frozen = time.monotonic()
                # kmock keeps every request for tests to assert on, and matches each new one
                # against all of them: emptied often, it stays as fast as at its start.
                server._requests.clear()
                before = time.monotonic()
                await asyncio.sleep(0.05)
                if time.monotonic() - before > 0.5:
                    _stamp(f"test double: its event loop stalled {time.monotonic() - before:.2f} s")

    asyncio.run(serve())


async def run(options: Options) -> dict[str, Any]:
    from kafka_group_operator.kube import client as kube_client

    results: dict[str, Any] = {}
    # The coordinators' logs stay there, for a look after a surprising run.
    work = Path(tempfile.mkdtemp(prefix="kgo-failover-"))
    print(f"coordinator logs in {work}", flush=True)
    with embedded.running_broker() as broker:
        port = embedded.free_port()
        server = multiprocessing.get_context("spawn").Process(
            target=serve_leases, args=(port,), daemon=True
        )
        server.start()
        url = f"http://127.0.0.1:{port}"
        api = kube_client.KubeClient(kube_client.Credentials(server=url))
        try:
            while True:
                try:
                    _, connection = await asyncio.open_connection("127.0.0.1", port)
                    connection.close()
                    break
                except OSError:
                    await asyncio.sleep(0.2)
            results["three_replicas_on_leases"] = await _scenario(
                broker.bootstrap, options, True, url, api, work
            )
        finally:
            await api.close()
            server.terminate()
            server.join(10)
        if options.no_peer:
            return results
        results["peer_single_replica_restarted"] = await _scenario(
            broker.bootstrap, options, False, None, None, work
        )
    leased = results["three_replicas_on_leases"]["recovery_seconds_last_group"]
    single = results["peer_single_replica_restarted"]["recovery_seconds_last_group"]
    results["ratio_leases_to_single_restart"] = round(leased / single, 2) if single else None
    return results


def main(argv: list[str]) -> int:
    options = Options.parse(argv)
    results = {
        "benchmark": "failover",
        "groups": options.groups,
        "members_per_group": options.members_per_group,
        "state_partitions": STATE_PARTITIONS,
        "lease_duration_seconds": options.lease_seconds,
        "renew_deadline_seconds": round(options.lease_seconds * 2 / 3, 3),
        "retry_period_seconds": options.retry_period_s,
        "heartbeat_interval_ms": options.heartbeat_interval_ms,
        "commit_every_seconds": max(COMMIT_EVERY_S, options.heartbeat_interval_ms / 1000),
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        **asyncio.run(run(options)),
    }
    options.results.parent.mkdir(exist_ok=True)
    options.results.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    leased = results["three_replicas_on_leases"]
    ok = leased["acknowledged_commits_lost"] == 0 and leased["partitions_moved"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
