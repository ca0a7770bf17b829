"""Lag verdicts: Burrow's rules, each on commit histories built by hand, and Burrow's own
test table (linkedin/Burrow ``core/internal/evaluator/caching_test.go``, ``tests``) ported
with its expected results: Burrow's timestamps are in milliseconds and its ``timeNow`` in
seconds, as here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from kafka_group_operator.coordinator import lag_health
from kafka_group_operator.coordinator.lag_health import Commit, Verdict


@dataclass(frozen=True)
class BurrowCase:
    index: int
    commits: Sequence[tuple[int, int, int | None]]
    log_ends: Sequence[int]
    current_lag: int
    now_s: int
    allowed_lag: int
    always_not_zero: bool
    rewind: int
    stopped: bool
    stalled: bool
    not_decreasing: bool
    recent_zero: bool
    verdict: Verdict


BURROW_TESTS = [
    # 0 - returns OK because there is zero lag somewhere
    BurrowCase(
        0,
        commits=[
            (1000, 100000, 0),
            (2000, 200000, 50),
            (3000, 300000, 100),
            (4000, 400000, 150),
            (5000, 500000, 200),
        ],
        log_ends=[5200],
        current_lag=200,
        now_s=600,
        allowed_lag=0,
        always_not_zero=False,
        rewind=-1,
        stopped=False,
        stalled=False,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 1 - same status. does not return true for stop because time since last commit (400s) is
    # equal to the difference (500-100), not greater than
    BurrowCase(
        1,
        commits=[
            (1000, 100000, 0),
            (2000, 200000, 50),
            (3000, 300000, 100),
            (4000, 400000, 150),
            (5000, 500000, 200),
        ],
        log_ends=[5200],
        current_lag=200,
        now_s=900,
        allowed_lag=0,
        always_not_zero=False,
        rewind=-1,
        stopped=False,
        stalled=False,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 2 - status is now STOP because the time since last commit is great enough (500s), even
    # though lag is zero at the start (fixed due to #290)
    BurrowCase(
        2,
        commits=[
            (1000, 100000, 0),
            (2000, 200000, 50),
            (3000, 300000, 100),
            (4000, 400000, 150),
            (5000, 500000, 200),
        ],
        log_ends=[5200],
        current_lag=200,
        now_s=1000,
        allowed_lag=0,
        always_not_zero=False,
        rewind=-1,
        stopped=True,
        stalled=False,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.STOP,
    ),
    # 3 - status is STOP when lag is always non-zero as well
    BurrowCase(
        3,
        commits=[
            (1000, 100000, 50),
            (2000, 200000, 100),
            (3000, 300000, 150),
            (4000, 400000, 200),
            (5000, 500000, 250),
        ],
        log_ends=[5250],
        current_lag=250,
        now_s=1000,
        allowed_lag=0,
        always_not_zero=True,
        rewind=-1,
        stopped=True,
        stalled=False,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.STOP,
    ),
    # 4 - status is OK because of zero lag, but stall is true because the offset is always the
    # same and there is lag (another commit with turn this to stall)
    BurrowCase(
        4,
        commits=[
            (1000, 100000, 0),
            (1000, 200000, 50),
            (1000, 300000, 100),
            (1000, 400000, 150),
            (1000, 500000, 200),
        ],
        log_ends=[1200],
        current_lag=200,
        now_s=600,
        allowed_lag=0,
        always_not_zero=False,
        rewind=-1,
        stopped=False,
        stalled=True,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 5 - status is now STALL because the lag is always non-zero
    BurrowCase(
        5,
        commits=[
            (1000, 100000, 100),
            (1000, 200000, 150),
            (1000, 300000, 200),
            (1000, 400000, 250),
            (1000, 500000, 300),
        ],
        log_ends=[1300],
        current_lag=300,
        now_s=600,
        allowed_lag=0,
        always_not_zero=True,
        rewind=-1,
        stopped=False,
        stalled=True,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.STALL,
    ),
    # 6 - status is still STALL even when the lag stays the same
    BurrowCase(
        6,
        commits=[
            (1000, 100000, 100),
            (1000, 200000, 100),
            (1000, 300000, 100),
            (1000, 400000, 100),
            (1000, 500000, 100),
        ],
        log_ends=[1100],
        current_lag=100,
        now_s=600,
        allowed_lag=0,
        always_not_zero=True,
        rewind=-1,
        stopped=False,
        stalled=True,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.STALL,
    ),
    # 7 - status is OK because the offsets go backwards, but though the lag does decrease
    # within the window (caught up the rewind)
    BurrowCase(
        7,
        commits=[
            (1000, 100000, 100),
            (2000, 200000, 150),
            (3000, 300000, 200),
            (2000, 400000, 1250),
            (4000, 500000, 300),
        ],
        log_ends=[4300],
        current_lag=300,
        now_s=600,
        allowed_lag=0,
        always_not_zero=True,
        rewind=3,
        stopped=False,
        stalled=False,
        not_decreasing=False,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 8 - status is OK because the current lag is 0 (even though the offsets show lag), even
    # though it would be considered stopped due to timestamps
    BurrowCase(
        8,
        commits=[
            (1000, 100000, 50),
            (2000, 200000, 100),
            (3000, 300000, 150),
            (4000, 400000, 200),
            (5000, 500000, 250),
        ],
        log_ends=[5250],
        current_lag=0,
        now_s=1000,
        allowed_lag=0,
        always_not_zero=True,
        rewind=-1,
        stopped=True,
        stalled=False,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 9 - status is STOP due to timestamps because the current lag is non-zero, even though lag
    # is always zero in offsets, only because there is new data (#290)
    BurrowCase(
        9,
        commits=[
            (792748079, 1512224618356, 0),
            (792748080, 1512224619362, 0),
            (792748081, 1512224620366, 0),
            (792748082, 1512224621367, 0),
            (792748083, 1512224622370, 0),
            (792748084, 1512224623373, 0),
            (792748085, 1512224624378, 0),
            (792748086, 1512224625379, 0),
            (792748087, 1512224626383, 0),
            (792748088, 1512224627383, 0),
            (792748089, 1512224628383, 0),
            (792748090, 1512224629388, 0),
            (792748091, 1512224630391, 0),
            (792748092, 1512224631394, 0),
            (792748093, 1512224632397, 0),
        ],
        log_ends=[792749024, 792749000, 792748800, 792748600, 792748500],
        current_lag=931,
        now_s=1512224650,
        allowed_lag=0,
        always_not_zero=False,
        rewind=-1,
        stopped=True,
        stalled=False,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.STOP,
    ),
    # 10 - status is OK, even though it would be stop due to timestamps, as within the recent
    # broker offset window the lag was zero (#303)
    BurrowCase(
        10,
        commits=[
            (792748079, 1512224618356, 0),
            (792748080, 1512224619362, 0),
            (792748081, 1512224620366, 0),
            (792748082, 1512224621367, 0),
            (792748083, 1512224622370, 0),
            (792748084, 1512224623373, 0),
            (792748085, 1512224624378, 0),
            (792748086, 1512224625379, 0),
            (792748087, 1512224626383, 0),
            (792748088, 1512224627383, 0),
            (792748089, 1512224628383, 0),
            (792748090, 1512224629388, 0),
            (792748091, 1512224630391, 0),
            (792748092, 1512224631394, 0),
            (792748093, 1512224632397, 0),
        ],
        log_ends=[792748094, 792748093, 792748093, 792748093],
        current_lag=1,
        now_s=1512224650,
        allowed_lag=0,
        always_not_zero=False,
        rewind=-1,
        stopped=True,
        stalled=False,
        not_decreasing=True,
        recent_zero=True,
        verdict=Verdict.OK,
    ),
    # 11 - same case as test 0 with additional `nil` lag entries which should not affect
    # results
    BurrowCase(
        11,
        commits=[
            (1000, 100000, 0),
            (1500, 150000, None),
            (2000, 200000, 50),
            (2500, 250000, None),
            (3000, 300000, 100),
            (3500, 350000, None),
            (4000, 400000, 150),
            (4500, 450000, None),
            (5000, 500000, 200),
            (5500, 550000, None),
        ],
        log_ends=[5700],
        current_lag=200,
        now_s=600,
        allowed_lag=0,
        always_not_zero=False,
        rewind=-1,
        stopped=False,
        stalled=False,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 12 - status is OK despite the fact that the current lag is greater zero and the time
    # since last commit is great enough because of the configured allowed lag
    BurrowCase(
        12,
        commits=[
            (1000, 100000, 2),
            (2000, 200000, 1),
            (2000, 300000, 1),
        ],
        log_ends=[2001],
        current_lag=1,
        now_s=550,
        allowed_lag=1,
        always_not_zero=False,
        rewind=-1,
        stopped=True,
        stalled=False,
        not_decreasing=False,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 13 - same as 5 but with an allowed lag
    BurrowCase(
        13,
        commits=[
            (1000, 100000, 100),
            (1000, 200000, 150),
            (1000, 300000, 200),
            (1000, 400000, 250),
            (1000, 500000, 300),
        ],
        log_ends=[1300],
        current_lag=300,
        now_s=600,
        allowed_lag=99,
        always_not_zero=True,
        rewind=-1,
        stopped=False,
        stalled=True,
        not_decreasing=True,
        recent_zero=False,
        verdict=Verdict.STALL,
    ),
    # 14 - same as 7 but with an allowed lag
    BurrowCase(
        14,
        commits=[
            (1000, 100000, 100),
            (2000, 200000, 150),
            (3000, 300000, 200),
            (2000, 400000, 1250),
            (4000, 500000, 300),
        ],
        log_ends=[4300],
        current_lag=300,
        now_s=600,
        allowed_lag=99,
        always_not_zero=True,
        rewind=3,
        stopped=False,
        stalled=False,
        not_decreasing=False,
        recent_zero=False,
        verdict=Verdict.OK,
    ),
    # 15 - Rewind, but we did not catch up to the previous point
    BurrowCase(
        15,
        commits=[
            (1000, 100000, 100),
            (2000, 200000, 150),
            (3000, 300000, 200),
            (2000, 400000, 1250),
            (2500, 500000, 300),
        ],
        log_ends=[4300],
        current_lag=300,
        now_s=600,
        allowed_lag=0,
        always_not_zero=True,
        rewind=3,
        stopped=False,
        stalled=False,
        not_decreasing=False,
        recent_zero=False,
        verdict=Verdict.REWIND,
    ),
]


@pytest.mark.parametrize("case", BURROW_TESTS, ids=lambda case: f"burrow-{case.index}")
def test_burrow_rule_table(case: BurrowCase) -> None:
    """Burrow's ``TestCachingEvaluator_CheckRules``: every rule, then the verdict."""
    commits = [Commit(*entry) for entry in case.commits]
    now_ms = case.now_s * 1000
    assert lag_health.lag_always_not_zero(commits, case.allowed_lag) is case.always_not_zero
    assert lag_health.offsets_rewind(commits) == case.rewind
    assert lag_health.offsets_stopped(commits, now_ms) is case.stopped
    assert lag_health.offsets_stalled(commits) is case.stalled
    assert lag_health.lag_not_decreasing(commits) is case.not_decreasing
    assert lag_health.recent_lag_zero(commits, case.log_ends) is case.recent_zero
    verdict = lag_health.partition_verdict(
        commits, case.log_ends, case.current_lag, now_ms, case.allowed_lag
    )
    assert verdict is case.verdict


