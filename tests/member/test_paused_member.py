"""A member process frozen (SIGSTOP: a GC pause, a suspended VM) while the group moves on.

Two member processes of ``kgo demo`` share a topic on a real coordinator and broker. One is
frozen for longer than its session, so the coordinator hands its partitions to the other;
then it is thawed with messages already fetched or about to be. It must hand none of them
out: its ownership stopped being provably fresh ``lost_after_ms`` after its last successful
heartbeat was sent, which was before it froze. The members journal, for every message, the
monotonic instant at which they asked for it, or for its batch (``asked``); the member hands
it out after that, so one asked for at or after the deadline is a zombie hand-out.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_group_operator.commands import demo
from kafka_group_operator.embedded import broker as embedded
from tests.member import proxy
from tests.support import topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SESSION_TIMEOUT_MS = 3_000
# What the member derives from KGO_SESSION_TIMEOUT_MS (config.MemberConfig.from_env).
LOST_AFTER_S = SESSION_TIMEOUT_MS / 2 / 1000
MEMBERS = {"member-0", "member-1"}
PARTITIONS = 4


@pytest.fixture(params=[0, 20], ids=["messages", "batches"])
def group(
    broker: embedded.EmbeddedBroker, request: pytest.FixtureRequest
) -> Iterator[demo.LocalGroup]:
    """Members that iterate messages, or ``batches(20)`` (``kgo demo member --batch``)."""
    local = demo.LocalGroup(
        group=f"paused-{uuid.uuid4().hex[:8]}",
        # A backlog that outlasts the test: the members always have fetched messages waiting,
        # as a busy consumer does.
        topic=topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=4_000),
        partitions=PARTITIONS,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=100,
        state_partitions=1,
        work_ms=10,
        batch=request.param,
    )
    local.broker = broker
    local.start_coordinator()
    try:
        yield local
    finally:
        local.stop()


def frozen(pid: int) -> bool:
    """Every thread of ``pid`` stopped (state T): none can run until SIGCONT."""
    tasks = list(Path(f"/proc/{pid}/task").iterdir())
    return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for task in tasks)


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_a_member_thawed_after_its_deadline_hands_out_nothing_it_lost(
    group: demo.LocalGroup,
) -> None:
    # The frozen member reaches its coordinator across a link with some latency, as across
    # zones: once thawed, it learns that it was fenced only a round trip later, while its
    # fetched messages are at hand at once. It must not need that round trip.
    link = proxy.Proxy("127.0.0.1", int(group.coordinator_url.rsplit(":", 1)[1]), latency_s=0.1)
    try:
        group.start_member("member-0", env={"KGO_COORDINATOR_URL": link.url})
        group.start_member("member-1")
        group.wait_settled(MEMBERS, timeout=30)
        # Twice: whether a zombie hand-out could show depends on where the threads froze.
        for _ in range(2):
            pause_and_thaw(group)
    finally:
        group.stop_members(sorted(group.members))
        link.close()


def pause_and_thaw(group: demo.LocalGroup) -> None:
    paused = group.members["member-0"]
    mine = group.ownership()["member-0"]
    assert mine
    journal_path = group.journal_path("member-0")
    settled = len(demo.Journal.read(journal_path).events)
    # Frozen in full flow, with fetched messages waiting in the member.
    wait_until(
        lambda: len(demo.Journal.read(journal_path).events) >= settled + 20,
        30,
        "member-0 processes its partitions",
    )
    seen = len(demo.Journal.read(journal_path).events)
    paused.send_signal(signal.SIGSTOP)
    wait_until(lambda: frozen(paused.pid), 10, "member-0 is frozen")
    # No thread of the member runs from here on, so every heartbeat that ever succeeded was
    # sent before this instant: the member's deadline is at the latest
    deadline = time.monotonic() + LOST_AFTER_S
    try:
        wait_until(
            lambda: mine <= group.ownership().get("member-1", frozenset()),
            SESSION_TIMEOUT_MS / 1000 + 20,
            "the coordinator gives member-0's partitions to member-1",
        )
        assert time.monotonic() >= deadline
    finally:
        os.kill(paused.pid, signal.SIGCONT)

    def thawed_events() -> list[dict[str, Any]]:
        return demo.Journal.read(journal_path).events[seen:]

    # Thawed, it drops what it lost, rejoins, and gets a share again.
    wait_until(
        lambda: any(e["e"] == "assigned" for e in thawed_events()), 30, "member-0 is reassigned"
    )
    group.wait_settled(MEMBERS, timeout=30)
    assert paused.poll() is None, "the thawed member died"
    events = thawed_events()
    reassigned = next(i for i, e in enumerate(events) if e["e"] == "assigned")
    lost = [e for e in events[:reassigned] if e["e"] == "lost"]
    assert [sorted(tuple(tp) for tp in e["p"]) for e in lost] == [sorted(mine)]
    zombies = [e for e in events[:reassigned] if e["e"] == "m" and e["asked"] >= deadline]
    assert zombies == [], f"{len(zombies)} message(s) handed out after the deadline"
