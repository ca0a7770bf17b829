"""``GroupMember`` against a real coordinator process and the embedded broker.

Outages and fencing are real too: the member reaches the coordinator through a loopback
proxy that the test cuts, while the coordinator keeps running its session timers.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from confluent_kafka import Message, Producer

from kafka_group_operator.commands import demo
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import GroupMember, MemberConfig, MemberError, client
from tests.member import proxy
from tests.support import topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# Long enough that a heartbeat slowed down by a loaded machine stays inside lost_after_ms.
SESSION_TIMEOUT_MS = 4_000
TOPICS = (
    "basic",
    "latest",
    "outage",
    "fenced",
    "blackhole",
    "instance",
    "example",
    "batches",
    "slowmessage",
    "slowbatch",
)
# Records waiting in each partition of the slow-handler tests: more than a fetched batch.
BACKLOG = 1_000
EXAMPLE = Path(__file__).parents[2] / "examples" / "consumer.py"


@pytest.fixture(scope="module")
def coordinator(broker: embedded.EmbeddedBroker) -> Iterator[demo.LocalGroup]:
    suffix = uuid.uuid4().hex[:8]
    local = demo.LocalGroup(
        group=f"member-tests-{suffix}",
        topic=f"member-main-{suffix}",
        partitions=2,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=100,
        state_partitions=1,
    )
    local.broker = broker
    # Before the coordinator starts, so that its first metadata poll knows every topic.
    for name in TOPICS:
        local.create_topic(
            f"{name}-{suffix}", 4 if name in ("fenced", "outage", "blackhole") else 2
        )
    local.start(broker)
    try:
        yield local
    finally:
        local.stop()


def topic(coordinator: demo.LocalGroup, name: str) -> str:
    return f"{name}-{coordinator.topic.rsplit('-', 1)[1]}"


def produce(bootstrap: str, topic_name: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "batch.num.messages": 1})
    for index in range(count):
        producer.produce(topic_name, value=f"m{index}".encode(), partition=partition)
    assert producer.flush(10) == 0


def config(
    coordinator: demo.LocalGroup, topic_name: str, url: str | None = None, **overrides: Any
) -> MemberConfig:
    assert coordinator.broker is not None
    settings: dict[str, Any] = {
        "group_id": coordinator.group,
        "coordinator_url": url or coordinator.coordinator_url,
        "token": coordinator.token,
        "topics": (topic_name,),
        "bootstrap_servers": coordinator.broker.bootstrap,
        "commit_interval_ms": 200,
        # Well inside the session timeout, so that a member gives its partitions up before
        # the coordinator hands them to someone else, even on a loaded machine.
        "lost_after_ms": SESSION_TIMEOUT_MS // 2,
        **overrides,
    }
    return MemberConfig(**settings)


class Handout(NamedTuple):
    """A message the member handed out, between two instants of the monotonic clock: it was
    asked for at ``asked`` and received at ``at``, so the member handed it out in between."""

    partition: int
    offset: int
    asked: float
    at: float


@dataclass
class Running:
    """A member iterating on its own thread, recording every message it hands out."""

    member: GroupMember
    processed: list[Handout] = field(default_factory=list)
    lost: list[tuple[float, frozenset[tuple[str, int]]]] = field(default_factory=list)
    failure: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> Running:
        def run() -> None:
            try:
                messages = iter(self.member)
                while True:
                    asked = time.monotonic()
                    message = next(messages, None)
                    if message is None:
                        return
                    self.processed.append(
                        Handout(
                            message.partition() or 0,
                            message.offset() or 0,
                            asked,
                            time.monotonic(),
                        )
                    )
            except BaseException as error:
                self.failure = error

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def wait_for(self, count: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while len(self.processed) < count:
            assert self.failure is None, self.failure
            assert time.monotonic() < deadline, f"processed {len(self.processed)} of {count}"
            time.sleep(0.02)

    def wait_assigned(self, count: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while len(self.member.assignment) != count:
            assert time.monotonic() < deadline, f"owns {sorted(self.member.assignment)}"
            time.sleep(0.02)

    def stop(self, permanent: bool = True) -> None:
        self.member.stop(permanent=permanent)
        assert self.thread is not None
        self.thread.join(20)
        assert not self.thread.is_alive()


def running(member_config: MemberConfig) -> Running:
    lost: list[tuple[float, frozenset[tuple[str, int]]]] = []
    member = GroupMember(member_config, on_lost=lambda p: lost.append((time.monotonic(), p)))
    return Running(member, lost=lost).start()


def test_consumes_commits_on_stop_and_the_next_member_resumes(
    coordinator: demo.LocalGroup,
) -> None:
    name = topic(coordinator, "basic")
    assert coordinator.broker is not None
    for partition in (0, 1):
        produce(coordinator.broker.bootstrap, name, partition, 50)
    first = running(config(coordinator, name, commit_interval_ms=60_000))
    first.wait_for(100)
    first.stop()
    assert sorted((h.partition, h.offset) for h in first.processed) == [
        (p, o) for p in (0, 1) for o in range(50)
    ]
    coordinator_client = coordinator.client()
    assert coordinator_client.fetch([(name, 0), (name, 1)]) == {(name, 0): 50, (name, 1): 50}

    for partition in (0, 1):
        produce(coordinator.broker.bootstrap, name, partition, 10)
    commits: list[dict[tuple[str, int], int]] = []
    committed = threading.Event()

    def on_commit(offsets: Any, failed: Any) -> None:
        assert not failed
        commits.append(dict(offsets))
        committed.set()

    second_member = GroupMember(
        config(coordinator, name, commit_interval_ms=60_000), on_commit=on_commit
    )
    second = Running(second_member).start()
    second.wait_for(20)
    time.sleep(0.3)
    assert sorted((h.partition, h.offset) for h in second.processed) == [
        (p, o) for p in (0, 1) for o in range(50, 60)
    ]
    # Offsets count as processed once the next message is asked for; both are by now.
    assert second_member.commit(asynchronous=True) == {}
    assert committed.wait(5)
    assert commits[-1] == {(name, 0): 60, (name, 1): 60}
    assert second_member.commit() == {}  # nothing new: nothing sent, nothing failed
    second.stop()
    assert coordinator_client.fetch([(name, 0), (name, 1)]) == {(name, 0): 60, (name, 1): 60}


def test_without_a_commit_auto_offset_reset_latest_skips_the_backlog(
    coordinator: demo.LocalGroup,
) -> None:
    name = topic(coordinator, "latest")
    assert coordinator.broker is not None
    produce(coordinator.broker.bootstrap, name, 0, 10)
    member = running(config(coordinator, name, auto_offset_reset="latest"))
    member.wait_assigned(2)
    time.sleep(1.0)  # the fetcher positions itself at the end
    produce(coordinator.broker.bootstrap, name, 0, 5)
    member.wait_for(5)
    time.sleep(0.3)
    member.stop()
    assert [(h.partition, h.offset) for h in member.processed] == [(0, o) for o in range(10, 15)]


def test_a_short_coordinator_outage_changes_nothing(coordinator: demo.LocalGroup) -> None:
    name = topic(coordinator, "outage")
    assert coordinator.broker is not None
    producer = demo.Producer(coordinator.broker.bootstrap, name, 4, rate=200)
    producer.start()
    link = proxy.Proxy("127.0.0.1", int(coordinator.coordinator_url.rsplit(":", 1)[1]))
    member = running(config(coordinator, name, url=link.url, instance_id="outage-0"))
    try:
        member.wait_assigned(4)
        epoch = member.member.member_epoch
        cut_at = time.monotonic()
        link.cut()
        time.sleep(SESSION_TIMEOUT_MS / 1000 / 3)
        link.restore()
        restored_at = time.monotonic()
        time.sleep(0.5)
        # It kept processing while the coordinator was out of reach, and lost nothing.
        assert {h.partition for h in member.processed if cut_at <= h.at <= restored_at} == {
            0,
            1,
            2,
            3,
        }
        assert member.lost == []
        assert len(member.member.assignment) == 4
        assert member.member.member_epoch == epoch
    finally:
        member.stop()
        producer.stop()
        link.close()


def test_a_fenced_member_stops_at_once_and_rejoins(coordinator: demo.LocalGroup) -> None:
    name = topic(coordinator, "fenced")
    assert coordinator.broker is not None
    producer = demo.Producer(coordinator.broker.bootstrap, name, 4, rate=200)
    producer.start()
    link = proxy.Proxy("127.0.0.1", int(coordinator.coordinator_url.rsplit(":", 1)[1]))
    cut_off = running(config(coordinator, name, url=link.url))
    other = running(config(coordinator, name))
    try:
        cut_off.wait_assigned(2)
        other.wait_assigned(2)
        mine = cut_off.member.assignment
        link.cut()
        # The coordinator expires the member and hands its partitions to the other one.
        other.wait_assigned(4, timeout=SESSION_TIMEOUT_MS / 1000 + 5)
        taken_at = time.monotonic()
        assert cut_off.lost, "the cut-off member never gave its partitions up"
        lost_at, lost = cut_off.lost[0]
        assert lost == mine
        # No zombie: nothing of the lost partitions was processed after they were dropped,
        # and they were dropped before the coordinator gave them away.
        assert lost_at <= taken_at
        assert [h for h in cut_off.processed if h.asked > lost_at] == []
        link.restore()
        # UNKNOWN_MEMBER_ID on its next heartbeat: it rejoins with epoch 0 and gets a share.
        cut_off.wait_assigned(2, timeout=10)
        other.wait_assigned(2, timeout=10)
        rejoined = len(cut_off.processed)
        cut_off.wait_for(rejoined + 10)
        assert cut_off.failure is None
    finally:
        cut_off.stop()
        other.stop()
        producer.stop()
        link.close()


def test_a_call_behind_a_black_hole_ends_at_its_deadline_and_is_not_retried(
    coordinator: demo.LocalGroup,
) -> None:
    link = proxy.Proxy("127.0.0.1", int(coordinator.coordinator_url.rsplit(":", 1)[1]))
    coordinator_client = client.CoordinatorClient(
        link.url, coordinator.group, coordinator.token, timeout_s=60
    )
    try:
        coordinator_client.describe()  # a kept-alive connection, as the heartbeat thread has
        assert link.accepted == 1
        link.stall()
        deadline = time.monotonic() + 0.5
        with pytest.raises(client.CoordinatorUnreachable):
            coordinator_client.request("GET", "", deadline=deadline)
        # It ended at its deadline, not after its 60 s timeout, and did not try again.
        assert time.monotonic() - deadline < 60
        assert link.accepted == 1
        # A call whose deadline has passed is not even sent.
        with pytest.raises(client.CoordinatorUnreachable):
            coordinator_client.request("GET", "", deadline=time.monotonic())
        assert link.accepted == 1
    finally:
        coordinator_client.close()
        link.close()


def test_a_member_behind_a_black_hole_hands_out_nothing_after_its_deadline(
    coordinator: demo.LocalGroup,
) -> None:
    """Packets dropped, not refused: the heartbeat hangs instead of failing. The member must
    not wait for its HTTP timeout (10 s here, as by default) to notice: it hands out nothing
    once ``lost_after_ms`` have passed since its last successful heartbeat was sent."""
    name = topic(coordinator, "blackhole")
    assert coordinator.broker is not None
    producer = demo.Producer(coordinator.broker.bootstrap, name, 4, rate=200)
    producer.start()
    link = proxy.Proxy("127.0.0.1", int(coordinator.coordinator_url.rsplit(":", 1)[1]))
    cut_off = running(config(coordinator, name, url=link.url, request_timeout_s=10.0))
    other = running(config(coordinator, name))
    try:
        cut_off.wait_assigned(2)
        other.wait_assigned(2)
        mine = cut_off.member.assignment
        cut_off.wait_for(len(cut_off.processed) + 10)
        link.stall()
        # Every heartbeat that succeeded was sent before this instant (its reply left the
        # proxy before the stall), so the member's deadline is at the latest:
        deadline = time.monotonic() + cut_off.member.config.lost_after_ms / 1000
        other.wait_assigned(4, timeout=SESSION_TIMEOUT_MS / 1000 + 10)
        lost_by = time.monotonic() + 30  # the old behaviour needed 20 s: two 10 s timeouts
        while not cut_off.lost and time.monotonic() < lost_by:
            time.sleep(0.05)
        assert cut_off.lost, "the cut-off member never gave its partitions up"
        assert cut_off.lost[0][1] == mine
        late = [h for h in cut_off.processed if h.asked >= deadline]
        assert late == [], f"{len(late)} message(s) handed out after the deadline"
        assert cut_off.failure is None
        link.restore()
        # Back in touch, it rejoins and gets a share again.
        cut_off.wait_assigned(2, timeout=20)
        other.wait_assigned(2, timeout=20)
        rejoined = len(cut_off.processed)
        cut_off.wait_for(rejoined + 10)
    finally:
        cut_off.stop()
        other.stop()
        producer.stop()
        link.close()


def test_a_refused_token_is_fatal(coordinator: demo.LocalGroup) -> None:
    """GROUP_AUTHORIZATION_FAILED is fatal, as in Kafka's consumer: retrying cannot help."""
    name = topic(coordinator, "instance")
    refused = running(config(coordinator, name, token="not-the-group-token"))
    assert refused.thread is not None
    refused.thread.join(20)
    assert isinstance(refused.failure, MemberError)
    assert isinstance(refused.failure.__cause__, errors.GroupAuthorizationFailed)
    assert refused.processed == []


