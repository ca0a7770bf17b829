"""Fuzzing the member API on a real coordinator (the runtime on the embedded broker).

Two fuzzers, one server:

- schemathesis (its own runner, ``st run``) generates requests from the OpenAPI document the
  server serves, valid and invalid ones, in both of the server's modes (with group tokens and
  without), and runs all of its checks on every reply: no 5xx, declared status, content
  type, headers and body schema, invalid data rejected, valid data accepted, undocumented
  methods and missing headers refused, authentication not ignored;
- hypothesis sends arbitrary JSON, bytes and Unicode (lone surrogates included) as bodies,
  group names and query values.

Neither may ever get a 5xx, and afterwards every state partition still serves: a member of
a group on each partition joins, commits and fetches its offset back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import subprocess
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_group_operator.access import tokens
from kafka_group_operator.api import app, openapi
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_records import partitioning
from tests.support import groups, topics

pytestmark = [pytest.mark.broker]

PARTITIONS = 3
T = TypeVar("T")


def group_on(partition: int, prefix: str) -> str:
    """A group id whose state lives in state partition ``partition``."""
    index = 0
    while partitioning.partition_for(f"{prefix}-{index}", PARTITIONS) != partition:
        index += 1
    return f"{prefix}-{index}"


# One group with a token on each state partition.
DOCUMENTED = [group_on(partition, "documented") for partition in range(PARTITIONS)]
TOKENS = {group: f"token-{group}" for group in DOCUMENTED}


def auth(group: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[group]}"}


@dataclass
class Served:
    """The member API on loopback ports, its runtime, and the event loop they run on."""

    base_url: str  # with the DOCUMENTED groups' tokens
    open_url: str  # without authentication, so that any group name reaches the coordinator
    runtime: coordinator_runtime.CoordinatorRuntime
    loop: asyncio.AbstractEventLoop

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


@pytest.fixture(scope="module")
def served(broker: embedded.EmbeddedBroker) -> Iterator[Served]:
    """A real runtime behind the real app, on a thread of their own so that the fuzzers'
    synchronous HTTP clients can call it: once with the ``DOCUMENTED`` groups' tokens (any
    other group is refused), once without authentication."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="member-api", daemon=True)
    thread.start()
    stack = contextlib.AsyncExitStack()
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=broker.bootstrap,
        topic=f"fuzz-state-{uuid.uuid4().hex[:8]}",
        partitions=PARTITIONS,
        metadata_interval_ms=500,
    )

    async def serve(api: web.Application) -> str:
        runner = web.AppRunner(api)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def start() -> Served:
        runtime = await stack.enter_async_context(groups.running(config))
        with_tokens = await serve(app.build_app(runtime, tokens.GroupTokens(TOKENS)))
        without = await serve(app.build_app(runtime, None))
        return Served(with_tokens, without, runtime, loop)

    try:
        yield asyncio.run_coroutine_threadsafe(start(), loop).result(90)
    finally:
        asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def topic(broker: embedded.EmbeddedBroker) -> str:
    return topics.create_topic(broker.bootstrap, 4)


def assert_every_partition_serves(served: Served, topic: str) -> None:
    """On each state partition a new group's member joins, commits and reads it back."""
    for url in (served.base_url, served.open_url):
        health = requests.get(f"{url}/healthz", timeout=30)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
    prefix = f"after-{uuid.uuid4().hex[:8]}"
    for partition in range(PARTITIONS):
        url = f"{served.open_url}/v1/groups/{group_on(partition, prefix)}"
        heartbeat = {
            "memberId": uuid.uuid4().hex,
            "memberEpoch": 0,
            "subscribedTopicNames": [topic],
            "rebalanceTimeoutMs": 30_000,
        }
        joined = requests.post(f"{url}/heartbeat", json=heartbeat, timeout=30)
        assert joined.status_code == 200, joined.text
        member = joined.json()
        # The only member: it owns every partition of the topic.
        assert member["assignment"] == {topic: [0, 1, 2, 3]}, member
        commit = {
            "memberId": member["memberId"],
            "memberEpoch": member["memberEpoch"],
            "offsets": [{"topic": topic, "partition": 3, "offset": 7 + partition}],
        }
        committed = requests.post(f"{url}/offsets", json=commit, timeout=30)
        assert (committed.status_code, committed.json()) == (200, {"errors": []})
        fetched = requests.get(f"{url}/offsets", params={"partition": f"{topic}:3"}, timeout=30)
        assert fetched.status_code == 200, fetched.text
        assert [o["offset"] for o in fetched.json()["offsets"]] == [7 + partition]


