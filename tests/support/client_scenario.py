"""The consumer scenario every client of the matrix runs through the gateway, whatever its
language: one member per process, driven over stdin, reporting its rebalance callbacks,
records and commits on stdout, one JSON event a line (``tests/clients/java/JavaMember.java``,
``tests/goclients/member.go``).

1. a member joins and consumes exactly from the committed offsets (some partitions have
   commits, one has none: the earliest offset);
2. a second member joins: partitions move, each revoked by its holder before the newcomer is
   given it; the synchronous and asynchronous commits (in turn, after each batch, and on
   revocation) leave every consumed record committed; new records reach their owner once;
3. ``seek`` replays a partition; ``pause``/``resume`` hold and release one;
4. static members: the first is killed (SIGKILL; a KIP-848 one closes, leaving with epoch
   -2) and restarted with the same ``group.instance.id``: it gets its partitions back and
   nothing moves;
5. the second is frozen (SIGSTOP) past its session timeout: its partitions move; thawed, it
   is told it lost them and joins again;
6. it is killed (SIGKILL): its partitions move once its session timeout has passed;
7. a dynamic member's close leaves the group: its partitions move at once.

``run`` returns the timings (first assignment, rebalances, moves) for the matrix's report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import Any

from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import messages
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from tests.support import groups, topics

PARTITIONS = 3
PER_PARTITION = 5
SESSION_MS = 6_000
WAIT_S = 60
ALL = set(range(PARTITIONS))


@dataclass(frozen=True)
class Config:
    name: str
    protocol: str  # classic or consumer (KIP-848)
    assignor: str  # the client's: its classic assignor, or the KIP-848 server assignor
    assignment: str  # spec.assignment of the group's resource: Client or Server
    static: bool


class Member:
    """One consumer process: its events as they come, commands on its stdin. With
    ``log_path`` its stderr goes there (to debug a failure), else nowhere."""

    def __init__(self, argv: list[str], log_path: str | None = None) -> None:
        stderr: Any = subprocess.DEVNULL
        if log_path:
            stderr = open(log_path, "wb")  # noqa: SIM115 - the process owns it
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
        )
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(event)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command.encode() + b"\n")
        self.process.stdin.flush()

    def owned(self) -> set[int]:
        held: set[int] = set()
        for event in self.snapshot():
            if event["event"] == "assigned":
                held |= set(event["partitions"])
            elif event["event"] in ("revoked", "lost"):
                held -= set(event["partitions"])
        return held

    def records(self, since: int = 0) -> list[tuple[int, int, str]]:
        return [
            (p, o, v)
            for event in self.snapshot()[since:]
            if event["event"] == "records"
            for p, o, v in event["records"]
        ]

    def kinds(self, since: int = 0) -> list[str]:
        return [event["event"] for event in self.snapshot()[since:]]

    def mark(self) -> int:
        return len(self.snapshot())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


async def until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = WAIT_S,
    detail: Callable[[], object] | None = None,
) -> float:
    """Wait for ``condition`` off the event loop's way; the seconds it took. On a time-out,
    the failure carries ``detail()`` (what the members said meanwhile, say)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            seen = "" if detail is None else f": {detail()}"
            raise AssertionError(f"timed out waiting for {what}{seen}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def split(*members: Member) -> bool:
    """Every partition owned by exactly one of ``members``, each owning some."""
    held = [m.owned() for m in members]
    return all(held) and sum(map(len, held)) == PARTITIONS and set().union(*held) == ALL


def first_assigned_at(member: Member, partition: int, since: int = 0) -> float | None:
    for event in member.snapshot()[since:]:
        if event["event"] == "assigned" and partition in event["partitions"]:
            return float(event["t"])
    return None


def last_released_at(member: Member, partition: int) -> float | None:
    released = None
    for event in member.snapshot():
        if event["event"] in ("revoked", "lost") and partition in event["partitions"]:
            released = float(event["t"])
    return released


async def committed(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, topic: str
) -> dict[int, int]:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return {p: c.offset for (t, p), c in fetched.offsets.items() if t == topic}


def produce(bootstrap: str, topic: str, partition: int, values: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1})
    for value in values:
        producer.produce(topic, value.encode(), partition=partition)
    assert producer.flush(30) == 0


