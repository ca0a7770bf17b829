"""Hostile frames, generated: whatever a client sends, the listener answers it (a response
to that correlation id) or closes that connection, and keeps serving every other one."""

from __future__ import annotations

import asyncio
import datetime
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_commit.v9.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup
from kio.static.primitive import i32Timedelta

from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.protocol import routes
from kafka_group_operator.wire import framing
from tests.protocol.test_listener import api_versions_v3, assert_serving
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

VALID = [
    framing.encode_request(body, 77)[4:]
    for body in (
        api_versions_v3(),
        MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name="fuzz"),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
        FindCoordinatorRequest(key_type=0, coordinator_keys=("fuzz-group",)),
        ConsumerGroupHeartbeatRequest(
            group_id="fuzz-group",
            member_id="fuzz-member",
            member_epoch=0,
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=1)),
            subscribed_topic_names=("fuzz",),
            topic_partitions=(),
        ),
        OffsetCommitRequest(
            group_id="fuzz-group",
            member_id="",
            topics=(
                OffsetCommitRequestTopic(
                    name="fuzz",
                    partitions=(
                        OffsetCommitRequestPartition(
                            partition_index=0, committed_offset=1, committed_metadata=""
                        ),
                    ),
                ),
            ),
        ),
        OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id="fuzz-group", topics=None),)),
    )
]

random_payloads = st.binary(max_size=300)
headed_payloads = st.builds(
    lambda key, version, correlation, rest: struct.pack(">hhi", key, version, correlation) + rest,
    st.sampled_from([*routes.ROUTES, 0, 1, 11, 12, 999, -1]),
    st.integers(-2, 20),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=200),
)


@st.composite
def mutated_payloads(draw: st.DrawFn) -> bytes:
    payload = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(payload) - 1))
        payload[position] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(payload)))
    return bytes(payload[: max(cut, len(payload) - draw(st.integers(0, 3)))])


async def answered_or_closed(port: int, payload: bytes) -> None:
    connection = await Connection.open(port)
    try:
        await connection.send_raw(framing.frame(payload))
        try:
            answer = await asyncio.wait_for(connection.reader.read(4), 10)
        except ConnectionError:
            answer = b""
        if answer:
            (size,) = struct.unpack(">i", answer)
            body = await asyncio.wait_for(connection.reader.readexactly(size), 10)
            # An answer is to this request: its correlation id comes first.
            assert body[:4] == payload[4:8]
    finally:
        await connection.close()
    await assert_serving(port)


FUZZ_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
FRAMES = st.one_of(random_payloads, headed_payloads, mutated_payloads())


@FUZZ_SETTINGS
@given(payload=FRAMES)
async def test_any_frame_is_answered_or_closes_only_its_connection(
    open_listener: protocol_listener.Listener, payload: bytes
) -> None:
    await answered_or_closed(open_listener.port, payload)


@FUZZ_SETTINGS
@given(payload=FRAMES)
async def test_any_frame_before_authentication_is_answered_or_closes_only_its_connection(
    secured_listener: protocol_listener.Listener, payload: bytes
) -> None:
    """With tokens, only ApiVersions and the SASL APIs are served before authentication."""
    await answered_or_closed(secured_listener.port, payload)
