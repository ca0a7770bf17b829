"""OffsetCommit, OffsetFetch and OffsetDelete onto the coordinator's commit, fetch and
deletion of offsets.

Commits are fenced as Kafka fences them: a member's commit must carry its current epoch
(``STALE_MEMBER_EPOCH``) and come from a known member (``UNKNOWN_MEMBER_ID``); versions
below 9 are the classic protocol's, where Kafka reports a stale epoch as
``ILLEGAL_GENERATION`` (``ConsumerGroup.validateOffsetCommit``). An administrative commit
(empty member id, epoch -1) is accepted only while the group has no active member.
Versions 10 of both APIs name topics by id.

OffsetCommit v0 and v1 and OffsetFetch v0 are gone from Kafka 4 (KIP-896) and from kio, but
clients written for Kafka 3.x still send them (sarama before 1.41 commits with v1 unless a
retention time is configured, whatever Kafka version it is told). They are read here
(``COMMIT_TRANSLATIONS``, ``FETCH_TRANSLATIONS``; their layouts are Kafka 3.9's message
schemas) into kio's request of the next version, whose response is encoded exactly as
theirs is: OffsetCommit v2 (v1 less its per-partition commit timestamp, plus a retention
time of -1: neither is kept, offsets expire by KIP-211's rule alone) and OffsetFetch v1 (v0
byte for byte). v0 names no generation or member: it is a member-less commit (-1, ""),
accepted only while the group has no active member, as Kafka accepts one. (Kafka 3.x's
ZooKeeper brokers kept v0 offsets in ZooKeeper, apart from the group's, and its KRaft
brokers answered v0 UNSUPPORTED_VERSION; here v0 reaches the group's own offsets.)

ListOffsets is answered from the brokers (the listener names itself every partition's leader in
its Metadata): tools that compute lag or reset offsets through the group's coordinator
(``kafka-consumer-groups --describe``, ``--reset-offsets``) get the brokers' log ends, read
committed when asked so. Only versions without tiered-storage timestamps are served.

OffsetDelete answers as Kafka's broker does: a group-level failure (authorization,
``GROUP_ID_NOT_FOUND``, ``NOT_COORDINATOR``, ...) is the top-level error with no topics; a
topic the cluster does not have is ``UNKNOWN_TOPIC_OR_PARTITION`` on each of its partitions
(``KafkaApis`` checks that before the coordinator sees the request); the coordinator
refuses the partitions of subscribed topics with ``GROUP_SUBSCRIBED_TO_TOPIC``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v2 import request as commit_v2
from kio.schema.offset_fetch.v1 import request as fetch_v1
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64, i64Timedelta

from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.protocol import cursor, dispatch

# The first OffsetCommit version of the consumer (KIP-848) protocol.
CONSUMER_PROTOCOL_COMMIT_VERSION = 9
# The first versions that carry topic ids instead of names.
COMMIT_TOPIC_ID_VERSION = 10
FETCH_TOPIC_ID_VERSION = 10
# The first OffsetFetch version with a list of groups.
FETCH_GROUPS_VERSION = 8


def _commit_error(ctx: dispatch.RequestContext, error: errors.CoordinatorError) -> ErrorCode:
    stale = isinstance(error, errors.StaleMemberEpoch | errors.FencedMemberEpoch)
    if stale and ctx.api_version < CONSUMER_PROTOCOL_COMMIT_VERSION:
        return ErrorCode.illegal_generation
    return dispatch.error_code(error)


async def offset_commit(ctx: dispatch.RequestContext, request: Any) -> Any:
    by_id = ctx.topic_ids().by_id
    by_topic: dict[Any, str | None] = {}
    offsets: dict[messages.TopicPartition, messages.CommitOffset] = {}
    for topic in request.topics:
        key = topic.topic_id if ctx.api_version >= COMMIT_TOPIC_ID_VERSION else topic.name
        name = by_id.get(key) if ctx.api_version >= COMMIT_TOPIC_ID_VERSION else key
        by_topic[key] = name
        if name is None:
            continue
        for partition in topic.partitions:
            offsets[(name, partition.partition_index)] = messages.CommitOffset(
                offset=partition.committed_offset,
                metadata=partition.committed_metadata or "",
                leader_epoch=getattr(partition, "committed_leader_epoch", -1),
            )
    failure: ErrorCode | None = None
    per_partition: dict[messages.TopicPartition, ErrorCode] = {}
    try:
        ctx.authorize(request.group_id)
        if offsets:
            response = await ctx.coordinator.commit_offsets(
                messages.OffsetCommitRequest(
                    group_id=request.group_id,
                    member_id=request.member_id,
                    member_epoch=request.generation_id_or_member_epoch,
                    offsets=offsets,
                    instance_id=getattr(request, "group_instance_id", None),
                )
            )
            per_partition = {
                tp: ErrorCode(errors.BY_NAME[name].code if name in errors.BY_NAME else -1)
                for tp, name in response.errors.items()
            }
    except errors.CoordinatorError as error:
        failure = _commit_error(ctx, error)
    topics = []
    for topic in request.topics:
        key = topic.topic_id if ctx.api_version >= COMMIT_TOPIC_ID_VERSION else topic.name
        name = by_topic[key]
        partitions = tuple(
            ctx.nested(
                "OffsetCommitResponsePartition",
                partition_index=partition.partition_index,
                error_code=(
                    ErrorCode.unknown_topic_or_partition
                    if name is None
                    else failure
                    if failure is not None
                    else per_partition.get((name, partition.partition_index), ErrorCode.none)
                ),
            )
            for partition in topic.partitions
        )
        topics.append(
            ctx.nested(
                "OffsetCommitResponseTopic",
                name=topic.name if ctx.api_version < 10 else None,
                topic_id=getattr(topic, "topic_id", None),
                partitions=partitions,
            )
        )
    return ctx.response(topics=tuple(topics))


async def _fetch_group(
    ctx: dispatch.RequestContext,
    group_id: str,
    topics: Any,
    member_id: str | None = None,
    member_epoch: int | None = None,
) -> tuple[ErrorCode, tuple[Any, ...]]:
    """The error of the group and its topics, in the response classes of this version."""
    by_id = ctx.topic_ids().by_id
    by_name = ctx.topic_ids().by_name
    use_ids = ctx.api_version >= FETCH_TOPIC_ID_VERSION
    wanted: list[tuple[Any, str | None, tuple[int, ...]]] | None = None
    if topics is not None:
        wanted = []
        for topic in topics:
            key = topic.topic_id if use_ids else topic.name
            wanted.append((key, by_id.get(key) if use_ids else key, tuple(topic.partition_indexes)))
    try:
        ctx.authorize(group_id)
        partitions = None
        if wanted is not None:
            partitions = tuple((name, p) for _, name, ps in wanted if name is not None for p in ps)
        response = await ctx.coordinator.fetch_offsets(
            messages.OffsetFetchRequest(
                group_id=group_id,
                partitions=partitions,
                member_id=member_id or None,
                member_epoch=member_epoch if member_id else None,
            )
        )
    except errors.CoordinatorError as error:
        code = dispatch.error_code(error)
        if ctx.api_version >= 2 or wanted is None:
            return code, ()
        # v1 has no group-level error: Kafka reports it on every requested partition.
        return code, tuple(
            ctx.nested(
                "OffsetFetchResponseTopic",
                name=key,
                partitions=tuple(
                    ctx.nested(
                        "OffsetFetchResponsePartition",
                        partition_index=index,
                        committed_offset=-1,
                        metadata="",
                        error_code=code,
                    )
                    for index in indexes
                ),
            )
            for key, _, indexes in wanted
        )
    if wanted is None:
        grouped: dict[str, list[int]] = {}
        for committed_topic, partition in sorted(response.offsets):
            grouped.setdefault(committed_topic, []).append(partition)
        wanted = [
            (by_name.get(topic) if use_ids else topic, topic, tuple(ps))
            for topic, ps in grouped.items()
        ]
    entries = []
    for key, name, indexes in wanted:
        partitions_out = []
        for index in indexes:
            committed = response.offsets.get((name, index)) if name is not None else None
            partitions_out.append(
                ctx.nested(
                    "OffsetFetchResponsePartitions"
                    if ctx.api_version >= 8
                    else "OffsetFetchResponsePartition",
                    partition_index=index,
                    committed_offset=committed.offset if committed else -1,
                    committed_leader_epoch=committed.leader_epoch if committed else -1,
                    metadata=committed.metadata if committed else "",
                    error_code=(
                        ErrorCode.unknown_topic_id if name is None and use_ids else ErrorCode.none
                    ),
                )
            )
        entries.append(
            ctx.nested(
                "OffsetFetchResponseTopics" if ctx.api_version >= 8 else "OffsetFetchResponseTopic",
                name=name,
                topic_id=key if use_ids else None,
                partitions=tuple(partitions_out),
            )
        )
    return ErrorCode.none, tuple(entries)


async def offset_fetch(ctx: dispatch.RequestContext, request: Any) -> Any:
    if ctx.api_version < FETCH_GROUPS_VERSION:
        error, topics = await _fetch_group(ctx, request.group_id, request.topics)
        return ctx.response(topics=topics, error_code=error)
    groups = []
    for group in request.groups:
        error, topics = await _fetch_group(
            ctx,
            group.group_id,
            group.topics,
            getattr(group, "member_id", None),
            getattr(group, "member_epoch", None),
        )
        groups.append(
            ctx.nested(
                "OffsetFetchResponseGroup", group_id=group.group_id, topics=topics, error_code=error
            )
        )
    return ctx.response(groups=tuple(groups))


async def offset_delete(ctx: dispatch.RequestContext, request: Any) -> Any:
    known = ctx.coordinator.known_topics()
    wanted = tuple(
        (str(topic.name), int(partition.partition_index))
        for topic in request.topics
        if topic.name in known
        for partition in topic.partitions
    )
    try:
        ctx.authorize(request.group_id)
        response = await ctx.coordinator.delete_offsets(
            messages.OffsetDeleteRequest(group_id=request.group_id, partitions=wanted)
        )
    except errors.CoordinatorError as error:
        return ctx.response(error_code=dispatch.error_code(error), topics=())
    topics = tuple(
        ctx.nested(
            "OffsetDeleteResponseTopic",
            name=topic.name,
            partitions=tuple(
                ctx.nested(
                    "OffsetDeleteResponsePartition",
                    partition_index=partition.partition_index,
                    error_code=(
                        ErrorCode.unknown_topic_or_partition
                        if topic.name not in known
                        else _error_named(
                            response.errors.get((topic.name, partition.partition_index))
                        )
                    ),
                )
                for partition in topic.partitions
            ),
        )
        for topic in request.topics
    )
    return ctx.response(error_code=ErrorCode.none, topics=topics)


def _error_named(name: str | None) -> ErrorCode:
    """Kafka's error code of a per-partition error name (``ErrorCode`` is named as Kafka's
    ``Errors``, in lower case)."""
    return ErrorCode.none if name is None else ErrorCode[name.lower()]


# -----------------------------------------------------------------------------------------
# Versions Kafka 4 removed (see the module's docstring)

_NO_RETENTION = i64Timedelta.parse(datetime.timedelta(milliseconds=-1))
# The fewest bytes of a topic (name, partition count) and of a v0/v1 partition.
_TOPIC_SIZE = 2 + 4
_COMMIT_PARTITION_SIZE = {0: 4 + 8 + 2, 1: 4 + 8 + 8 + 2}


def _count(reader: cursor.Cursor, element_size: int) -> int:
    count = reader.count(element_size)
    if count < 0:
        raise cursor.Malformed("null array where the schema allows none")
    return count


def _read_commit(version: int, reader: cursor.Cursor) -> Any:
    """OffsetCommit v0/v1 (GroupId, [v1: GenerationId, MemberId], Topics [Name, Partitions
    [PartitionIndex, CommittedOffset, [v1: CommitTimestamp], CommittedMetadata]]) as v2."""
    group_id = reader.string()
    generation, member_id = (reader.int32(), reader.string()) if version >= 1 else (-1, "")
    topics = []
    for _ in range(_count(reader, _TOPIC_SIZE)):
        name = reader.string()
        partitions = []
        for _ in range(_count(reader, _COMMIT_PARTITION_SIZE[version])):
            index, offset = reader.int32(), reader.int64()
            if version == 1:
                reader.int64()  # the commit timestamp: not kept
            partitions.append(
                commit_v2.OffsetCommitRequestPartition(
                    partition_index=i32(index),
                    committed_offset=i64(offset),
                    committed_metadata=reader.nullable_string(),
                )
            )
        topics.append(
            commit_v2.OffsetCommitRequestTopic(name=TopicName(name), partitions=tuple(partitions))
        )
    return commit_v2.OffsetCommitRequest(
        group_id=GroupId(group_id),
        generation_id_or_member_epoch=i32(generation),
        member_id=member_id,
        retention_time=_NO_RETENTION,
        topics=tuple(topics),
    )


def _read_fetch_v0(reader: cursor.Cursor) -> Any:
    """OffsetFetch v0 (GroupId, Topics [Name, PartitionIndexes [int32]]): v1's layout."""
    group_id = reader.string()
    topics = []
    for _ in range(_count(reader, _TOPIC_SIZE)):
        name = reader.string()
        indexes = tuple(i32(reader.int32()) for _ in range(_count(reader, 4)))
        topics.append(
            fetch_v1.OffsetFetchRequestTopic(name=TopicName(name), partition_indexes=indexes)
        )
    return fetch_v1.OffsetFetchRequest(group_id=GroupId(group_id), topics=tuple(topics))