@dataclass(frozen=True)
class Stack:
    """What the matrix's clients join through: a coordinator on a state topic of its own,
    its Kafka listener, and a gateway in front of the listener and the brokers."""

    bootstrap: str
    runtime: coordinator_runtime.CoordinatorRuntime
    gateway: protocol_gateway.Gateway


@contextlib.asynccontextmanager
async def stack(bootstrap: str, name: str) -> AsyncIterator[Stack]:
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=f"{name}-state-{uuid.uuid4().hex[:8]}",
        partitions=2,
        metadata_interval_ms=500,
        coordinator=coordinator_config.CoordinatorConfig(initial_rebalance_delay_ms=0),
    )
    async with groups.running(config) as runtime:
        listener = protocol_listener.Listener(
            runtime, None, protocol_listener.ListenerConfig(port=0)
        )
        await listener.start()
        gateway = protocol_gateway.Gateway(
            protocol_gateway.GatewayConfig(
                bootstrap_servers=kafka_connection.parse_servers(bootstrap),
                coordinator=("127.0.0.1", listener.port),
                port=0,
            )
        )
        await gateway.start()
        try:
            yield Stack(bootstrap, runtime, gateway)
        finally:
            await gateway.stop()
            await listener.stop()


async def run_case(
    config: Config,
    on: Stack,
    client: str,
    start: Callable[[str, str, str], Member],
    allowed_errors: Collection[str],
    report_path: str | None,
) -> None:
    """The scenario for one configuration of ``client``, on a topic and in a group of its
    own; ``start(group, topic, instance)`` starts a member. Its timings go to
    ``report_path`` (when one is given), whether it passed or not."""
    topic = topics.create_topic(on.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION)
    await topics.topic_id(on.runtime, topic)
    group = f"{client}-{config.name}-{uuid.uuid4().hex[:6]}"
    await configure(on.runtime, config, group, topic)
    report: dict[str, Any] = {"config": config.name}
    try:
        await run(
            config,
            lambda instance: start(group, topic, instance),
            on.bootstrap,
            on.runtime,
            group,
            topic,
            allowed_errors,
            report,
        )
    finally:
        await asyncio.to_thread(append_report, report_path, report)


def append_report(path: str | None, report: dict[str, Any]) -> None:
    """One JSON line of ``report`` appended to ``path`` (nothing without one)."""
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(report) + "\n")


async def configure(
    runtime: coordinator_runtime.CoordinatorRuntime, config: Config, group: str, topic: str
) -> None:
    """The group's resource as the scenario wants it, and commits made before anyone joins
    (an empty group takes an administrative commit): 2 on partition 0, 3 on partition 2."""
    await runtime.configure_group(
        messages.GroupSettings(
            group,
            assignor="range" if config.protocol == "consumer" else "cooperative-sticky",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=300,
            topics=(topic,),
            client_assignment=config.assignment == "Client",
        )
    )
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group,
            "",
            messages.LEAVE_EPOCH,
            {(topic, 0): messages.CommitOffset(2), (topic, 2): messages.CommitOffset(3)},
        )
    )


