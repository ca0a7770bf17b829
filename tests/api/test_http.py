"""The member API over HTTP, served from the real runtime on the embedded broker.

Every reply, success or error, is checked against the schema the OpenAPI document declares
for it, so the document and the server cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import jsonschema
import kopf
import pytest
import pytest_asyncio
from aiohttp import test_utils
from confluent_kafka import admin as kafka_admin
from confluent_kafka import cimpl
from yarl import URL

from kafka_group_operator.access import tokens
from kafka_group_operator.api import app, openapi
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import lifecycle
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.runtime import topic as state_topic
from tests.runtime import logs
from tests.support import groups

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="module")]

DOCUMENT = openapi.document()
TOKENS = {"group-a": "token-a", "group-b": "token-b", "group-c": "token-c", "group-d": "token-d"}


def conforms(body: Any, schema: str) -> None:
    """Validate ``body`` against ``#/components/schemas/<schema>`` of the served document."""
    jsonschema.Draft202012Validator(
        {**DOCUMENT, "$ref": f"#/components/schemas/{schema}"}
    ).validate(body)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    client = kafka_admin.AdminClient({"bootstrap.servers": bootstrap})
    for future in client.create_topics([cimpl.NewTopic(name, partitions, 1)]).values():
        future.result(15)


@pytest.fixture(scope="module")
def topic(broker: embedded.EmbeddedBroker) -> str:
    name = f"api-orders-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, name, 3)
    return name


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def http(
    broker: embedded.EmbeddedBroker, topic: str
) -> AsyncIterator[test_utils.TestClient[Any, Any]]:
    runtime = coordinator_runtime.CoordinatorRuntime(
        coordinator_runtime.RuntimeConfig(
            bootstrap_servers=broker.bootstrap,
            topic=f"api-state-{uuid.uuid4().hex[:8]}",
            partitions=2,
            metadata_interval_ms=500,
        )
    )
    await runtime.start()
    client = test_utils.TestClient(
        test_utils.TestServer(app.build_app(runtime, tokens.GroupTokens(TOKENS)))
    )
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        await runtime.stop()


def auth(group: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[group]}"}


async def join(
    http: test_utils.TestClient[Any, Any], group: str, topic: str, instance: str | None = None
) -> dict[str, Any]:
    body = {
        "memberId": uuid.uuid4().hex,
        "memberEpoch": 0,
        "instanceId": instance,
        "subscribedTopicNames": [topic],
        "rebalanceTimeoutMs": 30000,
    }
    reply = await http.post(f"/v1/groups/{group}/heartbeat", json=body, headers=auth(group))
    answer: dict[str, Any] = await reply.json()
    assert reply.status == 200, answer
    conforms(answer, "HeartbeatResponse")
    return answer


async def test_the_document_is_served(http: test_utils.TestClient[Any, Any]) -> None:
    reply = await http.get("/openapi.json")
    assert reply.status == 200
    assert await reply.json() == DOCUMENT
    health = await http.get("/healthz")
    conforms(await health.json(), "Health")


async def test_join_commit_fetch_describe(
    http: test_utils.TestClient[Any, Any], topic: str
) -> None:
    joined = await join(http, "group-a", topic, instance="group-a-0")
    assert joined["memberEpoch"] > 0
    assert joined["assignment"] == {topic: [0, 1, 2]}

    commit = {
        "memberId": joined["memberId"],
        "memberEpoch": joined["memberEpoch"],
        "offsets": [{"topic": topic, "partition": 1, "offset": 42, "metadata": "m"}],
    }
    reply = await http.post("/v1/groups/group-a/offsets", json=commit, headers=auth("group-a"))
    committed = await reply.json()
    assert reply.status == 200, committed
    conforms(committed, "OffsetCommitResponse")
    assert committed == {"errors": []}

    reply = await http.get(
        f"/v1/groups/group-a/offsets?partition={topic}:1", headers=auth("group-a")
    )
    fetched = await reply.json()
    conforms(fetched, "OffsetFetchResponse")
    assert [(o["topic"], o["partition"], o["offset"]) for o in fetched["offsets"]] == [
        (topic, 1, 42)
    ]

    reply = await http.get("/v1/groups/group-a", headers=auth("group-a"))
    described = await reply.json()
    assert reply.status == 200, described
    conforms(described, "GroupDescription")
    assert [m["instanceId"] for m in described["members"]] == ["group-a-0"]
    assert described["members"][0]["memberEpoch"] == joined["memberEpoch"]


