"""Offset commit/fetch validation and retention, with exact responses and records."""

from __future__ import annotations

import pytest

from kafka_group_operator.coordinator import errors, messages, records, result
from kafka_group_records import records as schema
from tests.coordinator.harness import GROUP, TOPIC, Harness, parts

DAY_MS = 24 * 3600 * 1000


def stable_pair() -> Harness:
    """m0 owns events-0..2 and m1 events-3..5, both at epoch 2 (range assignor)."""
    harness = Harness()
    harness.topics({TOPIC: 6})
    harness.configure(assignor="range", offsets_retention_ms=DAY_MS)
    harness.heartbeat("m0", 0, instance_id="g-0")
    harness.heartbeat("m1", 0, instance_id="g-1")
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3, 4, 5))
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2))
    harness.heartbeat("m1", 2, owned={})
    return harness


def commit_record(partition: int, offset: int, now_ms: int) -> object:
    return records.new_offset_commit_record(
        GROUP, TOPIC, partition, messages.CommitOffset(offset), now_ms
    )


def test_owner_commits_at_its_current_epoch() -> None:
    harness = stable_pair()
    result = harness.commit("m0", 2, {(TOPIC, 0): 10, (TOPIC, 2): 12})
    assert result.response == messages.OffsetCommitResponse({})
    assert result.records == [
        commit_record(0, 10, harness.now_ms),
        commit_record(2, 12, harness.now_ms),
    ]
    fetched = harness.shard.fetch_offsets(
        messages.OffsetFetchRequest(GROUP, member_id="m0", member_epoch=2)
    )
    assert fetched.offsets == {
        (TOPIC, 0): messages.CommittedOffset(10, "", -1, harness.now_ms),
        (TOPIC, 2): messages.CommittedOffset(12, "", -1, harness.now_ms),
    }


def test_partition_not_owned_is_refused_per_partition() -> None:
    harness = stable_pair()
    result = harness.commit("m0", 2, {(TOPIC, 1): 5, (TOPIC, 4): 7, ("other", 0): 1})
    assert result.response.errors == {
        (TOPIC, 4): "UNKNOWN_MEMBER_ID",
        ("other", 0): "UNKNOWN_MEMBER_ID",
    }
    assert result.records == [commit_record(1, 5, harness.now_ms)]


def test_a_revoking_member_may_commit_what_it_is_giving_up() -> None:
    harness = Harness()
    harness.topics({TOPIC: 4})
    harness.configure(assignor="range")
    harness.heartbeat("m0", 0, instance_id="g-0")
    harness.heartbeat("m1", 0, instance_id="g-1")
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3))  # 2 and 3 pending revocation
    result = harness.commit("m0", 1, {(TOPIC, 3): 99})
    assert (result.response.errors, len(result.records)) == ({}, 1)
    # The member waiting for partition 3 may not commit it yet.
    refused = harness.commit("m1", 2, {(TOPIC, 3): 100})
    assert refused.response.errors == {(TOPIC, 3): "UNKNOWN_MEMBER_ID"}


def test_zombie_commit_is_rejected() -> None:
    harness = stable_pair()
    harness.heartbeat("m1", messages.LEAVE_EPOCH)
    with pytest.raises(errors.UnknownMemberId) as rejected:
        harness.commit("m1", 2, {(TOPIC, 3): 50})
    assert (rejected.value.code, rejected.value.name) == (25, "UNKNOWN_MEMBER_ID")


def test_commit_at_a_stale_epoch_is_rejected() -> None:
    harness = stable_pair()
    with pytest.raises(errors.StaleMemberEpoch) as rejected:
        harness.commit("m0", 1, {(TOPIC, 0): 1})
    assert rejected.value.code == 113
    with pytest.raises(errors.StaleMemberEpoch):
        harness.shard.fetch_offsets(
            messages.OffsetFetchRequest(GROUP, member_id="m0", member_epoch=1)
        )
    with pytest.raises(errors.UnknownMemberId):
        harness.shard.fetch_offsets(
            messages.OffsetFetchRequest(GROUP, member_id="ghost", member_epoch=2)
        )


def test_metadata_over_4096_bytes_is_too_large() -> None:
    harness = stable_pair()
    request = messages.OffsetCommitRequest(
        GROUP,
        "m0",
        2,
        {
            (TOPIC, 0): messages.CommitOffset(1, metadata="x" * 4096),
            (TOPIC, 1): messages.CommitOffset(1, metadata="é" * 2049),
        },
    )
    result = harness.apply(harness.shard.commit_offsets(request, harness.now_ms))
    assert result.response.errors == {(TOPIC, 1): "OFFSET_METADATA_TOO_LARGE"}
    assert [record.key for record in result.records] == [
        records.new_offset_commit_tombstone(GROUP, TOPIC, 0).key
    ]


