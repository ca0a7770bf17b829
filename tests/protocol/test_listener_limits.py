"""What one client may cost the listener: frames and time before authentication, connections,
groups per request (each answered once), and a long request never holding up the others.

Memory given back after large frames is measured on a real process (``test_frame_memory``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest
from kio.schema.delete_groups.v2.request import DeleteGroupsRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.list_groups.v5.request import ListGroupsRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup

from kafka_group_operator.access import tokens
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import dispatch, routes
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import framing
from tests.protocol import served
from tests.protocol.conftest import TOKENS
from tests.protocol.test_listener import GROUP_AUTHORIZATION_FAILED, api_versions_v3, authenticated
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

CAP = protocol_listener.DEFAULT_MAX_GROUPS_PER_REQUEST


@pytest_asyncio.fixture(loop_scope="package")
async def strict_listener(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> AsyncIterator[protocol_listener.Listener]:
    """Tokens required, 1 s to authenticate, 3 connections at most."""
    served_ = protocol_listener.Listener(
        runtime,
        tokens.GroupTokens(TOKENS),
        protocol_listener.ListenerConfig(port=0, authentication_timeout_s=1, max_connections=3),
    )
    await served_.start()
    yield served_
    await served_.stop()


async def test_a_frame_over_512_kib_before_authentication_closes_the_connection(
    secured_listener: protocol_listener.Listener,
) -> None:
    connection = await Connection.open(secured_listener.port)
    try:
        # Only the size is sent: the listener refuses it before reading a byte of it.
        await connection.send_raw(struct.pack(">i", 512 * 1024 + 1))
        assert await connection.closed_by_peer()
    finally:
        await connection.close()


async def test_after_authentication_frames_may_be_larger_and_repeated_groups_count_once(
    secured_listener: protocol_listener.Listener,
) -> None:
    """A 600 KiB DescribeGroups naming its own group 10,000 times: answered once."""
    group = "group-a"
    connection = await authenticated(secured_listener.port, group, TOKENS[group])
    try:
        request = DescribeGroupsRequest(groups=(group,) * CAP, include_authorized_operations=False)
        padded = DescribeGroupsRequest(
            groups=(group + "\0" * 60,) * CAP, include_authorized_operations=False
        )
        assert len(framing.encode_request(padded, 1)) > 600 * 1024
        described = await connection.call(padded)  # another group's name: refused, once
        assert [(g.group_id, g.error_code) for g in described.groups] == [
            (group + "\0" * 60, GROUP_AUTHORIZATION_FAILED)
        ]
        described = await connection.call(request)
        assert [(g.group_id, g.error_code) for g in described.groups] == [(group, 0)]
    finally:
        await connection.close()


async def test_unauthenticated_connections_are_closed_after_the_deadline(
    strict_listener: protocol_listener.Listener,
) -> None:
    idle = await Connection.open(strict_listener.port)
    talking = await Connection.open(strict_listener.port)
    signed_in = await authenticated(strict_listener.port, "group-a", TOKENS["group-a"])
    try:
        started = time.monotonic()
        # ApiVersions before authentication is served, but does not extend the deadline.
        assert (await talking.call(api_versions_v3())).error_code == 0
        assert await idle.closed_by_peer()
        assert await talking.closed_by_peer()
        assert time.monotonic() - started < 10
        # The authenticated connection is not bound by it.
        await asyncio.sleep(max(0.0, 1.5 - (time.monotonic() - started)))
        assert (await signed_in.call(api_versions_v3())).error_code == 0
    finally:
        for connection in (idle, talking, signed_in):
            await connection.close()


async def test_one_connection_over_the_limit_is_closed_at_once(
    strict_listener: protocol_listener.Listener,
) -> None:
    held = [
        await authenticated(strict_listener.port, "group-a", TOKENS["group-a"]) for _ in range(3)
    ]
    try:
        extra = await Connection.open(strict_listener.port)
        assert await extra.closed_by_peer()
        await extra.close()
        # Every held connection is still served, and a freed slot serves a new one.
        for connection in held:
            assert (await connection.call(api_versions_v3())).error_code == 0
        await held.pop().close()
        deadline = time.monotonic() + 10
        while True:
            again = await Connection.open(strict_listener.port)
            try:
                if (await again.call(api_versions_v3())).error_code == 0:
                    break
            except (AssertionError, ConnectionError, asyncio.IncompleteReadError):
                assert time.monotonic() < deadline, "the freed slot was not reused"
                await asyncio.sleep(0.1)
            finally:
                await again.close()
    finally:
        for connection in held:
            await connection.close()


async def test_more_groups_than_the_cap_close_the_connection(
    open_listener: protocol_listener.Listener,
) -> None:
    for request in (
        DescribeGroupsRequest(groups=("g",) * (CAP + 1), include_authorized_operations=False),
        DeleteGroupsRequest(groups_names=("g",) * (CAP + 1)),
        ConsumerGroupDescribeRequest(
            group_ids=("g",) * (CAP + 1), include_authorized_operations=False
        ),
        FindCoordinatorRequest(key_type=0, coordinator_keys=("g",) * (CAP + 1)),
        ListGroupsRequest(states_filter=("Stable",) * (CAP + 1), types_filter=()),
        OffsetFetchRequest(
            groups=(OffsetFetchRequestGroup(group_id="g", topics=None),) * (CAP + 1),
            require_stable=False,
        ),
    ):
        connection = await Connection.open(open_listener.port)
        try:
            await connection.send_raw(framing.encode_request(request, 1))
            assert await connection.closed_by_peer(), type(request).__name__
        finally:
            await connection.close()


async def test_each_distinct_group_is_answered_once_in_order(
    open_listener: protocol_listener.Listener,
) -> None:
    connection = await Connection.open(open_listener.port)
    try:
        names = ("b-dup", "a-dup", "b-dup", "c-dup", "a-dup")
        distinct = ["b-dup", "a-dup", "c-dup"]
        described = await connection.call(
            DescribeGroupsRequest(groups=names, include_authorized_operations=False)
        )
        assert [g.group_id for g in described.groups] == distinct
        deleted = await connection.call(DeleteGroupsRequest(groups_names=names))
        assert [r.group_id for r in deleted.results] == distinct
        consumer = await connection.call(
            ConsumerGroupDescribeRequest(group_ids=names, include_authorized_operations=False)
        )
        assert [g.group_id for g in consumer.groups] == distinct
        found = await connection.call(FindCoordinatorRequest(key_type=0, coordinator_keys=names))
        assert [c.key for c in found.coordinators] == distinct
        fetched = await connection.call(
            OffsetFetchRequest(
                groups=tuple(OffsetFetchRequestGroup(group_id=n, topics=None) for n in names),
                require_stable=False,
            )
        )
        assert [g.group_id for g in fetched.groups] == distinct
    finally:
        await connection.close()


async def test_a_request_of_10000_groups_is_answered_whole_in_batches(
    open_listener: protocol_listener.Listener,
) -> None:
    connection = await Connection.open(open_listener.port)
    try:
        names = tuple(f"batch-{i}" for i in range(CAP))
        described = await connection.call(
            DescribeGroupsRequest(groups=names, include_authorized_operations=False)
        )
        assert tuple(g.group_id for g in described.groups) == names
        assert {g.group_state for g in described.groups} == {"Dead"}
    finally:
        await connection.close()


async def test_the_largest_request_leaves_the_loop_free_for_others(
    broker: embedded.EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """On a ``kgo coordinator`` process: while it serves DescribeGroups of 10,000 groups (the
    most one request may name) and ListGroups, another connection's requests keep being
    answered: the longest wait of one is a fraction of the large request's time."""
    directory = tmp_path_factory.mktemp("stall")
    process = await served.coordinator(broker.bootstrap, directory, tokens=False)
    try:
        big = await Connection.open(process.port)
        probe = await Connection.open(process.port)
        try:
            names = tuple(f"stall-{i}" for i in range(CAP))
            request = DescribeGroupsRequest(groups=names, include_authorized_operations=False)
            await big.call(request)  # warm: every version's code compiled once
            # Sent and read as bytes: this process's own decoding must not delay the probes.
            frame = framing.encode_request(request, 99)
            waits: list[float] = []

            async def described() -> bytes | None:
                await big.send_raw(frame)
                return await big.read_raw()

            task = asyncio.create_task(described())
            started = time.perf_counter()
            while not task.done():
                sent = time.perf_counter()
                await probe.call(api_versions_v3())
                waits.append(time.perf_counter() - sent)
            took = time.perf_counter() - started
            payload = await task
            assert payload is not None
            _, response = framing.read_response(payload, framing.response_type(15, 5))
            assert len(response.groups) == CAP
            longest = max(waits)
            print(f"DescribeGroups of {CAP} groups: {took * 1000:.0f} ms; longest probe wait")
            print(f"{longest * 1000:.1f} ms over {len(waits)} probes")
            assert len(waits) >= 3
            assert longest < took / 3
        finally:
            await big.close()
            await probe.close()
    finally:
        process.stop()


