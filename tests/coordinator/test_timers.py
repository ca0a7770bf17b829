"""Soft deadlines: re-arming, cancelling, expiry that waits for replay to disarm, and loads."""

from __future__ import annotations

from kafka_group_operator.coordinator import messages, shard, timers
from tests.coordinator.harness import GROUP, TOPIC, Harness, parts

DAY_MS = 24 * 3600 * 1000


def test_rearming_replaces_the_deadline() -> None:
    deadlines = timers.Deadlines()
    session = timers.session_key("g", "m")
    deadlines.arm(session, 100)
    deadlines.arm(session, 300)
    deadlines.arm(timers.retention_key("g"), 200)
    assert deadlines.next_deadline_ms() == 200
    assert deadlines.due(250) == [(timers.retention_key("g"), timers.Armed(200, 0))]


def test_due_deadlines_stay_armed_until_cancelled() -> None:
    deadlines = timers.Deadlines()
    rebalance = timers.rebalance_key("g", "m")
    deadlines.arm(rebalance, 100, tag=7)
    assert deadlines.due(100) == [(rebalance, timers.Armed(100, 7))]
    # The write of the fencing records may fail: the deadline is still due next time.
    assert deadlines.due(150) == [(rebalance, timers.Armed(100, 7))]
    deadlines.cancel(rebalance)
    assert deadlines.due(200) == []
    assert deadlines.next_deadline_ms() is None


def test_many_heartbeats_do_not_grow_the_heap_without_bound() -> None:
    deadlines = timers.Deadlines()
    for now in range(10_000):
        deadlines.arm(timers.session_key("g", f"m{now % 10}"), now + 45_000)
    assert len(deadlines) == 10
    assert len(deadlines._heap) <= 4 * 10 + 65
    assert deadlines.next_deadline_ms() == 9_990 + 45_000


def retention_timers(coordinator: shard.CoordinatorShard) -> dict[timers.TimerKey, timers.Armed]:
    return {
        key: armed
        for key, armed in coordinator.armed_timers().items()
        if key.kind is timers.TimerKind.RETENTION
    }


def test_a_load_arms_the_timers_live_replay_left_armed() -> None:
    harness = Harness()
    harness.topics({TOPIC: 4})
    harness.configure(assignor="range", offsets_retention_ms=DAY_MS, rebalance_timeout_ms=9_000)
    # orders: two members, m0 still revoking (a rebalance deadline), commits by both.
    harness.heartbeat("m0", 0, instance_id="g-0")
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3))
    harness.heartbeat("m1", 0, instance_id="g-1")
    harness.heartbeat("m0", 1, owned=parts(0, 1, 2, 3))
    harness.commit("m0", 1, {(TOPIC, 0): 5, (TOPIC, 3): 9})
    # idle (default retention, 7 days): emptied after a commit; its deadline runs from then.
    harness.heartbeat("x0", 0, group_id="idle")
    harness.heartbeat("x0", 1, group_id="idle", owned=parts(0, 1, 2, 3))
    harness.apply(
        harness.shard.commit_offsets(
            messages.OffsetCommitRequest("idle", "x0", 1, {(TOPIC, 1): messages.CommitOffset(3)}),
            harness.now_ms,
        )
    )
    harness.heartbeat("x0", messages.LEAVE_EPOCH, group_id="idle")
    # restored: administrative commits only, at two times.
    for now_ms, offset in ((harness.now_ms, 1), (harness.now_ms + 5, 2)):
        harness.apply(
            harness.shard.commit_offsets(
                messages.OffsetCommitRequest(
                    "restored", "", -1, {(TOPIC, 0): messages.CommitOffset(offset)}
                ),
                now_ms,
            )
        )
    live = harness.shard.armed_timers()
    # Every kind but a classic member's sync timeout, which no load restores (as in Kafka,
    # whose onLoaded re-arms sessions and rebalance timeouts only).
    # Every kind a consumer group uses (classic groups' timers: tests/coordinator/
    # test_classic_group.py).
    assert {key.kind for key in live} == set(timers.TimerKind) - {
        timers.TimerKind.SYNC,
        timers.TimerKind.CLASSIC_HEARTBEAT,
        timers.TimerKind.CLASSIC_JOIN,
        timers.TimerKind.CLASSIC_SYNC,
    }
    assert retention_timers(harness.shard) == {
        timers.retention_key("idle"): timers.Armed(harness.now_ms + 7 * DAY_MS, 0),
        timers.retention_key("restored"): timers.Armed(harness.now_ms + 5 + 7 * DAY_MS, 0),
    }

    # Every live operation above ran at one instant, so the load restarts even the session
    # and rebalance deadlines exactly where live operation left them.
    loaded = harness.replayed()
    assert loaded.armed_timers() == live
    assert loaded.next_deadline_ms() == harness.shard.next_deadline_ms()


def test_loading_replays_arm_nothing_until_loaded() -> None:
    harness = Harness()
    harness.heartbeat("m0", 0)
    harness.commit("m0", 1, {})
    harness.heartbeat("m0", messages.LEAVE_EPOCH)
    admin = messages.OffsetCommitRequest(GROUP, "", -1, {(TOPIC, 0): messages.CommitOffset(7)})
    harness.apply(harness.shard.commit_offsets(admin, harness.now_ms))
    loading = shard.CoordinatorShard()
    for record in harness.log:
        loading.replay(record)
    assert loading.armed_timers() == {}
    loading.on_loaded(harness.now_ms)
    assert loading.armed_timers() == harness.shard.armed_timers() != {}
