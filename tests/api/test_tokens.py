"""Per-group tokens: a group's token works for that group only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from aiohttp import test_utils

from kafka_group_operator.access import tokens
from kafka_group_operator.api import app
from kafka_group_operator.coordinator import errors
from kafka_group_operator.runtime import coordinator_runtime


def test_a_token_is_valid_for_its_own_group_only() -> None:
    store = tokens.GroupTokens({"a": "token-a", "b": "token-b"})
    tokens.authorize(store, "a", "token-a")
    with pytest.raises(errors.GroupAuthorizationFailed):
        tokens.authorize(store, "b", "token-a")
    with pytest.raises(errors.GroupAuthorizationFailed):
        tokens.authorize(store, "unknown", "token-a")
    with pytest.raises(errors.GroupAuthorizationFailed):
        tokens.authorize(store, "a", None)


def test_the_operator_rotates_and_removes_tokens() -> None:
    store = tokens.GroupTokens()
    store.set("a", "first")
    store.set("a", "second")
    with pytest.raises(errors.GroupAuthorizationFailed):
        tokens.authorize(store, "a", "first")
    tokens.authorize(store, "a", "second")
    store.discard("a")
    with pytest.raises(errors.GroupAuthorizationFailed):
        tokens.authorize(store, "a", "second")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_header_parsing(header: str | None, token: str | None) -> None:
    assert tokens.bearer_token(header) == token


def test_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"a": "x"}))
    assert tokens.GroupTokens.from_file(path).token_for("a") == "x"
    path.write_text(json.dumps({"a": ""}))
    with pytest.raises(ValueError, match="non-empty strings"):
        tokens.GroupTokens.from_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        tokens.GroupTokens.from_file(path)


def test_until_loaded_an_unknown_group_is_retriable_not_refused() -> None:
    store = tokens.GroupTokens(loaded=False)
    store.set("a", "token-a")
    tokens.authorize(store, "a", "token-a")
    # A known group's wrong token is refused at once; an unknown one may just not be read yet.
    with pytest.raises(errors.GroupAuthorizationFailed):
        tokens.authorize(store, "a", "wrong")
    with pytest.raises(errors.CoordinatorLoadInProgress) as loading:
        tokens.authorize(store, "b", "token-b")
    assert loading.value.retriable
    store.mark_loaded()
    with pytest.raises(errors.GroupAuthorizationFailed):
        tokens.authorize(store, "b", "token-b")


async def test_the_member_api_answers_load_in_progress_until_the_tokens_are_loaded() -> None:
    store = tokens.GroupTokens(loaded=False)
    # Authentication answers before the coordinator is asked anything: it is never started.
    runtime = coordinator_runtime.CoordinatorRuntime(
        coordinator_runtime.RuntimeConfig(bootstrap_servers="127.0.0.1:1")
    )
    async with test_utils.TestClient(test_utils.TestServer(app.build_app(runtime, store))) as http:
        headers = {"Authorization": "Bearer token-b"}
        reply = await http.post("/v1/groups/b/heartbeat", json={}, headers=headers)
        assert reply.status == 503
        assert reply.headers["Retry-After"] == "1"
        assert (await reply.json())["error"] == "COORDINATOR_LOAD_IN_PROGRESS"
        store.mark_loaded()
        reply = await http.post("/v1/groups/b/heartbeat", json={}, headers=headers)
        assert reply.status == 403
        assert (await reply.json())["error"] == "GROUP_AUTHORIZATION_FAILED"


def test_a_new_token_never_reads_as_a_command_line_option() -> None:
    # One in 64 bare URL-safe tokens starts with "-", which argparse takes for an option
    # (`--token -x...`: "expected one argument"), as a job's test once showed.
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--token")
    for _ in range(2_000):
        token = tokens.new_token()
        assert token.startswith(tokens.TOKEN_PREFIX)
        assert len(token) > 40
        assert parser.parse_args(["--token", token]).token == token
    assert len({tokens.new_token() for _ in range(100)}) == 100
