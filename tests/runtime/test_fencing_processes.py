"""Two ``kgo coordinator`` processes on one state topic: the newer one fences the older."""

from __future__ import annotations

import uuid

import pytest

from kafka_group_operator.commands import demo
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from tests.support import groups

pytestmark = [pytest.mark.slow, pytest.mark.broker]

# An administrative commit (no member): the group has no members here.
NO_MEMBER, NO_EPOCH = "", messages.LEAVE_EPOCH


async def test_a_second_coordinator_process_fences_the_first(
    broker: embedded.EmbeddedBroker,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    group, topic = f"split-{suffix}", f"split-orders-{suffix}"
    first = demo.LocalGroup(group=group, topic=topic, partitions=2, state_partitions=2)
    second = demo.LocalGroup(
        group=group, topic=topic, partitions=2, state_partitions=2, token=first.token
    )
    tp = (first.topic, 0)
    acknowledged = 0
    try:
        first.start(broker)
        to_first = first.client()
        for offset in range(1, 11):
            to_first.commit(NO_MEMBER, NO_EPOCH, {tp: offset})
            acknowledged = offset
        # The second process loads the same state topic: its writer fences the first's.
        second.broker = broker
        second.start_coordinator()
        to_second = second.client()
        with pytest.raises(errors.NotCoordinator):
            to_first.commit(NO_MEMBER, NO_EPOCH, {tp: 11})
        # Reads too, from then on: the first's memory may be stale.
        with pytest.raises(errors.NotCoordinator):
            to_first.fetch()
        with pytest.raises(errors.NotCoordinator):
            to_first.describe()
        assert to_second.fetch() == {tp: acknowledged}
        for offset in range(12, 17):
            to_second.commit(NO_MEMBER, NO_EPOCH, {tp: offset})
            acknowledged = offset
        with pytest.raises(errors.NotCoordinator):
            to_first.commit(NO_MEMBER, NO_EPOCH, {tp: 100})
        to_first.close()
        to_second.close()
        assert first.coordinator is not None
        assert first.coordinator.poll() is None, "a fenced coordinator keeps running"
    finally:
        second.stop()
        first.stop()
    config = coordinator_runtime.RuntimeConfig(
        broker.bootstrap, topic=first.state_topic, partitions=2
    )
    async with groups.running(config) as reloaded:
        fetched = await reloaded.fetch_offsets(messages.OffsetFetchRequest(first.group))
        assert {key: value.offset for key, value in fetched.offsets.items()} == {tp: acknowledged}
