"""ListGroups, DescribeGroups and DeleteGroups: the admin tools' view of the groups.

A consumer group (the coordinator assigns) is listed with protocol type "consumer" and group
type "consumer"; a classic group (the leader assigns) with its own protocol type and group
type "classic", and described as Kafka describes one: its members' metadata for the group's
protocol only while Stable, and the leader's assignment bytes as they are.

With tokens, a connection lists and describes only the group it authenticated as; other
groups are ``GROUP_AUTHORIZATION_FAILED``. The listener caps how many groups one request
names, answers each once and serves long lists in batches (``listener``); ListGroups, which
goes through every group of the coordinator, lets the event loop run between batches itself.
A group owned by a ConsumerGroup resource is deleted with that resource, not with
DeleteGroups (``GROUP_AUTHORIZATION_FAILED``, naming the resource).
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

from kio.schema.consumer_protocol_assignment.v0.data import (
    ConsumerProtocolAssignment,
)
from kio.schema.consumer_protocol_assignment.v0.data import (
    TopicPartition as AssignedTopicPartition,
)
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.serial import entity_writer
from kio.serial.writers import write_int16
from kio.static.primitive import i16, i32

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.protocol import dispatch


def subscription_bytes(topics: tuple[str, ...]) -> bytes:
    """A member's subscription as classic clients read it (ConsumerProtocolSubscription v0,
    after its int16 version), for DescribeGroups' ``member_metadata``."""
    buffer = io.BytesIO()
    write_int16(buffer, i16(0))
    entity_writer(ConsumerProtocolSubscription)(
        buffer, ConsumerProtocolSubscription(topics=tuple(sorted(topics)), user_data=None)
    )
    return buffer.getvalue()


def assignment_bytes(assignment: messages.Assignment) -> bytes:
    """A member's assignment as ConsumerProtocolAssignment v0 (``member_assignment``)."""
    buffer = io.BytesIO()
    write_int16(buffer, i16(0))
    entity_writer(ConsumerProtocolAssignment)(
        buffer,
        ConsumerProtocolAssignment(
            assigned_partitions=tuple(
                AssignedTopicPartition(
                    topic=TopicName(topic), partitions=tuple(i32(p) for p in sorted(partitions))
                )
                for topic, partitions in sorted(assignment.items())
            ),
            user_data=None,
        ),
    )
    return buffer.getvalue()


def _visible(ctx: dispatch.RequestContext, group_id: str) -> bool:
    try:
        ctx.authorize(group_id)
    except errors.CoordinatorError:
        return False
    return True


async def list_groups(ctx: dispatch.RequestContext, request: Any) -> Any:
    states = {state.lower() for state in getattr(request, "states_filter", ())}
    types = {kind.lower() for kind in getattr(request, "types_filter", ())}
    listed = []
    for count, group_id in enumerate(await ctx.coordinator.list_groups(), 1):
        if count % dispatch.GROUP_BATCH == 0:
            await asyncio.sleep(0)  # every group of the coordinator: let others run
        if not _visible(ctx, group_id):
            continue
        try:
            described = await ctx.coordinator.describe_group(group_id)
        except errors.CoordinatorError:  # deleted or expired since it was listed
            continue
        if states and described.state.lower() not in states:
            continue
        if types and described.group_type not in types:
            continue
        listed.append(
            ctx.nested(
                "ListedGroup",
                group_id=group_id,
                protocol_type=described.protocol_type,
                group_state=described.state,
                group_type=described.group_type,
            )
        )
    return ctx.response(error_code=ErrorCode.none, groups=tuple(listed))


async def describe_groups(ctx: dispatch.RequestContext, request: Any) -> Any:
    described = []
    for group_id in request.groups:
        try:
            ctx.authorize(group_id)
            group = await ctx.coordinator.describe_group(group_id)
        except errors.CoordinatorError as error:
            # Kafka describes an unknown group as Dead with no error before v6.
            unknown = isinstance(error, errors.GroupIdNotFound) and ctx.api_version < 6
            described.append(
                ctx.nested(
                    "DescribedGroup",
                    error_code=ErrorCode.none if unknown else dispatch.error_code(error),
                    error_message=None if unknown else error.message,
                    group_id=group_id,
                    group_state="Dead",
                    protocol_type="",
                    protocol_data="",
                    members=(),
                )
            )
            continue
        classic = group.group_type == "classic"
        members = tuple(
            ctx.nested(
                "DescribedGroupMember",
                member_id=member.member_id,
                group_instance_id=member.instance_id,
                client_id=member.client_id,
                client_host=member.client_host,
                member_metadata=(
                    (member.metadata or b"")
                    if classic
                    else subscription_bytes(member.subscribed_topic_names)
                ),
                member_assignment=(
                    (member.raw_assignment or b"")
                    if classic
                    else assignment_bytes(member.assignment)
                ),
            )
            for member in group.members
        )
        described.append(
            ctx.nested(
                "DescribedGroup",
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=group.state,
                protocol_type=group.protocol_type,
                protocol_data=group.assignor,
                members=members,
            )
        )
    return ctx.response(groups=tuple(described))


async def delete_groups(ctx: dispatch.RequestContext, request: Any) -> Any:
    results = []
    for group_id in request.groups_names:
        try:
            ctx.authorize(group_id)
            owner = await ctx.coordinator.group_owner(group_id)
            if owner is not None:
                # Its settings and lifecycle are the resource's: deleting the group is
                # deleting the resource (its deletionPolicy says what becomes of offsets).
                raise errors.GroupAuthorizationFailed(
                    f"group {group_id!r} is managed by ConsumerGroup "
                    f"{owner.namespace}/{owner.name}: delete that resource instead"
                )
            await ctx.coordinator.delete_group(messages.DeleteGroupRequest(group_id))
            code = ErrorCode.none
        except errors.CoordinatorError as error:
            code = dispatch.error_code(error)
        results.append(ctx.nested("DeletableGroupResult", group_id=group_id, error_code=code))
    return ctx.response(results=tuple(results))
