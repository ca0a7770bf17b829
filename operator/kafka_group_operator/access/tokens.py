"""Per-group bearer tokens of the member API, compared in constant time.

Every group has its own token. The operator keeps a ``GroupTokens`` filled from the groups'
Secrets; ``kgo coordinator --tokens FILE`` loads one from a JSON object ``{group: token}``.
A token is only ever valid for the group it belongs to, so a pod of group A that sends its
token to group B's endpoints is refused with ``GROUP_AUTHORIZATION_FAILED``.

After an operator start the Secrets take a moment to read. Until then a group without a
token may simply not be loaded yet, so it is answered ``COORDINATOR_LOAD_IN_PROGRESS``
(retriable, as Kafka answers while it loads ``__consumer_offsets``) instead of a refusal
that members treat as fatal.

Every replica authenticates every group, and authentication comes before the coordinator
check, as in Kafka (a broker authorizes a group request before its coordinator looks at it).
The control plane hands a group's token only to the replica coordinating the group; any
other replica (one that neither coordinates the group nor reconciled it, such as every
replica but one for a group created after it started, or the new coordinator after a
failover before the control plane hands it the token) asks the store's ``source`` for it
(``authenticate``): the operator's reads the group's Secret from the Kubernetes API. So a
member's valid token is answered by any replica, ``NOT_COORDINATOR`` naming the coordinator
where it is not this one.

Why not the coordinator check first, skipping the token where the group is served elsewhere?
What it would tell an unauthenticated caller is little: the holder of the group's state
partition, which follows from the group id's hash alone (the same for groups that exist and
groups that do not) and from the Leases, so no group's existence leaks. But the coordinator
itself needs the token, and after a failover the new coordinator may not have it yet; once
every replica can fetch any token, checking it first costs one lookup per group and replica
and tells a stranger nothing at all, not even the Lease map. A wrong token is refused the
same way everywhere (``GROUP_AUTHORIZATION_FAILED``).

Fetches are bounded whoever asks: a group's token is fetched at most once per
``refetch_interval_s`` (a miss or a mismatch within it is answered from what is known), so
a stranger presenting made-up tokens or group ids cannot turn requests into API calls beyond
that. A token known (set by the control plane or fetched) is trusted for ``fetched_ttl_s``,
then refreshed in the background while it keeps matching: a replica that once coordinated a
group, or fetched its token, learns of a new one (the group deleted and its id claimed again)
at its next use after that, and a token that stopped matching is fetched at once. A source
that cannot tell (the Kubernetes API unreachable) is answered ``COORDINATOR_LOAD_IN_PROGRESS``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kafka_group_operator.coordinator import errors

# Generated tokens start so: never with "-", which a command line would take for an option
# (`--token -x...`), and recognisable to secret scanners.
TOKEN_PREFIX = "kgo_"
# A group's token is fetched from the store's source at most this often.
REFETCH_INTERVAL_S = 1.0
# How much of a group id a refusal's log line shows.
LOGGED_GROUP_ID_CHARS = 200
# A fetched token is refreshed (in the background, while it matches) once this old.
FETCHED_TTL_S = 60.0

logger = logging.getLogger(__name__)

# Where a store fetches a token it was not given: the group's token, None when the group has
# none; ``CoordinatorError`` (retriable) when it cannot tell now.
TokenSource = Callable[[str], Awaitable[str | None]]


def new_token(random_bytes: int = 32) -> str:
    """A fresh group token: the prefix and ``random_bytes`` random bytes, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(random_bytes)


class TokenStore(Protocol):
    """Where the API looks up the token of a group (``None``: the group has none).

    May raise ``CoordinatorLoadInProgress`` when it cannot tell yet.
    """

    def token_for(self, group_id: str) -> str | None: ...


@dataclass(slots=True)
class _Known:
    """A group's token as last set or fetched (None: the source said it has none), and when
    (monotonic seconds)."""

    token: str | None
    at: float


