"""Real processes: a standalone coordinator and member processes on the embedded broker.

A producer writes continuously to a 12-partition topic while members join, restart, leave.
What the members did comes from their journals (every processed offset, every ownership
change); who owned what comes from the coordinator's own records, read back from the state
topic and decoded with ``kafka_group_records.codec``. The tests run in order on one group,
each leaving it settled on three members.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_group_operator.commands import common, demo
from kafka_group_operator.embedded import broker as embedded
from kafka_group_records import codec, records

pytestmark = [pytest.mark.slow, pytest.mark.broker]

BASE = {"member-0", "member-1", "member-2"}
Partition = tuple[str, int]


@dataclasses.dataclass
class Scenario:
    group: demo.LocalGroup
    producer: demo.Producer


@pytest.fixture(scope="module")
def group(scenario: Scenario) -> demo.LocalGroup:
    return scenario.group


@pytest.fixture(scope="module")
def producer(scenario: Scenario) -> demo.Producer:
    return scenario.producer


@pytest.fixture(scope="module")
def scenario(broker: embedded.EmbeddedBroker) -> Iterator[Scenario]:
    suffix = uuid.uuid4().hex[:8]
    local = demo.LocalGroup(
        group=f"scenario-{suffix}",
        topic=f"scenario-orders-{suffix}",
        partitions=12,
        # Long enough that a restarted process is back in time even on a loaded machine.
        session_timeout_ms=10_000,
        heartbeat_interval_ms=200,
        state_partitions=2,
    )
    local.start(broker)
    producer = demo.Producer(broker.bootstrap, local.topic, local.partitions, rate=240)
    producer.start()
    try:
        for instance in sorted(BASE):
            local.start_member(instance)
        local.wait_settled(BASE, timeout=30)
        wait_members_hold(local)
        yield Scenario(local, producer)
    finally:
        producer.stop()
        local.stop()


def journal(group: demo.LocalGroup, instance: str) -> demo.Journal:
    return demo.Journal.read(group.journal_path(instance))


def changes_after(group: demo.LocalGroup, instance: str, since: float) -> list[str]:
    events = journal(group, instance).events
    return [e["e"] for e in events if e["t"] >= since and e["e"] in ("assigned", "revoked", "lost")]


def held(group: demo.LocalGroup, instance: str) -> frozenset[Partition]:
    """What the member's own journal says it holds: its ownership changes, replayed."""
    holds: set[Partition] = set()
    for event in journal(group, instance).events:
        if event["e"] == "start":
            holds = set()
        elif event["e"] in ("assigned", "revoked", "lost"):
            partitions = {(t, p) for t, p in event["p"]}
            holds = holds | partitions if event["e"] == "assigned" else holds - partitions
    return frozenset(holds)


