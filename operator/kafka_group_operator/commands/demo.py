"""``kgo demo``: a live consumer group on an embedded broker, rebalanced in front of you.

Starts the embedded broker, the standalone coordinator (``kgo coordinator``, with its Kafka
listener) and three member processes, plus a producer; prints a table of members, partitions,
epochs and lag every second. An unmodified confluent-kafka consumer (``KAFKA_CLIENT``, which
imports nothing of this project) joins the group through ``kgo gateway``, takes its share and
commits; the group scales 3 -> 5 -> 3 and a member restarts, showing that the restart moves
no partition. Then it snapshots the group's committed offsets with the Spark snapshot job on
local Spark, lets the members consume on, restores the snapshot (the restore job's dry-run
plan first, then the plan applied through the coordinator) and checks that the offsets are
back exactly at the snapshot and that the members resume from there. At the end the producer
stops and the demo shows that the brokers' own group of the same id carries exactly the
coordinator's committed offsets (the offset mirror, every second here), then the group's
lines of the coordinator's ``/metrics``. Stops by itself after about three and a half minutes;
Ctrl-C stops it cleanly too, Spark job included.

The process harness (``LocalGroup``) is shared with the multi-process tests and the
rebalance benchmark. A member process is this module run with ``member``: a ``GroupMember``
that appends what it does to a JSON-lines journal (each processed offset, each assignment
change, each commit acknowledged), flushed line by line so that even ``kill -9`` leaves an
exact record behind.
SIGTERM makes a member leave temporarily (epoch -2, as a restarting pod); SIGUSR1 makes it
leave for good (epoch -1, as a pod removed by a scale-down).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kafka_group_operator.access import tokens
from kafka_group_operator.commands import common, describe
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import client

TopicPartition = tuple[str, int]

# Seconds the members consume between the snapshot and the restore, so that offsets move on.
CONSUME_ON_S = 10
# Seconds a stopped member process or Spark job gets before it is killed.
STOP_TIMEOUT_S = 10
# /metrics lines the final frame shows on a terminal (the rest are counted).
LIVE_METRICS_LINES = 9

# A plain Kafka consumer, as an application the operator did not write runs it: the README's
# example of "Using your existing Kafka clients", verbatim (a test keeps them equal); its
# environment is what the operator injects into a pod with ``clientProtocol: kafka``, and
# ``start_kafka_client`` puts the demo's topic in place of the example's.
KAFKA_CLIENT = """\
import os
import signal
import threading

from confluent_kafka import Consumer, KafkaException

