"""The compaction checkpoint format, shared by the compaction job (writer) and loaders (readers).

A checkpoint is a directory with two files:

* ``records.parquet``: the state topic's newest live record per key, columns
  ``partition int32, offset int64, key binary, value binary`` (value never null), sorted by
  partition then offset. Load markers are left out. Nothing is judged: the records of a group
  whose offsets expired stay, as they stay in the log, and the loader's coordinator expires
  them after the load by its own retention rule (KIP-211), as it would after a full load.
* ``checkpoint.json``: ``{"format": 1, "topic": ..., "endOffsets": {"<partition>": <offset>},
  "records": n, "createdAtMs": ms, "fence": kind}``. ``endOffsets[p]`` is exclusive: the
  checkpoint covers offsets ``[0, endOffsets[p])`` of partition ``p``. ``fence`` says where
  those ends came from (``coordinator``: markers the coordinator appended on request;
  ``last-stable-offset``: the partitions' last stable offsets, with no coordinator asked).
  Checkpoints of earlier versions carry a ``tombstones`` count instead, which is ignored.
  Partitions are INT32s written in ASCII digits, ends, ``records`` and ``createdAtMs`` JSON
  integers from 0 to INT64's largest; anything else makes the manifest unusable.

How a loader uses it, per state partition ``p``: decode and replay the checkpoint's rows of
``p`` in order (each is the newest live value of its key up to the covered end), then consume
the log from ``endOffsets[p]`` to its end and replay that as usual. The result equals replaying
the whole log, because every key's newest record before the end is in the checkpoint and
everything after it is replayed. ``endOffsets`` names every partition of the topic it was
taken from. A checkpoint whose ``topic`` differs, whose partitions are not exactly the
loader's (another partition count places groups elsewhere), or whose ``endOffsets[p]`` is
beyond the log's end (the topic was recreated), must be ignored.

Pure: JSON in and out; reading Parquet is the caller's business (pyarrow or Spark).
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 1
RECORDS_FILE = "records.parquet"
MANIFEST_FILE = "checkpoint.json"
RECORD_COLUMNS = ("partition", "offset", "key", "value")


class CheckpointError(ValueError):
    """A checkpoint manifest that this version cannot use."""


# Kafka's types: a partition is an INT32, an offset an INT64, neither negative here (a
# negative start would be read as a logical offset: -1 is "the log's end").
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
# A partition as the manifest writes it: ASCII digits (int() would take " 7", "٣", "7_0").
_PARTITION_TEXT = re.compile(r"[0-9]{1,10}")


def _whole(value: object, what: str, most: int = _INT64_MAX) -> int:
    """``value`` if it is a JSON integer from 0 to ``most``: no bool, fraction or string."""
    if type(value) is not int or not 0 <= value <= most:
        raise CheckpointError(f"{what} is {reprlib.repr(value)}, not an integer from 0 to {most}")
    return value


def _end_offsets(document: object) -> dict[int, int]:
    if not isinstance(document, dict):
        raise CheckpointError("endOffsets is not an object")
    ends: dict[int, int] = {}
    for text, offset in document.items():
        if not _PARTITION_TEXT.fullmatch(text):
            raise CheckpointError(f"endOffsets names partition {reprlib.repr(text)}")
        partition = _whole(int(text), "an endOffsets partition", _INT32_MAX)
        ends[partition] = _whole(offset, f"the end offset of partition {partition}")
    return ends


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    topic: str
    # partition -> first offset NOT covered by the checkpoint
    end_offsets: dict[int, int] = field(default_factory=dict)
    records: int = 0
    created_at_ms: int = 0
    fence: str = ""

    def tail_start(self, partition: int) -> int:
        """Where a loader continues reading partition ``partition`` after the checkpoint."""
        return self.end_offsets.get(partition, 0)


def manifest_document(manifest: CheckpointManifest) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "topic": manifest.topic,
        "endOffsets": {str(p): offset for p, offset in sorted(manifest.end_offsets.items())},
        "records": manifest.records,
        "createdAtMs": manifest.created_at_ms,
        "fence": manifest.fence,
    }


def parse_manifest(text: str) -> CheckpointManifest:
    """The manifest in ``checkpoint.json``; ``CheckpointError`` when it is not one we read."""
    try:
        document = json.loads(text)
        if document.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"unsupported checkpoint format {document.get('format')!r}")
        return CheckpointManifest(
            topic=str(document["topic"]),
            end_offsets=_end_offsets(document["endOffsets"]),
            records=_whole(document["records"], "records"),
            created_at_ms=_whole(document.get("createdAtMs", 0), "createdAtMs"),
            fence=str(document.get("fence", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(f"not a checkpoint manifest: {error}") from error


def check_fits(manifest: CheckpointManifest, topic: str, partitions: int) -> None:
    """``CheckpointError`` unless the checkpoint was taken from ``topic`` with ``partitions``
    partitions (the log-end check needs the log, so it is the loader's)."""
    if manifest.topic != topic:
        raise CheckpointError(f"checkpoint of topic {manifest.topic!r}, not {topic!r}")
    if set(manifest.end_offsets) != set(range(partitions)):
        raise CheckpointError(
            f"checkpoint covers {len(manifest.end_offsets)} partitions, not exactly the "
            f"{partitions} of the topic"
        )
