"""OffsetDelete in the coordinator core: Kafka's ``OffsetMetadataManager#deleteOffsets``.

Exact responses and records; replaying the records (live and from scratch) is what removes
the offsets.
"""

from __future__ import annotations

import pytest

from kafka_group_operator.coordinator import errors, messages, records, result, timers
from kafka_group_records import records as schema
from tests.coordinator.harness import GROUP, TOPIC, Harness, parts

OTHER = "audit"
DAY_MS = 24 * 3600 * 1000


def delete(
    harness: Harness, *partitions: tuple[str, int], group: str = GROUP
) -> result.Result[messages.OffsetDeleteResponse]:
    return harness.apply(
        harness.shard.delete_offsets(
            messages.OffsetDeleteRequest(group, partitions), harness.now_ms
        )
    )


def committed(harness: Harness) -> dict[tuple[str, int], int]:
    fetched = harness.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP))
    return {tp: offset.offset for tp, offset in fetched.offsets.items()}


def admin_commit(harness: Harness, offsets: dict[tuple[str, int], int]) -> None:
    outcome = harness.apply(
        harness.shard.commit_offsets(
            messages.OffsetCommitRequest(
                GROUP,
                "",
                messages.LEAVE_EPOCH,
                {tp: messages.CommitOffset(o) for tp, o in offsets.items()},
            ),
            harness.now_ms,
        )
    )
    assert outcome.response.errors == {}


def member_of(topics: tuple[str, ...], earlier: dict[tuple[str, int], int]) -> Harness:
    """``earlier`` committed while the group had no member, then m0 alone in the group,
    subscribed to ``topics``, owning every partition of TOPIC."""
    harness = Harness()
    harness.topics({TOPIC: 2, OTHER: 2})
    admin_commit(harness, earlier)
    harness.configure(assignor="range", offsets_retention_ms=DAY_MS)
    harness.heartbeat("m0", 0, topics=topics)
    harness.heartbeat("m0", 1, owned=parts(0, 1) if TOPIC in topics else {})
    return harness


def test_a_member_less_group_loses_exactly_the_named_offsets() -> None:
    harness = Harness()
    admin_commit(harness, {(TOPIC, 0): 5, (TOPIC, 1): 7, (OTHER, 0): 3})
    outcome = delete(harness, (TOPIC, 1), (OTHER, 0), (OTHER, 9))
    assert outcome.response == messages.OffsetDeleteResponse({})
    # A partition with nothing committed is answered without error and writes nothing.
    assert outcome.records == [
        records.new_offset_commit_tombstone(GROUP, OTHER, 0),
        records.new_offset_commit_tombstone(GROUP, TOPIC, 1),
    ]
    assert committed(harness) == {(TOPIC, 0): 5}
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_the_last_offset_deleted_leaves_no_group() -> None:
    harness = Harness()
    admin_commit(harness, {(TOPIC, 0): 5})
    delete(harness, (TOPIC, 0))
    assert harness.shard.list_groups() == []
    # Nothing is left to expire: the retention timer is disarmed by the replay.
    assert timers.retention_key(GROUP) not in harness.shard.armed_timers()
    with pytest.raises(errors.GroupIdNotFound):
        delete(harness, (TOPIC, 0))


def test_an_unknown_group_is_group_id_not_found() -> None:
    harness = Harness()
    with pytest.raises(errors.GroupIdNotFound) as refused:
        delete(harness, (TOPIC, 0))
    assert (refused.value.code, refused.value.name) == (69, "GROUP_ID_NOT_FOUND")
    with pytest.raises(errors.InvalidGroupId) as empty:
        delete(harness, (TOPIC, 0), group="")
    assert empty.value.code == 24


def test_subscribed_topics_are_refused_per_partition_others_deleted() -> None:
    harness = member_of((TOPIC,), {(OTHER, 1): 4})
    harness.commit("m0", 1, {(TOPIC, 0): 10})
    outcome = delete(harness, (TOPIC, 0), (TOPIC, 1), (OTHER, 1))
    # Kafka's GROUP_SUBSCRIBED_TO_TOPIC is error 86.
    assert outcome.response.errors == {
        (TOPIC, 0): "GROUP_SUBSCRIBED_TO_TOPIC",
        (TOPIC, 1): "GROUP_SUBSCRIBED_TO_TOPIC",
    }
    assert outcome.records == [records.new_offset_commit_tombstone(GROUP, OTHER, 1)]
    assert committed(harness) == {(TOPIC, 0): 10}


def test_once_the_members_leave_the_topic_may_be_deleted() -> None:
    harness = member_of((TOPIC,), {})
    harness.commit("m0", 1, {(TOPIC, 0): 10})
    harness.heartbeat("m0", messages.LEAVE_EPOCH)
    outcome = delete(harness, (TOPIC, 0))
    assert outcome.response.errors == {}
    assert outcome.records == [records.new_offset_commit_tombstone(GROUP, TOPIC, 0)]
    assert committed(harness) == {}
    # The group's own records stay: OffsetDelete touches offsets only.
    assert GROUP in harness.shard.list_groups()
    assert isinstance(harness.log[-1].key, schema.OffsetCommitKey)
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()
