"""OffsetCommit and OffsetFetch on the wire, every version family: names (v2-v9) and topic
ids (v10), one group (v1-v7) and many (v8+), with Kafka's fencing errors."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.list_offsets.v7.request import ListOffsetsPartition as ListOffsetsPartitionV7
from kio.schema.list_offsets.v7.request import ListOffsetsRequest as ListOffsetsV7
from kio.schema.list_offsets.v7.request import ListOffsetsTopic as ListOffsetsTopicV7
from kio.schema.offset_commit.v2.request import OffsetCommitRequest as CommitV2
from kio.schema.offset_commit.v2.request import OffsetCommitRequestPartition as CommitPartitionV2
from kio.schema.offset_commit.v2.request import OffsetCommitRequestTopic as CommitTopicV2
from kio.schema.offset_commit.v9.request import OffsetCommitRequest as CommitV9
from kio.schema.offset_commit.v9.request import OffsetCommitRequestPartition as CommitPartitionV9
from kio.schema.offset_commit.v9.request import OffsetCommitRequestTopic as CommitTopicV9
from kio.schema.offset_commit.v10.request import OffsetCommitRequest as CommitV10
from kio.schema.offset_commit.v10.request import (
    OffsetCommitRequestPartition as CommitPartitionV10,
)
from kio.schema.offset_commit.v10.request import OffsetCommitRequestTopic as CommitTopicV10
from kio.schema.offset_fetch.v1.request import OffsetFetchRequest as FetchV1
from kio.schema.offset_fetch.v1.request import OffsetFetchRequestTopic as FetchTopicV1
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest as FetchV7
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest as FetchV8
from kio.schema.offset_fetch.v8.request import OffsetFetchRequestGroup as FetchGroupV8
from kio.schema.offset_fetch.v8.request import OffsetFetchRequestTopics as FetchTopicsV8
from kio.schema.offset_fetch.v10.request import OffsetFetchRequest as FetchV10
from kio.schema.offset_fetch.v10.request import OffsetFetchRequestGroup as FetchGroupV10
from kio.schema.offset_fetch.v10.request import OffsetFetchRequestTopics as FetchTopicsV10
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.conftest import TOKENS
from tests.protocol.test_kip848 import UNKNOWN_MEMBER_ID, heartbeat, owned, topic_id
from tests.protocol.test_listener import GROUP_AUTHORIZATION_FAILED, authenticated
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

# Kafka's Errors: ILLEGAL_GENERATION(22), STALE_MEMBER_EPOCH(113), UNKNOWN_TOPIC_ID(100).
ILLEGAL_GENERATION = 22
STALE_MEMBER_EPOCH = 113
UNKNOWN_TOPIC_ID = 100
# UNKNOWN_TOPIC_OR_PARTITION(3).
UNKNOWN_TOPIC_OR_PARTITION = 3


def errors_of(response: object) -> list[int]:
    return [p.error_code for t in response.topics for p in t.partitions]  # type: ignore[attr-defined]


async def test_member_commits_are_fenced_by_epoch(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    tid = await topic_id(runtime, topic)
    group = f"offsets-{uuid.uuid4().hex[:6]}"
    connection = await Connection.open(open_listener.port)
    try:
        member = uuid.uuid4().hex
        joined = await connection.call(
            heartbeat(group, member, 0, topic=topic, owned_partitions={})
        )
        assert owned(joined) == {tid: (0, 1, 2)}
        epoch = joined.member_epoch

        def v9(epoch_sent: int, member_id: str = member) -> CommitV9:
            return CommitV9(
                group_id=group,
                generation_id_or_member_epoch=epoch_sent,
                member_id=member_id,
                topics=(
                    CommitTopicV9(
                        name=topic,
                        partitions=(
                            CommitPartitionV9(
                                partition_index=0, committed_offset=3, committed_metadata="m"
                            ),
                        ),
                    ),
                ),
            )

        assert errors_of(await connection.call(v9(epoch))) == [0]
        assert errors_of(await connection.call(v9(epoch - 1))) == [STALE_MEMBER_EPOCH]
        assert errors_of(await connection.call(v9(epoch, uuid.uuid4().hex))) == [UNKNOWN_MEMBER_ID]
        # Before v9 (the classic protocol) a stale epoch is an illegal generation.
        classic = CommitV2(
            group_id=group,
            generation_id_or_member_epoch=epoch - 1,
            member_id=member,
            topics=(
                CommitTopicV2(
                    name=topic,
                    partitions=(
                        CommitPartitionV2(
                            partition_index=1, committed_offset=9, committed_metadata=None
                        ),
                    ),
                ),
            ),
        )
        assert errors_of(await connection.call(classic)) == [ILLEGAL_GENERATION]
        # v10 names topics by id; an unknown id is UNKNOWN_TOPIC_OR_PARTITION.
        v10 = CommitV10(
            group_id=group,
            generation_id_or_member_epoch=epoch,
            member_id=member,
            topics=(
                CommitTopicV10(
                    topic_id=tid,
                    partitions=(
                        CommitPartitionV10(
                            partition_index=2, committed_offset=5, committed_metadata=""
                        ),
                    ),
                ),
                CommitTopicV10(
                    topic_id=uuid.uuid4(),
                    partitions=(
                        CommitPartitionV10(
                            partition_index=0, committed_offset=1, committed_metadata=""
                        ),
                    ),
                ),
            ),
        )
        assert errors_of(await connection.call(v10)) == [0, 3]

        # OffsetFetch v1 (names, one group), v7, v8 (many groups), v10 (ids).
        v1 = await connection.call(
            FetchV1(group_id=group, topics=(FetchTopicV1(name=topic, partition_indexes=(0, 1, 2)),))
        )
        assert [
            (p.partition_index, p.committed_offset, p.metadata) for p in v1.topics[0].partitions
        ] == [
            (0, 3, "m"),
            (1, -1, ""),
            (2, 5, ""),
        ]
        v7 = await connection.call(FetchV7(group_id=group, topics=None))
        assert v7.error_code == 0
        assert {
            (t.name, p.partition_index): p.committed_offset for t in v7.topics for p in t.partitions
        } == {
            (topic, 0): 3,
            (topic, 2): 5,
        }
        v8 = await connection.call(
            FetchV8(
                groups=(
                    FetchGroupV8(
                        group_id=group, topics=(FetchTopicsV8(name=topic, partition_indexes=(2,)),)
                    ),
                    FetchGroupV8(group_id=f"{group}-none", topics=None),
                )
            )
        )
        assert [(g.group_id, g.error_code) for g in v8.groups] == [(group, 0), (f"{group}-none", 0)]
        assert v8.groups[0].topics[0].partitions[0].committed_offset == 5
        assert v8.groups[1].topics == ()
        v10_fetch = await connection.call(
            FetchV10(
                groups=(
                    FetchGroupV10(
                        group_id=group,
                        member_id=member,
                        member_epoch=epoch,
                        topics=(FetchTopicsV10(topic_id=tid, partition_indexes=(0,)),),
                    ),
                    FetchGroupV10(
                        group_id=group, member_id=member, member_epoch=epoch - 1, topics=None
                    ),
                )
            )
        )
        fresh, stale = v10_fetch.groups
        assert (fresh.error_code, fresh.topics[0].topic_id) == (0, tid)
        assert fresh.topics[0].partitions[0].committed_offset == 3
        assert stale.error_code == STALE_MEMBER_EPOCH
    finally:
        await connection.close()


async def test_offsets_of_another_group_are_refused(
    secured_listener: protocol_listener.Listener, topic: str
) -> None:
    connection = await authenticated(secured_listener.port, "group-a", TOKENS["group-a"])
    try:
        refused = await connection.call(FetchV7(group_id="group-b", topics=None))
        assert refused.error_code == GROUP_AUTHORIZATION_FAILED
        commit = CommitV9(
            group_id="group-b",
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=(
                CommitTopicV9(
                    name=topic,
                    partitions=(
                        CommitPartitionV9(
                            partition_index=0, committed_offset=1, committed_metadata=""
                        ),
                    ),
                ),
            ),
        )
        assert errors_of(await connection.call(commit)) == [GROUP_AUTHORIZATION_FAILED]
    finally:
        await connection.close()


async def test_list_offsets_answers_the_brokers_log_ends_and_refuses_unknown_partitions(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    """ListOffsets (what tools ask their group's coordinator for log ends) is the brokers'
    answer for the cluster's partitions; a topic the cluster lacks, an empty name or a
    partition past the count is UNKNOWN_TOPIC_OR_PARTITION and never reaches the brokers (an
    empty name once closed the connection with an internal error)."""
    await topic_id(runtime, topic)  # the runtime knows the topic
    latest = i64(-1)
    request = ListOffsetsV7(
        replica_id=BrokerId(-1),
        isolation_level=i8(1),
        topics=(
            ListOffsetsTopicV7(
                name=TopicName(topic),
                partitions=tuple(
                    ListOffsetsPartitionV7(partition_index=i32(p), timestamp=latest)
                    for p in (0, 2, 3, -1)
                ),
            ),
            ListOffsetsTopicV7(
                name=TopicName(""),
                partitions=(ListOffsetsPartitionV7(partition_index=i32(0), timestamp=latest),),
            ),
            ListOffsetsTopicV7(
                name=TopicName(f"absent-{uuid.uuid4().hex[:6]}"),
                partitions=(ListOffsetsPartitionV7(partition_index=i32(0), timestamp=latest),),
            ),
        ),
    )
    connection = await Connection.open(open_listener.port)
    try:
        response = await connection.call(request)
    finally:
        await connection.close()
    answers = [
        (t.name, p.partition_index, p.error_code, p.offset)
        for t in response.topics
        for p in t.partitions
    ]
    # The topic fixture holds 5 messages in each of its 3 partitions.
    assert answers[:2] == [(topic, 0, 0, 5), (topic, 2, 0, 5)]
    assert [(name, partition, code) for name, partition, code, _ in answers[2:]] == [
        (topic, 3, UNKNOWN_TOPIC_OR_PARTITION),
        (topic, -1, UNKNOWN_TOPIC_OR_PARTITION),
        ("", 0, UNKNOWN_TOPIC_OR_PARTITION),
        (answers[-1][0], 0, UNKNOWN_TOPIC_OR_PARTITION),
    ]
