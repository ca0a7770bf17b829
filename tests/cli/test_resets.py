"""The reset plan of ``kafka_group_records.resets``, against the rules of Kafka's
``ConsumerGroupCommand`` (tools/src/main/java/org/apache/kafka/tools/consumer/group/
ConsumerGroupCommand.java), quoted where they are pinned."""

from __future__ import annotations

import pytest

from kafka_group_records import resets
from kafka_group_records.resets import PlannedOffset

# Two partitions: log start 10 and 0, log end 50 and 20; only partition 0 has a commit.
BOUNDS = {("t", 0): (10, 50), ("t", 1): (0, 20)}
COMMITTED = {("t", 0): 30}


def test_earliest_and_latest_are_the_log_start_and_end() -> None:
    assert resets.plan_reset("earliest", BOUNDS, COMMITTED) == [
        PlannedOffset("t", 0, 30, 10, 10, None),
        PlannedOffset("t", 1, None, 0, 0, None),
    ]
    assert [p.new for p in resets.plan_reset("latest", BOUNDS, COMMITTED)] == [50, 20]


def test_an_offset_out_of_range_is_clamped_and_the_clamp_reported() -> None:
    # Kafka's checkOffsetsRange: "New offset (...) is higher than latest offset for topic
    # partition ... Value will be set to <end>"; lower than earliest: set to <start>.
    assert resets.plan_reset("offset", BOUNDS, COMMITTED, value=5) == [
        PlannedOffset("t", 0, 30, 5, 10, "earliest"),
        PlannedOffset("t", 1, None, 5, 5, None),
    ]
    assert resets.plan_reset("offset", BOUNDS, COMMITTED, value=40) == [
        PlannedOffset("t", 0, 30, 40, 40, None),
        PlannedOffset("t", 1, None, 40, 20, "latest"),
    ]


def test_shift_by_moves_the_committed_offset_and_refuses_a_partition_without_one() -> None:
    assert resets.plan_reset("shift-by", {("t", 0): (10, 50)}, COMMITTED, value=-25) == [
        PlannedOffset("t", 0, 30, 5, 10, "earliest")
    ]
    # Kafka: "Cannot shift offset for partition <tp> since there is no current committed
    # offset" (TopicPartition.toString is topic-partition).
    with pytest.raises(
        ValueError,
        match=r"^Cannot shift offset for partition t-1 since there is no current committed offset$",
    ):
        resets.plan_reset("shift-by", BOUNDS, COMMITTED, value=1)


def test_datetime_takes_the_offset_by_time_or_the_log_end_when_nothing_is_that_new() -> None:
    # Kafka's getLogTimestampOffsets: a partition with no message at or after the time
    # resets to its log end.
    planned = resets.plan_reset(
        "datetime", BOUNDS, COMMITTED, time_offsets={("t", 0): 12, ("t", 1): None}
    )
    assert [(p.requested, p.new, p.clamp) for p in planned] == [(12, 12, None), (20, 20, None)]


def test_a_file_resets_only_its_partitions() -> None:
    planned = resets.plan_reset("file", BOUNDS, COMMITTED, file_offsets={("t", 1): 99})
    assert planned == [PlannedOffset("t", 1, None, 99, 20, "latest")]


@pytest.mark.parametrize(
    ("text", "ms"),
    [("PT1H", 3_600_000), ("P1DT2H3M4S", 93_784_000), ("PT30S", 30_000), ("P2D", 172_800_000)],
)
def test_durations_as_java_time_duration_parses_them(text: str, ms: int) -> None:
    # Kafka: Duration.parse(options) for --by-duration, format 'PnDTnHnMnS'.
    assert resets.parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["1h", "P", "PT", "P1DT", "PT-1H", ""])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not an ISO-8601 duration"):
        resets.parse_duration_ms(text)


def test_times_name_their_zone() -> None:
    assert resets.parse_time_ms("1970-01-01T01:00:01+01:00") == 1000
    assert resets.parse_time_ms("1970-01-01T00:00:01.500Z") == 1500
    # Kafka's own format (Utils.getDateTime: yyyy-MM-dd'T'HH:mm:ss.SSS and a zone).
    assert resets.parse_time_ms("1970-01-01T00:00:01.000+00:00") == 1000


def test_a_time_without_a_zone_is_refused_not_guessed() -> None:
    # Kafka's Utils.getDateTime appends "Z" to a time without a zone (UTC), which a reader
    # of the command takes for local time: neither is guessed here.
    with pytest.raises(ValueError, match=r"^the time '2026-11-21T12:00:00' names no zone: "):
        resets.parse_time_ms("2026-11-21T12:00:00")


def test_to_current_keeps_the_committed_offset_unclamped_else_the_log_end() -> None:
    # ConsumerGroupCommand --to-current: the committed offset as it is (no range check), the
    # log end for a partition without one. A committed offset past the log end a broker
    # reports stays.
    assert resets.plan_reset(
        "current", {("t", 0): (10, 20), ("t", 1): (0, 20)}, {("t", 0): 30}
    ) == [
        PlannedOffset("t", 0, 30, 30, 30, None),
        PlannedOffset("t", 1, None, 20, 20, None),
    ]


@pytest.mark.parametrize(
    ("spec", "scope"),
    [("t", ("t", None)), ("t:0,2", ("t", (0, 2))), ("a:b:3", ("a:b", (3,)))],
)
def test_topic_scopes(spec: str, scope: tuple[str, tuple[int, ...] | None]) -> None:
    assert resets.parse_topic_scope(spec) == scope


@pytest.mark.parametrize("spec", [":1", "t:", "t:x", "t:-1", ""])
def test_bad_topic_scopes(spec: str) -> None:
    with pytest.raises(ValueError):
        resets.parse_topic_scope(spec)


def test_the_csv_is_kafkas_export_for_one_group() -> None:
    # CsvUtils.CsvRecordNoGroup: fields topic, partition, offset; Jackson's CsvSchema writes
    # no header unless asked to.
    offsets = {("t", 1): 7, ("t", 0): 3, ("a", 0): 1}
    text = resets.format_csv(offsets)
    assert text == "a,0,1\nt,0,3\nt,1,7\n"
    assert resets.parse_csv(text.splitlines(), "g") == offsets


def test_the_csv_with_groups_keeps_the_rows_of_the_group() -> None:
    # CsvUtils.CsvRecordWithGroup: group, topic, partition, offset (several groups exported).
    rows = ["g,t,0,3", "other,t,0,9", "g,t,1,4"]
    assert resets.parse_csv(rows, "g") == {("t", 0): 3, ("t", 1): 4}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["t,0"], "line 1: expected topic,partition,offset"),
        (["t,0,x"], "line 1: partition and offset must be numbers"),
        (["t,0,-1"], "line 1: a topic, and partition and offset >= 0"),
        (["t,0,1", "t,0,2"], "line 2: t:0 appears twice"),
    ],
)
def test_bad_csv_rows_name_their_line(rows: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resets.parse_csv(rows, "g")