consumer = Consumer(
    {
        "bootstrap.servers": os.environ["KAFKA_BOOTSTRAP_SERVERS"],
        "group.id": os.environ["KAFKA_GROUP_ID"],
        "group.instance.id": os.environ["KAFKA_GROUP_INSTANCE_ID"],
        "group.protocol": "consumer",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
consumer.subscribe(["invoices"])
try:
    while not stop.is_set():
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        print(message.partition(), message.offset(), message.value())
        try:
            consumer.commit(message, asynchronous=False)  # after processing it
        except KafkaException as error:
            print(error)  # e.g. STALE_MEMBER_EPOCH during a rebalance: the next commit covers it
finally:
    consumer.close()  # leaves the group
"""


# ------------------------------------------------------------------------ member process


def member_main(argv: list[str]) -> int:
    """One member process: consume, journal every processed offset, stop on signals."""
    from confluent_kafka import Message

    from kafka_group_operator.member import config, group_member

    parser = argparse.ArgumentParser(prog="demo member")
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--work-ms", type=float, default=0.0, help="time spent per message")
    parser.add_argument(
        "--batch", type=int, default=0, help="consume member.batches(N) instead of messages"
    )
    args = parser.parse_args(argv)
    member_config = config.MemberConfig.from_env()
    journal = args.journal.open("a", buffering=1)

    def write(event: Mapping[str, Any]) -> None:
        # "t" is wall time, to line up with other processes; "mono" the monotonic clock, to
        # compare with deadlines (CLOCK_MONOTONIC is one clock for every process of a host).
        stamped = {**event, "t": time.time(), "mono": time.monotonic()}
        journal.write(json.dumps(stamped, separators=(",", ":")) + "\n")

    def on_change(kind: str) -> group_member.PartitionsCallback:
        return lambda partitions: write({"e": kind, "p": sorted(partitions)})

    def on_commit(
        offsets: Mapping[TopicPartition, int], failed: Mapping[TopicPartition, str]
    ) -> None:
        # "c": the offsets the coordinator acknowledged (what it must never lose).
        acknowledged = [[t, p, o] for (t, p), o in sorted(offsets.items()) if (t, p) not in failed]
        if acknowledged:
            write({"e": "c", "c": acknowledged})

    member = group_member.GroupMember(
        member_config,
        on_assigned=on_change("assigned"),
        on_revoked=on_change("revoked"),
        on_lost=on_change("lost"),
        on_commit=on_commit,
    )
    member.install_signal_handlers()
    signal.signal(signal.SIGUSR1, lambda signum, frame: member.stop(permanent=True))
    write({"e": "start", "member": member.member_id})
    work_s = args.work_ms / 1000
    # The member hands a message (or a batch) out between "asked" and the journal line's
    # "mono"; every message of a batch is journalled with the instant the batch was asked for.
    batches: Iterator[list[Message]] = (
        member.batches(args.batch) if args.batch else ([message] for message in member)
    )
    while True:
        asked = time.monotonic()
        batch = next(batches, None)
        if batch is None:
            break
        for message in batch:
            if work_s:
                time.sleep(work_s)
            tp = [message.topic(), message.partition()]
            write({"e": "m", "tp": tp, "o": message.offset(), "asked": asked})
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

    def acknowledged(self) -> Iterator[tuple[TopicPartition, int, float]]:
        """Every commit the coordinator acknowledged: (topic-partition, offset, wall time)."""
        for event in self.events:
            if event["e"] == "c":
                for topic, partition, offset in event["c"]:
                    yield (topic, partition), offset, event["t"]

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
    # Member processes consume batches of this many messages (member.batches), or messages
    # one at a time when 0.
    batch: int = 0
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kgo-demo-")))
    # Journals and logs are removed on stop unless kept (to look at after a failure).
    keep_directory: bool = field(default_factory=lambda: bool(os.environ.get("KGO_KEEP_FILES")))
    broker: embedded.Broker | None = None
    coordinator: subprocess.Popen[bytes] | None = None
    coordinator_url: str = ""
    # The coordinator's Kafka listener (``kgo coordinator --kafka-port``), for the gateway.
    kafka_listener: bool = False
    kafka_port: int = 0
    # Seconds between the offset mirror's commits into the brokers' own group of the same id
    # (``mirrorIntervalSeconds``); None turns the mirror off (``mirrorToKafka: false``).
    mirror_interval_s: int | None = None
    # The coordinator's Prometheus metrics (``kgo coordinator --metrics-port``).
    metrics: bool = False
    metrics_port: int = 0
    gateway: subprocess.Popen[bytes] | None = None
    gateway_port: int = 0
    # instance -> an unmodified Kafka client's process (``KAFKA_CLIENT``), through the gateway
    kafka_clients: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # The group's bearer token, as the operator would keep it in the group's Secret.
    token: str = field(default_factory=lambda: tokens.new_token(24))
    members: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # instance -> member id, standing in for the pod UID that survives a container restart
    pod_uids: dict[str, str] = field(default_factory=dict)
    # instance -> restarts in the same pod, as a pod's container restart count
    restarts: dict[str, int] = field(default_factory=dict)
    # The state topic's name, when not the group's own (``state_topic``).
    state_topic_name: str | None = None
    _exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    # -- lifecycle

    @property
    def state_topic(self) -> str:
        """The coordinator's state topic: one per demo group, so runs never share state,
        unless named (``kgo dev`` uses the default one, which the jobs default to)."""
        return self.state_topic_name or f"{self.group}.group-state"

    def start(self, broker: embedded.Broker | None = None) -> None:
        if broker is None:
            broker = self._exit.enter_context(embedded.running_broker())
        self.broker = broker
        self.create_topic(self.topic, self.partitions)
        self.start_coordinator()

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka import admin as kafka_admin
        from confluent_kafka import cimpl

        assert self.broker is not None
        # Warnings and errors only: not librdkafka's note that it dropped an event it no
        # longer needed ("Purging 1 unserved events") on the user's terminal.
        admin = kafka_admin.AdminClient(
            {"bootstrap.servers": self.broker.bootstrap, "log_level": 4}
        )
        futures = admin.create_topics([cimpl.NewTopic(name, partitions, 1)])
        for future in futures.values():
            future.result(15)

    def start_coordinator(self) -> None:
        assert self.broker is not None
        port = embedded.free_port()
        token_file = self.directory / "tokens.json"
        token_file.write_text(json.dumps({self.group: self.token}))
        groups = self.directory / "groups.json"
        groups.write_text(
            json.dumps(
                {
                    self.group: {
                        "sessionTimeoutMs": self.session_timeout_ms,
                        "heartbeatIntervalMs": self.heartbeat_interval_ms,
                        "topics": [self.topic],
                        **(
                            {"mirrorToKafka": False}
                            if self.mirror_interval_s is None
                            else {"mirrorIntervalSeconds": self.mirror_interval_s}
                        ),
                    }
                }
            )
        )
        log = (self.directory / "coordinator.log").open("ab")
        listener: list[str] = []
        if self.kafka_listener:
            self.kafka_port = embedded.free_port()
            listener = ["--kafka-port", str(self.kafka_port)]
        if self.metrics:
            self.metrics_port = embedded.free_port()
            listener += ["--metrics-port", str(self.metrics_port)]
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
                self.state_topic,
                "--state-partitions",
                str(self.state_partitions),
                "--groups",
                str(groups),
                "--tokens",
                str(token_file),
                *listener,
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

    def start_gateway(self, timeout: float = 60) -> None:
        """``kgo gateway`` in front of the broker and the coordinator's Kafka listener, as the
        operator runs it beside a ``clientProtocol: kafka`` pod (the group's token is its
        own, never the client's)."""
        assert self.broker is not None, "start() first"
        assert self.kafka_port, "start with kafka_listener=True"
        self.gateway_port = embedded.free_port()
        log = (self.directory / "gateway.log").open("ab")
        self.gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kafka_group_operator",
                "gateway",
                "--bootstrap",
                self.broker.bootstrap,
                "--coordinator",
                f"127.0.0.1:{self.kafka_port}",
                "--group-id",
                self.group,
                "--port",
                str(self.gateway_port),
            ],
            env={**os.environ, "KGO_GROUP_TOKEN": self.token},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.gateway.poll() is not None:
                raise RuntimeError(f"kgo gateway exited with {self.gateway.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.gateway_port), 0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"kgo gateway not listening after {timeout}s") from None
                time.sleep(0.1)

    def start_kafka_client(self, instance: str) -> subprocess.Popen[bytes]:
        """An unmodified confluent-kafka consumer (``KAFKA_CLIENT``) bootstrapped at the
        gateway, with the environment the operator injects into its pod."""
        assert self.gateway is not None, "start_gateway() first"
        log = (self.directory / f"{instance}.log").open("ab")
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("KGO_", "KAFKA_"))}
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                KAFKA_CLIENT.replace('["invoices"]', json.dumps([self.topic])),
            ],
            env={
                **clean,
                "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{self.gateway_port}",
                "KAFKA_GROUP_ID": self.group,
                "KAFKA_GROUP_INSTANCE_ID": instance,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.kafka_clients[instance] = process
        return process

    def stop_kafka_clients(self) -> None:
        """SIGTERM, as Kubernetes stops a pod: each client closes its consumer (leaves)."""
        stopping = list(self.kafka_clients.values())
        self.kafka_clients.clear()
        for process in stopping:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for process in stopping:
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

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

    def start_member(
        self, instance: str, same_pod: bool = False, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a member process: in a new pod, or ``same_pod`` as a container restart.

        ``env`` overrides the pod's environment (e.g. another ``KGO_COORDINATOR_URL``)."""
        if not same_pod or instance not in self.pod_uids:
            self.pod_uids[instance] = str(uuid.uuid4())
            self.restarts[instance] = 0
        else:
            self.restarts[instance] = self.restarts.get(instance, 0) + 1
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
                "--batch",
                str(self.batch),
            ],
            env={**self.member_env(instance), **(env or {})},
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

    def stop_members(self, instances: list[str], permanent: bool = False) -> None:
        """Stop several members at once, as a scale-down deletes its pods together."""
        stopping = [self.members.pop(instance) for instance in instances]
        for process in stopping:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGUSR1 if permanent else signal.SIGTERM)
        for process in stopping:
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def kill_member(self, instance: str) -> None:
        """``kill -9``: no commit, no leave."""
        process = self.members.pop(instance)
        process.kill()
        process.wait()

    def stop(self) -> None:
        # All members at once: each commits and leaves on its own.
        self.stop_members(list(self.members))
        self.stop_kafka_clients()
        if self.gateway is not None:
            self.gateway.terminate()
            try:
                self.gateway.wait(15)
            except subprocess.TimeoutExpired:
                self.gateway.kill()
                self.gateway.wait()
            self.gateway = None
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


