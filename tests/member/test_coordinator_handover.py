"""Members while their coordinator changes: restarted, or fenced by a newer one.

The members reach the coordinator through a loopback proxy standing for the Kubernetes
Service, which the test points at the new coordinator. A restarting coordinator refuses
connections, then answers ``COORDINATOR_LOAD_IN_PROGRESS`` while it loads; a fenced one keeps
running and answers ``NOT_COORDINATOR``. Members retry all of these, never fail on them, and,
as Kafka's consumer rediscovers its coordinator on ``NOT_COORDINATOR``, leave the kept-alive
connection to a fenced coordinator for a new one.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_group_operator.commands import demo
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import GroupMember, MemberConfig, client
from tests.member import proxy
from tests.member.test_group_member import Running

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SESSION_TIMEOUT_MS = 4_000


@contextlib.contextmanager
def local_group(
    broker: embedded.EmbeddedBroker, session_timeout_ms: int, heartbeat_interval_ms: int
) -> Iterator[demo.LocalGroup]:
    suffix = uuid.uuid4().hex[:8]
    local = demo.LocalGroup(
        group=f"handover-{suffix}",
        topic=f"handover-{suffix}",
        partitions=2,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        state_partitions=1,
    )
    local.start(broker)
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def group(broker: embedded.EmbeddedBroker) -> Iterator[demo.LocalGroup]:
    with local_group(broker, SESSION_TIMEOUT_MS, heartbeat_interval_ms=100) as local:
        yield local


def member_config(
    group: demo.LocalGroup, url: str, instance: str, lost_after_ms: int = SESSION_TIMEOUT_MS // 2
) -> MemberConfig:
    assert group.broker is not None
    settings: dict[str, Any] = {
        "group_id": group.group,
        "coordinator_url": url,
        "token": group.token,
        "topics": (group.topic,),
        "bootstrap_servers": group.broker.bootstrap,
        "instance_id": instance,
        "commit_interval_ms": 200,
        "lost_after_ms": lost_after_ms,
    }
    return MemberConfig(**settings)


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_member_of_a_fenced_coordinator_moves_to_the_new_one(group: demo.LocalGroup) -> None:
    assert group.broker is not None
    producer = demo.Producer(group.broker.bootstrap, group.topic, group.partitions, rate=100)
    producer.start()
    service = proxy.Proxy("127.0.0.1", port(group.coordinator_url))
    first = Running(GroupMember(member_config(group, service.url, "member-0"))).start()
    old_process, old_url = group.coordinator, group.coordinator_url
    second: Running | None = None
    try:
        first.wait_assigned(2)
        first.wait_for(10)
        # The replacement coordinator starts on the same state topic (the old one runs on),
        # and the Service selects it from now on: new connections lead there.
        group.start_coordinator()
        service.retarget("127.0.0.1", port(group.coordinator_url))
        # A member joining through the new coordinator makes it write: its transactional
        # producer fences the old one's.
        second = Running(GroupMember(member_config(group, group.coordinator_url, "member-1")))
        second.start()
        old = client.CoordinatorClient(old_url, group.group, group.token)
        deadline = time.monotonic() + 30
        while True:
            try:
                old.describe()
            except errors.NotCoordinator:
                break  # fenced, and says so
            assert time.monotonic() < deadline, "the old coordinator was never fenced"
            time.sleep(0.1)
        old.close()
        # The member follows the Service to the new coordinator: both members settle there.
        group.wait_settled({"member-0", "member-1"}, timeout=30)
        assert first.failure is None
        assert first.member.assignment == group.ownership()["member-0"]
        processed = len(first.processed)
        first.wait_for(processed + 5)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        producer.stop()
        service.close()
        if old_process is not None and old_process.poll() is None:
            old_process.terminate()
            old_process.wait(15)


RESTARTS = 3


def test_coordinator_restarts_fail_no_member_and_move_no_partition(
    group: demo.LocalGroup,
) -> None:
    """Each restart is quicker than ``lost_after_ms`` (half the session timeout), so nothing
    at all may change: no member process exits, none loses or is revoked a partition."""
    # Read by members from their environment: lost_after_ms is 15 s, where a restart takes
    # about 2 s on a quiet machine, so that a loaded one still restarts well inside it.
    group.session_timeout_ms = 30_000
    service = proxy.Proxy("127.0.0.1", port(group.coordinator_url))
    try:
        for instance in ("member-0", "member-1"):
            group.start_member(instance, env={"KGO_COORDINATOR_URL": service.url})
        group.wait_settled({"member-0", "member-1"}, timeout=30)
        before = group.ownership()
        # Settled is the coordinator's view: a member journals its assignment after it has
        # been handed out, so start counting changes once both journals agree with it.
        deadline = time.monotonic() + 30
        while any(_journal_owned(group, i) != owned for i, owned in before.items()):
            assert time.monotonic() < deadline, "the members never journaled their assignment"
            time.sleep(0.05)
        since = time.time()
        outages: list[float] = []
        for _ in range(RESTARTS):
            killed = time.monotonic()
            restart_coordinator(group, service)
            outages.append(round(time.monotonic() - killed, 2))
            group.wait_settled({"member-0", "member-1"}, timeout=30)
            assert group.ownership() == before
        for instance, process in group.members.items():
            assert process.poll() is None, f"{instance} exited"
            changes = [
                event["e"]
                for event in demo.Journal.read(group.journal_path(instance)).events
                if event["t"] >= since and event["e"] in ("start", "lost", "revoked", "assigned")
            ]
            assert changes == [], f"{instance}: {changes}; restarts took {outages} s; " + (
                _log_tail(group, instance)
            )
    finally:
        group.stop_members(sorted(group.members))
        service.close()


def _log_tail(group: demo.LocalGroup, instance: str) -> str:
    """The end of the member's log (its warnings): why it dropped partitions, stale or fenced."""
    log = group.directory / f"{instance}.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "its log ends:\n" + "\n".join(lines[-30:])