# --------------------------------------------------------------------------- schemathesis

# Every documented operation is tested, but the document's own (schemathesis leaves out the
# route its schema comes from).
OPERATIONS = (
    sum(
        1
        for item in openapi.document()["paths"].values()
        for method in item
        if method != "parameters"
    )
    - 1
)
# Cases per operation and phase; about a thousand cases in each mode.
SCHEMATHESIS_EXAMPLES = 150
MIN_CASES_PER_MODE = 1_000


def schemathesis_run(
    base_url: str, report: Path, config: Path | None = None, token: str | None = None
) -> subprocess.Popen[str]:
    """``st run`` (schemathesis's own runner, as a user runs it) with every check, all its
    phases and both generation modes, against the document the server at ``base_url``
    serves. One worker: the CPython these tests run on cannot parse generated code in
    several threads at once (hypothesis does, describing its strategies)."""
    command = [
        str(Path(sys.executable).parent / "st"),
        "--no-color",
        *(["--config-file", str(config)] if config is not None else []),
        "run",
        f"{base_url}/openapi.json",
        "--checks", "all",
        "--mode", "all",
        "--max-examples", str(SCHEMATHESIS_EXAMPLES),
        "--workers", "1",
        "--seed", "23",
        "--generation-database", "none",
        "--request-timeout", "30",
        "--report", "json",
        "--report-json-path", str(report),
        *(["--header", f"Authorization: Bearer {token}"] if token else []),
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_schemathesis_with_all_checks_finds_the_document_and_the_server_agree(
    served: Served, topic: str, tmp_path: Path
) -> None:
    """Both modes, at once: without tokens (any group, the document declares no security)
    and with them (the first documented group, with its token; schemathesis also sends
    requests without it, which must be refused). Every check: no 5xx, statuses, content
    types, headers and bodies as documented, invalid data rejected, valid data accepted,
    missing headers and undocumented methods refused, authentication not ignored."""
    group = DOCUMENTED[0]
    config = tmp_path / "schemathesis.toml"
    config.write_text(f'[parameters]\n"path.group" = "{group}"\n')
    runs = {
        "without tokens": (
            schemathesis_run(served.open_url, tmp_path / "open.json"),
            tmp_path / "open.json",
        ),
        "with tokens": (
            schemathesis_run(served.base_url, tmp_path / "tokens.json", config, TOKENS[group]),
            tmp_path / "tokens.json",
        ),
    }
    generated = {}
    for mode, (process, report_path) in runs.items():
        output, _ = process.communicate(timeout=600)
        report = json.loads(report_path.read_text())
        assert (process.returncode, report["failures"], report["errors"]) == (0, [], []), (
            f"{mode}:\n{output[-6000:]}"
        )
        assert report["complete"], mode
        assert "--checks all" in report["command"], mode
        assert report["operations"]["tested"] == OPERATIONS, mode
        generated[mode] = report["test_cases"]["generated"]
        print(f"schemathesis, {mode}: {generated[mode]} cases, {report['running_time']:.0f} s")
        assert generated[mode] >= MIN_CASES_PER_MODE, (mode, generated)
    assert sum(generated.values()) >= 2 * MIN_CASES_PER_MODE
    assert_every_partition_serves(served, topic)


# ------------------------------------------------------------------------------ hypothesis

# Any code point, lone surrogates included (hypothesis leaves them out unless asked).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)
# Values the decoders have tripped on.
NASTY_TEXT = st.sampled_from(
    ["m\ud800", "\udfff", "²", "٣", " 1", "+1", "1_0", "9" * 5_000, "", "t:", ":1", "t:²"]
)
# Mostly well-formed text (so that many requests get past decoding), else the two above.
TEXT = st.one_of(st.text(max_size=20), st.text(max_size=20), ANY_TEXT, NASTY_TEXT)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, -2, 2**31, 2**63, 5.0, 5.5, 1e300, 10**4_000]),
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
SMALL = st.one_of(st.sampled_from([0, -1, -2, 1]), st.integers(0, 5), NUMBERS)
# Near-valid bodies: the real fields, with small numbers and arbitrary text, so that many get
# past decoding into the coordinator (an administrative commit writes records at once).
HEARTBEATS = st.fixed_dictionaries(
    {"memberId": TEXT, "memberEpoch": SMALL},
    optional={
        "instanceId": st.none() | TEXT,
        "rack": st.none() | TEXT,
        "rebalanceTimeoutMs": st.just(30_000) | NUMBERS,
        "subscribedTopicNames": st.lists(TEXT, max_size=3),
        "serverAssignor": st.sampled_from(["uniform", "range", "cooperative-sticky"]) | TEXT,
        "ownedPartitions": st.dictionaries(TEXT, st.lists(SMALL, max_size=3), max_size=2),
        "clientId": TEXT,
    },
)
COMMITS = st.fixed_dictionaries(
    {
        "memberId": st.just("") | TEXT,
        "memberEpoch": st.just(-1) | SMALL,
        "offsets": st.lists(
            st.fixed_dictionaries(
                {"topic": TEXT, "partition": SMALL, "offset": SMALL},
                optional={"metadata": TEXT, "leaderEpoch": SMALL},
            ),
            min_size=1,
            max_size=3,
        ),
    }
)