def test_a_fenced_instance_id_is_fatal(coordinator: demo.LocalGroup) -> None:
    name = topic(coordinator, "instance")
    link = proxy.Proxy("127.0.0.1", int(coordinator.coordinator_url.rsplit(":", 1)[1]))
    # A member that does not give up on its own, so that it comes back as a zombie with
    # its old epoch (with the default lost_after_ms it would have rejoined as a newcomer and
    # waited with UNRELEASED_INSTANCE_ID instead).
    zombie = running(
        config(coordinator, name, url=link.url, instance_id="instance-0", lost_after_ms=60_000)
    )
    try:
        zombie.wait_assigned(2)
        link.cut()
        # Its session expires; a new process takes the instance id over.
        time.sleep(SESSION_TIMEOUT_MS / 1000 + 1)
        successor = running(config(coordinator, name, instance_id="instance-0"))
        successor.wait_assigned(2)
        link.restore()
        assert zombie.thread is not None
        zombie.thread.join(10)
        assert isinstance(zombie.failure, MemberError)
        assert isinstance(zombie.failure.__cause__, errors.FencedInstanceId)
        assert len(successor.member.assignment) == 2
        successor.stop()
    finally:
        link.close()


def test_the_example_consumer_consumes_and_commits_on_sigterm(
    coordinator: demo.LocalGroup,
) -> None:
    """``examples/consumer.py`` as a pod runs it: configured by the environment only."""
    name = topic(coordinator, "example")
    assert coordinator.broker is not None
    for partition in (0, 1):
        produce(coordinator.broker.bootstrap, name, partition, 20)
    env = {**coordinator.member_env_for(name), "KGO_INSTANCE_ID": "example-0"}
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE)], env=env, stderr=subprocess.PIPE, text=True
    )
    coordinator_client = coordinator.client()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            members = coordinator.describe()["members"]
            if any(m["instanceId"] == "example-0" and m["assignment"] for m in members):
                break
            time.sleep(0.1)
        time.sleep(2)  # the backlog of 40 small messages is consumed in well under that
        process.send_signal(signal.SIGTERM)
        _, log = process.communicate(timeout=20)
        assert process.returncode == 0, log
    finally:
        if process.poll() is None:
            process.kill()
    # Its commit on the way out covers everything it consumed.
    assert coordinator_client.fetch([(name, 0), (name, 1)]) == {(name, 0): 20, (name, 1): 20}
    assert "handing over" not in log  # a temporary leave revokes nothing


