"""Frames whose one count or length claims far more than the frame holds (2^32-2 elements or
bytes; 2^31-1 in non-flexible versions), at every depth of every API version the listener
routes, sent to a real ``kgo coordinator`` and a real ``kgo gateway``: each closes its own
connection, the reason logged once, and the processes go on serving a canary group that keeps
committing. Before the bounds check, the 17-byte ListGroups v5 frame among them aborted the
coordinator (SIGABRT), and the same FindCoordinator v4 frame aborted the gateway.

Replies too: a broker that answers the gateway's ApiVersions, Metadata, DescribeCluster or
FindCoordinator with such a body closes that client's connection, not the gateway.
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from dataclasses import dataclass
from typing import Any

import pytest

from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import routes
from kafka_group_operator.wire import framing, layout
from tests.protocol import frames, served
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]


@dataclass(frozen=True)
class Case:
    schema: type[Any]
    where: str
    frame: bytes

    def __str__(self) -> str:
        return f"{self.schema.__name__} v{self.schema.__version__} {self.where}"


def request_cases(schemas: list[type[Any]]) -> list[Case]:
    return [
        Case(schema, where, frames.request_frame(schema, body))
        for schema in schemas
        for where, body in frames.hostile_bodies(schema)
    ]


ROUTED = request_cases(frames.routed_requests())
# What the gateway sends to the listener (group APIs) or decodes itself (FindCoordinator): never
# the rest, which it forwards to the brokers.
THROUGH_GATEWAY = [
    case for case in ROUTED if case.schema.__api_key__ in protocol_gateway.GROUP_APIS
]


async def refused(port: int, frame: bytes, group: str | None = None) -> int:
    """Sends ``frame`` on a new connection (authenticated as ``group`` if given); asserts it
    is closed unanswered. The connection's local port (how the logs name it)."""
    if group is None:
        connection = await Connection.open(port)
    else:
        connection = await served.authenticated(port, group, served.TOKENS[group])
    try:
        local: int = connection.writer.get_extra_info("sockname")[1]
        await connection.send_raw(frame)
        assert await connection.closed_by_peer(), "answered instead of closed"
        return local
    finally:
        await connection.close()


async def logged_once_each(
    process: served.Served, ports: list[int], since: int, bound_s: float = 30
) -> None:
    """The listener logged exactly one closing line for each of these connections, in its log
    after offset ``since`` (an earlier test's connection may have had the same local port)."""
    deadline = time.monotonic() + bound_s
    while True:
        closing = re.findall(
            r"closing the connection of 127\.0\.0\.1:(\d+): (.*)", process.log_text()[since:]
        )
        counts: dict[int, int] = {}
        for port, _reason in closing:
            counts[int(port)] = counts.get(int(port), 0) + 1
        missing = [port for port in ports if counts.get(port, 0) == 0]
        if not missing or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert not missing, f"{len(missing)} connections closed without a reason logged"
    # Exactly one line per connection: a local port the system handed out twice during the
    # test is logged twice.
    assert counts == collections.Counter(ports)


def valid_request(schema: type[Any]) -> bytes:
    """The shortest body of ``schema``; FindCoordinator asks for a transaction coordinator
    (key type 1), which the gateway sends to a broker, not to the listener."""
    body = bytearray(frames.minimal_body(layout.layout(schema)))
    if schema.__api_key__ == 10:
        # v1-v3: key (string), key_type (int8); v4+: key_type, coordinator_keys.
        position = 0 if schema.__version__ >= 4 else (1 if schema.__flexible__ else 2)
        body[position] = 1
    return bytes(body)


REPLIES = [
    (schema, where, body)
    for key in frames.GATEWAY_REPLIES
    for schema in frames.versions_of(key, "response")
    # FindCoordinator v0 has no key type: the gateway sends it to the listener.
    if not (key == 10 and schema.__version__ == 0)
    for where, body in frames.hostile_bodies(schema)
]


async def test_every_routed_version_and_depth_is_covered() -> None:
    covered = {(c.schema.__api_key__, c.schema.__version__) for c in ROUTED}
    routed = {
        (route.api_key, version)
        for route in routes.ROUTES.values()
        for version in range(route.min_version, route.max_version + 1)
    }
    translated = {
        (route.api_key, version)
        for route in routes.ROUTES.values()
        for version in route.translations
    }
    # Only versions whose body has no length or count at all: ApiVersions v0-v2 and
    # ListGroups v0-v2 (empty bodies); and the versions kio has no schema of, read by the
    # listener's own bounded reader (test_old_versions sends them counts beyond the frame).
    assert routed - covered == {(18, 0), (18, 1), (18, 2), (16, 0), (16, 1), (16, 2)} | translated
    assert translated == {(8, 0), (8, 1), (9, 0)}
    assert len(ROUTED) > 400
    # The frame of the report: ListGroups v5 whose states_filter declares 2^32-2 elements.
    (report,) = [
        c for c in ROUTED if str(c) == "ListGroupsRequest v5 ListGroupsRequest.states_filter"
    ]
    assert len(report.frame) == 24


async def test_the_listener_closes_each_without_authentication(hostile_stack: served.Stack) -> None:
    since = len(hostile_stack.coordinator.log_text())
    ports = [await refused(hostile_stack.coordinator.port, case.frame) for case in ROUTED]
    await logged_once_each(hostile_stack.coordinator, ports, since)
    await hostile_stack.still_serving()


async def test_the_listener_closes_each_after_authentication(hostile_stack: served.Stack) -> None:
    since = len(hostile_stack.coordinator.log_text())
    ports = [
        await refused(hostile_stack.coordinator.port, case.frame, served.TENANT) for case in ROUTED
    ]
    await logged_once_each(hostile_stack.coordinator, ports, since)
    log = hostile_stack.coordinator.log_text()[since:]
    # The reason names the field, e.g. the frame that once aborted the process:
    assert "ListGroupsRequest v5: ListGroupsRequest.states_filter: 4294967294 elements" in log
    await hostile_stack.still_serving()


async def test_the_gateway_closes_each_group_request(hostile_stack: served.Stack) -> None:
    """The client does not authenticate: the gateway does, for its group."""
    for case in THROUGH_GATEWAY:
        await refused(hostile_stack.gateway.port, case.frame)
    await hostile_stack.still_serving()


async def test_the_gateway_closes_each_client_whose_broker_replies_hostile(
    hostile_stack: served.Stack,
) -> None:
    for index, (schema, where, body) in enumerate(REPLIES, 1):
        request = framing.request_type(schema.__api_key__, schema.__version__)
        hostile_stack.evil.replies[index] = body
        connection = await Connection.open(hostile_stack.evil_gateway.port)
        try:
            await connection.send_raw(frames.request_frame(request, valid_request(request), index))
            # Closed, ApiVersions included: only a broker's UNSUPPORTED_VERSION answer (v0
            # whatever was asked) passes unread, and these bodies carry no error code.
            assert await connection.closed_by_peer(), f"{schema.__name__} {where} answered"
        finally:
            await connection.close()
    await hostile_stack.still_serving()