def raw(bodies: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """A body as sent: JSON (with "\\ud800"-style escapes and NaN), a deep nest, or bytes."""
    return st.one_of(
        bodies.map(lambda body: json.dumps(body).encode()),
        JSON.map(lambda body: json.dumps(body).encode()),
        st.integers(1, 200_000).map(lambda depth: b"[" * depth + b"]" * (depth % 3)),
        # Numbers as written, past what a float or a Decimal holds.
        st.one_of(
            st.from_regex(rb"\A-?[0-9]{1,30}(\.[0-9]{1,5})?([eE][+-]?[0-9]{1,5})?\Z"),
            st.builds(
                lambda mantissa, exponent: b"%de%d" % (mantissa, exponent),
                st.integers(-(10**6), 10**6),
                st.integers(-(10**25), 10**25),
            ),
        ).map(lambda number: b'{"memberId": "m", "memberEpoch": %s}' % number),
        st.binary(max_size=64),
    )


ROUTES = {
    ("POST", "/heartbeat"): raw(HEARTBEATS),
    ("POST", "/offsets"): raw(COMMITS),
    ("GET", "/offsets"): st.none(),
    ("GET", ""): st.none(),
}
QUERIES = st.lists(
    st.tuples(st.sampled_from(["partition", "memberId", "memberEpoch", "x"]), TEXT),
    max_size=4,
)
HOSTILE_CASES = 1_000


def quote(text: str) -> str:
    """Percent-encoded UTF-8, lone surrogates as their (invalid) three bytes."""
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


# Header bytes, any but the line breaks and NUL that end or break a header line.
HEADER_BYTES = st.binary(max_size=40).map(
    lambda value: value.translate(None, b"\r\n\0").strip() or b"x"
)


@st.composite
def requests_to_the_api(draw: st.DrawFn) -> tuple[str, str, bytes | None, dict[str, Any]]:
    """(method, path and query, body, headers) of a request to a member API route. A request
    with an Authorization header goes to the server with tokens, others to the open one."""
    headers: dict[str, Any] = {"Content-Type": "application/json"}
    group = draw(st.sampled_from(["a", "b", "c", *DOCUMENTED]) | TEXT.filter(bool))
    method, route = draw(st.sampled_from(sorted(ROUTES)))
    query = "&".join(f"{quote(key)}={quote(value)}" for key, value in draw(QUERIES))
    body = draw(ROUTES[method, route])
    authorization = draw(
        st.none()
        | st.just(f"Bearer {TOKENS.get(group, 'none')}".encode())
        | HEADER_BYTES.map(lambda token: b"Bearer " + token)
        | HEADER_BYTES
    )
    if authorization is not None:
        headers["Authorization"] = authorization
    return method, f"/v1/groups/{quote(group)}{route}?{query}", body, headers


def test_arbitrary_json_and_unicode_never_get_a_5xx(served: Served, topic: str) -> None:
    session = requests.Session()
    statuses: collections.Counter[int] = collections.Counter()

    @settings(
        max_examples=HOSTILE_CASES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=requests_to_the_api())
    def send(request: tuple[str, str, bytes | None, dict[str, Any]]) -> None:
        method, target, body, headers = request
        url = served.base_url if "Authorization" in headers else served.open_url
        reply = session.request(method, url + target, data=body, headers=headers, timeout=30)
        statuses[reply.status_code] += 1
        assert reply.status_code < 500, (reply.status_code, reply.text)
        if reply.status_code >= 400 and reply.headers["Content-Type"].startswith(
            "application/json"
        ):
            error = reply.json()
            assert error["error"] in errors.BY_NAME, error

    send()
    # The fuzzing got through to the coordinator, not only to the decoders' first checks.
    assert statuses[200] > 0, statuses
    assert statuses[400] > 0, statuses
    assert_every_partition_serves(served, topic)