class DemoFailed(RuntimeError):
    """A step of the demo did not show what it promises (its message says what went wrong)."""


def _owners(group: LocalGroup) -> dict[TopicPartition, str]:
    try:
        return {tp: name for name, owned in group.ownership().items() for tp in owned}
    except Exception:
        return {}


def fit(head: str, body: list[str], notes: list[str], columns: int, rows: int) -> list[str]:
    """The lines of one frame on a terminal of ``columns`` x ``rows``: the header (up to two
    lines), the body, then as many of the latest notes as the rows left hold. No line is
    wider than the terminal (it would wrap) and there are fewer lines than rows (the last
    row keeps the cursor), so the frame never scrolls its header away."""
    width = max(columns - 1, 20)

    def cut(line: str) -> str:
        return line if len(line) <= width else line[: width - 1] + "…"

    header = textwrap.wrap(head, width, subsequent_indent="  ")[:2] or [""]
    lines = [cut(line) for line in header] + [""] + [cut(line) for line in body]
    room = rows - 1 - len(lines)
    if room < 0:
        return lines[: rows - 1]
    tail = notes[-room:] if room else []
    while tail and not tail[0]:
        tail = tail[1:]  # the blank that opens a note block
    gap = [""] if body and tail and len(lines) + len(tail) < rows - 1 else []
    return lines + gap + [cut(line) for line in tail]