def next_batch(batches: Iterator[list[Message]], timeout: float = 20) -> list[Message]:
    """The next non-empty batch (``batches()`` yields empty ones while nothing comes)."""
    deadline = time.monotonic() + timeout
    for batch in batches:
        if batch:
            return batch
        assert time.monotonic() < deadline, "no message came"
    raise AssertionError("the member stopped")


def ends(batch: list[Message]) -> dict[tuple[str, int], int]:
    """Each partition's offset after its last message in ``batch``."""
    return {(m.topic() or "", m.partition() or 0): (m.offset() or 0) + 1 for m in batch}


def committed(coordinator_client: client.CoordinatorClient, name: str) -> dict[Any, int]:
    """Committed offsets past the start of ``name``'s partitions: a partition that nothing was
    processed of yet may be committed at its position, 0 (Kafka's consumer commits its
    positions too)."""
    offsets = coordinator_client.fetch([(name, 0), (name, 1)])
    return {partition: offset for partition, offset in offsets.items() if offset > 0}


def test_batches_hand_out_every_message_once_in_order_and_count_when_the_next_is_asked_for(
    coordinator: demo.LocalGroup,
) -> None:
    name = topic(coordinator, "batches")
    assert coordinator.broker is not None
    for partition in (0, 1):
        produce(coordinator.broker.bootstrap, name, partition, 100)
    member = GroupMember(config(coordinator, name, commit_interval_ms=60_000))
    with pytest.raises(ValueError, match="max_records"):
        member.batches(0)
    coordinator_client = coordinator.client()
    batches = member.batches(30, timeout=0.2)
    first = next_batch(batches)
    # The batch in hand is not processed yet: a commit on the consuming thread has nothing.
    assert member.commit() == {}
    assert committed(coordinator_client, name) == {}
    second = next_batch(batches)
    # Asking for the second batch made the first one processed, and only the first.
    assert member.commit() == {}
    assert committed(coordinator_client, name) == ends(first)
    handed = [first, second]
    while sum(map(len, handed)) < 200:
        handed.append(next_batch(batches))
    assert all(1 <= len(batch) <= 30 for batch in handed)
    for partition in (0, 1):
        offsets = [m.offset() for batch in handed for m in batch if m.partition() == partition]
        assert offsets == list(range(100)), f"partition {partition}"
    # Stopping ends the iteration; closing commits the last batch too.
    member.stop(permanent=True)
    assert [batch for batch in batches if batch] == []
    assert committed(coordinator_client, name) == {(name, 0): 100, (name, 1): 100}