COMMIT_TRANSLATIONS: Mapping[int, dispatch.Translation] = {
    0: dispatch.Translation(2, lambda reader: _read_commit(0, reader)),
    1: dispatch.Translation(2, lambda reader: _read_commit(1, reader)),
}
FETCH_TRANSLATIONS: Mapping[int, dispatch.Translation] = {
    0: dispatch.Translation(1, _read_fetch_v0),
}


async def list_offsets(ctx: dispatch.RequestContext, request: Any) -> Any:
    # Only partitions the cluster has are asked of the brokers: any other (a topic it does not
    # have, an empty name, a partition past the count) is UNKNOWN_TOPIC_OR_PARTITION, as a
    # broker answers it, and never reaches the brokers however many a request names.
    known = ctx.coordinator.known_topics()
    wanted = {
        (topic.name, partition.partition_index): partition.timestamp
        for topic in request.topics
        if topic.name in known
        for partition in topic.partitions
        if 0 <= partition.partition_index < known[topic.name].num_partitions
    }
    read_committed = getattr(request, "isolation_level", 0) == 1
    failure = ErrorCode.none
    listed: Mapping[messages.TopicPartition, messages.ListedOffset] = {}
    if wanted:
        try:
            listed = await ctx.coordinator.list_offsets(wanted, read_committed)
        except errors.CoordinatorError as error:
            failure = dispatch.error_code(error)
    missing = messages.ListedOffset(error_code=ErrorCode.unknown_topic_or_partition)
    unknown = messages.ListedOffset(error_code=failure or ErrorCode.unknown_server_error)
    topics = tuple(
        ctx.nested(
            "ListOffsetsTopicResponse",
            name=topic.name,
            partitions=tuple(
                ctx.nested(
                    "ListOffsetsPartitionResponse",
                    partition_index=partition.partition_index,
                    error_code=ErrorCode(found.error_code),
                    timestamp=found.timestamp,
                    offset=found.offset,
                    leader_epoch=found.leader_epoch,
                )
                for partition in topic.partitions
                for key in ((topic.name, partition.partition_index),)
                for found in (listed.get(key, unknown) if key in wanted else missing,)
            ),
        )
        for topic in request.topics
    )
    return ctx.response(topics=topics)