class Screen:
    """What the demo shows: the group as its coordinator sees it, redrawn every second, and notes.

    On a terminal the view is redrawn in place, fitted to the terminal (``fit``: nothing wraps
    or scrolls, 80 x 24 included) with the latest notes under it, and the demo's last notes
    are shown in a final frame of their own (``finish``). Into a file or a pipe each note is
    written once, when it is made, and a frame only when something other than the clock and
    the lag changed: the step, the members, their processes or who owns what.
    """

    def __init__(
        self, group: LocalGroup, out: IO[str], size: tuple[int, int] | None = None
    ) -> None:
        self.group = group
        self.out = out
        self.live = out.isatty()
        self.notes: list[str] = []
        self._last: object = None
        self._size = size  # columns, rows; default: the terminal's, asked at each frame

    def size(self) -> tuple[int, int]:
        if self._size is not None:
            return self._size
        found = shutil.get_terminal_size((80, 24))
        return found.columns, found.lines

    def note(self, *lines: str) -> None:
        self.notes.extend(lines)
        if not self.live:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()

    def processes(self) -> str:
        """``orders-0 pid 4242, orders-1 pid 4250 (restarted 1x)``: the member processes,
        then the unmodified Kafka clients'."""
        members = [
            f"{instance} pid {process.pid}"
            + (
                f" (restarted {self.group.restarts[instance]}x)"
                if self.group.restarts.get(instance)
                else ""
            )
            for instance, process in sorted(self.group.members.items())
        ]
        clients = [
            f"{instance} pid {process.pid} (confluent-kafka via kgo gateway)"
            for instance, process in sorted(self.group.kafka_clients.items())
        ]
        return ", ".join(members + clients)

    def show(self, caption: str, before: dict[TopicPartition, str], elapsed: str = "") -> None:
        """One frame; ``before`` is who owned what when the step began (moves count from it).

        A partition first seen owned during the step (the first assignment) is added to
        ``before``, so that handing it on later in the step counts as a move.
        """
        try:
            description = self.group.describe()
            table = describe.render(description)
            members = sorted(
                (m["instanceId"] or m["memberId"], m["memberEpoch"], m["state"])
                for m in description["members"]
            )
        except Exception as error:
            table, members = f"(coordinator not answering: {error})", []
        now = _owners(self.group)
        for tp, owner in now.items():
            before.setdefault(tp, owner)
        moved = sorted(tp for tp, owner in now.items() if before[tp] != owner)
        moves = ", ".join(f"{t}[{p}] {before[(t, p)]}->{now[(t, p)]}" for t, p in moved)
        processes = self.processes()
        if not self.live:
            state = (caption, members, sorted(now.items()), processes)
            if state == self._last:
                return
            self._last = state
        suffix = f"  ({elapsed})" if elapsed and self.live else ""
        head = f"kgo demo  {time.strftime('%H:%M:%S')}  {caption}{suffix}"
        if self.live:
            columns, rows = self.size()
            summary, *members_table = table.splitlines() or [""]
            body = [
                # The group's line (state, epochs, assignor, lag) on two lines if need be.
                *textwrap.wrap(summary, max(columns - 1, 20), subsequent_indent="  ")[:2],
                *members_table,
                *textwrap.wrap(
                    f"member processes: {processes or 'none'}",
                    max(columns - 1, 20),
                    subsequent_indent="  ",
                )[:2],
                "",
                f"partitions moved in this step: {len(moved)}  ({moves or 'none'})",
            ]
            self._draw(fit(head, body, self.notes, columns, rows))
            return
        self.out.write(f"\n{head}\n\n{table}\n")
        self.out.write(f"member processes: {processes or 'none'}\n")
        self.out.write(f"\npartitions moved in this step: {len(moved)}  ({moves or 'none'})\n")
        self.out.flush()

    def _draw(self, lines: list[str]) -> None:
        self.out.write("\x1b[2J\x1b[H" + "\n".join(lines) + "\n")
        self.out.flush()

    def finish(self, caption: str, since: int) -> None:
        """On a terminal, a last frame of the notes made from ``since`` on (the demo's last
        sections), where the group's table was; elsewhere they are written already."""
        if self.live:
            columns, rows = self.size()
            head = f"kgo demo  {time.strftime('%H:%M:%S')}  {caption}"
            self._draw(fit(head, [], self.notes[since:], columns, rows))

    def watch(
        self,
        caption: str,
        seconds: float,
        until: Callable[[], bool] | None = None,
        before: Mapping[TopicPartition, str] | None = None,
    ) -> bool:
        """Redraws for ``seconds``, or until ``until()`` holds; returns whether it came to hold.

        ``before``: who owned what when the step began, taken before its action (a member
        that left is no longer in the view, but its partitions moved); default: now.
        """
        start = _owners(self.group) if before is None else dict(before)
        deadline = time.monotonic() + seconds
        while True:
            # Checked before the frame is drawn, so the step's last frame shows the group as
            # it was found settled (drawn first, it could show the state just before).
            done = until is not None and until()
            self.show(caption, start)
            if done:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(1)


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """Terminates a process started in its own session and everything it started (a JVM)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            process.poll()
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
    process.wait()


def run_job(screen: Screen, job: str, arguments: list[str], caption: str) -> dict[str, Any]:
    """``python -m kafka_group_jobs.<job>`` on local Spark, as the operator runs it without a
    spark-operator; the view is redrawn while it runs. Returns the job's result document.

    The job reads up to the demo coordinator's read fence (``--coordinator-url``, with the
    group's token in its environment, never on its command line)."""
    # The operator's own reading of a job's output; imported here, as it loads the
    # Kubernetes client, which member processes (this module too) do not need.
    from kafka_group_operator.jobs import runner

    master = runner.LOCAL_MASTER
    stdout_path = screen.group.directory / f"{job}.out"
    log_path = screen.group.directory / f"{job}.log"
    with stdout_path.open("wb") as stdout, log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"kafka_group_jobs.{job}",
                *arguments,
                "--coordinator-url",
                screen.group.coordinator_url,
                "--master",
                master,
                "--json",
            ],
            env={**os.environ, "KGO_GROUP_TOKEN": screen.group.token},
            stdout=stdout,
            stderr=log,
            # Its own session: Ctrl-C reaches the demo, which then stops the job and its JVM.
            start_new_session=True,
        )
    try:
        started = time.monotonic()
        before = _owners(screen.group)
        while process.poll() is None:
            screen.show(caption, before, elapsed=f"{time.monotonic() - started:.0f} s")
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1)
    finally:
        if process.poll() is None:
            stop_process_group(process)
    outcome = runner.outcome_of(
        process.returncode, stdout_path.read_text(), log_path.read_text(errors="replace")
    )
    if not outcome.succeeded or outcome.result is None:
        raise DemoFailed(f"the {job} job failed: {outcome.reason}")
    return outcome.result