@pytest.mark.parametrize("mode", ["messages", "batches"])
def test_a_slow_handler_gets_nothing_more_once_the_deadline_passed(
    coordinator: demo.LocalGroup, mode: str
) -> None:
    """The handler takes longer than ``lost_after_ms`` while the coordinator is out of reach
    (packets dropped). Records already fetched are at hand (a backlog, fetched 500 at a time),
    but none may be handed out once the ownership may be lost: iterating, not the rest of the
    batch in hand, whose checks were made before the deadline; in batches, not the next."""
    name = topic(coordinator, "slowmessage" if mode == "messages" else "slowbatch")
    assert coordinator.broker is not None
    topics.produce(coordinator.broker.bootstrap, name, (0, 1), BACKLOG)
    link = proxy.Proxy("127.0.0.1", int(coordinator.coordinator_url.rsplit(":", 1)[1]))
    lost: list[tuple[float, frozenset[tuple[str, int]]]] = []
    member = GroupMember(
        config(coordinator, name, url=link.url, max_poll_records=500),
        on_lost=lambda p: lost.append((time.monotonic(), p)),
    )
    lost_after_s = member.config.lost_after_ms / 1000
    handed: list[Handout] = []
    stalled: list[float] = []  # the instant the link was stalled
    failure: list[BaseException] = []

    def handle() -> None:
        # Fetching from a backlog: after the first records, whole batches are at hand.
        if len(handed) == 50:
            link.stall()
            stalled.append(time.monotonic())
            time.sleep(lost_after_s + 1.0)

    def consume() -> None:
        try:
            batches: Iterator[list[Message]] = (
                member.batches(500, timeout=0.2)
                if mode == "batches"
                else ([message] for message in member)
            )
            while True:
                asked = time.monotonic()
                batch = next(batches, None)
                if batch is None:
                    return
                for message in batch:
                    handed.append(
                        Handout(message.partition() or 0, message.offset() or 0, asked, 0.0)
                    )
                    handle()
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        wait_until = time.monotonic() + 60
        while not lost and time.monotonic() < wait_until:
            assert not failure, failure
            time.sleep(0.05)
        assert stalled, f"handed out {len(handed)} of {2 * BACKLOG} records"
        assert lost, "the member never gave its partitions up"
        # Every heartbeat that succeeded was sent before the stall.
        deadline = stalled[0] + lost_after_s
        assert lost[0][0] >= deadline - 0.5  # not lost before its time (it was in touch)
        late = [h for h in handed if h.asked >= deadline]
        assert late == [], f"{len(late)} record(s) handed out after the deadline"
        assert len(handed) < 2 * BACKLOG  # there were records at hand to hand out
        assert not failure, failure
    finally:
        link.restore()
        member.stop(permanent=True)
        thread.join(20)
        link.close()
    assert not thread.is_alive()
