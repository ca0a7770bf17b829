"""Membership scenarios, Kafka style: call the handler, assert the exact response and records.

Scenarios that pin exact targets use the ``range`` assignor, whose result is fixed by
Kafka's definition (static members ordered by instance id, contiguous ranges); the
scale-down and property tests use the sticky assignors and assert properties instead.
"""

from __future__ import annotations

import pytest

from kafka_group_operator.coordinator import errors, group_state, messages, records
from kafka_group_records import records as schema
from tests.coordinator.harness import (
    GROUP,
    TOPIC,
    TOPIC_ID,
    Harness,
    current,
    parts,
    subscription,
    target,
    topic_metadata,
)

UNREVOKED = group_state.MemberState.UNREVOKED_PARTITIONS
UNRELEASED = group_state.MemberState.UNRELEASED_PARTITIONS
STABLE = group_state.MemberState.STABLE


def response(
    member_id: str, epoch: int, assignment: dict[str, frozenset[int]] | None = None
) -> messages.HeartbeatResponse:
    return messages.HeartbeatResponse(member_id, epoch, 3_000, assignment)


def ranged(partitions: int = 6) -> Harness:
    harness = Harness()
    harness.topics({TOPIC: partitions})
    harness.configure(assignor="range")
    return harness


def state(harness: Harness) -> str:
    return harness.shard.describe_group(GROUP).state


def test_first_member_joins_and_gets_everything() -> None:
    harness = ranged()
    result = harness.heartbeat("m0", 0, instance_id="g-0")

    assert result.response == response("m0", 1, parts(0, 1, 2, 3, 4, 5))
    assert result.records == [
        records.new_group_epoch_record(GROUP, 1),
        topic_metadata(6),
        subscription("m0", "g-0"),
        target("m0", 0, 1, 2, 3, 4, 5),
        records.new_target_assignment_epoch_record(GROUP, 1),
        current("m0", 1, 0, STABLE, (0, 1, 2, 3, 4, 5)),
    ]
    assert state(harness) == "Stable"


def two_stable_members() -> Harness:
    harness = ranged()
    harness.heartbeat("m0", 0, instance_id="g-0")
    harness.heartbeat("m1", 0, instance_id="g-1")
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3, 4, 5))
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2))
    harness.heartbeat("m1", 2, owned={})
    return harness


def test_second_member_waits_until_the_first_revokes() -> None:
    harness = ranged()
    harness.heartbeat("m0", 0, instance_id="g-0")

    joined = harness.heartbeat("m1", 0, instance_id="g-1")
    assert joined.response == response("m1", 2, {})
    assert joined.records == [
        records.new_group_epoch_record(GROUP, 2),
        subscription("m1", "g-1"),
        target("m0", 0, 1, 2),
        target("m1", 3, 4, 5),
        records.new_target_assignment_epoch_record(GROUP, 2),
        current("m1", 2, 0, UNRELEASED),
    ]
    assert state(harness) == "Reconciling"

    # m0 is told to keep 0-2: 3-5 are pending revocation while it still reports them.
    revoking = harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3, 4, 5))
    assert revoking.response == response("m0", 1, parts(0, 1, 2))
    assert revoking.records == [current("m0", 1, 0, UNREVOKED, (0, 1, 2), (3, 4, 5))]

    # Nothing is handed to m1 while m0 still owns it.
    waiting = harness.heartbeat("m1", 2, owned={})
    assert waiting.response == response("m1", 2)
    assert waiting.records == []

    revoked = harness.heartbeat("m0", 1, owned=parts(0, 1, 2))
    assert revoked.response == response("m0", 2)
    assert revoked.records == [current("m0", 2, 1, STABLE, (0, 1, 2))]

    released = harness.heartbeat("m1", 2, owned={})
    assert released.response == response("m1", 2, parts(3, 4, 5))
    assert released.records == [current("m1", 2, 0, STABLE, (3, 4, 5))]
    assert state(harness) == "Stable"

    # A stable member's heartbeat writes nothing and sends no assignment.
    steady = harness.heartbeat("m1", 2, owned=parts(3, 4, 5))
    assert (steady.response, steady.records) == (response("m1", 2), [])


def settle(harness: Harness, members: dict[str, tuple[int, dict[str, frozenset[int]]]]) -> int:
    """Heartbeat every member with what it owns until nothing changes; return the rounds."""
    for rounds in range(1, 20):
        changed = False
        for member_id, (epoch, owned) in list(members.items()):
            result = harness.heartbeat(member_id, epoch, owned=owned)
            assignment = result.response.assignment
            members[member_id] = (
                result.response.member_epoch,
                dict(assignment) if assignment is not None else owned,
            )
            changed |= bool(result.records)
        if not changed:
            return rounds
    raise AssertionError("the group did not settle")


