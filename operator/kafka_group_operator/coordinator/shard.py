"""One coordinator shard: the groups of one state-topic partition (``GroupCoordinatorShard``).

Sans-IO. The runtime calls a write handler, appends the returned records to the state topic,
waits for the acknowledgement, feeds each record to ``replay`` and only then answers the
caller. Loading at start-up is the same ``replay`` over the topic, followed by
``on_loaded``. Timers are the runtime's job too: it asks ``next_deadline_ms`` and calls
``on_timer``.

This module routes: membership requests to ``membership``; classic-protocol ones to
``classic`` (members of a consumer group, the coordinator assigns) or ``classic_rebalance``
(classic groups, the leader assigns), as Kafka's ``GroupMetadataManager`` routes them by the
group's type; offsets to ``offsets``, and each replayed record to the aggregate its key type
names. A group id is a consumer group or a classic group, never both; a classic group of a
ConsumerGroup resource keeps the resource's GroupConfig record in a consumer-group aggregate
with nothing else (the config alone). Which one a classic JoinGroup makes (Kafka 4's rules,
with the resource's say):

* a classic group exists: it joins it;
* a consumer group with members exists: it joins that (Kafka's classic member of a consumer
  group), and so does it when the group's resource asks for server-side assignment
  (``spec.assignment: Server``, the default);
* otherwise (no group, an empty consumer group, ``spec.assignment: Client``): a classic
  group, replacing the empty consumer group's records (its resource's config stays).

A KIP-848 member joining a classic group converts it (``migration``) when
``group.consumer.migration.policy`` allows it; the last KIP-848 member leaving a consumer
group of classic members converts it back, unless its resource asks for server-side
assignment.

Classic groups also replay soft records (``replay_soft``), the state Kafka keeps in memory
only; see ``classic_group``. Transition tables are enforced on live
replay only (after ``on_loaded``); while loading, compacted records may arrive in an order
that passes through meaningless intermediate states. Timers too are live-replay business:
a loading replay arms none (most of a state topic is offset commits, and re-arming a
group's retention deadline on each cost most of the load), and ``on_loaded`` arms every
timer once from the loaded state, exactly as live replay would have left them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kafka_group_operator import assignors as assignor_registry
from kafka_group_operator.assignors import api as assignor_api
from kafka_group_operator.coordinator import (
    classic,
    classic_group,
    classic_rebalance,
    consumer_protocol,
    errors,
    group,
    group_state,
    membership,
    messages,
    migration,
    offsets,
    result,
    timers,
)
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import records as coordinator_records
from kafka_group_records import records as schema

_CLASSIC_TIMERS = frozenset(
    {
        timers.TimerKind.CLASSIC_HEARTBEAT,
        timers.TimerKind.CLASSIC_JOIN,
        timers.TimerKind.CLASSIC_SYNC,
    }
)

_MEMBER_KEYS = (
    schema.ConsumerGroupMemberMetadataKey,
    schema.ConsumerGroupTargetAssignmentMemberKey,
    schema.ConsumerGroupCurrentMemberAssignmentKey,
)

# The records of a group with members that can move its retention deadline: subscriptions
# decide which topics' offsets may expire, the configuration holds the retention.
_RETENTION_KEYS = (schema.ConsumerGroupMemberMetadataKey, schema.GroupConfigKey)

# How a static member that left with epoch -2 is described: it holds its partitions for the
# session timeout but consumes nothing, so it must not look STABLE (ready) to the operator.
LEFT_TEMPORARILY = "LEFT_TEMPORARILY"


def _server_assigned(existing: group.ConsumerGroup) -> bool:
    """Whether the group's resource asks the coordinator to assign (``spec.assignment:
    Server``); a group without a resource follows what its members speak."""
    return existing.config is not None and not existing.config.client_assignment


def _describe_classic(existing: classic_group.ClassicGroup) -> messages.GroupDescription:
    """Kafka's DescribeGroups of a classic group: metadata only when Stable; for the
    ``consumer`` protocol, each member's topics and partitions as far as they can be read."""
    stable = existing.state is group_state.ClassicGroupState.STABLE
    consumer = existing.uses_consumer_protocol()
    members = []
    for member in existing.members.values():
        topics: tuple[str, ...] = ()
        assignment: dict[str, frozenset[int]] = {}
        if consumer:
            with contextlib.suppress(consumer_protocol.MalformedConsumerProtocol):
                topics = tuple(
                    sorted(
                        consumer_protocol.decode_subscription(member.protocols[0].metadata).topics
                    )
                )
            if member.assignment:
                with contextlib.suppress(consumer_protocol.MalformedConsumerProtocol):
                    assignment = consumer_protocol.decode_assignment(member.assignment)
        members.append(
            messages.MemberDescription(
                member_id=member.member_id,
                instance_id=member.instance_id,
                rack_id=None,
                member_epoch=existing.generation,
                state="STABLE" if stable else existing.state.name,
                subscribed_topic_names=topics,
                assignment=assignment,
                target_assignment=assignment,
                partitions_pending_revocation={},
                client_id=member.client_id,
                client_host=member.client_host,
                classic=True,
                metadata=member.metadata(existing.protocol_name) if stable else None,
                raw_assignment=member.assignment,
            )
        )
    return messages.GroupDescription(
        group_id=existing.group_id,
        state=existing.state.value,
        group_epoch=existing.generation,
        assignment_epoch=existing.generation,
        assignor=(existing.protocol_name or "") if stable else "",
        members=tuple(members),
        group_type="classic",
        protocol_type=existing.protocol_type or "",
    )