async def test_a_token_of_another_group_is_refused(
    http: test_utils.TestClient[Any, Any], topic: str
) -> None:
    body = {"memberId": "m", "memberEpoch": 0, "subscribedTopicNames": [topic]}
    reply = await http.post("/v1/groups/group-b/heartbeat", json=body, headers=auth("group-a"))
    error = await reply.json()
    assert reply.status == 403
    conforms(error, "Error")
    assert (error["error"], error["code"]) == ("GROUP_AUTHORIZATION_FAILED", 30)
    reply = await http.get("/v1/groups/group-b", headers=auth("group-a"))
    assert reply.status == 403
    reply = await http.get("/v1/groups/group-without-token", headers=auth("group-a"))
    assert reply.status == 403


async def test_a_missing_token_is_challenged(http: test_utils.TestClient[Any, Any]) -> None:
    reply = await http.post("/v1/groups/group-a/heartbeat", json={})
    assert reply.status == 401
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await reply.json())["error"] == "GROUP_AUTHORIZATION_FAILED"
    reply = await http.get("/v1/groups/group-a", headers={"Authorization": "Basic eDp5"})
    assert reply.status == 401


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be an object"),
        (b'{"memberId": "m"}', "missing field(s): memberEpoch"),
        (b'{"memberId": "m", "memberEpoch": "1"}', "must be an integer"),
        (b"\xff\xfe", "not valid JSON"),
        (b"", "not valid JSON"),
    ],
)
async def test_malformed_bodies_get_a_clear_400(
    http: test_utils.TestClient[Any, Any], data: bytes, complaint: str
) -> None:
    for path in ("/v1/groups/group-a/offsets", "/v1/groups/group-a/heartbeat"):
        reply = await http.post(path, data=data, headers=auth("group-a"))
        error = await reply.json()
        assert reply.status == 400, error
        conforms(error, "Error")
        assert (error["error"], error["code"]) == ("INVALID_REQUEST", 42)
    assert complaint in error["message"]  # the heartbeat's complaint


async def test_a_large_body_is_read_whole(
    http: test_utils.TestClient[Any, Any], topic: str
) -> None:
    """A body arrives in several pieces; all of them are read (JSON allows the padding)."""
    body = b'{"memberId": "large", "memberEpoch": 0, "subscribedTopicNames": ["%s"]' % (
        topic.encode()
    )
    data = body + b" " * (app.MAX_BODY_BYTES - len(body) - 1) + b"}"
    reply = await http.post("/v1/groups/group-d/heartbeat", data=data, headers=auth("group-d"))
    assert reply.status == 200, await reply.text()
    assert (await reply.json())["memberId"] == "large"
    # One byte more is refused.
    reply = await http.post(
        "/v1/groups/group-d/heartbeat", data=b" " + data, headers=auth("group-d")
    )
    error = await reply.json()
    assert (reply.status, error["error"]) == (400, "INVALID_REQUEST")
    assert "larger than" in error["message"]


async def test_an_oversized_body_is_refused(http: test_utils.TestClient[Any, Any]) -> None:
    data = b'{"memberId": "' + b"m" * (app.MAX_BODY_BYTES + 10) + b'"}'
    reply = await http.post("/v1/groups/group-a/heartbeat", data=data, headers=auth("group-a"))
    error = await reply.json()
    assert (reply.status, error["error"]) == (400, "INVALID_REQUEST")
    assert "larger than" in error["message"]