def _journal_owned(group: demo.LocalGroup, instance: str) -> frozenset[tuple[str, int]]:
    """What ``instance`` owns by its own journal: assigned, less revoked and lost."""
    owned: set[tuple[str, int]] = set()
    for event in demo.Journal.read(group.journal_path(instance)).events:
        partitions = {(topic, partition) for topic, partition in event.get("p", ())}
        if event["e"] == "assigned":
            owned |= partitions
        elif event["e"] in ("revoked", "lost"):
            owned -= partitions
    return frozenset(owned)


def restart_coordinator(group: demo.LocalGroup, service: proxy.Proxy) -> None:
    """Kill the coordinator (a crash, a lost node), start a new one, and point the Service at
    it as soon as its process exists: members meet it refusing connections, and may meet it
    answering COORDINATOR_LOAD_IN_PROGRESS while it loads."""
    old_process, old_url = group.coordinator, group.coordinator_url
    assert old_process is not None
    old_process.kill()
    old_process.wait()
    service.cut()  # the old pod's connections are gone with it
    starting = threading.Thread(target=group.start_coordinator, daemon=True)
    starting.start()
    deadline = time.monotonic() + 30
    while group.coordinator_url == old_url:
        assert time.monotonic() < deadline, "the new coordinator did not start"
        time.sleep(0.01)
    service.retarget("127.0.0.1", port(group.coordinator_url))
    service.restore()
    starting.join(60)
    assert not starting.is_alive(), "the new coordinator did not get ready"


class HeartbeatLog:
    """Every heartbeat a member sends, as (sent, answered, succeeded) on the monotonic
    clock: the member's own client, called through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, member: GroupMember) -> None:
        self.calls: list[tuple[float, float, bool]] = []
        self.in_flight = False
        coordinator = member._client
        send = coordinator.heartbeat

        def heartbeat(body: client.Json, deadline: float | None = None) -> client.Json:
            sent = time.monotonic()
            self.in_flight = True
            try:
                reply = send(body, deadline)
            except errors.CoordinatorError:
                self.calls.append((sent, time.monotonic(), False))
                raise
            finally:
                self.in_flight = False
            self.calls.append((sent, time.monotonic(), True))
            return reply

        monkeypatch.setattr(coordinator, "heartbeat", heartbeat)

    def sent_since(self, instant: float) -> list[tuple[float, float, bool]]:
        return [call for call in self.calls if call[0] >= instant]

    def wait_steady(self, quiet_s: float = 1.0, timeout: float = 30) -> float:
        """Wait until the last heartbeat succeeded ``quiet_s`` ago and none is in flight;
        when that last one was sent."""
        deadline = time.monotonic() + timeout
        while (
            self.in_flight
            or not self.calls
            or not self.calls[-1][2]
            or time.monotonic() - self.calls[-1][1] < quiet_s
        ):
            assert time.monotonic() < deadline, f"heartbeats never settled: {self.calls}"
            time.sleep(0.05)
        return self.calls[-1][0]

    def first_success(self, after: float, timeout: float = 30) -> float:
        """When the first successful heartbeat sent after ``after`` was sent."""
        deadline = time.monotonic() + timeout
        while not (succeeded := [sent for sent, _, ok in self.sent_since(after) if ok]):
            assert time.monotonic() < deadline, f"no successful heartbeat: {self.calls}"
            time.sleep(0.01)
        return succeeded[0]


def test_a_member_heartbeats_at_once_when_its_coordinator_dies(
    broker: embedded.EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member heartbeats every 40 s. Its coordinator is SIGKILLed right after one: the
    member notices its connection closing and heartbeats at once (refused, retried while the
    new coordinator starts), so its first successful heartbeat comes when the new coordinator
    serves, not 40 s after the last. A path that keeps closing idle connections then costs at
    most one early heartbeat per interval, not a loop."""
    interval_s = 40.0
    with local_group(broker, session_timeout_ms=120_000, heartbeat_interval_ms=80_000) as group:
        service = proxy.Proxy("127.0.0.1", port(group.coordinator_url))
        # Half of lost_after_ms bounds the interval: a heartbeat every 40 s.
        config = member_config(group, service.url, "member-0", lost_after_ms=int(interval_s * 2000))
        member = GroupMember(config)
        heartbeats = HeartbeatLog(monkeypatch, member)
        running = Running(member).start()
        try:
            running.wait_assigned(2)
            owned = member.assignment
            # Steady: the heartbeat reporting the assignment is done, the next is 40 s away.
            last = heartbeats.wait_steady()
            killed = time.monotonic()
            restart_coordinator(group, service)
            since_kill = heartbeats.sent_since(killed)
            assert since_kill, "no heartbeat while the coordinator restarted"
            assert since_kill[0][0] - killed < 1.0, since_kill
            answered = heartbeats.first_success(after=killed, timeout=interval_s)
            assert answered < last + interval_s, heartbeats.sent_since(killed)
            assert member.assignment == owned
            assert running.failure is None

            # Connections closed while idle, every 0.2 s for 5 s: one early heartbeat at most.
            closing = time.monotonic()
            while time.monotonic() < closing + 5:
                service.cut()
                service.restore()
                time.sleep(0.2)
            assert len(heartbeats.sent_since(closing)) <= 1, heartbeats.sent_since(closing)
            assert member.assignment == owned
        finally:
            running.stop()
            service.close()