@pytest.mark.parametrize("count", [1, 2, 3, 4, 6])
def test_members_join_one_at_a_time(count: int) -> None:
    harness = ranged(12)
    members: dict[str, tuple[int, dict[str, frozenset[int]]]] = {}
    for index in range(count):
        member_id = f"m{index}"
        joined = harness.heartbeat(member_id, 0, instance_id=f"g-{index}")
        # Every join bumps the group epoch once and recomputes the target at that epoch.
        assert joined.records[0] == records.new_group_epoch_record(GROUP, index + 1)
        assert subscription(member_id, f"g-{index}") in joined.records
        assert records.new_target_assignment_epoch_record(GROUP, index + 1) in joined.records
        assert joined.response.member_epoch == index + 1
        members[member_id] = (joined.response.member_epoch, dict(joined.response.assignment or {}))
        settle(harness, members)
        assert state(harness) == "Stable"

    # range: 12 partitions over the members in instance-id order, contiguous.
    size, extra = divmod(12, count)
    start = 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        epoch, owned = members[f"m{index}"]
        assert (epoch, owned) == (count, parts(*range(start, end)))
        start = end


def test_static_member_restart_moves_nothing() -> None:
    harness = two_stable_members()

    left = harness.heartbeat("m1", messages.STATIC_LEAVE_EPOCH, instance_id="g-1")
    assert left.response == response("m1", -2)
    assert left.records == [current("m1", -2, 2, STABLE, (3, 4, 5))]
    away = harness.shard.describe_group(GROUP).members[1]
    assert (away.member_id, away.member_epoch, away.state) == ("m1", -2, "LEFT_TEMPORARILY")
    assert away.assignment == parts(3, 4, 5)

    # The restarted pod has a new member id; it keeps the instance id, and with it everything.
    back = harness.heartbeat("m1-restarted", 0, instance_id="g-1")
    assert back.response == response("m1-restarted", 2, parts(3, 4, 5))
    assert back.records == [
        subscription("m1-restarted", "g-1"),
        target("m1-restarted", 3, 4, 5),
        records.new_current_assignment_tombstone(GROUP, "m1"),
        current("m1-restarted", 2, 2, STABLE, (3, 4, 5)),
        records.new_target_assignment_tombstone(GROUP, "m1"),
        records.new_member_subscription_tombstone(GROUP, "m1"),
    ]
    description = harness.shard.describe_group(GROUP)
    assert (description.state, description.group_epoch) == ("Stable", 2)
    # The other member notices nothing.
    other = harness.heartbeat("m0", 2, owned=parts(0, 1, 2))
    assert (other.response, other.records) == (response("m0", 2), [])

    # The old incarnation is a zombie now.
    with pytest.raises(errors.FencedInstanceId):
        harness.heartbeat("m1", 2, instance_id="g-1", owned=parts(3, 4, 5))
    with pytest.raises(errors.UnknownMemberId):
        harness.heartbeat("m1", 2, owned=parts(3, 4, 5))
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_a_second_live_instance_is_refused() -> None:
    harness = two_stable_members()
    with pytest.raises(errors.UnreleasedInstanceId) as refused:
        harness.heartbeat("intruder", 0, instance_id="g-1")
    assert (refused.value.code, refused.value.name) == (111, "UNRELEASED_INSTANCE_ID")


def test_static_member_that_does_not_return_expires_after_the_session_timeout() -> None:
    harness = two_stable_members()
    harness.heartbeat("m1", messages.STATIC_LEAVE_EPOCH, instance_id="g-1")
    harness.now_ms += 40_000
    harness.heartbeat("m0", 2, owned=parts(0, 1, 2))

    # m1's session runs from its leave; m0 keeps its session alive by heartbeating.
    assert harness.tick(5_000).records == [
        records.new_group_epoch_record(GROUP, 3),
        *records.new_member_tombstones(GROUP, "m1"),
        target("m0", 0, 1, 2, 3, 4, 5),
        records.new_target_assignment_epoch_record(GROUP, 3),
    ]
    got = harness.heartbeat("m0", 2, owned=parts(0, 1, 2))
    assert got.response == response("m0", 3, parts(0, 1, 2, 3, 4, 5))