async def test_unknown_paths_and_methods_answer_in_the_error_shape(
    http: test_utils.TestClient[Any, Any],
) -> None:
    reply = await http.get("/v1/nothing-here")
    assert reply.status == 404
    conforms(await reply.json(), "Error")
    reply = await http.delete("/v1/groups/group-a/heartbeat", headers=auth("group-a"))
    assert reply.status == 405
    conforms(await reply.json(), "Error")


async def test_coordinator_errors_map_to_kafka_names_and_statuses(
    http: test_utils.TestClient[Any, Any], topic: str
) -> None:
    joined = await join(http, "group-b", topic)
    stale = {"memberId": joined["memberId"], "memberEpoch": joined["memberEpoch"] + 5}
    reply = await http.post("/v1/groups/group-b/heartbeat", json=stale, headers=auth("group-b"))
    error = await reply.json()
    assert (reply.status, error["error"], error["code"]) == (409, "FENCED_MEMBER_EPOCH", 110)
    conforms(error, "Error")

    unknown = {"memberId": "nobody", "memberEpoch": 3}
    reply = await http.post("/v1/groups/group-b/heartbeat", json=unknown, headers=auth("group-b"))
    error = await reply.json()
    assert (reply.status, error["error"], error["code"]) == (409, "UNKNOWN_MEMBER_ID", 25)

    commit = {
        "memberId": "nobody",
        "memberEpoch": 3,
        "offsets": [{"topic": topic, "partition": 0, "offset": 1}],
    }
    reply = await http.post("/v1/groups/group-b/offsets", json=commit, headers=auth("group-b"))
    error = await reply.json()
    assert (reply.status, error["error"]) == (409, "UNKNOWN_MEMBER_ID"), error


async def test_an_unknown_group_is_404(http: test_utils.TestClient[Any, Any]) -> None:
    unauthenticated = test_utils.TestClient(
        test_utils.TestServer(app.build_app(http.app[app.COORDINATOR_KEY], None))
    )
    await unauthenticated.start_server()
    try:
        reply = await unauthenticated.get("/v1/groups/never-seen")
        error = await reply.json()
        assert (reply.status, error["error"], error["code"]) == (404, "GROUP_ID_NOT_FOUND", 69)
        conforms(error, "Error")
    finally:
        await unauthenticated.close()


@contextlib.asynccontextmanager
async def _loading_behind_a_frozen_broker() -> AsyncIterator[
    tuple[coordinator_runtime.CoordinatorRuntime, test_utils.TestClient[Any, Any], Any]
]:
    """A runtime whose load a frozen broker (SIGSTOP) holds back, its API, and the broker's
    process (SIGCONT it to let the load end)."""
    with embedded.running_broker() as own:
        runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=own.bootstrap, partitions=1, wait_until_loaded=False
            )
        )
        client = test_utils.TestClient(test_utils.TestServer(app.build_app(runtime, None)))
        await client.start_server()
        assert own.process is not None
        try:
            await runtime.start()
            os.kill(own.process.pid, signal.SIGSTOP)
            try:
                yield runtime, client, own.process
            finally:
                os.kill(own.process.pid, signal.SIGCONT)
        finally:
            await client.close()
            await runtime.stop()


_JOIN = {"memberId": "m", "memberEpoch": 0, "subscribedTopicNames": ["t"]}