def _history(*entries: tuple[int, int, int | None]) -> list[Commit]:
    """Commits at (offset, seconds, lag)."""
    return [Commit(offset, seconds * 1000, lag) for offset, seconds, lag in entries]


def test_zero_current_lag_is_ok_whatever_the_history() -> None:
    # Stalled, stopped and rewound, but caught up now.
    commits = _history((500, 10, 5), (100, 20, 9), (100, 30, 9))
    assert lag_health.partition_verdict(commits, [100], 0, 1_000_000) is Verdict.OK


def test_stop_when_no_commit_for_longer_than_the_window_spans() -> None:
    commits = _history((100, 10, 5), (200, 20, 5), (300, 30, 5))
    # 20 s since the last commit equals the 20 s the window spans: not yet.
    assert lag_health.partition_verdict(commits, [305], 5, 50_000) is Verdict.WARNING
    assert lag_health.partition_verdict(commits, [305], 5, 50_001) is Verdict.STOP
    # Caught up within the recent log ends: not stopped yet.
    assert lag_health.partition_verdict(commits, [300, 305], 5, 50_001) is Verdict.WARNING


def test_stop_comes_before_the_zero_lag_rule() -> None:
    commits = _history((100, 10, 0), (200, 20, 0))
    assert lag_health.partition_verdict(commits, [250], 50, 31_000) is Verdict.STOP


