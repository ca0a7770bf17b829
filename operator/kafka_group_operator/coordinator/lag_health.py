"""Lag verdicts: Burrow's evaluation rules over a bounded window of recent commits.

Pure: commits, log ends and a clock reading in; a verdict out. The rules, their order and
the group's verdict are ported from Burrow's evaluator (linkedin/Burrow,
``core/internal/evaluator/caching.go``: ``calculatePartitionStatus`` and the ``checkIf*``
rules; ``evaluateConsumerStatus`` for the group) and its status constants
(``core/protocol/evaluator.go``). Its test table (``caching_test.go``) is ported in the
tests of this module.

Where the window comes from (Burrow's in-memory storage, ``core/internal/storage/inmemory.go``,
keeps a ring of ``intervals`` commits and of ``intervals`` broker log-end offsets per
partition, 10 by default): the operator feeds ``GroupLagWindow.observe`` from each status
refresh. A commit enters the window when its offset or commit timestamp differs from the
newest one in it (several commits between two refreshes are seen as the newest only, much as
Burrow's ``min-distance`` merges frequent commits); its lag is the log end known at that
refresh minus its offset. Each refresh also adds the partition's log end to the log-end ring.
Both rings are bounded, and a partition the group no longer has committed offsets for is
forgotten, so the memory is ``intervals`` entries per committed partition.

Two additions to Burrow keep a healthy group's verdict from flapping. A partition whose lag is
a few messages (below ``minimum_lag``) is never WARNING: a live producer keeps some messages
in flight, so a busy, healthy consumer shows a lag of 1 or 2 that Burrow's Rule 5 reads as
"not decreasing" whenever no commit of the window happened to catch up. And each partition's
verdict moves between healthy (OK) and unhealthy (anything else) only once the new side has
held for ``settle`` evaluations in a row (hysteresis); within the unhealthy side it follows
the rules at once (WARNING to STOP, say), as an alert already stands.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Burrow's ``storage.intervals`` default (inmemory.go: viper.SetDefault(".intervals", 10)).
DEFAULT_INTERVALS = 10
# Burrow's ``evaluator.allowed-lag`` default (caching.go: viper.SetDefault(".allowed-lag", 0)).
DEFAULT_ALLOWED_LAG = 0
# Burrow's ``evaluator.minimum-complete``: a partition whose ring is filled below this share
# is OK without evaluation (``evaluatePartitionStatus``). Burrow leaves it at 0; here it is
# two commits of ten, because with a single commit the window spans no time and Rule 3 calls
# every lagging partition stopped: each operator restart and each new group would flash STOP.
DEFAULT_MINIMUM_COMPLETE = 0.2
# Ours, not Burrow's: a lag below this many messages is never WARNING (STOP, STALL and REWIND
# are judged as Burrow does, whatever the lag).
DEFAULT_MINIMUM_LAG = 10
# Ours: evaluations in a row a partition's verdict must hold on the other side (healthy or
# not) before it is shown; with the default status refresh (10 s), half a minute.
DEFAULT_SETTLE = 3


class Verdict(enum.IntEnum):
    """Burrow's ``StatusConstant``, ordered from least to most bad (protocol/evaluator.go).

    NOTFOUND is only for a group with nothing to evaluate; ERROR only for a group (one or
    more partitions in STOP, STALL or REWIND); STOP, STALL and REWIND only for partitions.
    """

    NOTFOUND = 0
    OK = 1
    WARNING = 2
    ERROR = 3
    STOP = 4
    STALL = 5
    REWIND = 6


@dataclass(frozen=True, slots=True)
class Commit:
    """One entry of a partition's window: Burrow's ``ConsumerOffset`` (``Lag`` may be nil
    there too: a commit seen before any log end of its partition was known)."""

    offset: int
    timestamp_ms: int
    lag: int | None


# Rule 1 (Burrow ``isLagAlwaysNotZero``): a lag at or under the allowed lag anywhere in the
# window makes the window OK.
def lag_always_not_zero(commits: Sequence[Commit], allowed_lag: int) -> bool:
    return not any(commit.lag is not None and commit.lag <= allowed_lag for commit in commits)


# Rule 2 (Burrow ``checkIfOffsetsRewind``): the index of the first commit whose offset is
# lower than the one before it; -1 when the offsets never go backwards.
def offsets_rewind(commits: Sequence[Commit]) -> int:
    for index in range(1, len(commits)):
        if commits[index].offset < commits[index - 1].offset:
            return index
    return -1


# Rule 2, part 2 (Burrow ``checkIfRewindRecovered``): whether a later commit reached the
# offset committed just before the rewind.
def rewind_recovered(commits: Sequence[Commit], rewind_index: int) -> bool:
    before = commits[rewind_index - 1].offset
    return any(commits[i].offset >= before for i in range(rewind_index, len(commits)))


# Rule 3 (Burrow ``checkIfOffsetsStopped``): the time since the newest commit exceeds the
# time the window spans, so the consumer stopped committing. Strictly greater: equal is not.
def offsets_stopped(commits: Sequence[Commit], now_ms: int) -> bool:
    first, last = commits[0].timestamp_ms, commits[-1].timestamp_ms
    return now_ms - last > last - first


# Rule 4 (Burrow ``checkIfOffsetsStalled``): commits whose offsets never change.
def offsets_stalled(commits: Sequence[Commit]) -> bool:
    return all(commits[i].offset == commits[i - 1].offset for i in range(1, len(commits)))


# Rule 5 (Burrow ``checkIfLagNotDecreasing``): the lag never drops from one commit with a
# known lag to the next.
def lag_not_decreasing(commits: Sequence[Commit]) -> bool:
    last: int | None = None
    for commit in commits:
        if commit.lag is None:
            continue
        if last is not None and commit.lag < last:
            return False
        last = commit.lag
    return True


# Burrow ``checkIfRecentLagZero``: a recent log end at or below the newest committed offset
# means the consumer was caught up a few refreshes ago, which delays STOP.
def recent_lag_zero(commits: Sequence[Commit], log_ends: Iterable[int]) -> bool:
    newest = commits[-1].offset
    return any(end <= newest for end in log_ends)


def partition_verdict(
    commits: Sequence[Commit],
    log_ends: Sequence[int],
    current_lag: int,
    now_ms: int,
    allowed_lag: int = DEFAULT_ALLOWED_LAG,
) -> Verdict:
    """Burrow's ``calculatePartitionStatus``: the rules in its order, the worst first.

    An empty window is OK, as in Burrow's ``evaluatePartitionStatus``.
    """
    if not commits or current_lag <= allowed_lag:
        # A partition whose current lag is within the allowed lag is never in error.
        return Verdict.OK
    # STOP first: it is a problem even if the lag was zero somewhere in an old window,
    # unless the recent log ends show the consumer was caught up.
    if offsets_stopped(commits, now_ms) and not recent_lag_zero(commits, log_ends):
        return Verdict.STOP
    # A rewind counts only until the consumer is back where it was (caching.go explains why
    # this comes before Rule 1).
    rewind = offsets_rewind(commits)
    if rewind > 0 and not rewind_recovered(commits, rewind):
        return Verdict.REWIND
    if lag_always_not_zero(commits, allowed_lag):
        if offsets_stalled(commits):
            return Verdict.STALL
        if lag_not_decreasing(commits):
            return Verdict.WARNING
    return Verdict.OK


def group_verdict(partitions: Iterable[Verdict]) -> Verdict:
    """Burrow's ``evaluateConsumerStatus``: the worst partition's verdict, where STOP, STALL
    and REWIND count as ERROR; OK for a group without partitions."""
    worst = Verdict.OK
    for verdict in partitions:
        worst = max(worst, min(verdict, Verdict.ERROR))
    return worst


@dataclass(frozen=True, slots=True)
class PartitionVerdict:
    topic: str
    partition: int
    verdict: Verdict
    current_lag: int
    # The newest commit of the window (Burrow's ``End``).
    offset: int
    commit_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class GroupVerdict:
    verdict: Verdict
    # Every evaluated partition, the worst first (then the most lagging).
    partitions: tuple[PartitionVerdict, ...]


@dataclass(slots=True)
class PartitionWindow:
    """The bounded rings of one partition, and its lag at the latest observation."""

    intervals: int = DEFAULT_INTERVALS
    commits: deque[Commit] = field(init=False)
    log_ends: deque[int] = field(init=False)
    current_lag: int = 0
    # The verdict shown (None before the first evaluation), and how many evaluations in a
    # row have found the partition on the other side of healthy.
    shown: Verdict | None = None
    crossing: int = 0

    def __post_init__(self) -> None:
        self.commits = deque(maxlen=self.intervals)
        self.log_ends = deque(maxlen=self.intervals)

    def settle(self, verdict: Verdict, evaluations: int) -> Verdict:
        """The verdict to show after one evaluation found ``verdict`` (hysteresis: the
        module's docstring)."""
        shown = self.shown
        if shown is None or (shown is Verdict.OK) == (verdict is Verdict.OK):
            self.shown, self.crossing = verdict, 0
            return verdict
        self.crossing += 1
        if self.crossing >= evaluations:
            self.shown, self.crossing = verdict, 0
            return verdict
        return shown

    def observe(self, offset: int, commit_timestamp_ms: int, log_end: int | None) -> None:
        lag = None if log_end is None else max(0, log_end - offset)
        if log_end is not None:
            self.log_ends.append(log_end)
            self.current_lag = max(0, log_end - offset)
        newest = self.commits[-1] if self.commits else None
        if newest is None or (newest.offset, newest.timestamp_ms) != (offset, commit_timestamp_ms):
            self.commits.append(Commit(offset, commit_timestamp_ms, lag))


@dataclass(slots=True)
class GroupLagWindow:
    """The windows of a group's committed partitions, fed once per status refresh."""

    intervals: int = DEFAULT_INTERVALS
    allowed_lag: int = DEFAULT_ALLOWED_LAG
    minimum_complete: float = DEFAULT_MINIMUM_COMPLETE
    minimum_lag: int = DEFAULT_MINIMUM_LAG
    settle: int = DEFAULT_SETTLE
    partitions: dict[tuple[str, int], PartitionWindow] = field(default_factory=dict)
    # The group verdict last published, to tell a change (and post one Event for it).
    published: Verdict | None = None

    def observe(
        self,
        committed: Mapping[tuple[str, int], tuple[int, int]],
        log_ends: Mapping[tuple[str, int], int],
    ) -> None:
        """``committed``: (offset, commit timestamp in ms) per partition; ``log_ends``: the
        log-end offsets known now (a partition without one keeps its lag)."""
        for tp in list(self.partitions):
            if tp not in committed:
                del self.partitions[tp]
        for tp, (offset, timestamp_ms) in committed.items():
            window = self.partitions.get(tp)
            if window is None:
                window = self.partitions[tp] = PartitionWindow(self.intervals)
            window.observe(offset, timestamp_ms, log_ends.get(tp))

    def evaluate(self, now_ms: int) -> GroupVerdict:
        """Each partition's verdict as shown (minimum lag and hysteresis applied) and the
        group's from them. Call once per refresh: every call counts for the hysteresis."""
        if not self.partitions:
            return GroupVerdict(Verdict.NOTFOUND, ())
        verdicts = []
        for (topic, partition), window in self.partitions.items():
            newest = window.commits[-1]
            verdict = Verdict.OK
            if len(window.commits) / self.intervals >= self.minimum_complete:
                verdict = partition_verdict(
                    tuple(window.commits),
                    tuple(window.log_ends),
                    window.current_lag,
                    now_ms,
                    self.allowed_lag,
                )
                if verdict is Verdict.WARNING and window.current_lag < self.minimum_lag:
                    verdict = Verdict.OK
            verdict = window.settle(verdict, self.settle)
            verdicts.append(
                PartitionVerdict(
                    topic,
                    partition,
                    verdict,
                    window.current_lag,
                    newest.offset,
                    newest.timestamp_ms,
                )
            )
        verdicts.sort(key=lambda p: (-p.verdict, -p.current_lag, p.topic, p.partition))
        return GroupVerdict(group_verdict(p.verdict for p in verdicts), tuple(verdicts))
