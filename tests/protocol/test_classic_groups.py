"""Classic groups on the wire: the leader assigns, the coordinator relays (Kafka's ClassicGroup).

kio requests as clients send them, to a group no ConsumerGroup resource owns (so it follows
its clients, as on Kafka): the JoinGroup answers name the leader and give it every member's
metadata; the leader's SyncGroup bytes reach each member unchanged, whatever the protocol
type; DescribeGroups and ListGroups show the group as Kafka shows a classic group.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid
from typing import Any

import pytest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.list_groups.v5.request import ListGroupsRequest
from kio.schema.sync_group.v5.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.schema.types import GroupId
from kio.static.primitive import i32, i32Timedelta

from kafka_group_operator.protocol import listener as protocol_listener
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

SESSION = i32Timedelta.parse(datetime.timedelta(seconds=10))
REBALANCE = i32Timedelta.parse(datetime.timedelta(seconds=10))


def join(
    group: str, member_id: str, metadata: bytes, protocol_type: str, instance: str | None = None
) -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=SESSION,
        rebalance_timeout=REBALANCE,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type=protocol_type,
        protocols=(JoinGroupRequestProtocol(name="sessioned", metadata=metadata),),
    )


async def joined(connection: Connection, group: str, metadata: bytes, protocol_type: str) -> Any:
    """A dynamic member's two JoinGroups (KIP-394), the second one parked at the barrier."""
    first = await connection.call(join(group, "", metadata, protocol_type))
    assert first.error_code == ErrorCode.member_id_required
    return await connection.call(join(group, first.member_id, metadata, protocol_type))


def sync(
    group: str, member_id: str, generation: int, assignments: dict[str, bytes]
) -> SyncGroupRequest:
    return SyncGroupRequest(
        group_id=GroupId(group),
        generation_id=i32(generation),
        member_id=member_id,
        group_instance_id=None,
        protocol_type="connect",
        protocol_name="sessioned",
        assignments=tuple(
            SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in assignments.items()
        ),
    )


async def test_a_connect_group_elects_a_leader_and_relays_its_assignment(
    open_listener: protocol_listener.Listener,
) -> None:
    group = f"connect-{uuid.uuid4().hex[:8]}"
    worker_a = await Connection.open(open_listener.port)
    worker_b = await Connection.open(open_listener.port)
    try:
        # Two workers join at once: both wait at the barrier, then both are answered.
        a, b = await asyncio.gather(
            joined(worker_a, group, b"worker-a-config", "connect"),
            joined(worker_b, group, b"worker-b-config", "connect"),
        )
        assert a.error_code == b.error_code == ErrorCode.none
        assert a.generation_id == b.generation_id == 1
        assert a.protocol_type == b.protocol_type == "connect"
        assert a.protocol_name == b.protocol_name == "sessioned"
        assert a.leader == b.leader
        leader, follower = (a, b) if a.leader == a.member_id else (b, a)
        follower_connection = worker_b if leader is a else worker_a
        leader_connection = worker_a if leader is a else worker_b
        # Only the leader gets the members, with the metadata each sent.
        assert {m.member_id: m.metadata for m in leader.members} == {
            a.member_id: b"worker-a-config",
            b.member_id: b"worker-b-config",
        }
        assert follower.members == ()
        # The follower's SyncGroup waits for the leader's; each gets its bytes as sent.
        follower_sync = asyncio.create_task(
            follower_connection.call(sync(group, follower.member_id, 1, {}))
        )
        await asyncio.sleep(0.2)
        assert not follower_sync.done()
        leader_sync = await leader_connection.call(
            sync(
                group,
                leader.member_id,
                1,
                {leader.member_id: b"connectors: [a]", follower.member_id: b"tasks: [a-0]"},
            )
        )
        assert (leader_sync.error_code, leader_sync.assignment) == (0, b"connectors: [a]")
        synced = await asyncio.wait_for(follower_sync, 10)
        assert (synced.error_code, synced.assignment) == (0, b"tasks: [a-0]")
        assert (synced.protocol_type, synced.protocol_name) == ("connect", "sessioned")
        heartbeat = await follower_connection.call(
            HeartbeatRequest(
                group_id=GroupId(group),
                generation_id=i32(1),
                member_id=follower.member_id,
                group_instance_id=None,
            )
        )
        assert heartbeat.error_code == ErrorCode.none

        # Admin tools see a classic group, as Kafka shows one.
        (described,) = (
            await worker_a.call(
                DescribeGroupsRequest(groups=(GroupId(group),), include_authorized_operations=False)
            )
        ).groups
        assert (described.group_state, described.protocol_type, described.protocol_data) == (
            "Stable",
            "connect",
            "sessioned",
        )
        assert {
            m.member_id: (m.member_metadata, m.member_assignment) for m in described.members
        } == {
            leader.member_id: (
                b"worker-a-config" if leader is a else b"worker-b-config",
                b"connectors: [a]",
            ),
            follower.member_id: (
                b"worker-b-config" if leader is a else b"worker-a-config",
                b"tasks: [a-0]",
            ),
        }
        listed = await worker_a.call(ListGroupsRequest(states_filter=(), types_filter=("classic",)))
        assert [
            (g.group_id, g.protocol_type, g.group_state, g.group_type)
            for g in listed.groups
            if g.group_id == group
        ] == [(group, "connect", "Stable", "classic")]
    finally:
        await worker_a.close()
        await worker_b.close()
