"""Pure ``DataFrame -> DataFrame`` transforms of the snapshot, compaction and restore jobs.

Every function here takes frames (and plain values) and returns a frame: no reading, no
writing, no Kafka, no clock. The jobs' ``main`` functions do the I/O around them and the tests
feed them small inline frames.

Inputs are frames of decoded state-topic records (``columns.STATE_RECORD_DDL``) or of small
per-partition tables:

* offsets ``(topic, partition, offset, ...)`` as committed by the group;
* bounds ``(topic, partition, earliest_offset, latest_offset, time_offset)`` of the live data
  topics, where ``time_offset`` is the first offset at or after a reset time (null when the
  target is not a time, or when no message is that new).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kafka_group_jobs import columns

TOPIC_PARTITION = ["topic", "partition"]
# What compaction needs of each record: its place, its bytes, and whether it is a marker.
COMPACTION_COLUMNS = ("partition", "offset", "key", "value", "record_type")

# ---------------------------------------------------------------------------------------
# The log, compacted


def latest_per_key(state_records: DataFrame) -> DataFrame:
    """The newest record of every key, as Kafka's log compaction would keep it.

    Tombstones are kept (a tombstone is the newest word on its key); ``live`` drops them.
    A key always lands on the same state partition, so the offset orders its records.
    """
    newest = state_records.groupBy("key").agg(
        F.max_by(F.struct(*state_records.columns), F.col("offset")).alias("newest")
    )
    return newest.select("newest.*")


def live(state_records: DataFrame) -> DataFrame:
    """Records that are not tombstones."""
    return state_records.where(F.col("value").isNotNull())


def as_of(state_records: DataFrame, as_of_ms: int) -> DataFrame:
    """The log as it stood at ``as_of_ms`` (records appended at or before that time)."""
    return state_records.where(F.col("timestamp") <= F.lit(as_of_ms))


# ---------------------------------------------------------------------------------------
# Snapshot


def group_offsets(
    state_records: DataFrame, group_id: str, as_of_ms: int | None = None
) -> DataFrame:
    """The committed offsets of one group, now or as of a past time (from commit history).

    Columns: topic, partition, offset, leader_epoch, metadata, commit_timestamp.
    """
    commits = state_records.where(
        (F.col("record_type") == columns.OFFSET_COMMIT) & (F.col("group_id") == group_id)
    )
    if as_of_ms is not None:
        commits = as_of(commits, as_of_ms)
    # One group's commit keys are its (topic, partition)s, so the newest per key is the newest
    # per (topic, partition). Only what the result needs travels through the sort and the
    # shuffle: no key or value bytes, a tombstone as a flag.
    newest = commits.groupBy("topic", "topic_partition").agg(
        F.max_by(
            F.struct(
                F.col("value").isNull().alias("deleted"),
                "committed_offset",
                "leader_epoch",
                "metadata",
                "commit_timestamp",
            ),
            F.col("offset"),
        ).alias("newest")
    )
    return newest.where(~F.col("newest.deleted")).select(
        "topic",
        F.col("topic_partition").alias("partition"),
        F.col("newest.committed_offset").alias("offset"),
        "newest.leader_epoch",
        "newest.metadata",
        "newest.commit_timestamp",
    )


def with_lag(offsets: DataFrame, log_ends: DataFrame) -> DataFrame:
    """Adds ``log_end_offset`` and ``lag`` (never negative; null where the end is unknown)."""
    joined = offsets.join(
        log_ends.select(*TOPIC_PARTITION, "log_end_offset"), TOPIC_PARTITION, "left"
    )
    # greatest() skips nulls, so an unknown end must be kept null explicitly.
    lag = F.greatest(F.col("log_end_offset") - F.col("offset"), F.lit(0).cast("long"))
    return joined.withColumn("lag", F.when(F.col("log_end_offset").isNotNull(), lag))


# ---------------------------------------------------------------------------------------
# Compaction
#
# No retention is judged here: which groups expired is the coordinator's rule alone
# (``coordinator/offsets.py``), applied live and after every load, checkpoint or not.


def checkpoint_records(latest: DataFrame) -> DataFrame:
    """What a loader needs: the newest live record of every key, markers left out.

    Columns: partition, offset, key, value (ordered per partition by offset when written).
    """
    return (
        live(latest)
        .where(F.col("record_type") != columns.LOAD_MARKER)
        .select("partition", "offset", "key", "value")
    )


# ---------------------------------------------------------------------------------------
# Restore and reset

RESET_KINDS = columns.RESET_KINDS


def in_scope(
    frame: DataFrame,
    topics: tuple[str, ...] = (),
    partitions: dict[str, tuple[int, ...]] | None = None,
) -> DataFrame:
    """Rows of the given topics (all when empty) and, per topic, of the given partitions."""
    condition: Column = F.lit(True)
    if topics:
        condition = F.col("topic").isin(list(topics))
    if partitions:
        chosen = F.lit(False)
        for topic, numbers in partitions.items():
            chosen = chosen | ((F.col("topic") == topic) & F.col("partition").isin(list(numbers)))
        condition = condition & chosen
    return frame.where(condition)


def requested_offsets(
    bounds: DataFrame,
    committed: DataFrame,
    kind: str,
    value: int | None = None,
    snapshot: DataFrame | None = None,
) -> DataFrame:
    """The offset a reset asks for, per live partition, before clamping.

    Columns: topic, partition, earliest_offset, latest_offset, current_offset, requested_offset.
    ``snapshot`` restores only the partitions the snapshot holds; ``shift-by`` only moves
    partitions that have a committed offset (as Kafka's tool does); every other kind covers
    every partition of ``bounds``. Datetime and duration fall back to the log end when no
    message is that new, as ``kafka-consumer-groups.sh`` does.
    """
    if kind not in RESET_KINDS:
        raise ValueError(f"unknown reset kind {kind!r}; expected one of {', '.join(RESET_KINDS)}")
    base = bounds.join(
        committed.select(*TOPIC_PARTITION, F.col("offset").alias("current_offset")),
        TOPIC_PARTITION,
        "left",
    )
    if kind == "snapshot":
        if snapshot is None:
            raise ValueError("a snapshot reset needs the snapshot's offsets")
        base = base.join(
            snapshot.select(*TOPIC_PARTITION, F.col("offset").alias("snapshot_offset")),
            TOPIC_PARTITION,
        )
        requested = F.col("snapshot_offset")
    elif kind == "earliest":
        requested = F.col("earliest_offset")
    elif kind == "latest":
        requested = F.col("latest_offset")
    elif kind == "offset":
        requested = F.lit(_required(kind, value))
    elif kind == "shift-by":
        base = base.where(F.col("current_offset").isNotNull())
        requested = F.col("current_offset") + F.lit(_required(kind, value))
    else:  # datetime or duration: resolved to a per-partition time_offset beforehand
        requested = F.coalesce(F.col("time_offset"), F.col("latest_offset"))
    return base.select(
        *TOPIC_PARTITION,
        "earliest_offset",
        "latest_offset",
        "current_offset",
        requested.cast("long").alias("requested_offset"),
    )


def clamp(requested: DataFrame) -> DataFrame:
    """Clamps each requested offset into [earliest, latest] and says where it did.

    Adds ``new_offset`` and ``clamp`` (null, ``earliest`` or ``latest``).
    """
    low, high, wanted = F.col("earliest_offset"), F.col("latest_offset"), F.col("requested_offset")
    return requested.withColumn("new_offset", F.least(F.greatest(wanted, low), high)).withColumn(
        "clamp", F.when(wanted < low, "earliest").when(wanted > high, "latest")
    )


def missing_partitions(snapshot: DataFrame, bounds: DataFrame) -> DataFrame:
    """Snapshot partitions that the live topics no longer have (reported, never written)."""
    return snapshot.select(*TOPIC_PARTITION, "offset").join(
        bounds.select(*TOPIC_PARTITION), TOPIC_PARTITION, "left_anti"
    )


def plan_reset(
    bounds: DataFrame,
    committed: DataFrame,
    kind: str,
    value: int | None = None,
    snapshot: DataFrame | None = None,
    topics: tuple[str, ...] = (),
    partitions: dict[str, tuple[int, ...]] | None = None,
) -> DataFrame:
    """The whole plan: scope, request, clamp; one row per partition to write, sorted.

    Columns: topic, partition, earliest_offset, latest_offset, current_offset,
    requested_offset, new_offset, clamp.
    """
    scoped = in_scope(bounds, topics, partitions)
    planned = clamp(requested_offsets(scoped, committed, kind, value, snapshot))
    return planned.orderBy(*TOPIC_PARTITION)


def _required(kind: str, value: int | None) -> int:
    if value is None:
        raise ValueError(f"a {kind} reset needs a value")
    return value
