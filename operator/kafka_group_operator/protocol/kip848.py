"""ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848), mapped one to one onto the
coordinator's heartbeat and describe: the same epochs, fencing, server-side assignors and
static-membership rules as the member API. The wire speaks topic ids; the coordinator
speaks names: ``dispatch.TopicIds`` translates with the ids the runtime polls.
"""

from __future__ import annotations

import base64
import datetime
import functools
import struct
import uuid
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.protocol import dispatch
from kafka_group_operator.wire import tagged

# ConsumerGroupDescribe v1 member types (Kafka's ConsumerGroupDescribeResponse.json:
# "-1 for unknown. 0 for classic member. +1 for consumer member.").
MEMBER_TYPE_CLASSIC = 0
MEMBER_TYPE_CONSUMER = 1


def new_member_id() -> str:
    """A member id as Kafka's ``Uuid.randomUuid().toString()`` prints one (v0 clients leave
    the member id empty on join and the coordinator chooses it)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@functools.lru_cache(maxsize=64)
def _interval(milliseconds: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=milliseconds))


def _milliseconds(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


def _wire_assignment(
    ctx: dispatch.RequestContext, assignment: messages.Assignment
) -> tuple[Any, ...]:
    ids = ctx.topic_ids()
    entries = []
    for topic, partitions in sorted(assignment.items()):
        topic_id = ids.by_name.get(topic)
        if topic_id is None:
            # The wire cannot name a partition without its topic's id: a member told less
            # than it owns could let two members consume one partition.
            raise errors.CoordinatorNotAvailable(f"the id of topic {topic!r} is not known yet")
        entries.append(
            ctx.nested(
                "TopicPartitions",
                topic_id=topic_id,
                topic_name=topic,
                partitions=tuple(sorted(partitions)),
            )
        )
    return tuple(entries)


def _heartbeat_request(ctx: dispatch.RequestContext, request: Any) -> messages.HeartbeatRequest:
    """The coordinator's request; ``CoordinatorError`` for one it must not be given."""
    ctx.authorize(request.group_id)
    if getattr(request, "subscribed_topic_regex", None):
        raise errors.InvalidRequest("regular-expression subscriptions are not supported")
    member_id = request.member_id
    if not member_id:
        if ctx.api_version >= 1 or request.member_epoch != messages.JOIN_EPOCH:
            raise errors.InvalidRequest("MemberId can't be empty.")
        member_id = new_member_id()
    owned: messages.Assignment | None = None
    if request.topic_partitions is not None:
        by_id = ctx.topic_ids().by_id
        # Ids the coordinator does not know name topics it never assigned.
        owned = {
            by_id[entry.topic_id]: frozenset(entry.partitions)
            for entry in request.topic_partitions
            if entry.topic_id in by_id
        }
    rebalance_timeout_ms = _milliseconds(request.rebalance_timeout)
    subscribed = request.subscribed_topic_names
    return messages.HeartbeatRequest(
        group_id=request.group_id,
        member_id=member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=None if rebalance_timeout_ms < 0 else rebalance_timeout_ms,
        subscribed_topic_names=None if subscribed is None else tuple(subscribed),
        server_assignor=request.server_assignor,
        owned_partitions=owned,
        client_id=ctx.header.client_id or "",
        client_host=ctx.session.client_host,
    )


# A steady heartbeat's answer (no error, the assignment unchanged), encoded by hand: the
# same bytes kio writes for ConsumerGroupHeartbeatResponse v0 and v1 (one layout, flexible:
# Kafka's ConsumerGroupHeartbeatResponse.json), at a tenth of the cost. ThrottleTimeMs 0
# (int32), ErrorCode 0 (int16) and ErrorMessage null (compact nullable string: 0); MemberId (a
# compact string: unsigned varint of its length + 1, then its UTF-8 bytes); MemberEpoch and
# HeartbeatIntervalMs (int32 each); Assignment null (int8 -1); no tagged field (0).
_STEADY_HEAD = bytes(7)
_STEADY_TAIL = b"\xff\x00"
_EPOCH_AND_INTERVAL = struct.Struct(">ii")


