"""``kgo demo``: a live consumer group on an embedded broker, rebalanced in front of you.

Starts the embedded broker, the standalone coordinator (``kgo coordinator``) and three member
processes, plus a producer; prints a table of members, partitions, epochs and lag every
second; scales the group 3 -> 5 -> 3 and restarts a member, showing that the restart moves
no partition. Stops by itself after about a minute and a half; Ctrl-C stops it cleanly too.

The process harness (``LocalGroup``) is shared with the multi-process tests and the
rebalance benchmark. A member process is this module run with ``member``: a ``GroupMember``
that appends what it does to a JSON-lines journal (each processed offset, each assignment
change), flushed line by line so that even ``kill -9`` leaves an exact record behind.
SIGTERM makes a member leave temporarily (epoch -2, as a restarting pod); SIGUSR1 makes it
leave for good (epoch -1, as a pod removed by a scale-down).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kafka_group_operator.commands import describe
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import client

TopicPartition = tuple[str, int]


# ------------------------------------------------------------------------ member process


def member_main(argv: list[str]) -> int:
    """One member process: consume, journal every processed offset, stop on signals."""
    from kafka_group_operator.member import config, group_member

    parser = argparse.ArgumentParser(prog="demo member")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--work-ms", type=float, default=0.0, help="time spent per message")
    args = parser.parse_args(argv)
    member_config = config.MemberConfig.from_env()
    journal = args.journal.open("a", buffering=1)

    def write(event: Mapping[str, Any]) -> None:
        journal.write(json.dumps({**event, "t": time.time()}, separators=(",", ":")) + "\n")

    def on_change(kind: str) -> group_member.PartitionsCallback:
        return lambda partitions: write({"e": kind, "p": sorted(partitions)})

    member = group_member.GroupMember(
        member_config,
        on_assigned=on_change("assigned"),
        on_revoked=on_change("revoked"),
        on_lost=on_change("lost"),
    )
    member.install_signal_handlers()
    signal.signal(signal.SIGUSR1, lambda signum, frame: member.stop(permanent=True))
    write({"e": "start", "member": member.member_id})
    work_s = args.work_ms / 1000
    for message in member:
        if work_s:
            time.sleep(work_s)
        write({"e": "m", "tp": [message.topic(), message.partition()], "o": message.offset()})
    write({"e": "stop"})
    journal.close()
    return 0


@dataclass
class Journal:
    """What a member process wrote: processed offsets and ownership changes, in order."""

    events: list[dict[str, Any]]

    @classmethod
    def read(cls, path: Path) -> Journal:
        events = []
        if path.exists():
            for line in path.read_text().splitlines():
                # A kill -9 can cut the last line short.
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
        return cls(events)

    def processed(self) -> Iterator[tuple[TopicPartition, int, float]]:
        for event in self.events:
            if event["e"] == "m":
                yield (event["tp"][0], event["tp"][1]), event["o"], event["t"]

    def changes(self, kind: str) -> list[tuple[float, list[TopicPartition]]]:
        return [
            (event["t"], [(t, p) for t, p in event["p"]])
            for event in self.events
            if event["e"] == kind
        ]


# --------------------------------------------------------------------------- the harness


def _wait_http(
    url: str, timeout: float, process: subprocess.Popen[bytes], token: str | None = None
) -> None:
    """Until ``url`` answers 200 (the coordinator answers 503 while it loads)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before serving")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=1):
                return
        except OSError:  # HTTPError (503, 404) is an OSError too
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


@dataclass
class Producer:
    """Writes keyed messages round-robin over a topic's partitions at a steady rate."""

    bootstrap: str
    topic: str
    partitions: int
    rate: float = 200.0
    produced: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="demo-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import Producer as KafkaProducer

        # One record per batch: tansu reports a wrong high watermark after larger batches,
        # and lag is computed from it.
        producer = KafkaProducer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 2, "batch.num.messages": 1}
        )

        def delivered(error: Any, message: Any) -> None:
            if error is None:
                partition = message.partition()
                self.produced[partition] = max(
                    self.produced.get(partition, 0), message.offset() + 1
                )

        sequence = 0
        start = time.monotonic()
        while not self._stop.is_set():
            producer.produce(
                self.topic,
                value=f"message {sequence}".encode(),
                partition=sequence % self.partitions,
                on_delivery=delivered,
            )
            sequence += 1
            producer.poll(0)
            ahead = sequence / self.rate - (time.monotonic() - start)
            if ahead > 0:
                self._stop.wait(ahead)
        producer.flush(10)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)


