"""Discovery: partition-set and peers-map specs, and the member API naming a group's
coordinator (in NOT_COORDINATOR answers and at ``GET /v1/groups/{group}/coordinator``), served
by two real runtimes that split one state topic on the embedded broker."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
import pytest_asyncio
from aiohttp import test_utils, web

from kafka_group_operator.access import discovery, tokens
from kafka_group_operator.api import app, openapi
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import client as member_client
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning
from tests.support import groups

DOCUMENT = openapi.document()
PARTITIONS = 2
PORTS = {
    name: embedded.free_port() for name in (0, 1, "stale", "loop-a", "loop-b", "moving", "pointing")
}
URLS = {p: f"http://127.0.0.1:{PORTS[p]}" for p in (0, 1)}
# Nothing listens there: a peers map naming a coordinator that is gone.
GONE = f"http://127.0.0.1:{embedded.free_port()}"
# The peers map of "pointing" (a test changes whom it names, as the Lease watch would).
POINTING: dict[int, str] = {}


def conforms(body: Any, schema: str) -> None:
    jsonschema.Draft202012Validator(
        {**DOCUMENT, "$ref": f"#/components/schemas/{schema}"}
    ).validate(body)


def _group_on(partition: int) -> str:
    index = 0
    while partitioning.partition_for(f"group-{index}", PARTITIONS) != partition:
        index += 1
    return f"group-{index}"


# ------------------------------------------------------------------------------ the specs


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0-24", set(range(25))),
        ("0-2,30", {0, 1, 2, 30}),
        (" 7 ", {7}),
        ("3-3,1", {1, 3}),
        ("0-4,2-6", set(range(7))),
    ],
)
def test_partition_sets_are_numbers_and_inclusive_ranges(spec: str, expected: set[int]) -> None:
    assert discovery.parse_partition_set(spec) == expected
    assert discovery.parse_partition_set(discovery.format_partition_set(expected)) == expected


def test_a_partition_set_is_formatted_with_ranges_merged() -> None:
    assert discovery.format_partition_set({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert discovery.format_partition_set(set()) == ""


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", r"'' is not a partition number"),
        ("0-", r"'0-' is not a partition number"),
        ("a", r"'a' is not a partition number"),
        ("5-2", r"'5-2' is not a range of partitions"),
        ("-1", r"'-1' is not a partition number"),
        ("1,,2", r"'' is not a partition number"),
    ],
)
def test_a_malformed_partition_set_is_refused_by_name(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        discovery.parse_partition_set(spec)


def test_peers_map_sets_to_urls() -> None:
    assert discovery.parse_peers("0-1+4=http://a:8080/,2-3=https://b") == {
        0: "http://a:8080",
        1: "http://a:8080",
        4: "http://a:8080",
        2: "https://b",
        3: "https://b",
    }
    with pytest.raises(ValueError, match="is not PARTITIONS=URL"):
        discovery.parse_peers("0-1")
    with pytest.raises(ValueError, match="is not an http"):
        discovery.parse_peers("0=ftp://a")
    with pytest.raises(ValueError, match="partition 1 is given to http://a and http://b"):
        discovery.parse_peers("0-1=http://a,1=http://b")


def test_a_directory_refuses_partitions_outside_the_topic_and_clashing_urls() -> None:
    with pytest.raises(ValueError, match="partitions 2 are outside"):
        discovery.Directory(2, frozenset({2}))
    with pytest.raises(ValueError, match="partitions 5 are outside"):
        discovery.Directory(2, None, None, {5: "http://a"})
    with pytest.raises(ValueError, match="partitions 0 are served here, but the peers map"):
        discovery.Directory(2, frozenset({0}), "http://me", {0: "http://other"})
    # One peers map for every process may name this one too.
    shared = discovery.Directory(2, frozenset({0}), "http://me", {0: "http://me", 1: "http://b"})
    assert shared.owner(_group_on(1)) == discovery.Owner(1, "http://b", False)
    assert shared.owner(_group_on(0)) == discovery.Owner(0, "http://me", True)


# ------------------------------------------------------------------------------ over HTTP

Clients = dict[int | str, test_utils.TestClient[Any, Any]]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def coordinators(broker: embedded.EmbeddedBroker) -> AsyncIterator[Clients]:
    """Coordinator ``p`` serves state partition ``p`` at ``URLS[p]``, knowing the other.
    ``"stale"`` serves partition 0 too (the same runtime) with a peers map naming ``GONE`` for
    partition 1; ``"silent"`` serves partition 0 with no peers map; ``"loop-a"`` and
    ``"loop-b"`` serve partition 0 and each names the other for partition 1; ``"moving"``
    serves partition 1 too, and ``"pointing"`` serves partition 0 naming ``POINTING[1]``
    (``"moving"`` at first) for partition 1."""
    name = f"discovery-state-{uuid.uuid4().hex[:8]}"
    token_store = tokens.GroupTokens({_group_on(0): "t0", _group_on(1): "t1"})
    async with contextlib.AsyncExitStack() as stack:
        clients: Clients = {}
        for partition in range(PARTITIONS):
            config = coordinator_runtime.RuntimeConfig(
                bootstrap_servers=broker.bootstrap,
                topic=name,
                partitions=PARTITIONS,
                served_partitions=frozenset({partition}),
            )
            runtime = await stack.enter_async_context(groups.running(config))
            directory = discovery.Directory(
                PARTITIONS, frozenset({partition}), URLS[partition], URLS
            )
            clients[partition] = await _serve(
                stack, app.build_app(runtime, token_store, directory), PORTS[partition]
            )
            if partition == 0:
                stale = discovery.Directory(PARTITIONS, frozenset({0}), None, {1: GONE})
                clients["stale"] = await _serve(
                    stack, app.build_app(runtime, token_store, stale), PORTS["stale"]
                )
                for name, other in (("loop-a", "loop-b"), ("loop-b", "loop-a")):
                    loop = discovery.Directory(PARTITIONS, frozenset({0}), None, {1: _url(other)})
                    clients[name] = await _serve(
                        stack, app.build_app(runtime, token_store, loop), PORTS[name]
                    )
                POINTING[1] = _url("moving")
                pointing = discovery.Directory(PARTITIONS, frozenset({0}), None, POINTING)
                clients["pointing"] = await _serve(
                    stack, app.build_app(runtime, token_store, pointing), PORTS["pointing"]
                )
                silent = discovery.Directory(PARTITIONS, frozenset({0}))
                clients["silent"] = await _serve(
                    stack, app.build_app(runtime, token_store, silent), embedded.free_port()
                )
            if partition == 1:
                moving = discovery.Directory(PARTITIONS, frozenset({1}), _url("moving"))
                clients["moving"] = await _serve(
                    stack, app.build_app(runtime, token_store, moving), PORTS["moving"]
                )
        yield clients


def _url(name: int | str) -> str:
    return f"http://127.0.0.1:{PORTS[name]}"


async def _serve(
    stack: contextlib.AsyncExitStack, application: web.Application, port: int
) -> test_utils.TestClient[Any, Any]:
    client = test_utils.TestClient(test_utils.TestServer(application, port=port))
    await client.start_server()
    stack.push_async_callback(client.close)
    return client


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="module")
async def test_not_coordinator_names_the_groups_coordinator(coordinators: Clients) -> None:
    for partition, other in ((0, 1), (1, 0)):
        group = _group_on(partition)
        token = {"Authorization": f"Bearer t{partition}"}
        body = {"memberId": "m-1", "memberEpoch": 0, "subscribedTopicNames": ["t"]}
        wrong = await coordinators[other].post(
            f"/v1/groups/{group}/heartbeat", json=body, headers=token
        )
        assert wrong.status == 503
        error = await wrong.json()
        conforms(error, "Error")
        # NOT_COORDINATOR is Kafka's error 16 (Errors.java: NOT_COORDINATOR(16, ...)).
        assert (error["error"], error["code"]) == ("NOT_COORDINATOR", 16)
        assert error["coordinator"] == {"partition": partition, "url": URLS[partition]}
        right = await coordinators[partition].post(
            f"/v1/groups/{group}/heartbeat", json=body, headers=token
        )
        assert right.status == 200, await right.text()
        # Other errors carry no hint.
        malformed = await coordinators[partition].post(
            f"/v1/groups/{group}/heartbeat", json={}, headers=token
        )
        assert malformed.status == 400
        assert "coordinator" not in await malformed.json()


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="module")
async def test_find_coordinator_answers_from_any_coordinator(coordinators: Clients) -> None:
    for partition in range(PARTITIONS):
        group = _group_on(partition)
        for asked in range(PARTITIONS):
            reply = await coordinators[asked].get(
                f"/v1/groups/{group}/coordinator",
                headers={"Authorization": f"Bearer t{partition}"},
            )
            assert reply.status == 200
            found = await reply.json()
            conforms(found, "Coordinator")
            assert found == {
                "partition": partition,
                "url": URLS[partition],
                "self": asked == partition,
            }
        # Authenticated like every group route.
        refused = await coordinators[0].get(f"/v1/groups/{group}/coordinator")
        assert refused.status == 401


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="module")
async def test_the_member_client_follows_the_hint_until_the_next(coordinators: Clients) -> None:
    group = _group_on(1)
    follower = member_client.CoordinatorClient(URLS[0], group, "t1")
    try:
        # Sent on to the coordinator named, which answers (a group without commits: none).
        assert await asyncio.to_thread(follower.fetch) == {}
        assert follower.coordinator_url == URLS[1]
        for _ in range(3):
            assert await asyncio.to_thread(follower.fetch) == {}
        assert follower.coordinator_url == URLS[1]
    finally:
        follower.close()


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="module")
async def test_the_member_client_asks_its_configured_url_again(coordinators: Clients) -> None:
    group = _group_on(1)
    follower = member_client.CoordinatorClient(_url("stale"), group, "t1", timeout_s=5)
    try:
        # Named, but gone: the request fails, and the next one asks the configured URL again.
        for _ in range(2):
            with pytest.raises(member_client.CoordinatorUnreachable):
                await asyncio.to_thread(follower.fetch)
            assert follower.coordinator_url == _url("stale")
    finally:
        follower.close()
    # Two coordinators naming each other: the client hops once, then raises (retriable).
    looping = member_client.CoordinatorClient(_url("loop-a"), group, "t1")
    try:
        with pytest.raises(member_client.CoordinatorMoved) as moved:
            await asyncio.to_thread(looping.fetch)
        assert moved.value.name == "NOT_COORDINATOR"
        assert moved.value.retriable
        assert looping.coordinator_url == _url("loop-a")
    finally:
        looping.close()
    # A NOT_COORDINATOR naming nobody leaves the client where it is.
    silent = coordinators["silent"]
    silent_url = f"http://127.0.0.1:{silent.port}"
    stuck = member_client.CoordinatorClient(silent_url, group, "t1")
    try:
        with pytest.raises(errors.NotCoordinator) as refused:
            await asyncio.to_thread(stuck.fetch)
        assert not isinstance(refused.value, member_client.CoordinatorMoved)
        assert stuck.coordinator_url == silent_url
    finally:
        stuck.close()


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="module")
async def test_a_followed_coordinator_that_stopped_is_left_within_the_call(
    coordinators: Clients,
) -> None:
    """A rolling restart: the coordinator a member follows hands the group over and stops
    listening; the member's next call reaches the new one through its configured URL, without
    an error (the refused request was never sent)."""
    group = _group_on(1)
    follower = member_client.CoordinatorClient(_url("pointing"), group, "t1")
    try:
        assert await asyncio.to_thread(follower.fetch) == {}
        assert follower.coordinator_url == _url("moving")
        POINTING[1] = URLS[1]
        await coordinators["moving"].close()
        assert await asyncio.to_thread(follower.fetch) == {}
        assert follower.coordinator_url == URLS[1]
    finally:
        follower.close()
