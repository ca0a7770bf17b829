"""A replica that stops hands its partitions over instead of leaving them to expire.

Three replicas (``LeasedShards`` driving real runtimes, as in ``test_lease_shards``) on the
Kubernetes test double and the embedded broker, with a 30 s Lease: longer than anything
here may take, so that whatever moves, moves by a handover and not by an expiry. One replica
stops as the operator's cleanup stops it: its own Lease is released, then every partition it
held; by the time its ``stop()`` returns, the other two hold each one, and serve their groups
with the state the first left. Giving partitions up by choice is logged at INFO: no warning
of a lost partition in a start, a rebalance or a stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import coordinator_port, lease_shards
from kafka_group_operator.kube import client, leases
from kafka_group_operator.runtime import coordinator_runtime
from tests.runtime import logs
from tests.support import groups, kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

NS = "kgo-system"
PREFIX = "kgo-partition"
LEASES = "coordination.k8s.io/v1/leases"
LEASE_S = 30
PARTITIONS = 6
NAMES = ("a", "b", "c")
State = coordinator_runtime.PartitionState


class Replica:
    def __init__(self, api: client.KubeClient, bootstrap: str, topic: str, identity: str) -> None:
        self.identity = identity
        self.runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=bootstrap,
                topic=topic,
                partitions=PARTITIONS,
                write_timeout_ms=5000,
                metadata_interval_ms=1000,
                served_partitions=frozenset(),
            )
        )
        self.shards = lease_shards.LeasedShards(
            api,
            self.runtime,
            lease_shards.LeaseSettings(
                namespace=NS,
                identity=identity,
                replicas=NAMES,
                prefix=PREFIX,
                url_template="http://{identity}.kgo:8080",
                lease_duration_seconds=LEASE_S,
            ),
        )

    async def start(self) -> None:
        await asyncio.wait_for(self.runtime.start(), 60)
        self.shards.start()

    async def stop(self) -> None:
        await self.shards.stop()
        await self.runtime.stop()


async def _until(condition: Callable[[], bool], seconds: float = 60) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if condition():
                return
            await asyncio.sleep(0.05)


def _holder(kmock: kube.ApiServer, name: str) -> str | None:
    raw = kmock.get(LEASES, NS, name)
    return None if raw is None else raw["spec"].get("holderIdentity")


def _active(replica: Replica, group: str) -> bool:
    return replica.runtime.partition_state(group) is State.ACTIVE


async def test_a_stopping_replica_hands_its_partitions_over(
    kmock: kube.ApiServer, broker: embedded.EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api = client.KubeClient(client.Credentials(server=str(kmock.url)))
    topic = logs.unique_topic()
    made = {name: Replica(api, broker.bootstrap, topic, name) for name in NAMES}
    group_of = {p: groups.group_on(p, PARTITIONS) for p in range(PARTITIONS)}
    try:
        await asyncio.gather(*(replica.start() for replica in made.values()))
        # Two partitions each, each loaded, each replica knowing every holder.
        await _until(
            lambda: all(
                len(r.shards.elector.held) == 2
                and all(r.runtime.serving(p) for p in r.shards.elector.held)
                and all(r.shards.elector.holder(p) for p in range(PARTITIONS))
                for r in made.values()
            )
        )
        for partition, group in group_of.items():
            holder = next(r for r in made.values() if partition in r.shards.elector.held)
            await _until(lambda holder=holder, group=group: _active(holder, group))  # type: ignore[misc]
            # Retried: a takeover at the start may still fence a writer for a moment.
            await coordinator_port.wait_for(
                lambda holder=holder, group=group, partition=partition: (  # type: ignore[misc]
                    holder.runtime.commit_offsets(groups.admin_commit(group, 100 + partition))
                ),
                within=30,
            )

        leaving = made["b"]
        handed = set(leaving.shards.elector.held)
        await leaving.stop()
        survivors = [made["a"], made["c"]]
        # Its own Lease is free: the others count it gone without waiting for an expiry.
        assert _holder(kmock, f"{PREFIX}-replica-1") is None
        # When stop() returned, each partition it held was held by a survivor already.
        for partition in handed:
            assert _holder(kmock, leases.lease_name(PREFIX, partition)) in ("a", "c")
        await _until(lambda: all(len(r.shards.elector.held) == 3 for r in survivors))
        for partition, group in group_of.items():
            holder = next(r for r in survivors if partition in r.shards.elector.held)
            await _until(lambda holder=holder, group=group: _active(holder, group))  # type: ignore[misc]
            assert await groups.committed(holder.runtime, group) == 100 + partition
            # And the survivors name each other as the holders.
            for other in survivors:
                assert other.shards.elector.holder(partition) == holder.identity
    finally:
        await asyncio.gather(*(replica.stop() for replica in made.values()))
        await api.close()

    # A start (with its rebalance) and a stop: every partition given up by choice, at INFO.
    partition_records = [
        r
        for r in caplog.records
        if r.name.startswith("kafka_group_operator") and "partition" in r.getMessage()
    ]
    assert not [r.getMessage() for r in partition_records if r.levelno >= logging.WARNING]
    given_up = [r.getMessage() for r in partition_records if "gave partition" in r.getMessage()]
    assert any("handed over: this replica is stopping" in m for m in given_up), given_up
