"""The coordinator listener: a Kafka-protocol server in front of the coordinator runtime.

Each connection is an asyncio protocol that answers its requests in order (Kafka also serves
one request of a connection at a time); each request goes through the dispatch table
(``routes.ROUTES``). A request its route can answer without waiting (``answer_now``: a
steady heartbeat, answered from the runtime's memory) is answered in the callback that read
it, with no task, no future and no timer of its own: that is most of what a coordinator
serves. The first request that must wait (a commit, a join, a describe) is served by a task,
which goes on with the requests after it until none is left whole, and the connection's
callback takes over again. What Kafka's broker does on bad input, this does too, to that
connection only:

- an unknown API key, an unsupported version of any API but ApiVersions, a body that does
  not decode (a length or count that does not fit the frame among them, ``wire.bounds``),
  a frame above the size limit, or a request other than ApiVersions/SASL before
  authentication (when tokens are required): the connection is closed, the reason logged
  once (INFO; an unsupported version as a WARNING naming the client id and the API: a
  client that never learns why its connection closes retries forever);
- an unsupported ApiVersions version: answered in v0 with ``UNSUPPORTED_VERSION`` and the
  ApiVersions range (KIP-511), so the client can retry with a version it shares;
- a failed SASL authentication: answered, then closed (also while the groups' tokens are
  still loading, after a bounded hold, with the retriable ``COORDINATOR_LOAD_IN_PROGRESS``);
- no complete request, or a response not read, for ``idle_timeout_s``: closed (one timer per
  connection, which looks at when the connection began to wait when it fires: nothing is
  armed per request).

What one client may cost is bounded:

- before authentication (when tokens are required), a frame may be at most 512 KiB (Kafka's
  ``sasl.server.max.receive.size``) and the client must authenticate within
  ``authentication_timeout_s`` of connecting, or the connection is closed;
- at most ``max_connections`` connections at once: one more is closed as it is accepted
  (Kafka closes one over ``max.connections.per.ip`` so), logged at most every 10 s;
- a request naming groups (DescribeGroups, DeleteGroups, OffsetFetch v8+, ConsumerGroup-
  Describe, FindCoordinator v4+, ListGroups' filters) names at most
  ``max_groups_per_request``; more closes the connection before the body is decoded. A group
  named twice is answered once (Kafka's DeleteGroups does so), and a long list is served
  ``dispatch.GROUP_BATCH`` groups at a time with the event loop free in between, so that other
  connections' heartbeats are not held up;
- large frames take memory only as their bytes arrive, and give it back when the frame is
  done or abandoned (``framing.FrameBuffer``); a connection whose requests are not being
  served (one waits, or its answers are not read) is not read beyond 128 KiB.

An unexpected failure in a handler is logged and closes that connection; the listener and
every other connection go on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from kio.schema import index as api_index
from kio.schema.api_versions.v0.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16

from kafka_group_operator.access import tokens
from kafka_group_operator.protocol import cursor, dispatch, peers, routes
from kafka_group_operator.wire import framing

logger = logging.getLogger(__name__)

# A connection's requests served in a row before the listener lets the event loop run: frames
# already buffered are read without waiting and a cheap request is answered without waiting,
# so a client pipelining thousands would otherwise hold every other connection (and a stop)
# until its last. A turn of the loop costs a few microseconds: one in 16 requests is noise.
YIELD_EVERY = 16

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})

# Kafka's sasl.server.max.receive.size default: the largest frame before authentication.
MAX_UNAUTHENTICATED_FRAME_BYTES = 512 * 1024
DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_MAX_GROUPS_PER_REQUEST = 10_000
# Per API key: the request's list of groups and the response's list of answers, one per group.
_GROUP_LISTS: Mapping[int, tuple[str, str]] = {
    9: ("groups", "groups"),  # OffsetFetch v8+
    10: ("coordinator_keys", "coordinators"),  # FindCoordinator v4+
    15: ("groups", "groups"),  # DescribeGroups
    42: ("groups_names", "results"),  # DeleteGroups
    69: ("group_ids", "groups"),  # ConsumerGroupDescribe
}
# Request arrays capped at max_groups_per_request (ListGroups' filters too).
_CAPPED: Mapping[int, tuple[str, ...]] = {
    **{key: (request,) for key, (request, _) in _GROUP_LISTS.items()},
    16: ("states_filter", "types_filter"),  # ListGroups
}
# At most one line per this many seconds about connections refused over the limit.
_REFUSAL_LOG_INTERVAL_S = 10.0
# Bytes a connection is read ahead of what is being served (a request that waits, answers
# its client does not read) before its reading pauses: asyncio's streams paused at twice
# their 64 KiB limit. A frame being received whole is filled in as it arrives regardless.
_READ_AHEAD_BYTES = 128 * 1024


@dataclass(frozen=True)
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    # What Metadata and FindCoordinator tell clients (default: host and bound port).
    advertised_host: str | None = None
    advertised_port: int | None = None
    # Apart from the brokers' ids, so a client that meets both never merges their nodes.
    node_id: int = 1_000_000
    max_frame_bytes: int = framing.DEFAULT_MAX_FRAME_BYTES
    # A connection that sends no complete request (or reads no response) for this long is
    # closed: Kafka's connections.max.idle.ms (10 minutes), which also bounds slow senders.
    idle_timeout_s: float = 600.0
    # With tokens: a connection must authenticate within this long of connecting, in frames
    # of at most max_unauthenticated_frame_bytes (SASL/PLAIN needs a few hundred bytes).
    authentication_timeout_s: float = 10.0
    max_unauthenticated_frame_bytes: int = MAX_UNAUTHENTICATED_FRAME_BYTES
    # Connections served at once; one more is closed as it is accepted.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # Groups one request may name (see the module's docstring).
    max_groups_per_request: int = DEFAULT_MAX_GROUPS_PER_REQUEST
    # SaslAuthenticate while the groups' tokens are loading is held this long before it is
    # answered COORDINATOR_LOAD_IN_PROGRESS: below the clients' request timeouts (30 s in
    # Java, the gateway's 10 s).
    loading_hold_s: float = 5.0
    # Several coordinators splitting the state topic: who serves the other partitions'
    # groups (FindCoordinator names them). The node id is then derived from the advertised
    # address (``peers.node_id_for``), so that every coordinator names this one alike.
    peers: peers.Peers | None = None
    # TLS when both are given (PEM files).
    certificate_file: str | None = None
    key_file: str | None = None


def ssl_context(certificate_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate_file, key_file)
    return context


class Listener:
    """Serves ``coordinator`` on the Kafka protocol; ``start()``, then ``stop()``."""

    def __init__(
        self,
        coordinator: dispatch.Coordinator,
        token_store: tokens.TokenStore | None,
        config: ListenerConfig | None = None,
        table: Mapping[int, dispatch.Route] = routes.ROUTES,
    ) -> None:
        self.config = config or ListenerConfig()
        self._coordinator = coordinator
        self._token_store = token_store
        self._table = table
        self._server: asyncio.Server | None = None
        self._services: dispatch.Services | None = None
        self._connections: set[_Connection] = set()
        # Tasks serving requests that wait (a connection gone may still have one running).
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._refused = 0
        self._refusal_logged = 0.0

    @property
    def port(self) -> int:
        """The bound port (the configured one, or the one chosen for port 0)."""
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        config = self.config
        context = None
        if config.certificate_file and config.key_file:
            context = ssl_context(config.certificate_file, config.key_file)
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), config.host, config.port, ssl=context
        )
        host = config.advertised_host or config.host
        if host in _WILDCARDS:
            host = socket.getfqdn()  # a wildcard address is no address a client can use
        port = config.advertised_port or self.port
        node_id = config.node_id if config.peers is None else peers.node_id_for((host, port))
        node = dispatch.Node(node_id, host, port)
        self._services = dispatch.Services(
            self._coordinator,
            self._token_store,
            node,
            self._table,
            loading_hold_s=config.loading_hold_s,
            peers=config.peers,
            caps={
                key: dict.fromkeys(fields, config.max_groups_per_request)
                for key, fields in _CAPPED.items()
            },
        )

    async def stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def _refuse(self, peer: Any) -> None:
        """Count a connection refused over the limit; say so at most every 10 s."""
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= _REFUSAL_LOG_INTERVAL_S:
            logger.warning(
                "refused %d connection(s), the last from %s: %d are open, the listener's "
                "max_connections",
                self._refused,
                _address(peer),
                len(self._connections),
            )
            self._refused, self._refusal_logged = 0, now


class _Connection(asyncio.Protocol):
    """One client's connection: frames in as they arrive, answers out in order.

    At any time one of these serves the connection's whole frames: the callback that read
    them (``_serve_ready``, answering what it can at once), or the task of a request that
    waits (``_serve_waiting``), or neither while the connection waits for bytes, for a turn
    of the loop (``_deferred``) or for its client to read (``_write_paused``).
    """

    def __init__(self, listener: Listener) -> None:
        assert listener._services is not None
        self._listener = listener
        self._services = listener._services
        self._config = listener.config
        self._loop = asyncio.get_running_loop()
        self._frames = framing.FrameBuffer()
        self._transport: asyncio.Transport | None = None
        self._peer: Any = None
        self.session = dispatch.Session(client_host="")
        self._task: asyncio.Task[None] | None = None
        self._deferred = False
        self._write_paused = False
        self._read_paused = False
        self._eof = False
        self._closed = False
        # Without tokens there is nothing to authenticate: the pre-authentication bounds
        # apply only when tokens are required.
        self._authenticating = self._services.token_store is not None
        # Since when the connection waits for a whole request (its last answer, or its
        # start), or for its client to read: the idle timeout counts from then.
        self._idle_from = 0.0
        self._authenticate_by = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        self._transport = cast(asyncio.Transport, transport)
        self._peer = peer = transport.get_extra_info("peername")
        listener = self._listener
        if len(listener._connections) >= self._config.max_connections:
            listener._refuse(peer)
            self._closed = True
            transport.close()
            return
        listener._connections.add(self)
        self.session.client_host = str(peer[0]) if peer else ""
        self._idle_from = self._loop.time()
        self._authenticate_by = self._idle_from + self._config.authentication_timeout_s
        self._arm(self._wait_deadline())

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._frames.feed(data)
        if self._serving_here():
            self._serve_ready()
        elif self._frames.buffered() > _READ_AHEAD_BYTES and not self._read_paused:
            self._read_paused = True
            assert self._transport is not None
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        if self._serving_here():
            self._serve_ready()
        # Kept open (half closed) until the answers owed are written; TLS closes anyway.
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        # The peer went away (or the connection was closed here): nothing to log. A request
        # being served finishes, its answer dropped.
        self._forget()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._idle_from = self._loop.time()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._idle_from = self._loop.time()
        if self._serving_here():
            self._serve_ready()

    # --- serving --------------------------------------------------------------------------

    def _serving_here(self) -> bool:
        return (
            self._task is None
            and not self._deferred
            and not self._write_paused
            and not self._closed
        )

    def _max_bytes(self) -> int:
        config = self._config
        if self._authenticating and self.session.principal is None:
            return min(config.max_frame_bytes, config.max_unauthenticated_frame_bytes)
        return config.max_frame_bytes

    def _serve_ready(self) -> None:
        """Serve the whole frames received, from this callback: each answered at once when it
        can be; the first that must wait goes to a task, with the frames after it. After
        ``YIELD_EVERY`` the rest waits for the next turn of the loop."""
        services, session, frames = self._services, self.session, self._frames
        served = 0
        try:
            while True:
                if served == YIELD_EVERY:
                    self._deferred = True
                    self._loop.call_soon(self._after_turn)
                    return
                payload = frames.take(self._max_bytes())
                if payload is None:
                    break
                answer = answer_now(services, session, payload)
                if not isinstance(answer, bytes):
                    self._task = task = self._loop.create_task(self._serve_waiting(answer))
                    self._listener._tasks.add(task)
                    task.add_done_callback(self._listener._tasks.discard)
                    return
                if not self._write(answer):
                    return
                served += 1
        except Exception as error:
            self._fail(error)
            return
        self._waiting()

    def _after_turn(self) -> None:
        self._deferred = False
        if self._serving_here():
            self._serve_ready()

    async def _serve_waiting(self, request: Request) -> None:
        """Serve ``request``, which may wait, then the whole frames after it (those that can
        be answered at once, at once), letting the loop run every ``YIELD_EVERY``; the
        connection's callback serves again once none is left."""
        services, session = self._services, self.session
        served = 0
        try:
            answer = await serve(services, session, request)
            while True:
                if not self._write(answer):
                    return
                served += 1
                if served % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                payload = self._frames.take(self._max_bytes())
                if payload is None:
                    break
                now = answer_now(services, session, payload)
                answer = now if isinstance(now, bytes) else await serve(services, session, now)
        except asyncio.CancelledError:
            # stop() cancels what is being served; asyncio's callbacks of Python 3.11 log
            # a task that ends cancelled as an error.
            if not self._listener._stopping:
                raise
            return
        except Exception as error:
            self._fail(error)
            return
        finally:
            self._task = None
        self._waiting()

    def _write(self, answer: bytes) -> bool:
        """Send an answer; whether to serve on now (not when the connection is closed, nor
        while its client does not read: ``resume_writing`` serves on)."""
        if self._closed:
            return False
        assert self._transport is not None
        self._transport.write(answer)
        self._idle_from = self._loop.time()
        if self.session.close_after_response:
            self.close()
            return False
        return not self._write_paused

    def _waiting(self) -> None:
        """No whole frame is left: the connection waits for its client."""
        if self._closed:
            return
        if self._eof:
            cut = self._frames.cut_short()
            if cut is None:
                self.close()
            else:
                self._fail(framing.FrameError(cut))
            return
        if (
            self._authenticating
            and self.session.principal is None
            and self._loop.time() >= self._authenticate_by
        ):
            # Its deadline passed while a request was served (a SASL hold).
            self._fail(self._unauthenticated())
            return
        if self._read_paused:
            self._read_paused = False
            assert self._transport is not None
            self._transport.resume_reading()

    # --- time limits ----------------------------------------------------------------------

    def _arm(self, when: float) -> None:
        self._timer = self._loop.call_at(when, self._on_timer)

    def _wait_deadline(self) -> float:
        """When the wait that began at ``_idle_from`` ends the connection."""
        deadline = self._idle_from + self._config.idle_timeout_s
        if not self._write_paused and self._authenticating and self.session.principal is None:
            deadline = min(deadline, self._authenticate_by)
        return deadline

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        now = self._loop.time()
        if self._task is not None or self._deferred:
            # Serving a request is not waiting for the client: not timed.
            self._arm(now + self._config.idle_timeout_s)
            return
        deadline = self._wait_deadline()
        if now < deadline:
            self._arm(deadline)
        elif deadline < self._idle_from + self._config.idle_timeout_s:
            self._fail(self._unauthenticated())
        else:
            # A client that has not read its answers for so long gets none of the rest: a
            # graceful close would wait for it to read them, holding their memory.
            self._fail(TimeoutError(), abort=self._write_paused)

    def _unauthenticated(self) -> framing.FrameError:
        return framing.FrameError(
            f"not authenticated within {self._config.authentication_timeout_s:g} s"
        )

    # --- closing --------------------------------------------------------------------------

    def _fail(self, error: BaseException, abort: bool = False) -> None:
        """Say why the connection closes (once), and close it."""
        if self._closed:
            return
        if isinstance(error, UnsupportedVersion):
            # Kafka closes too, but a client that never learns why retries forever: say so.
            logger.warning("closing the connection of %s: %s", self.session.client_host, error)
        elif isinstance(error, framing.FrameError):
            logger.info("closing the connection of %s: %s", _address(self._peer), error)
        elif isinstance(error, TimeoutError):
            logger.info("closing the idle connection of %s", _address(self._peer))
        elif not isinstance(error, (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
            logger.error(
                "closing the connection of %s after an internal error serving %s",
                _address(self._peer),
                self.session.serving,
                exc_info=error,
            )
        self.close(abort)

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._forget()
        assert self._transport is not None
        if abort or self._listener._stopping:
            # A graceful close waits until the peer has read every reply sent: a client
            # that reads nothing would hold the stop (and SIGTERM) for ever.
            self._transport.abort()
        else:
            self._transport.close()

    def _forget(self) -> None:
        self._closed = True
        self._listener._connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._frames.close()


def _address(peer: Any) -> str:
    return f"{peer[0]}:{peer[1]}" if peer else "an unknown peer"


@dataclass(slots=True)
class Request:
    """A request read and checked, for ``serve``."""

    route: dispatch.Route
    header: framing.RequestHeader
    body: Any


def answer_now(
    services: dispatch.Services, session: dispatch.Session, payload: bytes
) -> bytes | Request:
    """The framed answer to one request frame if it needs no wait (its route's
    ``answer_now`` gives one, or the ApiVersions version is unsupported), else the request
    read, for ``serve``. ``FrameError`` means close."""
    fixed = framing.peek_request_header(payload)
    route = services.routes.get(fixed.api_key)
    if route is None:
        raise framing.FrameError(f"unsupported API key {fixed.api_key}")
    translation = route.translations.get(fixed.api_version)
    supported = route.min_version <= fixed.api_version <= route.max_version
    if not supported or (
        translation is None and framing.request_type(fixed.api_key, fixed.api_version) is None
    ):
        if fixed.api_key == framing.API_VERSIONS_KEY:
            return _unsupported_api_versions(route, fixed.correlation_id)
        raise UnsupportedVersion(route, fixed.api_version, _client_id(payload))
    if (
        services.token_store is not None
        and session.principal is None
        and not route.before_authentication
    ):
        raise framing.FrameError(f"API key {fixed.api_key} before SASL authentication")
    if translation is not None:
        header, body = translation.read_request(payload)
    else:
        header, body = framing.read_request(payload, services.caps.get(fixed.api_key), fixed)
    session.serving = _serving(type(body), header.api_version)
    if route.answer_now is not None:
        response = route.answer_now(dispatch.RequestContext(services, session, header), body)
        if response is not None:
            return framing.encode_response(
                header.api_key, header.api_version, header.correlation_id, response
            )
    return Request(route, header, body)


async def serve(services: dispatch.Services, session: dispatch.Session, request: Request) -> bytes:
    """The framed answer to a request ``answer_now`` left to its route's handler."""
    route, header, body = request.route, request.header, request.body
    context = dispatch.RequestContext(services, session, header)
    lists = _GROUP_LISTS.get(route.api_key)
    named = getattr(body, lists[0], None) if lists is not None else None
    if lists is not None and isinstance(named, tuple):
        return await _answer_each_group_once(route, context, body, named, *lists)
    response = await route.handler(context, body)
    return framing.encode_response(
        header.api_key, header.api_version, header.correlation_id, response
    )


async def handle(services: dispatch.Services, session: dispatch.Session, payload: bytes) -> bytes:
    """The framed response to one request frame, as a connection serves it; ``FrameError``
    means close."""
    answer = answer_now(services, session, payload)
    return answer if isinstance(answer, bytes) else await serve(services, session, answer)


_SERVING: dict[tuple[type[Any], int], str] = {}


def _serving(schema: type[Any], version: int) -> str:
    """How the log of a failure names the request being served (one string per version)."""
    name = _SERVING.get((schema, version))
    if name is None:
        name = _SERVING[schema, version] = f"{schema.__name__} v{version}"
    return name


async def _answer_each_group_once(
    route: dispatch.Route,
    context: dispatch.RequestContext,
    body: Any,
    named: tuple[Any, ...],
    request_field: str,
    response_field: str,
) -> bytes:
    """The framed response to a request naming groups: once per distinct group, in order;
    ``dispatch.GROUP_BATCH`` groups at a time (served, then encoded), the event loop free
    between batches. One batch is one call of the handler."""
    header = context.header
    distinct = _distinct(named)
    if len(distinct) <= dispatch.GROUP_BATCH:
        if len(distinct) < len(named):
            body = dataclasses.replace(body, **{request_field: distinct})
        response = await route.handler(context, body)
        return framing.encode_response(
            header.api_key, header.api_version, header.correlation_id, response
        )
    encoded: list[bytes] = []
    count = 0
    for start in range(0, len(distinct), dispatch.GROUP_BATCH):
        batch = dataclasses.replace(
            body, **{request_field: distinct[start : start + dispatch.GROUP_BATCH]}
        )
        response = await route.handler(context, batch)
        answers = getattr(response, response_field)
        encoded.append(framing.encode_entities(answers))
        count += len(answers)
        await asyncio.sleep(0)
    return framing.encode_response_around(
        header.api_key,
        header.api_version,
        header.correlation_id,
        response,
        response_field,
        encoded,
        count,
    )


def _distinct(named: tuple[Any, ...]) -> tuple[Any, ...]:
    """``named`` without repeats, in order. OffsetFetch names its groups in structs: one is a
    repeat only when all of it is (the same group with another member epoch is answered
    twice, as Kafka answers it)."""
    first = tuple(dict.fromkeys(named))
    return named if len(first) == len(named) else first


class UnsupportedVersion(framing.FrameError):
    """A version of an API the listener does not serve: the connection is closed."""

    def __init__(self, route: dispatch.Route, version: int, client_id: str | None) -> None:
        name = api_index.api_key_map.get(route.api_key, f"key {route.api_key}")
        super().__init__(
            f"client {client_id!r} sent {_api_name(name)} (API key {route.api_key}) "
            f"version {version}; this coordinator serves versions "
            f"{route.min_version}-{route.max_version}"
        )


def _api_name(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def _client_id(payload: bytes) -> str | None:
    """The request header's client id (after key, version and correlation id), if whole."""
    try:
        return cursor.Cursor(payload, 8).nullable_string()
    except cursor.Truncated:
        return None


def _unsupported_api_versions(route: dispatch.Route, correlation_id: int) -> bytes:
    # Kafka's ApiVersionsRequest.getErrorResponse: v0, UNSUPPORTED_VERSION, and the range
    # of ApiVersions itself.
    body = ApiVersionsResponse(
        error_code=ErrorCode.unsupported_version,
        api_keys=(
            ApiVersion(
                api_key=i16(route.api_key),
                min_version=i16(route.min_version),
                max_version=i16(route.max_version),
            ),
        ),
    )
    return framing.encode_response(framing.API_VERSIONS_KEY, 0, correlation_id, body)
