"""Partitions taken and given up while the runtime runs, as Leases come and go.

On the embedded broker, with real runtimes: taking a partition fences its previous writer and
loads what it acknowledged; giving it up answers NOT_COORDINATOR at once, including the write
in flight; a partition taken back by the same process gets a writer that was never fenced;
and a runtime whose Lease may have expired acknowledges nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import Any

import pytest

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from tests.runtime import logs
from tests.support import groups

pytestmark = pytest.mark.broker

PARTITIONS = 2
State = coordinator_runtime.PartitionState


def _config(bootstrap: str, name: str) -> coordinator_runtime.RuntimeConfig:
    return coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=name,
        partitions=PARTITIONS,
        write_timeout_ms=5000,
        metadata_interval_ms=500,
        served_partitions=frozenset(),
    )


async def _until_active(runtime: coordinator_runtime.CoordinatorRuntime, group: str) -> None:
    async with asyncio.timeout(30):
        while True:
            if runtime.partition_state(group) is State.ACTIVE:
                return
            await asyncio.sleep(0.02)


async def test_taking_giving_up_and_taking_back_a_partition(
    broker: embedded.EmbeddedBroker,
) -> None:
    name = logs.unique_topic()
    group = groups.group_on(0, PARTITIONS)
    async with (
        groups.running(_config(broker.bootstrap, name)) as a,
        groups.running(_config(broker.bootstrap, name)) as b,
    ):
        assert a.served_partitions == b.served_partitions == []
        a.acquire(0)
        assert a.serving(0)
        assert not a.serving(1)
        # Until its load ends the partition answers "loading", a retriable error.
        with pytest.raises(errors.CoordinatorLoadInProgress):
            await a.commit_offsets(groups.admin_commit(group, 1))
        await _until_active(a, group)
        await a.commit_offsets(groups.admin_commit(group, 1))
        a.release(0)
        assert a.partition_state(group) is State.NOT_SERVED
        with pytest.raises(errors.NotCoordinator):
            await a.commit_offsets(groups.admin_commit(group, 2))
        with pytest.raises(errors.NotCoordinator):
            await a.fetch_offsets(messages.OffsetFetchRequest(group))
        b.acquire(0)
        await _until_active(b, group)
        assert await groups.committed(b, group) == 1
        await b.commit_offsets(groups.admin_commit(group, 3))
        b.release(0)
        # Taken back by the process that gave it up: b's writer fenced a's old one, so a
        # needs a new one (a writer's fencing is sticky); it loads what b acknowledged.
        a.acquire(0)
        await _until_active(a, group)
        assert await groups.committed(a, group) == 3
        await a.commit_offsets(groups.admin_commit(group, 4))
        assert a.served_partitions == [0]
        assert a.unhealthy_partitions() == []
        # And b, taking it again, fences a's second writer: a's next write is refused.
        b.acquire(0)
        await _until_active(b, group)
        assert await groups.committed(b, group) == 4
        with pytest.raises(errors.NotCoordinator):
            await a.commit_offsets(groups.admin_commit(group, 5))
        assert a.partition_state(group) is State.FENCED


@pytest.mark.parametrize("how", ["lease-expired", "lease-lost", "handed-over"])
async def test_a_commit_in_flight_when_the_lease_goes_is_never_acknowledged(
    broker: embedded.EmbeddedBroker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    caplog.set_level(logging.INFO)
    name = logs.unique_topic()
    group = groups.group_on(1, PARTITIONS)
    held: dict[int, bool] = {0: True, 1: True}
    given_up: set[int] = set()
    async with (
        groups.running(_config(broker.bootstrap, name)) as a,
        groups.running(_config(broker.bootstrap, name)) as b,
    ):
        a.lease_check = held.__getitem__
        a.lease_given_up = given_up.__contains__
        a.acquire(1)
        await _until_active(a, group)
        await a.commit_offsets(groups.admin_commit(group, 1))  # acknowledged while the lease holds
        entered, opened = groups.hold_commit_appends(monkeypatch)
        in_flight = asyncio.create_task(a.commit_offsets(groups.admin_commit(group, 2)))
        await asyncio.wait_for(entered.wait(), 10)
        if how == "lease-expired":
            # The renew deadline passed; nobody has told the runtime yet.
            held[1] = False
        elif how == "handed-over":
            # The elector gave the partition up (a stopping replica); its on_lost is still
            # on its way to the runtime's loop.
            held[1] = False
            given_up.add(1)
        else:
            a.release(1)  # the elector's on_lost
        opened.set()
        with pytest.raises(errors.NotCoordinator):
            await asyncio.wait_for(in_flight, 10)
        assert a.partition_state(group) is State.NOT_SERVED
        stopped = [
            r for r in caplog.records if "stopped serving state partition 1" in r.getMessage()
        ]
        if how != "lease-lost":
            # A handover is a choice (INFO); an expiry nobody chose is a WARNING.
            levels = {r.levelno for r in stopped}
            assert levels == {logging.INFO if how == "handed-over" else logging.WARNING}
        # The new holder has every acknowledged commit; the refused one may be there too
        # (the brokers took it), which a client's retry would have made true anyway.
        b.acquire(1)
        await _until_active(b, group)
        assert await groups.committed(b, group) in (1, 2)


async def test_nothing_is_answered_once_the_lease_may_have_expired(
    broker: embedded.EmbeddedBroker,
) -> None:
    name = logs.unique_topic()
    group = groups.group_on(0, PARTITIONS)
    held: dict[int, bool] = {0: True, 1: True}
    async with groups.running(_config(broker.bootstrap, name)) as a:
        a.lease_check = held.__getitem__
        a.acquire(0)
        await _until_active(a, group)
        joined = await a.heartbeat(
            messages.HeartbeatRequest(
                group_id=group, member_id="m1", member_epoch=0, subscribed_topic_names=("t",)
            )
        )
        held[0] = False
        requests: list[Any] = [
            a.heartbeat(
                messages.HeartbeatRequest(
                    group_id=group, member_id="m1", member_epoch=joined.member_epoch
                )
            ),
            a.commit_offsets(groups.admin_commit(group, 7)),
            a.fetch_offsets(messages.OffsetFetchRequest(group)),
            a.describe_group(group),
        ]
        for request in requests:
            with pytest.raises(errors.NotCoordinator):
                await request


async def test_a_partition_fenced_while_its_lease_is_held_here_is_taken_again(
    broker: embedded.EmbeddedBroker,
) -> None:
    """An earlier holder gave the partition up while its writer was still starting; that
    writer finished after the Lease holder's and fenced it. The holder takes the partition
    again (its Lease is the only valid one), fencing the late writer, and serves everything
    it acknowledged; the earlier holder acknowledges nothing."""
    name = logs.unique_topic()
    group = groups.group_on(0, PARTITIONS)
    async with (
        groups.running(_config(broker.bootstrap, name)) as late,
        groups.running(_config(broker.bootstrap, name)) as holder,
    ):
        holder.lease_check = {0: True, 1: False}.__getitem__
        late.lease_check = {0: False, 1: False}.__getitem__
        holder.acquire(0)
        await _until_active(holder, group)
        await holder.commit_offsets(groups.admin_commit(group, 1))
        # The late start: its writer fences the holder's; then the elector gives it up.
        late.acquire(0)
        async with asyncio.timeout(30):
            # Loaded, or fenced already by the holder taking the partition again.
            while True:
                if late.partition_state(group) is not State.LOADING:
                    break
                await asyncio.sleep(0.02)
        late.release(0)
        refused = 0
        async with asyncio.timeout(60):
            while True:
                try:
                    await holder.commit_offsets(groups.admin_commit(group, 2))
                    break
                except (errors.NotCoordinator, errors.CoordinatorLoadInProgress):
                    refused += 1  # fenced, then loading again
                    await asyncio.sleep(0.05)
        assert refused >= 1
        assert holder.partition_state(group) is State.ACTIVE
        assert await groups.committed(holder, group) == 2
        with pytest.raises(errors.NotCoordinator):
            await late.commit_offsets(groups.admin_commit(group, 9))


async def test_two_holders_of_one_partition_back_off_instead_of_taking_turns(
    broker: embedded.EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """Two deployments sharing one state topic both believe they hold its Lease: each fence
    is taken back, but later each time, so they do not reload the partition without end."""
    name = logs.unique_topic()
    group = groups.group_on(0, PARTITIONS)
    async with (
        groups.running(_config(broker.bootstrap, name)) as a,
        groups.running(_config(broker.bootstrap, name)) as b,
    ):
        for runtime in (a, b):
            runtime.lease_check = {0: True, 1: False}.__getitem__
        a.acquire(0)
        await _until_active(a, group)
        b.acquire(0)
        await _until_active(b, group)
        caplog.clear()
        loop = asyncio.get_running_loop()
        until = loop.time() + 60
        offset = 0

        def delays() -> list[float]:
            retakes = [r.getMessage() for r in caplog.records]
            return sorted(
                float(m.split("again in ")[1].split(" s")[0])
                for m in retakes
                if "taking it again in" in m
            )

        # Traffic on both, so each learns of every fence, until each could have retaken twice
        # (how fast depends on the machine: a retake is a producer's start and a load).
        while loop.time() < until and len(delays()) < 4:
            for runtime in (a, b):
                offset += 1
                with contextlib.suppress(errors.CoordinatorError):
                    await runtime.commit_offsets(groups.admin_commit(group, offset))
            await asyncio.sleep(0.05)
        seen = delays()
        assert len(seen) >= 4, seen
        # Each runtime's retakes wait 0.5 s, then 1 s, 2 s, ...: among four or more of the
        # two runtimes', no wait comes more than twice (at a fixed 0.5 s they all would).
        assert all(d in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0) for d in seen), seen
        assert max(collections.Counter(seen).values()) <= 2, seen
