"""What every coordinator write handler returns: the records to persist and the response.

The runtime appends ``records`` to the state topic, waits for the acknowledgement, replays
them into the shard, and only then hands ``response`` to the caller. A handler never mutates
state itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kafka_group_records import records

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Result(Generic[T]):
    response: T
    records: list[records.Record] = field(default_factory=list)
