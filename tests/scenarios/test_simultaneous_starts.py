"""Real processes: two standalone ``kgo coordinator`` processes started at the same moment on
one fresh state topic, with commits going on from the first moment, round after round.

Both load every partition, and each load fences the other's writer where it comes second, so
the two end up splitting the partitions. A coordinator fenced during its start-up load must
stay up and serve what it holds (it once exited, and sometimes both did, leaving no
coordinator at all). At the end of each round: both processes run, every state partition is
served by one of them, and every commit acknowledged to the traffic is in the state topic;
then both stop on SIGTERM within ``commands.coordinator.STOP_GRACE_S``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from kafka_group_operator.commands import coordinator as coordinator_command
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import client
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning
from tests.support import groups as group_support
from tests.support import processes

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.asyncio]

STATE_PARTITIONS = 6
ROUNDS = 5
TOPIC, TOPIC_PARTITION = "orders", ("orders", 0)
# How long a round may take to settle on a loaded machine.
SETTLE_S = 120


def groups_covering(partitions: int, suffix: str) -> list[str]:
    """One group id per state partition."""
    found: dict[int, str] = {}
    number = 0
    while len(found) < partitions:
        group = f"g{number}-{suffix}"
        found.setdefault(partitioning.partition_for(group, partitions), group)
        number += 1
    return [found[p] for p in range(partitions)]


class Traffic:
    """Member-less commits of increasing offsets to every group, each sent to whichever
    coordinator serves the group (the other answers NOT_COORDINATOR or is loading)."""

    def __init__(self, urls: list[str], group_ids: list[str]) -> None:
        self.urls = urls
        self.acknowledged: dict[str, int] = {}
        self.attempted: dict[str, int] = {}
        self.served_by: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._commit, args=(group,), daemon=True) for group in group_ids
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _commit(self, group: str) -> None:
        clients = [client.CoordinatorClient(url, group, None, timeout_s=5) for url in self.urls]
        offset = 0
        try:
            while not self._stop.is_set():
                index = self.served_by.get(group, offset % len(clients))
                self.attempted[group] = offset + 1
                try:
                    failed = clients[index].commit(
                        "", messages.LEAVE_EPOCH, {TOPIC_PARTITION: offset + 1}
                    )
                except (errors.CoordinatorError, OSError):
                    failed = {TOPIC_PARTITION: "unanswered"}
                if failed:
                    self.served_by.pop(group, None)
                    offset += 1  # the next attempt asks the other coordinator
                    self._stop.wait(0.05)
                    continue
                offset += 1
                self.acknowledged[group] = offset
                self.served_by[group] = index
                self._stop.wait(0.02)
        finally:
            for each in clients:
                each.close()


def start_coordinator(
    broker: embedded.EmbeddedBroker, directory: Path, port: int, state_topic: str, name: str
) -> subprocess.Popen[bytes]:
    log = (directory / f"{name}.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable, "-m", "kafka_group_operator", "coordinator",
            "--bootstrap", broker.bootstrap, "--port", str(port),
            "--topic", state_topic, "--state-partitions", str(STATE_PARTITIONS),
            "--groups", str(directory / "groups.json"), "--log-level", "INFO",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def served_groups(urls: list[str], group_ids: list[str]) -> dict[str, list[int]]:
    """Which coordinators answer for each group (the ones serving its state partition)."""
    serving: dict[str, list[int]] = {group: [] for group in group_ids}
    for group in group_ids:
        for index, url in enumerate(urls):
            each = client.CoordinatorClient(url, group, None, timeout_s=5)
            try:
                each.fetch()
            except (
                errors.NotCoordinator,
                errors.CoordinatorNotAvailable,
                # Reloading the partition (a write whose outcome was unknown): not serving
                # now; the caller asks again.
                errors.CoordinatorLoadInProgress,
                OSError,
            ):
                continue
            finally:
                each.close()
            serving[group].append(index)
    return serving


@pytest.mark.parametrize("round_number", range(ROUNDS))
async def test_two_coordinators_started_at_once_both_stay_and_lose_nothing(
    broker: embedded.EmbeddedBroker, tmp_path: Path, round_number: int
) -> None:
    suffix = uuid.uuid4().hex[:6]
    state_topic = f"simultaneous-{suffix}"
    group_ids = groups_covering(STATE_PARTITIONS, suffix)
    (tmp_path / "groups.json").write_text(
        json.dumps({group: {"topics": [TOPIC], "mirrorToKafka": False} for group in group_ids})
    )
    ports = [embedded.free_port(), embedded.free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    traffic = Traffic(urls, group_ids)
    traffic.start()
    started = [
        start_coordinator(broker, tmp_path, port, state_topic, f"coordinator-{index}")
        for index, port in enumerate(ports)
    ]
    try:
        # Settled: every group acknowledged a few commits since, by one coordinator.
        deadline = time.monotonic() + SETTLE_S
        while True:
            exited = [i for i, process in enumerate(started) if process.poll() is not None]
            assert not exited, f"coordinator(s) {exited} exited:\n" + "\n".join(
                (tmp_path / f"coordinator-{i}.log").read_text()[-3000:] for i in exited
            )
            if all(traffic.acknowledged.get(group, 0) >= 20 for group in group_ids):
                break
            assert time.monotonic() < deadline, f"not settled: {traffic.acknowledged}"
            await asyncio.sleep(0.2)
        # Exactly one coordinator answers for each group. Reads alone do not find a fence:
        # one that lost a partition without writing to it since answers reads until its
        # fence check (``fence_check_interval_ms`` after a read) has written a marker.
        while True:
            serving = served_groups(urls, group_ids)
            if all(len(indexes) == 1 for indexes in serving.values()):
                break
            assert time.monotonic() < deadline, f"not one coordinator per group: {serving}"
            await asyncio.sleep(0.5)
        assert all(process.poll() is None for process in started), "a coordinator exited"
    finally:
        traffic.stop()
        stop_seconds = []
        for process in started:
            begun = time.monotonic()
            processes.stop_all([process], timeout=coordinator_command.STOP_GRACE_S + 5)
            stop_seconds.append(time.monotonic() - begun)
    assert [process.returncode for process in started] == [0, 0]
    assert max(stop_seconds) <= coordinator_command.STOP_GRACE_S, stop_seconds
    config = coordinator_runtime.RuntimeConfig(
        broker.bootstrap, topic=state_topic, partitions=STATE_PARTITIONS
    )
    async with group_support.running(config) as reloaded:
        for group in group_ids:
            fetched = await reloaded.fetch_offsets(messages.OffsetFetchRequest(group))
            offset = fetched.offsets[TOPIC_PARTITION].offset
            # Every acknowledged commit is kept; one that failed unseen may have landed too.
            assert traffic.acknowledged[group] <= offset <= traffic.attempted[group], group