def _described_state(member: group.Member) -> str:
    if member.member_epoch == messages.STATIC_LEAVE_EPOCH:
        return LEFT_TEMPORARILY
    return member.state.name


class CoordinatorShard:
    def __init__(
        self,
        assignors: Mapping[str, assignor_api.PartitionAssignor] | None = None,
        settings: coordinator_config.CoordinatorConfig = coordinator_config.DEFAULT,
    ) -> None:
        self._settings = settings
        self._groups: dict[str, group.ConsumerGroup] = {}
        self._classic_groups: dict[str, classic_group.ClassicGroup] = {}
        self._offsets = offsets.OffsetStore()
        # group id -> the resource owning it; apart from ``_groups`` because it outlives
        # the group's expiry.
        self._owners: dict[str, messages.GroupOwner] = {}
        self._deadlines = timers.Deadlines()
        self._membership = membership.Membership(
            self._groups,
            assignors if assignors is not None else assignor_registry.ASSIGNORS,
            self._deadlines,
        )
        self._classic = classic.ClassicMembership(self._groups, self._membership, self._deadlines)
        self._rebalance = classic_rebalance.ClassicRebalance(
            self._classic_groups, self._deadlines, settings
        )
        self._loading = True

    # -----------------------------------------------------------------------------------
    # Write handlers: validate, return records; never mutate hard state

    def heartbeat(
        self, request: messages.HeartbeatRequest, now_ms: int
    ) -> result.Result[messages.HeartbeatResponse]:
        classic_existing = self._classic_groups.get(request.group_id)
        if classic_existing is not None:
            return self._heartbeat_to_classic_group(classic_existing, request, now_ms)
        outcome = self._membership.heartbeat(request, now_ms)
        existing = self._groups.get(request.group_id)
        if (
            request.member_epoch == messages.LEAVE_EPOCH
            and existing is not None
            and migration.can_downgrade(existing, (request.member_id,), self._settings)
        ):
            # The last consumer-protocol member leaves: its classic members become a
            # classic group (Kafka's consumerGroupFenceMember).
            records, soft = migration.downgrade(
                existing, (request.member_id,), self._rebalance, now_ms
            )
            return result.Result(outcome.response, records, soft)
        return outcome

    def _heartbeat_to_classic_group(
        self,
        existing: classic_group.ClassicGroup,
        request: messages.HeartbeatRequest,
        now_ms: int,
    ) -> result.Result[messages.HeartbeatResponse]:
        """A KIP-848 member and a classic group (Kafka's getOrMaybeCreateConsumerGroup): an
        empty one is replaced, a non-empty one converted when the policy allows."""
        group_id = request.group_id
        if request.member_epoch != messages.JOIN_EPOCH:
            raise errors.GroupIdNotFound(f"Group {group_id} is not a consumer group.")
        if existing.state is group_state.ClassicGroupState.EMPTY:
            preceding = [coordinator_records.new_group_metadata_tombstone(group_id)]
            completions: list[result.Completion] = []
        elif migration.can_upgrade(existing, self._settings):
            feed = self._membership.topic_feed or {}
            preceding = migration.upgrade_records(existing, feed)
            completions = migration.fail_parked(
                existing,
                errors.RebalanceInProgress(f"Group {group_id} became a consumer group."),
            )
        else:
            raise errors.GroupIdNotFound(f"Group {group_id} is not a consumer group.")
        # The member's heartbeat, on the group those records leave behind.
        converted = group.ConsumerGroup(group_id)
        holder = self._groups.get(group_id)
        if holder is not None and holder.config is not None:
            converted.apply(
                coordinator_records.new_group_config_record(group_id, holder.config),
                strict=False,
            )
        for record in preceding:
            if not isinstance(record.key, schema.GroupMetadataKey):
                converted.apply(record, strict=False)
        joined = self._membership.on(collections.ChainMap({group_id: converted}, self._groups))
        outcome = joined.heartbeat(request, now_ms)
        if completions:
            migration.arm_sessions(existing, self._deadlines, now_ms)
        return result.Result(
            outcome.response, [*preceding, *outcome.records], outcome.soft, completions
        )

    def classic_join(self, request: messages.ClassicJoinRequest, now_ms: int) -> result.Result[Any]:
        """A JoinGroup; its response may be ``result.Deferred`` (parked) or ``result.Failed``."""
        classic.validate_join(request, self._settings)
        group_id = request.group_id
        if group_id in self._classic_groups:
            return self._rebalance.join(request, now_ms)
        existing = self._groups.get(group_id)
        if existing is not None and (existing.members or _server_assigned(existing)):
            return self._classic.join(request, now_ms)
        # Kafka's maybeDeleteEmptyConsumerGroup; a resource's config stays.
        preceding = (
            membership.group_tombstones(existing, keep_config=True) if existing is not None else []
        )
        return self._rebalance.join(request, now_ms, preceding)

    def classic_sync(self, request: messages.ClassicSyncRequest, now_ms: int) -> result.Result[Any]:
        if request.group_id in self._classic_groups:
            return self._rebalance.sync(request, now_ms)
        return self._classic.sync(request, now_ms)

    def classic_heartbeat(
        self, request: messages.ClassicHeartbeatRequest, now_ms: int
    ) -> result.Result[messages.ClassicHeartbeatResponse]:
        if request.group_id in self._classic_groups:
            return self._rebalance.heartbeat(request, now_ms)
        return self._classic.heartbeat(request, now_ms)

    def classic_leave(
        self, request: messages.ClassicLeaveRequest, now_ms: int
    ) -> result.Result[messages.ClassicLeaveResponse]:
        if not request.group_id:
            raise errors.InvalidGroupId("GroupId can't be empty.")
        if request.group_id in self._classic_groups:
            return self._rebalance.leave(request, now_ms)
        return self._classic.leave(request, now_ms)

    def commit_offsets(
        self, request: messages.OffsetCommitRequest, now_ms: int
    ) -> result.Result[messages.OffsetCommitResponse]:
        classic_group_ = self._classic_groups.get(request.group_id)
        if classic_group_ is not None:
            return offsets.commit_classic_offsets(classic_group_, request, now_ms)
        return offsets.commit_offsets(
            self._offsets, self._groups.get(request.group_id), request, now_ms
        )

    def delete_offsets(
        self, request: messages.OffsetDeleteRequest, now_ms: int
    ) -> result.Result[messages.OffsetDeleteResponse]:
        classic_group_ = self._classic_groups.get(request.group_id)
        if classic_group_ is not None:
            return offsets.delete_classic_offsets(self._offsets, classic_group_, request)
        return offsets.delete_offsets(self._offsets, self._groups.get(request.group_id), request)

    def configure_group(self, settings: messages.GroupSettings, now_ms: int) -> result.Result[None]:
        return self._membership.configure_group(settings, now_ms)

    def remove_members(
        self, request: messages.RemoveMembersRequest, now_ms: int
    ) -> result.Result[dict[str, str | None]]:
        if request.group_id in self._classic_groups:
            # A classic group: Kafka's admin removal, a LeaveGroup by instance id alone.
            leave = messages.ClassicLeaveRequest(
                request.group_id,
                tuple(messages.ClassicLeavingMember("", i) for i in request.instance_ids),
            )
            left = self._rebalance.leave(leave, now_ms)
            outcome = dict(zip(request.instance_ids, left.response.errors, strict=True))
            return result.Result(outcome, left.records, left.soft, left.completions)
        return self._membership.remove_members(request, now_ms)

    def update_topics(
        self, topics: Mapping[str, messages.TopicInfo], now_ms: int
    ) -> result.Result[None]:
        return self._membership.update_topics(topics, now_ms)

    def claim_group(
        self, request: messages.ClaimGroupRequest, now_ms: int
    ) -> result.Result[messages.GroupOwner]:
        """The owner of the group id after the claim: the claimant, unless another owns it."""
        current = self._owners.get(request.group_id)
        if current is not None and (current.uid != request.owner.uid or current == request.owner):
            return result.Result(current, [])
        owner = request.owner
        value = schema.GroupOwnerValue(owner.namespace, owner.name, owner.uid)
        return result.Result(owner, [schema.Record(schema.GroupOwnerKey(request.group_id), value)])

    def release_group(
        self, request: messages.ReleaseGroupRequest, now_ms: int
    ) -> result.Result[bool]:
        """Whether the group id was released (False: another resource owns it, or none)."""
        current = self._owners.get(request.group_id)
        if current is None or current.uid != request.owner_uid:
            return result.Result(False, [])
        return result.Result(True, [schema.Record(schema.GroupOwnerKey(request.group_id), None)])

    def delete_group(
        self, request: messages.DeleteGroupRequest, now_ms: int
    ) -> result.Result[None]:
        group_id = request.group_id
        if request.owner_uid is not None:
            owner = self._owners.get(group_id)
            if owner is None or owner.uid != request.owner_uid:
                raise errors.GroupAuthorizationFailed(
                    f"Group {group_id} is not owned by the resource deleting it."
                )
        existing = self._groups.get(group_id)
        classic_existing = self._classic_groups.get(group_id)
        if (
            existing is None
            and classic_existing is None
            and not self._offsets.has_offsets(group_id)
        ):
            raise errors.GroupIdNotFound(f"Group {group_id} does not exist.")
        if existing is not None and existing.members and not request.force:
            raise errors.NonEmptyGroup(f"Group {group_id} still has members.")
        if (
            classic_existing is not None
            and classic_existing.state is not group_state.ClassicGroupState.EMPTY
            and not request.force
        ):
            raise errors.NonEmptyGroup(f"Group {group_id} still has members.")
        records = offsets.offset_tombstones(self._offsets, group_id)
        soft: list[result.SoftRecord] = []
        completions: list[result.Completion] = []
        if classic_existing is not None:
            records.append(coordinator_records.new_group_metadata_tombstone(group_id))
            completions = migration.fail_parked(
                classic_existing, errors.CoordinatorNotAvailable(f"Group {group_id} was deleted.")
            )
        if existing is not None:
            records.extend(membership.group_tombstones(existing, keep_config=False))
        return result.Result(None, records, soft, completions)

    def on_timer(self, now_ms: int) -> result.Result[None]:
        """Fence members whose session, rebalance or sync timeout passed; expire idle groups."""
        fenced: dict[str, list[str]] = {}
        records: list[schema.Record] = []
        soft: list[result.SoftRecord] = []
        completions: list[result.Completion] = []
        # A classic group takes one timer per call: each works on the group its replay
        # left, so the next of the same group waits for the next call (they stay due).
        classic_handled: set[str] = set()
        for key, armed in self._deadlines.due(now_ms):
            if key.kind in _CLASSIC_TIMERS:
                if key.group_id in classic_handled:
                    continue
                classic_handled.add(key.group_id)
                self._deadlines.cancel(key)
                outcome = self._classic_timer(key, armed, now_ms)
                records.extend(outcome.records)
                soft.extend(outcome.soft)
                completions.extend(outcome.completions)
                continue
            existing = self._groups.get(key.group_id)
            if key.kind is timers.TimerKind.RETENTION and key.group_id in self._classic_groups:
                tombstones = self._expired_classic(key.group_id, now_ms)
                if tombstones:
                    records.extend(tombstones)
                else:
                    self._rearm_retention(key.group_id)
                continue
            if key.kind is timers.TimerKind.RETENTION:
                tombstones, group_expired = offsets.expired(
                    self._offsets, existing, key.group_id, now_ms
                )
                if group_expired and existing is not None:
                    tombstones.extend(membership.group_tombstones(existing, keep_config=True))
                if tombstones:
                    # Stays armed: replaying the tombstones re-arms it (or the write failed
                    # and the next call tries again).
                    records.extend(tombstones)
                else:
                    self._rearm_retention(key.group_id)
                continue
            member = existing.members.get(key.member_id) if existing is not None else None
            expired = member is not None and (
                key.kind in (timers.TimerKind.SESSION, timers.TimerKind.SYNC)
                or (
                    member.state is group_state.MemberState.UNREVOKED_PARTITIONS
                    and member.member_epoch == armed.tag
                )
                or (
                    # A classic member told to join again that did not (its join timeout).
                    existing is not None
                    and classic.classic_metadata(member) is not None
                    and member.member_epoch == armed.tag
                    and member.member_epoch < existing.group_epoch
                )
            )
            if not expired:
                self._deadlines.cancel(key)
                continue
            fenced.setdefault(key.group_id, [])
            if key.member_id not in fenced[key.group_id]:
                fenced[key.group_id].append(key.member_id)
        for group_id, member_ids in fenced.items():
            existing = self._groups[group_id]
            if migration.can_downgrade(existing, member_ids, self._settings):
                converted, converted_soft = migration.downgrade(
                    existing, member_ids, self._rebalance, now_ms
                )
                records.extend(converted)
                soft.extend(converted_soft)
                continue
            records.extend(self._membership.removal_records(existing, member_ids, now_ms))
        return result.Result(None, records, soft, completions)

    def _classic_timer(
        self, key: timers.TimerKey, armed: timers.Armed, now_ms: int
    ) -> result.Result[None]:
        if key.kind is timers.TimerKind.CLASSIC_HEARTBEAT:
            return self._rebalance.expire_heartbeat(key.group_id, key.member_id, now_ms)
        if key.kind is timers.TimerKind.CLASSIC_JOIN:
            return self._rebalance.expire_join(key.group_id, armed.tag, now_ms)
        return self._rebalance.expire_sync(key.group_id, armed.tag, now_ms)

    def _classic_retention_ms(self, group_id: str) -> int:
        # A resource's classic group keeps the resource's settings in a config-only
        # consumer-group aggregate.
        holder = self._groups.get(group_id)
        settings = holder.settings if holder is not None else group.DEFAULT_CONFIG
        return settings.offsets_retention_ms

    def _expired_classic(self, group_id: str, now_ms: int) -> list[schema.Record]:
        """Tombstones of a classic group's offsets expired at ``now_ms``, and of the group
        when it is empty and has no offset left (Kafka's ``maybeDeleteGroup``)."""
        existing = self._classic_groups[group_id]
        deadlines = offsets.classic_deadlines(
            self._offsets, existing, self._classic_retention_ms(group_id)
        )
        due = sorted(partition for partition, deadline in deadlines.items() if deadline <= now_ms)
        records = [
            coordinator_records.new_offset_commit_tombstone(group_id, topic, partition)
            for topic, partition in due
        ]
        gone = len(due) == self._offsets.count(group_id)
        if existing.state is group_state.ClassicGroupState.EMPTY and gone:
            records.append(coordinator_records.new_group_metadata_tombstone(group_id))
        return records

    def next_deadline_ms(self) -> int | None:
        return self._deadlines.next_deadline_ms()

    # -----------------------------------------------------------------------------------
    # Reads

    def fetch_offsets(self, request: messages.OffsetFetchRequest) -> messages.OffsetFetchResponse:
        if request.group_id in self._classic_groups:
            # Classic groups check nobody on a fetch (Kafka's validateOffsetFetch: only
            # a dead group, which is not in memory).
            request = dataclasses.replace(request, member_id=None, member_epoch=None)
            return offsets.fetch_offsets(self._offsets, None, request)
        return offsets.fetch_offsets(self._offsets, self._groups.get(request.group_id), request)

    def describe_group(self, group_id: str, now_ms: int | None = None) -> messages.GroupDescription:
        """The group as it stands; with ``now_ms``, each member's time left before its session
        times out (how long a stopped member that did not leave still holds its place)."""
        classic_existing = self._classic_groups.get(group_id)
        if classic_existing is not None:
            return _describe_classic(classic_existing)
        existing = self._groups.get(group_id)
        if existing is None:
            if not self._offsets.has_offsets(group_id):
                raise errors.GroupIdNotFound(f"Group {group_id} does not exist.")
            existing = group.ConsumerGroup(group_id)
        members = sorted(
            existing.members.values(),
            key=lambda member: (
                member.instance_id is None,
                member.instance_id or "",
                member.member_id,
            ),
        )
        return messages.GroupDescription(
            group_id=group_id,
            state=existing.state.value,
            group_epoch=existing.group_epoch,
            assignment_epoch=existing.assignment_epoch,
            assignor=existing.settings.assignor,
            session_timeout_ms=existing.settings.session_timeout_ms,
            members=tuple(
                messages.MemberDescription(
                    member_id=member.member_id,
                    instance_id=member.instance_id,
                    rack_id=member.rack_id,
                    member_epoch=member.member_epoch,
                    state=_described_state(member),
                    subscribed_topic_names=member.subscribed_topic_names,
                    assignment=existing.by_name(member.assigned),
                    target_assignment=existing.by_name(existing.target.get(member.member_id, {})),
                    partitions_pending_revocation=existing.by_name(member.pending_revocation),
                    client_id=member.client_id,
                    client_host=member.client_host,
                    classic=member.subscription().classic_member_metadata is not None,
                    session_expires_in_ms=self._session_left_ms(group_id, member.member_id, now_ms),
                )
                for member in members
            ),
        )

    def _session_left_ms(self, group_id: str, member_id: str, now_ms: int | None) -> int | None:
        armed = self._deadlines.get(timers.session_key(group_id, member_id))
        if armed is None or now_ms is None:
            return None
        return max(armed.deadline_ms - now_ms, 0)

    def group_state(self, group_id: str) -> str | None:
        """The group's state word (``GroupState``), None for no group: cheap enough for every
        request, unlike ``describe_group``."""
        classic_existing = self._classic_groups.get(group_id)
        if classic_existing is not None:
            return classic_existing.state.value
        existing = self._groups.get(group_id)
        return None if existing is None else existing.state.value

    def group_owner(self, group_id: str) -> messages.GroupOwner | None:
        return self._owners.get(group_id)

    def list_groups(self) -> list[str]:
        return sorted(
            set(self._groups) | set(self._classic_groups) | set(self._offsets.group_ids())
        )

    # -----------------------------------------------------------------------------------
    # Replay: the only state mutation

    def replay(self, record: schema.Record) -> None:
        key = record.key
        if isinstance(key, schema.OffsetCommitKey):
            self._offsets.replay(key, record.value)
            if not self._loading and self._may_expire(key.group, key.topic):
                self._rearm_retention(key.group)
            return
        if isinstance(key, schema.GroupMetadataKey):
            self._replay_group_metadata(key.group, record.value)
            return
        if isinstance(key, schema.LoadMarkerKey):
            return  # the loader's
        if isinstance(key, schema.GroupOwnerKey):
            owner = record.value
            if isinstance(owner, schema.GroupOwnerValue):
                self._owners[key.group_id] = messages.GroupOwner(
                    owner.namespace, owner.name, owner.uid
                )
            else:
                self._owners.pop(key.group_id, None)
            return
        group_id = key.group_id
        existing = self._groups.get(group_id)
        if existing is None:
            if record.value is None:
                return
            existing = self._groups[group_id] = group.ConsumerGroup(group_id)
        existing.apply(record, strict=not self._loading)
        if self._loading:
            # No timer is armed while loading: ``on_loaded`` arms each one once, from the
            # final state, instead of re-arming retention on every record of the log.
            if existing.state is group_state.GroupState.DEAD:
                del self._groups[group_id]
            return
        if (
            isinstance(key, schema.ConsumerGroupMemberMetadataKey)
            and record.value is None
            and key.member_id not in existing.members
        ):
            self._deadlines.cancel(timers.session_key(group_id, key.member_id))
            self._deadlines.cancel(timers.rebalance_key(group_id, key.member_id))
            self._deadlines.cancel(timers.sync_key(group_id, key.member_id))
        if existing.state is group_state.GroupState.DEAD:
            del self._groups[group_id]
        elif existing.members and not isinstance(key, _RETENTION_KEYS):
            # With members, only subscriptions and settings move the retention deadline;
            # reconciliation records (most of them) leave it alone.
            return
        self._rearm_retention(group_id)

    def _replay_group_metadata(self, group_id: str, value: schema.RecordValue | None) -> None:
        """A classic group's record: a tombstone removes the group; a value rebuilds it while
        loading (Kafka's replay). Live, the soft record written with it carries the group's
        state, so a value only creates a group not in memory."""
        if value is None:
            gone = self._classic_groups.pop(group_id, None)
            if gone is not None and not self._loading:
                self._rebalance.cancel_timers(gone)
                self._rearm_retention(group_id)
            return
        assert isinstance(value, schema.GroupMetadataValue)
        if self._loading or group_id not in self._classic_groups:
            self._classic_groups[group_id] = classic_group.ClassicGroup.from_record(group_id, value)
            if not self._loading:
                self._rearm_retention(group_id)

    def replay_soft(self, record: result.SoftRecord) -> None:
        """Replay a soft record (never written, see ``result``): a classic group's next state.

        The transitions the handler's copy took are checked against the table again, from
        the state the group is in here.
        """
        if not isinstance(record, classic_group.ClassicGroupUpdated):
            raise errors.InconsistentState(f"unknown soft record {type(record).__name__}")
        group_id, updated = record.group_id, record.group
        if updated is None:
            self._classic_groups.pop(group_id, None)
            return
        current = self._classic_groups.get(group_id)
        state = current.state if current is not None else group_state.ClassicGroupState.EMPTY
        for before, after in updated.transitions:
            if before is not state:
                raise errors.IllegalStateTransition(
                    "classic group", group_id, state.name, after.name, "soft record"
                )
            group_state.check_classic_transition(group_id, before, after, "soft record")
            state = after
        if state is not updated.state:
            raise errors.IllegalStateTransition(
                "classic group", group_id, state.name, updated.state.name, "soft record"
            )
        updated.transitions = []
        self._classic_groups[group_id] = updated
        self._rearm_retention(group_id)

    def replay_encoded_offset_commits(self, commits: Iterable[offsets.EncodedCommit]) -> None:
        """Replay offset commits kept in their written form (``offsets.EncodedCommit``, see
        ``offsets``): the same state as ``replay`` of each decoded record, in that order."""
        if self._loading:
            self._offsets.replay_encoded(commits)
            return
        for commit in commits:
            self._offsets.replay_encoded((commit,))
            group_id, (topic, _), _ = commit
            if self._may_expire(group_id, topic):
                self._rearm_retention(group_id)

    def _may_expire(self, group_id: str, topic: str) -> bool:
        classic_existing = self._classic_groups.get(group_id)
        if classic_existing is not None:
            return offsets.classic_may_expire(classic_existing, topic)
        return offsets.may_expire_alone(self._groups.get(group_id), topic)

    def on_loaded(self, now_ms: int) -> None:
        """After a load: restart every soft timer from ``now_ms`` and check transitions."""
        self._loading = False
        self._deadlines.clear()
        for existing in self._groups.values():
            settings = existing.settings
            for member in existing.members.values():
                self._deadlines.arm(
                    timers.session_key(existing.group_id, member.member_id),
                    now_ms + membership.session_timeout_ms(member.subscription(), settings),
                )
                if member.state is group_state.MemberState.UNREVOKED_PARTITIONS:
                    self._deadlines.arm(
                        timers.rebalance_key(existing.group_id, member.member_id),
                        now_ms + membership.rebalance_timeout_ms(member.subscription(), settings),
                        member.member_epoch,
                    )
        for classic_existing in self._classic_groups.values():
            # Kafka's onLoaded: every loaded member's session starts now.
            self._rebalance.arm_heartbeats(classic_existing, now_ms)
        for group_id in self.list_groups():
            self._rearm_retention(group_id)

    def _rearm_retention(self, group_id: str) -> None:
        classic_existing = self._classic_groups.get(group_id)
        if classic_existing is not None:
            deadline = self._classic_retention_deadline(classic_existing)
        else:
            deadline = offsets.retention_deadline_ms(
                self._offsets, self._groups.get(group_id), group_id
            )
        key = timers.retention_key(group_id)
        if deadline is None:
            self._deadlines.cancel(key)
        else:
            self._deadlines.arm(key, deadline)

    def _classic_retention_deadline(self, existing: classic_group.ClassicGroup) -> int | None:
        group_id = existing.group_id
        deadlines = offsets.classic_deadlines(
            self._offsets, existing, self._classic_retention_ms(group_id)
        )
        deadline = min(deadlines.values(), default=None)
        if (
            deadline is None
            and existing.state is group_state.ClassicGroupState.EMPTY
            and not self._offsets.has_offsets(group_id)
        ):
            # An empty group without offsets goes at Kafka's next offsets cleanup, at most
            # offsets.retention.check.interval.ms after it became empty (a member told
            # MEMBER_ID_REQUIRED has that long to come back with its id).
            deadline = (existing.state_timestamp or 0) + offsets.RETENTION_CHECK_INTERVAL_MS
        return deadline

    # -----------------------------------------------------------------------------------
    # Introspection

    def armed_timers(self) -> dict[timers.TimerKey, timers.Armed]:
        """Every armed soft deadline (session, rebalance, retention) by key."""
        return self._deadlines.armed()

    def canonical_state(self) -> dict[str, Any]:
        """Every piece of hard state as plain, ordered data: equal states dump equal."""

        def assignment(value: coordinator_records.TopicIdAssignment) -> list[Any]:
            return [(str(topic), sorted(parts)) for topic, parts in sorted(value.items()) if parts]

        groups: dict[str, Any] = {}
        for group_id, existing in sorted(self._groups.items()):
            groups[group_id] = {
                "state": existing.state.name,
                "group_epoch": existing.group_epoch,
                "assignment_epoch": existing.assignment_epoch,
                "config": existing.config,
                "empty_since_ms": existing.empty_since_ms,
                "topics": sorted(existing.topics.values(), key=lambda t: t.topic_name),
                "target": {m: assignment(t) for m, t in sorted(existing.target.items())},
                "members": {
                    member_id: (
                        member.subscription(),
                        member.member_epoch,
                        member.previous_member_epoch,
                        member.state.name,
                        assignment(member.assigned),
                        assignment(member.pending_revocation),
                    )
                    for member_id, member in sorted(existing.members.items())
                },
                "owners": sorted((str(t), p, m) for (t, p), m in existing.owners.items()),
                "static_members": sorted(existing.static_members.items()),
                "subscribed_topics": sorted(existing.subscribed_topics.items()),
                "unreconciled": sorted(existing.unreconciled),
            }
        classic_groups = {
            group_id: {
                "state": existing.state.name,
                "generation": existing.generation,
                "protocol_type": existing.protocol_type,
                "protocol_name": existing.protocol_name,
                "leader": existing.leader_id,
                "members": [
                    (m.member_id, m.instance_id, m.protocols, m.assignment)
                    for m in existing.members.values()
                ],
            }
            for group_id, existing in sorted(self._classic_groups.items())
        }
        return {
            "groups": groups,
            "classic_groups": classic_groups,
            "owners": dict(sorted(self._owners.items())),
            "offsets": {
                group_id: sorted(self._offsets.committed(group_id).items())
                for group_id in sorted(self._offsets.group_ids())
            },
        }
