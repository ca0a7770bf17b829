"""Committed offsets: commit and fetch validation, their replay, and retention (KIP-211).

Commit rules (DESIGN §2, KIP-848's OffsetCommit v9+):

* A member commits with its id and its *current* epoch. Unknown member or group:
  ``UNKNOWN_MEMBER_ID`` (a removed zombie lands here); another epoch: ``STALE_MEMBER_EPOCH``
  (retriable after the next heartbeat); both fail the whole request.
* Per partition, the member must own it (assigned, or still revoking it so that it can
  commit its final position). Otherwise that partition fails with ``UNKNOWN_MEMBER_ID``:
  Kafka's own client reads it as "the partition was assigned to another member"
  (``CommitFailedException``) and must not retry, which is exactly the meaning here.
* An administrative commit (member id ``""``, epoch -1, as Kafka's admin client sends) is
  accepted while the group has no members at all. While the group's assignment is paused
  (an online reset), it is accepted per partition once no member owns that partition any
  more, and fails with ``REBALANCE_IN_PROGRESS`` (retriable) while one still does. On an
  active, unpaused group it fails with ``UNKNOWN_MEMBER_ID``, as in Kafka.
* Metadata longer than 4096 UTF-8 bytes (``offset.metadata.max.bytes``) fails that
  partition with ``OFFSET_METADATA_TOO_LARGE``.

Deletion (Kafka's OffsetDelete, ``delete_offsets``) tombstones single partitions' offsets,
except those of topics a member of the group subscribes to (``GROUP_SUBSCRIBED_TO_TOPIC``).

A classic group (the leader assigns) is fenced as Kafka's ``ClassicGroup`` fences it
(``commit_classic_offsets``): by generation, not by partition, since the coordinator does
not know what the leader assigned. Its offsets expire as ``ClassicGroup``'s
``offsetExpirationCondition`` says (``classic_deadlines``).

Retention, as Kafka's ``OffsetMetadataManager#cleanupExpiredOffsets`` for KIP-848 groups,
every expiry a tombstone:

* A group that has been empty for ``offsets_retention_ms`` (from the lifecycle record's
  ``empty_since_ms``, KIP-211; for a group that never had members, from its latest commit)
  loses its offsets and its group records. Its GroupConfig record stays: the operator's
  ConsumerGroup resource still exists and only ``delete_group`` removes it.
* In a group with members, an offset of a topic no member subscribes to expires on its own,
  ``offsets_retention_ms`` after its commit timestamp; offsets of subscribed topics never do.
* An offset with an explicit expire timestamp (old version-1 records) expires when that
  time comes, instead of by either rule above (and never while its topic is subscribed).

A load replays mostly offset commits, 100,000 and more per partition, and most are never
fetched before they are committed again. So the loader may replay an offset commit in the
form the coordinator writes it (value version 3, empty metadata) as its value bytes
(``EncodedCommit``, ``OffsetStore.replay_encoded``): the store keeps the bytes, which are a
fixed layout already checked by the loader, takes the commit timestamp it needs for
retention out of them, and decodes a group's offsets the first time anything reads them.
That decode changes nothing a reader can see (the same ``OffsetCommitValue`` a decoded
replay would have stored); it saves the load three objects per offset, and the garbage
collector's passes over them (bytes are not tracked).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Container, Iterable, Iterator, Mapping

from kafka_group_operator.coordinator import (
    classic_group,
    errors,
    group,
    group_state,
    messages,
    result,
)
from kafka_group_operator.coordinator import records as coordinator_records
from kafka_group_records import codec
from kafka_group_records import records as schema

ClassicState = group_state.ClassicGroupState

# Kafka's offsets.retention.check.interval.ms (default): how often its cleanup runs; an empty
# classic group without offsets is deleted by the next one.
RETENTION_CHECK_INTERVAL_MS = 600_000

MAX_METADATA_BYTES = 4096
# OffsetDelete's refusal of a partition whose topic a member subscribes to (Kafka's error
# 86, a per-partition error with no coordinator exception of its own).
GROUP_SUBSCRIBED_TO_TOPIC = "GROUP_SUBSCRIBED_TO_TOPIC"
# An offset commit's expire timestamp when it carries none (every version but 1).
NO_EXPIRY = -1

TopicPartition = messages.TopicPartition
# An offset commit as the loader may replay it: group id, (topic, partition), and the value's
# bytes in the coordinator's own form (version 3, empty metadata: ``ENCODED_VALUE_SIZE`` bytes).
EncodedCommit = tuple[str, TopicPartition, bytes]
ENCODED_VALUE_SIZE = 24
# Where that form keeps the commit timestamp: after version, offset, epoch, metadata length.
_ENCODED_COMMIT_TIMESTAMP = struct.Struct(">q")
_ENCODED_COMMIT_TIMESTAMP_AT = 16
# Why a partition may not be committed (a Kafka error name), or None when it may.
_PartitionCheck = Callable[[str, int], str | None]


class OffsetStore:
    """The committed offsets of every group on the shard, rebuilt by replay."""

    def __init__(self) -> None:
        # A value is bytes when replayed encoded and not read since (see the docstring).
        self._offsets: dict[str, dict[TopicPartition, schema.OffsetCommitValue | bytes]] = {}
        # Groups holding encoded values: ``committed`` decodes them on first reading.
        self._encoded: set[str] = set()
        self._latest_commit_ms: dict[str, int] = {}
        # How many of a group's offsets carry an explicit expire timestamp (groups with
        # none are absent): retention scans a member-less group's offsets only if any do.
        self._explicit_expiries: dict[str, int] = {}

    def replay(self, key: schema.OffsetCommitKey, value: schema.RecordValue | None) -> None:
        partition = (key.topic, key.partition)
        group_id = key.group
        if value is None:
            committed = self._offsets.get(group_id)
            if committed is not None:
                self._count_explicit(group_id, committed.pop(partition, None), -1)
                if not committed:
                    del self._offsets[group_id]
                    self._encoded.discard(group_id)
                    self._latest_commit_ms.pop(group_id, None)
            return
        assert isinstance(value, schema.OffsetCommitValue)
        committed = self._offsets.setdefault(group_id, {})
        self._count_explicit(group_id, committed.get(partition), -1)
        committed[partition] = value
        self._count_explicit(group_id, value, 1)
        latest = self._latest_commit_ms.get(group_id, value.commit_timestamp)
        self._latest_commit_ms[group_id] = max(latest, value.commit_timestamp)

    def replay_encoded(self, commits: Iterable[EncodedCommit]) -> None:
        """Replay offset commits given as ``EncodedCommit``: the same state as replaying
        each one decoded, in the same order (a value's bytes must be of that form)."""
        offsets, encoded, latest = self._offsets, self._encoded, self._latest_commit_ms
        timestamp, at = _ENCODED_COMMIT_TIMESTAMP.unpack_from, _ENCODED_COMMIT_TIMESTAMP_AT
        for group_id, partition, value in commits:
            if len(value) != ENCODED_VALUE_SIZE:
                raise ValueError(f"not an encoded offset commit value: {value!r}")
            committed = offsets.get(group_id)
            if committed is None:
                committed = offsets[group_id] = {}
            else:
                self._count_explicit(group_id, committed.get(partition), -1)
            committed[partition] = value
            encoded.add(group_id)
            commit_ms: int = timestamp(value, at)[0]
            if latest.get(group_id, commit_ms) <= commit_ms:
                latest[group_id] = commit_ms

    def _count_explicit(
        self, group_id: str, value: schema.OffsetCommitValue | bytes | None, change: int
    ) -> None:
        # Encoded values never carry an explicit expiry (only version 1 does).
        if value is None or isinstance(value, bytes) or value.expire_timestamp == NO_EXPIRY:
            return
        count = self._explicit_expiries.get(group_id, 0) + change
        if count:
            self._explicit_expiries[group_id] = count
        else:
            del self._explicit_expiries[group_id]

    def explicit_expiries(self, group_id: str) -> int:
        """How many of the group's offsets carry an explicit expire timestamp."""
        return self._explicit_expiries.get(group_id, 0)

    def committed(self, group_id: str) -> Mapping[TopicPartition, schema.OffsetCommitValue]:
        committed = self._offsets.get(group_id)
        if committed is None:
            return {}
        if group_id in self._encoded:
            for partition, value in committed.items():
                if isinstance(value, bytes):
                    # Replacing a value while iterating is safe: the keys do not change.
                    committed[partition] = _decoded(group_id, partition, value)
            self._encoded.discard(group_id)
        return committed  # type: ignore[return-value]  # every value decoded just above

    def committed_outside(
        self, group_id: str, topics: Mapping[str, int]
    ) -> Iterator[tuple[TopicPartition, schema.OffsetCommitValue]]:
        """The group's offsets of topics not in ``topics``, decoding only those."""
        for partition, value in self._offsets.get(group_id, {}).items():
            if partition[0] not in topics:
                if isinstance(value, bytes):
                    yield partition, _decoded(group_id, partition, value)
                else:
                    yield partition, value

    def count(self, group_id: str) -> int:
        """How many offsets the group has committed."""
        return len(self._offsets.get(group_id, ()))

    def has_offsets(self, group_id: str) -> bool:
        return group_id in self._offsets

    def latest_commit_ms(self, group_id: str) -> int | None:
        return self._latest_commit_ms.get(group_id)

    def group_ids(self) -> list[str]:
        return list(self._offsets)


def _decoded(group_id: str, partition: TopicPartition, value: bytes) -> schema.OffsetCommitValue:
    decoded = codec.decode_value(schema.OffsetCommitKey(group_id, *partition), value)
    assert isinstance(decoded, schema.OffsetCommitValue)
    return decoded


def commit_offsets(
    store: OffsetStore,
    existing: group.ConsumerGroup | None,
    request: messages.OffsetCommitRequest,
    now_ms: int,
) -> result.Result[messages.OffsetCommitResponse]:
    if not request.group_id:
        raise errors.InvalidRequest("GroupId can't be empty.")
    is_admin = request.member_id == "" and request.member_epoch == messages.LEAVE_EPOCH
    failed: dict[TopicPartition, str] = {}
    if is_admin:
        may_commit = _admin_permission(existing)
    else:
        member = _validated_member(existing, request.group_id, request.member_id)
        if request.member_epoch != member.member_epoch:
            if member.subscription().classic_member_metadata is not None:
                # A classic member commits with its generation (Kafka's
                # validateOffsetCommit for classic members): a stale one is illegal.
                raise errors.IllegalGeneration(
                    f"Generation {request.member_epoch} is not the current {member.member_epoch}."
                )
            raise errors.StaleMemberEpoch(
                f"Member epoch {request.member_epoch} is not the current {member.member_epoch}."
            )
        assert existing is not None
        may_commit = _member_permission(existing, member)
    records = []
    for (topic, partition), commit in sorted(request.offsets.items()):
        refusal = may_commit(topic, partition)
        if refusal is None and len(commit.metadata.encode("utf-8")) > MAX_METADATA_BYTES:
            refusal = errors.OffsetMetadataTooLarge.name
        if refusal is not None:
            failed[(topic, partition)] = refusal
            continue
        records.append(
            coordinator_records.new_offset_commit_record(
                request.group_id, topic, partition, commit, now_ms
            )
        )
    return result.Result(messages.OffsetCommitResponse(errors=failed), records)


def commit_classic_offsets(
    existing: classic_group.ClassicGroup,
    request: messages.OffsetCommitRequest,
    now_ms: int,
    *,
    transactional: bool = False,
) -> result.Result[messages.OffsetCommitResponse]:
    """Kafka's ``ClassicGroup.validateOffsetCommit``, then every partition is written."""
    state = existing.state
    generation = request.member_epoch
    if state is ClassicState.DEAD:
        raise errors.CoordinatorNotAvailable(f"Group {existing.group_id} is dead.")
    if not (generation < 0 and state is ClassicState.EMPTY):
        if generation >= 0 or request.member_id or request.instance_id is not None:
            existing.validate_member(request.member_id, request.instance_id)
            if generation != existing.generation:
                raise errors.IllegalGeneration(
                    f"Generation {generation} is not the group's {existing.generation}."
                )
        elif not transactional and state is not ClassicState.EMPTY:
            raise errors.UnknownMemberId(
                f"Group {existing.group_id} has members: only they may commit."
            )
        if not transactional and state is ClassicState.COMPLETING_REBALANCE:
            raise errors.RebalanceInProgress(
                f"Group {existing.group_id} is completing a rebalance."
            )
    failed: dict[TopicPartition, str] = {}
    records = []
    for (topic, partition), commit in sorted(request.offsets.items()):
        if len(commit.metadata.encode("utf-8")) > MAX_METADATA_BYTES:
            failed[(topic, partition)] = errors.OffsetMetadataTooLarge.name
            continue
        records.append(
            coordinator_records.new_offset_commit_record(
                request.group_id, topic, partition, commit, now_ms
            )
        )
    return result.Result(messages.OffsetCommitResponse(errors=failed), records)


def _validated_member(
    existing: group.ConsumerGroup | None, group_id: str, member_id: str
) -> group.Member:
    if existing is None:
        raise errors.UnknownMemberId(f"Group {group_id} has no members.")
    member = existing.members.get(member_id)
    if member is None or not member.has_subscription:
        raise errors.UnknownMemberId(f"Member {member_id!r} is not in group {group_id}.")
    return member


def _member_permission(existing: group.ConsumerGroup, member: group.Member) -> _PartitionCheck:
    ids = existing.topic_ids_by_name

    def check(topic: str, partition: int) -> str | None:
        topic_id = ids.get(topic)
        if topic_id is not None and existing.owners.get((topic_id, partition)) == member.member_id:
            return None
        return errors.UnknownMemberId.name

    return check


def _admin_permission(existing: group.ConsumerGroup | None) -> _PartitionCheck:
    if existing is None or not existing.members:
        return _anything
    if not existing.settings.assignment_paused:
        raise errors.UnknownMemberId(
            f"Group {existing.group_id} has active members: only its members may commit."
        )
    ids = existing.topic_ids_by_name

    def check(topic: str, partition: int) -> str | None:
        topic_id = ids.get(topic)
        if topic_id is not None and (topic_id, partition) in existing.owners:
            return errors.RebalanceInProgress.name
        return None

    return check


def _anything(topic: str, partition: int) -> str | None:
    return None


def delete_offsets(
    store: OffsetStore,
    existing: group.ConsumerGroup | None,
    request: messages.OffsetDeleteRequest,
) -> result.Result[messages.OffsetDeleteResponse]:
    """Kafka's ``OffsetMetadataManager#deleteOffsets`` for a consumer group: an unknown
    group is ``GROUP_ID_NOT_FOUND``; a partition of a topic some member subscribes to is
    refused with ``GROUP_SUBSCRIBED_TO_TOPIC`` (its members would lose their position);
    every other partition is answered without error, and a tombstone is written for each
    one that has a committed offset (replaying it removes the offset)."""
    group_id = request.group_id
    if not group_id:
        raise errors.InvalidGroupId("GroupId can't be empty.")
    if existing is None and not store.has_offsets(group_id):
        raise errors.GroupIdNotFound(f"Group {group_id} does not exist.")
    subscribed: Container[str] | None = existing.subscribed_topics if existing is not None else None
    committed = store.committed(group_id)
    refused: dict[TopicPartition, str] = {}
    records = []
    for topic, partition in sorted(set(request.partitions)):
        if subscribed is not None and topic in subscribed:
            refused[(topic, partition)] = GROUP_SUBSCRIBED_TO_TOPIC
        elif (topic, partition) in committed:
            records.append(
                coordinator_records.new_offset_commit_tombstone(group_id, topic, partition)
            )
    return result.Result(messages.OffsetDeleteResponse(errors=refused), records)


def delete_classic_offsets(
    store: OffsetStore,
    existing: classic_group.ClassicGroup,
    request: messages.OffsetDeleteRequest,
) -> result.Result[messages.OffsetDeleteResponse]:
    """Kafka's ``ClassicGroup.validateOffsetDelete``: a group with members that does not
    speak the consumer protocol has no say over single offsets (NON_EMPTY_GROUP); one that
    does refuses the topics it subscribes to."""
    if existing.state is ClassicState.DEAD:
        raise errors.GroupIdNotFound(f"Group {existing.group_id} is dead.")
    if existing.state is not ClassicState.EMPTY and not existing.uses_consumer_protocol():
        raise errors.NonEmptyGroup(f"Group {existing.group_id} has members.")
    committed = store.committed(existing.group_id)
    refused: dict[TopicPartition, str] = {}
    records = []
    for topic, partition in sorted(set(request.partitions)):
        if existing.is_subscribed_to_topic(topic):
            refused[(topic, partition)] = GROUP_SUBSCRIBED_TO_TOPIC
        elif (topic, partition) in committed:
            records.append(
                coordinator_records.new_offset_commit_tombstone(existing.group_id, topic, partition)
            )
    return result.Result(messages.OffsetDeleteResponse(errors=refused), records)


def fetch_offsets(
    store: OffsetStore,
    existing: group.ConsumerGroup | None,
    request: messages.OffsetFetchRequest,
) -> messages.OffsetFetchResponse:
    if request.member_id is not None:
        member = _validated_member(existing, request.group_id, request.member_id)
        if request.member_epoch is not None and request.member_epoch != member.member_epoch:
            raise errors.StaleMemberEpoch(
                f"Member epoch {request.member_epoch} is not the current {member.member_epoch}."
            )
    committed = store.committed(request.group_id)
    wanted = committed.keys() if request.partitions is None else request.partitions
    return messages.OffsetFetchResponse(
        offsets={
            partition: _committed_offset(committed[partition])
            for partition in sorted(wanted)
            if partition in committed
        }
    )


def _committed_offset(value: schema.OffsetCommitValue) -> messages.CommittedOffset:
    return messages.CommittedOffset(
        offset=value.offset,
        metadata=value.metadata,
        leader_epoch=value.leader_epoch,
        commit_timestamp=value.commit_timestamp,
    )


# ---------------------------------------------------------------------------------------
# Retention


def retention_deadline_ms(
    store: OffsetStore, existing: group.ConsumerGroup | None, group_id: str
) -> int | None:
    """When something of the group expires next, or None if nothing ever will as it stands."""
    deadline = group_expiry_ms(store, existing, group_id)
    for _, offset_deadline in _expiring_alone(store, existing, group_id):
        if deadline is None or offset_deadline < deadline:
            deadline = offset_deadline
    return deadline


def group_expiry_ms(
    store: OffsetStore, existing: group.ConsumerGroup | None, group_id: str
) -> int | None:
    """KIP-211: when an empty group loses its records and every offset without an explicit
    expiry; None while it has members, or when it holds nothing of that kind."""
    if existing is not None and existing.members:
        return None
    expiring_with_group = store.count(group_id) - store.explicit_expiries(group_id)
    if not expiring_with_group and not _has_group_records(existing):
        return None
    settings = existing.settings if existing is not None else group.DEFAULT_CONFIG
    if (
        existing is not None
        and existing.empty_since_ms is not None
        and existing.empty_since_ms >= 0
    ):
        base = existing.empty_since_ms
    else:
        latest = store.latest_commit_ms(group_id)
        if latest is None:
            return None
        base = latest
    return base + settings.offsets_retention_ms


def expired(
    store: OffsetStore, existing: group.ConsumerGroup | None, group_id: str, now_ms: int
) -> tuple[list[schema.Record], bool]:
    """Tombstones of the group's offsets expired at ``now_ms``, and whether the whole group
    (its records too, which the caller tombstones) has expired."""
    due = {
        partition
        for partition, deadline in _expiring_alone(store, existing, group_id)
        if deadline <= now_ms
    }
    group_deadline = group_expiry_ms(store, existing, group_id)
    group_expired = group_deadline is not None and group_deadline <= now_ms
    if group_expired:
        due.update(
            partition
            for partition, value in store.committed(group_id).items()
            if value.expire_timestamp == NO_EXPIRY
        )
    records = [
        coordinator_records.new_offset_commit_tombstone(group_id, topic, partition)
        for topic, partition in sorted(due)
    ]
    return records, group_expired


def may_expire_alone(existing: group.ConsumerGroup | None, topic: str) -> bool:
    """Whether an offset of ``topic`` can expire by itself or move the group's deadline: not
    while a member subscribes to the topic. Live replay skips re-arming retention otherwise."""
    return existing is None or not existing.members or topic not in existing.subscribed_topics


def _expiring_alone(
    store: OffsetStore, existing: group.ConsumerGroup | None, group_id: str
) -> Iterator[tuple[TopicPartition, int]]:
    """The offsets that expire one by one, each with its deadline: in a group with members,
    those of topics no member subscribes to; in any group, those with an explicit expiry."""
    if existing is not None and existing.members:
        retention_ms = existing.settings.offsets_retention_ms
        # Offsets of subscribed topics never expire alone: those are not even decoded.
        for partition, value in store.committed_outside(group_id, existing.subscribed_topics):
            if value.expire_timestamp == NO_EXPIRY:
                yield partition, value.commit_timestamp + retention_ms
            else:
                yield partition, value.expire_timestamp
    elif store.explicit_expiries(group_id):
        for partition, value in store.committed(group_id).items():
            if value.expire_timestamp != NO_EXPIRY:
                yield partition, value.expire_timestamp


def classic_deadlines(
    store: OffsetStore, existing: classic_group.ClassicGroup, retention_ms: int
) -> dict[TopicPartition, int]:
    """When each offset of a classic group may expire (Kafka's ``offsetExpirationCondition``
    of a ``ClassicGroup`` and ``cleanupExpiredOffsets``), absent for those that cannot:

    * no protocol type (a group only commits): ``retention_ms`` after each commit;
    * Empty: ``retention_ms`` after the group became empty (its state timestamp), or after
      each commit when that time is unknown;
    * Stable, speaking the consumer protocol, its topics known: the offsets of topics no
      member subscribes to, ``retention_ms`` after each commit;
    * otherwise (rebalancing, or another protocol): none.

    An offset with an explicit expire timestamp (version-1 records) expires then instead.
    """
    state = existing.state
    if existing.protocol_type is None:
        base_of_group = None
    elif state is ClassicState.EMPTY:
        base_of_group = existing.state_timestamp
    elif (
        state is ClassicState.STABLE
        and existing.uses_consumer_protocol()
        and existing.subscribed_topics is not None
    ):
        base_of_group = None
    else:
        return {}
    deadlines: dict[TopicPartition, int] = {}
    for partition, value in store.committed(existing.group_id).items():
        if existing.is_subscribed_to_topic(partition[0]):
            continue
        if value.expire_timestamp != NO_EXPIRY:
            deadlines[partition] = value.expire_timestamp
        else:
            base = value.commit_timestamp if base_of_group is None else base_of_group
            deadlines[partition] = base + retention_ms
    return deadlines


def classic_may_expire(existing: classic_group.ClassicGroup, topic: str) -> bool:
    """Whether a commit of ``topic`` can move the group's retention deadline."""
    if existing.state in (ClassicState.EMPTY, ClassicState.DEAD) or existing.protocol_type is None:
        return True
    return existing.state is ClassicState.STABLE and not existing.is_subscribed_to_topic(topic)


def offset_tombstones(store: OffsetStore, group_id: str) -> list[schema.Record]:
    """Tombstones for every committed offset of the group (expiry or deletion)."""
    return [
        coordinator_records.new_offset_commit_tombstone(group_id, topic, partition)
        for topic, partition in sorted(store.committed(group_id))
    ]


def _has_group_records(existing: group.ConsumerGroup | None) -> bool:
    return existing is not None and (
        bool(existing.target)
        or existing.has_target_epoch
        or existing.has_partition_metadata
        or existing.empty_since_ms is not None
        or existing.has_group_epoch
    )