def snapshot_offsets(manifest: Mapping[str, Any]) -> dict[TopicPartition, int]:
    """The offsets a snapshot holds, read straight from its Parquet file (no Spark needed)."""
    from pyarrow import parquet

    directory = Path(urllib.request.url2pathname(urllib.parse.urlsplit(manifest["location"]).path))
    table = parquet.read_table(
        directory / manifest["data"], columns=["topic", "partition", "offset"]
    )
    return {(row["topic"], row["partition"]): row["offset"] for row in table.to_pylist()}


def offsets_table(
    topic: str, rows: list[tuple[str, Mapping[TopicPartition, int | None]]]
) -> list[str]:
    """Offsets of one topic, one row per label and one column per partition."""
    partitions = sorted({p for _, offsets in rows for t, p in offsets if t == topic})
    cells = [[str(offsets.get((topic, p), "-")) for p in partitions] for _, offsets in rows]
    width = max([len(str(p)) for p in partitions] + [len(c) for row in cells for c in row]) + 1
    label_width = max(len(f"{topic} partition"), *(len(label) for label, _ in rows)) + 1
    lines = [
        f"  {topic + ' partition':<{label_width}}" + "".join(f"{p:>{width}}" for p in partitions)
    ]
    for (label, _), row in zip(rows, cells, strict=True):
        lines.append(f"  {label:<{label_width}}" + "".join(f"{cell:>{width}}" for cell in row))
    return lines


def first_processed(
    group: LocalGroup, instances: list[str], since: float
) -> dict[TopicPartition, int]:
    """Per partition, the offset of the first message any of ``instances`` processed after
    ``since`` (a ``time.time()``), from their journals."""
    first: dict[TopicPartition, tuple[float, int]] = {}
    for instance in instances:
        for tp, offset, at in Journal.read(group.journal_path(instance)).processed():
            if at >= since and (tp not in first or at < first[tp][0]):
                first[tp] = (at, offset)
    return {tp: offset for tp, (_, offset) in first.items()}


def _has_no_members(group: LocalGroup) -> bool:
    try:
        return not group.describe()["members"]
    except Exception:
        return False


