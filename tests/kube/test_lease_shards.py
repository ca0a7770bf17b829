"""Coordinator shards on partition Leases: the elector drives real runtimes.

Each replica is a ``LeasedShards`` (elector + ``CoordinatorRuntime``) against the Kubernetes
test double and the embedded broker, with a 6 s Lease (renew deadline 4 s, a round every
second): long enough that a loaded machine does not make the Leases churn. Covered: two
replicas racing for one partition, a handover when a second replica comes, a replica
restarted under the same name, and a replica whose renewals fail while a commit is in
flight. No commit any replica acknowledged is ever missing at the next holder.

The elector runs on a thread of its own: two tests stall the runtime's event loop (a blocking
call on it) against an API server on a thread of its own too, and check that renewals go on
meanwhile and that a loss fences the runtime before its loop hears of it. Their elector runs
on a clock the stalled test moves forward, so that the stall outlasts the renew deadline
without taking that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import pytest
from kmock._internal import apps

from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import lease_shards
from kafka_group_operator.kube import client, leases
from kafka_group_operator.kube import errors as kube_errors
from kafka_group_operator.runtime import coordinator_runtime
from tests.runtime import logs
from tests.support import groups, kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

NS = "kgo-system"
LEASES = "coordination.k8s.io/v1/leases"
State = coordinator_runtime.PartitionState


@pytest.fixture
async def api(kmock: kube.ApiServer) -> AsyncIterator[client.KubeClient]:
    kube_client = client.KubeClient(client.Credentials(server=str(kmock.url)))
    yield kube_client
    await kube_client.close()


class Replica:
    """One replica: a runtime serving what its elector holds."""

    def __init__(
        self,
        api: client.KubeClient,
        bootstrap: str,
        topic: str,
        partitions: int,
        identity: str,
        replicas: Sequence[str],
    ) -> None:
        self.runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=bootstrap,
                topic=topic,
                partitions=partitions,
                write_timeout_ms=5000,
                metadata_interval_ms=1000,
                served_partitions=frozenset(),
            )
        )
        settings = lease_shards.LeaseSettings(
            namespace=NS,
            identity=identity,
            replicas=tuple(replicas),
            url_template="http://{identity}.kgo:8080",
            lease_duration_seconds=6,
        )
        self.shards = lease_shards.LeasedShards(api, self.runtime, settings)
        self.directory = self.shards.directory()

    async def start(self) -> None:
        await asyncio.wait_for(self.runtime.start(), 60)
        self.shards.start()

    async def stop(self) -> None:
        await self.shards.stop()
        await self.runtime.stop()

    async def crash(self) -> None:
        """Stop as a killed process would: no Lease released, nothing handed over."""

        async def keep_leases() -> None:
            return None

        self.shards.elector.release_all = keep_leases  # type: ignore[method-assign]
        await self.shards.stop()
        await self.runtime.stop()


@contextlib.asynccontextmanager
async def replicas(
    api: client.KubeClient,
    bootstrap: str,
    topic: str,
    partitions: int,
    names: Sequence[str],
    start: Sequence[str] | None = None,
) -> AsyncIterator[dict[str, Replica]]:
    made = {name: Replica(api, bootstrap, topic, partitions, name, names) for name in names}
    started = list(names if start is None else start)
    try:
        await asyncio.gather(*(made[name].start() for name in started))
        yield made
    finally:
        await asyncio.gather(*(replica.stop() for replica in made.values()))


async def _until(condition: Callable[[], bool], seconds: float = 30) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if condition():
                return
            await asyncio.sleep(0.05)


def _active(replica: Replica, group: str) -> bool:
    return replica.runtime.partition_state(group) is State.ACTIVE


async def test_two_replicas_racing_for_one_partition(
    api: client.KubeClient, broker: embedded.EmbeddedBroker
) -> None:
    group = groups.group_on(0, 1)
    async with replicas(api, broker.bootstrap, logs.unique_topic(), 1, ["a", "b"]) as made:
        a, b = made["a"], made["b"]
        both_seen = 0

        async def watch() -> None:
            nonlocal both_seen
            while True:
                both_seen += a.runtime.serving(0) and b.runtime.serving(0)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            # Whoever wins the first race, the partition ends with "a" (rank 0 of two
            # replicas sharing one partition) and stays there.
            await _until(lambda: _active(a, group))
            for offset in range(1, 6):
                await a.runtime.commit_offsets(groups.admin_commit(group, offset))
                await asyncio.sleep(0.2)
            assert not b.runtime.serving(0)
        finally:
            watcher.cancel()
        assert both_seen == 0
        with pytest.raises(errors.NotCoordinator):
            await b.runtime.commit_offsets(groups.admin_commit(group, 99))
        # The loser names the winner, from the Lease it read.
        await _until(lambda: b.directory.owner(group).url is not None)
        owner = b.directory.owner(group)
        assert owner.is_self is False
        assert owner.url == "http://a.kgo:8080"
        assert a.directory.owner(group).is_self
        assert await groups.committed(a.runtime, group) == 5


async def test_a_new_replica_gets_its_share_and_groups_keep_their_state(
    api: client.KubeClient, broker: embedded.EmbeddedBroker
) -> None:
    partitions = 4
    group_of = {p: groups.group_on(p, partitions) for p in range(partitions)}
    topic = logs.unique_topic()
    async with replicas(api, broker.bootstrap, topic, partitions, ["a", "b"], start=["a"]) as made:
        a, b = made["a"], made["b"]
        # Alone, a takes every partition.
        await _until(lambda: all(_active(a, g) for g in group_of.values()))
        for partition, group in group_of.items():
            await a.runtime.commit_offsets(groups.admin_commit(group, 10 + partition))
        await b.start()
        # a gives up two partitions and b takes them: two each, each served exactly once.
        await _until(
            lambda: len(b.runtime.served_partitions) == 2 and len(a.runtime.served_partitions) == 2
        )
        assert set(a.runtime.served_partitions).isdisjoint(b.runtime.served_partitions)
        for partition, group in group_of.items():
            holder = a if partition in a.runtime.served_partitions else b
            await _until(lambda holder=holder, group=group: _active(holder, group))  # type: ignore[misc]
            assert await groups.committed(holder.runtime, group) == 10 + partition
            await holder.runtime.commit_offsets(groups.admin_commit(group, 20 + partition))
            assert await groups.committed(holder.runtime, group) == 20 + partition


async def test_a_replica_restarted_under_the_same_name_takes_its_leases_back(
    api: client.KubeClient, broker: embedded.EmbeddedBroker
) -> None:
    partitions = 2
    topic = logs.unique_topic()
    group_of = {p: groups.group_on(p, partitions) for p in range(partitions)}
    first = Replica(api, broker.bootstrap, topic, partitions, "a", ["a"])
    await first.start()
    try:
        await _until(lambda: all(_active(first, g) for g in group_of.values()))
        for partition, group in group_of.items():
            await first.runtime.commit_offsets(groups.admin_commit(group, 5 + partition))
    finally:
        await first.crash()
    # Its Leases still name "a" and have not expired: nobody else could take them for 6 s,
    # but "a" itself takes them back at once, fences the old writers and loads.
    again = Replica(api, broker.bootstrap, topic, partitions, "a", ["a"])
    await again.start()
    try:
        await _until(lambda: all(_active(again, g) for g in group_of.values()))
        for partition, group in group_of.items():
            assert await groups.committed(again.runtime, group) == 5 + partition
    finally:
        await again.stop()


async def test_renewals_failing_while_a_commit_is_in_flight(
    api: client.KubeClient,
    kmock: kube.ApiServer,
    broker: embedded.EmbeddedBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = groups.group_on(0, 1)
    topic = logs.unique_topic()
    async with replicas(api, broker.bootstrap, topic, 1, ["a", "b"], start=["a"]) as made:
        a, b = made["a"], made["b"]
        await _until(lambda: _active(a, group))
        acknowledged = 0
        for offset in (1, 2, 3):
            await a.runtime.commit_offsets(groups.admin_commit(group, offset))
            acknowledged = offset
        # The next commit's append is held until the renewals have failed.
        entered, opened = groups.hold_commit_appends(monkeypatch)
        in_flight = asyncio.create_task(a.runtime.commit_offsets(groups.admin_commit(group, 4)))
        await asyncio.wait_for(entered.wait(), 10)
        refusal = kmock.reject(LEASES, 500, "etcd is unavailable", action="update")
        await _until(lambda: not a.runtime.serving(0), seconds=10)
        opened.set()
        outcome: int | None
        try:
            await asyncio.wait_for(in_flight, 10)
            outcome = 4
        except errors.NotCoordinator:
            outcome = None
        # Never acknowledged: its renewals failed before the brokers answered.
        assert outcome is None
        kmock.rejections.remove(refusal)
        monkeypatch.undo()
        # a stops, releasing its Lease; b takes the partition and has every acknowledged
        # commit (and maybe the refused one, which the brokers may hold).
        await a.stop()
        await b.start()
        await _until(lambda: _active(b, group))
        assert await groups.committed(b.runtime, group) in (acknowledged, 4)


@contextlib.contextmanager
def api_server_on_its_own_thread() -> Iterator[str]:
    """The Kubernetes test double on a thread and event loop of its own; yields its URL."""
    ready = threading.Event()
    running: dict[str, Any] = {}

    async def serve() -> None:
        async with kube.ApiServer() as server, apps.Server(server) as http:
            running["stop"] = asyncio.Event()
            running["loop"] = asyncio.get_running_loop()
            running["url"] = str(http.url).rstrip("/")
            ready.set()
            await running["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30), "the API server did not start"
    try:
        yield running["url"]
    finally:
        running["loop"].call_soon_threadsafe(running["stop"].set)
        thread.join(30)


class Ahead:
    """``time.monotonic`` plus an offset a test moves forward (read from any thread)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def _stall(until: Callable[[], bool], step: Callable[[], None] = lambda: None) -> None:
    """Block the calling event loop until ``until()``, calling ``step`` as it polls."""
    deadline = time.monotonic() + 30
    while not until():
        assert time.monotonic() < deadline, "the elector did nothing while the loop stalled"
        step()
        time.sleep(0.01)