@dataclass
class LocalGroup:
    """A broker, a standalone coordinator and member processes, all on loopback."""

    group: str = "demo.orders"
    topic: str = "orders"
    partitions: int = 12
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 300
    state_partitions: int = 3
    work_ms: float = 0.0
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kgo-demo-")))
    # Journals and logs are removed on stop unless kept (to look at after a failure).
    keep_directory: bool = field(default_factory=lambda: bool(os.environ.get("KGO_KEEP_FILES")))
    broker: embedded.EmbeddedBroker | None = None
    coordinator: subprocess.Popen[bytes] | None = None
    coordinator_url: str = ""
    # The group's bearer token, as the operator would keep it in the group's Secret.
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    members: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # instance -> member id, standing in for the pod UID that survives a container restart
    pod_uids: dict[str, str] = field(default_factory=dict)
    _exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    # -- lifecycle

    def start(self, broker: embedded.EmbeddedBroker | None = None) -> None:
        if broker is None:
            broker = self._exit.enter_context(embedded.running_broker())
        self.broker = broker
        self.create_topic(self.topic, self.partitions)
        self.start_coordinator()

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka import admin as kafka_admin
        from confluent_kafka import cimpl

        assert self.broker is not None
        admin = kafka_admin.AdminClient({"bootstrap.servers": self.broker.bootstrap})
        futures = admin.create_topics([cimpl.NewTopic(name, partitions, 1)])
        for future in futures.values():
            future.result(15)

    def start_coordinator(self) -> None:
        assert self.broker is not None
        port = embedded.free_port()
        tokens = self.directory / "tokens.json"
        tokens.write_text(json.dumps({self.group: self.token}))
        groups = self.directory / "groups.json"
        groups.write_text(
            json.dumps(
                {
                    self.group: {
                        "sessionTimeoutMs": self.session_timeout_ms,
                        "heartbeatIntervalMs": self.heartbeat_interval_ms,
                        "topics": [self.topic],
                    }
                }
            )
        )
        log = (self.directory / "coordinator.log").open("ab")
        self.coordinator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kafka_group_operator",
                "coordinator",
                "--bootstrap",
                self.broker.bootstrap,
                "--port",
                str(port),
                "--topic",
                f"{self.group}.group-state",
                "--partitions",
                str(self.state_partitions),
                "--groups",
                str(groups),
                "--tokens",
                str(tokens),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session: Ctrl-C reaches only the harness, which stops things in order.
            start_new_session=True,
        )
        self.coordinator_url = f"http://127.0.0.1:{port}"
        # Ready once the state is loaded and the group configured: it can be described.
        _wait_http(
            f"{self.coordinator_url}/v1/groups/{self.group}", 60, self.coordinator, self.token
        )

    def member_env_for(self, topic: str) -> dict[str, str]:
        """What the operator injects into a pod of this group, minus the pod's identity."""
        assert self.broker is not None
        return {
            **os.environ,
            "KGO_GROUP_ID": self.group,
            "KGO_GROUP_TOKEN": self.token,
            "KGO_COORDINATOR_URL": self.coordinator_url,
            "KGO_TOPICS": topic,
            "KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap,
            "KGO_AUTO_OFFSET_RESET": "earliest",
        }

    def member_env(self, instance: str) -> dict[str, str]:
        return {
            **self.member_env_for(self.topic),
            "KGO_MEMBER_ID": self.pod_uids[instance],
            "KGO_INSTANCE_ID": instance,
            "KGO_COMMIT_INTERVAL_MS": "500",
            "KGO_SESSION_TIMEOUT_MS": str(self.session_timeout_ms),
        }

    def journal_path(self, instance: str) -> Path:
        return self.directory / f"{instance}.jsonl"

    def start_member(self, instance: str, same_pod: bool = False) -> subprocess.Popen[bytes]:
        """Start a member process: in a new pod, or ``same_pod`` as a container restart."""
        if not same_pod or instance not in self.pod_uids:
            self.pod_uids[instance] = str(uuid.uuid4())
        log = (self.directory / f"{instance}.log").open("ab")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kafka_group_operator.commands.demo",
                "member",
                "--journal",
                str(self.journal_path(instance)),
                "--work-ms",
                str(self.work_ms),
            ],
            env=self.member_env(instance),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.members[instance] = process
        return process

    def stop_member(self, instance: str, permanent: bool = False, timeout: float = 20) -> int:
        """Stop a member cleanly: SIGTERM leaves temporarily, ``permanent`` for good."""
        process = self.members.pop(instance)
        process.send_signal(signal.SIGUSR1 if permanent else signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def kill_member(self, instance: str) -> None:
        """``kill -9``: no commit, no leave."""
        process = self.members.pop(instance)
        process.kill()
        process.wait()

    def stop(self) -> None:
        # All members at once: each commits and leaves on its own.
        stopping = list(self.members.values())
        self.members.clear()
        for process in stopping:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in stopping:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.coordinator is not None:
            self.coordinator.terminate()
            try:
                self.coordinator.wait(15)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()
                self.coordinator.wait()
            self.coordinator = None
        self._exit.close()
        if not self.keep_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- observation

    def client(self) -> client.CoordinatorClient:
        return client.CoordinatorClient(self.coordinator_url, self.group, self.token)

    def describe(self) -> dict[str, Any]:
        coordinator = self.client()
        try:
            return coordinator.describe()
        finally:
            coordinator.close()

    def ownership(self) -> dict[str, frozenset[TopicPartition]]:
        """instance id -> partitions it owns, from the coordinator's description."""
        return {
            member["instanceId"]: frozenset(
                (topic, p) for topic, parts in member["assignment"].items() for p in parts
            )
            for member in self.describe()["members"]
        }

    def settled(self, instances: set[str]) -> bool:
        """Every partition owned, by exactly the given members, none being revoked."""
        try:
            description = self.describe()
        except Exception:
            return False
        members = {m["instanceId"]: m for m in description["members"]}
        if set(members) != instances:
            return False
        owned: list[TopicPartition] = []
        for member in members.values():
            if (
                member["partitionsPendingRevocation"]
                or member["assignment"] != member["targetAssignment"]
            ):
                return False
            owned += [(t, p) for t, parts in member["assignment"].items() for p in parts]
        return sorted(owned) == [(self.topic, p) for p in range(self.partitions)]

    def wait_settled(self, instances: set[str], timeout: float = 30) -> float:
        """Seconds until ``settled(instances)``; raises ``TimeoutError``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.settled(instances):
                return time.monotonic() - start
            time.sleep(0.05)
        raise TimeoutError(f"group not settled on {sorted(instances)} after {timeout}s")


# ------------------------------------------------------------------------------ the demo


def _owners(group: LocalGroup) -> dict[TopicPartition, str]:
    try:
        return {tp: name for name, owned in group.ownership().items() for tp in owned}
    except Exception:
        return {}


def _print_table(
    group: LocalGroup, caption: str, before: Mapping[TopicPartition, str], out: IO[str]
) -> None:
    try:
        table = describe.render(group.describe())
    except Exception as error:
        table = f"(coordinator not answering: {error})"
    now = _owners(group)
    moved = sorted(tp for tp, owner in now.items() if before.get(tp, owner) != owner)
    moves = ", ".join(f"{t}[{p}] {before[(t, p)]}->{now[(t, p)]}" for t, p in moved) or "none"
    out.write("\x1b[2J\x1b[H" if out.isatty() else "\n")
    out.write(f"kgo demo  {time.strftime('%H:%M:%S')}  {caption}\n\n{table}\n")
    out.write(f"\npartitions moved in this step: {len(moved)}  ({moves})\n")
    out.flush()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(out: IO[str] = sys.stdout) -> int:
    # SIGTERM stops the demo as cleanly as Ctrl-C does, leaving no process behind.
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupt)
    steps: list[tuple[str, float, str]] = [
        ("start", 14, "3 members join and share 12 partitions"),
        ("scale 5", 14, "scaled to 5: only the partitions the new members need move"),
        ("scale 3", 14, "scaled back to 3: the leavers' partitions move at once"),
        (
            "restart orders-1",
            18,
            "orders-1 crashed (kill -9) and restarted in its pod: nothing moves",
        ),
        ("end", 6, "steady"),
    ]
    group = LocalGroup(group="demo.orders", work_ms=2.0)
    producer: Producer | None = None
    try:
        out.write("starting the embedded broker and the coordinator...\n")
        out.flush()
        # The broker inherits an ignored SIGINT, so that Ctrl-C (sent by the terminal to the
        # whole process group) leaves it running while the members commit and leave.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            group.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert group.broker is not None
        producer = Producer(group.broker.bootstrap, group.topic, group.partitions, rate=150)
        producer.start()
        for action, duration, caption in steps:
            before = _owners(group)
            if action == "start":
                for index in range(3):
                    group.start_member(f"orders-{index}")
            elif action == "scale 5":
                for index in (3, 4):
                    group.start_member(f"orders-{index}")
            elif action == "scale 3":
                for index in (4, 3):
                    group.stop_member(f"orders-{index}", permanent=True)
            elif action == "restart orders-1":
                owned = group.ownership().get("orders-1", frozenset())
                group.kill_member("orders-1")
                group.start_member("orders-1", same_pod=True)
                caption += f" (owned {len(owned)} partitions before)"
            deadline = time.monotonic() + duration
            while time.monotonic() < deadline:
                _print_table(group, caption, before, out)
                time.sleep(1)
        out.write("\ndemo finished\n")
        return 0
    except KeyboardInterrupt:
        out.write("\ninterrupted, stopping cleanly...\n")
        out.flush()
        return 130
    finally:
        # A second Ctrl-C must not cut the cleanup short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if producer is not None:
            producer.stop()
        group.stop()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run a consumer group on an embedded broker and watch it rebalance"
    )
    parser.set_defaults(func=lambda args: run_demo())


if __name__ == "__main__":
    if sys.argv[1:2] == ["member"]:
        sys.exit(member_main(sys.argv[2:]))
    sys.exit(f"usage: {sys.argv[0]} member --journal FILE")
