"""The state topic replicated three ways on an Apache Kafka cluster (``min.insync.replicas=2``).

A state partition's leader killed while members commit: no acknowledged commit is lost, the
coordinator serves again once Kafka has elected a new leader, and a second coordinator still
fences the first. Two nodes down, below ``min.insync.replicas``: every commit fails with a
retriable error and none is acknowledged or applied. Nodes stopped here are started again
before each test ends, so the next test finds three.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka.admin import AdminClient

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import kafka
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning
from tests.runtime import logs
from tests.support import groups

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PARTITIONS = 2


def config_for(cluster: kafka.KafkaCluster) -> coordinator_runtime.RuntimeConfig:
    return coordinator_runtime.RuntimeConfig(
        bootstrap_servers=cluster.bootstrap,
        topic=logs.unique_topic("replicated"),
        partitions=PARTITIONS,
        replication_factor=3,
        min_insync_replicas=2,
        write_timeout_ms=3000,
        metadata_interval_ms=300,
    )


def commit(group: str, offset: int) -> messages.OffsetCommitRequest:
    return messages.OffsetCommitRequest(
        group_id=group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={("t", 0): messages.CommitOffset(offset)},
    )


async def stored(runtime: coordinator_runtime.CoordinatorRuntime, group: str) -> int | None:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    found = fetched.offsets.get(("t", 0))
    return None if found is None else found.offset


def replicas_of(cluster: kafka.KafkaCluster, topic: str, partition: int) -> tuple[int, list[int]]:
    """(leader, replicas) of one partition, as the cluster's metadata says now."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    described = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition]
    return described.leader, list(described.replicas)


def restore(cluster: kafka.KafkaCluster) -> None:
    """Every node running again, the next test's starting point."""
    for node in cluster.nodes:
        if not node.alive():
            cluster.start_node(node.node_id)


async def test_a_leader_killed_while_members_commit_loses_no_acknowledged_commit(
    kafka_cluster: kafka.KafkaCluster,
) -> None:
    config = config_for(kafka_cluster)
    group_ids = [f"g{index}" for index in range(6)]
    assert {partitioning.partition_for(g, PARTITIONS) for g in group_ids} == {0, 1}
    acknowledged: dict[str, int] = {}
    attempted: dict[str, set[int]] = {g: set() for g in group_ids}
    after_kill: dict[str, int] = dict.fromkeys(group_ids, 0)
    failures: list[errors.CoordinatorError] = []
    killed_at: float | None = None
    first_ack_after_kill: dict[str, float] = {}
    stop = asyncio.Event()
    first = coordinator_runtime.CoordinatorRuntime(config)
    await asyncio.wait_for(first.start(), 120)
    victim, replicas = replicas_of(kafka_cluster, config.topic, 0)
    assert len(replicas) == 3

    async def committer(group: str) -> None:
        offset = 0
        while not stop.is_set():
            offset += 1
            attempted[group].add(offset)
            try:
                await first.commit_offsets(commit(group, offset))
            except errors.CoordinatorError as error:
                failures.append(error)
                await asyncio.sleep(0.1)
                continue
            acknowledged[group] = offset
            if killed_at is not None:
                after_kill[group] += 1
                first_ack_after_kill.setdefault(group, time.monotonic() - killed_at)
            await asyncio.sleep(0.01)

    try:
        committers = asyncio.gather(*(committer(g) for g in group_ids))
        deadline = time.monotonic() + 120
        while len(acknowledged) < len(group_ids) or min(acknowledged.values()) < 3:
            assert time.monotonic() < deadline, f"commits never got going: {acknowledged}"
            await asyncio.sleep(0.1)
        await asyncio.to_thread(kafka_cluster.kill_node, victim)
        killed_at = time.monotonic()
        # Served again: every group has commits acknowledged after the kill.
        deadline = time.monotonic() + 120
        while min(after_kill.values()) < 5:
            assert time.monotonic() < deadline, (
                f"not served again after node {victim} died: {after_kill}; {failures[-3:]}"
            )
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(committers, 60)
        new_leader, _ = replicas_of(kafka_cluster, config.topic, 0)
        assert new_leader != victim
        # Whatever failed during the election failed retriably.
        assert all(error.retriable for error in failures), failures

        # Fencing is intact on the new leaders: a second coordinator takes every partition
        # and the first acknowledges nothing more.
        second = coordinator_runtime.CoordinatorRuntime(config)
        await asyncio.wait_for(second.start(), 120)
        try:
            for group in group_ids:
                with pytest.raises(errors.NotCoordinator):
                    await first.commit_offsets(commit(group, 1_000_000))
                assert await stored(second, group) in attempted[group]
                assert await stored(second, group) >= acknowledged[group]
        finally:
            await second.stop()
    finally:
        stop.set()
        await first.stop()
        await asyncio.to_thread(restore, kafka_cluster)

    async with groups.running(config) as reloaded:
        for group in group_ids:
            found = await stored(reloaded, group)
            assert found is not None
            # Every acknowledged commit is there; one whose outcome was unknown may be too.
            assert found >= acknowledged[group], group
            assert found in attempted[group]
    on_victim = [g for g in group_ids if partitioning.partition_for(g, PARTITIONS) == 0]
    print(
        f"node {victim} (leader of state partition 0) killed: first commit acknowledged again "
        f"after {max(first_ack_after_kill[g] for g in on_victim):.2f}s, "
        f"{len(failures)} retriable failures meanwhile"
    )


async def test_below_min_insync_replicas_nothing_is_acknowledged(
    kafka_cluster: kafka.KafkaCluster,
) -> None:
    config = config_for(kafka_cluster)
    group = groups.group_on(0, PARTITIONS)
    async with groups.running(config) as runtime:
        await runtime.commit_offsets(commit(group, 1))
        leader, replicas = replicas_of(kafka_cluster, config.topic, 0)
        followers = [node for node in replicas if node != leader]
        try:
            for node in followers:
                await asyncio.to_thread(kafka_cluster.kill_node, node)
            refusals: list[errors.CoordinatorError] = []
            for offset in (2, 3, 4):
                with pytest.raises(errors.CoordinatorError) as raised:
                    await asyncio.wait_for(runtime.commit_offsets(commit(group, offset)), 60)
                refusals.append(raised.value)
            assert all(error.retriable for error in refusals), refusals
        finally:
            await asyncio.to_thread(restore, kafka_cluster)
        # Back above min.insync.replicas: served again, and none of the refused commits
        # was applied.
        deadline = time.monotonic() + 120
        late: list[errors.CoordinatorError] = []
        while True:
            try:
                assert await stored(runtime, group) == 1
                await runtime.commit_offsets(commit(group, 5))
                break
            except errors.CoordinatorError as error:
                late.append(error)
            assert time.monotonic() < deadline, f"never served again: {late[-1:]}"
            await asyncio.sleep(0.2)
        assert all(error.retriable for error in late), late
    async with groups.running(config) as reloaded:
        assert await stored(reloaded, group) == 5


def test_the_cluster_has_three_brokers(kafka_cluster: kafka.KafkaCluster) -> None:
    """The cluster this module runs on: three brokers, new topics replicated three ways."""
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