def snapshot_and_restore(screen: Screen, coordinator: client.CoordinatorClient) -> None:
    """Snapshot the group's offsets, let them move on, restore the snapshot, watch the resume.

    The jobs are the real Spark jobs on local Spark. The restore job plans with ``--dry-run``;
    the plan is then written as the operator writes an online reset's plan: one administrative
    commit through the coordinator, which takes it only while the group is empty or paused.
    The standalone coordinator has no pause, so the members leave for it (scale to 0) and
    come back as new pods.
    """
    # Imported here: member processes run this module and need none of it (nor croniter).
    from kafka_group_operator.manifests import offset_jobs

    group = screen.group
    assert group.broker is not None
    bootstrap = group.broker.bootstrap
    location = (group.directory / "snapshot").as_uri()

    manifest = run_job(
        screen,
        "snapshot",
        offset_jobs.snapshot_arguments(bootstrap, group.state_topic, group.group, location, None),
        "snapshot: the Spark job reads the group's commits from the state topic (local Spark)",
    )
    saved = snapshot_offsets(manifest)
    covered = ", ".join(
        f"partition {p} below offset {end}"
        for p, end in manifest["stateTopic"]["endOffsets"].items()
    )
    screen.note(
        "",
        f"snapshot written to {manifest['location']}",
        f"  {manifest['records']} offsets of partitions "
        f"{common.compact_partitions(manifest['partitions'])}, taken at {manifest['takenAt']}",
        f"  state-topic records covered: {covered}",
        f"  checksum {manifest['checksum']}",
    )

    screen.watch("the members consume on: their offsets move past the snapshot", CONSUME_ON_S)
    ahead = sum(offset - saved.get(tp, 0) for tp, offset in coordinator.fetch().items())
    screen.note(f"the members are now {ahead} messages past the snapshot")

    instances = sorted(group.members)
    group.stop_members(instances, permanent=True)
    group.stop_kafka_clients()
    if not screen.watch(
        "scaled to 0: the coordinator takes an administrative commit only while the group is empty",
        20,
        until=lambda: _has_no_members(group),
    ):
        raise DemoFailed("the group still has members after they all left")

    audit = run_job(
        screen,
        "restore",
        offset_jobs.restore_arguments(
            bootstrap, group.state_topic, group.group, {"to": "snapshot"}, [group.topic], location
        ),
        "restore, dry run: the Spark job plans the reset to the snapshot and writes nothing",
    )
    current = {(p["topic"], p["partition"]): p["oldOffset"] for p in audit["partitions"]}
    plan = offset_jobs.commits_of(audit)
    screen.note(
        "",
        "restore plan (dry run):",
        *offsets_table(group.topic, [("committed now", current), ("restore to", plan)]),
        f"  clamped: {audit['clamped']}, snapshot partitions gone: "
        f"{len(audit['missingPartitions'])}",
    )

    rejected = coordinator.commit("", -1, plan)
    if rejected:
        raise DemoFailed(f"the coordinator rejected the restore: {rejected}")
    restored = coordinator.fetch()
    screen.note(
        "",
        f"plan applied: one administrative commit of {len(plan)} offsets through the coordinator",
        *offsets_table(
            group.topic,
            [("snapshot", saved), ("before restore", current), ("after restore", restored)],
        ),
    )
    if restored != saved:
        raise DemoFailed("the restored offsets differ from the snapshot's")
    screen.note(f"all {len(saved)} offsets are back exactly at the snapshot")

    since = time.time()
    for instance in instances:
        group.start_member(instance)
    resumed: dict[TopicPartition, int] = {}

    def every_partition_resumed() -> bool:
        resumed.update(first_processed(group, instances, since))
        return set(resumed) >= set(restored)

    # A member works through one partition's backlog before the next one's first message
    # (a fetch brings a partition's records in one batch), so the wait grows with what is
    # replayed: the messages past the snapshot, at work_ms each, shared by the members. The
    # Spark jobs take minutes on a busy machine, and the producer runs meanwhile.
    backlog = sum(
        offset - saved[tp] for tp, offset in current.items() if tp in saved and offset is not None
    )
    replay_s = backlog * group.work_ms / 1000 / max(len(instances), 1)
    if not screen.watch(
        f"scaled back to {len(instances)}: the new members start from the restored offsets",
        30 + 2 * replay_s,
        until=every_partition_resumed,
    ):
        raise DemoFailed(
            f"no message processed since the restore on {set(restored) - set(resumed)}"
        )
    screen.note(
        "",
        "the members are back:",
        *offsets_table(group.topic, [("restored to", restored), ("first processed", resumed)]),
    )
    if resumed != restored:
        raise DemoFailed("the members did not resume at the restored offsets")
    screen.note(
        f"they resumed exactly at the snapshot on all {len(resumed)} partitions:",
        f"the {backlog} messages processed after it are processed again, as a restore asks",
    )
    screen.watch("restored and consuming", 5)


