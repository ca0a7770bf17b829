"""Coordinator shards that follow partition Leases: the elector, the runtime and the directory.

Several replicas (the operator's StatefulSet, or ``kgo coordinator --lease-namespace``
processes) share one state topic. Each runs a ``kube.elector.LeaseElector`` over the
partitions' Leases and a ``CoordinatorRuntime`` that serves what the elector holds: the
elector's ``on_acquired`` takes a partition (fence, load, serve), ``on_lost`` gives it up at
once, and the runtime asks the elector's ``holds`` before it acknowledges anything. Who is
alive comes from one Lease per replica (``kube.elector.ReplicaLeases``), so that a replica
holding nothing yet gets its share, and a dead one's partitions are taken over. ``stop``
hands this replica's partitions over (``LeaseElector.hand_over``) before anything else of
the replica stops; the elector's watch on the Leases runs on its thread too.

The elector runs on a thread of its own, with its own event loop and its own API client
(built from the runtime's client's credentials, following kopf's re-logins): members'
requests keep the runtime's loop busy, and a renewal waiting behind them could miss the renew
deadline, losing Leases for no fault. Its callbacks cross back with
``loop.call_soon_threadsafe``, in the order the elector made them. A loss fences at once
whatever the runtime's loop is doing: the runtime asks ``holds`` (a read of the elector's map,
safe from any thread) before acknowledging anything, and ``holds`` is false from the moment
the elector drops the partition, before the callback that stops the partition has run.

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
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka_group_operator.access import discovery
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
    lease_duration_seconds: int = 8
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
    """Runs the elector for ``runtime`` (started, serving no fixed partition) on its own thread.

    ``api`` is the runtime's client: the elector does not use it (its connections belong to
    the runtime's loop) but a client of its own, configured from ``api.credentials`` once
    they are known (kopf may log in after the runtime starts) and again whenever they change.
    """

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
        self._source = api
        self._api = kube_client.KubeClient()
        self.replicas = elector.ReplicaLeases(
            self._api,
            settings.namespace,
            settings.prefix,
            settings.identity,
            settings.replicas,
            settings.lease_duration_seconds,
            clock=clock,
        )
        self.elector = elector.LeaseElector(
            self._api,
            config,
            on_acquired=self._acquired,
            on_lost=self._lost,
            members=self.replicas.alive,
            member_expiries=self.replicas.expiries,
            on_other_lease=self.replicas.saw,
            members_seen=self.replicas.alive_seen,
            settled=lambda partition: not runtime.loading(partition),
            clock=clock,
        )
        runtime.lease_check = self.elector.holds
        runtime.lease_given_up = self.elector.given_up
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the runtime's
        self._elector_loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()  # set on the elector's loop
        self._finished: asyncio.Future[None] | None = None  # resolved on the runtime's loop

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

    # The elector's callbacks, called on its thread: the runtime's loop does the work.

    def _acquired(self, partition: int) -> None:
        self._to_runtime(self._acquire, partition)

    def _lost(self, partition: int, why: str, voluntary: bool) -> None:
        # The runtime already refuses to acknowledge anything (``holds`` is false); this
        # stops the partition and fails what is queued.
        def release(index: int) -> None:
            self.runtime.release(index, why, voluntary=voluntary)

        self._to_runtime(release, partition)

    def _acquire(self, partition: int) -> None:
        if not self.elector.holds(partition):
            return  # lost again before the runtime's loop got to it
        try:
            self.runtime.acquire(partition)
        except RuntimeError as error:  # the runtime stopped meanwhile
            logger.info("not taking state partition %d: %s", partition, error)

    def _to_runtime(self, callback: Callable[[int], None], partition: int) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the runtime's loop is closed: nothing to do
            loop.call_soon_threadsafe(callback, partition)

    def start(self) -> None:
        """Start electing, on a thread of its own (call on the runtime's event loop)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._finished = self._loop.create_future()
        self._stopping = asyncio.Event()
        self._elector_loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(self._elector_loop,), name="lease elector", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        """Hand every partition over (``LeaseElector.hand_over``): this replica's own Lease
        released, each partition's released and taken by another replica before this
        returns (at most a Lease duration), this replica's front doors still answering
        ``NOT_COORDINATOR`` with the new holders meanwhile. Call it before they stop."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        assert self._elector_loop is not None
        assert self._finished is not None
        with contextlib.suppress(RuntimeError):  # the thread has ended already
            self._elector_loop.call_soon_threadsafe(self._stopping.set)
        # The partitions' callbacks were queued on this loop before this resolves.
        await asyncio.shield(self._finished)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._elect())
        except Exception:
            logger.exception("the lease elector failed")
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            if self._loop is not None and self._finished is not None:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(_resolve, self._finished)

    async def _elect(self) -> None:
        """On the elector's thread: wait for credentials, elect until stopped, release."""
        period = self.elector.config.retry_period_seconds
        stopping: asyncio.Task[Any] = asyncio.create_task(self._stopping.wait())
        credentials = self._source.credentials
        try:
            while credentials is None:
                done, _ = await asyncio.wait({stopping}, timeout=period)
                if done:
                    return
                credentials = self._source.credentials
            self._api.configure(credentials)
            electing: asyncio.Task[Any] = asyncio.create_task(
                self.elector.run(), name="lease elector"
            )
            watching: asyncio.Task[Any] = asyncio.create_task(
                self.elector.watch(), name="lease watch"
            )
            try:
                while not electing.done():
                    done, _ = await asyncio.wait(
                        {stopping, electing}, timeout=period, return_when=asyncio.FIRST_COMPLETED
                    )
                    if stopping in done:
                        await self._hand_over()
                        break
                    latest = self._source.credentials
                    if latest is not None and latest is not credentials:
                        credentials = latest
                        self._api.configure(credentials)  # kopf logged in again
            finally:
                # Cancelling the elector gives up what it still holds and releases it.
                for task in (watching, electing):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            stopping.cancel()
            await self._api.close()

    async def _hand_over(self) -> None:
        """On the elector's thread: this replica counted gone by the others first (its own
        Lease released), then its partitions handed over."""
        self.elector.stop_taking()
        try:
            await self.replicas.release()
            await self.elector.hand_over(self.settings.lease_duration_seconds)
        except Exception:  # the stop goes on: what is left is released by the elector
            logger.exception("handing the partitions over failed")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
