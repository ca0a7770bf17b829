"""The consumer-group aggregate: hard state of one group and its members, changed only by replay.

``ConsumerGroup.apply`` is the only code that mutates this state; the handlers in
``membership`` read it and return records. Besides the records' content the aggregate keeps
indexes that replay maintains so that a heartbeat never scans the group:

* ``owners``: partition -> the member that owns it (assigned or pending revocation). Replay
  refuses a record that would give a partition to a second member
  (``errors.InconsistentState``), which is the "never owned twice" invariant enforced at
  the only place state changes.
* ``static_members``: instance id -> member id.
* ``subscribed_topics``: how many members subscribe to each topic name.
* ``unreconciled``: members not yet STABLE at the target epoch (drives RECONCILING).

The group's state is derived after each record (``group_state`` has the tables). Topic ids
are Kafka's UUIDs; names come from the group's partition-metadata record.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field

from kafka_group_operator.coordinator import errors, group_state
from kafka_group_operator.coordinator import records as coordinator_records
from kafka_group_records import records as schema

TopicIdAssignment = coordinator_records.TopicIdAssignment
PartitionKey = tuple[uuid.UUID, int]

DEFAULT_CONFIG = schema.GroupConfigValue()


@dataclass(slots=True)
class Member:
    """One member: its subscription (member-metadata record) and current assignment."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: group_state.MemberState = group_state.MemberState.STABLE
    assigned: TopicIdAssignment = field(default_factory=dict)
    pending_revocation: TopicIdAssignment = field(default_factory=dict)
    # Which of the member's records exist, so removal writes exactly the needed tombstones.
    has_subscription: bool = False
    has_current_assignment: bool = False
    # The replayed record itself, so that rebalances do not rebuild it for every member.
    subscription_record: schema.ConsumerGroupMemberMetadataValue | None = None

    def subscription(self) -> schema.ConsumerGroupMemberMetadataValue:
        if self.subscription_record is not None:
            return self.subscription_record
        return schema.ConsumerGroupMemberMetadataValue(
            instance_id=self.instance_id,
            rack_id=self.rack_id,
            client_id=self.client_id,
            client_host=self.client_host,
            subscribed_topic_names=self.subscribed_topic_names,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            server_assignor=self.server_assignor,
        )

    def owned_partitions(self) -> list[PartitionKey]:
        """Every partition this member holds, including those it is still revoking."""
        held = [(topic, p) for topic, parts in self.assigned.items() for p in parts]
        held.extend((topic, p) for topic, parts in self.pending_revocation.items() for p in parts)
        return held


