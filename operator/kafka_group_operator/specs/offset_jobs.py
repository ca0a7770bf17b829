"""Typed views of the job-related specs: an OffsetSnapshot, ``spec.offsetReset`` and
``spec.snapshots`` of a ConsumerGroup.

Like ``consumer_group.parse_consumer_group``: each ``parse_*`` turns the raw mapping into a
frozen view with every default applied, or raises ``errors.InvalidSpec``. The defaults repeat
the CRDs' because a resource may reach the operator without the API server's defaulting (an
older CRD, a test server); ``tests/specs/test_offset_jobs.py`` checks they match. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_group_operator.specs import consumer_group, errors

STORAGE_SCHEMES = ("file", "s3a", "s3", "pvc")
STORAGE_FORMATS = ("parquet",)
SPARK_MODES = ("auto", "operator", "local")
RESET_TARGETS = ("earliest", "latest", "offset", "datetime", "duration", "shiftBy", "snapshot")
# The field each target needs (the CRD's CEL rules say the same).
_RESET_VALUES = {
    "offset": "offset",
    "datetime": "datetime",
    "duration": "duration",
    "shiftBy": "shiftBy",
    "snapshot": "snapshot",
}


@dataclass(frozen=True, slots=True)
class Storage:
    uri: str
    format: str = "parquet"


@dataclass(frozen=True, slots=True)
class SparkOverrides:
    """An OffsetSnapshot's ``spec.spark``: what it changes of the chart's Spark settings."""

    mode: str | None = None  # None: the operator's configured mode (the chart's spark.mode)
    image: str | None = None
    service_account: str | None = None
    driver: Mapping[str, Any] = field(default_factory=dict)
    executor: Mapping[str, Any] = field(default_factory=dict)
    spark_conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OffsetSnapshotSpec:
    name: str
    namespace: str
    group_name: str  # consumerGroupRef.name, same namespace
    storage: Storage
    as_of: str | None = None
    spark: SparkOverrides | None = None  # None: the chart's settings, spark.mode included


@dataclass(frozen=True, slots=True)
class ResetScope:
    topic: str
    partitions: tuple[int, ...] = ()  # every partition when empty


@dataclass(frozen=True, slots=True)
class OffsetResetSpec:
    to: str
    offset: int | None = None
    datetime: str | None = None
    duration: str | None = None
    shift_by: int | None = None
    snapshot: str | None = None
    topics: tuple[ResetScope, ...] = ()  # every subscribed topic when empty
    dry_run: bool = True


@dataclass(frozen=True, slots=True)
class SnapshotScheduleSpec:
    schedule: str
    storage: Storage
    history_limit: int = 7


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise errors.InvalidSpec(f"{what} must be an object")
    return value


def parse_storage(value: object, what: str = "storage") -> Storage:
    storage = _mapping(value, what)
    uri = storage.get("uri")
    if not isinstance(uri, str) or "://" not in uri or uri.split("://")[0] not in STORAGE_SCHEMES:
        raise errors.InvalidSpec(
            f"{what}.uri must be a {', '.join(s + '://' for s in STORAGE_SCHEMES)} URI, not {uri!r}"
        )
    return Storage(uri, consumer_group._choice(storage, "format", STORAGE_FORMATS, prefix=what))


def parse_offset_snapshot(name: str, namespace: str, spec: Mapping[str, Any]) -> OffsetSnapshotSpec:
    reference = _mapping(spec.get("consumerGroupRef"), "consumerGroupRef")
    group_name = reference.get("name")
    if not isinstance(group_name, str) or not group_name:
        raise errors.InvalidSpec("consumerGroupRef.name must be a non-empty string")
    as_of = spec.get("asOf")
    if as_of is not None and not isinstance(as_of, str):
        raise errors.InvalidSpec("asOf must be an RFC 3339 time")
    spark = None
    if spec.get("spark") is not None:
        raw = _mapping(spec["spark"], "spark")
        spark = SparkOverrides(
            mode=(
                None
                if raw.get("mode") is None
                else consumer_group._choice(raw, "mode", SPARK_MODES, prefix="spark.")
            ),
            image=raw.get("image"),
            service_account=raw.get("serviceAccount"),
            driver=dict(raw.get("driver") or {}),
            executor=dict(raw.get("executor") or {}),
            spark_conf=dict(raw.get("sparkConf") or {}),
        )
    return OffsetSnapshotSpec(
        name=name,
        namespace=namespace,
        group_name=group_name,
        storage=parse_storage(spec.get("storage")),
        as_of=as_of,
        spark=spark,
    )


def parse_offset_reset(value: object) -> OffsetResetSpec:
    reset = _mapping(value, "offsetReset")
    to = consumer_group._choice(reset, "to", RESET_TARGETS, default="", prefix="offsetReset.")
    needed = _RESET_VALUES.get(to)
    if needed is not None and reset.get(needed) is None:
        raise errors.InvalidSpec(f"offsetReset.to={to} needs offsetReset.{needed}")
    scopes = []
    for item in reset.get("topics") or ():
        scope = _mapping(item, "offsetReset.topics[]")
        partitions = scope.get("partitions") or ()
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in partitions):
            raise errors.InvalidSpec("offsetReset.topics[].partitions must be integers")
        scopes.append(ResetScope(str(scope.get("name")), tuple(partitions)))
    for key in ("offset", "shiftBy"):
        if reset.get(key) is not None and (
            not isinstance(reset[key], int) or isinstance(reset[key], bool)
        ):
            raise errors.InvalidSpec(f"offsetReset.{key} must be an integer")
    return OffsetResetSpec(
        to=to,
        offset=reset.get("offset"),
        datetime=reset.get("datetime"),
        duration=reset.get("duration"),
        shift_by=reset.get("shiftBy"),
        snapshot=reset.get("snapshot"),
        topics=tuple(scopes),
        dry_run=consumer_group._boolean(reset, "dryRun", True, prefix="offsetReset."),
    )


def parse_snapshot_schedule_spec(value: object) -> SnapshotScheduleSpec:
    """``spec.snapshots``; a schedule that is no cron schedule raises ``InvalidSchedule``."""
    snapshots = _mapping(value, "snapshots")
    return SnapshotScheduleSpec(
        schedule=consumer_group.parse_snapshot_schedule(snapshots.get("schedule")),
        storage=parse_storage(snapshots.get("storage"), "snapshots.storage"),
        history_limit=consumer_group._integer(
            snapshots, "historyLimit", 7, 1, 1000, prefix="snapshots."
        ),
    )
