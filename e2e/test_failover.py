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
the signal) are printed, one JSON line per failover.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from e2e import groups
from e2e.conftest import (
    OPERATOR,
    OPERATOR_NAMESPACE,
    WAIT_S,
    Cluster,
    budget,
    get,
    known_token_issue,
    run,
    wait_for,
)
from kafka_group_records import codec, partitioning, records

STATE_TOPIC = "kafka-group-operator.group-state"  # the chart's stateTopic.name
STATE_PARTITIONS = 50  # the chart's stateTopic.partitions
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


def _held_again(partition: int, since: float) -> tuple[str, float] | None:
    """The partition's holder and since when it holds it, once a live replica renewed it
    after ``since``: another replica that took it over, or the restarted one resuming it."""
    spec = _lease(partition)["spec"]
    if _micro(spec.get("renewTime")) <= since or not spec.get("holderIdentity"):
        return None
    acquired = _micro(spec.get("acquireTime"))
    return str(spec["holderIdentity"]), acquired if acquired > since else _micro(spec["renewTime"])


def _operator_restarts(pod: str) -> int:
    status = get("pod", pod, OPERATOR_NAMESPACE)["status"]
    return int(status["containerStatuses"][0]["restartCount"])


def _all_committing_since(namespace: str, instant: float) -> dict[str, list[dict[str, Any]]] | None:
    """The members' events, once each saw a commit acknowledged after ``instant``."""
    found = _member_events(namespace)
    return found if all(_first_commit_after(found[pod], instant) for pod in MEMBERS) else None


def _restarts(namespace: str) -> dict[str, int]:
    listed = json.loads(run("kubectl", "get", "pods", "-n", namespace, "-o", "json"))["items"]
    return {
        pod["metadata"]["name"]: status["restartCount"]
        for pod in listed
        for status in pod["status"].get("containerStatuses") or []
        if status["restartCount"]
    }


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
    assert _restarts(namespace) == {}
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
    cluster: Cluster, known_groups: dict[str, groups.KnownGroup]
) -> None:
    group = known_groups["failover"]
    namespace, topic, gid = group.namespace, group.topic, group.group_id
    with known_token_issue(cluster, namespace), known_failover_issue(namespace):
        groups.start(group, len(MEMBERS))
        state_partition = partitioning.partition_for(gid, STATE_PARTITIONS)
        with Stream(cluster.bootstrap, topic) as stream:
            _wait_first_commits(cluster, namespace, gid)
            before = {"at": time.time(), **groups.read_group(cluster, namespace, "orders", gid)}
            for number, signum in enumerate(SIGNALS):
                wait_for(
                    lambda: groups.replicas_ready() and groups.spread(),
                    "every replica serving its share",
                )
                holder = _lease(state_partition)["spec"]["holderIdentity"]
                restarts = _operator_restarts(holder)
                pid = cluster.container_pid(OPERATOR_NAMESPACE, holder, "operator")
                signalled = time.time()
                os.kill(pid, signum)
                new_holder, held_since = wait_for(
                    lambda signalled=signalled: _held_again(state_partition, signalled),
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
                    pod: round(
                        float(_first_commit_after(found[pod], signalled) or 0) - signalled, 2
                    )
                    for pod in MEMBERS
                }
                figure = {
                    "failover": number + 1,
                    "signal": signal.Signals(signum).name,
                    "replica": holder,
                    "next_holder": new_holder,
                    "partition_held_again_after_s": round(held_since - signalled, 2),
                    "members_first_acknowledged_commit_after_s": served,
                }
                print(json.dumps(figure), flush=True)
            produced = stream.stop()
        counts = _check_nothing_lost_or_moved(cluster, namespace, gid, before, produced)
        print(json.dumps({"produced": produced, **counts}), flush=True)
        run(
            "kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s"
        )


def _wait_first_commits(cluster: Cluster, namespace: str, gid: str) -> None:
    wait_for(
        lambda: sum(groups.read_group(cluster, namespace, "orders", gid)["offsets"].values()) > 0,
        "first commits",
        every=2,
    )


# Issue 22, item 2: with the chart's 15 s Leases a group is served again 15-21 s after its
# coordinator dies; members drop their partitions after sessionTimeout/2 (22.5 s) without a
# successful heartbeat, and one retrying with back-off may pass that deadline.
DROPPED = "no successful heartbeat for"


@contextlib.contextmanager
def known_failover_issue(namespace: str) -> Iterator[None]:
    """A failure while a member dropped its partitions for want of a heartbeat during a
    failover is issue 22 item 2's (xfail, with the evidence); any other failure fails."""
    try:
        yield
    except (AssertionError, pytest.fail.Exception) as error:
        dropped = [
            f"{pod}: {line.strip()[:300]}"
            for pod in MEMBERS
            for line in groups.log_text(namespace, pod).splitlines()
            if DROPPED in line
        ]
        if dropped:
            pytest.xfail(
                f"issue 22 item 2 (failover slower than the members' drop deadline): "
                f"{dropped[0]}; the failure: {str(error)[:500]}"
            )
        raise


# Issue 22, item 2: a stopping replica stops answering before its partitions' next holder
# serves them, so members see NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS for seconds.
HEARTBEAT_FAILED = "heartbeat failed"


@budget(waits=16, polls_s=600)
def test_a_rolling_restart_costs_no_heartbeat(
    cluster: Cluster, known_groups: dict[str, groups.KnownGroup]
) -> None:
    group = known_groups["rolling-restart"]
    namespace, topic, gid = group.namespace, group.topic, group.group_id
    with known_token_issue(cluster, namespace), known_failover_issue(namespace):
        groups.start(group, len(MEMBERS))
        with Stream(cluster.bootstrap, topic) as stream:
            _wait_first_commits(cluster, namespace, gid)
            before = {"at": time.time(), **groups.read_group(cluster, namespace, "orders", gid)}
            failed_before = {
                pod: groups.log_text(namespace, pod).count(HEARTBEAT_FAILED) for pod in MEMBERS
            }
            started = time.time()
            groups.restart_replicas()
            print(json.dumps({"rolling_restart_s": round(time.time() - started, 1)}), flush=True)
            produced = stream.stop()
        counts = _check_nothing_lost_or_moved(cluster, namespace, gid, before, produced)
        failed = {
            pod: [
                line
                for line in groups.log_text(namespace, pod).splitlines()
                if HEARTBEAT_FAILED in line
            ][failed_before[pod] :]
            for pod in MEMBERS
        }
        errors = sum(len(lines) for lines in failed.values())
        print(json.dumps({"produced": produced, **counts, "heartbeat_errors": errors}), flush=True)
        run(
            "kubectl", "delete", "cg/orders", "-n", namespace, "--wait=true", f"--timeout={WAIT_S}s"
        )
        if errors:
            first = next(line for lines in failed.values() for line in lines)
            pytest.xfail(
                f"issue 22 item 2 (a stopping replica stops answering before its partitions are "
                f"served elsewhere): {errors} heartbeat errors, first: {first[:300]}"
            )