def test_rewind_until_the_consumer_is_back_where_it_was() -> None:
    back = _history((100, 10, 5), (200, 20, 5), (50, 30, 160), (120, 40, 90))
    assert lag_health.offsets_rewind(back) == 2
    assert lag_health.partition_verdict(back, [210], 90, 41_000) is Verdict.REWIND
    recovered = [*back, Commit(200, 50_000, 10)]
    assert lag_health.partition_verdict(recovered, [210], 10, 51_000) is Verdict.OK


def test_rewind_comes_before_the_zero_lag_rule() -> None:
    commits = _history((100, 10, 0), (40, 20, 60))
    assert lag_health.partition_verdict(commits, [100], 60, 21_000) is Verdict.REWIND


def test_stall_when_offsets_do_not_move_while_lagging() -> None:
    commits = _history((100, 10, 5), (100, 20, 8), (100, 30, 8))
    assert lag_health.partition_verdict(commits, [108], 8, 31_000) is Verdict.STALL
    # The same commits with a zero lag anywhere are OK (Rule 1).
    commits[0] = Commit(100, 10_000, 0)
    assert lag_health.partition_verdict(commits, [108], 8, 31_000) is Verdict.OK


def test_warning_when_the_lag_never_decreases() -> None:
    growing = _history((100, 10, 5), (200, 20, 7), (300, 30, 7), (400, 40, 9))
    assert lag_health.partition_verdict(growing, [409], 9, 41_000) is Verdict.WARNING
    shrinking = [*growing, Commit(500, 50_000, 4)]
    assert lag_health.partition_verdict(shrinking, [504], 4, 51_000) is Verdict.OK