async def run(
    config: Config,
    start: Callable[[str], Member],
    bootstrap: str,
    runtime: coordinator_runtime.CoordinatorRuntime,
    group: str,
    topic: str,
    allowed_errors: Collection[str],
    report: dict[str, Any],
) -> None:
    """The scenario for a group ``configure`` set up, on a topic of ``PARTITIONS`` holding
    ``PER_PARTITION`` records each; ``start(instance)`` starts a member (its
    ``group.instance.id`` if ``config.static``). Timings go into ``report``. Error events of
    the types ``allowed_errors`` (a frozen member's failed commits once it is fenced) are
    allowed, no others."""
    members: list[Member] = []

    def started(instance: str) -> Member:
        member = start(instance)
        members.append(member)
        return member

    began = time.monotonic()
    try:
        # 1. Join; consume exactly from the committed offsets.
        first = started("pod-a")
        report["first_assignment_s"] = await until(lambda: first.owned() == ALL, "a's assignment")
        expected = {(0, o) for o in range(2, 5)} | {(1, o) for o in range(5)} | {(2, 3), (2, 4)}
        await until(lambda: len(first.records()) >= len(expected), "a's records")
        await asyncio.sleep(0.5)  # nothing more comes
        consumed = first.records()
        assert sorted((p, o) for p, o, _ in consumed) == sorted(expected)
        # It joined with the protocol asked for (a client may fall back to the classic one),
        # into the kind of group its resource asks for.
        described = await runtime.describe_group(group)
        report["group_type"] = described.group_type
        assert [m.classic for m in described.members] == [config.protocol == "classic"]
        if config.protocol == "consumer":
            assert described.group_type == "consumer"
        elif config.assignment == "Client":
            assert described.group_type == "classic"

        # 2. A second member: partitions move, revoked before they are given.
        before = first.owned()
        second = started("pod-b")
        report["rebalance_s"] = await until(lambda: split(first, second), "a split")
        moved = before - first.owned()
        report["moved_on_join"] = len(moved)
        assert moved == second.owned()
        for partition in moved:
            released, given = (
                last_released_at(first, partition),
                first_assigned_at(second, partition),
            )
            assert released is not None
            assert given is not None
            assert released <= given, f"p{partition} given to b before a revoked it"
        for member in (first, second):
            assert "error" not in member.kinds(), member.snapshot()
        await until(lambda: "committed" in first.kinds(), "a's commits")

        async def all_committed() -> bool:
            return await committed(runtime, group, topic) == dict.fromkeys(ALL, PER_PARTITION)

        deadline = time.monotonic() + WAIT_S
        while not await all_committed():
            assert time.monotonic() < deadline, await committed(runtime, group, topic)
            await asyncio.sleep(0.1)

        # New records reach their partition's owner once each.
        owner = {p: (first if p in first.owned() else second) for p in ALL}
        marks = {id(m): m.mark() for m in (first, second)}
        for partition in ALL:
            await asyncio.to_thread(produce, bootstrap, topic, partition, ["n5", "n6"])

        def new_records() -> list[tuple[int, int]]:
            return sorted((p, o) for m in (first, second) for p, o, _ in m.records(marks[id(m)]))

        await until(lambda: len(new_records()) >= 2 * PARTITIONS, "the new records")
        assert new_records() == sorted((p, o) for p in ALL for o in (5, 6))
        for member in (first, second):
            assert {p for p, _, _ in member.records(marks[id(member)])} <= member.owned()

        # 3. seek replays; pause holds and resume releases. A seek may end a session
        # (sarama's does), and partition 0 may change hands when the members join again: the
        # replay is read by whoever holds it then, from the offset sought.
        marks = {id(m): m.mark() for m in (first, second)}
        owner[0].send("seek 0 1")

        def replayed() -> list[list[int]]:
            return [[o for p, o, _ in m.records(marks[id(m)]) if p == 0] for m in (first, second)]

        def since_seek() -> list[list[dict[str, Any]]]:
            return [m.snapshot()[marks[id(m)] :] for m in (first, second)]

        await until(
            lambda: set(range(1, 7)) <= {o for read in replayed() for o in read},
            "the replay",
            detail=since_seek,
        )
        assert min(o for read in replayed() for o in read) == 1, since_seek()
        # The member holding partition 1 now (a seek may end a session: sarama's does).
        await until(lambda: split(first, second), "a split after the seek")
        holder = first if 1 in first.owned() else second
        mark = holder.mark()
        holder.send("pause 1")
        await until(lambda: "paused" in holder.kinds(mark), "the pause")
        await asyncio.to_thread(produce, bootstrap, topic, 1, ["held"])
        await asyncio.sleep(1.0)
        assert [r for r in holder.records(mark) if r[0] == 1] == []
        holder.send("resume 1")
        await until(lambda: (1, 7, "held") in holder.records(mark), "the resumed record")

        # 4. A static member restarts in place: nothing moves.
        if config.static:
            kept = first.owned()
            mark_b = second.mark()
            if config.protocol == "consumer":
                # A KIP-848 static member closing leaves with epoch -2: its partitions wait
                # for it (killed, its instance id would stay taken until its session ends).
                first.send("close")
                await asyncio.to_thread(first.process.wait, 30)
            else:
                # A classic static member never leaves: a kill is a restart like any other.
                first.stop()
            restarted_at = time.monotonic()
            first = started("pod-a")
            await until(lambda: first.owned() == kept, "a's partitions back")
            report["static_restart_s"] = time.monotonic() - restarted_at
            await asyncio.sleep(0.5)
            # b gives nothing up. A rebalance where nothing moves may still happen (b is told
            # its unchanged assignment): franz-go's restarted leader balances even when the
            # coordinator says to skip it (KIP-814), and rejoins if its plan differs.
            released = [
                p
                for e in second.snapshot()[mark_b:]
                if e["event"] in ("revoked", "lost")
                for p in e["partitions"]
            ]
            report["moved_on_static_restart"] = len(released) + len(kept ^ first.owned())
            report["rebalances_on_static_restart"] = second.kinds(mark_b).count("assigned")
            assert report["moved_on_static_restart"] == 0, second.snapshot()[mark_b:]

        # 5. b frozen past its session: its partitions move; thawed, it lost them.
        mark_b = second.mark()
        lost = second.owned()
        os.kill(second.process.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            await until(
                lambda: first.owned() == ALL, "b's partitions at a", SESSION_MS / 1000 + WAIT_S
            )
            report["moved_after_freeze_s"] = time.monotonic() - frozen_at
        finally:
            os.kill(second.process.pid, signal.SIGCONT)
        assert time.monotonic() - frozen_at >= SESSION_MS / 1000 - 0.5

        def lost_since_the_freeze() -> set[int]:
            # One event per partition where each claim ends on its own (sarama's cooperative
            # sessions), one for all of them elsewhere.
            return {
                p
                for e in second.snapshot()[mark_b:]
                if e["event"] == "lost"
                for p in e["partitions"]
            }

        await until(lambda: lost <= lost_since_the_freeze(), "b's lost partitions")
        assert lost_since_the_freeze() == lost, second.snapshot()[mark_b:]
        await until(lambda: split(first, second), "b back in the group")

        # 6. kill -9: b's partitions move after its session timeout.
        second.stop()
        killed_at = time.monotonic()
        await until(lambda: first.owned() == ALL, "b's partitions after the kill")
        report["moved_after_kill_s"] = time.monotonic() - killed_at
        assert report["moved_after_kill_s"] >= SESSION_MS / 1000 - 0.5

        # 7. A dynamic member's close leaves the group: its partitions move at once.
        if not config.static:
            leaver = started("pod-c")
            await until(lambda: split(first, leaver), "c joined")
            leaver.send("close")
            closed_at = time.monotonic()
            await until(lambda: "closed" in leaver.kinds(), "c's close")
            await until(lambda: first.owned() == ALL, "c's partitions after its close")
            report["moved_after_close_s"] = time.monotonic() - closed_at
            assert report["moved_after_close_s"] < SESSION_MS / 1000
        report["total_s"] = time.monotonic() - began
        errors_seen = [e for m in members for e in m.snapshot() if e["event"] == "error"]
        report["errors"] = sorted({e["type"] for e in errors_seen})
        assert all(e["type"] in allowed_errors for e in errors_seen), errors_seen
    finally:
        for member in members:
            member.stop()