@contextlib.asynccontextmanager
async def stalled_replica(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[lease_shards.LeasedShards, coordinator_runtime.CoordinatorRuntime, Any]]:
    """One replica on a 3 s Lease (renew deadline 2 s) against a threaded API server, its
    elector on an ``Ahead`` clock, its renewals counted (and failed while ``failing`` is set)."""
    renewals: list[float] = []
    failing = threading.Event()
    renew = leases.renew

    async def counted_renew(api: client.KubeClient, namespace: str, lease: Any) -> Any:
        if failing.is_set():
            raise kube_errors.Unreachable("the API server is away")
        renewed = await renew(api, namespace, lease)
        if lease.name == leases.lease_name(settings.prefix, 0):  # not the replica's own
            renewals.append(time.monotonic())
        return renewed

    monkeypatch.setattr(leases, "renew", counted_renew)
    clock = Ahead()
    settings = lease_shards.LeaseSettings(
        namespace=NS, identity="a", replicas=("a",), lease_duration_seconds=3
    )
    with api_server_on_its_own_thread() as url:
        api = client.KubeClient(client.Credentials(server=url))
        runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=bootstrap,
                topic=logs.unique_topic(),
                partitions=1,
                write_timeout_ms=5000,
                metadata_interval_ms=1000,
                served_partitions=frozenset(),
            )
        )
        shards = lease_shards.LeasedShards(api, runtime, settings, clock=clock)
        await asyncio.wait_for(runtime.start(), 60)
        shards.start()
        try:
            yield shards, runtime, (renewals, failing, clock)
        finally:
            await shards.stop()
            await runtime.stop()
            await api.close()


