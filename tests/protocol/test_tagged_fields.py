"""Tagged fields the schema does not define (a newer client's, KIP-482): Kafka ignores them,
and so does the listener, wherever they are (a request's own section or a nested struct's);
a tagged section that runs past the message still closes that connection alone. Requests are
raw bytes: kio's writer would never produce such tags."""

from __future__ import annotations

import struct
import uuid

import pytest
from kio.schema.api_versions.v3.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64

from kafka_group_operator.coordinator import messages
from kafka_group_operator.protocol import dispatch
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import framing
from tests.protocol.test_kip848 import heartbeat, owned, topic_id
from tests.protocol.test_listener import api_versions_v3, assert_serving
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]


def tags(*fields: tuple[int, bytes]) -> bytes:
    """A tagged-fields section: count, then each tag, size and bytes (all small varints)."""
    section = bytes([len(fields)])
    for tag, value in fields:
        section += bytes([tag, len(value)]) + value
    return section


def with_tags(frame: bytes, empty_sections: int, *sections: bytes) -> bytes:
    """``frame`` whose last ``empty_sections`` bytes (the empty tagged sections that end its
    innermost last struct and its enclosing ones) are replaced by ``sections``."""
    payload = frame[4:]
    assert payload[-empty_sections:] == b"\0" * empty_sections
    payload = payload[:-empty_sections] + b"".join(sections)
    return framing.frame(payload)


async def call_raw(connection: Connection, data: bytes, schema: type) -> object:
    await connection.send_raw(data)
    payload = await connection.read_raw()
    assert payload is not None, "the listener closed the connection"
    _, response = framing.read_response(payload, schema)
    return response


async def test_unknown_tags_in_a_heartbeat_and_its_nested_struct_are_ignored(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = f"tags-{uuid.uuid4().hex[:6]}"
    member_id = uuid.uuid4().hex
    connection = await Connection.open(open_listener.port)
    try:
        joined = await connection.call(
            heartbeat(group, member_id, 0, topic=topic, owned_partitions={})
        )
        assert joined.error_code == ErrorCode.none
        # The next heartbeat reports what it owns: body ..., topic_partitions
        # [TopicPartitions {topic_id, partitions, tags}], tags.
        request = heartbeat(group, member_id, joined.member_epoch, owned_partitions=owned(joined))
        data = with_tags(
            framing.encode_request(request, 99),
            2,
            tags((7, b"nested"), (30, b"")),
            tags((5, b"\x01\x02\x03"), (99, b"top")),
        )
        response = await call_raw(
            connection, data, framing.response_type(request.__api_key__, request.__version__)
        )
        assert response.error_code == ErrorCode.none  # type: ignore[attr-defined]
        assert response.member_epoch == joined.member_epoch  # type: ignore[attr-defined]
        # The connection goes on serving.
        assert (await connection.call(api_versions_v3())).error_code == ErrorCode.none
    finally:
        await connection.close()
    described = await runtime.describe_group(group)
    assert [m.member_id for m in described.members] == [member_id]
    await runtime.heartbeat(
        messages.HeartbeatRequest(group_id=group, member_id=member_id, member_epoch=-1)
    )


async def test_unknown_tags_in_every_level_of_a_commit_are_ignored(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = f"tags-{uuid.uuid4().hex[:6]}"
    request = OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        group_instance_id=None,
        topics=(
            OffsetCommitRequestTopic(
                name=TopicName(topic),
                partitions=(
                    OffsetCommitRequestPartition(
                        partition_index=i32(2),
                        committed_offset=i64(4),
                        committed_leader_epoch=i32(-1),
                        committed_metadata="",
                    ),
                ),
            ),
        ),
    )
    data = with_tags(
        framing.encode_request(request, 1),
        3,
        tags((3, b"p")),  # the partition's
        tags((4, b"t")),  # the topic's
        tags((6, b"r")),  # the request's
    )
    connection = await Connection.open(open_listener.port)
    try:
        response = await call_raw(
            connection, data, framing.response_type(request.__api_key__, request.__version__)
        )
        errors = [p.error_code for t in response.topics for p in t.partitions]  # type: ignore[attr-defined]
        assert errors == [ErrorCode.none]
    finally:
        await connection.close()
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    assert {tp: o.offset for tp, o in fetched.offsets.items()} == {(topic, 2): 4}


async def test_a_tagged_field_past_the_end_closes_only_that_connection(
    open_listener: protocol_listener.Listener,
) -> None:
    request = heartbeat("tags-broken", uuid.uuid4().hex, 0, topic="t")
    # A field of 100 bytes in a message that ends after 2 of them.
    data = with_tags(framing.encode_request(request, 1), 1, tags((9, b"ab"))[:2] + b"\x64ab")
    connection = await Connection.open(open_listener.port)
    try:
        await connection.send_raw(data)
        assert await connection.closed_by_peer()
    finally:
        await connection.close()
    await assert_serving(open_listener.port)


async def test_known_tags_are_kept_and_unknown_ones_dropped_in_replies() -> None:
    """The gateway reads brokers' replies with the same reader: an unknown tag beside a
    known one (ApiVersions v3's finalized_features_epoch, tag 1) leaves the known one read."""
    reply = ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=(),
        throttle_time=dispatch.NO_THROTTLE,
        finalized_features_epoch=i64(5),
    )
    encoded = framing.encode_response(18, 3, 42, reply)[4:]
    known = tags((1, struct.pack(">q", 5)))
    assert encoded.endswith(known)
    with_unknown = encoded[: -len(known)] + tags((1, struct.pack(">q", 5)), (99, b"later"))
    correlation_id, read = framing.read_response(with_unknown, ApiVersionsResponse)
    assert (correlation_id, read) == (42, reply)
