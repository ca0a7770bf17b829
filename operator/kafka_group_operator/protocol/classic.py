"""JoinGroup, SyncGroup, Heartbeat and LeaveGroup: classic consumers as members of a consumer
group, onto the coordinator's classic handlers (``coordinator.classic``).

As in Kafka 4 (``GroupMetadataManager.classicGroupJoinToConsumerGroup``), the coordinator
assigns: the JoinGroup response names no leader and lists no members, so no client runs its
own assignor, and SyncGroup answers each member its own share (whatever assignments a
client sends are ignored). The subscription inside JoinGroup's protocol metadata is a
``ConsumerProtocolSubscription``, read as leniently as Kafka reads it
(``consumer_protocol``: missing trailing fields take their defaults, a newer version reads
as the newest); the assignment goes out as a ``ConsumerProtocolAssignment``.
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
        if protocols and request.protocol_type == messages.CLASSIC_PROTOCOL_TYPE:
            # Every protocol of a consumer carries the same subscription (Kafka reads one).
            subscription = decode_subscription(protocols[0].metadata)
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
        protocol_type=messages.CLASSIC_PROTOCOL_TYPE,
        protocol_name=joined.protocol_name,
        # No leader: the coordinator assigns (Kafka leaves the leader empty here too).
        leader="",
        skip_assignment=False,
        member_id=joined.member_id,
        members=(),
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
        assignment=groups.assignment_bytes(synced.assignment),
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