async def test_a_request_met_by_a_load_is_answered_when_the_load_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held, not refused: a member backing off a second between retries would otherwise wait
    for its next attempt after the load."""
    monkeypatch.setattr(app, "LOAD_WAIT_S", 30.0)
    async with _loading_behind_a_frozen_broker() as (_, client, broker):
        join = asyncio.create_task(client.post("/v1/groups/g/heartbeat", json=_JOIN))
        await asyncio.sleep(1.0)
        assert not join.done()  # held while the load cannot end
        os.kill(broker.pid, signal.SIGCONT)
        reply = await asyncio.wait_for(join, 60)
        body = await reply.json()
        assert reply.status == 200, body
        assert body["memberEpoch"] >= 1


async def test_503_while_the_state_loads() -> None:
    """A frozen broker holds the load back; the API answers 503 until it completes."""
    async with _loading_behind_a_frozen_broker() as (runtime, client, broker):
        reply = await client.post("/v1/groups/g/heartbeat", json=_JOIN)
        error = await reply.json()
        assert (reply.status, error["error"], error["code"]) == (
            503,
            "COORDINATOR_LOAD_IN_PROGRESS",
            14,
        )
        assert reply.headers["Retry-After"] == "1"
        conforms(error, "Error")
        os.kill(broker.pid, signal.SIGCONT)
        await runtime.wait_until_loaded()
        reply = await client.get("/v1/groups/g")
        assert reply.status == 404


# Raw bodies (a JSON "\ud800" escape is valid JSON) and queries that used to reach the
# coordinator or raise inside the API: each must be a plain 400 INVALID_REQUEST.
HOSTILE: list[tuple[str, str, bytes]] = [
    ("POST", "/heartbeat", b'{"memberId": "m\\ud800", "memberEpoch": 0}'),
    ("POST", "/heartbeat", b'{"memberId": "m", "memberEpoch": 0, "instanceId": "i\\udfff"}'),
    ("POST", "/heartbeat", b'{"memberId": "m\xed\xa0\x80", "memberEpoch": 0}'),
    (
        "POST",
        "/heartbeat",
        b'{"memberId": "m", "memberEpoch": 0, "subscribedTopicNames": ["t\\ud800"]}',
    ),
    (
        "POST",
        "/offsets",
        b'{"memberId": "", "memberEpoch": -1, "offsets": '
        b'[{"topic": "t", "partition": 0, "offset": 1, "metadata": "x\\ud800"}]}',
    ),
    ("POST", "/heartbeat", b"[" * 100_000),
    ("POST", "/heartbeat", b'{"memberId": "m", "memberEpoch": 1e999999999}'),
    ("GET", "/offsets?partition=t:%C2%B2", b""),  # "t:²"
    ("GET", "/offsets?partition=t:" + "9" * 5_000, b""),
    ("GET", "/offsets?partition=t:2147483648", b""),
    ("GET", "/offsets?memberId=m&memberEpoch=%D9%A3", b""),  # "٣", an Arabic-Indic 3
]


@pytest.mark.parametrize(("method", "path", "data"), HOSTILE)
async def test_hostile_input_is_a_400_and_every_partition_keeps_serving(
    http: test_utils.TestClient[Any, Any], topic: str, method: str, path: str, data: bytes
) -> None:
    runtime = http.app[app.COORDINATOR_KEY]
    assert isinstance(runtime, coordinator_runtime.CoordinatorRuntime)
    # group-a and group-b live on different state partitions: each must keep serving.
    assert {runtime.partition_of("group-a"), runtime.partition_of("group-b")} == {0, 1}
    for group in ("group-a", "group-b"):
        reply = await http.request(
            method,
            URL(f"/v1/groups/{group}{path}", encoded=True),
            data=data or None,
            headers=auth(group),
        )
        error = await reply.json()
        assert (reply.status, error["error"], error["code"]) == (400, "INVALID_REQUEST", 42)
        conforms(error, "Error")
        # The complaint names the field; no internal exception text leaks out.
        assert error["message"].startswith(("field '", "body is not valid JSON")), error
        assert "internal" not in error["message"]
        assert "codec" not in error["message"]
        await asyncio.wait_for(join(http, group, topic), 30)


async def test_the_documented_minimum_and_integral_numbers_are_served(
    http: test_utils.TestClient[Any, Any], topic: str
) -> None:
    """The coordinator refuses a rebalance timeout of 0, so the document's minimum is 1; and
    JSON Schema's integer, which the document declares, includes 30000.0."""
    heartbeat = DOCUMENT["components"]["schemas"]["HeartbeatRequest"]["properties"]
    minimum = heartbeat["rebalanceTimeoutMs"]["minimum"]
    body = (
        b'{"memberId": "integral", "memberEpoch": 0.0, "subscribedTopicNames": ["%s"], '
        b'"rebalanceTimeoutMs": %d}' % (topic.encode(), minimum)
    )
    reply = await http.post("/v1/groups/group-c/heartbeat", data=body, headers=auth("group-c"))
    joined = await reply.json()
    assert reply.status == 200, joined
    conforms(joined, "HeartbeatResponse")
    commit = (
        b'{"memberId": "integral", "memberEpoch": %d.0, "offsets": '
        b'[{"topic": "%s", "partition": 2.0, "offset": 1e3}]}'
        % (joined["memberEpoch"], topic.encode())
    )
    reply = await http.post("/v1/groups/group-c/offsets", data=commit, headers=auth("group-c"))
    assert (reply.status, await reply.json()) == (200, {"errors": []})
    reply = await http.get(
        f"/v1/groups/group-c/offsets?partition={topic}:2", headers=auth("group-c")
    )
    assert [o["offset"] for o in (await reply.json())["offsets"]] == [1000]


