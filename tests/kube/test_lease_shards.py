"""Coordinator shards on partition Leases: the elector drives real runtimes.

Each replica is a ``LeasedShards`` (elector + ``CoordinatorRuntime``) against the Kubernetes
test double and the embedded broker, with a 6 s Lease (renew deadline 4 s, a round every
second): long enough that a loaded machine does not make the Leases churn. Covered: two
replicas racing for one partition, a handover when a second replica comes, a replica
restarted under the same name, and a replica whose renewals fail while a commit is in
flight. No commit any replica acknowledged is ever missing at the next holder.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import lease_shards
from kafka_group_operator.kube import client
from kafka_group_operator.runtime import coordinator_runtime, writer
from kafka_group_records import partitioning
from tests.runtime import logs
from tests.support import kube

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


def _group_on(partition: int, partitions: int) -> str:
    index = 0
    while partitioning.partition_for(f"g{index}", partitions) != partition:
        index += 1
    return f"g{index}"


def _commit(group: str, offset: int) -> messages.OffsetCommitRequest:
    return messages.OffsetCommitRequest(
        group_id=group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={("t", 0): messages.CommitOffset(offset, "")},
    )


async def _fetch(runtime: coordinator_runtime.CoordinatorRuntime, group: str) -> int | None:
    offsets = (await runtime.fetch_offsets(messages.OffsetFetchRequest(group))).offsets
    committed = offsets.get(("t", 0))
    return None if committed is None else committed.offset


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
    group = _group_on(0, 1)
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
                await a.runtime.commit_offsets(_commit(group, offset))
                await asyncio.sleep(0.2)
            assert not b.runtime.serving(0)
        finally:
            watcher.cancel()
        assert both_seen == 0
        with pytest.raises(errors.NotCoordinator):
            await b.runtime.commit_offsets(_commit(group, 99))
        # The loser names the winner, from the Lease it read.
        await _until(lambda: b.directory.owner(group).url is not None)
        owner = b.directory.owner(group)
        assert owner.is_self is False
        assert owner.url == "http://a.kgo:8080"
        assert a.directory.owner(group).is_self
        assert await _fetch(a.runtime, group) == 5


async def test_a_new_replica_gets_its_share_and_groups_keep_their_state(
    api: client.KubeClient, broker: embedded.EmbeddedBroker
) -> None:
    partitions = 4
    group_of = {p: _group_on(p, partitions) for p in range(partitions)}
    topic = logs.unique_topic()
    async with replicas(api, broker.bootstrap, topic, partitions, ["a", "b"], start=["a"]) as made:
        a, b = made["a"], made["b"]
        # Alone, a takes every partition.
        await _until(lambda: all(_active(a, g) for g in group_of.values()))
        for partition, group in group_of.items():
            await a.runtime.commit_offsets(_commit(group, 10 + partition))
        await b.start()
        # a gives up two partitions and b takes them: two each, each served exactly once.
        await _until(
            lambda: len(b.runtime.served_partitions) == 2 and len(a.runtime.served_partitions) == 2
        )
        assert set(a.runtime.served_partitions).isdisjoint(b.runtime.served_partitions)
        for partition, group in group_of.items():
            holder = a if partition in a.runtime.served_partitions else b
            await _until(lambda holder=holder, group=group: _active(holder, group))  # type: ignore[misc]
            assert await _fetch(holder.runtime, group) == 10 + partition
            await holder.runtime.commit_offsets(_commit(group, 20 + partition))
            assert await _fetch(holder.runtime, group) == 20 + partition


async def test_a_replica_restarted_under_the_same_name_takes_its_leases_back(
    api: client.KubeClient, broker: embedded.EmbeddedBroker
) -> None:
    partitions = 2
    topic = logs.unique_topic()
    group_of = {p: _group_on(p, partitions) for p in range(partitions)}
    first = Replica(api, broker.bootstrap, topic, partitions, "a", ["a"])
    await first.start()
    try:
        await _until(lambda: all(_active(first, g) for g in group_of.values()))
        for partition, group in group_of.items():
            await first.runtime.commit_offsets(_commit(group, 5 + partition))
    finally:
        await first.crash()
    # Its Leases still name "a" and have not expired: nobody else could take them for 6 s,
    # but "a" itself takes them back at once, fences the old writers and loads.
    again = Replica(api, broker.bootstrap, topic, partitions, "a", ["a"])
    await again.start()
    try:
        await _until(lambda: all(_active(again, g) for g in group_of.values()))
        for partition, group in group_of.items():
            assert await _fetch(again.runtime, group) == 5 + partition
    finally:
        await again.stop()


async def test_renewals_failing_while_a_commit_is_in_flight(
    api: client.KubeClient,
    kmock: kube.ApiServer,
    broker: embedded.EmbeddedBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _group_on(0, 1)
    topic = logs.unique_topic()
    async with replicas(api, broker.bootstrap, topic, 1, ["a", "b"], start=["a"]) as made:
        a, b = made["a"], made["b"]
        await _until(lambda: _active(a, group))
        acknowledged = 0
        for offset in (1, 2, 3):
            await a.runtime.commit_offsets(_commit(group, offset))
            acknowledged = offset
        # The next commit's append is held until the renewals have failed.
        entered, opened = asyncio.Event(), asyncio.Event()
        original = writer.StateWriter.append

        async def slow_append(
            state_writer: writer.StateWriter,
            partition: int,
            batch: Sequence[writer.EncodedRecord],
        ) -> int:
            if any(key[:2] == b"\x00\x01" for key, _ in batch):
                entered.set()
                await opened.wait()
            return await original(state_writer, partition, batch)

        monkeypatch.setattr(writer.StateWriter, "append", slow_append)
        in_flight = asyncio.create_task(a.runtime.commit_offsets(_commit(group, 4)))
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
        assert await _fetch(b.runtime, group) in (acknowledged, 4)
