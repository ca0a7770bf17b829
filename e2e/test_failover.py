"""Coordinator failover on a real control plane: the chart's three replicas, the one
coordinating a consuming group (the holder of its state partition's Lease) SIGKILLed three
times and SIGTERMed once, then every replica restarted by a rolling restart, while the group's
two members consume a topic that keeps receiving messages.

The members' own accounts (``support/consumer.py``: every acknowledged commit, every assigned,
revoked and lost partition, every processed message) are held to:

* 0 commits lost: every commit a member saw acknowledged is an offset record in the state
  topic (counted one by one), and the group goes on to commit every message produced;
* 0 partitions moved: the assignment and the group epoch are the same after as before, and no
  member revoked or lost a partition or processed a message twice;
* 0 member crashes: no consumer container restarted.

The figures (time to the new Lease holder, to each member's first acknowledged commit after
the signal, each member's longest time between two acknowledged commits) are printed, one JSON
line per failover and one for the rolling restart.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from e2e import groups
from e2e.conftest import (
    OPERATOR,
    OPERATOR_NAMESPACE,
    WAIT_S,
    Cluster,
    budget,
    get,
    run,
    wait_for,
)
from kafka_group_records import codec, partitioning, records

STATE_TOPIC = "kafka-group-operator.group-state"  # the chart's stateTopic.name
STATE_PARTITIONS = 50  # the chart's stateTopic.partitions
# A member drops its partitions after half its session timeout without a successful
# heartbeat (the group's sessionTimeoutSeconds: the example's, 45 s).
DROP_AFTER_S = 45 / 2
PARTITIONS = 4
MEMBERS = ["orders-0", "orders-1"]
SIGNALS = (signal.SIGKILL, signal.SIGKILL, signal.SIGKILL, signal.SIGTERM)


class Stream:
    """A producer thread: one message every 20 ms until ``stop()``; how many it produced."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.produced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        while not self._stop.is_set():
            index = self.produced
            producer.produce(
                self.topic,
                f"word{index % 7} message {index}".encode(),
                partition=index % PARTITIONS,
            )
            self.produced += 1
            producer.poll(0)
            self._stop.wait(0.02)
        assert producer.flush(60) == 0

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(90)
        return self.produced

    def __exit__(self, *_: object) -> None:
        self.stop()


def _lease(partition: int) -> dict[str, Any]:
    return get("lease", f"{OPERATOR}-partition-{partition}", OPERATOR_NAMESPACE)


def _micro(text: str | None) -> float:
    """A Lease's MicroTime, in seconds since the epoch (0 when unset)."""
    return datetime.datetime.fromisoformat(text).timestamp() if text else 0.0


def _held_again(
    partition: int, since: float, signalled: str, graceful: bool
) -> tuple[str, float] | None:
    """The partition's holder and since when it holds it, once a live replica renewed it
    after ``since``: another replica that took it over, or the restarted one resuming it.
    After a SIGTERM the signalled replica may renew once more before it hands over: its own
    renewals count only for a new acquisition (its restart taking it back)."""
    spec = _lease(partition)["spec"]
    holder = spec.get("holderIdentity")
    if _micro(spec.get("renewTime")) <= since or not holder:
        return None
    acquired = _micro(spec.get("acquireTime"))
    if graceful and holder == signalled and acquired <= since:
        return None
    return str(holder), acquired if acquired > since else _micro(spec["renewTime"])


def _largest_commit_gap(
    found: dict[str, list[dict[str, Any]]], start: float, end: float
) -> dict[str, float]:
    """Each member's longest time between two acknowledged commits within [start, end] (it
    commits every second while messages come): how long its coordinator was not serving it."""
    gaps = {}
    for pod, events in found.items():
        times = sorted(
            e["at"]
            for e in events
            if e["event"] == "committed" and e["offsets"] and start <= e["at"] <= end
        )
        gaps[pod] = round(max((b - a for a, b in itertools.pairwise(times)), default=0.0), 2)
    return gaps


def _operator_restarts(pod: str) -> int:
    status = get("pod", pod, OPERATOR_NAMESPACE)["status"]
    return int(status["containerStatuses"][0]["restartCount"])


def _all_committing_since(namespace: str, instant: float) -> dict[str, list[dict[str, Any]]] | None:
    """The members' events, once each saw a commit acknowledged after ``instant``."""
    found = _member_events(namespace)
    return found if all(_first_commit_after(found[pod], instant) for pod in MEMBERS) else None


