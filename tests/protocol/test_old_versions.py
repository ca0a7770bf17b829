"""The group APIs' versions Kafka 4 removed (KIP-896) that Kafka 3.x clients still send:
OffsetCommit v0 and v1, OffsetFetch v0. kio has no type for them, so the frames here are
written out from Kafka 3.9's ``OffsetCommitRequest.json`` / ``OffsetFetchRequest.json``
layouts (v0: GroupId, Topics [Name, Partitions [PartitionIndex, CommittedOffset,
CommittedMetadata]]; v1 adds GenerationId and MemberId after GroupId and a CommitTimestamp
before each CommittedMetadata; OffsetFetch v0 is v1's layout). Their responses share v2's
and v1's layouts (ThrottleTimeMs comes in v3), so kio's types of those read them.

And a version the listener does not serve: closed, as Kafka's ``SocketServer`` closes on the
``UnsupportedVersionException`` of ``parseRequestHeader``, with a warning naming the client
id and the API."""

from __future__ import annotations

import logging
import struct
import uuid
from typing import Any

import pytest
from kio.schema.join_group.v0.request import JoinGroupRequest as JoinV0
from kio.schema.join_group.v0.request import JoinGroupRequestProtocol as ProtocolV0
from kio.schema.sync_group.v0.request import SyncGroupRequest as SyncV0
from kio.schema.types import GroupId
from kio.static.primitive import i32

from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import framing
from tests.protocol.test_classic import (
    ILLEGAL_GENERATION,
    SESSION,
    UNKNOWN_MEMBER_ID,
    subscription,
)
from tests.protocol.test_kip848 import topic_id
from tests.protocol.test_listener import assert_serving
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

OFFSET_COMMIT, OFFSET_FETCH = 8, 9


def string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """A framed request with header v1 (client id "old-client")."""
    return framing.frame(
        struct.pack(">hhi", api_key, version, correlation) + string("old-client") + body
    )


def commit_body(
    version: int,
    group: str,
    topic: str,
    offsets: dict[int, int],
    generation: int = -1,
    member: str = "",
) -> bytes:
    body = string(group)
    if version >= 1:
        body += struct.pack(">i", generation) + string(member)
    body += struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(offsets))
    for partition, offset in sorted(offsets.items()):
        body += struct.pack(">iq", partition, offset)
        if version == 1:
            body += struct.pack(">q", -1)  # commit timestamp: -1, "now"
        body += string(f"meta-{offset}")
    return body


def fetch_body(group: str, topic: str, partitions: tuple[int, ...]) -> bytes:
    return (
        string(group)
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
    )


async def call(connection: Connection, api_key: int, version: int, body: bytes) -> Any:
    """Send one old-version request; its response read with kio's type of the version
    whose layout it shares (OffsetCommit v2, OffsetFetch v1)."""
    await connection.send_raw(request(api_key, version, 7, body))
    payload = await connection.read_raw()
    assert payload is not None, "the listener closed the connection"
    shared = 2 if api_key == OFFSET_COMMIT else 1
    correlation, response = framing.read_response(payload, framing.response_type(api_key, shared))
    assert correlation == 7
    return response


def commit_errors(response: Any) -> dict[int, int]:
    return {p.partition_index: p.error_code for t in response.topics for p in t.partitions}


def fetched(response: Any) -> dict[int, tuple[int, str, int]]:
    return {
        p.partition_index: (p.committed_offset, p.metadata, p.error_code)
        for t in response.topics
        for p in t.partitions
    }