def test_unknown_lags_are_skipped_by_the_lag_rules() -> None:
    commits = _history((100, 10, None), (200, 20, 5), (300, 30, None), (400, 40, 6))
    assert lag_health.lag_always_not_zero(commits, 0)
    assert lag_health.lag_not_decreasing(commits)
    assert not lag_health.lag_always_not_zero(_history((100, 10, None), (200, 20, 0)), 0)


def test_allowed_lag() -> None:
    commits = _history((100, 10, 3), (100, 20, 3))
    assert lag_health.partition_verdict(commits, [103], 3, 21_000, allowed_lag=3) is Verdict.OK
    assert lag_health.partition_verdict(commits, [103], 3, 21_000, allowed_lag=2) is Verdict.STALL


def test_empty_window_is_ok() -> None:
    assert lag_health.partition_verdict([], [], 10, 1000) is Verdict.OK


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [
        ([], Verdict.OK),
        ([Verdict.OK, Verdict.OK], Verdict.OK),
        ([Verdict.OK, Verdict.WARNING], Verdict.WARNING),
        ([Verdict.WARNING, Verdict.STOP, Verdict.OK], Verdict.ERROR),
        ([Verdict.STALL], Verdict.ERROR),
        ([Verdict.REWIND, Verdict.WARNING], Verdict.ERROR),
    ],
)
def test_group_verdict_is_the_worst_partition_with_errors_as_error(
    partitions: list[Verdict], expected: Verdict
) -> None:
    assert lag_health.group_verdict(partitions) is expected


def test_verdict_order_is_burrows_status_constants() -> None:
    # core/protocol/evaluator.go: NotFound 0, OK 1, Warning 2, Error 3, Stop 4, Stall 5, Rewind 6.
    assert [v.value for v in Verdict] == [0, 1, 2, 3, 4, 5, 6]
    assert [v.name for v in Verdict] == [
        "NOTFOUND", "OK", "WARNING", "ERROR", "STOP", "STALL", "REWIND"
    ]  # fmt: skip


def test_window_records_new_commits_only_and_stays_bounded() -> None:
    window = lag_health.PartitionWindow(intervals=3)
    window.observe(100, 1_000, None)
    window.observe(100, 1_000, 110)  # the same commit, seen again: only the log end is new
    assert list(window.commits) == [Commit(100, 1_000, None)]
    assert (list(window.log_ends), window.current_lag) == ([110], 10)
    window.observe(100, 2_000, 120)  # a new commit of the same offset
    for second in range(3, 10):
        window.observe(100 + second, second * 1000, 130)
    assert [c.offset for c in window.commits] == [107, 108, 109]
    assert list(window.log_ends) == [130, 130, 130]
    assert window.current_lag == 21


def test_a_partition_below_the_minimum_completeness_is_not_judged() -> None:
    window = lag_health.GroupLagWindow(intervals=10, minimum_complete=0.2, settle=1)
    # One commit long ago and a lag since: Rule 3 alone would say STOP.
    window.observe({("t", 0): (5, 1000)}, {("t", 0): 50})
    assert window.evaluate(60_000).partitions[0].verdict is Verdict.OK
    window.observe({("t", 0): (6, 2000)}, {("t", 0): 50})
    assert window.evaluate(60_000).partitions[0].verdict is Verdict.STOP