def kafka_client_joins(screen: Screen, instance: str, seconds: float) -> None:
    """The gateway and an unmodified Kafka client join the group; the step passes once the
    client owns partitions and its commits of them move on, as the coordinator sees them."""
    group = screen.group
    before = _owners(group)
    group.start_gateway()
    pid = group.start_kafka_client(instance).pid
    start = time.monotonic()
    caption = (
        f"{instance}: a plain confluent-kafka consumer (group.protocol=consumer, pid {pid}) "
        "joins through kgo gateway"
    )
    first: dict[TopicPartition, int] = {}

    def committing() -> bool:
        try:
            owned = group.ownership().get(instance, frozenset())
            with contextlib.closing(group.client()) as coordinator:
                now = {tp: o for tp, o in coordinator.fetch().items() if tp in owned}
        except Exception:
            return False  # the coordinator not answering this once: the next frame asks again
        if not first:
            first.update(now)
            return False
        return any(offset > first.get(tp, offset) for tp, offset in now.items())

    if not screen.watch(caption, 60, until=committing, before=before):
        raise DemoFailed(f"{instance} owns no partition or commits nothing")
    joined = time.monotonic() - start
    owned = sorted(group.ownership().get(instance, frozenset()))
    with contextlib.closing(group.client()) as coordinator:
        committed = {tp: o for tp, o in coordinator.fetch().items() if tp in owned}
    screen.note(
        "",
        f"{instance} (confluent-kafka, importing nothing of kgo; bootstrap = the gateway) owns "
        f"{common.compact_partitions(_by_topic(owned))} and commits them, "
        f"{joined:.1f} s after it started:",
        *offsets_table(group.topic, [("first commit seen", first), ("committed now", committed)]),
    )
    screen.watch(caption, max(seconds - joined, 0), before=before)


def native_offsets(
    bootstrap: str, group_id: str, topic: str, partitions: int
) -> dict[TopicPartition, int]:
    """The committed offsets of the brokers' own group ``group_id``, as any Kafka tool reads
    them: an OffsetFetch by a consumer of the group that never joins it (not the admin
    client's group calls, which can abort the whole process when a connection drops)."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        answered = consumer.committed(
            [KafkaTopicPartition(topic, p) for p in range(partitions)], timeout=10
        )
    finally:
        consumer.close()
    # A negative offset is the brokers' "none committed".
    return {(tp.topic, tp.partition): tp.offset for tp in answered if tp.offset >= 0}


# Counters of the coordinator's own shown beside the group's lines.
_COORDINATOR_SERIES = ("kgo_heartbeats_total", "kgo_offset_commits_total", "kgo_rebalances_total")


def metrics_lines(url: str, group_id: str, partition: int = 0) -> tuple[list[str], int]:
    """The group's lines of a ``/metrics`` page (its per-partition series only for
    ``partition``) and the coordinator's request counters; and how many per-partition lines
    of the group were left out."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    shown: list[str] = []
    left_out = 0
    group_label = f'group="{group_id}"'
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if group_label in line:
            if "partition=" in line and f'partition="{partition}"' not in line:
                left_out += 1
                continue
            shown.append(line)
        elif line.split(" ", 1)[0] in _COORDINATOR_SERIES:
            shown.append(line)
    return shown, left_out