def test_permanent_leave_frees_partitions_at_once() -> None:
    harness = two_stable_members()
    left = harness.heartbeat("m1", messages.LEAVE_EPOCH, instance_id="g-1")
    assert left.response == response("m1", -1)
    assert left.records == [
        records.new_group_epoch_record(GROUP, 3),
        *records.new_member_tombstones(GROUP, "m1"),
        target("m0", 0, 1, 2, 3, 4, 5),
        records.new_target_assignment_epoch_record(GROUP, 3),
    ]
    got = harness.heartbeat("m0", 2, owned=parts(0, 1, 2))
    assert got.response == response("m0", 3, parts(0, 1, 2, 3, 4, 5))


def test_last_member_leaving_records_when_the_group_became_empty() -> None:
    harness = ranged()
    harness.heartbeat("m0", 0)
    harness.now_ms = 5_000
    left = harness.heartbeat("m0", messages.LEAVE_EPOCH)
    assert left.records == [
        records.new_group_epoch_record(GROUP, 2),
        *records.new_member_tombstones(GROUP, "m0"),
        records.new_group_lifecycle_record(GROUP, 5_000),
        records.new_partition_metadata_record(GROUP, []),
        records.new_target_assignment_epoch_record(GROUP, 2),
    ]
    assert state(harness) == "Empty"
    # Joining again clears the mark.
    joined = harness.heartbeat("m1", 0)
    assert records.new_group_lifecycle_record(GROUP, -1) in joined.records


def test_scale_down_moves_only_the_departed_members_partitions() -> None:
    harness = Harness()
    harness.topics({TOPIC: 12})
    harness.configure()  # cooperative-sticky
    members: dict[str, tuple[int, dict[str, frozenset[int]]]] = {}
    for index in range(4):
        joined = harness.heartbeat(f"m{index}", 0, instance_id=f"g-{index}")
        members[f"m{index}"] = (joined.response.member_epoch, {})
        settle(harness, members)
    before = {member_id: owned[TOPIC] for member_id, (_, owned) in members.items()}
    assert sorted(len(p) for p in before.values()) == [3, 3, 3, 3]

    removed = harness.apply(
        harness.shard.remove_members(messages.RemoveMembersRequest(GROUP, ("g-3",)), 0)
    )
    assert removed.response == {"g-3": None}
    assert removed.records[:4] == [
        records.new_group_epoch_record(GROUP, 5),
        *records.new_member_tombstones(GROUP, "m3"),
    ]
    del members["m3"]
    settle(harness, members)

    after = {member_id: owned[TOPIC] for member_id, (_, owned) in members.items()}
    for member_id, owned in after.items():
        assert owned >= before[member_id], "a remaining member lost a partition"
    moved = set().union(*after.values()) - set().union(*(before[m] for m in after))
    assert moved == before["m3"]
    assert sorted(len(p) for p in after.values()) == [4, 4, 4]
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_remove_members_reports_unknown_instances() -> None:
    harness = two_stable_members()
    result = harness.shard.remove_members(
        messages.RemoveMembersRequest(GROUP, ("g-7",)), harness.now_ms
    )
    assert (result.response, result.records) == ({"g-7": "UNKNOWN_MEMBER_ID"}, [])


def test_epoch_validation() -> None:
    harness = two_stable_members()
    with pytest.raises(errors.FencedMemberEpoch):
        harness.heartbeat("m0", 3, owned=parts(0, 1, 2))
    # A lost response: the member still sends its previous epoch, owning a subset.
    lost = harness.heartbeat("m0", 1, owned=parts(0, 1))
    assert lost.response.member_epoch == 2
    with pytest.raises(errors.FencedMemberEpoch):
        harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3))
    with pytest.raises(errors.FencedMemberEpoch):
        harness.heartbeat("m1", 1, owned=parts(3))  # m1's previous epoch is 0
    with pytest.raises(errors.UnknownMemberId):
        harness.heartbeat("nobody", 2, owned={})


def test_invalid_requests() -> None:
    harness = ranged()
    with pytest.raises(errors.InvalidRequest):
        harness.heartbeat("m0", 0, owned=parts(1))
    with pytest.raises(errors.InvalidRequest):
        harness.heartbeat("", 0)
    with pytest.raises(errors.InvalidRequest):
        harness.heartbeat("m0", -3)
    with pytest.raises(errors.UnsupportedAssignor):
        harness.shard.heartbeat(
            messages.HeartbeatRequest(GROUP, "m0", 0, server_assignor="nope"), 0
        )


