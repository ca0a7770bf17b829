"""A small blocking client of the coordinator's member API (standard library only).

One keep-alive HTTP connection per calling thread. Errors come back as the coordinator's own
``CoordinatorError`` subclasses, looked up by their Kafka name, so the member reacts to
``FENCED_MEMBER_EPOCH`` the same way whether it came from HTTP or anywhere else. A coordinator
that cannot be reached, or does not answer before the caller's deadline, raises
``CoordinatorUnreachable`` (retriable).

Following the coordinator, as Kafka's consumer does with FindCoordinator: when several
coordinators split the groups, a ``NOT_COORDINATOR`` answer names the group's coordinator
(``"coordinator": {"url"}``). The client then sends every later request there, and keeps
doing so until the next ``NOT_COORDINATOR`` (which names the coordinator anew, or, naming none,
sends the client back to its configured URL), or until that coordinator cannot be reached
(then the configured URL is asked again, as Kafka marks its coordinator unknown on a
disconnect). A request answered ``NOT_COORDINATOR`` with a new address is sent there at once
(it was not applied: a coordinator answers NOT_COORDINATOR only for what it did not apply),
as Kafka's consumer sends its request as soon as FindCoordinator answers; a second such answer
in a row (coordinators naming each other) is raised as ``CoordinatorMoved``, retriable. Likewise
a coordinator followed since an earlier call that now refuses the connection (it stopped, e.g.
after handing its partitions over in a rolling restart) is left for the configured URL within
the same call, as Kafka's consumer looks its coordinator up at once on a disconnect: the
request was never sent, and the configured URL answers it or names the new coordinator.

A coordinator that dies closes its connections (its kernel does, even after SIGKILL), as one
that stops does (one that merely lost the group's partition keeps them open and answers
``NOT_COORDINATOR``): ``idle_socket`` lets the member's heartbeat thread
watch its kept-alive connection between two heartbeats and notice at once, as Kafka's
consumer notices a disconnected coordinator in its network client's poll.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from kafka_group_operator.coordinator import errors

TopicPartition = tuple[str, int]
Json = dict[str, Any]


class CoordinatorUnreachable(errors.CoordinatorNotAvailable):
    """No HTTP answer from the coordinator (connection refused, reset, timed out).

    ``unsent``: the request surely never reached it (the connection was refused, or its name
    no longer resolves), so sending it elsewhere cannot apply it twice."""

    def __init__(self, message: str, unsent: bool = False) -> None:
        super().__init__(message)
        self.unsent = unsent


# Failures that happen before a request is sent: nothing listens there (a coordinator that
# stopped or died), or the name is gone (a deleted pod's DNS name).
UNSENT_ERRORS = (ConnectionRefusedError, socket.gaierror)


class CoordinatorMoved(errors.NotCoordinator):
    """NOT_COORDINATOR naming another coordinator: later requests go there."""


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
        self._configured = parsed
        # Where requests go: the configured URL, or the coordinator a NOT_COORDINATOR named.
        # Replaced whole (one assignment), so every thread sees one or the other.
        self._parsed = parsed
        self._timeout_s = timeout_s
        self._group_path = "/v1/groups/" + urllib.parse.quote(group_id, "")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._local = threading.local()

    @property
    def coordinator_url(self) -> str:
        """The URL requests go to now (the configured one until a coordinator is named)."""
        return urllib.parse.urlunsplit(self._parsed)

    def _follow(self, target: urllib.parse.SplitResult) -> bool:
        """Send later requests to ``target``; True if that is a change."""
        if target == self._parsed:
            return False
        self._parsed = target
        return True

    def _hinted(self, body: Mapping[str, Any]) -> urllib.parse.SplitResult:
        """The coordinator a NOT_COORDINATOR body names, else the configured URL."""
        hint = body.get("coordinator")
        url = hint.get("url") if isinstance(hint, dict) else None
        if isinstance(url, str):
            parsed = urllib.parse.urlsplit(url)
            if parsed.scheme in ("http", "https") and parsed.hostname:
                return parsed
        return self._configured

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None and getattr(self._local, "target", None) != self._parsed:
            # Opened to the coordinator before the one now followed.
            self.drop_connection()
            connection = None
        if connection is None:
            self._local.target = target = self._parsed
            host, port = target.hostname or "", target.port
            if target.scheme == "https":
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

    def idle_socket(self) -> socket.socket | None:
        """The socket of this thread's kept-alive connection, if one is open: between two
        requests it turns readable only when the coordinator closed it (or sent what was not
        asked for), and the connection is then of no further use."""
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None or getattr(self._local, "target", None) != self._parsed:
            return None
        sock: socket.socket | None = connection.sock
        return sock

    def drop_connection(self) -> None:
        """Close this thread's connection: its next request opens a new one."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def request(
        self, method: str, path: str, body: Json | None = None, deadline: float | None = None
    ) -> Json:
        """One call; raises the coordinator's error for a non-2xx reply.

        ``deadline`` (a ``time.monotonic()`` instant) bounds the whole call, retries included:
        no socket operation waits past it, and a call that timed out is never repeated. A
        NOT_COORDINATOR naming another coordinator is sent there once, before the deadline; so
        is one a followed coordinator refused (to the configured URL).
        """
        followed = self._parsed != self._configured
        try:
            try:
                return self._request_once(method, path, body, deadline)
            except CoordinatorUnreachable as error:
                # Only where an earlier call was sent: a coordinator named in this call that
                # is already gone is the configured URL's stale hint, asked again later.
                if not (followed and error.unsent) or _remaining(deadline) <= 0:
                    raise
                return self._request_once(method, path, body, deadline)
        except CoordinatorMoved:
            if _remaining(deadline) <= 0:
                raise
            return self._request_once(method, path, body, deadline)

    def _request_once(
        self, method: str, path: str, body: Json | None, deadline: float | None
    ) -> Json:
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            connection = self._connection()
            target: urllib.parse.SplitResult = self._local.target
            reused = connection.sock is not None
            url_path = target.path.rstrip("/") + self._group_path + path
            try:
                self._bound(connection, deadline)
                connection.request(method, url_path, body=payload, headers=self._headers)
                self._bound(connection, deadline)
                response = connection.getresponse()
                self._bound(connection, deadline)
                raw = response.read()
                break
            except (OSError, http.client.HTTPException) as error:
                self.drop_connection()
                # A kept-alive connection the server closed in between fails on first use:
                # one retry on a fresh connection tells that apart from a coordinator that
                # is really gone. A timeout is never retried: the server may be processing
                # the request, and the caller's deadline is what the time was for.
                stale = reused and isinstance(error, STALE_CONNECTION_ERRORS)
                if attempt == 2 or not stale or _remaining(deadline) <= 0:
                    # A followed coordinator that is gone: ask the configured URL again
                    # (unless another thread has followed a newer hint meanwhile).
                    if self._parsed == target:
                        self._follow(self._configured)
                    raise CoordinatorUnreachable(
                        f"coordinator unreachable: {error}",
                        unsent=isinstance(error, UNSENT_ERRORS),
                    ) from error
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {}
        if 200 <= response.status < 300 and isinstance(decoded, dict):
            return decoded
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), str):
            error_class = errors.BY_NAME.get(decoded["error"], errors.CoordinatorError)
            if issubclass(error_class, REDISCOVER_ERRORS):
                self.drop_connection()
            message = str(decoded.get("message", ""))
            if issubclass(error_class, errors.NotCoordinator) and self._follow(
                self._hinted(decoded)
            ):
                raise CoordinatorMoved(f"{message} (now following {self.coordinator_url})")
            raise error_class(message)
        if response.status >= 500:
            self.drop_connection()
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
        self.drop_connection()
