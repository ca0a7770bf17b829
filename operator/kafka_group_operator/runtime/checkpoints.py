"""Compaction checkpoints on the coordinator's side: find the newest usable one, read it.

The format is ``kafka_group_records.checkpoint``; this module does the I/O with pyarrow. A
checkpoint location is a local directory (``file://`` URI or plain path) holding either one
checkpoint or, as scheduled compaction leaves them, several ``checkpoint-<UTC stamp>``
directories, of which the newest usable one is taken. A checkpoint is complete once its
manifest exists: the compaction job writes the Parquet first.

Anything wrong with a checkpoint (missing, unreadable, another topic or partition count) is a
``checkpoint.CheckpointError``; the loader then reads the log from its start, which is always
correct, only slower.

A checkpoint is also too old once the log after it may have lost tombstones: Kafka's cleaner
drops a tombstone ``delete.retention.ms`` after it compacted the segment holding it, so a
group deleted (or an offset expired) after the checkpoint was taken would leave no trace in
the tail, and the checkpoint's record of it would come back. Like any Kafka consumer that
must see deletes, a load from a checkpoint must end within ``delete.retention.ms`` of the
checkpoint's reading: ``usable_age_ms`` keeps a margin for the load and for clocks.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kafka_group_records import checkpoint

logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"


@dataclass(frozen=True)
class Checkpoint:
    location: Path
    manifest: checkpoint.CheckpointManifest
    # partition -> key -> value: each key's newest live record up to the covered end, in
    # offset order, exactly the survivors a full read of those offsets would leave.
    survivors: dict[int, dict[bytes, bytes | None]]


def local_directory(uri: str) -> Path:
    """The directory of a ``file://`` URI or plain path; other storage is not read here."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise checkpoint.CheckpointError(f"file URI with a remote host: {uri}")
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    raise checkpoint.CheckpointError(
        f"checkpoints are read from local directories only, not {parsed.scheme}:// ({uri})"
    )


def candidates(directory: Path) -> list[Path]:
    """Complete checkpoints at ``directory``, newest first."""
    if (directory / checkpoint.MANIFEST_FILE).is_file():
        return [directory]
    if not directory.is_dir():
        return []
    found = [
        child
        for child in directory.iterdir()
        if child.name.startswith(CHECKPOINT_PREFIX) and (child / checkpoint.MANIFEST_FILE).is_file()
    ]
    # The stamps are zero-padded UTC times: name order is time order.
    return sorted(found, key=lambda child: child.name, reverse=True)


def read(location: Path, topic: str, partitions: int, wanted: Collection[int]) -> Checkpoint:
    """The checkpoint at ``location``, holding only the rows of the ``wanted`` partitions."""
    try:
        manifest = checkpoint.parse_manifest(
            (location / checkpoint.MANIFEST_FILE).read_text(encoding="utf-8")
        )
        checkpoint.check_fits(manifest, topic, partitions)
        table = pq.read_table(
            location / checkpoint.RECORDS_FILE,
            columns=list(checkpoint.RECORD_COLUMNS),
            filters=[("partition", "in", sorted(wanted))],
        )
    except checkpoint.CheckpointError:
        raise
    except (OSError, ValueError, pa.ArrowException) as error:
        raise checkpoint.CheckpointError(f"unreadable checkpoint {location}: {error}") from error
    if len(wanted) == partitions and table.num_rows != manifest.records:
        raise checkpoint.CheckpointError(
            f"checkpoint {location} holds {table.num_rows} records, its manifest says "
            f"{manifest.records}"
        )
    # Spark writes the rows sorted, but as several files: the order is established here.
    table = table.sort_by([("partition", "ascending"), ("offset", "ascending")])
    for name in ("key", "value"):
        if table.column(name).null_count:
            row = table.filter(pc.is_null(table.column(name))).slice(0, 1).to_pylist()[0]
            raise checkpoint.CheckpointError(
                f"checkpoint {location}: partition {row['partition']} offset {row['offset']} "
                "has no key or value"
            )
    # Column by column, a partition at a time: the rows are sorted by partition, and a dict
    # built from two lists costs a fraction of a Python loop over 100,000 rows.
    survivors: dict[int, dict[bytes, bytes | None]] = {partition: {} for partition in wanted}
    partitions = table.column("partition")
    for partition in sorted(wanted):
        rows = table.filter(pc.equal(partitions, partition))
        if not rows.num_rows:
            continue
        last = pc.max(rows.column("offset")).as_py()
        if last >= manifest.tail_start(partition):
            raise checkpoint.CheckpointError(
                f"checkpoint {location}: offset {last} of partition {partition} is past the "
                "offsets it covers"
            )
        survivors[partition] = dict(
            zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True)
        )
    return Checkpoint(location, manifest, survivors)


# A load and the clocks of the compaction job and of the coordinator get up to an hour (and at
# most half the topic's delete.retention.ms) between a checkpoint's age and that retention.
LOAD_MARGIN_MS = 3600 * 1000


def usable_age_ms(delete_retention_ms: int) -> int:
    """The oldest a checkpoint may be for a topic that keeps tombstones this long."""
    return delete_retention_ms - min(delete_retention_ms // 2, LOAD_MARGIN_MS)


def newest(
    uri: str,
    topic: str,
    partitions: int,
    wanted: Collection[int],
    *,
    now_ms: int,
    delete_retention_ms: int,
) -> Checkpoint | None:
    """The newest usable checkpoint at ``uri`` for these partitions, or None (logged). One
    taken longer ago than ``usable_age_ms`` is not used, nor any older one."""
    try:
        found = candidates(local_directory(uri))
    except checkpoint.CheckpointError as error:
        logger.warning("no compaction checkpoint used: %s; loading the whole log", error)
        return None
    for location in found:
        try:
            taken = read(location, topic, partitions, wanted)
            age_ms = now_ms - taken.manifest.created_at_ms
            if age_ms > usable_age_ms(delete_retention_ms):
                logger.warning(
                    "compaction checkpoint %s not used: taken %.0f s ago, and the state topic "
                    "keeps tombstones %.0f s (delete.retention.ms): a group deleted or an "
                    "offset expired since may have left no trace in the log after it; "
                    "loading the whole log",
                    location,
                    age_ms / 1000,
                    delete_retention_ms / 1000,
                )
                return None
            return taken
        except checkpoint.CheckpointError as error:
            logger.warning("compaction checkpoint not used: %s", error)
        except Exception:
            # Whatever went wrong, reading the whole log is always correct.
            logger.exception("compaction checkpoint %s not used", location)
    logger.warning("no usable compaction checkpoint at %s; loading the whole log", uri)
    return None


def write(
    location: Path,
    manifest: checkpoint.CheckpointManifest,
    rows: Iterable[tuple[int, int, bytes, bytes]],
) -> None:
    """Writes a checkpoint of ``(partition, offset, key, value)`` rows as the compaction job
    does (one Parquet file rather than Spark's directory of them; readers take either)."""
    ordered = sorted(rows, key=lambda row: (row[0], row[1]))
    table = pa.table(
        {
            "partition": pa.array([row[0] for row in ordered], pa.int32()),
            "offset": pa.array([row[1] for row in ordered], pa.int64()),
            "key": pa.array([row[2] for row in ordered], pa.binary()),
            "value": pa.array([row[3] for row in ordered], pa.binary()),
        }
    )
    location.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, location / checkpoint.RECORDS_FILE)
    # The manifest last: its presence says the checkpoint is complete.
    (location / checkpoint.MANIFEST_FILE).write_text(
        json.dumps(checkpoint.manifest_document(manifest)), encoding="utf-8"
    )
