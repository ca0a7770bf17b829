"""The offset mirror on real brokers: a group's committed offsets reach the brokers' own group
of the same id within the interval, catch up after an outage, and a refusal is visible."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kafka_group_operator.coordinator import messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime, metrics, mirror
from tests.runtime import logs
from tests.support import groups, native_groups

pytestmark = pytest.mark.broker

INTERVAL = 0.5


def _config(bootstrap: str) -> coordinator_runtime.RuntimeConfig:
    return coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=logs.unique_topic(),
        partitions=2,
        write_timeout_ms=3000,
        metadata_interval_ms=500,
    )


def _create_topic(bootstrap: str, partitions: int) -> str:
    name = logs.unique_topic("mirrored")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)
    return name


async def _commit(
    runtime: coordinator_runtime.CoordinatorRuntime,
    group: str,
    offsets: Mapping[tuple[str, int], int],
) -> None:
    response = await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=group,
            member_id="",
            member_epoch=messages.LEAVE_EPOCH,
            offsets={tp: messages.CommitOffset(offset) for tp, offset in offsets.items()},
        )
    )
    assert not response.errors


async def _status_until(
    runtime: coordinator_runtime.CoordinatorRuntime,
    group: str,
    reason: mirror.MirrorReason,
    within: float = 30.0,
) -> mirror.MirrorStatus:
    deadline = time.monotonic() + within
    status = runtime.mirror.status(group)
    while time.monotonic() < deadline:
        status = runtime.mirror.status(group)
        if status is not None and status.reason is reason:
            return status
        await asyncio.sleep(0.1)
    raise AssertionError(f"mirror of {group} is {status}, never {reason}")


async def test_committed_offsets_reach_the_native_group_within_the_interval(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = _create_topic(broker.bootstrap, 3)
    async with groups.running(_config(broker.bootstrap)) as runtime:
        runtime.mirror.configure("mirrored", mirror.MirrorTarget(broker.bootstrap, {}, INTERVAL))
        await _commit(runtime, "mirrored", {(topic, 0): 5, (topic, 1): 7})
        await native_groups.wait_for_offsets(
            broker.bootstrap, "mirrored", {(topic, 0): 5, (topic, 1): 7}
        )
        # Only what changed is sent, and a later commit replaces the mirrored offset.
        await _commit(runtime, "mirrored", {(topic, 1): 9, (topic, 2): 1})
        await native_groups.wait_for_offsets(
            broker.bootstrap, "mirrored", {(topic, 0): 5, (topic, 1): 9, (topic, 2): 1}
        )
        status = await _status_until(runtime, "mirrored", mirror.MirrorReason.CAUGHT_UP)
        assert status.mirrored
        assert status.behind == 0
        assert runtime.mirror.statuses() == {"mirrored": status}
        # A group not configured for mirroring is left alone.
        await _commit(runtime, "unmirrored", {(topic, 0): 3})
        assert runtime.mirror.status("unmirrored") is None
        await asyncio.sleep(4 * INTERVAL)
        assert await asyncio.to_thread(native_groups.offsets, broker.bootstrap, "unmirrored") == {}
        # Stopping the mirror of a group stops its commits to the brokers.
        runtime.mirror.configure("mirrored", None)
        await _commit(runtime, "mirrored", {(topic, 0): 50})
        await asyncio.sleep(4 * INTERVAL)
        assert (await asyncio.to_thread(native_groups.offsets, broker.bootstrap, "mirrored"))[
            (topic, 0)
        ] == 5


async def test_the_mirror_catches_up_after_the_brokers_were_down(
    broker: embedded.EmbeddedBroker, fresh_broker: embedded.EmbeddedBroker
) -> None:
    # The state topic stays up on one cluster; the group's own cluster goes down.
    native = fresh_broker.bootstrap
    topic = _create_topic(native, 2)
    async with groups.running(_config(broker.bootstrap)) as runtime:
        runtime.mirror.configure(
            "outage", mirror.MirrorTarget(native, {}, INTERVAL, request_timeout_seconds=2.0)
        )
        await _commit(runtime, "outage", {(topic, 0): 1})
        await native_groups.wait_for_offsets(native, "outage", {(topic, 0): 1})
        await asyncio.to_thread(fresh_broker.stop)
        try:
            # Commits go on while the mirror cannot: none of them waits for it.
            started = time.monotonic()
            await _commit(runtime, "outage", {(topic, 0): 10, (topic, 1): 20})
            assert time.monotonic() - started < 2.0
            failed = await _status_until(runtime, "outage", mirror.MirrorReason.MIRROR_FAILED)
            assert not failed.mirrored
            assert failed.behind == 2
            assert native in failed.message
        finally:
            await asyncio.to_thread(fresh_broker.start)
        await native_groups.wait_for_offsets(native, "outage", {(topic, 0): 10, (topic, 1): 20})
        caught_up = await _status_until(runtime, "outage", mirror.MirrorReason.CAUGHT_UP)
        assert caught_up.failures == 0


async def test_a_native_group_with_active_members_refuses_and_shows_why(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = _create_topic(broker.bootstrap, 1)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "busy", "session.timeout.ms": 6000}
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            await asyncio.to_thread(consumer.poll, 0.2)
        assert consumer.assignment(), "the native consumer never joined"
        async with groups.running(_config(broker.bootstrap)) as runtime:
            runtime.mirror.configure("busy", mirror.MirrorTarget(broker.bootstrap, {}, INTERVAL))
            await _commit(runtime, "busy", {(topic, 0): 4})
            refused = await _status_until(runtime, "busy", mirror.MirrorReason.MIRROR_FAILED)
            assert "UNKNOWN_MEMBER_ID" in refused.message
            assert "active members" in refused.message
            # The failure is on /metrics too, where an alert sees it.
            scraped = _mirror_metrics(runtime, "busy")
            assert scraped["kgo_offsets_mirrored"] == ("MirrorFailed", 0)
            assert scraped["kgo_offsets_mirror_behind_partitions"] == ("MirrorFailed", 1)
            assert scraped["kgo_offsets_mirror_failures"][1] >= 1
            # Once the native consumer has left, the retry goes through.
            await asyncio.to_thread(consumer.close)
            await _status_until(runtime, "busy", mirror.MirrorReason.CAUGHT_UP, within=60)
            await native_groups.wait_for_offsets(broker.bootstrap, "busy", {(topic, 0): 4})
            assert _mirror_metrics(runtime, "busy") == {
                "kgo_offsets_mirrored": ("CaughtUp", 1),
                "kgo_offsets_mirror_behind_partitions": ("CaughtUp", 0),
                "kgo_offsets_mirror_failures": ("CaughtUp", 0),
            }
    finally:
        consumer.close()


async def test_only_the_coordinator_serving_the_group_mirrors_it(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = _create_topic(broker.bootstrap, 1)
    config = _config(broker.bootstrap)
    async with groups.running(config) as first:
        first.mirror.configure("handed-over", mirror.MirrorTarget(broker.bootstrap, {}, INTERVAL))
        await _commit(first, "handed-over", {(topic, 0): 2})
        await native_groups.wait_for_offsets(broker.bootstrap, "handed-over", {(topic, 0): 2})
        # A second coordinator loads the state topic: its writers fence the first one's,
        # which learns it on its next write.
        async with groups.running(config) as second:
            with pytest.raises(Exception, match=r"another coordinator"):
                await _commit(first, "handed-over", {(topic, 0): 3})
            stopped = await _status_until(first, "handed-over", mirror.MirrorReason.NOT_COORDINATOR)
            assert not stopped.mirrored
            second.mirror.configure(
                "handed-over", mirror.MirrorTarget(broker.bootstrap, {}, INTERVAL)
            )
            await _commit(second, "handed-over", {(topic, 0): 8})
            await native_groups.wait_for_offsets(broker.bootstrap, "handed-over", {(topic, 0): 8})


def _mirror_metrics(
    runtime: coordinator_runtime.CoordinatorRuntime, group_id: str
) -> dict[str, tuple[str, float]]:
    """The mirror's series of one group as scraped: name -> (reason label, value)."""
    text = generate_latest(metrics.registry_for(runtime, "test")).decode()
    return {
        sample.name: (sample.labels["reason"], sample.value)
        for family in text_string_to_metric_families(text)
        if family.name.startswith("kgo_offsets_mirror")
        for sample in family.samples
        if sample.labels.get("group") == group_id
    }
