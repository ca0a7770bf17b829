"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup onto the coordinator's classic handlers.

The coordinator decides which group a member joins (``coordinator.shard``):

* a consumer group (``spec.assignment: Server``, or consumer-protocol members present), as in
  Kafka 4 (``GroupMetadataManager.classicGroupJoinToConsumerGroup``): the coordinator
  assigns, the JoinGroup response names no leader and lists no members, and SyncGroup
  answers each member its own share as a ``ConsumerProtocolAssignment`` (whatever
  assignments a client sends are ignored);
* a classic group (Kafka's ``ClassicGroup``): the JoinGroup response names the leader, and
  the leader's lists every member's metadata; the leader's SyncGroup assignments are stored
  and each member's bytes relayed to it as they are. Such JoinGroup and SyncGroup requests
  may wait at the group's barriers (the runtime parks them).

The subscription inside a ``consumer`` JoinGroup's protocol metadata is a
``ConsumerProtocolSubscription``, read as leniently as Kafka reads it (``consumer_protocol``:
missing trailing fields take their defaults, a newer version reads as the newest). Only a
consumer group reads it: metadata that is not one is relayed by a classic group as it is,
and refused by a consumer group.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.protocol import consumer_protocol, dispatch, groups
from kafka_group_records import records as schema

# JoinGroup v4+ (KIP-394): a dynamic member without an id is sent back for one.
_MEMBER_ID_REQUIRED_VERSION = 4
# JoinGroup v9+ (KIP-814): a returning static leader may be told to skip its assignment.
_SKIP_ASSIGNMENT_VERSION = 9
# LeaveGroup v3+ (KIP-345): a batch of members, by member id or instance id.
_BATCH_LEAVE_VERSION = 3


def decode_subscription(metadata: bytes) -> Any:
    """The kio ``ConsumerProtocolSubscription`` in a JoinGroup protocol's metadata;
    ``InconsistentGroupProtocol`` (Kafka's answer to a malformed one) without a topic list."""
    try:
        return consumer_protocol.read_subscription(metadata)
    except consumer_protocol.MalformedMetadata as error:
        raise errors.InconsistentGroupProtocol(
            f"the protocol metadata is not a ConsumerProtocolSubscription: {error}"
        ) from None


def _milliseconds(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


async def join_group(ctx: dispatch.RequestContext, request: Any) -> Any:
    try:
        ctx.authorize(request.group_id)
        protocols = tuple(
            schema.ClassicProtocol(protocol.name, protocol.metadata)
            for protocol in request.protocols
        )
        topics: tuple[str, ...] = ()
        owned: dict[str, frozenset[int]] = {}
        rack_id: str | None = None
        readable = True
        subscription: Any = None
        if protocols and request.protocol_type == messages.CLASSIC_PROTOCOL_TYPE:
            # Every protocol of a consumer carries the same subscription (Kafka reads one).
            try:
                subscription = decode_subscription(protocols[0].metadata)
            except errors.InconsistentGroupProtocol:
                # A classic group relays it unread; a consumer group refuses it.
                readable = False
        if subscription is not None:
            topics = tuple(subscription.topics)
            for entry in getattr(subscription, "owned_partitions", ()):
                owned[entry.topic] = owned.get(entry.topic, frozenset()) | frozenset(
                    entry.partitions
                )
            rack_id = getattr(subscription, "rack_id", None)
        session_timeout_ms = _milliseconds(request.session_timeout)
        # v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance = getattr(request, "rebalance_timeout", None)
        rebalance_timeout_ms = session_timeout_ms if rebalance is None else _milliseconds(rebalance)
        joined = await ctx.coordinator.classic_join(
            messages.ClassicJoinRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                instance_id=getattr(request, "group_instance_id", None),
                protocol_type=request.protocol_type,
                protocols=protocols,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                subscribed_topic_names=topics,
                owned_partitions=owned,
                rack_id=rack_id,
                require_known_member_id=ctx.api_version >= _MEMBER_ID_REQUIRED_VERSION,
                client_id=ctx.header.client_id or "",
                client_host=ctx.session.client_host,
                supports_skip_assignment=ctx.api_version >= _SKIP_ASSIGNMENT_VERSION,
                subscription_readable=readable,
            )
        )
    except errors.CoordinatorError as error:
        member_id = error.member_id if isinstance(error, errors.MemberIdRequired) else ""
        return ctx.response(
            error_code=dispatch.error_code(error),
            generation_id=-1,
            protocol_type=None,
            protocol_name=None if ctx.api_version >= 7 else "",
            leader="",
            skip_assignment=False,
            member_id=member_id or request.member_id,
            members=(),
        )
    return ctx.response(
        error_code=ErrorCode.none,
        generation_id=joined.generation_id,
        protocol_type=joined.protocol_type,
        protocol_name=(
            joined.protocol_name if joined.protocol_name is not None or ctx.api_version >= 7 else ""
        ),
        # "" when the coordinator assigns (a consumer group: Kafka leaves it empty too).
        leader=joined.leader,
        skip_assignment=joined.skip_assignment,
        member_id=joined.member_id,
        members=tuple(
            ctx.nested(
                "JoinGroupResponseMember",
                member_id=member.member_id,
                group_instance_id=member.instance_id,
                metadata=member.metadata,
            )
            for member in joined.members
        ),
    )


async def sync_group(ctx: dispatch.RequestContext, request: Any) -> Any:
    try:
        ctx.authorize(request.group_id)
        synced = await ctx.coordinator.classic_sync(
            messages.ClassicSyncRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                instance_id=getattr(request, "group_instance_id", None),
                protocol_type=getattr(request, "protocol_type", None),
                protocol_name=getattr(request, "protocol_name", None),
                assignments=tuple(
                    (entry.member_id, entry.assignment) for entry in request.assignments
                ),
            )
        )
    except errors.CoordinatorError as error:
        return ctx.response(
            error_code=dispatch.error_code(error),
            protocol_type=None,
            protocol_name=None,
            assignment=b"",
        )
    return ctx.response(
        error_code=ErrorCode.none,
        protocol_type=synced.protocol_type,
        protocol_name=synced.protocol_name,
        # A classic group relays the leader's bytes; a consumer group's are encoded here.
        assignment=(
            synced.raw_assignment
            if synced.raw_assignment is not None
            else groups.assignment_bytes(synced.assignment)
        ),
    )