def test_group_window_forgets_partitions_and_sorts_worst_first() -> None:
    window = lag_health.GroupLagWindow(intervals=5, minimum_complete=0.0, settle=1)
    assert window.evaluate(0).verdict is Verdict.NOTFOUND
    # t/0 keeps committing; t/1 commits once and then not while its lag grows; t/2 is idle
    # and caught up.
    for second in range(1, 6):
        window.observe(
            {("t", 0): (second * 10, second * 1000), ("t", 1): (5, 1000), ("t", 2): (7, 1000)},
            {("t", 0): second * 10, ("t", 1): 5 + second * 3, ("t", 2): 7},
        )
    result = window.evaluate(6_000)
    assert result.verdict is Verdict.ERROR
    assert [(p.partition, p.verdict, p.current_lag) for p in result.partitions] == [
        (1, Verdict.STOP, 15),
        (0, Verdict.OK, 0),
        (2, Verdict.OK, 0),
    ]
    window.observe({("t", 0): (60, 6000)}, {("t", 0): 60})
    assert list(window.partitions) == [("t", 0)]
    assert window.evaluate(7_000).verdict is Verdict.OK


def _busy_group(
    lags: list[int], window: lag_health.GroupLagWindow
) -> list[tuple[Verdict, Verdict]]:
    """A consumer committing every second with ``lags[i]`` messages still behind at commit i:
    (the rules' own verdict of partition 0, the group verdict shown) after each refresh."""
    seen = []
    for second, lag in enumerate(lags, start=1):
        offset = second * 100
        window.observe({("t", 0): (offset, second * 1000)}, {("t", 0): offset + lag})
        commits = tuple(window.partitions[("t", 0)].commits)
        ends = tuple(window.partitions[("t", 0)].log_ends)
        raw = lag_health.partition_verdict(commits, ends, lag, second * 1000 + 500)
        seen.append((raw, window.evaluate(second * 1000 + 500).verdict))
    return seen


def test_a_lag_of_a_few_messages_is_no_warning() -> None:
    """A healthy, busy consumer is always 1 or 2 messages behind: Burrow's Rule 5 says
    WARNING whenever no commit of the window caught up, and OK when one did."""
    lags = [1, 2, 2, 1, 2, 2, 2, 0, 1, 2, 2, 2, 2, 2]
    seen = _busy_group(lags, lag_health.GroupLagWindow())
    raw = [r for r, _ in seen]
    # Burrow alone flaps.
    assert Verdict.WARNING in raw
    assert Verdict.OK in raw[2:]
    assert {shown for _, shown in seen} == {Verdict.OK}
    # The same lags in hundreds are a real warning, shown once it held three refreshes (the
    # first refresh sees one commit, too few to judge).
    seen = _busy_group([lag * 100 for lag in [1, 2, 2, 2, 2, 2]], lag_health.GroupLagWindow())
    assert [raw for raw, _ in seen][1:] == [Verdict.WARNING] * 5
    assert [shown for _, shown in seen] == [Verdict.OK] * 3 + [Verdict.WARNING] * 3


def test_hysteresis_between_healthy_and_not() -> None:
    window = lag_health.PartitionWindow()
    assert window.settle(Verdict.OK, 3) is Verdict.OK  # the first verdict is shown at once
    # A single WARNING between OKs is not shown, nor two.
    assert [window.settle(v, 3) for v in (Verdict.WARNING, Verdict.OK)] == [Verdict.OK] * 2
    assert [window.settle(v, 3) for v in (Verdict.WARNING,) * 2] == [Verdict.OK] * 2
    assert window.settle(Verdict.OK, 3) is Verdict.OK
    # Three in a row are; unhealthy verdicts of any kind count together, the latest shown.
    crossing = [Verdict.WARNING, Verdict.STOP, Verdict.STOP]
    assert [window.settle(v, 3) for v in crossing] == [Verdict.OK, Verdict.OK, Verdict.STOP]
    # Within the unhealthy side the verdict follows at once.
    assert window.settle(Verdict.STALL, 3) is Verdict.STALL
    # Back to OK only after three OKs in a row.
    back = [Verdict.OK, Verdict.OK, Verdict.WARNING, Verdict.OK, Verdict.OK, Verdict.OK]
    assert [window.settle(v, 3) for v in back] == [Verdict.STALL] * 2 + [Verdict.WARNING] * 3 + [
        Verdict.OK
    ]
    # settle=1 is Burrow's own behaviour: every verdict shown as found.
    plain = lag_health.PartitionWindow()
    assert [plain.settle(v, 1) for v in (Verdict.OK, Verdict.WARNING, Verdict.OK)] == [
        Verdict.OK,
        Verdict.WARNING,
        Verdict.OK,
    ]
