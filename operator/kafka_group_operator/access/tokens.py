"""Per-group bearer tokens of the member API, compared in constant time.

Every group has its own token. The operator keeps a ``GroupTokens`` filled from the groups'
Secrets; ``kgo coordinator --tokens FILE`` loads one from a JSON object ``{group: token}``.
A token is only ever valid for the group it belongs to, so a pod of group A that sends its
token to group B's endpoints is refused with ``GROUP_AUTHORIZATION_FAILED``.

After an operator start the Secrets take a moment to read. Until then a group without a
token may simply not be loaded yet, so it is answered ``COORDINATOR_LOAD_IN_PROGRESS``
(retriable, as Kafka answers while it loads ``__consumer_offsets``) instead of a refusal
that members treat as fatal.
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from kafka_group_operator.coordinator import errors

# Generated tokens start so: never with "-", which a command line would take for an option
# (`--token -x...`), and recognisable to secret scanners.
TOKEN_PREFIX = "kgo_"


def new_token(random_bytes: int = 32) -> str:
    """A fresh group token: the prefix and ``random_bytes`` random bytes, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(random_bytes)


class TokenStore(Protocol):
    """Where the API looks up the token of a group (``None``: the group has none).

    May raise ``CoordinatorLoadInProgress`` when it cannot tell yet.
    """

    def token_for(self, group_id: str) -> str | None: ...


class GroupTokens:
    """A mutable, thread-safe ``TokenStore``; the operator sets and discards entries.

    Created with ``loaded=False``, it answers ``CoordinatorLoadInProgress`` for a group it
    has no token for until ``mark_loaded()``: the operator calls it once every existing
    group's token has been read.
    """

    def __init__(self, tokens: Mapping[str, str] | None = None, *, loaded: bool = True) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = dict(tokens or {})
        self._loaded = loaded

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
            self._tokens[group_id] = token

    def discard(self, group_id: str) -> None:
        with self._lock:
            self._tokens.pop(group_id, None)

    def mark_loaded(self) -> None:
        with self._lock:
            self._loaded = True

    @property
    def loaded(self) -> bool:
        with self._lock:
            return self._loaded

    def token_for(self, group_id: str) -> str | None:
        with self._lock:
            token = self._tokens.get(group_id)
            if token is None and not self._loaded:
                raise errors.CoordinatorLoadInProgress(
                    f"the tokens of the groups are still loading (group {group_id!r})"
                )
            return token


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or ``None``."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def authorize(store: TokenStore, group_id: str, presented: str | None) -> None:
    """Raise ``GroupAuthorizationFailed`` unless ``presented`` is ``group_id``'s token."""
    if presented is None:
        raise errors.GroupAuthorizationFailed(
            "missing bearer token: send 'Authorization: Bearer <the group token>'"
        )
    expected = store.token_for(group_id)
    # Compare even when the group has no token, so the reply time does not reveal which
    # groups exist.
    # aiohttp decodes header bytes that are not UTF-8 to lone surrogates ("surrogateescape");
    # "surrogatepass" encodes any of them instead of failing (no valid token holds one).
    matches = hmac.compare_digest(
        presented.encode("utf-8", "surrogatepass"),
        (expected if expected is not None else "\0" + presented).encode("utf-8", "surrogatepass"),
    )
    if expected is None or not matches:
        raise errors.GroupAuthorizationFailed(f"the token is not valid for group {group_id!r}")
