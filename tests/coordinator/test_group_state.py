"""Transition tables (h11-style table tests) and the error hierarchy's Kafka codes."""

from __future__ import annotations

import itertools

import pytest

from kafka_group_operator.coordinator import errors, group_state, messages, records, shard
from tests.coordinator.harness import GROUP, TOPIC, Harness, current, parts, subscription

Group = group_state.GroupState
MemberState = group_state.MemberState

LEGAL_GROUP_MOVES = {
    (Group.EMPTY, Group.ASSIGNING),
    (Group.ASSIGNING, Group.EMPTY),
    (Group.ASSIGNING, Group.RECONCILING),
    (Group.ASSIGNING, Group.STABLE),
    (Group.ASSIGNING, Group.PAUSED),
    (Group.RECONCILING, Group.EMPTY),
    (Group.RECONCILING, Group.ASSIGNING),
    (Group.RECONCILING, Group.STABLE),
    (Group.RECONCILING, Group.PAUSED),
    (Group.STABLE, Group.EMPTY),
    (Group.STABLE, Group.ASSIGNING),
    (Group.STABLE, Group.RECONCILING),
    (Group.PAUSED, Group.EMPTY),
    (Group.PAUSED, Group.ASSIGNING),
    (Group.PAUSED, Group.RECONCILING),
    (Group.EMPTY, Group.DEAD),
}


@pytest.mark.parametrize(
    ("state", "next_state"),
    [(a, b) for a, b in itertools.product(Group, Group) if a is not b],
    ids=lambda state: state.name,
)
def test_group_transition_table(state: Group, next_state: Group) -> None:
    if (state, next_state) in LEGAL_GROUP_MOVES:
        group_state.check_group_transition("g", state, next_state, "event")
    else:
        with pytest.raises(errors.IllegalStateTransition) as illegal:
            group_state.check_group_transition("g", state, next_state, "SomeRecord")
        assert (illegal.value.state, illegal.value.next_state) == (state.name, next_state.name)
        assert illegal.value.event == "SomeRecord"
        assert "SomeRecord" in str(illegal.value)


def test_dead_is_final_and_reached_only_from_empty() -> None:
    assert group_state.VALID_PREVIOUS_GROUP_STATES[Group.DEAD] == {Group.EMPTY}
    for state in Group:
        assert Group.DEAD not in group_state.VALID_PREVIOUS_GROUP_STATES[state]


def test_member_table_never_enters_unknown() -> None:
    reconciling = [
        MemberState.STABLE,
        MemberState.UNREVOKED_PARTITIONS,
        MemberState.UNRELEASED_PARTITIONS,
    ]
    for state, next_state in itertools.product(MemberState, reconciling):
        group_state.check_member_transition("m", state, next_state, "event")
    for state in reconciling:
        with pytest.raises(errors.IllegalStateTransition):
            group_state.check_member_transition("m", state, MemberState.UNKNOWN, "event")
    assert group_state.member_state_from_id(7) is MemberState.UNKNOWN
    assert group_state.member_state_from_id(3) is MemberState.UNKNOWN


def test_member_state_ids_are_kafkas() -> None:
    # apache/kafka group-coordinator/src/main/java/org/apache/kafka/coordinator/group/modern/
    # MemberState.java: STABLE((byte) 0), UNREVOKED_PARTITIONS((byte) 1),
    # UNRELEASED_PARTITIONS((byte) 2), UNKNOWN((byte) 127).
    kafka = {"STABLE": 0, "UNREVOKED_PARTITIONS": 1, "UNRELEASED_PARTITIONS": 2, "UNKNOWN": 127}
    assert {state.name: state.value for state in MemberState} == kafka
    for name, value in kafka.items():
        assert group_state.member_state_from_id(value) is MemberState[name]


def test_live_replay_enforces_the_table() -> None:
    harness = Harness()
    harness.topics({TOPIC: 2})
    harness.configure()
    # A member record that skips the group-epoch bump would take EMPTY straight to STABLE.
    with pytest.raises(errors.IllegalStateTransition) as illegal:
        harness.shard.replay(subscription("m0"))
    assert (illegal.value.state, illegal.value.next_state) == ("EMPTY", "STABLE")
    assert illegal.value.event == "ConsumerGroupMemberMetadataKey"


def test_loading_replays_any_order_and_checks_once_loaded() -> None:
    loading = shard.CoordinatorShard()
    loading.replay(subscription("m0"))
    loading.replay(current("m0", 0, 0, MemberState.STABLE))
    loading.on_loaded(0)
    assert loading.describe_group(GROUP).state == "Stable"


def test_replay_refuses_a_partition_owned_twice() -> None:
    harness = Harness()
    harness.topics({TOPIC: 2})
    harness.configure(assignor="range")
    harness.heartbeat("m0", 0)
    harness.heartbeat("m1", 0)
    with pytest.raises(errors.InconsistentState):
        harness.shard.replay(current("m1", 2, 0, MemberState.STABLE, (0,)))


def test_states_through_a_life_cycle() -> None:
    harness = Harness()
    harness.topics({TOPIC: 2})
    harness.configure(assignor="range")
    seen = [harness.shard.describe_group(GROUP).state]
    harness.heartbeat("m0", 0)
    seen.append(harness.shard.describe_group(GROUP).state)
    harness.heartbeat("m1", 0)
    seen.append(harness.shard.describe_group(GROUP).state)
    harness.heartbeat("m0", 1, owned=parts(0, 1))
    harness.heartbeat("m0", 1, owned=parts(0))
    harness.heartbeat("m1", 2, owned={})
    seen.append(harness.shard.describe_group(GROUP).state)
    harness.heartbeat("m0", -1)
    harness.heartbeat("m1", -1)
    seen.append(harness.shard.describe_group(GROUP).state)
    harness.apply(harness.shard.delete_group(messages.DeleteGroupRequest(GROUP), 0))
    assert seen == ["Empty", "Stable", "Reconciling", "Stable", "Empty"]
    assert harness.shard.list_groups() == []


def test_every_error_carries_its_kafka_code() -> None:
    expected = {
        "COORDINATOR_LOAD_IN_PROGRESS": 14,
        "NOT_COORDINATOR": 16,
        "OFFSET_METADATA_TOO_LARGE": 12,
        "UNKNOWN_MEMBER_ID": 25,
        "INVALID_SESSION_TIMEOUT": 26,
        "REBALANCE_IN_PROGRESS": 27,
        "INVALID_REQUEST": 42,
        "NON_EMPTY_GROUP": 68,
        "GROUP_ID_NOT_FOUND": 69,
        "FENCED_INSTANCE_ID": 82,
        "FENCED_MEMBER_EPOCH": 110,
        "UNRELEASED_INSTANCE_ID": 111,
        "UNSUPPORTED_ASSIGNOR": 112,
        "STALE_MEMBER_EPOCH": 113,
    }
    for name, code in expected.items():
        error = errors.BY_NAME[name]("detail")
        assert (error.code, error.name, errors.BY_CODE[code]) == (code, name, type(error))
        assert error.to_dict() == {"error": name, "code": code, "message": "detail"}
        assert isinstance(error, errors.CoordinatorError)
    assert len(errors.BY_CODE) == len(errors.ALL_ERRORS)


def test_a_record_helper_round_trips_through_replay() -> None:
    harness = Harness()
    harness.apply(harness.shard.configure_group(messages.GroupSettings(GROUP), 0))
    harness.shard.replay(records.new_group_lifecycle_record(GROUP, 5))
    assert harness.shard.canonical_state()["groups"][GROUP]["empty_since_ms"] == 5