def admin_commit(harness: Harness, partitions: dict[int, int]) -> messages.OffsetCommitResponse:
    request = messages.OffsetCommitRequest(
        GROUP,
        "",
        -1,
        {(TOPIC, p): messages.CommitOffset(offset) for p, offset in partitions.items()},
    )
    return harness.apply(harness.shard.commit_offsets(request, harness.now_ms)).response


def test_admin_commit_only_without_active_members_or_while_paused() -> None:
    harness = stable_pair()
    with pytest.raises(errors.UnknownMemberId):
        admin_commit(harness, {0: 0})

    harness.configure(assignor="range", offsets_retention_ms=DAY_MS, assignment_paused=True)
    # m0 revoked, m1 has not yet: only m0's partitions may be reset.
    harness.heartbeat("m0", 2, owned={})
    assert admin_commit(harness, {0: 0, 3: 0}).errors == {(TOPIC, 3): "REBALANCE_IN_PROGRESS"}
    harness.heartbeat("m1", 2, owned={})
    assert admin_commit(harness, {3: 0}).errors == {}

    # A group nobody ever joined accepts administrative commits (a restore before start).
    fresh = Harness()
    assert admin_commit(fresh, {0: 7}).errors == {}
    assert fresh.shard.list_groups() == [GROUP]
    assert fresh.shard.describe_group(GROUP).state == "Empty"


def test_offsets_of_an_idle_group_expire_after_the_retention() -> None:
    harness = stable_pair()
    harness.commit("m0", 2, {(TOPIC, 0): 10})
    harness.commit("m1", 2, {(TOPIC, 4): 14})
    harness.heartbeat("m0", messages.LEAVE_EPOCH)
    harness.heartbeat("m1", messages.LEAVE_EPOCH)
    empty_since = harness.now_ms
    assert harness.shard.next_deadline_ms() == empty_since + DAY_MS

    assert harness.tick(DAY_MS - 1).records == []
    expired = harness.tick(1)
    assert expired.records == [
        records.new_offset_commit_tombstone(GROUP, TOPIC, 0),
        records.new_offset_commit_tombstone(GROUP, TOPIC, 4),
        records.new_target_assignment_epoch_tombstone(GROUP),
        records.new_partition_metadata_tombstone(GROUP),
        records.new_group_lifecycle_tombstone(GROUP),
        records.new_group_epoch_tombstone(GROUP),
    ]
    assert harness.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP)).offsets == {}
    # The operator's settings survive; nothing is due any more.
    description = harness.shard.describe_group(GROUP)
    assert (description.state, description.assignor) == ("Empty", "range")
    assert harness.shard.next_deadline_ms() is None


def test_a_member_joining_in_time_keeps_the_offsets() -> None:
    harness = stable_pair()
    harness.commit("m0", 2, {(TOPIC, 0): 10})
    harness.heartbeat("m0", messages.LEAVE_EPOCH)
    harness.heartbeat("m1", messages.LEAVE_EPOCH)
    harness.now_ms += DAY_MS - 10
    harness.heartbeat("m2", 0)
    assert harness.tick(DAY_MS).records[:3] == [
        # m2 never heartbeats again: its session expires, but the offsets stay.
        records.new_group_epoch_record(GROUP, 6),
        *records.new_member_tombstones(GROUP, "m2")[:2],
    ]
    assert harness.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP)).offsets


AUDIT = "audit"
RETENTION_MS = 20_000


def moved_off_audit() -> Harness:
    """m0 subscribed to events and audit, committed both, then dropped audit at +1 s."""
    harness = Harness()
    harness.topics({TOPIC: 2, AUDIT: 2})
    harness.configure(
        assignor="range", offsets_retention_ms=RETENTION_MS, session_timeout_ms=600_000
    )
    both = {TOPIC: frozenset({0, 1}), AUDIT: frozenset({0, 1})}
    harness.heartbeat("m0", 0, topics=(TOPIC, AUDIT))
    harness.heartbeat("m0", 1, owned=both)
    harness.commit("m0", 1, {(TOPIC, 0): 10, (AUDIT, 0): 20, (AUDIT, 1): 21})
    harness.now_ms += 1_000
    harness.heartbeat("m0", 1, owned=both, topics=(TOPIC,))
    harness.heartbeat("m0", 1, owned=parts(0, 1))
    assert harness.shard.describe_group(GROUP).state == "Stable"
    return harness