def test_rebalance_timeout_fences_a_member_that_does_not_revoke() -> None:
    harness = ranged()
    harness.configure(assignor="range", rebalance_timeout_ms=10_000, session_timeout_ms=60_000)
    harness.heartbeat("m0", 0, instance_id="g-0")
    harness.heartbeat("m1", 0, instance_id="g-1")
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3, 4, 5))  # now UNREVOKED, timer armed
    for _ in range(3):
        harness.now_ms += 4_000
        # Still holding 3-5: the timer is not re-armed by these heartbeats.
        assert harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3, 4, 5)).records == []
        harness.heartbeat("m1", 2, owned={})
    assert harness.shard.next_deadline_ms() == 1_000 + 10_000
    fenced = harness.apply(harness.shard.on_timer(harness.now_ms))
    assert fenced.records == [
        records.new_group_epoch_record(GROUP, 3),
        *records.new_member_tombstones(GROUP, "m0"),
        target("m1", 0, 1, 2, 3, 4, 5),
        records.new_target_assignment_epoch_record(GROUP, 3),
    ]
    got = harness.heartbeat("m1", 2, owned={})
    assert got.response == response("m1", 3, parts(0, 1, 2, 3, 4, 5))


def test_pause_revokes_everything_cooperatively_and_resume_gives_it_back() -> None:
    harness = two_stable_members()
    paused = harness.configure(assignor="range", assignment_paused=True)
    assert paused.records == [
        records.new_group_epoch_record(GROUP, 3),
        records.new_group_config_record(
            GROUP,
            schema.GroupConfigValue(
                assignor="range",
                assignment_paused=True,
                topics=(TOPIC,),
                # The targets to hand back on resume.
                paused_targets=(
                    schema.MemberTarget("m0", (schema.TopicPartitions(TOPIC_ID, (0, 1, 2)),)),
                    schema.MemberTarget("m1", (schema.TopicPartitions(TOPIC_ID, (3, 4, 5)),)),
                ),
            ),
        ),
        target("m0"),
        target("m1"),
        records.new_target_assignment_epoch_record(GROUP, 3),
    ]
    assert state(harness) == "Reconciling"
    assert harness.heartbeat("m0", 2, owned=parts(0, 1, 2)).response == response("m0", 2, {})
    harness.heartbeat("m0", 2, owned={})
    harness.heartbeat("m1", 2, owned=parts(3, 4, 5))
    harness.heartbeat("m1", 2, owned={})
    assert state(harness) == "Paused"

    resumed = harness.configure(assignor="range")
    assert resumed.records[0] == records.new_group_epoch_record(GROUP, 4)
    assert harness.heartbeat("m0", 3, owned={}).response == response("m0", 4, parts(0, 1, 2))
    assert harness.heartbeat("m1", 3, owned={}).response == response("m1", 4, parts(3, 4, 5))
    assert state(harness) == "Stable"


def test_unchanged_configuration_writes_nothing() -> None:
    harness = two_stable_members()
    assert harness.configure(assignor="range").records == []
    with pytest.raises(errors.UnsupportedAssignor):
        harness.configure(assignor="no-such-assignor")
    with pytest.raises(errors.InvalidSessionTimeout):
        harness.configure(session_timeout_ms=0)


def test_more_partitions_rebalance_the_subscribed_group() -> None:
    harness = two_stable_members()
    grown = harness.topics({TOPIC: 8, "unrelated": 3})
    assert grown.records == [
        records.new_group_epoch_record(GROUP, 3),
        topic_metadata(8),
        target("m0", 0, 1, 2, 3),
        target("m1", 4, 5, 6, 7),
        records.new_target_assignment_epoch_record(GROUP, 3),
    ]
    # Metadata of a topic nobody subscribes to changes nothing.
    assert harness.topics({TOPIC: 8, "unrelated": 5}).records == []