async def test_a_client_pipelining_requests_lets_the_event_loop_run_between_them(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    """Requests already buffered are read without waiting, and a cheap one is answered without
    waiting either: a client that pipelines thousands would hold the event loop (every other
    client's heartbeats, and the stop on SIGTERM) until the last. The listener yields every
    ``YIELD_EVERY`` requests; counted in requests served between two turns of the loop, so
    the machine's speed does not matter."""
    served_calls = [0]
    api_versions = routes.ROUTES[framing.API_VERSIONS_KEY]

    async def counted(context: dispatch.RequestContext, body: object) -> object:
        served_calls[0] += 1
        return await api_versions.handler(context, body)

    table = {
        **routes.ROUTES,
        api_versions.api_key: dataclasses.replace(api_versions, handler=counted),
    }
    listener = protocol_listener.Listener(
        runtime, None, protocol_listener.ListenerConfig(port=0), table=table
    )
    await listener.start()
    requests = 5_000
    most_between_turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal most_between_turns
        seen = served_calls[0]
        while not stop.is_set():
            await asyncio.sleep(0)
            most_between_turns = max(most_between_turns, served_calls[0] - seen)
            seen = served_calls[0]

    connection = await Connection.open(listener.port)
    ticking = asyncio.create_task(ticker())
    try:
        connection.writer.write(
            b"".join(framing.encode_request(api_versions_v3(), n) for n in range(requests))
        )
        for _ in range(requests):
            assert await connection.read_raw() is not None
    finally:
        stop.set()
        await ticking
        await connection.close()
        await listener.stop()
    assert served_calls[0] == requests
    assert most_between_turns <= protocol_listener.YIELD_EVERY