async def test_renewals_go_on_while_the_runtime_loop_is_stalled(
    broker: embedded.EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = groups.group_on(0, 1)
    async with stalled_replica(broker.bootstrap, monkeypatch) as (shards, runtime, probes):
        renewals, _, clock = probes
        await _until(lambda: runtime.partition_state(group) is State.ACTIVE)
        await runtime.commit_offsets(groups.admin_commit(group, 1))
        deadline = shards.elector.config.renew_deadline_seconds
        # The loop is blocked for three renewals, while the elector's clock moves on by more
        # than the renew deadline: only renewals made meanwhile keep the partition.
        seen = len(renewals)

        def one_renewal_further() -> None:
            nonlocal seen
            if len(renewals) > seen:
                seen = len(renewals)
                clock.offset += deadline * 0.4

        _stall(lambda: clock.offset > deadline, one_renewal_further)
        assert shards.elector.holds(0)
        assert runtime.lease_check is not None
        assert runtime.lease_check(0)
        # Nothing was lost, so the runtime serves on and acknowledges.
        await runtime.commit_offsets(groups.admin_commit(group, 2))
        assert await groups.committed(runtime, group) == 2
        assert runtime.partition_state(group) is State.ACTIVE


async def test_a_loss_fences_the_runtime_before_its_stalled_loop_hears_of_it(
    broker: embedded.EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = groups.group_on(0, 1)
    async with stalled_replica(broker.bootstrap, monkeypatch) as (shards, runtime, probes):
        _, failing, _ = probes
        await _until(lambda: runtime.partition_state(group) is State.ACTIVE)
        await runtime.commit_offsets(groups.admin_commit(group, 1))
        # A commit is on its way to the brokers when the loop stalls and the renewals fail.
        entered, opened = groups.hold_commit_appends(monkeypatch)
        in_flight = asyncio.create_task(runtime.commit_offsets(groups.admin_commit(group, 2)))
        await asyncio.wait_for(entered.wait(), 10)
        failing.set()
        assert runtime.lease_check is not None
        check = runtime.lease_check
        _stall(lambda: not check(0))
        # Fenced while the loop has not run the loss callback: the runtime still counts the
        # partition as its own, and yet may acknowledge nothing of it.
        assert runtime.serving(0)
        assert not shards.elector.holds(0)
        opened.set()
        with pytest.raises(errors.NotCoordinator):
            await asyncio.wait_for(in_flight, 10)
        with pytest.raises(errors.NotCoordinator):
            await runtime.commit_offsets(groups.admin_commit(group, 3))
        assert not runtime.serving(0)