def steady_answer(member_id: str, member_epoch: int, heartbeat_interval_ms: int) -> bytes:
    """The encoded body of a heartbeat's answer without error and without assignment."""
    encoded = member_id.encode()
    return b"".join(
        (
            _STEADY_HEAD,
            tagged.encode_uvarint(len(encoded) + 1),
            encoded,
            _EPOCH_AND_INTERVAL.pack(member_epoch, heartbeat_interval_ms),
            _STEADY_TAIL,
        )
    )


def _heartbeat_answer(ctx: dispatch.RequestContext, response: messages.HeartbeatResponse) -> Any:
    if response.assignment is None:
        return steady_answer(
            response.member_id, response.member_epoch, response.heartbeat_interval_ms
        )
    return ctx.response(
        error_code=ErrorCode.none,
        error_message=None,
        member_id=response.member_id,
        member_epoch=response.member_epoch,
        heartbeat_interval=_interval(response.heartbeat_interval_ms),
        assignment=ctx.nested(
            "Assignment", topic_partitions=_wire_assignment(ctx, response.assignment)
        ),
    )


def _heartbeat_error(ctx: dispatch.RequestContext, error: errors.CoordinatorError) -> Any:
    return ctx.response(
        error_code=dispatch.error_code(error),
        error_message=error.message,
        member_id=None,
        member_epoch=0,
        heartbeat_interval=_interval(0),
        assignment=None,
    )


async def consumer_group_heartbeat(ctx: dispatch.RequestContext, request: Any) -> Any:
    try:
        response = await ctx.coordinator.heartbeat(_heartbeat_request(ctx, request))
        return _heartbeat_answer(ctx, response)
    except errors.CoordinatorError as error:
        return _heartbeat_error(ctx, error)


def consumer_group_heartbeat_now(ctx: dispatch.RequestContext, request: Any) -> Any:
    """The answer without waiting (``dispatch.Route.answer_now``), or ``None``: a join or a
    leave always writes, and so does a heartbeat the runtime cannot answer at once."""
    if request.member_epoch <= messages.JOIN_EPOCH:
        return None
    try:
        response = ctx.coordinator.heartbeat_now(_heartbeat_request(ctx, request))
        if response is None:
            return None
        return _heartbeat_answer(ctx, response)
    except errors.CoordinatorError as error:
        return _heartbeat_error(ctx, error)


async def consumer_group_describe(ctx: dispatch.RequestContext, request: Any) -> Any:
    groups = []
    for group_id in request.group_ids:
        try:
            ctx.authorize(group_id)
            described = await ctx.coordinator.describe_group(group_id)
            members = tuple(
                ctx.nested(
                    "Member",
                    member_id=member.member_id,
                    instance_id=member.instance_id,
                    rack_id=member.rack_id,
                    member_epoch=member.member_epoch,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    subscribed_topic_names=member.subscribed_topic_names,
                    subscribed_topic_regex=None,
                    assignment=ctx.nested(
                        "Assignment",
                        topic_partitions=_wire_assignment(ctx, member.assignment),
                    ),
                    target_assignment=ctx.nested(
                        "Assignment",
                        topic_partitions=_wire_assignment(ctx, member.target_assignment),
                    ),
                    member_type=MEMBER_TYPE_CLASSIC if member.classic else MEMBER_TYPE_CONSUMER,
                )
                for member in described.members
            )
            groups.append(
                ctx.nested(
                    "DescribedGroup",
                    error_code=ErrorCode.none,
                    error_message=None,
                    group_id=group_id,
                    group_state=described.state,
                    group_epoch=described.group_epoch,
                    assignment_epoch=described.assignment_epoch,
                    assignor_name=described.assignor,
                    members=members,
                )
            )
        except errors.CoordinatorError as error:
            groups.append(
                ctx.nested(
                    "DescribedGroup",
                    error_code=dispatch.error_code(error),
                    error_message=error.message,
                    group_id=group_id,
                    group_state="Dead",
                    group_epoch=-1,
                    assignment_epoch=-1,
                    assignor_name="",
                    members=(),
                )
            )
    return ctx.response(groups=tuple(groups))
