"""Typed records of the coordinator's state topic, one frozen dataclass per Kafka schema.

This module is the single vocabulary shared by the coordinator (which emits and replays
records), the runtime (which writes and loads them) and the Spark jobs (which read and
rewrite them). It holds data only: the binary encoding lives in ``codec``.

A record is a key and a value; a value of ``None`` is a tombstone. The key's class fixes
the record type, exactly like the key version in Kafka's ``__consumer_offsets``:

=====  =============================================  ===================================
 ver    key / value classes                            Kafka schema
=====  =============================================  ===================================
 0/1    OffsetCommitKey / OffsetCommitValue            OffsetCommitKey, OffsetCommitValue
 2      GroupMetadataKey / GroupMetadataValue          GroupMetadataKey, GroupMetadataValue
 3      ConsumerGroupMetadataKey / ...Value            ConsumerGroupMetadata
 4      ConsumerGroupPartitionMetadataKey / ...Value   ConsumerGroupPartitionMetadata
 5      ConsumerGroupMemberMetadataKey / ...Value      ConsumerGroupMemberMetadata
 6      ConsumerGroupTargetAssignmentMetadataKey/...   ConsumerGroupTargetAssignmentMetadata
 7      ConsumerGroupTargetAssignmentMemberKey / ...   ConsumerGroupTargetAssignmentMember
 8      ConsumerGroupCurrentMemberAssignmentKey / ...  ConsumerGroupCurrentMemberAssignment
 1000   GroupConfigKey / GroupConfigValue              ours: per-group settings from the CR
 1001   GroupLifecycleKey / GroupLifecycleValue        ours: when the group became empty
 1002   GroupOwnerKey / GroupOwnerValue                ours: the resource owning the group id
 1100   LoadMarkerKey / LoadMarkerValue                ours: end-of-log marker for loaders
=====  =============================================  ===================================

Our own key versions start at 1000, far from Kafka's (0-15 today, growing slowly), so a
Kafka tool reading the topic skips them as unknown record types instead of misreading them.

Topic ids are 16-byte UUIDs as in Kafka; ``ConsumerGroupPartitionMetadataValue`` maps them
to names.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TypeAlias

# ---------------------------------------------------------------------------------------
# Offsets (key versions 0 and 1)


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = 0
    # Only version 1 carries an explicit expiry; -1 means "use the retention rules".
    expire_timestamp: int = -1


# ---------------------------------------------------------------------------------------
# Classic group metadata (key version 2)


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class GroupMetadataMember:
    """One member of a classic group, as ``GroupMetadataValue.MemberMetadata``.

    ``subscription`` is the member's metadata for the group's selected protocol and
    ``assignment`` what the leader assigned it, both opaque bytes relayed as the clients
    sent them.
    """

    member_id: str
    client_id: str
    client_host: str
    session_timeout: int
    subscription: bytes
    assignment: bytes
    # Versions 3+; None for a dynamic member.
    group_instance_id: str | None = None
    # Versions 1+; -1 where a version 0 record has none.
    rebalance_timeout: int = -1


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    """A classic group as Kafka's ``GroupMetadataValue`` (versions 0-4).

    Kafka writes it when a rebalance completes (the leader's SyncGroup), when a group becomes
    empty, when a static member is replaced without a rebalance, and when a group is created
    or converted; a load rebuilds the group from the latest one. ``version`` is the value
    version the record was read as, and the one it is written as (Kafka writes 3).
    """

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    # Versions 2+: when the group entered its current state (KIP-211), -1 unknown.
    current_state_timestamp: int = -1
    members: tuple[GroupMetadataMember, ...] = ()
    version: int = 3


# ---------------------------------------------------------------------------------------
# KIP-848 consumer group records (key versions 3-8)


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadataKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadataValue:
    epoch: int


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    racks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic_id: uuid.UUID
    topic_name: str
    num_partitions: int
    partition_metadata: tuple[PartitionMetadata, ...] = ()


@dataclass(frozen=True, slots=True)
class ConsumerGroupPartitionMetadataKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupPartitionMetadataValue:
    topics: tuple[TopicMetadata, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupMemberMetadataKey:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ClassicProtocol:
    """One protocol a classic member supports: its name and its (opaque) metadata."""

    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class ClassicMemberMetadata:
    """What a member speaking the classic protocol (JoinGroup) sent: Kafka's tagged field 0."""

    session_timeout_ms: int
    supported_protocols: tuple[ClassicProtocol, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupMemberMetadataValue:
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    # None for a member of the consumer protocol (KIP-848).
    classic_member_metadata: ClassicMemberMetadata | None = None


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    """Partitions of one topic, as Kafka's ``TopicPartitions`` struct (topic by id)."""

    topic_id: uuid.UUID
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupTargetAssignmentMetadataKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupTargetAssignmentMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupTargetAssignmentMemberKey:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupTargetAssignmentMemberValue:
    topic_partitions: tuple[TopicPartitions, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupCurrentMemberAssignmentKey:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupCurrentMemberAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    # Kafka's MemberState ids: 0 STABLE, 1 UNREVOKED_PARTITIONS, 2 UNRELEASED_PARTITIONS,
    # 127 UNKNOWN (see ``coordinator.group_state.MemberState``).
    state: int
    assigned_partitions: tuple[TopicPartitions, ...]
    partitions_pending_revocation: tuple[TopicPartitions, ...]


# ---------------------------------------------------------------------------------------
# Our own records (key versions >= 1000)


@dataclass(frozen=True, slots=True)
class GroupConfigKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class MemberTarget:
    """One member's target assignment, kept in ``GroupConfigValue.paused_targets``."""

    member_id: str
    topic_partitions: tuple[TopicPartitions, ...]


@dataclass(frozen=True, slots=True)
class GroupConfigValue:
    """Settings the operator derives from the ConsumerGroup resource.

    ``assignment_paused`` makes the target assignment empty, so that every member revokes
    cooperatively (used by online offset resets); the partitions come back when cleared.
    ``paused_targets`` holds, while paused, each member's target from just before the pause:
    the resume hands it back as what the members owned, so that a sticky assignor gives
    every member what it had instead of reshuffling.
    """

    assignor: str = "cooperative-sticky"
    session_timeout_ms: int = 45_000
    rebalance_timeout_ms: int = 300_000
    heartbeat_interval_ms: int = 3_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    assignment_paused: bool = False
    topics: tuple[str, ...] = field(default=())
    paused_targets: tuple[MemberTarget, ...] = field(default=())
    # ``spec.assignment: Client``: the group's classic members are a Kafka classic group whose
    # leader assigns; False (``Server``) has the coordinator assign every member.
    client_assignment: bool = False


@dataclass(frozen=True, slots=True)
class GroupLifecycleKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupLifecycleValue:
    """KIP-211: the time the group last became empty (-1 while it has members)."""

    empty_since_ms: int


@dataclass(frozen=True, slots=True)
class GroupOwnerKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class GroupOwnerValue:
    """The ConsumerGroup resource that owns the group id: the first to claim it.

    Kept apart from ``GroupConfigValue`` because it outlives the group's other records
    (offsets expiry removes those, not the claim); only the owner's deletion removes it.
    """

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class LoadMarkerKey:
    """One key per state-topic partition, so compaction keeps only the newest marker."""


@dataclass(frozen=True, slots=True)
class LoadMarkerValue:
    nonce: str
    written_at_ms: int


RecordKey: TypeAlias = (
    OffsetCommitKey
    | GroupMetadataKey
    | ConsumerGroupMetadataKey
    | ConsumerGroupPartitionMetadataKey
    | ConsumerGroupMemberMetadataKey
    | ConsumerGroupTargetAssignmentMetadataKey
    | ConsumerGroupTargetAssignmentMemberKey
    | ConsumerGroupCurrentMemberAssignmentKey
    | GroupConfigKey
    | GroupLifecycleKey
    | GroupOwnerKey
    | LoadMarkerKey
)

RecordValue: TypeAlias = (
    OffsetCommitValue
    | GroupMetadataValue
    | ConsumerGroupMetadataValue
    | ConsumerGroupPartitionMetadataValue
    | ConsumerGroupMemberMetadataValue
    | ConsumerGroupTargetAssignmentMetadataValue
    | ConsumerGroupTargetAssignmentMemberValue
    | ConsumerGroupCurrentMemberAssignmentValue
    | GroupConfigValue
    | GroupLifecycleValue
    | GroupOwnerValue
    | LoadMarkerValue
)


@dataclass(frozen=True, slots=True)
class Record:
    """One state-topic record; ``value is None`` is a tombstone for ``key``."""

    key: RecordKey
    value: RecordValue | None


def group_of(key: RecordKey) -> str | None:
    """The group a key belongs to (``None`` for partition-level records such as markers)."""
    if isinstance(key, OffsetCommitKey | GroupMetadataKey):
        return key.group
    if isinstance(key, LoadMarkerKey):
        return None
    return key.group_id


# Topic ids for brokers that do not report one: deterministic, so every process agrees.
_TOPIC_ID_NAMESPACE = uuid.UUID("6b61666b-612d-6772-6f75-702d746f7069")


def topic_id_for_name(topic_name: str) -> uuid.UUID:
    return uuid.uuid5(_TOPIC_ID_NAMESPACE, topic_name)
