"""Classic groups as Kafka runs them (``ClassicGroup``): the leader assigns, the coordinator relays.

Context tests: each drives the shard the way the runtime does (``Harness``: records are
logged and replayed, then soft records, then the answers to parked requests) and asserts the
exact records written and the exact responses, following ``GroupMetadataManager``'s
``classicGroupJoinToClassicGroup``, ``classicGroupSyncToClassicGroup``,
``classicGroupHeartbeatToClassicGroup``, ``classicGroupLeaveToClassicGroup`` and their
timers, and Kafka's tests of them (``GroupMetadataManagerTest``'s classic-group cases).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import (
    errors,
    group_state,
    messages,
    records,
    result,
    timers,
)
from kafka_group_records import records as schema
from tests.coordinator.harness import Harness

State = group_state.ClassicGroupState
GROUP = "classic"
SESSION_MS = 10_000
REBALANCE_MS = 60_000
# A ConsumerProtocolSubscription v0 of topic "t" (the bytes are relayed, never read here
# except for the subscribed topics).
SUBSCRIPTION = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\xff\xff\xff\xff"
RANGE = schema.ClassicProtocol("range", SUBSCRIPTION)
ROUNDROBIN = schema.ClassicProtocol("roundrobin", SUBSCRIPTION)


def harness(initial_delay_ms: int = 0) -> Harness:
    counter = itertools.count()
    return Harness(
        settings=coordinator_config.CoordinatorConfig(initial_rebalance_delay_ms=initial_delay_ms),
        new_uuid=lambda: f"uuid{next(counter)}",
    )


def join(
    h: Harness,
    member_id: str = "",
    *,
    instance_id: str | None = None,
    protocols: tuple[schema.ClassicProtocol, ...] = (RANGE,),
    protocol_type: str = "consumer",
    require_known_member_id: bool = False,
    skip_assignment: bool = False,
    client_id: str = "client",
    session_timeout_ms: int = SESSION_MS,
    rebalance_timeout_ms: int = REBALANCE_MS,
    group_id: str = GROUP,
) -> result.Result[Any]:
    request = messages.ClassicJoinRequest(
        group_id=group_id,
        member_id=member_id,
        instance_id=instance_id,
        protocol_type=protocol_type,
        protocols=protocols,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        subscribed_topic_names=("t",),
        require_known_member_id=require_known_member_id,
        client_id=client_id,
        client_host="/10.0.0.1",
        supports_skip_assignment=skip_assignment,
    )
    return h.apply(h.shard.classic_join(request, h.now_ms))


def sync(
    h: Harness,
    member_id: str,
    generation: int,
    assignments: dict[str, bytes] | None = None,
    *,
    instance_id: str | None = None,
    protocol_name: str | None = None,
) -> result.Result[Any]:
    request = messages.ClassicSyncRequest(
        GROUP,
        member_id,
        generation,
        instance_id=instance_id,
        protocol_type="consumer",
        protocol_name=protocol_name,
        assignments=tuple((assignments or {}).items()),
    )
    return h.apply(h.shard.classic_sync(request, h.now_ms))


def heartbeat(
    h: Harness, member_id: str, generation: int, instance_id: str | None = None
) -> messages.ClassicHeartbeatResponse:
    request = messages.ClassicHeartbeatRequest(GROUP, member_id, generation, instance_id)
    return h.apply(h.shard.classic_heartbeat(request, h.now_ms)).response


def leave(h: Harness, *members: messages.ClassicLeavingMember) -> tuple[str | None, ...]:
    request = messages.ClassicLeaveRequest(GROUP, members)
    response: messages.ClassicLeaveResponse = h.apply(
        h.shard.classic_leave(request, h.now_ms)
    ).response
    return response.errors


def answer(h: Harness, kind: str, member_id: str) -> result.Completion:
    return h.completed[result.DeferredKey(kind, GROUP, member_id)]


def state(h: Harness) -> str:
    return h.shard.describe_group(GROUP).state


def metadata_record(
    generation: int,
    leader: str | None,
    timestamp: int,
    members: tuple[schema.GroupMetadataMember, ...],
    protocol: str | None = "range",
) -> schema.Record:
    return records.new_group_metadata_record(
        GROUP,
        schema.GroupMetadataValue(
            protocol_type="consumer",
            generation=generation,
            protocol=protocol,
            leader=leader,
            current_state_timestamp=timestamp,
            members=members,
        ),
    )


def member_record(
    member_id: str, assignment: bytes, instance_id: str | None = None
) -> schema.GroupMetadataMember:
    return schema.GroupMetadataMember(
        member_id=member_id,
        client_id="client",
        client_host="/10.0.0.1",
        session_timeout=SESSION_MS,
        subscription=SUBSCRIPTION,
        assignment=assignment,
        group_instance_id=instance_id,
        rebalance_timeout=REBALANCE_MS,
    )


def end_join_phase(h: Harness) -> None:
    """Run the timers due now until the join phase ends: with no initial delay, a join during
    it still extends it once (Kafka's ``tryCompleteInitialRebalanceElseSchedule``), and each
    extension is a timer of its own."""
    for _ in range(5):
        if state(h) != "PreparingRebalance":
            return
        h.tick(0)
    raise AssertionError("the join phase did not end")


def stable_pair(h: Harness) -> tuple[str, str]:
    """Two dynamic members, generation 1, Stable: the leader assigned ``A`` and ``B``."""
    first = join(h).response
    second = join(h).response
    assert isinstance(first, result.Deferred)
    assert isinstance(second, result.Deferred)
    end_join_phase(h)
    leader, follower = first.key.member_id, second.key.member_id
    sync(h, follower, 1)
    sync(h, leader, 1, {leader: b"A", follower: b"B"})
    assert state(h) == "Stable"
    return leader, follower


# ---------------------------------------------------------------------------------------
# The state machine is Kafka's table


KAFKA_PREVIOUS_STATES = {
    State.EMPTY: {State.PREPARING_REBALANCE},
    State.PREPARING_REBALANCE: {State.STABLE, State.COMPLETING_REBALANCE, State.EMPTY},
    State.COMPLETING_REBALANCE: {State.PREPARING_REBALANCE},
    State.STABLE: {State.COMPLETING_REBALANCE},
    State.DEAD: set(State),
}


@pytest.mark.parametrize("before", list(State))
@pytest.mark.parametrize("after", list(State))
def test_transitions_are_kafkas_table(before: State, after: State) -> None:
    assert group_state.VALID_PREVIOUS_CLASSIC_STATES[after] == KAFKA_PREVIOUS_STATES[after]
    if before in KAFKA_PREVIOUS_STATES[after]:
        group_state.check_classic_transition("g", before, after, "test")
    else:
        with pytest.raises(errors.IllegalStateTransition):
            group_state.check_classic_transition("g", before, after, "test")


def test_heartbeat_answers_are_kafkas_per_state() -> None:
    assert group_state.CLASSIC_HEARTBEAT_ANSWER == {
        State.EMPTY: "UNKNOWN_MEMBER_ID",
        State.PREPARING_REBALANCE: "REBALANCE_IN_PROGRESS",
        State.COMPLETING_REBALANCE: None,
        State.STABLE: None,
        State.DEAD: "COORDINATOR_NOT_AVAILABLE",
    }


def test_a_soft_record_taking_an_illegal_transition_is_refused() -> None:
    h = harness()
    leader, _ = stable_pair(h)
    # A copy moved Stable -> Empty, which the table forbids (only through PreparingRebalance).
    copy = h.shard._classic_groups[GROUP].copy()
    copy.transitions.append((State.STABLE, State.EMPTY))
    copy.state = State.EMPTY
    from kafka_group_operator.coordinator import classic_group

    with pytest.raises(errors.IllegalStateTransition):
        h.shard.replay_soft(classic_group.ClassicGroupUpdated(GROUP, copy))
    assert state(h) == "Stable"
    assert heartbeat(h, leader, 1).rebalance_in_progress is False


# ---------------------------------------------------------------------------------------
# JoinGroup and the join barrier


def test_member_id_required_then_join_then_leader_and_follower_sync() -> None:
    h = harness(initial_delay_ms=3_000)
    # KIP-394 (JoinGroup v4+): a dynamic member is sent back for its id. The join created
    # the group: Kafka commits it with an empty GroupMetadata record.
    first = join(h, require_known_member_id=True)
    assert isinstance(first.response, result.Failed)
    assert isinstance(first.response.error, errors.MemberIdRequired)
    assert first.response.error.member_id == "client-uuid0"
    assert first.records == [
        records.new_group_metadata_record(
            GROUP, schema.GroupMetadataValue("", 0, None, None, 1_000, ())
        )
    ]
    assert state(h) == "Empty"
    # With its id it joins: parked, the group prepares its first rebalance.
    joined = join(h, "client-uuid0", require_known_member_id=True)
    assert joined.response == result.Deferred(result.join_key(GROUP, "client-uuid0"))
    assert joined.records == []
    assert state(h) == "PreparingRebalance"
    assert h.shard.armed_timers()[timers.classic_join_key(GROUP)] == timers.Armed(
        4_000, timers.JOIN_INITIAL_DELAY
    )
    # A static member joins during the initial delay: parked too, and the delay extends.
    static = join(h, instance_id="pod-1")
    assert static.response == result.Deferred(result.join_key(GROUP, "pod-1-uuid1"))
    h.tick(3_000)
    assert h.completions == []
    assert h.shard.armed_timers()[timers.classic_join_key(GROUP)] == timers.Armed(
        7_000, timers.JOIN_INITIAL_DELAY
    )
    # No one new in the next delay: generation 1, the first member leads.
    h.tick(3_000)
    assert state(h) == "CompletingRebalance"
    members = (
        messages.ClassicJoinMember("client-uuid0", None, SUBSCRIPTION),
        messages.ClassicJoinMember("pod-1-uuid1", "pod-1", SUBSCRIPTION),
    )
    assert h.completions == [
        result.Completion(
            result.join_key(GROUP, "client-uuid0"),
            messages.ClassicJoinResponse(
                "client-uuid0", 1, "range", "consumer", "client-uuid0", members
            ),
        ),
        result.Completion(
            result.join_key(GROUP, "pod-1-uuid1"),
            messages.ClassicJoinResponse("pod-1-uuid1", 1, "range", "consumer", "client-uuid0"),
        ),
    ]
    assert h.log[1:] == []
    # The follower's SyncGroup waits for the leader's.
    follower = sync(h, "pod-1-uuid1", 1, instance_id="pod-1")
    assert follower.response == result.Deferred(result.sync_key(GROUP, "pod-1-uuid1"))
    assert follower.records == []
    # The leader's assignment is written, then relayed as it is to each member.
    h.now_ms += 5
    leader = sync(h, "client-uuid0", 1, {"client-uuid0": b"\x01", "pod-1-uuid1": b"\x02"})
    assert leader.records == [
        metadata_record(
            1,
            "client-uuid0",
            7_000,
            (
                member_record("client-uuid0", b"\x01"),
                member_record("pod-1-uuid1", b"\x02", "pod-1"),
            ),
        )
    ]
    assert leader.response == messages.ClassicSyncResponse(
        "consumer", "range", raw_assignment=b"\x01"
    )
    assert answer(h, "sync", "pod-1-uuid1") == result.Completion(
        result.sync_key(GROUP, "pod-1-uuid1"),
        messages.ClassicSyncResponse("consumer", "range", raw_assignment=b"\x02"),
    )
    assert state(h) == "Stable"
    assert heartbeat(h, "client-uuid0", 1) == messages.ClassicHeartbeatResponse(False)
    assert heartbeat(h, "pod-1-uuid1", 1, "pod-1") == messages.ClassicHeartbeatResponse(False)


def test_any_protocol_type_and_the_vote() -> None:
    h = harness()
    connect = schema.ClassicProtocol("sessioned", b"worker-a")
    compatible = schema.ClassicProtocol("compatible", b"worker-a-old")
    first = join(h, protocol_type="connect", protocols=(connect, compatible)).response
    # The second worker prefers the older protocol; both support both.
    second = join(
        h,
        protocol_type="connect",
        protocols=(compatible, schema.ClassicProtocol("sessioned", b"worker-b")),
    ).response
    third = join(
        h, protocol_type="connect", protocols=(schema.ClassicProtocol("compatible", b"c"),)
    ).response
    end_join_phase(h)
    # Only "compatible" is supported by all three: it wins whatever the preferences.
    leader_answer = answer(h, "join", first.key.member_id).response
    assert leader_answer.protocol_type == "connect"
    assert leader_answer.protocol_name == "compatible"
    # Each member's metadata for the selected protocol.
    assert [m.metadata for m in leader_answer.members] == [b"worker-a-old", b"worker-a-old", b"c"]
    assert answer(h, "join", second.key.member_id).response.members == ()
    assert answer(h, "join", third.key.member_id).response.leader == first.key.member_id


def test_the_vote_takes_what_most_members_prefer() -> None:
    h = harness()
    join(h, protocols=(RANGE, ROUNDROBIN))
    join(h, protocols=(ROUNDROBIN, RANGE))
    join(h, protocols=(ROUNDROBIN, RANGE))
    end_join_phase(h)
    assert h.shard.describe_group(GROUP).state == "CompletingRebalance"
    assert {c.response.protocol_name for c in h.completions} == {"roundrobin"}


@pytest.mark.parametrize(
    ("protocol_type", "protocols"),
    [
        ("connect", (RANGE,)),  # another protocol type
        ("consumer", (schema.ClassicProtocol("sticky", SUBSCRIPTION),)),  # no common protocol
        ("consumer", ()),
    ],
)
def test_inconsistent_protocols_are_refused(
    protocol_type: str, protocols: tuple[schema.ClassicProtocol, ...]
) -> None:
    h = harness()
    stable_pair(h)
    refused = join(h, protocol_type=protocol_type, protocols=protocols)
    assert isinstance(refused.response, result.Failed)
    assert isinstance(refused.response.error, errors.InconsistentGroupProtocol)
    assert refused.records == []
    assert state(h) == "Stable"


def test_a_new_group_refused_a_join_is_still_created_as_kafka_does() -> None:
    h = harness()
    refused = join(h, protocols=())
    assert isinstance(refused.response.error, errors.InconsistentGroupProtocol)
    assert refused.records == [
        records.new_group_metadata_record(
            GROUP, schema.GroupMetadataValue("", 0, None, None, 1_000, ())
        )
    ]
    # Empty without offsets: it goes at Kafka's next offsets cleanup (10 minutes at most).
    assert h.tick(600_000 - 1).records == []
    assert h.tick(1).records == [records.new_group_metadata_tombstone(GROUP)]
    assert h.shard.list_groups() == []


def test_a_join_with_a_member_id_for_no_group_is_unknown() -> None:
    h = harness()
    with pytest.raises(errors.UnknownMemberId):
        join(h, "ghost")
    assert h.log == []


def test_followers_rejoining_unchanged_get_the_generation_and_the_leader_rebalances() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    h.completions.clear()
    again = join(h, follower)
    assert again.response == messages.ClassicJoinResponse(follower, 1, "range", "consumer", leader)
    assert again.records == []
    assert state(h) == "Stable"
    # The leader joining forces a rebalance (that is how it reassigns on topic changes):
    # parked until the follower rejoins, which it learns from its heartbeat.
    parked = join(h, leader)
    assert parked.response == result.Deferred(result.join_key(GROUP, leader))
    assert state(h) == "PreparingRebalance"
    assert heartbeat(h, follower, 1) == messages.ClassicHeartbeatResponse(True)
    assert h.completions == []
    # The barrier holds until every known member has joined.
    rejoin = join(h, follower)
    assert state(h) == "CompletingRebalance"
    assert rejoin.response == messages.ClassicJoinResponse(follower, 2, "range", "consumer", leader)
    assert answer(h, "join", leader).response.generation_id == 2
    assert [m.member_id for m in answer(h, "join", leader).response.members] == [leader, follower]
    # A stale generation is refused.
    with pytest.raises(errors.IllegalGeneration):
        heartbeat(h, follower, 1)


def test_the_rebalance_timeout_drops_dynamic_members_that_did_not_rejoin_but_keeps_static() -> None:
    h = harness()
    dynamic = join(h).response.key.member_id
    static = join(h, instance_id="pod-0").response.key.member_id
    third = join(h).response.key.member_id
    end_join_phase(h)
    sync(h, dynamic, 1, {dynamic: b"a", static: b"b", third: b"c"})
    sync(h, static, 1, instance_id="pod-0")
    sync(h, third, 1)
    # The third member's metadata changes: a rebalance. The others keep heartbeating (told
    # REBALANCE_IN_PROGRESS) but never rejoin.
    join(h, third, protocols=(schema.ClassicProtocol("range", SUBSCRIPTION + b"x"),))
    assert state(h) == "PreparingRebalance"
    assert h.shard.armed_timers()[timers.classic_join_key(GROUP)] == timers.Armed(
        h.now_ms + REBALANCE_MS, timers.JOIN_COMPLETE
    )
    for _ in range(REBALANCE_MS // 5_000 - 1):
        h.tick(5_000)
        assert heartbeat(h, dynamic, 1).rebalance_in_progress
        assert heartbeat(h, static, 1, "pod-0").rebalance_in_progress
    h.tick(4_999)
    assert state(h) == "PreparingRebalance"
    h.tick(1)
    described = h.shard.describe_group(GROUP)
    assert described.state == "CompletingRebalance"
    assert described.group_epoch == 2
    # The dynamic member that did not rejoin is gone; the static one stays (its session
    # decides), outside the generation.
    assert [m.member_id for m in described.members] == [static, third]
    # The leader did not rejoin: the first member that did leads.
    assert answer(h, "join", third).response.leader == third
    with pytest.raises(errors.UnknownMemberId):
        heartbeat(h, dynamic, 1)
    with pytest.raises(errors.IllegalGeneration):
        heartbeat(h, static, 1, "pod-0")


def test_a_member_whose_session_passes_is_removed_and_the_group_rebalances() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    h.now_ms += SESSION_MS - 1
    heartbeat(h, leader, 1)
    h.tick(1)
    # The follower missed its session: gone, and the leader is told to rejoin.
    assert state(h) == "PreparingRebalance"
    assert heartbeat(h, leader, 1) == messages.ClassicHeartbeatResponse(True)
    with pytest.raises(errors.UnknownMemberId):
        heartbeat(h, follower, 1)
    joined = join(h, leader)
    assert joined.response == messages.ClassicJoinResponse(
        leader,
        2,
        "range",
        "consumer",
        leader,
        (messages.ClassicJoinMember(leader, None, SUBSCRIPTION),),
    )


def test_a_member_that_does_not_sync_in_time_is_removed() -> None:
    h = harness()
    first = join(h).response.key.member_id
    second = join(h).response.key.member_id
    end_join_phase(h)
    # Only the leader syncs; the follower never does. (Its heartbeats do not excuse it.)
    sync(h, first, 1, {first: b"a", second: b"b"})
    h.now_ms += REBALANCE_MS - 1
    heartbeat(h, second, 1)
    heartbeat(h, first, 1)
    h.tick(1)
    assert state(h) == "PreparingRebalance"
    assert [m.member_id for m in h.shard.describe_group(GROUP).members] == [first]


def test_everyone_leaving_during_a_rebalance_writes_the_empty_generation() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    join(h, leader)
    assert leave(h, messages.ClassicLeavingMember(follower)) == (None,)
    # The leader's parked join completes alone: generation 2.
    assert answer(h, "join", leader).response.generation_id == 2
    assert state(h) == "CompletingRebalance"
    h.now_ms += 7
    # The last member leaves: a rebalance with nobody to wait for ends at once, empty.
    assert leave(h, messages.ClassicLeavingMember(leader)) == (None,)
    assert state(h) == "Empty"
    assert h.log[-1] == records.new_group_metadata_record(
        GROUP,
        schema.GroupMetadataValue("consumer", 3, None, None, h.now_ms, ()),
    )


def test_leave_by_member_id_instance_id_and_unknowns() -> None:
    h = harness()
    dynamic = join(h).response.key.member_id
    static = join(h, instance_id="pod-0").response.key.member_id
    end_join_phase(h)
    sync(h, dynamic, 1, {dynamic: b"a", static: b"b"})
    sync(h, static, 1, instance_id="pod-0")
    outcome = leave(
        h,
        messages.ClassicLeavingMember("nobody"),
        messages.ClassicLeavingMember("", "pod-9"),
        messages.ClassicLeavingMember("someone-else", "pod-0"),
        # KIP-345's admin removal: an instance id alone.
        messages.ClassicLeavingMember("", "pod-0"),
    )
    assert outcome == (
        "UNKNOWN_MEMBER_ID",
        "UNKNOWN_MEMBER_ID",
        "FENCED_INSTANCE_ID",
        None,
    )
    assert state(h) == "PreparingRebalance"
    assert [m.member_id for m in h.shard.describe_group(GROUP).members] == [dynamic]


def test_a_pending_member_can_leave_before_it_joins() -> None:
    h = harness()
    stable_pair(h)
    pending = join(h, require_known_member_id=True).response.error.member_id
    assert state(h) == "Stable"
    assert leave(h, messages.ClassicLeavingMember(pending)) == (None,)
    # A successful leave in Stable starts a rebalance, as in Kafka.
    assert state(h) == "PreparingRebalance"
    assert leave(h, messages.ClassicLeavingMember(pending)) == ("UNKNOWN_MEMBER_ID",)


def test_a_pending_member_times_out_after_its_session() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    pending = join(h, require_known_member_id=True).response.error.member_id
    h.tick(SESSION_MS - 1)
    heartbeat(h, leader, 1)
    heartbeat(h, follower, 1)
    h.tick(1)
    # Gone from the pending members: its id is now unknown to the group.
    assert leave(h, messages.ClassicLeavingMember(pending)) == ("UNKNOWN_MEMBER_ID",)
    assert state(h) == "Stable"


# ---------------------------------------------------------------------------------------
# Static members (KIP-345)


def test_a_static_member_restarting_in_stable_takes_its_place_without_a_rebalance() -> None:
    h = harness()
    leader = join(h, instance_id="pod-0").response.key.member_id
    follower = join(h, instance_id="pod-1").response.key.member_id
    end_join_phase(h)
    sync(h, follower, 1, instance_id="pod-1")
    sync(h, leader, 1, {leader: b"L", follower: b"F"}, instance_id="pod-0")
    # pod-1 restarts: no member id, same instance id.
    h.now_ms += 3
    back = join(h, instance_id="pod-1")
    assert back.records == [
        metadata_record(
            1,
            leader,
            1_000,
            (member_record(leader, b"L", "pod-0"), member_record("pod-1-uuid2", b"F", "pod-1")),
        )
    ]
    assert back.response == messages.ClassicJoinResponse(
        "pod-1-uuid2", 1, "range", "consumer", leader
    )
    assert state(h) == "Stable"
    # Its assignment is kept: SyncGroup hands it back; the old id is a zombie.
    assert sync(h, "pod-1-uuid2", 1, instance_id="pod-1").response.raw_assignment == b"F"
    with pytest.raises(errors.FencedInstanceId):
        heartbeat(h, follower, 1, "pod-1")
    assert heartbeat(h, leader, 1, "pod-0") == messages.ClassicHeartbeatResponse(False)


@pytest.mark.parametrize("skip_assignment", [False, True])
def test_a_returning_static_leader_is_told_to_keep_the_assignment(skip_assignment: bool) -> None:
    h = harness()
    leader = join(h, instance_id="pod-0").response.key.member_id
    follower = join(h, instance_id="pod-1").response.key.member_id
    end_join_phase(h)
    sync(h, follower, 1, instance_id="pod-1")
    sync(h, leader, 1, {leader: b"L", follower: b"F"}, instance_id="pod-0")
    back = join(h, instance_id="pod-0", skip_assignment=skip_assignment).response
    if skip_assignment:
        # JoinGroup v9+ (KIP-814): leader, with the members, told to skip assigning.
        assert back == messages.ClassicJoinResponse(
            "pod-0-uuid2",
            1,
            "range",
            "consumer",
            "pod-0-uuid2",
            (
                messages.ClassicJoinMember(follower, "pod-1", SUBSCRIPTION),
                messages.ClassicJoinMember("pod-0-uuid2", "pod-0", SUBSCRIPTION),
            ),
            skip_assignment=True,
        )
    else:
        # Older clients see the old leader id, so they act as followers.
        assert back == messages.ClassicJoinResponse("pod-0-uuid2", 1, "range", "consumer", leader)
    assert state(h) == "Stable"


def test_a_static_member_replaced_while_completing_fences_the_old_sync_and_rebalances() -> None:
    h = harness()
    join(h, instance_id="pod-0")
    follower = join(h, instance_id="pod-1").response.key.member_id
    end_join_phase(h)
    parked = sync(h, follower, 1, instance_id="pod-1")
    assert isinstance(parked.response, result.Deferred)
    back = join(h, instance_id="pod-1")
    assert isinstance(answer(h, "sync", follower).error, errors.FencedInstanceId)
    assert isinstance(back.response, result.Deferred)
    assert state(h) == "PreparingRebalance"


def test_static_members_are_validated_by_instance_id() -> None:
    h = harness()
    leader = join(h, instance_id="pod-0").response.key.member_id
    end_join_phase(h)
    with pytest.raises(errors.UnknownMemberId):
        heartbeat(h, leader, 1, "pod-9")
    with pytest.raises(errors.FencedInstanceId):
        heartbeat(h, "other", 1, "pod-0")
    with pytest.raises(errors.FencedInstanceId):
        sync(h, "other", 1, instance_id="pod-0")
    assert isinstance(sync(h, leader, 1, {leader: b"x"}, instance_id="pod-0").response, object)


# ---------------------------------------------------------------------------------------
# Parked requests


def test_a_retried_join_supersedes_the_parked_one() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    first = join(h, leader)
    second = join(h, leader)
    assert first.response == second.response == result.Deferred(result.join_key(GROUP, leader))
    # Both parked under one key: the runtime answers the older REBALANCE_IN_PROGRESS when
    # it parks the newer; the completion goes to whichever waits then.
    join(h, follower)
    assert answer(h, "join", leader).response.generation_id == 2


def test_sync_in_preparing_is_rebalance_in_progress_and_in_empty_unknown() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    join(h, leader)
    with pytest.raises(errors.RebalanceInProgress):
        sync(h, follower, 1)
    with pytest.raises(errors.IllegalGeneration):
        sync(h, follower, 7)


# ---------------------------------------------------------------------------------------
# Offsets of a classic group


def commit(
    h: Harness, member_id: str, generation: int, instance_id: str | None = None
) -> messages.OffsetCommitResponse:
    request = messages.OffsetCommitRequest(
        GROUP, member_id, generation, {("t", 0): messages.CommitOffset(5)}, instance_id
    )
    return h.apply(h.shard.commit_offsets(request, h.now_ms)).response


def test_commits_are_fenced_by_generation_as_kafka_does() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    assert commit(h, follower, 1) == messages.OffsetCommitResponse()
    assert h.log[-1] == records.new_offset_commit_record(
        GROUP, "t", 0, messages.CommitOffset(5), h.now_ms
    )
    with pytest.raises(errors.IllegalGeneration):
        commit(h, follower, 0)
    with pytest.raises(errors.UnknownMemberId):
        commit(h, "stranger", 1)
    # An administrative commit (generation -1, no member) only while the group is empty.
    with pytest.raises(errors.UnknownMemberId):
        commit(h, "", -1)
    join(h, leader)
    join(h, follower)
    # CompletingRebalance: the member has the new generation but no assignment yet.
    with pytest.raises(errors.RebalanceInProgress):
        commit(h, follower, 2)
    assert (
        h.shard.fetch_offsets(
            messages.OffsetFetchRequest(GROUP, member_id="anyone", member_epoch=99)
        )
        .offsets[("t", 0)]
        .offset
        == 5
    )


def test_an_empty_classic_group_takes_admin_commits_and_expires_with_its_offsets() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    commit(h, follower, 1)
    leave(h, messages.ClassicLeavingMember(leader), messages.ClassicLeavingMember(follower))
    h.tick(0)
    assert state(h) == "Empty"
    empty_at = h.now_ms
    assert commit(h, "", -1) == messages.OffsetCommitResponse()
    retention_ms = 7 * 24 * 3600 * 1000
    assert h.shard.armed_timers()[timers.retention_key(GROUP)].deadline_ms == (
        empty_at + retention_ms
    )
    h.now_ms = empty_at + retention_ms
    expired = h.tick(0)
    assert expired.records == [
        records.new_offset_commit_tombstone(GROUP, "t", 0),
        records.new_group_metadata_tombstone(GROUP),
    ]
    assert h.shard.list_groups() == []


# ---------------------------------------------------------------------------------------
# Load: the state topic rebuilds the group as Kafka's replay does


def test_a_load_rebuilds_a_stable_group_and_starts_every_session() -> None:
    h = harness()
    leader, follower = stable_pair(h)
    loaded = h.replayed()
    assert loaded.canonical_state()["classic_groups"] == {
        GROUP: {
            "state": "STABLE",
            "generation": 1,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "leader": leader,
            "members": [
                (leader, None, (RANGE,), b"A"),
                (follower, None, (RANGE,), b"B"),
            ],
        }
    }
    armed = loaded.armed_timers()
    assert armed[timers.classic_heartbeat_key(GROUP, leader)].deadline_ms == h.now_ms + SESSION_MS
    assert armed[timers.classic_heartbeat_key(GROUP, follower)].deadline_ms == (
        h.now_ms + SESSION_MS
    )


def test_a_new_member_parked_past_its_join_timeout_is_answered_and_removed() -> None:
    h = Harness(
        settings=coordinator_config.CoordinatorConfig(
            initial_rebalance_delay_ms=0, new_member_join_timeout_ms=5_000
        ),
        new_uuid=iter(f"uuid{n}" for n in itertools.count()).__next__,
    )
    leader, follower = stable_pair(h)
    h.completions.clear()
    # A third member joins: a rebalance the others must rejoin; only the leader does.
    newcomer = join(h).response.key.member_id
    join(h, leader)
    h.tick(4_999)
    heartbeat(h, follower, 1)
    assert h.completions == []
    h.tick(1)
    # Kafka's removeMemberAndUpdateClassicGroup: answered UNKNOWN_MEMBER_ID, then removed.
    assert isinstance(answer(h, "join", newcomer).error, errors.UnknownMemberId)
    assert newcomer not in {m.member_id for m in h.shard.describe_group(GROUP).members}
    assert state(h) == "PreparingRebalance"


def test_a_scale_down_removes_static_members_of_a_classic_group_at_once() -> None:
    h = harness()
    leader = join(h, instance_id="pod-0").response.key.member_id
    follower = join(h, instance_id="pod-1").response.key.member_id
    end_join_phase(h)
    sync(h, follower, 1, instance_id="pod-1")
    sync(h, leader, 1, {leader: b"L", follower: b"F"}, instance_id="pod-0")
    removed = h.apply(
        h.shard.remove_members(messages.RemoveMembersRequest(GROUP, ("pod-1", "pod-7")), h.now_ms)
    )
    assert removed.response == {"pod-1": None, "pod-7": "UNKNOWN_MEMBER_ID"}
    # The leader is told to rejoin and reassigns without pod-1.
    assert state(h) == "PreparingRebalance"
    assert [m.member_id for m in h.shard.describe_group(GROUP).members] == [leader]
