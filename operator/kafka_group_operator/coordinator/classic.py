"""Classic-protocol members (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) of a consumer group.

A classic member joins a consumer group (the coordinator assigns) when the group has
consumer-protocol members, or when its ConsumerGroup resource asks for server-side
assignment (``spec.assignment: Server``); otherwise it joins a classic group, where the
leader assigns (``classic_rebalance``). The shard routes.

Kafka 4 serves a consumer that still speaks the classic protocol as a member of the same
consumer group (``GroupMetadataManager.classicGroupJoinToConsumerGroup`` and its sync,
heartbeat and leave twins); so does this module, on top of ``membership``:

* JoinGroup is a KIP-848 join (member epoch 0) carrying what the member reports owning
  (its subscription's owned partitions) and its classic metadata (session timeout and
  supported protocols, kept in the subscription record, so only replay changes state). The
  server-side assignor computes the target; reconciliation decides the member's current
  assignment; the generation it answers is the member epoch.
* SyncGroup hands out the member's current assignment (never what it is still revoking,
  never what another member still owns). It writes nothing. A member that joined has its
  rebalance timeout to sync (Kafka's sync timeout, armed by JoinGroup and cancelled by a
  successful SyncGroup); the shard's timer removes it otherwise, as it removes one whose
  session expired. Like Kafka's, a load does not restore it (the session timeout does).
* Heartbeat writes nothing either; it answers REBALANCE_IN_PROGRESS while the member must
  join again: the group epoch moved past it, it has partitions to revoke (a cooperative
  client revokes what SyncGroup no longer lists, an eager one everything), or partitions it
  waited for were released. From the first such answer the member has its rebalance timeout
  to join again (Kafka's join timeout); the shard's timer removes it otherwise.
* LeaveGroup removes members for good, by member id or by instance id (a batch, v3+).

The protocol vote is Kafka's: the protocol type must be ``consumer`` and the joining member
must share at least one protocol name with every other classic member
(INCONSISTENT_GROUP_PROTOCOL otherwise). A static member (``group.instance.id``) that joins
without a member id replaces the current holder of its instance id at once (KIP-345); the
old member id is fenced (FENCED_INSTANCE_ID).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping

from kafka_group_operator.coordinator import (
    config,
    errors,
    group,
    group_state,
    membership,
    messages,
    result,
    timers,
)
from kafka_group_records import records as schema

MemberState = group_state.MemberState


def validate_join(request: messages.ClassicJoinRequest, settings: config.CoordinatorConfig) -> None:
    """What Kafka checks of every JoinGroup before it looks at the group."""
    if not request.group_id:
        raise errors.InvalidGroupId("GroupId can't be empty.")
    low, high = settings.min_session_timeout_ms, settings.max_session_timeout_ms
    if not low <= request.session_timeout_ms <= high:
        raise errors.InvalidSessionTimeout(
            f"SessionTimeoutMs {request.session_timeout_ms} is outside [{low}, {high}]."
        )
    if request.instance_id == "":
        raise errors.InvalidRequest("GroupInstanceId can't be empty.")


def new_member_id() -> str:
    """A member id as Kafka's ``Uuid.randomUuid().toString()`` prints one."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def classic_metadata(member: group.Member) -> schema.ClassicMemberMetadata | None:
    return member.subscription().classic_member_metadata