def test_offsets_of_a_topic_no_member_subscribes_to_expire_from_their_commit() -> None:
    harness = moved_off_audit()
    committed_ms = harness.now_ms - 1_000
    assert harness.shard.next_deadline_ms() == committed_ms + RETENTION_MS

    assert harness.tick(RETENTION_MS - 1_001).records == []
    expired = harness.tick(1)
    assert expired.records == [
        records.new_offset_commit_tombstone(GROUP, AUDIT, 0),
        records.new_offset_commit_tombstone(GROUP, AUDIT, 1),
    ]
    # The subscribed topic's offset is as old, and stays; so does the group.
    fetched = harness.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP))
    assert list(fetched.offsets) == [(TOPIC, 0)]
    assert harness.tick(10 * RETENTION_MS).records == []
    assert harness.shard.describe_group(GROUP).state == "Stable"
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_subscribing_again_in_time_keeps_the_offsets() -> None:
    harness = moved_off_audit()
    harness.now_ms += RETENTION_MS - 2_000
    harness.heartbeat("m0", 2, owned=parts(0, 1), topics=(TOPIC, AUDIT))
    assert harness.tick(RETENTION_MS).records == []
    fetched = harness.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP))
    assert list(fetched.offsets) == [(AUDIT, 0), (AUDIT, 1), (TOPIC, 0)]


def test_a_newer_commit_of_an_unsubscribed_topic_postpones_only_its_own_expiry() -> None:
    harness = moved_off_audit()
    # A newer commit of one partition of the dropped topic, replayed as a record.
    later = records.new_offset_commit_record(
        GROUP, AUDIT, 1, messages.CommitOffset(30), harness.now_ms + 5_000
    )
    harness.apply(result.Result(None, [later]))
    first_commit_ms = harness.now_ms - 1_000
    assert harness.shard.next_deadline_ms() == first_commit_ms + RETENTION_MS
    harness.now_ms = first_commit_ms
    assert harness.tick(RETENTION_MS).records == [
        records.new_offset_commit_tombstone(GROUP, AUDIT, 0)
    ]
    assert harness.shard.next_deadline_ms() == first_commit_ms + 6_000 + RETENTION_MS
    assert harness.tick(6_000).records == [records.new_offset_commit_tombstone(GROUP, AUDIT, 1)]
    assert harness.tick(10 * RETENTION_MS).records == []


def explicit_record(topic: str, partition: int, expire_ms: int) -> schema.Record:
    """An old version-1 offset commit, with its own expire timestamp."""
    return schema.Record(
        schema.OffsetCommitKey(GROUP, topic, partition),
        schema.OffsetCommitValue(5, commit_timestamp=0, expire_timestamp=expire_ms),
    )


def test_an_explicit_expire_timestamp_decides_alone() -> None:
    harness = moved_off_audit()
    now = harness.now_ms
    harness.apply(
        result.Result(
            None,
            [
                explicit_record(AUDIT, 0, now + 3_000),  # unsubscribed: expires at its time
                explicit_record(TOPIC, 1, now + 1_000),  # subscribed: never expires
            ],
        )
    )
    assert harness.shard.next_deadline_ms() == now + 3_000
    assert harness.tick(3_000).records == [records.new_offset_commit_tombstone(GROUP, AUDIT, 0)]
    # audit-1 keeps its commit-timestamp deadline; events-1 is subscribed.
    assert harness.shard.next_deadline_ms() == now - 1_000 + RETENTION_MS


def test_an_explicit_expiry_outlives_its_empty_group() -> None:
    harness = stable_pair()
    harness.commit("m0", 2, {(TOPIC, 0): 10})
    harness.heartbeat("m0", messages.LEAVE_EPOCH)
    harness.heartbeat("m1", messages.LEAVE_EPOCH)
    empty_since = harness.now_ms
    harness.apply(result.Result(None, [explicit_record(TOPIC, 4, empty_since + 2 * DAY_MS)]))
    assert harness.shard.next_deadline_ms() == empty_since + DAY_MS

    expired = harness.tick(DAY_MS)
    assert expired.records == [
        records.new_offset_commit_tombstone(GROUP, TOPIC, 0),
        records.new_target_assignment_epoch_tombstone(GROUP),
        records.new_partition_metadata_tombstone(GROUP),
        records.new_group_lifecycle_tombstone(GROUP),
        records.new_group_epoch_tombstone(GROUP),
    ]
    fetched = harness.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP))
    assert list(fetched.offsets) == [(TOPIC, 4)]
    assert harness.shard.next_deadline_ms() == empty_since + 2 * DAY_MS
    assert harness.tick(DAY_MS - 1).records == []
    assert harness.tick(1).records == [records.new_offset_commit_tombstone(GROUP, TOPIC, 4)]
    assert harness.shard.next_deadline_ms() is None
    assert harness.shard.list_groups() == [GROUP]  # the operator's settings stay
