"""Classic-protocol members of a consumer group: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

The scenarios follow Kafka's ``GroupMetadataManager`` classic-to-consumer-group paths: a
classic member is a member of the consumer group whose generation is its member epoch; the
server-side assignor computes its target; REBALANCE_IN_PROGRESS on Heartbeat makes it join
again to revoke. Exact targets use the ``range`` assignor (fixed by Kafka's definition).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from kafka_group_operator.coordinator import errors, group_state, messages, records, timers
from kafka_group_records import codec
from kafka_group_records import records as schema
from tests.coordinator.harness import (
    GROUP,
    TOPIC,
    Harness,
    current,
    parts,
    target,
    topic_metadata,
)

STABLE = group_state.MemberState.STABLE
UNREVOKED = group_state.MemberState.UNREVOKED_PARTITIONS
RANGE = (schema.ClassicProtocol("range", b"subscription"),)
COOPERATIVE = (schema.ClassicProtocol("cooperative-sticky", b"subscription"),)


def ranged(partitions: int = 4) -> Harness:
    harness = Harness()
    harness.topics({TOPIC: partitions})
    harness.configure(assignor="range")
    return harness


def join(
    harness: Harness,
    member_id: str = "",
    *,
    owned: Mapping[str, frozenset[int]] | None = None,
    instance_id: str | None = None,
    protocols: tuple[schema.ClassicProtocol, ...] = RANGE,
    protocol_type: str = "consumer",
    session_timeout_ms: int = 10_000,
    require_known_member_id: bool = False,
) -> messages.ClassicJoinResponse:
    request = messages.ClassicJoinRequest(
        group_id=GROUP,
        member_id=member_id,
        instance_id=instance_id,
        protocol_type=protocol_type,
        protocols=protocols,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=60_000,
        subscribed_topic_names=(TOPIC,),
        owned_partitions=owned or {},
        require_known_member_id=require_known_member_id,
    )
    return harness.apply(harness.shard.classic_join(request, harness.now_ms)).response


def sync(
    harness: Harness, member_id: str, generation: int, **fields: str | None
) -> messages.ClassicSyncResponse:
    request = messages.ClassicSyncRequest(GROUP, member_id, generation, **fields)
    outcome = harness.shard.classic_sync(request, harness.now_ms)
    assert outcome.records == []
    return outcome.response


def heartbeat(
    harness: Harness, member_id: str, generation: int, instance_id: str | None = None
) -> bool:
    request = messages.ClassicHeartbeatRequest(GROUP, member_id, generation, instance_id)
    outcome = harness.shard.classic_heartbeat(request, harness.now_ms)
    assert outcome.records == []
    return outcome.response.rebalance_in_progress


def leave(harness: Harness, *members: tuple[str, str | None]) -> tuple[str | None, ...]:
    request = messages.ClassicLeaveRequest(
        GROUP, tuple(messages.ClassicLeavingMember(m, i) for m, i in members)
    )
    return harness.apply(harness.shard.classic_leave(request, harness.now_ms)).response.errors


def test_join_then_sync_hands_out_the_assignment() -> None:
    harness = ranged()
    joined = join(harness, instance_id="pod-0")

    assert joined.generation_id == 1
    assert joined.protocol_name == "range"
    member_id = joined.member_id
    classic = schema.ClassicMemberMetadata(10_000, RANGE)
    # The same records as a KIP-848 join; the subscription carries the classic metadata.
    assert harness.log[-6:] == [
        records.new_group_epoch_record(GROUP, 1),
        topic_metadata(4),
        records.new_member_subscription_record(
            GROUP,
            member_id,
            schema.ConsumerGroupMemberMetadataValue(
                instance_id="pod-0",
                subscribed_topic_names=(TOPIC,),
                rebalance_timeout_ms=60_000,
                classic_member_metadata=classic,
            ),
        ),
        target(member_id, 0, 1, 2, 3),
        records.new_target_assignment_epoch_record(GROUP, 1),
        current(member_id, 1, 0, STABLE, (0, 1, 2, 3)),
    ]
    assert sync(harness, member_id, 1) == messages.ClassicSyncResponse(
        "consumer", "range", parts(0, 1, 2, 3)
    )
    assert heartbeat(harness, member_id, 1) is False
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_classic_metadata_record_bytes() -> None:
    # ConsumerGroupMemberMetadataValue v0 (Kafka's ConsumerGroupMemberMetadataValue.json):
    # InstanceId, RackId (compact nullable strings), ClientId, ClientHost (compact
    # strings), SubscribedTopicNames (compact array), SubscribedTopicRegex, RebalanceTimeoutMs
    # int32, ServerAssignor, then the tagged fields: tag 0 ClassicMemberMetadata =
    # SessionTimeoutMs int32, SupportedProtocols compact array of (Name compact string,
    # Metadata compact bytes, tagged fields), tagged fields.
    value = schema.ConsumerGroupMemberMetadataValue(
        client_id="c",
        subscribed_topic_names=("t",),
        classic_member_metadata=schema.ClassicMemberMetadata(
            45_000, (schema.ClassicProtocol("range", b"\x00\x01"),)
        ),
    )
    expected = bytes.fromhex(
        "0000"  # value version 0
        "00"  # InstanceId null
        "00"  # RackId null
        "0263"  # ClientId "c"
        "01"  # ClientHost ""
        "020274"  # SubscribedTopicNames ["t"]
        "00"  # SubscribedTopicRegex null
        "ffffffff"  # RebalanceTimeoutMs -1
        "00"  # ServerAssignor null
        "01"  # one tagged field
        "00"  # tag 0
        "10"  # 16 bytes
        "0000afc8"  # SessionTimeoutMs 45000
        "02"  # one protocol
        "0672616e6765"  # "range"
        "030001"  # metadata 00 01
        "00"  # protocol's tagged fields
        "00"  # ClassicMemberMetadata's tagged fields
    )
    key = schema.ConsumerGroupMemberMetadataKey(GROUP, "m")
    assert codec.encode_value(value) == expected
    assert codec.decode_value(key, expected) == value
    plain = dataclasses.replace(value, classic_member_metadata=None)
    assert codec.decode_value(key, codec.encode_value(plain)) == plain


def test_second_member_joins_and_the_cooperative_first_revokes_what_sync_no_longer_lists() -> None:
    harness = ranged()
    # Instance ids fix the range assignor's member order.
    first = join(harness, protocols=COOPERATIVE, instance_id="pod-0").member_id
    second = join(harness, protocols=COOPERATIVE, instance_id="pod-1")
    assert second.generation_id == 2
    # Its partitions are still the first member's: it waits (and has nothing yet).
    assert sync(harness, second.member_id, 2).assignment == {}
    assert heartbeat(harness, second.member_id, 2) is False

    # The first member is behind the group epoch: it must join again.
    assert heartbeat(harness, first, 1) is True
    with pytest.raises(errors.RebalanceInProgress):
        sync(harness, first, 1)
    rejoined = join(
        harness, first, owned=parts(0, 1, 2, 3), protocols=COOPERATIVE, instance_id="pod-0"
    )
    # Revoking: it keeps its epoch, and SyncGroup lists only what it keeps.
    assert rejoined.generation_id == 1
    assert sync(harness, first, 1).assignment == parts(0, 1)
    assert heartbeat(harness, first, 1) is True
    rejoined = join(harness, first, owned=parts(0, 1), protocols=COOPERATIVE, instance_id="pod-0")
    assert rejoined.generation_id == 2
    assert sync(harness, first, 2).assignment == parts(0, 1)
    assert heartbeat(harness, first, 2) is False

    # Released: the second member joins again and gets them.
    assert heartbeat(harness, second.member_id, 2) is True
    rejoined = join(harness, second.member_id, protocols=COOPERATIVE, instance_id="pod-1")
    assert rejoined.generation_id == 2
    assert sync(harness, second.member_id, 2).assignment == parts(2, 3)
    assert heartbeat(harness, second.member_id, 2) is False
    assert harness.shard.describe_group(GROUP).state == "Stable"
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_an_eager_member_revokes_everything_and_rejoins_owning_nothing() -> None:
    harness = ranged()
    first = join(harness, instance_id="pod-0").member_id
    second = join(harness, instance_id="pod-1").member_id
    assert heartbeat(harness, first, 1) is True
    # An eager client revoked everything before joining again: it reports owning nothing.
    assert join(harness, first, owned={}, instance_id="pod-0").generation_id == 2
    assert sync(harness, first, 2).assignment == parts(0, 1)
    assert heartbeat(harness, second, 2) is True
    join(harness, second, instance_id="pod-1")
    assert sync(harness, second, 2).assignment == parts(2, 3)


def test_static_member_restarted_within_the_session_timeout_moves_nothing() -> None:
    harness = ranged()
    old = join(harness, instance_id="pod-0").member_id
    other = join(harness, instance_id="pod-1").member_id
    join(harness, old, owned=parts(0, 1))
    join(harness, other)
    group_epoch = harness.shard.describe_group(GROUP).group_epoch
    before = len(harness.log)

    # The restarted pod has forgotten its member id; its instance id brings it back.
    restarted = join(harness, instance_id="pod-0", owned={})
    assert restarted.member_id != old
    assert restarted.generation_id == group_epoch
    assert sync(harness, restarted.member_id, group_epoch).assignment == parts(0, 1)
    assert sync(harness, other, group_epoch).assignment == parts(2, 3)
    assert harness.shard.describe_group(GROUP).group_epoch == group_epoch
    written = harness.log[before:]
    assert not any(isinstance(record.key, schema.ConsumerGroupMetadataKey) for record in written)
    # The old member id is fenced everywhere.
    with pytest.raises(errors.FencedInstanceId):
        heartbeat(harness, old, group_epoch, instance_id="pod-0")
    with pytest.raises(errors.FencedInstanceId):
        join(harness, old, instance_id="pod-0")
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_protocol_type_and_vote() -> None:
    harness = ranged()
    with pytest.raises(errors.InconsistentGroupProtocol):
        join(harness, protocol_type="connect")
    with pytest.raises(errors.InconsistentGroupProtocol):
        join(harness, protocols=())
    first = join(harness).member_id
    roundrobin = schema.ClassicProtocol("roundrobin", b"")
    with pytest.raises(errors.InconsistentGroupProtocol):
        join(harness, protocols=(roundrobin,))
    # Sharing one protocol is enough.
    assert join(harness, protocols=(roundrobin, *RANGE)).protocol_name == "roundrobin"
    with pytest.raises(errors.InconsistentGroupProtocol):
        sync(harness, first, 1, protocol_name="roundrobin")
    with pytest.raises(errors.InconsistentGroupProtocol):
        sync(harness, first, 1, protocol_type="connect")


def test_stale_generation_commit_is_illegal_generation() -> None:
    harness = ranged()
    first = join(harness, instance_id="pod-0").member_id
    assert harness.commit(first, 1, {(TOPIC, 0): 5}).response.errors == {}
    join(harness, instance_id="pod-1")
    join(harness, first, owned={}, instance_id="pod-0")  # generation 2 now, owning 0 and 1
    with pytest.raises(errors.IllegalGeneration):
        harness.commit(first, 1, {(TOPIC, 0): 6})
    with pytest.raises(errors.IllegalGeneration):
        heartbeat(harness, first, 1)
    with pytest.raises(errors.IllegalGeneration):
        sync(harness, first, 1)
    assert harness.commit(first, 2, {(TOPIC, 0): 6}).response.errors == {}


def test_unknown_members() -> None:
    harness = ranged()
    with pytest.raises(errors.UnknownMemberId):
        heartbeat(harness, "nobody", 0)
    join(harness)
    with pytest.raises(errors.UnknownMemberId):
        heartbeat(harness, "nobody", 1)
    with pytest.raises(errors.UnknownMemberId):
        sync(harness, "nobody", 1)
    # A static member joining with an id must hold its instance id.
    with pytest.raises(errors.UnknownMemberId):
        join(harness, "nobody", instance_id="pod-9")
    with pytest.raises(errors.UnknownMemberId):
        heartbeat(harness, "nobody", 1, instance_id="pod-9")
    # A KIP-848 member cannot use the classic APIs.
    harness.heartbeat("kip848", 0)
    with pytest.raises(errors.UnknownMemberId):
        heartbeat(harness, "kip848", 2)


def test_member_id_required_writes_nothing() -> None:
    harness = ranged()
    before = len(harness.log)
    with pytest.raises(errors.MemberIdRequired) as raised:
        join(harness, require_known_member_id=True)
    assert raised.value.member_id
    assert len(harness.log) == before
    joined = join(harness, raised.value.member_id, require_known_member_id=True)
    assert joined.member_id == raised.value.member_id


def test_invalid_session_timeout() -> None:
    harness = ranged()
    with pytest.raises(errors.InvalidSessionTimeout):
        join(harness, session_timeout_ms=5_999)
    with pytest.raises(errors.InvalidSessionTimeout):
        join(harness, session_timeout_ms=1_800_001)


def test_the_member_own_session_timeout_fences_it() -> None:
    harness = ranged()
    harness.configure(assignor="range", session_timeout_ms=45_000)
    member_id = join(harness, session_timeout_ms=10_000).member_id
    harness.tick(9_000)
    assert heartbeat(harness, member_id, 1) is False
    harness.tick(9_000)
    assert member_id in harness.shard.describe_group(GROUP).members[0].member_id
    harness.tick(10_001)
    assert harness.shard.describe_group(GROUP).members == ()
    # After a reload the timer comes from the member's own session timeout too.
    member_id = join(harness, session_timeout_ms=10_000).member_id
    reloaded = harness.replayed()
    armed = reloaded.armed_timers()
    sessions = [a.deadline_ms for k, a in armed.items() if k.member_id == member_id]
    assert sessions == [harness.now_ms + 10_000]


def test_leave_by_member_id_and_by_instance_id() -> None:
    harness = ranged()
    dynamic = join(harness).member_id
    static = join(harness, instance_id="pod-1").member_id
    static2 = join(harness, instance_id="pod-2").member_id
    outcome = leave(
        harness,
        (dynamic, None),
        ("", "pod-1"),
        ("someone-else", "pod-2"),
        ("nobody", None),
        ("", "pod-9"),
    )
    assert outcome == (
        None,
        None,
        errors.FencedInstanceId.name,
        errors.UnknownMemberId.name,
        errors.UnknownMemberId.name,
    )
    remaining = [m.member_id for m in harness.shard.describe_group(GROUP).members]
    assert remaining == [static2]
    assert static not in remaining
    # The survivor gets everything back on its next join.
    assert heartbeat(harness, static2, 3, instance_id="pod-2") is True
    generation = join(harness, static2, instance_id="pod-2").generation_id
    assert sync(harness, static2, generation, instance_id="pod-2").assignment == parts(0, 1, 2, 3)
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_mixed_group_with_a_kip848_member() -> None:
    harness = ranged()
    classic_id = join(harness).member_id
    joined = harness.heartbeat("kip848", 0)
    assert joined.response.member_epoch == 2
    # The classic member revokes through a rejoin; the KIP-848 one then gets its share.
    assert heartbeat(harness, classic_id, 1) is True
    join(harness, classic_id, owned={})
    got = harness.heartbeat("kip848", 2, owned={})
    assert got.response.assignment is not None
    classic_share = sync(harness, classic_id, 2).assignment
    assert set(classic_share.get(TOPIC, ())) | set(got.response.assignment.get(TOPIC, ())) == {
        0,
        1,
        2,
        3,
    }


def test_a_member_told_to_rejoin_that_never_does_is_removed_after_its_rebalance_timeout() -> None:
    harness = ranged()
    stuck = join(harness, instance_id="pod-0").member_id
    sync(harness, stuck, 1, instance_id="pod-0")
    other = join(harness, instance_id="pod-1").member_id
    sync(harness, other, 2, instance_id="pod-1")
    # Told to join again (its rebalance timeout is 60 s); it keeps heartbeating instead.
    assert heartbeat(harness, stuck, 1, instance_id="pod-0") is True
    for _ in range(6):  # 54 s, each heartbeat inside its 10 s session timeout
        harness.tick(9_000)
        assert heartbeat(harness, stuck, 1, instance_id="pod-0") is True
        # The newcomer waits for the partitions the stuck member holds.
        assert heartbeat(harness, other, 2, instance_id="pod-1") is False
    members = [m.member_id for m in harness.shard.describe_group(GROUP).members]
    assert members == [stuck, other]
    harness.tick(7_000)  # 61 s: the join timeout, not the session, removes it
    members = [m.member_id for m in harness.shard.describe_group(GROUP).members]
    assert members == [other]
    assert heartbeat(harness, other, 2, instance_id="pod-1") is True
    generation = join(harness, other, instance_id="pod-1").generation_id
    assert sync(harness, other, generation, instance_id="pod-1").assignment == parts(0, 1, 2, 3)


def test_a_member_that_rejoins_in_time_is_not_removed_by_its_join_timeout() -> None:
    harness = ranged()
    first = join(harness, instance_id="pod-0").member_id
    sync(harness, first, 1, instance_id="pod-0")
    other = join(harness, instance_id="pod-1").member_id
    sync(harness, other, 2, instance_id="pod-1")
    assert heartbeat(harness, first, 1, instance_id="pod-0") is True
    harness.tick(9_000)
    assert join(harness, first, owned={}, instance_id="pod-0").generation_id == 2
    sync(harness, first, 2, instance_id="pod-0")
    heartbeat(harness, other, 2, instance_id="pod-1")
    for _ in range(7):  # 72 s after it was told to join again: past its rebalance timeout
        harness.tick(9_000)
        assert heartbeat(harness, first, 2, instance_id="pod-0") is False
        heartbeat(harness, other, 2, instance_id="pod-1")
    members = [m.member_id for m in harness.shard.describe_group(GROUP).members]
    assert members == [first, other]


def test_a_member_that_joins_but_never_syncs_is_removed_after_its_rebalance_timeout() -> None:
    """Kafka's sync timeout: JoinGroup arms the member's rebalance timeout (60 s here, longer
    than its 10 s session timeout, which its heartbeats keep alive), SyncGroup cancels it."""
    harness = ranged()
    synced = join(harness, instance_id="pod-0").member_id
    sync(harness, synced, 1, instance_id="pod-0")
    silent = join(harness, instance_id="pod-1").member_id
    for _ in range(6):  # 54 s, each heartbeat inside the 10 s session timeout
        harness.tick(9_000)
        heartbeat(harness, synced, 1, instance_id="pod-0")
        heartbeat(harness, silent, 2, instance_id="pod-1")
    members = [m.member_id for m in harness.shard.describe_group(GROUP).members]
    assert members == [synced, silent]
    before = len(harness.log)
    harness.tick(6_001)  # 60 s after its join: removed, its tombstones written
    written = harness.log[before:]
    tombstones = records.new_member_tombstones(GROUP, silent)
    assert written[1 : 1 + len(tombstones)] == tombstones  # after the group epoch's bump
    assert [m.member_id for m in harness.shard.describe_group(GROUP).members] == [synced]
    # Its timers went with it.
    assert not [key for key in harness.shard.armed_timers() if key.member_id == silent]
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_a_sync_refused_for_a_rebalance_does_not_cancel_the_sync_timeout() -> None:
    harness = ranged()
    first = join(harness, instance_id="pod-0").member_id
    join(harness, instance_id="pod-1")  # the group moves to epoch 2 before first syncs
    with pytest.raises(errors.RebalanceInProgress):
        # first is not revoking yet (its heartbeat would tell it), so it must join again.
        sync(harness, first, 1, instance_id="pod-0")
    assert harness.shard.armed_timers().get(timers.sync_key(GROUP, first)) is not None
