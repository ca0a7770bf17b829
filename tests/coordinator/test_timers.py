"""Soft deadlines: re-arming, cancelling, and expiry that waits for replay to disarm."""

from __future__ import annotations

from kafka_group_operator.coordinator import timers


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