_SERIES = re.compile(r"^(?P<name>[^{\s]+)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def short_series(line: str) -> str:
    """A Prometheus line with only its topic and partition labels kept."""
    match = _SERIES.match(line)
    if match is None or match["labels"] is None:
        return line
    kept = ",".join(
        f'{key}="{value}"'
        for key, value in _LABEL.findall(match["labels"])
        if key in ("topic", "partition")
    )
    name, value = match["name"], match["value"]
    return f"{name}{{{kept}}} {value}" if kept else f"{name} {value}"


def mirror_and_metrics(screen: Screen, producer: Producer) -> None:
    """The end: the producer stops, the members catch up, and the brokers' own group of the
    same id comes to carry exactly the coordinator's offsets (the offset mirror, which makes
    them visible to Kafka's own tools); then the group's lines of the coordinator's
    ``/metrics``. Fails unless the two sets of offsets meet."""
    group = screen.group
    assert group.broker is not None
    producer.stop()
    ends = {(group.topic, p): end for p, end in producer.produced.items()}
    ours: dict[TopicPartition, int] = {}
    theirs: dict[TopicPartition, int] = {}

    def mirrored() -> bool:
        assert group.broker is not None
        try:
            with contextlib.closing(group.client()) as coordinator:
                now = coordinator.fetch()
            native = native_offsets(
                group.broker.bootstrap, group.group, group.topic, group.partitions
            )
        except Exception:
            return False  # not answering this once: the next frame asks again
        ours.clear()
        ours.update(now)
        theirs.clear()
        theirs.update(native)
        # Every message consumed and committed, and the brokers' group at the same place.
        return all(ours.get(tp) == end for tp, end in ends.items()) and theirs == ours

    caption = (
        f"the producer stopped: the members catch up, the mirror commits into the brokers' "
        f"group {group.group} (every {group.mirror_interval_s} s)"
    )
    if not screen.watch(caption, 30, until=mirrored):
        screen.note(
            "",
            *offsets_table(
                group.topic, [("log end", ends), ("coordinator", ours), ("brokers' group", theirs)]
            ),
        )
        raise DemoFailed("the brokers' own group does not carry the coordinator's offsets")
    screen.note(
        "",
        f"the brokers' own group {group.group} (an OffsetFetch, as kafka-consumer-groups.sh, "
        "Burrow or KEDA read it) carries the coordinator's offsets:",
        *offsets_table(
            group.topic, [("coordinator", ours), ("brokers' group", theirs), ("log end", ends)]
        ),
    )
    url = f"http://127.0.0.1:{group.metrics_port}/metrics"
    lines, left_out = metrics_lines(url, group.group)
    if screen.live:
        # The final frame holds this and the table above on 24 rows of 80 columns: the
        # partition's labels only (the group is named above), so that the values show.
        left_out += max(len(lines) - LIVE_METRICS_LINES, 0)
        lines = [short_series(line) for line in lines[:LIVE_METRICS_LINES]]
    screen.note(
        "",
        f"{url} (kafka-lag-exporter's names and labels), the lines of {group.group}:",
        *(f"  {line}" for line in lines),
        f"  ... and {left_out} more lines of the other partitions",
    )


def _by_topic(partitions: list[TopicPartition]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    return grouped


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(out: IO[str] = sys.stdout) -> int:
    # SIGTERM stops the demo as cleanly as Ctrl-C does, leaving no process behind.
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupt)
    steps: list[tuple[str, float, str]] = [
        ("start", 14, "3 members join and share 12 partitions"),
        ("kafka client", 10, ""),
        (
            "scale 5",
            14,
            "scaled to 5 library members: only the partitions the new members need move",
        ),
        ("scale 3", 14, "scaled back to 3 library members: the leavers' partitions move at once"),
        (
            "restart orders-1",
            18,
            "orders-1 crashed (kill -9) and restarted in its pod: nothing moves",
        ),
    ]
    group = LocalGroup(
        group="demo.orders", work_ms=2.0, kafka_listener=True, mirror_interval_s=1, metrics=True
    )
    screen = Screen(group, out)
    producer: Producer | None = None
    try:
        out.write("starting the embedded broker and the coordinator...\n")
        out.flush()
        # The broker, the coordinator, the members and the Spark jobs run in sessions of their
        # own: Ctrl-C reaches only the demo, which stops them in order.
        group.start()
        assert group.broker is not None
        producer = Producer(group.broker.bootstrap, group.topic, group.partitions, rate=150)
        producer.start()
        for action, duration, caption in steps:
            # Taken before the action: a scale-down's leavers are gone from the view after it.
            before = _owners(group)
            if action == "kafka client":
                kafka_client_joins(screen, "orders-kafka", duration)
                continue
            if action == "start":
                for index in range(3):
                    group.start_member(f"orders-{index}")
            elif action == "scale 5":
                for index in (3, 4):
                    group.start_member(f"orders-{index}")
            elif action == "scale 3":
                group.stop_members(["orders-4", "orders-3"], permanent=True)
            elif action == "restart orders-1":
                owned = group.ownership().get("orders-1", frozenset())
                killed = group.members["orders-1"].pid
                group.kill_member("orders-1")
                restarted = group.start_member("orders-1", same_pod=True).pid
                caption += (
                    f" (owned {len(owned)} partitions before; pid {killed} killed,"
                    f" pid {restarted} started, restart #{group.restarts['orders-1']})"
                )
            screen.watch(caption, duration, before=before)
        with contextlib.closing(group.client()) as coordinator:
            snapshot_and_restore(screen, coordinator)
        last = len(screen.notes)
        mirror_and_metrics(screen, producer)
        screen.finish("the brokers' own group and the coordinator's /metrics", last)
        out.write("\ndemo finished\n")
        return 0
    except DemoFailed as failure:
        # What the failed step noted last, on a terminal too.
        screen.finish("failed", 0)
        # Its logs and journals tell what happened: kept.
        group.keep_directory = True
        out.write(
            f"\ndemo failed: {failure}\n(logs, journals and snapshot kept in {group.directory})\n"
        )
        return 1
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
