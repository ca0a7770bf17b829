"""Coordinator shards that follow partition Leases: the elector, the runtime and the directory.

Several replicas (the operator's StatefulSet, or ``kgo coordinator --lease-namespace``
processes) share one state topic. Each runs a ``kube.elector.LeaseElector`` over the
partitions' Leases and a ``CoordinatorRuntime`` that serves what the elector holds: the
elector's ``on_acquired`` takes a partition (fence, load, serve), ``on_lost`` gives it up at
once, and the runtime asks the elector's ``holds`` before it acknowledges anything. Who is
alive comes from one Lease per replica (``kube.elector.ReplicaLeases``), so that a replica
holding nothing yet gets its share, and a dead one's partitions are taken over.

``LeaseDirectory`` answers "who coordinates this group" from the same view: this replica for
the partitions it serves, else the holder the elector last read, as a URL (``url_template``
with ``{identity}``, e.g. ``http://{identity}.kgo-headless:8080``; ``{identity}`` alone when
the identities are URLs). That goes into every ``NOT_COORDINATOR`` answer of the member API.
``kafka_peers`` is its twin for the Kafka-protocol listener (``protocol.peers.LeasePeers``):
FindCoordinator names the holder's listener, its address from the holder's identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kafka_group_operator.api import discovery
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import elector
from kafka_group_operator.protocol import peers
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    """Which Leases, who this replica is among which replicas, and the timing.

    The renew deadline and retry period default to 2/3 and 1/6 of the Lease's duration
    (client-go's 15/10/2 s keep similar ratios), so one setting scales them all.
    """

    namespace: str
    identity: str
    replicas: Sequence[str]
    prefix: str = "kgo-partition"
    url_template: str = "{identity}"
    lease_duration_seconds: int = 15
    renew_deadline_seconds: float | None = None
    retry_period_seconds: float | None = None

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("the Leases need a namespace")
        if self.identity not in self.replicas:
            raise ValueError(
                f"this replica ({self.identity!r}) is not among the replicas {list(self.replicas)}"
            )
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas named twice in {list(self.replicas)}")
        if "{identity}" not in self.url_template:
            raise ValueError(f"the URL template {self.url_template!r} has no {{identity}}")
        if self.lease_duration_seconds < 1:
            raise ValueError("the Lease duration must be at least 1 second")

    def elector_config(self, partitions: int) -> elector.ElectorConfig:
        """The elector's settings; ValueError when the timing breaks client-go's rules."""
        duration = self.lease_duration_seconds
        return elector.ElectorConfig(
            namespace=self.namespace,
            lease_prefix=self.prefix,
            partitions=partitions,
            identity=self.identity,
            lease_duration_seconds=duration,
            renew_deadline_seconds=(
                self.renew_deadline_seconds
                if self.renew_deadline_seconds is not None
                else duration * 2 / 3
            ),
            retry_period_seconds=(
                self.retry_period_seconds if self.retry_period_seconds is not None else duration / 6
            ),
        )

    def url_of(self, identity: str) -> str:
        return self.url_template.replace("{identity}", identity)


@dataclass(frozen=True)
class LeaseDirectory(discovery.Directory):
    """A directory whose served set and owners change with the Leases (see the docstring)."""

    serving: Callable[[int], bool] = field(default=lambda partition: False)
    holder_url: Callable[[int], str | None] = field(default=lambda partition: None)

    def owner(self, group_id: str) -> discovery.Owner:
        partition = partitioning.partition_for(group_id, self.partitions)
        if self.serving(partition):
            return discovery.Owner(partition, self.advertised_url, True)
        return discovery.Owner(partition, self.holder_url(partition), False)


class LeasedShards:
    """Runs the elector for ``runtime`` (started, serving no fixed partition)."""

    def __init__(
        self,
        api: kube_client.KubeClient,
        runtime: coordinator_runtime.CoordinatorRuntime,
        settings: LeaseSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if runtime.config.served_partitions != frozenset():
            raise ValueError("a runtime on Leases starts serving no partition of its own")
        self.settings = settings
        self.runtime = runtime
        config = settings.elector_config(runtime.config.partitions)
        self.replicas = elector.ReplicaLeases(
            api,
            settings.namespace,
            settings.prefix,
            settings.identity,
            settings.replicas,
            settings.lease_duration_seconds,
            clock=clock,
        )
        self.elector = elector.LeaseElector(
            api,
            config,
            on_acquired=self._acquired,
            on_lost=self._lost,
            members=self.replicas.alive,
            clock=clock,
        )
        runtime.lease_check = self.elector.holds
        self._task: asyncio.Task[None] | None = None

    def directory(self, advertised_url: str | None = None) -> LeaseDirectory:
        """The member API's directory for this replica (its own URL from the template)."""
        return LeaseDirectory(
            partitions=self.runtime.config.partitions,
            served=frozenset(),
            advertised_url=advertised_url or self.settings.url_of(self.settings.identity),
            serving=self.runtime.serving,
            holder_url=self.holder_url,
        )

    def kafka_peers(self, address_of: Callable[[str], peers.Address]) -> peers.LeasePeers:
        """The Kafka listener's peers for this replica: ``address_of`` gives a replica's
        listener address from its identity (``peers.address_template``); the listener
        advertises this replica's own."""
        return peers.LeasePeers(
            partitions=self.runtime.config.partitions,
            identity=self.settings.identity,
            replicas=tuple(self.settings.replicas),
            address_of=address_of,
            serving=self.runtime.serving,
            holder=self.elector.holder,
        )

    def holder_url(self, partition: int) -> str | None:
        holder = self.elector.holder(partition)
        return None if holder is None else self.settings.url_of(holder)

    def _acquired(self, partition: int) -> None:
        self.runtime.acquire(partition)

    def _lost(self, partition: int) -> None:
        self.runtime.release(partition)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.elector.run(), name="lease elector")

    async def stop(self) -> None:
        """Give every partition up and release its Lease, so that others take it at once."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