def _member_events(namespace: str) -> dict[str, list[dict[str, Any]]]:
    return {pod: groups.events(namespace, pod) for pod in MEMBERS}


def _durable(bootstrap: str, gid: str, wanted: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Which of the ``wanted`` (partition, offset) commits of ``gid`` are offset records in
    the state topic (read committed)."""
    partition = partitioning.partition_for(gid, STATE_PARTITIONS)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "e2e-state-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(STATE_TOPIC, partition, OFFSET_BEGINNING)])
    found: set[tuple[str, int]] = set()
    idle_until = time.monotonic() + 15
    try:
        while time.monotonic() < idle_until and not wanted <= found:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            idle_until = time.monotonic() + 15
            key = message.key()
            if key is None:
                continue
            record = codec.decode_record(key, message.value())
            if isinstance(record.key, records.OffsetCommitKey) and record.key.group == gid:
                value = record.value
                if isinstance(value, records.OffsetCommitValue):
                    found.add((f"{record.key.topic}:{record.key.partition}", value.offset))
    finally:
        consumer.close()
    return wanted & found


def _acknowledged_commits(found: dict[str, list[dict[str, Any]]]) -> set[tuple[str, int]]:
    return {
        (partition, int(offset))
        for events in found.values()
        for event in events
        if event["event"] == "committed"
        for partition, offset in event["offsets"].items()
    }


def _first_commit_after(found: list[dict[str, Any]], instant: float) -> float | None:
    times = [
        e["at"] for e in found if e["event"] == "committed" and e["offsets"] and e["at"] > instant
    ]
    return min(times) if times else None


def _check_nothing_lost_or_moved(
    cluster: Cluster, namespace: str, gid: str, before: dict[str, Any], produced: int
) -> dict[str, int]:
    """The assertions of the module docstring, from ``before`` (the group's view, taken at
    ``before["at"]``) on; the counts."""
    final = wait_for(
        lambda: (
            view
            if sum(
                (view := groups.read_group(cluster, namespace, "orders", gid))["offsets"].values()
            )
            >= produced
            else None
        ),
        f"all {produced} messages committed",
        every=2,
    )
    assert final["assignment"] == before["assignment"]
    assert final["groupEpoch"] == before["groupEpoch"]
    found = _member_events(namespace)
    moved = {
        pod: [e for e in events if e["event"] in ("revoked", "lost") and e["at"] > before["at"]]
        for pod, events in found.items()
    }
    assert moved == {pod: [] for pod in MEMBERS}, moved
    processed = Counter(
        (e["partition"], e["offset"])
        for events in found.values()
        for e in events
        if e["event"] == "processed"
    )
    twice = {key: n for key, n in processed.items() if n > 1}
    assert twice == {}, f"{len(twice)} messages processed more than once"
    restarted = groups.restarted(namespace)
    assert restarted == {}, json.dumps(restarted, indent=1)
    acknowledged = _acknowledged_commits(found)
    durable = _durable(cluster.bootstrap, gid, acknowledged)
    assert acknowledged - durable == set(), (
        f"{len(acknowledged - durable)} acknowledged commits lost"
    )
    return {
        "acknowledged_commits": len(acknowledged),
        "durable": len(durable),
        "processed": len(processed),
    }


@budget(waits=20, polls_s=900)
def test_killed_and_stopped_coordinators_lose_and_move_nothing(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    group = groups.create(cluster, namespace, len(MEMBERS))
    topic, gid = group.topic, group.group_id
    state_partition = partitioning.partition_for(gid, STATE_PARTITIONS)
    with Stream(cluster.bootstrap, topic) as stream:
        _wait_first_commits(cluster, namespace, gid)
        before = {"at": time.time(), **groups.read_group(cluster, namespace, "orders", gid)}
        for number, signum in enumerate(SIGNALS):
            # A Lease can be between holders even then (the restarted replica taking its
            # share back): wait until the group's has one.
            holder = wait_for(
                lambda: (
                    groups.replicas_ready()
                    and groups.spread()
                    and _lease(state_partition)["spec"].get("holderIdentity")
                ),
                "every replica serving its share",
            )
            restarts = _operator_restarts(holder)
            pid = cluster.container_pid(OPERATOR_NAMESPACE, holder, "operator")
            signalled = time.time()
            os.kill(pid, signum)
            graceful = signum == signal.SIGTERM
            new_holder, held_since = wait_for(
                lambda signalled=signalled, holder=holder, graceful=graceful: _held_again(
                    state_partition, signalled, holder, graceful
                ),
                "the group's partition held again",
                every=0.2,
            )
            found = wait_for(
                lambda signalled=signalled: _all_committing_since(namespace, signalled),
                "every member's commits acknowledged again",
            )
            # The signalled replica comes back (the node restarts its container).
            wait_for(
                lambda holder=holder, restarts=restarts: _operator_restarts(holder) > restarts,
                f"{holder} restarted",
            )
            served = {
                pod: round(float(_first_commit_after(found[pod], signalled) or 0) - signalled, 2)
                for pod in MEMBERS
            }
            gaps = _largest_commit_gap(_member_events(namespace), signalled - 5, time.time())
            figure = {
                "failover": number + 1,
                "signal": signal.Signals(signum).name,
                "replica": holder,
                "next_holder": new_holder,
                "partition_held_again_after_s": round(held_since - signalled, 2),
                "members_first_acknowledged_commit_after_s": served,
                "largest_commit_gap_s": gaps,
            }
            print(json.dumps(figure), flush=True)
            assert max(gaps.values()) < DROP_AFTER_S, figure
        produced = stream.stop()
    counts = _check_nothing_lost_or_moved(cluster, namespace, gid, before, produced)
    print(json.dumps({"produced": produced, **counts}), flush=True)
    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")


def _wait_first_commits(cluster: Cluster, namespace: str, gid: str) -> None:
    wait_for(
        lambda: sum(groups.read_group(cluster, namespace, "orders", gid)["offsets"].values()) > 0,
        "first commits",
        every=2,
    )


# A member's line for a heartbeat the coordinator did not answer with success, and the answers
# a handover may give: the stopping replica no longer has the group (NOT_COORDINATOR) and the
# next holder is still loading it past the member API's hold (COORDINATOR_LOAD_IN_PROGRESS: a
# load takes under a second on a quiet machine, several on a loaded one).
HEARTBEAT_FAILED = re.compile(r"heartbeat failed \((\w+)\)")
HANDOVER_ANSWERS = {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"}


@budget(waits=16, polls_s=600)
def test_a_rolling_restart_moves_nothing_and_keeps_the_members_served(
    cluster: Cluster, operator: str, namespace: str
) -> None:
    """A rolling restart of the operator, while the group consumes: nothing lost or moved, no
    member crash (``_check_nothing_lost_or_moved``), and the members' heartbeats meet nothing
    but the handover's retriable answers, each member served again within its drop deadline.
    The count of such answers and the longest gaps are printed: they follow the takeovers'
    loads, hence the machine's load (none at all on a quiet machine)."""
    group = groups.create(cluster, namespace, len(MEMBERS))
    topic, gid = group.topic, group.group_id
    with Stream(cluster.bootstrap, topic) as stream:
        _wait_first_commits(cluster, namespace, gid)
        before = {"at": time.time(), **groups.read_group(cluster, namespace, "orders", gid)}
        started = time.time()
        groups.restart_replicas()
        ended = time.time()
        produced = stream.stop()
    counts = _check_nothing_lost_or_moved(cluster, namespace, gid, before, produced)
    answers = Counter(
        match.group(1)
        for pod in MEMBERS
        for line in groups.log_text(namespace, pod).splitlines()
        if (match := HEARTBEAT_FAILED.search(line)) and _logged_at(line) >= started
    )
    gaps = _largest_commit_gap(_member_events(namespace), started, ended)
    figure = {
        "rolling_restart_s": round(ended - started, 1),
        "produced": produced,
        **counts,
        "heartbeat_errors": sum(answers.values()),
        "heartbeat_answers": dict(answers),
        "largest_commit_gap_s": gaps,
    }
    print(json.dumps(figure), flush=True)
    run("kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s")
    assert set(answers) <= HANDOVER_ANSWERS, answers
    assert max(gaps.values()) < DROP_AFTER_S, gaps


def _logged_at(line: str) -> float:
    """The time of a member's log line (``logging``'s asctime, the machine's local time)."""
    stamp = line[:23]
    try:
        return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return 0.0
