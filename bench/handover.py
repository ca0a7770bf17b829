"""Handovers: how long groups go unserved when a replica stops, restarts, or dies.

Setup, as ``bench failover``: the embedded broker, the Kubernetes test double in a process of
its own, three ``kgo coordinator --lease-namespace`` processes on one 12-partition state
topic, with the operator's default Lease (8 s: renew deadline 5.3 s, a round every 1.3 s),
and ``N`` groups of ``M`` members heartbeating every ``I`` ms and committing every 2 s
through the member API (``bench.failover``'s load generator: it follows ``NOT_COORDINATOR``
hints, asks another replica when its coordinator is gone, and retries as the member library
does).

Measured from the outside: one prober per state partition asks a group of that partition
for its offsets every 50 ms (following hints, trying the replicas in turn when one is gone,
as a Service would). A partition's *gap* is the longest time between two successful answers
(an answer held while the new holder loads counts until it comes); the probers' largest gap
while nothing happens is the noise floor. Three phases, in one run:

- **rolling restart**, as a StatefulSet's rolling update does it: each replica in turn
  (from the highest) gets SIGTERM, is started again under the same name once it exited, and
  the next one goes once the Leases spread evenly again. Gaps per replica: the largest over
  the partitions, split into the stop (handover to the others) and the return (the others
  hand its share back).
- **graceful stop**: a replica gets SIGTERM and stays down (a scale-down, a drain to a node
  that cannot take it yet); then it comes back.
- **crash (the peer)**: a replica is SIGKILLed and restarted after the failover: nothing is
  handed over, the others wait for its Leases to expire.

Correctness, over the whole run: acknowledged commits lost (a partition whose committed offset
is below the highest ever acknowledged), partitions that moved between members, members
fenced: all must be 0.

Options: ``--groups`` (100), ``--members-per-group`` (2), ``--heartbeat-interval-ms``
(1000), ``--lease-seconds`` (8). Writes ``bench/results/handover.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import failover
from kafka_group_operator.embedded import broker as embedded
from kafka_group_records import partitioning

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "handover.json"
REPLICAS = 3
STATE_PARTITIONS = failover.STATE_PARTITIONS
PROBE_EVERY_S = 0.05
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Options:
    groups: int = 100
    members_per_group: int = 2
    heartbeat_interval_ms: int = 1000
    lease_seconds: int = 8

    @classmethod
    def parse(cls, argv: list[str]) -> Options:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m bench handover")
        parser.add_argument("--groups", type=int, default=cls.groups)
        parser.add_argument("--members-per-group", type=int, default=cls.members_per_group)
        parser.add_argument("--heartbeat-interval-ms", type=int, default=cls.heartbeat_interval_ms)
        parser.add_argument("--lease-seconds", type=int, default=cls.lease_seconds)
        args = parser.parse_args(argv)
        return cls(
            args.groups, args.members_per_group, args.heartbeat_interval_ms, args.lease_seconds
        )


@dataclass
class Prober:
    """Asks one group of a state partition for its offsets, again and again."""

    partition: int
    group: str
    urls: list[str]
    url: str = ""
    # time.monotonic() of every successful answer.
    answered: list[float] = field(default_factory=list)

    async def run(self, session: aiohttp.ClientSession, stopped: asyncio.Event) -> None:
        self.url = self.url or self.urls[self.partition % len(self.urls)]
        turn = 0
        while not stopped.is_set():
            started = time.monotonic()
            try:
                async with session.get(
                    f"{self.url}/v1/groups/{self.group}/offsets",
                    timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                ) as response:
                    reply = await response.json(content_type=None)
                if response.status == 200:
                    self.answered.append(time.monotonic())
                else:
                    coordinator = reply.get("coordinator") if isinstance(reply, dict) else None
                    hint = (coordinator or {}).get("url")
                    if hint and hint != self.url:
                        self.url = hint
                        continue  # at once, as a member follows a hint
            except (TimeoutError, aiohttp.ClientError, ValueError):
                turn += 1
                self.url = self.urls[turn % len(self.urls)]
            await asyncio.sleep(max(0.0, PROBE_EVERY_S - (time.monotonic() - started)))

    def gap(self, start: float, end: float) -> float:
        """The longest time between two answers (or the window's edges) in [start, end]."""
        times = [start, *(t for t in self.answered if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(times))


def _gaps(probers: list[Prober], start: float, end: float) -> dict[int, float]:
    return {p.partition: round(p.gap(start, end), 3) for p in probers}


def _argv(
    index: int,
    bootstrap: str,
    ports: list[int],
    urls: list[str],
    state_topic: str,
    groups_file: Path,
    api_url: str,
    lease_seconds: int,
) -> list[str]:
    return [
        "--bootstrap", bootstrap, "--port", str(ports[index]), "--topic", state_topic,
        "--state-partitions", str(STATE_PARTITIONS), "--groups", str(groups_file),
        "--log-level", "INFO", "--advertised-url", urls[index],
        "--lease-namespace", failover.NAMESPACE, "--lease-replicas", ",".join(urls),
        "--lease-prefix", failover.PREFIX, "--lease-duration", str(lease_seconds),
        "--kube-server", api_url,
    ]  # fmt: skip


async def _spread(api: Any, urls: list[str], alive: list[str], limit: float = 120) -> float:
    """Until every partition is held by a live replica, shares differing by one at most;
    seconds it took."""
    started = time.monotonic()
    while True:
        holders = await failover._holders(api)
        shares = [list(holders.values()).count(url) for url in alive]
        if all(h in alive for h in holders.values()) and max(shares) - min(shares) <= 1:
            return time.monotonic() - started
        if time.monotonic() - started > limit:
            raise TimeoutError(f"the leases did not spread over {alive}: {holders}")
        await asyncio.sleep(0.25)


async def _all_served(probers: list[Prober], within: float = 120) -> None:
    """Until every prober has been answered in the last second."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        now = time.monotonic()
        if all(p.answered and now - p.answered[-1] < 1.0 for p in probers):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("some state partition is not served")


def _stamp(message: str) -> float:
    now = time.time()
    print(
        f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d} {message}",
        flush=True,
    )
    return time.monotonic()


async def _terminate(process: Any) -> None:
    process.send_signal(signal.SIGTERM)
    await asyncio.to_thread(process.wait, 60)


async def _scenario(bootstrap: str, options: Options, api_url: str, api: Any, work: Path) -> Any:
    suffix = uuid.uuid4().hex[:6]
    topic = f"handover-orders-{suffix}"
    failover.embedded_topic(bootstrap, topic)
    state_topic = f"handover-state-{suffix}"
    names = [f"handover-{suffix}-{index}" for index in range(options.groups)]
    groups_file = work / f"groups-{suffix}.json"
    groups_file.write_text(
        json.dumps(
            {
                g: {
                    "sessionTimeoutMs": failover.SESSION_TIMEOUT_MS,
                    "heartbeatIntervalMs": options.heartbeat_interval_ms,
                    "topics": [topic],
                }
                for g in names
            }
        )
    )
    ports = [embedded.free_port() for _ in range(REPLICAS)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    logs = [work / f"coordinator-{suffix}-{i}.log" for i in range(REPLICAS)]

    def argv(index: int) -> list[str]:
        return _argv(
            index, bootstrap, ports, urls, state_topic, groups_file, api_url, options.lease_seconds
        )

    processes = list(
        await asyncio.gather(
            *(failover._start(argv(i), ports[i], logs[i]) for i in range(REPLICAS))
        )
    )

    async def restart(index: int) -> None:
        processes[index] = await failover._start(argv(index), ports[index], logs[index])

    connector = aiohttp.TCPConnector(limit=0)
    results: dict[str, Any] = {}
    try:
        await _spread(api, urls, urls)
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=5), connector=connector
        ) as session:
            members = [
                failover.Member(g, i, urls, urls[(n + i) % REPLICAS])
                for n, g in enumerate(names)
                for i in range(options.members_per_group)
            ]
            load = failover.Load(session, members, topic, options.heartbeat_interval_ms)
            probers = [
                Prober(
                    p,
                    next(g for g in names if partitioning.partition_for(g, STATE_PARTITIONS) == p),
                    urls,
                )
                for p in range(STATE_PARTITIONS)
            ]
            stopped = asyncio.Event()
            tasks = [asyncio.create_task(load.run_member(m)) for m in members]
            tasks += [asyncio.create_task(p.run(session, stopped)) for p in probers]
            tasks.append(asyncio.create_task(failover._progress(load)))
            try:
                await failover._settled(load, seconds=3, limit=180)
                await _all_served(probers)
                before = {(m.group, m.instance): m.assignment for m in members}
                fenced_before = sum(m.fenced for m in members)
                quiet_start = time.monotonic()
                await asyncio.sleep(10)
                results["noise_floor_gap_seconds"] = max(
                    _gaps(probers, quiet_start, time.monotonic()).values()
                )
                load.errors.clear()
                load_averages = [os.getloadavg()[0]]

                # Rolling restart, from the highest ordinal down, as a StatefulSet does.
                rolling = []
                for index in reversed(range(REPLICAS)):
                    start = _stamp(f"SIGTERM replica {index}")
                    await _terminate(processes[index])
                    exited = _stamp(f"replica {index} exited")
                    await restart(index)
                    back = _stamp(f"replica {index} started again")
                    await _spread(api, urls, urls)
                    await _all_served(probers)
                    await asyncio.sleep(2)
                    end = time.monotonic()
                    away = _gaps(probers, start, back)
                    handback = _gaps(probers, back, end)
                    load_averages.append(os.getloadavg()[0])
                    rolling.append(
                        {
                            "replica": index,
                            "stop_seconds": round(exited - start, 3),
                            "down_seconds": round(back - exited, 3),
                            "largest_gap_seconds": max(max(away.values()), max(handback.values())),
                            "largest_gap_at_stop_seconds": max(away.values()),
                            "largest_gap_at_return_seconds": max(handback.values()),
                            "gaps_at_stop_by_partition": away,
                            "gaps_at_return_by_partition": handback,
                        }
                    )
                results["rolling_restart"] = rolling

                # A graceful stop with no return for a while, then the return.
                index = 1
                start = _stamp(f"SIGTERM replica {index} (stays down)")
                await _terminate(processes[index])
                exited = _stamp(f"replica {index} exited")
                await _spread(api, urls, [u for u in urls if u != urls[index]])
                await _all_served(probers)
                await asyncio.sleep(5)
                stop_gaps = _gaps(probers, start, time.monotonic())
                back = _stamp(f"replica {index} started again")
                await restart(index)
                await _spread(api, urls, urls)
                await _all_served(probers)
                await asyncio.sleep(2)
                return_gaps = _gaps(probers, back, time.monotonic())
                load_averages.append(os.getloadavg()[0])
                results["graceful_stop"] = {
                    "stop_seconds": round(exited - start, 3),
                    "largest_gap_seconds": max(stop_gaps.values()),
                    "median_gap_seconds": statistics.median(stop_gaps.values()),
                    "gaps_by_partition": stop_gaps,
                    "largest_gap_at_return_seconds": max(return_gaps.values()),
                    "gaps_at_return_by_partition": return_gaps,
                }

                # The peer: a crash, nothing handed over.
                index = 0
                start = _stamp(f"SIGKILL replica {index}")
                processes[index].send_signal(signal.SIGKILL)
                await asyncio.to_thread(processes[index].wait, 60)
                await _spread(api, urls, [u for u in urls if u != urls[index]])
                await _all_served(probers)
                await asyncio.sleep(2)
                crash_gaps = _gaps(probers, start, time.monotonic())
                load_averages.append(os.getloadavg()[0])
                results["crash_peer"] = {
                    "largest_gap_seconds": max(crash_gaps.values()),
                    "median_gap_seconds": statistics.median(crash_gaps.values()),
                    "gaps_by_partition": crash_gaps,
                }
                await restart(index)
                await _spread(api, urls, urls)
                await _all_served(probers)
                await asyncio.sleep(3)
                after = {(m.group, m.instance): m.assignment for m in members}
                results["errors_seen_by_members"] = dict(load.errors)
                results["load_average_per_phase"] = [round(x, 2) for x in load_averages]
            finally:
                stopped.set()
                load.stopped = True
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for m in members:
                    m.disconnect()
            lost = checked = 0
            by_group: dict[str, list[failover.Member]] = {}
            for m in members:
                by_group.setdefault(m.group, []).append(m)
            for g in names:
                committed = await failover._fetch_committed(load, by_group[g][0])
                for m in by_group[g]:
                    for partition, offset in m.acknowledged.items():
                        checked += 1
                        lost += committed.get(partition, -1) < offset
            results["commits_acknowledged"] = load.acknowledged
            results["acknowledged_commits_lost"] = lost
            results["partitions_moved"] = sum(len(before[key] - after[key]) for key in before)
            results["members_fenced"] = sum(m.fenced for m in members) - fenced_before
    finally:
        for process in processes:
            failover._stop(process)
    rolling = results["rolling_restart"]
    results["summary"] = {
        "largest_gap_per_replica_in_a_rolling_restart_seconds": [
            r["largest_gap_seconds"] for r in rolling
        ],
        "graceful_stop_largest_gap_seconds": results["graceful_stop"]["largest_gap_seconds"],
        "crash_largest_gap_seconds": results["crash_peer"]["largest_gap_seconds"],
        "ratio_graceful_stop_to_crash": round(
            results["graceful_stop"]["largest_gap_seconds"]
            / results["crash_peer"]["largest_gap_seconds"],
            3,
        ),
    }
    return results


async def run(options: Options) -> dict[str, Any]:
    from kafka_group_operator.kube import client as kube_client

    work = Path(tempfile.mkdtemp(prefix="kgo-handover-"))
    print(f"coordinator logs in {work}", flush=True)
    with embedded.running_broker() as broker:
        port = embedded.free_port()
        server = multiprocessing.get_context("spawn").Process(
            target=failover.serve_leases, args=(port,), daemon=True
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
            return dict(await _scenario(broker.bootstrap, options, url, api, work))
        finally:
            await api.close()
            server.terminate()
            server.join(10)


def main(argv: list[str]) -> int:
    options = Options.parse(argv)
    results = {
        "benchmark": "handover",
        "groups": options.groups,
        "members_per_group": options.members_per_group,
        "state_partitions": STATE_PARTITIONS,
        "lease_duration_seconds": options.lease_seconds,
        "heartbeat_interval_ms": options.heartbeat_interval_ms,
        "probe_every_seconds": PROBE_EVERY_S,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        **asyncio.run(run(options)),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["summary"], indent=2))
    ok = (
        results["acknowledged_commits_lost"] == 0
        and results["partitions_moved"] == 0
        and results["members_fenced"] == 0
    )
    with contextlib.suppress(KeyError):
        print(f"noise floor {results['noise_floor_gap_seconds']} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