async def test_a_405_names_the_allowed_methods(http: test_utils.TestClient[Any, Any]) -> None:
    """RFC 9110: a 405 carries Allow; it lists the documented methods (GET implies HEAD)."""
    for template, item in DOCUMENT["paths"].items():
        path = template.replace("{group}", "group-a")
        documented = {method.upper() for method in item if method != "parameters"}
        allowed = documented | ({"HEAD"} if "GET" in documented else set())
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - documented:
            reply = await http.request(method, path, headers=auth("group-a"))
            assert reply.status == 405, (method, path)
            assert set(reply.headers["Allow"].split(",")) == allowed, (method, path)
            conforms(await reply.json(), "Error")


async def test_healthz_fails_while_a_state_partition_cannot_serve(
    broker: embedded.EmbeddedBroker,
) -> None:
    """Kubernetes restarts the pod on a failing liveness probe; the reply names the partitions."""
    name = logs.unique_topic()
    admin = kafka_admin.AdminClient({"bootstrap.servers": broker.bootstrap})
    state_topic.ensure_state_topic(admin, state_topic.TopicSettings(name, 2, 1, 1), 10)
    # An offset-commit key (version 1) whose value is cut short: partition 1 can never load.
    logs.produce(broker.bootstrap, name, 1, [(b"\x00\x01\x00\x09g", b"\x00\x03")])
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=broker.bootstrap, topic=name, partitions=2
    )
    async with groups.running(config) as runtime:
        client = test_utils.TestClient(test_utils.TestServer(app.build_app(runtime, None)))
        await client.start_server()
        try:
            reply = await client.get("/healthz")
            health = await reply.json()
            assert reply.status == 503
            assert health == {"status": "unhealthy", "unhealthyPartitions": [1]}
            conforms(health, "Health")
        finally:
            await client.close()
        # The chart's liveness probe is kopf's, which fails too (kopf answers it with a 500).
        slot = lifecycle._Slot(
            state=cast(lifecycle.OperatorState, SimpleNamespace(runtime=runtime))
        )
        with pytest.raises(kopf.PermanentError, match=r"state partitions \[1\]"):
            lifecycle.coordinator_probe({lifecycle.SLOT_KEY: slot})


@pytest.mark.parametrize("token", [b"\xff\xfe", b"t\xed\xa0\x80", b"\xc3\xa9"])
async def test_a_token_that_is_not_utf8_is_refused(
    http: test_utils.TestClient[Any, Any], token: bytes
) -> None:
    """Header bytes that are not UTF-8 reach the API as lone surrogates: a 403, never a 500."""
    url = http.make_url("/v1/groups/group-a")
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(
            b"GET /v1/groups/group-a HTTP/1.1\r\nHost: coordinator\r\nConnection: close\r\n"
            b"Authorization: Bearer " + token + b"\r\n\r\n"
        )
        await writer.drain()
        head, _, body = (await reader.read()).partition(b"\r\n\r\n")
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 403 "), head
    error = json.loads(body)
    conforms(error, "Error")
    assert error["error"] == "GROUP_AUTHORIZATION_FAILED"
