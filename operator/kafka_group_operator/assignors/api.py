"""The one interface every partition assignor implements, and its input and output types.

Pure data and a Protocol: the coordinator builds a ``GroupSpec`` from its state (owned =
the current target assignment, generation = the assignment epoch), the CLI builds one from
JSON, and both call ``assignor.assign(spec)``.

Partitions are ``(topic, partition)`` tuples throughout: they are the cheapest hashable
pair in CPython, and the assignors are on the hot path of every rebalance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

TopicPartition = tuple[str, int]
# member id -> partitions, each list sorted by (topic, partition)
GroupAssignment = dict[str, list[TopicPartition]]


class AssignorError(Exception):
    """The input cannot be assigned (Kafka's ``PartitionAssignorException``)."""


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    topics: frozenset[str]
    owned: tuple[TopicPartition, ...] = ()
    # Generation in which ``owned`` was assigned; None is Kafka's DEFAULT_GENERATION (-1).
    generation: int | None = None
    rack: str | None = None
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class GroupSpec:
    members: Mapping[str, MemberSubscription]
    partitions_per_topic: Mapping[str, int]
    # topic -> for each partition index, the racks holding its replicas
    partition_racks: Mapping[str, Sequence[frozenset[str]]] = field(default_factory=dict)


class PartitionAssignor(Protocol):
    name: str

    def assign(self, spec: GroupSpec) -> GroupAssignment:
        """Assign every partition of every subscribed topic exactly once, to a subscriber."""
        ...