def test_delete_group() -> None:
    harness = two_stable_members()
    harness.commit("m0", 2, {(TOPIC, 0): 42})
    with pytest.raises(errors.NonEmptyGroup):
        harness.shard.delete_group(messages.DeleteGroupRequest(GROUP), harness.now_ms)

    deleted = harness.apply(
        harness.shard.delete_group(messages.DeleteGroupRequest(GROUP, force=True), harness.now_ms)
    )
    assert deleted.records == [
        records.new_offset_commit_tombstone(GROUP, TOPIC, 0),
        *records.new_member_tombstones(GROUP, "m0"),
        *records.new_member_tombstones(GROUP, "m1"),
        records.new_target_assignment_epoch_tombstone(GROUP),
        records.new_partition_metadata_tombstone(GROUP),
        records.new_group_config_tombstone(GROUP),
        records.new_group_epoch_tombstone(GROUP),
    ]
    assert harness.shard.list_groups() == []
    with pytest.raises(errors.GroupIdNotFound):
        harness.shard.describe_group(GROUP)
    with pytest.raises(errors.UnknownMemberId):
        harness.heartbeat("m0", 2, owned=parts(0, 1, 2))
    # Tombstones included, a replay from scratch ends with nothing either.
    assert harness.replayed().canonical_state() == {
        "groups": {},
        "classic_groups": {},
        "owners": {},
        "offsets": {},
    }


def test_restarted_container_rejoins_as_the_same_member_and_keeps_everything() -> None:
    # The member id comes from the pod, so a crashed container comes back with the same id
    # and epoch 0, owning nothing yet.
    harness = two_stable_members()
    back = harness.heartbeat("m1", 0, instance_id="g-1")
    assert (back.response, back.records) == (response("m1", 2, parts(3, 4, 5)), [])


def test_same_member_returning_from_a_temporary_leave() -> None:
    harness = two_stable_members()
    harness.heartbeat("m1", messages.STATIC_LEAVE_EPOCH, instance_id="g-1")
    back = harness.heartbeat("m1", 0, instance_id="g-1")
    assert back.response == response("m1", 2, parts(3, 4, 5))
    assert back.records == [current("m1", 2, 2, STABLE, (3, 4, 5))]
    assert state(harness) == "Stable"


def test_static_member_returning_after_its_target_changed() -> None:
    # m1 left before it received its partitions; meanwhile m0 still holds them.
    harness = ranged()
    harness.heartbeat("m0", 0, instance_id="g-0")
    harness.heartbeat("m1", 0, instance_id="g-1")
    harness.heartbeat("m1", messages.STATIC_LEAVE_EPOCH, instance_id="g-1")
    back = harness.heartbeat("m1-new", 0, instance_id="g-1")
    assert back.response == response("m1-new", 2, {})
    assert back.records[-3] == current("m1-new", 2, 2, UNRELEASED)
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3, 4, 5))
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2))
    assert harness.heartbeat("m1-new", 2, owned={}).response == response(
        "m1-new", 2, parts(3, 4, 5)
    )


def test_unsubscribed_topic_stays_owned_until_released() -> None:
    # Owned partitions are reported by topic name: a topic the member just unsubscribed
    # from must keep resolving until it has really let its partitions go, even if the
    # response telling it to revoke was lost.
    harness = Harness()
    harness.topics({TOPIC: 2, "audit": 2})
    harness.configure(assignor="range")
    both = (TOPIC, "audit")
    everything = {TOPIC: frozenset({0, 1}), "audit": frozenset({0, 1})}
    harness.heartbeat("m0", 0, topics=both)
    narrowed = harness.heartbeat("m0", 1, topics=(TOPIC,), owned=everything)
    assert narrowed.response == response("m0", 1, parts(0, 1))
    # Still recorded: m0 holds audit partitions until it reports them released.
    assert [type(record.key).__name__ for record in narrowed.records] == [
        "ConsumerGroupMetadataKey",
        "ConsumerGroupMemberMetadataKey",
        "ConsumerGroupTargetAssignmentMemberKey",
        "ConsumerGroupTargetAssignmentMetadataKey",
        "ConsumerGroupCurrentMemberAssignmentKey",
    ]
    topics = harness.shard.canonical_state()["groups"][GROUP]["topics"]
    assert [topic.topic_name for topic in topics] == ["audit", TOPIC]

    # The response was lost: the member still reports the audit partitions.
    again = harness.heartbeat("m0", 1, owned=everything)
    assert again.records == []
    assert again.response == response("m0", 1, parts(0, 1))
    harness.heartbeat("m1", 0, topics=both)
    assert harness.shard.describe_group(GROUP).members[1].assignment == {}

    # m1's join gave it events-1 as well (range over two subscribers): m0 revokes it too.
    revoking = harness.heartbeat("m0", 1, owned=parts(0, 1))
    assert revoking.response == response("m0", 1, parts(0))
    released = harness.heartbeat("m0", 1, owned=parts(0))
    assert released.response == response("m0", 3)
    joined = harness.heartbeat("m1", 3, owned={})
    assert joined.response == response("m1", 3, {TOPIC: frozenset({1}), "audit": frozenset({0, 1})})