async def heartbeat(ctx: dispatch.RequestContext, request: Any) -> Any:
    try:
        ctx.authorize(request.group_id)
        beat = await ctx.coordinator.classic_heartbeat(
            messages.ClassicHeartbeatRequest(
                group_id=request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                instance_id=getattr(request, "group_instance_id", None),
            )
        )
    except errors.CoordinatorError as error:
        return ctx.response(error_code=dispatch.error_code(error))
    if beat.rebalance_in_progress:
        return ctx.response(error_code=ErrorCode(errors.RebalanceInProgress.code))
    return ctx.response(error_code=ErrorCode.none)


async def leave_group(ctx: dispatch.RequestContext, request: Any) -> Any:
    batch = ctx.api_version >= _BATCH_LEAVE_VERSION
    if batch:
        leaving = tuple(
            messages.ClassicLeavingMember(member.member_id, member.group_instance_id)
            for member in request.members
        )
    else:
        leaving = (messages.ClassicLeavingMember(request.member_id),)
    try:
        ctx.authorize(request.group_id)
        left = await ctx.coordinator.classic_leave(
            messages.ClassicLeaveRequest(request.group_id, leaving)
        )
    except errors.CoordinatorError as error:
        return ctx.response(error_code=dispatch.error_code(error), members=())
    codes = [ErrorCode(0 if name is None else errors.BY_NAME[name].code) for name in left.errors]
    if not batch:
        return ctx.response(error_code=codes[0])
    members = tuple(
        ctx.nested(
            "MemberResponse",
            member_id=member.member_id,
            group_instance_id=member.instance_id,
            error_code=code,
        )
        for member, code in zip(leaving, codes, strict=True)
    )
    return ctx.response(error_code=ErrorCode.none, members=members)
