"""Per-group tokens: a group's token works for that group only."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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


class _Source:
    """A token source for tests: answers from ``tokens``, counts and can hold its calls."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens
        self.calls: list[str] = []
        self.gate: asyncio.Event | None = None
        self.error: errors.CoordinatorError | None = None

    async def __call__(self, group_id: str) -> str | None:
        self.calls.append(group_id)
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.tokens.get(group_id)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fetching_store(source: _Source, clock: _Clock) -> tokens.GroupTokens:
    return tokens.GroupTokens(
        source=source, refetch_interval_s=1.0, fetched_ttl_s=60.0, clock=clock
    )


async def test_a_token_not_given_is_fetched_once_and_shared() -> None:
    source, clock = _Source({"g": "token-g"}), _Clock()
    store = _fetching_store(source, clock)
    source.gate = asyncio.Event()
    # Ten requests at once: one fetch, all answered by it.
    waiting = [asyncio.create_task(tokens.authenticate(store, "g", "token-g")) for _ in range(10)]
    await asyncio.sleep(0)
    source.gate.set()
    await asyncio.gather(*waiting)
    assert source.calls == ["g"]
    # Known and fresh: no more fetches, and a wrong token is refused without one.
    await tokens.authenticate(store, "g", "token-g")
    with pytest.raises(errors.GroupAuthorizationFailed):
        await tokens.authenticate(store, "g", "wrong")
    assert source.calls == ["g"]


async def test_made_up_groups_and_tokens_fetch_at_most_once_per_interval() -> None:
    source, clock = _Source({"g": "token-g"}), _Clock()
    store = _fetching_store(source, clock)
    for _ in range(5):
        with pytest.raises(errors.GroupAuthorizationFailed):
            await tokens.authenticate(store, "made-up", "x")
    assert source.calls == ["made-up"]
    await tokens.authenticate(store, "g", "token-g")
    for _ in range(5):
        with pytest.raises(errors.GroupAuthorizationFailed):
            await tokens.authenticate(store, "g", "guess")
    assert source.calls == ["made-up", "g"]
    # Once per interval a mismatch asks again (the token may have changed).
    clock.now += 1.5
    for _ in range(5):
        with pytest.raises(errors.GroupAuthorizationFailed):
            await tokens.authenticate(store, "g", "guess")
    assert source.calls == ["made-up", "g", "g"]
    # A made-up id is not remembered (only when it was asked).
    assert store.token_for("made-up") is None


async def test_a_changed_token_is_fetched_when_presented() -> None:
    """A group deleted and its id claimed again: the new token works on a replica that knew
    the old one (set by the control plane when it coordinated, or fetched), the old one no
    longer does once the new one was seen."""
    source, clock = _Source({"g": "new"}), _Clock()
    store = _fetching_store(source, clock)
    store.set("g", "old")
    await tokens.authenticate(store, "g", "new")
    assert source.calls == ["g"]
    with pytest.raises(errors.GroupAuthorizationFailed):
        await tokens.authenticate(store, "g", "old")


async def test_an_old_token_is_refreshed_behind_the_answer() -> None:
    source, clock = _Source({"g": "token-g"}), _Clock()
    store = _fetching_store(source, clock)
    await tokens.authenticate(store, "g", "token-g")
    clock.now += 61
    source.tokens["g"] = "rotated"
    # Still matching what is known: answered at once, refreshed in the background.
    await tokens.authenticate(store, "g", "token-g")
    assert store.token_for("g") == "token-g"
    for _ in range(3):
        await asyncio.sleep(0)
    assert source.calls == ["g", "g"]
    assert store.token_for("g") == "rotated"
    with pytest.raises(errors.GroupAuthorizationFailed):
        await tokens.authenticate(store, "g", "token-g")


async def test_a_source_that_cannot_tell_is_retriable_until_it_can() -> None:
    source, clock = _Source({"g": "token-g"}), _Clock()
    store = _fetching_store(source, clock)
    source.error = errors.CoordinatorLoadInProgress("the Kubernetes API does not answer")
    for _ in range(3):  # one fetch; the same retriable answer until the next is due
        with pytest.raises(errors.CoordinatorLoadInProgress):
            await tokens.authenticate(store, "g", "token-g")
    assert source.calls == ["g"]
    source.error = None
    clock.now += 1.5
    await tokens.authenticate(store, "g", "token-g")
    assert source.calls == ["g", "g"]


async def test_a_token_set_meanwhile_wins_over_a_fetch_in_flight() -> None:
    source, clock = _Source({"g": "from-the-secret"}), _Clock()
    store = _fetching_store(source, clock)
    source.gate = asyncio.Event()
    fetching = asyncio.create_task(store.fetch_if_needed("g", "x"))
    await asyncio.sleep(0)
    clock.now += 0.1
    store.set("g", "from-the-control-plane")
    source.gate.set()
    await fetching
    assert store.token_for("g") == "from-the-control-plane"
    # A discard meanwhile wins too (the group was deleted while its token was read).
    clock.now += 2
    source.gate = asyncio.Event()
    fetching = asyncio.create_task(store.fetch_if_needed("g", "x"))
    await asyncio.sleep(0)
    store.discard("g")
    source.gate.set()
    await fetching
    assert store.token_for("g") is None


async def test_without_a_source_nothing_is_fetched() -> None:
    store = tokens.GroupTokens({"a": "token-a"})
    await tokens.authenticate(store, "a", "token-a")
    with pytest.raises(errors.GroupAuthorizationFailed):
        await tokens.authenticate(store, "b", "token-a")


async def test_a_refusal_is_logged_once_per_interval_and_never_shows_a_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, clock = _Source({"g": "token-g"}), _Clock()
    store = _fetching_store(source, clock)
    with caplog.at_level(logging.WARNING, logger=tokens.__name__):
        for _ in range(5):
            with pytest.raises(errors.GroupAuthorizationFailed):
                await tokens.authenticate(store, "g", "a-guess")
        clock.now += 1.5
        with pytest.raises(errors.GroupAuthorizationFailed):
            await tokens.authenticate(store, "g", "another-guess")
    refusals = [r.getMessage() for r in caplog.records if "refused a token" in r.getMessage()]
    assert refusals == [
        "refused a token for group 'g': it is not the group's token (known for 0.0s); "
        "the source was last asked 0.0s ago",
        "refused a token for group 'g': it is not the group's token (known for 0.0s); "
        "the source was last asked 0.0s ago",
    ]
    assert not any("guess" in r or "token-g" in r for r in refusals)


async def test_a_refusal_of_a_huge_group_id_logs_it_cut_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = _fetching_store(_Source({}), _Clock())
    huge = "g" * 100_000 + "\udcff"
    with (
        caplog.at_level(logging.WARNING, logger=tokens.__name__),
        pytest.raises(errors.GroupAuthorizationFailed),
    ):
        await tokens.authenticate(store, huge, "a-guess")
    (line,) = [r.getMessage() for r in caplog.records if "refused a token" in r.getMessage()]
    assert len(line) < 400