def wait_members_hold(group: demo.LocalGroup, timeout: float = 20) -> None:
    """Until every member has taken what the coordinator says it owns. The coordinator counts
    a partition as the member's once its heartbeat answer carries it; the member takes it
    (fetching its committed offset, then journalling) a moment later, later still on a busy
    machine. A test that watches for ownership changes starts after that moment."""
    deadline = time.monotonic() + timeout
    while True:
        owned = group.ownership()
        if all(held(group, instance) == partitions for instance, partitions in owned.items()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the members' journals do not show what they own: {owned}")
        time.sleep(0.05)


def wait_for_restart(group: demo.LocalGroup, instance: str, timeout: float = 20) -> float:
    """Until the restarted process of ``instance`` got its partitions; returns that time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = journal(group, instance).events
        starts = [i for i, event in enumerate(events) if event["e"] == "start"]
        assigned = [e for e in events[starts[-1] :] if e["e"] == "assigned"] if starts else []
        if len(starts) >= 2 and assigned:
            return float(assigned[0]["t"])
        time.sleep(0.05)
    raise TimeoutError(f"{instance} did not get partitions back after its restart")


def test_static_restart_within_the_session_timeout_moves_nothing(group: demo.LocalGroup) -> None:
    wait_members_hold(group)
    before = group.ownership()
    epoch_before = group.describe()["groupEpoch"]
    assert set(before) == BASE
    killed_at = time.time()
    group.kill_member("member-1")
    # The container restarts inside its pod: same pod UID, hence the same member id.
    group.start_member("member-1", same_pod=True)
    back_at = wait_for_restart(group, "member-1")
    group.wait_settled(BASE, timeout=20)
    time.sleep(1.0)
    settled_at = time.time()

    assert group.ownership() == before, "a restart within the session timeout moved partitions"
    # Not even a new group epoch: the coordinator saw the same member come back.
    assert group.describe()["groupEpoch"] == epoch_before
    restarted = journal(group, "member-1")
    assert restarted.changes("assigned")[-1][1] == sorted(before["member-1"])
    resumed = {tp for tp, _, at in restarted.processed() if at >= back_at}
    assert resumed == set(before["member-1"]), "the restarted member did not resume"
    for other in BASE - {"member-1"}:
        assert changes_after(group, other, killed_at) == [], f"{other} was rebalanced"
        # ... and it kept consuming every partition it owns while member-1 was away.
        consumed = {
            tp for tp, _, at in journal(group, other).processed() if killed_at <= at <= settled_at
        }
        assert consumed == set(before[other]), f"{other} paused during the restart"


def test_a_rolling_restart_in_a_new_pod_moves_nothing(group: demo.LocalGroup) -> None:
    """SIGTERM: the member commits and leaves temporarily (epoch -2); its successor pod, a
    new member with the same instance id, inherits the partitions."""
    wait_members_hold(group)
    before = group.ownership()
    stopped_at = time.time()
    assert group.stop_member("member-2") == 0
    group.start_member("member-2", same_pod=False)
    back_at = wait_for_restart(group, "member-2")
    group.wait_settled(BASE, timeout=20)

    assert group.ownership() == before
    for other in BASE - {"member-2"}:
        assert changes_after(group, other, stopped_at) == [], f"{other} was rebalanced"
    # The successor resumes from what its predecessor committed on the way out: the first
    # offset it processes on each partition directly follows the predecessor's last one.
    # Settled means assigned, not yet fetched: wait until every partition shows a message.
    deadline = time.monotonic() + 20
    while True:
        events = journal(group, "member-2")
        last_before = {tp: o for tp, o, at in events.processed() if at < back_at}
        first_after: dict[Partition, int] = {}
        for tp, offset, at in events.processed():
            if at >= back_at and tp not in first_after:
                first_after[tp] = offset
        if first_after.keys() == before["member-2"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert first_after.keys() == before["member-2"]
    for tp, offset in first_after.items():
        assert offset == last_before[tp] + 1, f"{tp}: resumed at {offset}"


def test_a_joining_member_takes_only_its_share(group: demo.LocalGroup) -> None:
    before = group.ownership()
    joined_at = time.time()
    group.start_member("member-3")
    group.wait_settled(BASE | {"member-3"}, timeout=20)
    after = group.ownership()

    moved = {tp for instance, owned in before.items() for tp in owned - after[instance]}
    # 12 partitions over 4 members: exactly 3 change hands, all to the newcomer.
    assert len(moved) == 3
    assert after["member-3"] == moved
    assert all(len(owned) == 3 for owned in after.values())
    revoked = [
        tp
        for instance in BASE
        for at, partitions in journal(group, instance).changes("revoked")
        if at >= joined_at
        for tp in partitions
    ]
    assert sorted(revoked) == sorted(moved)


def test_kgo_describe_prints_the_group(group: demo.LocalGroup) -> None:
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "kafka_group_operator",
            "describe",
            group.group,
            "--coordinator",
            group.coordinator_url,
            "--token",
            group.token,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    owned = group.ownership()
    assert printed.startswith(f"group {group.group}  state Stable")
    for instance, partitions in owned.items():
        row = next(line for line in printed.splitlines() if line.startswith(instance))
        assert f" {len(partitions)} " in row
        assert common.compact_partitions({group.topic: [p for _, p in partitions]}) in row


def test_compact_partitions() -> None:
    assert common.compact_partitions({"t": [5, 0, 1, 2, 7, 8]}) == "t[0-2,5,7-8]"
    assert common.compact_partitions({}) == "-"


def test_a_permanent_leave_moves_its_partitions_at_once(group: demo.LocalGroup) -> None:
    leaver = group.ownership()["member-3"]
    group.stop_member("member-3", permanent=True)
    # Well inside the session timeout: nobody waits for the leaver to expire.
    seconds = group.wait_settled(BASE, timeout=20)
    assert seconds < group.session_timeout_ms / 1000 / 2
    after = group.ownership()
    assert sorted(tp for owned in after.values() for tp in owned) == sorted(
        (group.topic, p) for p in range(group.partitions)
    )
    assert all(len(owned) == 4 for owned in after.values())
    assert leaver <= frozenset().union(*after.values())


def state_records(group: demo.LocalGroup) -> list[records.Record]:
    """The coordinator's state-topic records up to now, in log order per partition.

    Members keep committing, so the log never goes quiet; a partition is read up to the
    first record written after the reading began (the broker's high watermark is not
    trusted, see ``embedded.broker``).
    """
    assert group.broker is not None
    consumer = Consumer({"bootstrap.servers": group.broker.bootstrap, "group.id": "reader"})
    topic = f"{group.group}.group-state"
    decoded: list[records.Record] = []
    started_ms = time.time() * 1000
    try:
        for partition in range(group.state_partitions):
            consumer.assign([TopicPartition(topic, partition, 0)])
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 1.5:
                message = consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                if message.timestamp()[1] > started_ms:
                    break
                idle_since = time.monotonic()
                decoded.append(codec.decode_record(message.key() or b"", message.value()))
    finally:
        consumer.close()
    return decoded


def test_no_partition_is_ever_owned_by_two_members(group: demo.LocalGroup) -> None:
    """Replays the coordinator's member-assignment records, checking every intermediate state.

    A partition belongs to a member from the record that assigns it until the record that
    no longer lists it, pending revocation included: until the member confirms the release,
    the coordinator must not give it to anybody else.
    """
    held: dict[str, set[Partition]] = {}
    names: dict[uuid.UUID, str] = {}
    checked = 0
    for record in state_records(group):
        key, value = record.key, record.value
        if isinstance(value, records.ConsumerGroupPartitionMetadataValue):
            names.update({topic.topic_id: topic.topic_name for topic in value.topics})
        if not isinstance(key, records.ConsumerGroupCurrentMemberAssignmentKey):
            continue
        if key.group_id != group.group:
            continue
        if value is None:
            held.pop(key.member_id, None)
            continue
        assert isinstance(value, records.ConsumerGroupCurrentMemberAssignmentValue)
        held[key.member_id] = {
            (names.get(tps.topic_id, str(tps.topic_id)), p)
            for tps in (*value.assigned_partitions, *value.partitions_pending_revocation)
            for p in tps.partitions
        }
        owners: dict[Partition, str] = {}
        for member, partitions in held.items():
            for tp in partitions:
                assert tp not in owners, f"{tp} owned by {owners[tp]} and {member} at once"
                owners[tp] = member
        checked += 1
    # Joins, a restart and a leave happened: many assignment changes were checked.
    assert checked >= 10


def test_every_produced_offset_is_processed_and_none_skipped(
    group: demo.LocalGroup, producer: demo.Producer
) -> None:
    producer.stop()
    produced = dict(producer.produced)
    assert sum(produced.values()) > 1000
    deadline = time.monotonic() + 30
    while True:
        processed: dict[int, set[int]] = {p: set() for p in range(group.partitions)}
        for instance in BASE | {"member-3"}:
            for (_, partition), offset, _ in journal(group, instance).processed():
                processed[partition].add(offset)
        missing = {p: end - len(processed[p] & set(range(end))) for p, end in produced.items()}
        if not any(missing.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(missing.values()), f"offsets never processed, per partition: {missing}"
    # Nothing beyond what was produced, and nothing out of thin air.
    assert all(max(processed[p]) == end - 1 for p, end in produced.items())
