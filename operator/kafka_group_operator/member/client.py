"""A small blocking client of the coordinator's member API (standard library only).

One keep-alive HTTP connection per calling thread. Errors come back as the coordinator's own
``CoordinatorError`` subclasses, looked up by their Kafka name, so the member reacts to
``FENCED_MEMBER_EPOCH`` the same way whether it came from HTTP or anywhere else. A coordinator
that cannot be reached, or does not answer before the caller's deadline, raises
``CoordinatorUnreachable`` (retriable).
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from kafka_group_operator.coordinator import errors

TopicPartition = tuple[str, int]
Json = dict[str, Any]


class CoordinatorUnreachable(errors.CoordinatorNotAvailable):
    """No HTTP answer from the coordinator (connection refused, reset, timed out)."""


# What a kept-alive connection that the server closed in between fails with on reuse.
STALE_CONNECTION_ERRORS = (
    http.client.RemoteDisconnected,
    BrokenPipeError,
    ConnectionResetError,
    ConnectionAbortedError,
)


# Answers after which the connection is dropped, so that the next call reaches whichever
# coordinator the address (a Kubernetes Service) leads to now, not the kept-alive one that just
# said it is not, or no longer, the coordinator (e.g. fenced by a newer one). Kafka's consumer
# rediscovers its coordinator on exactly these two (markCoordinatorUnknown in
# AbstractHeartbeatRequestManager.onErrorResponse and CommitRequestManager).
REDISCOVER_ERRORS = (errors.NotCoordinator, errors.CoordinatorNotAvailable)


def _remaining(deadline: float | None) -> float:
    return math.inf if deadline is None else deadline - time.monotonic()


class CoordinatorClient:
    def __init__(
        self, url: str, group_id: str, token: str | None = None, timeout_s: float = 10.0
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._parsed = parsed
        self._timeout_s = timeout_s
        self._base = parsed.path.rstrip("/") + "/v1/groups/" + urllib.parse.quote(group_id, "")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            host, port = self._parsed.hostname or "", self._parsed.port
            if self._parsed.scheme == "https":
                connection = http.client.HTTPSConnection(host, port, timeout=self._timeout_s)
            else:
                connection = http.client.HTTPConnection(host, port, timeout=self._timeout_s)
            self._local.connection = connection
        return connection

    def _bound(self, connection: http.client.HTTPConnection, deadline: float | None) -> None:
        """Let the next socket operation wait no longer than the time left before ``deadline``."""
        timeout = min(self._timeout_s, _remaining(deadline))
        if timeout <= 0:
            raise TimeoutError("deadline passed")
        connection.timeout = timeout  # taken by connect()
        if connection.sock is not None:
            connection.sock.settimeout(timeout)

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def request(
        self, method: str, path: str, body: Json | None = None, deadline: float | None = None
    ) -> Json:
        """One call; raises the coordinator's error for a non-2xx reply.

        ``deadline`` (a ``time.monotonic()`` instant) bounds the whole call, retry included:
        no socket operation waits past it, and a call that timed out is never repeated.
        """
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            connection = self._connection()
            reused = connection.sock is not None
            try:
                self._bound(connection, deadline)
                connection.request(method, self._base + path, body=payload, headers=self._headers)
                self._bound(connection, deadline)
                response = connection.getresponse()
                self._bound(connection, deadline)
                raw = response.read()
                break
            except (OSError, http.client.HTTPException) as error:
                self._drop_connection()
                # A kept-alive connection the server closed in between fails on first use:
                # one retry on a fresh connection tells that apart from a coordinator that
                # is really gone. A timeout is never retried: the server may be processing
                # the request, and the caller's deadline is what the time was for.
                stale = reused and isinstance(error, STALE_CONNECTION_ERRORS)
                if attempt == 2 or not stale or _remaining(deadline) <= 0:
                    raise CoordinatorUnreachable(f"coordinator unreachable: {error}") from error
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {}
        if 200 <= response.status < 300 and isinstance(decoded, dict):
            return decoded
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), str):
            error_class = errors.BY_NAME.get(decoded["error"], errors.CoordinatorError)
            if issubclass(error_class, REDISCOVER_ERRORS):
                self._drop_connection()
            raise error_class(str(decoded.get("message", "")))
        if response.status >= 500:
            self._drop_connection()
            raise CoordinatorUnreachable(f"HTTP {response.status} from the coordinator")
        raise errors.CoordinatorError(f"unexpected HTTP {response.status} from the coordinator")

    def heartbeat(self, body: Json, deadline: float | None = None) -> Json:
        return self.request("POST", "/heartbeat", body, deadline)

    def commit(
        self, member_id: str, member_epoch: int, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, str]:
        """Commit ``offsets``; returns the error name of each partition that failed."""
        reply = self.request(
            "POST",
            "/offsets",
            {
                "memberId": member_id,
                "memberEpoch": member_epoch,
                "offsets": [
                    {"topic": topic, "partition": partition, "offset": offset}
                    for (topic, partition), offset in sorted(offsets.items())
                ],
            },
        )
        return {(entry["topic"], entry["partition"]): entry["error"] for entry in reply["errors"]}

    def fetch(
        self,
        partitions: Iterable[TopicPartition] | None = None,
        member_id: str | None = None,
        member_epoch: int | None = None,
    ) -> dict[TopicPartition, int]:
        """Committed offsets of ``partitions`` (all of the group's when ``None``)."""
        query: list[tuple[str, str]] = [
            ("partition", f"{topic}:{partition}") for topic, partition in partitions or ()
        ]
        if member_id is not None and member_epoch is not None:
            query += [("memberId", member_id), ("memberEpoch", str(member_epoch))]
        path = "/offsets" + ("?" + urllib.parse.urlencode(query) if query else "")
        reply = self.request("GET", path)
        return {(entry["topic"], entry["partition"]): entry["offset"] for entry in reply["offsets"]}

    def describe(self) -> Json:
        return self.request("GET", "")

    def close(self) -> None:
        self._drop_connection()
