"""Group id ownership: one ConsumerGroup resource owns a group id, durably, until it lets go."""

from __future__ import annotations

import pytest

from kafka_group_operator.coordinator import errors, messages
from kafka_group_records import records as schema
from tests.coordinator.harness import GROUP, TOPIC, Harness

OWNER = messages.GroupOwner("shop", "orders", "uid-a")
INTRUDER = messages.GroupOwner("other", "orders", "uid-b")


def claim(harness: Harness, owner: messages.GroupOwner) -> messages.GroupOwner:
    return harness.apply(
        harness.shard.claim_group(messages.ClaimGroupRequest(GROUP, owner), harness.now_ms)
    ).response


def test_the_first_claimant_owns_the_group_id_and_a_second_changes_nothing() -> None:
    harness = Harness()
    first = harness.shard.claim_group(messages.ClaimGroupRequest(GROUP, OWNER), harness.now_ms)
    assert first.response == OWNER
    assert first.records == [
        schema.Record(
            schema.GroupOwnerKey(GROUP), schema.GroupOwnerValue("shop", "orders", "uid-a")
        )
    ]
    harness.apply(first)
    # Claiming again is a no-op for the owner, and refused (no record) for anyone else.
    again = harness.shard.claim_group(messages.ClaimGroupRequest(GROUP, OWNER), harness.now_ms)
    assert (again.response, again.records) == (OWNER, [])
    other = harness.shard.claim_group(messages.ClaimGroupRequest(GROUP, INTRUDER), harness.now_ms)
    assert (other.response, other.records) == (OWNER, [])
    # Ownership is state: it survives a reload from the log.
    assert harness.replayed().group_owner(GROUP) == OWNER


def test_only_the_owner_releases_and_then_another_may_claim() -> None:
    harness = Harness()
    claim(harness, OWNER)
    refused = harness.shard.release_group(messages.ReleaseGroupRequest(GROUP, "uid-b"), 0)
    assert (refused.response, refused.records) == (False, [])
    released = harness.apply(
        harness.shard.release_group(messages.ReleaseGroupRequest(GROUP, "uid-a"), 0)
    )
    assert released.response is True
    assert released.records == [schema.Record(schema.GroupOwnerKey(GROUP), None)]
    assert harness.shard.group_owner(GROUP) is None
    assert claim(harness, INTRUDER) == INTRUDER
    assert harness.replayed().group_owner(GROUP) == INTRUDER


def test_only_the_owner_may_delete_the_group() -> None:
    harness = Harness()
    harness.topics({TOPIC: 2})
    harness.configure()
    claim(harness, OWNER)
    harness.apply(
        harness.shard.commit_offsets(
            messages.OffsetCommitRequest(GROUP, "", -1, {(TOPIC, 0): messages.CommitOffset(5)}),
            harness.now_ms,
        )
    )
    for uid in ("uid-b", "unknown"):
        with pytest.raises(errors.GroupAuthorizationFailed):
            harness.shard.delete_group(
                messages.DeleteGroupRequest(GROUP, force=True, owner_uid=uid), harness.now_ms
            )
    harness.apply(
        harness.shard.delete_group(
            messages.DeleteGroupRequest(GROUP, force=True, owner_uid="uid-a"), harness.now_ms
        )
    )
    assert harness.shard.fetch_offsets(messages.OffsetFetchRequest(GROUP)).offsets == {}
    # Deleting the records does not release the id: that is the owner's separate decision.
    assert harness.shard.group_owner(GROUP) == OWNER