class GroupTokens:
    """A mutable, thread-safe ``TokenStore``; the operator sets and discards entries.

    Created with ``loaded=False``, it answers ``CoordinatorLoadInProgress`` for a group it
    has no token for until ``mark_loaded()``: the operator calls it once every existing
    group's token has been read.

    With a ``source``, a token that is unknown, does not match, or is older than
    ``fetched_ttl_s`` is fetched from there (see the module's docstring):
    ``fetch_if_needed``, on the event loop of the front doors.
    """

    def __init__(
        self,
        tokens: Mapping[str, str] | None = None,
        *,
        loaded: bool = True,
        source: TokenSource | None = None,
        refetch_interval_s: float = REFETCH_INTERVAL_S,
        fetched_ttl_s: float = FETCHED_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._known: dict[str, _Known] = {
            group: _Known(token, clock()) for group, token in (tokens or {}).items()
        }
        # Writes are counted, and each group's last one kept: a fetch started before a
        # later write (a set, a discard) does not overwrite it.
        self._writes = 0
        self._last_write: dict[str, int] = {}
        self._loaded = loaded
        self.source = source
        self._refetch_interval_s = refetch_interval_s
        self._fetched_ttl_s = fetched_ttl_s
        # When each group was last asked of the source, the fetches in flight, and why the
        # last one failed, if it did (until the next is due, the same answer: retriable).
        self._asked: dict[str, float] = {}
        self._fetching: dict[str, asyncio.Task[None]] = {}
        self._failed: dict[str, errors.CoordinatorError] = {}
        self._refusals_logged: dict[str, float] = {}

    @classmethod
    def from_file(cls, path: Path) -> GroupTokens:
        """Read a JSON object mapping group ids to tokens."""
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read the tokens file {path}: {error}") from error
        if not isinstance(loaded, dict) or not all(
            isinstance(group, str) and isinstance(token, str) and token
            for group, token in loaded.items()
        ):
            raise ValueError(
                f"{path} must hold a JSON object of non-empty strings {{group: token}}"
            )
        return cls(loaded)

    def set(self, group_id: str, token: str) -> None:
        if not token:
            raise ValueError("a group token must not be empty")
        with self._lock:
            self._remember(group_id, token)

    def discard(self, group_id: str) -> None:
        with self._lock:
            self._writes += 1
            self._last_write[group_id] = self._writes
            self._known.pop(group_id, None)

    def mark_loaded(self) -> None:
        with self._lock:
            self._loaded = True

    @property
    def loaded(self) -> bool:
        with self._lock:
            return self._loaded

    def token_for(self, group_id: str) -> str | None:
        with self._lock:
            known = self._known.get(group_id)
            token = known.token if known is not None else None
            if token is None and not self._loaded:
                raise errors.CoordinatorLoadInProgress(
                    f"the tokens of the groups are still loading (group {group_id!r})"
                )
            return token

    async def fetch_if_needed(self, group_id: str, presented: str) -> None:
        """Fetch ``group_id``'s token from the source unless what is known settles
        ``presented``: a token that matches and is younger than ``fetched_ttl_s`` (older, it
        is refreshed in the background), or an answer fetched less than
        ``refetch_interval_s`` ago. Raises the source's ``CoordinatorError`` when it cannot
        tell."""
        if self.source is None:
            return
        now = self._clock()
        with self._lock:
            known = self._known.get(group_id)
            matches = (
                known is not None
                and known.token is not None
                and hmac.compare_digest(_bytes(known.token), _bytes(presented))
            )
            fresh = known is not None and now - known.at < self._fetched_ttl_s
            recent = now - self._asked.get(group_id, -math.inf) < self._refetch_interval_s
        if matches and fresh:
            return
        if matches:
            if not recent:  # old but still valid: answer now, refresh behind
                self._fetch(group_id)
            return
        if recent and group_id not in self._fetching:
            failed = self._failed.get(group_id)
            if failed is not None:
                raise failed
            return
        await asyncio.shield(self._fetch(group_id))

    def _fetch(self, group_id: str) -> asyncio.Task[None]:
        """The fetch of ``group_id`` in flight, started if there is none (one per group)."""
        task = self._fetching.get(group_id)
        if task is None:
            self._asked[group_id] = self._clock()
            if len(self._asked) > 100_000:  # bounded: made-up group ids are forgotten
                self._asked = {group_id: self._asked[group_id]}
                self._failed.clear()
            with self._lock:
                writes = self._writes
            task = asyncio.ensure_future(self._fetch_now(group_id, writes))
            self._fetching[group_id] = task
            task.add_done_callback(lambda _: self._fetching.pop(group_id, None))
            task.add_done_callback(_quietly)
        return task

    async def _fetch_now(self, group_id: str, writes: int) -> None:
        assert self.source is not None
        try:
            token = await self.source(group_id)
        except errors.CoordinatorError as error:
            self._failed[group_id] = error
            raise
        self._failed.pop(group_id, None)
        with self._lock:
            known = self._known.get(group_id)
            if self._last_write.get(group_id, 0) > writes:
                return  # set or discarded by the control plane meanwhile: that is newer
            if token is None and known is None:
                return  # nothing known, nothing to remember (made-up ids stay out)
            self._remember(group_id, token or None)

    def log_refusal(self, group_id: str) -> None:
        """Say why a presented token was refused (never the token): once per group and
        ``refetch_interval_s`` at most, so that a stranger's guesses cannot flood the log."""
        now = self._clock()
        # A stranger's group id may be as long as a frame allows: logged and kept cut short.
        shown = group_id[:LOGGED_GROUP_ID_CHARS]
        with self._lock:
            if now - self._refusals_logged.get(shown, -math.inf) < self._refetch_interval_s:
                return
            if len(self._refusals_logged) > 10_000:
                self._refusals_logged.clear()
            self._refusals_logged[shown] = now
            known = self._known.get(group_id)
        asked = self._asked.get(group_id)
        view = (
            "no token is known for the group"
            if known is None or known.token is None
            else f"it is not the group's token (known for {now - known.at:.1f}s)"
        )
        source = (
            "no source to ask"
            if self.source is None
            else "the source was never asked"
            if asked is None
            else f"the source was last asked {now - asked:.1f}s ago"
        )
        logger.warning("refused a token for group %r: %s; %s", shown, view, source)

    def _remember(self, group_id: str, token: str | None) -> None:
        """Record ``token`` (under the lock): the known entries are ordered by their writes."""
        self._writes += 1
        self._last_write[group_id] = self._writes
        self._known[group_id] = _Known(token, self._clock())


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or ``None``."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


async def authenticate(store: TokenStore, group_id: str, presented: str | None) -> None:
    """``authorize``, after fetching the group's token if the store can and needs to."""
    if presented is not None and isinstance(store, GroupTokens):
        await store.fetch_if_needed(group_id, presented)
        try:
            authorize(store, group_id, presented)
        except errors.GroupAuthorizationFailed:
            store.log_refusal(group_id)
            raise
        return
    authorize(store, group_id, presented)


def _bytes(text: str) -> bytes:
    # aiohttp decodes header bytes that are not UTF-8 to lone surrogates ("surrogateescape");
    # "surrogatepass" encodes any of them instead of failing (no valid token holds one).
    return text.encode("utf-8", "surrogatepass")


def _quietly(task: asyncio.Task[None]) -> None:
    """A fetch's failure is its waiters' to report (a background refresh has none: the token
    stays as it was known); read here so that asyncio does not report it again."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("fetching a group's token failed: %s", task.exception())


def authorize(store: TokenStore, group_id: str, presented: str | None) -> None:
    """Raise ``GroupAuthorizationFailed`` unless ``presented`` is ``group_id``'s token."""
    if presented is None:
        raise errors.GroupAuthorizationFailed(
            "missing bearer token: send 'Authorization: Bearer <the group token>'"
        )
    expected = store.token_for(group_id)
    # Compare even when the group has no token, so the reply time does not reveal which
    # groups exist.
    matches = hmac.compare_digest(
        _bytes(presented), _bytes(expected if expected is not None else "\0" + presented)
    )
    if expected is None or not matches:
        raise errors.GroupAuthorizationFailed(f"the token is not valid for group {group_id!r}")