async def test_member_less_commits_v0_and_v1_and_fetch_v0(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    await topic_id(runtime, topic)
    group = f"old-{uuid.uuid4().hex[:8]}"
    connection = await Connection.open(open_listener.port)
    try:
        # v1 without a member (sarama's offset manager outside a group): generation -1.
        v1 = await call(connection, OFFSET_COMMIT, 1, commit_body(1, group, topic, {0: 3, 1: 4}))
        assert commit_errors(v1) == {0: 0, 1: 0}
        v0 = await call(connection, OFFSET_COMMIT, 0, commit_body(0, group, topic, {2: 5}))
        assert commit_errors(v0) == {2: 0}
        offsets = await call(connection, OFFSET_FETCH, 0, fetch_body(group, topic, (0, 1, 2)))
        assert fetched(offsets) == {0: (3, "meta-3", 0), 1: (4, "meta-4", 0), 2: (5, "meta-5", 0)}
    finally:
        await connection.close()


async def test_a_classic_member_commits_with_v1_and_v0_is_refused_while_it_is_active(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    """sarama before 1.23 commits with v1 inside its group: the generation fences it, as a
    v2+ commit is fenced. A v0 commit carries no member: like Kafka's member-less commit,
    it is refused while the group has an active member."""
    await topic_id(runtime, topic)
    group = f"old-{uuid.uuid4().hex[:8]}"
    connection = await Connection.open(open_listener.port)
    try:
        joined = await connection.call(
            JoinV0(
                group_id=GroupId(group),
                session_timeout=SESSION,
                member_id="",
                protocol_type="consumer",
                protocols=(ProtocolV0(name="range", metadata=subscription(topic)),),
            )
        )
        assert joined.error_code == 0
        member, generation = joined.member_id, joined.generation_id
        synced = await connection.call(
            SyncV0(
                group_id=GroupId(group),
                generation_id=i32(generation),
                member_id=member,
                assignments=(),
            )
        )
        assert synced.error_code == 0
        current = commit_body(1, group, topic, {0: 2}, generation, member)
        assert commit_errors(await call(connection, OFFSET_COMMIT, 1, current)) == {0: 0}
        stale = commit_body(1, group, topic, {0: 3}, generation - 1, member)
        assert commit_errors(await call(connection, OFFSET_COMMIT, 1, stale)) == {
            0: ILLEGAL_GENERATION
        }
        member_less = commit_body(0, group, topic, {0: 4})
        assert commit_errors(await call(connection, OFFSET_COMMIT, 0, member_less)) == {
            0: UNKNOWN_MEMBER_ID
        }
        offsets = await call(connection, OFFSET_FETCH, 0, fetch_body(group, topic, (0,)))
        assert fetched(offsets) == {0: (2, "meta-2", 0)}
    finally:
        await connection.close()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(string("g") + struct.pack(">i", 2**31 - 2), id="a count beyond the frame"),
        pytest.param(
            string("g") + struct.pack(">i", 1) + string("t") + struct.pack(">i", 2**31 - 2),
            id="a nested count beyond the frame",
        ),
        pytest.param(string("g") + struct.pack(">i", 1) + b"\x7f\xff", id="a string beyond"),
        pytest.param(string("g") + struct.pack(">i", 1) + string("t"), id="cut short"),
        pytest.param(string("g") + struct.pack(">i", -1), id="null topics"),
        pytest.param(string("g") + struct.pack(">i", 0) + b"\0", id="a byte after the request"),
    ],
)
async def test_malformed_old_versions_close_only_their_connection(
    open_listener: protocol_listener.Listener, body: bytes
) -> None:
    for api_key, version in ((OFFSET_COMMIT, 0), (OFFSET_FETCH, 0)):
        connection = await Connection.open(open_listener.port)
        try:
            await connection.send_raw(request(api_key, version, 1, body))
            assert await connection.closed_by_peer()
        finally:
            await connection.close()
    await assert_serving(open_listener.port)


async def test_an_unsupported_version_is_closed_with_a_warning_naming_client_and_api(
    open_listener: protocol_listener.Listener, caplog: pytest.LogCaptureFixture
) -> None:
    connection = await Connection.open(open_listener.port)
    try:
        with caplog.at_level(logging.WARNING, logger=protocol_listener.__name__):
            await connection.send_raw(request(OFFSET_COMMIT, 11, 1, b""))
            assert await connection.closed_by_peer()
    finally:
        await connection.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "'old-client'" in warnings[0]
    assert "OffsetCommit (API key 8) version 11" in warnings[0]
    assert "versions 0-10" in warnings[0]