class ClassicMembership:
    def __init__(
        self,
        groups: Mapping[str, group.ConsumerGroup],
        members: membership.Membership,
        deadlines: timers.Deadlines,
    ) -> None:
        self._groups = groups
        self._membership = members
        self._deadlines = deadlines

    # -----------------------------------------------------------------------------------
    # JoinGroup

    def join(
        self, request: messages.ClassicJoinRequest, now_ms: int
    ) -> result.Result[messages.ClassicJoinResponse]:
        """``validate_join`` has passed (the shard checks it before routing)."""
        existing = self._groups.get(request.group_id)
        member_id = request.member_id
        self._check_protocols(existing, member_id, request)
        if not member_id:
            member_id = new_member_id()
            if request.instance_id is None and request.require_known_member_id:
                raise errors.MemberIdRequired(member_id)
        else:
            self._check_rejoin(existing, request)
        rebalance_timeout = request.rebalance_timeout_ms
        heartbeat = messages.HeartbeatRequest(
            group_id=request.group_id,
            member_id=member_id,
            member_epoch=messages.JOIN_EPOCH,
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout_ms=rebalance_timeout if rebalance_timeout > 0 else None,
            subscribed_topic_names=request.subscribed_topic_names,
            owned_partitions=request.owned_partitions,
            client_id=request.client_id,
            client_host=request.client_host,
            classic=schema.ClassicMemberMetadata(request.session_timeout_ms, request.protocols),
        )
        joined = self._membership.heartbeat(heartbeat, now_ms)
        # Kafka's scheduleConsumerGroupSyncTimeout: the member's rebalance timeout from this
        # join to its SyncGroup, re-armed by every join.
        settings = existing.settings if existing is not None else group.DEFAULT_CONFIG
        sync_timeout = rebalance_timeout if rebalance_timeout > 0 else settings.rebalance_timeout_ms
        self._deadlines.arm(timers.sync_key(request.group_id, member_id), now_ms + sync_timeout)
        response = messages.ClassicJoinResponse(
            member_id=member_id,
            generation_id=joined.response.member_epoch,
            protocol_name=request.protocols[0].name,
        )
        return result.Result(response, joined.records)

    def _check_protocols(
        self,
        existing: group.ConsumerGroup | None,
        member_id: str,
        request: messages.ClassicJoinRequest,
    ) -> None:
        """Kafka's ``ConsumerGroup.supportsClassicProtocols``."""
        if request.protocol_type == messages.CLASSIC_PROTOCOL_TYPE and not (
            request.subscription_readable
        ):
            raise errors.InconsistentGroupProtocol(
                "The protocol metadata is not a ConsumerProtocolSubscription: a consumer group "
                "reads it."
            )
        if request.protocol_type != messages.CLASSIC_PROTOCOL_TYPE or not request.protocols:
            raise errors.InconsistentGroupProtocol(
                f"Protocol type {request.protocol_type!r} with {len(request.protocols)} "
                f"protocols is not supported: a consumer group takes "
                f"{messages.CLASSIC_PROTOCOL_TYPE!r} with at least one protocol."
            )
        if existing is None:
            return
        names = {protocol.name for protocol in request.protocols}
        replaced = (
            existing.static_members.get(request.instance_id)
            if request.instance_id is not None
            else None
        )
        # One protocol every classic member supports (not only one per pair): the group
        # could otherwise not vote one if it became a classic group.
        common = set(names)
        for other in existing.members.values():
            if other.member_id in (member_id, replaced):
                continue
            metadata = classic_metadata(other)
            if metadata is None:
                continue
            common &= {protocol.name for protocol in metadata.supported_protocols}
            if not common:
                raise errors.InconsistentGroupProtocol(
                    f"Member {member_id or '(new)'} shares no protocol with every classic "
                    f"member of group {request.group_id} (last: {other.member_id})."
                )

    def _check_rejoin(
        self, existing: group.ConsumerGroup | None, request: messages.ClassicJoinRequest
    ) -> None:
        """A static member joining with an id must hold its instance id; a dynamic member
        with an id the group does not know joins under it (Kafka creates it: that is the
        second join after MEMBER_ID_REQUIRED, or a member that was fenced)."""
        if request.instance_id is None:
            known = existing.members.get(request.member_id) if existing is not None else None
            if known is None:
                return
        member = self._validated_member(
            existing, request.group_id, request.member_id, request.instance_id
        )
        if classic_metadata(member) is None:
            raise errors.UnknownMemberId(
                f"Member {member.member_id} uses the consumer protocol, not JoinGroup."
            )

    # -----------------------------------------------------------------------------------
    # SyncGroup and Heartbeat: validation and reads only

    def sync(
        self, request: messages.ClassicSyncRequest, now_ms: int
    ) -> result.Result[messages.ClassicSyncResponse]:
        existing, member, metadata = self._classic_member(
            request.group_id, request.member_id, request.instance_id, request.generation_id
        )
        protocol_name = metadata.supported_protocols[0].name
        if request.protocol_type is not None and (
            request.protocol_type != messages.CLASSIC_PROTOCOL_TYPE
        ):
            raise errors.InconsistentGroupProtocol(
                f"Protocol type {request.protocol_type!r} is not "
                f"{messages.CLASSIC_PROTOCOL_TYPE!r}."
            )
        if request.protocol_name is not None and request.protocol_name != protocol_name:
            raise errors.InconsistentGroupProtocol(
                f"Protocol {request.protocol_name!r} is not the group's {protocol_name!r}."
            )
        # Kafka's throwIfRebalanceInProgress: a member behind the group epoch joins again,
        # unless it is revoking (it keeps its epoch until the revocation is done).
        if (
            existing.group_epoch > member.member_epoch
            and member.state is not MemberState.UNREVOKED_PARTITIONS
        ):
            raise errors.RebalanceInProgress(
                f"Group {request.group_id} is at epoch {existing.group_epoch}; "
                f"member {member.member_id} must join again."
            )
        self._deadlines.cancel(timers.sync_key(existing.group_id, member.member_id))
        self._arm_session(existing, member, metadata, now_ms)
        response = messages.ClassicSyncResponse(
            protocol_type=messages.CLASSIC_PROTOCOL_TYPE,
            protocol_name=protocol_name,
            assignment=existing.by_name(member.assigned),
        )
        return result.Result(response, [])

    def heartbeat(
        self, request: messages.ClassicHeartbeatRequest, now_ms: int
    ) -> result.Result[messages.ClassicHeartbeatResponse]:
        existing, member, metadata = self._classic_member(
            request.group_id, request.member_id, request.instance_id, request.generation_id
        )
        self._arm_session(existing, member, metadata, now_ms)
        rejoin = (
            member.member_epoch < existing.group_epoch
            or member.state is MemberState.UNREVOKED_PARTITIONS
            or (
                member.state is MemberState.UNRELEASED_PARTITIONS
                and self._released_to(existing, member)
            )
        )
        if rejoin:
            self._arm_join_timeout(existing, member, now_ms)
        return result.Result(messages.ClassicHeartbeatResponse(rebalance_in_progress=rejoin), [])

    def _arm_join_timeout(
        self, existing: group.ConsumerGroup, member: group.Member, now_ms: int
    ) -> None:
        """Kafka's ``scheduleConsumerGroupJoinTimeoutIfAbsent``: a member told to join again
        has its rebalance timeout to do so, armed once per member epoch; a member that is
        still behind at that epoch when it fires is removed (``shard.on_timer``)."""
        key = timers.rebalance_key(existing.group_id, member.member_id)
        armed = self._deadlines.get(key)
        if armed is None or armed.tag != member.member_epoch:
            timeout = membership.rebalance_timeout_ms(member.subscription(), existing.settings)
            self._deadlines.arm(key, now_ms + timeout, member.member_epoch)

    @staticmethod
    def _released_to(existing: group.ConsumerGroup, member: group.Member) -> bool:
        """Whether a partition the member waits for is free now (Kafka's
        ``waitingOnUnreleasedPartition`` negated)."""
        target = existing.target.get(member.member_id, {})
        for topic_id, partitions in target.items():
            held = member.assigned.get(topic_id, frozenset())
            for partition in partitions - held:
                if existing.owners.get((topic_id, partition)) is None:
                    return True
        return False

    # -----------------------------------------------------------------------------------
    # LeaveGroup

    def leave(
        self, request: messages.ClassicLeaveRequest, now_ms: int
    ) -> result.Result[messages.ClassicLeaveResponse]:
        if not request.group_id:
            raise errors.InvalidGroupId("GroupId can't be empty.")
        existing = self._groups.get(request.group_id)
        outcome: list[str | None] = []
        leaving: list[str] = []
        for entry in request.members:
            try:
                member = self._leaving_member(existing, request.group_id, entry)
            except errors.CoordinatorError as error:
                outcome.append(error.name)
                continue
            outcome.append(None)
            if member.member_id not in leaving:
                leaving.append(member.member_id)
        records: list[schema.Record] = []
        if leaving:
            assert existing is not None
            records = self._membership.removal_records(existing, leaving, now_ms)
        return result.Result(messages.ClassicLeaveResponse(tuple(outcome)), records)

    def _leaving_member(
        self,
        existing: group.ConsumerGroup | None,
        group_id: str,
        entry: messages.ClassicLeavingMember,
    ) -> group.Member:
        if existing is None:
            raise errors.UnknownMemberId(f"Group {group_id} has no members.")
        if entry.instance_id is None:
            member = existing.members.get(entry.member_id)
            if member is None or not member.has_subscription:
                raise errors.UnknownMemberId(f"Member {entry.member_id} is not in the group.")
        else:
            holder = existing.member_for_instance(entry.instance_id)
            if holder is None:
                raise errors.UnknownMemberId(f"Instance id {entry.instance_id} is unknown.")
            # An empty member id leaves by instance id alone (KIP-345's admin removal).
            if entry.member_id and entry.member_id != holder.member_id:
                raise errors.FencedInstanceId(
                    f"Instance id {entry.instance_id} belongs to member {holder.member_id}."
                )
            member = holder
        if classic_metadata(member) is None:
            raise errors.UnknownMemberId(
                f"Member {member.member_id} uses the consumer protocol, not LeaveGroup."
            )
        return member

    # -----------------------------------------------------------------------------------
    # Helpers

    def _classic_member(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int
    ) -> tuple[group.ConsumerGroup, group.Member, schema.ClassicMemberMetadata]:
        existing = self._groups.get(group_id)
        member = self._validated_member(existing, group_id, member_id, instance_id)
        assert existing is not None
        metadata = classic_metadata(member)
        if metadata is None:
            raise errors.UnknownMemberId(f"Member {member_id} does not use the classic protocol.")
        if generation_id != member.member_epoch:
            raise errors.IllegalGeneration(
                f"Generation {generation_id} is not member {member_id}'s {member.member_epoch}."
            )
        return existing, member, metadata

    @staticmethod
    def _validated_member(
        existing: group.ConsumerGroup | None,
        group_id: str,
        member_id: str,
        instance_id: str | None,
    ) -> group.Member:
        """Kafka's ``validateConsumerGroupMember``: unknown ids and fenced instances."""
        if existing is None:
            raise errors.UnknownMemberId(f"Group {group_id} has no members.")
        if instance_id is not None:
            holder = existing.member_for_instance(instance_id)
            if holder is None:
                raise errors.UnknownMemberId(f"Instance id {instance_id} is unknown.")
            if holder.member_id != member_id:
                raise errors.FencedInstanceId(
                    f"Instance id {instance_id} belongs to member {holder.member_id}."
                )
            return holder
        member = existing.members.get(member_id)
        if member is None or not member.has_subscription:
            raise errors.UnknownMemberId(f"Member {member_id} is not in the group.")
        return member

    def _arm_session(
        self,
        existing: group.ConsumerGroup,
        member: group.Member,
        metadata: schema.ClassicMemberMetadata,
        now_ms: int,
    ) -> None:
        self._deadlines.arm(
            timers.session_key(existing.group_id, member.member_id),
            now_ms + metadata.session_timeout_ms,
        )