class ConsumerGroup:
    """Hard state of one group, rebuilt from its records."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.config: schema.GroupConfigValue | None = None
        # KIP-211: when the group last became empty; -1 while it has members, None unknown.
        self.empty_since_ms: int | None = None
        self.topics: dict[uuid.UUID, schema.TopicMetadata] = {}
        self.topic_ids_by_name: dict[str, uuid.UUID] = {}
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}
        self.target: dict[str, TopicIdAssignment] = {}
        self.owners: dict[PartitionKey, str] = {}
        self.subscribed_topics: Counter[str] = Counter()
        self.unreconciled: set[str] = set()
        self.has_group_epoch = False
        self.has_partition_metadata = False
        self.has_target_epoch = False
        self.state = group_state.GroupState.EMPTY

    # -----------------------------------------------------------------------------------
    # Reads

    @property
    def settings(self) -> schema.GroupConfigValue:
        return self.config if self.config is not None else DEFAULT_CONFIG

    def topic_name(self, topic_id: uuid.UUID) -> str:
        metadata = self.topics.get(topic_id)
        return metadata.topic_name if metadata is not None else str(topic_id)

    def by_name(self, assignment: TopicIdAssignment) -> dict[str, frozenset[int]]:
        return {self.topic_name(topic): parts for topic, parts in assignment.items() if parts}

    def member_for_instance(self, instance_id: str) -> Member | None:
        member_id = self.static_members.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    def is_vacant(self) -> bool:
        """No record of the group is left: it is DEAD."""
        return not (
            self.members
            or self.target
            or self.has_group_epoch
            or self.has_partition_metadata
            or self.has_target_epoch
            or self.config is not None
            or self.empty_since_ms is not None
        )

    def derive_state(self) -> group_state.GroupState:
        if self.is_vacant():
            return group_state.GroupState.DEAD
        if not self.members:
            return group_state.GroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return group_state.GroupState.ASSIGNING
        if self.unreconciled:
            return group_state.GroupState.RECONCILING
        if self.settings.assignment_paused:
            return group_state.GroupState.PAUSED
        return group_state.GroupState.STABLE

    # -----------------------------------------------------------------------------------
    # Replay: the only mutation

    def apply(self, record: schema.Record, *, strict: bool) -> None:
        """Replay one record of this group; ``strict`` checks the transition tables."""
        key, value = record.key, record.value
        event = type(key).__name__ + (" tombstone" if value is None else "")
        if isinstance(key, schema.ConsumerGroupMetadataKey):
            self._apply_group_epoch(value)
        elif isinstance(key, schema.ConsumerGroupPartitionMetadataKey):
            self._apply_partition_metadata(value)
        elif isinstance(key, schema.ConsumerGroupMemberMetadataKey):
            self._apply_subscription(key.member_id, value)
        elif isinstance(key, schema.ConsumerGroupTargetAssignmentMemberKey):
            self._apply_target_member(key.member_id, value)
        elif isinstance(key, schema.ConsumerGroupTargetAssignmentMetadataKey):
            self._apply_target_epoch(value)
        elif isinstance(key, schema.ConsumerGroupCurrentMemberAssignmentKey):
            self._apply_current_assignment(key.member_id, value, strict=strict, event=event)
        elif isinstance(key, schema.GroupConfigKey):
            self._apply_config(value)
        elif isinstance(key, schema.GroupLifecycleKey):
            self._apply_lifecycle(value)
        else:
            raise errors.InconsistentState(f"not a consumer-group record: {event}")
        next_state = self.derive_state()
        if strict:
            group_state.check_group_transition(self.group_id, self.state, next_state, event)
        self.state = next_state

    def _apply_group_epoch(self, value: schema.RecordValue | None) -> None:
        if value is None:
            self.group_epoch, self.has_group_epoch = 0, False
            return
        assert isinstance(value, schema.ConsumerGroupMetadataValue)
        self.group_epoch, self.has_group_epoch = value.epoch, True

    def _apply_partition_metadata(self, value: schema.RecordValue | None) -> None:
        if value is None:
            self.topics, self.topic_ids_by_name = {}, {}
            self.has_partition_metadata = False
            return
        assert isinstance(value, schema.ConsumerGroupPartitionMetadataValue)
        self.topics = {topic.topic_id: topic for topic in value.topics}
        self.topic_ids_by_name = {topic.topic_name: topic.topic_id for topic in value.topics}
        self.has_partition_metadata = True

    def _apply_subscription(self, member_id: str, value: schema.RecordValue | None) -> None:
        if value is None:
            self._remove_member(member_id)
            return
        assert isinstance(value, schema.ConsumerGroupMemberMetadataValue)
        member = self._member(member_id)
        if member.instance_id != value.instance_id:
            self._unmap_instance(member)
        self.subscribed_topics.subtract(member.subscribed_topic_names)
        member.instance_id = value.instance_id
        member.rack_id = value.rack_id
        member.client_id = value.client_id
        member.client_host = value.client_host
        member.subscribed_topic_names = value.subscribed_topic_names
        member.rebalance_timeout_ms = value.rebalance_timeout_ms
        member.server_assignor = value.server_assignor
        member.has_subscription = True
        member.subscription_record = value
        self.subscribed_topics.update(member.subscribed_topic_names)
        self.subscribed_topics += Counter()  # drops zero counts
        if member.instance_id is not None:
            # A replacement writes the new member before tombstoning the old one.
            self.static_members[member.instance_id] = member_id

    def _apply_target_member(self, member_id: str, value: schema.RecordValue | None) -> None:
        if value is None:
            self.target.pop(member_id, None)
            return
        assert isinstance(value, schema.ConsumerGroupTargetAssignmentMemberValue)
        self.target[member_id] = coordinator_records.from_topic_partitions(value.topic_partitions)

    def _apply_target_epoch(self, value: schema.RecordValue | None) -> None:
        if value is None:
            self.assignment_epoch, self.has_target_epoch = 0, False
        else:
            assert isinstance(value, schema.ConsumerGroupTargetAssignmentMetadataValue)
            self.assignment_epoch, self.has_target_epoch = value.assignment_epoch, True
        # Every member's "reconciled" flag depends on the target epoch: a rebalance-time scan.
        self.unreconciled = {
            member_id for member_id, member in self.members.items() if self._is_unreconciled(member)
        }

    def _apply_current_assignment(
        self, member_id: str, value: schema.RecordValue | None, *, strict: bool, event: str
    ) -> None:
        if value is None:
            member = self.members.get(member_id)
            if member is None:
                return
            # Kafka resets the member rather than removing it: the subscription record
            # (tombstoned next) is what makes a member exist.
            self._release(member)
            member.member_epoch = member.previous_member_epoch = 0
            member.state = group_state.MemberState.STABLE
            member.assigned, member.pending_revocation = {}, {}
            member.has_current_assignment = False
            self._track_reconciled(member)
            return
        assert isinstance(value, schema.ConsumerGroupCurrentMemberAssignmentValue)
        member = self._member(member_id)
        next_state = group_state.member_state_from_id(value.state)
        if strict and member.has_current_assignment:
            group_state.check_member_transition(member_id, member.state, next_state, event)
        self._release(member)
        member.member_epoch = value.member_epoch
        member.previous_member_epoch = value.previous_member_epoch
        member.state = next_state
        member.assigned = coordinator_records.from_topic_partitions(value.assigned_partitions)
        member.pending_revocation = coordinator_records.from_topic_partitions(
            value.partitions_pending_revocation
        )
        member.has_current_assignment = True
        self._claim(member)
        self._track_reconciled(member)

    def _apply_config(self, value: schema.RecordValue | None) -> None:
        assert value is None or isinstance(value, schema.GroupConfigValue)
        self.config = value

    def _apply_lifecycle(self, value: schema.RecordValue | None) -> None:
        assert value is None or isinstance(value, schema.GroupLifecycleValue)
        self.empty_since_ms = None if value is None else value.empty_since_ms

    # -----------------------------------------------------------------------------------
    # Index maintenance

    def _member(self, member_id: str) -> Member:
        member = self.members.get(member_id)
        if member is None:
            # Records of a member may arrive in any order while loading; any creates it.
            member = self.members[member_id] = Member(member_id)
            self._track_reconciled(member)
        return member

    def _remove_member(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is None:
            return
        self._release(member)
        self._unmap_instance(member)
        self.subscribed_topics.subtract(member.subscribed_topic_names)
        self.subscribed_topics += Counter()
        self.unreconciled.discard(member_id)

    def _unmap_instance(self, member: Member) -> None:
        instance_id = member.instance_id
        if instance_id is not None and self.static_members.get(instance_id) == member.member_id:
            del self.static_members[instance_id]

    def _release(self, member: Member) -> None:
        owners = self.owners
        for partition in member.owned_partitions():
            if owners.get(partition) == member.member_id:
                del owners[partition]

    def _claim(self, member: Member) -> None:
        owners = self.owners
        for partition in member.owned_partitions():
            owner = owners.get(partition)
            if owner is not None and owner != member.member_id:
                topic_id, index = partition
                raise errors.InconsistentState(
                    f"group {self.group_id!r}: partition {self.topic_name(topic_id)}-{index} "
                    f"given to {member.member_id!r} while {owner!r} still owns it"
                )
            owners[partition] = member.member_id

    def _is_unreconciled(self, member: Member) -> bool:
        return (
            member.member_epoch != self.assignment_epoch
            or member.state is not group_state.MemberState.STABLE
        )

    def _track_reconciled(self, member: Member) -> None:
        if self._is_unreconciled(member):
            self.unreconciled.add(member.member_id)
        else:
            self.unreconciled.discard(member.member_id)
