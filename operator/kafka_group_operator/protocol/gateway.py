"""The gateway (``kgo gateway``): a Kafka-protocol proxy next to an unmodified Kafka client.

Kafka clients ask whichever broker they are connected to for their group's coordinator, so
the redirect to the operator's coordinator listener has to happen on the client's own
connections. The gateway listens on loopback:

- the **coordinator port** (the client's bootstrap address): group and offset APIs
  (``GROUP_APIS``) go to the coordinator listener, on a connection the gateway authenticated
  with SASL/PLAIN as the group (username = group id, password = the group's token);
  everything else (ApiVersions, Metadata, ...) goes to a broker, so that the client sees one
  consistent cluster: the brokers' topics and nodes, and our coordinator. When the listener
  closes the gateway's connection (its replica stopped or died), the client's is closed too,
  as a dead coordinator's would be;
- one **broker port** per upstream broker, opened when a reply first names that broker: every
  request goes to that broker. Only a broker that the gateway's own Metadata request to the
  bootstrap servers names, at that address, gets a port (asked again, at most once a second,
  when a reply names an unknown node or address): a node it does not confirm is left out of
  the client's reply (a transaction coordinator: ``COORDINATOR_NOT_AVAILABLE``) and never
  connected to, so the brokers' credentials and TLS connections go to those brokers only;
- one **peer coordinator port** per coordinator listener FindCoordinator names at an
  address other than the configured one (several coordinators splitting the state topic,
  ``protocol.peers``), opened when first named: it serves like the coordinator port, with
  that listener for the group APIs. The configured address may be a Service whose every
  connection reaches any replica, so a group owned by the replica one connection reached
  is still served through the owner's own address. A group's
  coordinator follows the listeners' answers: the coordinator port's FindCoordinator is
  answered by the listener, and a broker's answer for a group is replaced by the listener's
  (asked on a connection of the gateway's own), so that a client sent back by
  ``NOT_COORDINATOR`` lands on the group's coordinator whichever node it asks.

Requests are forwarded byte for byte; the gateway reads no further than the request header
(a Produce request up to its acks, a FindCoordinator request whole). Replies are matched to
requests in request order, as a broker answers a connection's requests, never by the
correlation id the client chose: a reply that is not the oldest outstanding request's, or a
request reusing an outstanding correlation id, closes the connection. The gateway rewrites
the replies of ``Metadata`` and ``DescribeCluster`` (broker addresses -> the broker ports,
plus the coordinator nodes), ``FindCoordinator`` (a group's coordinator -> the coordinator
port or a peer coordinator port, a transaction coordinator -> its broker port) and
``ApiVersions`` (those three capped at the versions kio reads; on the coordinator port, the
group APIs' versions are the listener's), each read whole with kio's types (no byte after
its body). A broker port answers ``ListGroups`` with no group: the coordinator's listing is
the one a client gets (``_no_groups``). Produce and Fetch payloads are never decoded. On a
broker port, the bytes go from one socket's transport to the other's as they arrive; only
the frames the gateway reads are gathered whole (``max_gathered_bytes``, 1 MiB, or 64 MiB
for a Metadata reply), and a side that reads slower than the other sends stops the other
being read (the transports' flow control) rather than the gateway buffering for it. The
coordinator ports read each request whole, up to ``max_gathered_bytes`` (the group APIs'
requests are small), and refuse Produce and Fetch. Each port takes at most
``max_connections`` client connections.

Toward the brokers, TLS and SASL (PLAIN, SCRAM-SHA-256/512) come from librdkafka-style
properties (``wire.connection.upstream_security``, shared with the offset mirror); the client
talks plaintext to loopback. A connection whose client or upstream breaks the protocol, or
whose upstream cannot be reached, is closed alone: the gateway and every other connection go
on serving.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import dataclasses
import datetime
import gc
import logging
import math
import ssl
import struct
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0Request
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.static.primitive import i8, i16, i32

from kafka_group_operator.wire import connection, framing
from kafka_group_operator.wire.connection import (
    Security,
    UpstreamError,
    authenticate,
    connect,
)

logger = logging.getLogger(__name__)

# API keys (Kafka's ApiKeys).
PRODUCE = 0
FETCH = 1
METADATA = 3
FIND_COORDINATOR = 10
LIST_GROUPS = 16
API_VERSIONS = framing.API_VERSIONS_KEY
DESCRIBE_CLUSTER = 60
# What a consumer group's coordinator serves: OffsetCommit, OffsetFetch, FindCoordinator
# (group keys), JoinGroup, Heartbeat, LeaveGroup, SyncGroup, DescribeGroups, ListGroups,
# DeleteGroups, OffsetDelete, ConsumerGroupHeartbeat, ConsumerGroupDescribe.
GROUP_APIS = frozenset({8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47, 68, 69})
# FindCoordinator's key types (Kafka's FindCoordinatorRequest.CoordinatorType).
GROUP_KEY_TYPE = 0

# Kafka's socket.request.max.bytes: the largest request a broker accepts. On a broker port a
# request passes through as its bytes come, so this costs the gateway no memory.
MAX_REQUEST_BYTES = 100 * 1024 * 1024
# Fetch replies are bounded by the client's fetch.max.bytes / receive.message.max.bytes
# (librdkafka's default is 100 MB); on a broker port they pass through as they come, on the
# coordinator port this bounds a reply read whole.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
# A frame the gateway reads whole before forwarding it: every request on the coordinator
# ports, a FindCoordinator request on a broker port, and the replies it rewrites but
# Metadata's. The group APIs' requests are small: an OffsetCommit v9 costs 18 bytes a
# partition plus its metadata string, so 1 MiB holds a commit of 50,000 partitions (20,000
# with 30-byte metadata, what Kafka Streams writes); a JoinGroup's subscription or a
# SyncGroup's assignments of hundreds of members fit as well. Bigger frames close the
# connection; those still in flight cost at most this much each.
MAX_GATHERED_BYTES = 1024 * 1024
# A Metadata reply, read whole to be rewritten: ~40 bytes a partition (leader, replicas and
# in-sync replicas of three brokers), so 64 MiB holds a cluster of 1.5 million partitions.
# Only a client's Metadata request for all topics of such a cluster comes near it.
MAX_METADATA_REPLY_BYTES = 64 * 1024 * 1024
# Open client connections per gateway port (the coordinator port, each broker's and each
# peer coordinator's); more are closed as they come, as a broker does past max.connections.
# The gateway serves one application: a few clients, each with a connection per broker.
MAX_CONNECTIONS = 256

# The rewritten ApiVersions replies kept: a few per broker of the cluster and request version.
_VERSIONS_REPLIES = 64
# FindCoordinator keys in one request: the coordinator listener's own bound on the groups one
# request names (``protocol.listener.ListenerConfig.max_groups_per_request``).
_FIND_COORDINATOR_CAPS = {"coordinator_keys": 10_000}
# Requests of one client connection on the coordinator port awaiting their replies.
MAX_IN_FLIGHT = 64
# Requests of one client connection on a broker port awaiting their replies before the
# client is no longer read (until replies come): what tracking them costs is bounded. A
# broker answers one request of a connection at a time; librdkafka pipelines up to
# max.in.flight (1,000,000 by default) and simply waits here.
_MAX_OUTSTANDING = 1024
# The coordinator port's stream buffer: a request is read up to its size; a client that
# sends faster than it reads stops being read beyond this.
_COORDINATOR_STREAM_LIMIT = 64 * 1024
# The gateway's own Metadata request to the brokers is repeated when a reply names a broker
# it does not know (or elsewhere), at most this often.
_CLUSTER_REFRESH_S = 1.0
# How much of a Produce request may come before its acks: a client id and a transactional id
# (each at most 32,767 bytes), and the request header's tagged fields.
_PRODUCE_HEAD_MAX = 128 * 1024
_CORRELATION = struct.Struct(">i")
_FIXED_HEADER = struct.Struct(">hhi")


def _libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (free heap pages back to the system), where there is one."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): nothing to call
    return trim


_malloc_trim = _libc_malloc_trim()

# The connection settings the gateway is given are checked as it starts: one error type.
GatewayConfigError = connection.ConfigError


@dataclass(frozen=True)
class GatewayConfig:
    bootstrap_servers: tuple[tuple[str, int], ...]
    coordinator: tuple[str, int]
    brokers_security: Security = field(default_factory=Security)
    coordinator_security: Security = field(default_factory=Security)
    host: str = "127.0.0.1"
    # The coordinator port, which is also the client's bootstrap address.
    port: int = 9092
    # The node id clients see for the coordinator: apart from the brokers' ids (as the
    # listener's own), so that a client never takes the coordinator for a broker.
    coordinator_node_id: int = 1_000_000
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_response_bytes: int = MAX_RESPONSE_BYTES
    max_gathered_bytes: int = MAX_GATHERED_BYTES
    max_metadata_reply_bytes: int = MAX_METADATA_REPLY_BYTES
    max_connections: int = MAX_CONNECTIONS


async def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()


def _write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    # Two writes: no copy of a large Fetch reply just to prefix its size.
    writer.write(len(payload).to_bytes(4, "big"))
    writer.write(payload)


# --- the gateway ------------------------------------------------------------------------


@dataclass
class _Broker:
    node_id: int
    address: tuple[str, int]
    server: asyncio.Server

    @property
    def port(self) -> int:
        port: int = self.server.sockets[0].getsockname()[1]
        return port


# What a rewritten reply needs of its request: api key, version, FindCoordinator's key type
# and keys.
_Pending = tuple[int, int, int, tuple[str, ...]]


@dataclass
class _PeerCoordinator:
    """Another coordinator's listener and the local port that stands for it."""

    node_id: int
    address: tuple[str, int]
    server: asyncio.Server

    @property
    def port(self) -> int:
        port: int = self.server.sockets[0].getsockname()[1]
        return port


class Gateway:
    """``start()``, then clients bootstrap at ``host:port``; ``stop()``."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._server: asyncio.Server | None = None
        self._brokers: dict[int, _Broker] = {}
        self._broker_lock = asyncio.Lock()
        self._connections: set[asyncio.Task[Any]] = set()
        self._next_bootstrap = 0
        # Other coordinators' listeners by address, and the gateway's own connection to the
        # configured listener, on which it asks who coordinates a group.
        self._peers: dict[tuple[str, int], _PeerCoordinator] = {}
        self._resolver: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._resolver_lock = asyncio.Lock()
        self._resolver_calls = 0
        # The listener's API versions, from the gateway's ApiVersions on each connection.
        self._listener_versions: dict[int, tuple[int, int]] = {}
        # The brokers' ApiVersions replies, rewritten (after the correlation id), by request
        # version and reply (after the correlation id).
        self._versions_replies: dict[tuple[int, bytes], bytes] = {}
        # The brokers as the gateway's own Metadata requests to the bootstrap servers name
        # them (node id -> address), on a connection of its own: the only addresses a broker
        # port ever connects to.
        self._cluster: dict[int, tuple[str, int]] = {}
        self._cluster_lock = asyncio.Lock()
        self._cluster_asked = -math.inf
        self._cluster_link: tuple[asyncio.StreamReader, asyncio.StreamWriter, int] | None = None
        self._cluster_calls = 0
        self._unconfirmed_logged = -math.inf
        # Open client connections per port, and when a refusal was last logged.
        self._open: collections.Counter[str] = collections.Counter()
        self._refusal_logged: dict[str, float] = {}
        self._trim_pending = False

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def broker_ports(self) -> dict[int, int]:
        """node id -> its local port, for the brokers seen so far."""
        return {node_id: broker.port for node_id, broker in self._brokers.items()}

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve_coordinator_port,
            self.config.host,
            self.config.port,
            limit=_COORDINATOR_STREAM_LIMIT,
        )

    def peer_ports(self) -> dict[tuple[str, int], int]:
        """Other coordinators' listener address -> its local port, for those seen so far."""
        return {address: peer.port for address, peer in self._peers.items()}

    async def stop(self) -> None:
        servers = [
            self._server,
            *(broker.server for broker in self._brokers.values()),
            *(peer.server for peer in self._peers.values()),
        ]
        for server in servers:
            if server is not None:
                server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._resolver is not None:
            await _close(self._resolver[1])
            self._resolver = None
        if self._cluster_link is not None:
            await _close(self._cluster_link[1])
            self._cluster_link = None

    # -- connections ------------------------------------------------------------------

    def _admit(self, name: str) -> bool:
        """Whether a new client connection on the port ``name`` is served (counted until
        ``_serve`` ends) or refused: ``max_connections`` are open there already."""
        if self._open[name] < self.config.max_connections:
            self._open[name] += 1
            return True
        now = time.monotonic()
        if now - self._refusal_logged.get(name, -math.inf) >= 10.0:
            self._refusal_logged[name] = now
            logger.warning(
                "refusing connections on the %s: %s are open (the limit)",
                name,
                self.config.max_connections,
            )
        return False

    async def _serve(self, name: str, serve: Any, close: Callable[[], Awaitable[None]]) -> None:
        """Serve one admitted client connection; its failure closes it alone, logged."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await serve
        except (framing.FrameError, UpstreamError) as error:
            logger.info("closing a client connection on the %s: %s", name, error)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # a peer went away
        except asyncio.CancelledError:
            pass  # stop()
        except Exception:
            logger.exception("closing a client connection on the %s after an internal error", name)
        finally:
            self._connections.discard(task)
            self._open[name] -= 1
            await close()
            self._release_memory()

    def _release_memory(self) -> None:
        """Soon after connections close, hand the memory their frames took back to the
        system (at most once a second). A connection that ends on an error leaves its
        frame's bytes in reference cycles (the error's context and traceback hold them, and
        its task holds the error) until the cycle collector runs; and CPython frees them
        into the C allocator, whose heap keeps them. Without this, a gateway that once held
        unfinished frames would stay that large."""
        if self._trim_pending:
            return
        self._trim_pending = True

        def trim() -> None:
            self._trim_pending = False
            gc.collect()
            if _malloc_trim is not None:
                _malloc_trim(0)

        asyncio.get_running_loop().call_later(1.0, trim)

    def _broker_port_connection(self, node_id: int) -> asyncio.Protocol:
        """The protocol of a client's connection to the port of broker ``node_id``."""
        name = f"port of broker {node_id}"
        if not self._admit(name):
            return _Refused()

        def start(connection: _BrokerConnection) -> asyncio.Future[None]:
            async def close() -> None:
                connection.close()

            return asyncio.ensure_future(self._serve(name, self._pipe(node_id, connection), close))

        return _BrokerConnection(self.config, start).client

    async def _pipe(self, node_id: int, connection: _BrokerConnection) -> None:
        """One upstream: requests and replies pass in order, from one transport to the other
        as they arrive; replies are matched to requests in order (``_BrokerConnection``), and
        those the gateway rewrites are read whole, decoded and rewritten."""
        up_reader, up_writer = await connect(
            self._brokers[node_id].address, self.config.brokers_security
        )
        # From here the broker's transport feeds ``connection.upstream``. Nothing is left in
        # ``up_reader``: a broker sends nothing unasked, and the handshakes were answered.
        if up_reader.at_eof():
            up_writer.close()
            return  # the broker closed it already: the client's connection ends likewise

        async def rewrite(payload: bytes, entry: _Pending) -> bytes:
            return await self._rewrite(payload, entry, coordinator_port=False)

        await connection.run(up_writer.transport, self._entry, rewrite)

    async def _serve_coordinator_port(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        name = "coordinator port"
        if not self._admit(name):
            await _close(writer)
            return
        route = self._route(reader, writer, self.config.coordinator)
        await self._serve(name, route, lambda: _close(writer))

    async def _serve_peer_port(
        self,
        address: tuple[str, int],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        name = f"port of coordinator {address[0]}:{address[1]}"
        if not self._admit(name):
            await _close(writer)
            return
        route = self._route(reader, writer, address)
        await self._serve(name, route, lambda: _close(writer))

    async def _route(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        listener: tuple[str, int],
    ) -> None:
        """Two upstreams (the ``listener`` for ``GROUP_APIS``, a broker for the rest), each
        opened on first use; replies go back in request order, as Kafka clients expect.

        When the listener closes its connection (its coordinator stopped or died), the
        client's connection is closed too once the replies already received are sent: the
        client sees its coordinator's node go, as it would see a broker's, and looks the
        coordinator up again at once instead of at its next request.

        Each lane matches its replies to its requests in order, and a request may not reuse
        the correlation id of one still awaiting its reply (the connection is closed), as on
        the broker ports. Requests are read whole, up to ``max_gathered_bytes``."""
        lanes: dict[str, _Lane] = {}
        # Bounded: a client that sends without reading stops being read (as a broker mutes it).
        order: asyncio.Queue[tuple[asyncio.Future[bytes], _Pending]] = asyncio.Queue(MAX_IN_FLIGHT)
        outstanding: set[int] = set()
        listener_closed = asyncio.Event()

        async def lane(kind: str) -> _Lane:
            if kind not in lanes:
                if kind == "listener":
                    up_reader, up_writer = await self._connect_listener(listener)
                else:
                    up_reader, up_writer = await self._connect_bootstrap()
                lanes[kind] = _Lane(up_reader, up_writer, self.config.max_response_bytes)
                if kind == "listener":
                    lanes[kind].ended.add_done_callback(lambda _: listener_closed.set())
            return lanes[kind]

        async def requests() -> None:
            while (
                payload := await framing.read_frame(reader, self.config.max_gathered_bytes)
            ) is not None:
                header = framing.peek_request_header(payload)
                if header.api_key in (PRODUCE, FETCH):
                    # No partition leads here (and Produce with acks=0 has no reply to keep
                    # in order).
                    raise framing.FrameError(f"API key {header.api_key} on the coordinator port")
                if header.correlation_id in outstanding:
                    raise framing.FrameError(
                        f"correlation id {header.correlation_id} reused while its request "
                        "awaits its reply"
                    )
                entry = self._entry(header, payload)
                if header.api_key == API_VERSIONS:
                    # Its reply advertises the listener's versions: know them first.
                    await lane("listener")
                    payload = _unpinned_api_versions(payload)
                to_listener = header.api_key in GROUP_APIS and (
                    header.api_key != FIND_COORDINATOR or entry[2] == GROUP_KEY_TYPE
                )
                target = await lane("listener" if to_listener else "broker")
                outstanding.add(header.correlation_id)
                await order.put((target.send(payload, header.correlation_id), entry))
                await target.writer.drain()

        async def replies() -> None:
            while True:
                reply, entry = await order.get()
                payload = await reply
                if entry[0] in _REWRITTEN:
                    payload = await self._rewrite(payload, entry, coordinator_port=True)
                outstanding.discard(framing.peek_correlation(payload))
                _write_frame(writer, payload)
                await writer.drain()
                order.task_done()

        async def coordinator_gone() -> None:
            await listener_closed.wait()
            # A reply still owed by the listener fails, which ends replies() first.
            await order.join()

        try:
            await _first_to_end(requests(), replies(), coordinator_gone())
        finally:
            for each in lanes.values():
                await each.close()

    async def _connect_listener(
        self, address: tuple[str, int]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        up_reader, up_writer = await connect(
            address, dataclasses.replace(self.config.coordinator_security, sasl=None)
        )
        try:
            # The listener's versions, for the ApiVersions replies of the coordinator port.
            versions = await connection.call(
                up_reader,
                up_writer,
                ApiVersionsRequest(client_software_name="kgo-gateway", client_software_version="1"),
                -4,
            )
            self._listener_versions = {
                int(key.api_key): (int(key.min_version), int(key.max_version))
                for key in versions.api_keys
            }
            sasl = self.config.coordinator_security.sasl
            if sasl is not None:
                await authenticate(up_reader, up_writer, sasl)
        except (OSError, framing.FrameError) as error:
            await _close(up_writer)
            raise UpstreamError(f"coordinator listener: {error}") from None
        except UpstreamError:
            await _close(up_writer)
            raise
        return up_reader, up_writer

    async def _connect_bootstrap(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to one of the bootstrap servers (round robin past failures)."""
        servers = self.config.bootstrap_servers
        last: UpstreamError | None = None
        for _ in servers:
            address = servers[self._next_bootstrap % len(servers)]
            try:
                return await connect(address, self.config.brokers_security)
            except UpstreamError as error:
                last = error
                self._next_bootstrap += 1
        assert last is not None
        raise last

    # -- rewriting --------------------------------------------------------------------

    def _entry(self, header: framing.RequestHeader, payload: bytes | None) -> _Pending:
        """What the reply to a request the gateway rewrites needs of it: the header's api
        key and version, and for FindCoordinator (whose ``payload`` the gateway reads whole)
        the key type and keys."""
        key_type = GROUP_KEY_TYPE
        keys: tuple[str, ...] = ()
        if header.api_key == FIND_COORDINATOR:
            assert payload is not None
            # Its reply depends on the key type and keys: the one request body the gateway
            # reads. As many keys as the coordinator listener takes in one request.
            _, body = framing.read_request(payload, _FIND_COORDINATOR_CAPS)
            key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
            keys = (str(body.key),) if header.api_version < 4 else tuple(body.coordinator_keys)
        return header.api_key, header.api_version, key_type, keys

    async def _rewrite(self, payload: bytes, entry: _Pending, *, coordinator_port: bool) -> bytes:
        api_key, version, key_type, keys = entry
        # A broker's ApiVersions reply rewrites to the same bytes whenever it is the same
        # (nothing of the gateway's goes into it off the coordinator port), and every client
        # connection starts with one: decoded once per broker and version, not per connection.
        cache_key = (version, payload[_CORRELATION.size :])
        if api_key == API_VERSIONS and not coordinator_port:
            cached = self._versions_replies.get(cache_key)
            if cached is not None:
                return payload[: _CORRELATION.size] + cached
        # ApiVersions v5 (KIP-1242) answers in v4's layout; kio reads up to v4.
        layout = min(version, _API_VERSIONS_LAYOUT) if api_key == API_VERSIONS else version
        try:
            schema = framing.response_type(api_key, layout)
            # Whole: a reply is what its schema reads, to the last byte.
            correlation_id, body = framing.read_response(payload, schema)
        except Exception as error:  # kio raises assorted errors on malformed input
            if api_key == API_VERSIONS and _error_code(payload) == ErrorCode.unsupported_version:
                # An UNSUPPORTED_VERSION answer comes in v0 (KIP-511): pass it on as is.
                return payload
            raise framing.FrameError(f"unreadable reply of API key {api_key}: {error}") from None
        if api_key == API_VERSIONS:
            body = self._merge_versions(body, coordinator_port)
        elif api_key == METADATA:
            brokers = await self._local_nodes(body.brokers, "node_id")
            brokers += self._coordinator_node(body.brokers, brokers, "node_id")
            body = dataclasses.replace(body, brokers=tuple(brokers))
        elif api_key == DESCRIBE_CLUSTER:
            brokers = await self._local_nodes(body.brokers, "broker_id")
            brokers += self._coordinator_node(body.brokers, brokers, "broker_id")
            body = dataclasses.replace(body, brokers=tuple(brokers))
        elif api_key == FIND_COORDINATOR:
            body = await self._find_coordinator(body, version, key_type, keys, coordinator_port)
        rewritten: bytes = framing.encode_response(api_key, layout, correlation_id, body)[4:]
        if api_key == API_VERSIONS and not coordinator_port:
            if len(self._versions_replies) >= _VERSIONS_REPLIES:
                self._versions_replies.clear()  # brokers upgraded many times over: start again
            self._versions_replies[cache_key] = rewritten[_CORRELATION.size :]
        return rewritten

    def _coordinator_node(self, nodes: Any, brokers: list[Any], id_field: str) -> list[Any]:
        """The coordinator (at the coordinator port) and each other coordinator seen so far
        (at its peer port) as nodes of a Metadata or DescribeCluster reply (of ``nodes``, the
        reply's), unless one of ``brokers`` already has the id. FindCoordinator names these
        nodes; a client that does not find one among the cluster's nodes drops its
        coordinator connection at each metadata refresh (librdkafka closes it as a "nodename
        change" after every JoinGroup). They lead no partition and none is the controller:
        the brokers' partitions and controller id are the brokers' own."""
        local = [(self.config.coordinator_node_id, self.port)]
        local += [(peer.node_id, peer.port) for peer in self._peers.values()]
        taken = {int(getattr(b, id_field)) for b in brokers}
        if not nodes:
            return []
        return [
            _replace(
                nodes[0],
                {id_field: i32(node_id), "host": self.config.host, "port": i32(port), "rack": None},
            )
            for node_id, port in local
            if node_id not in taken
        ]

    async def _local_nodes(self, nodes: Any, id_field: str) -> list[Any]:
        """The brokers of a reply that the gateway's own Metadata confirms, each with the
        address of its local port; the others are left out."""
        local = []
        for node in nodes:
            node_id, address = int(getattr(node, id_field)), (str(node.host), int(node.port))
            broker = await self._confirmed(node_id, address)
            if broker is not None:
                local.append(
                    dataclasses.replace(node, host=self.config.host, port=i32(broker.port))
                )
        return local

    async def _confirmed(self, node_id: int, address: tuple[str, int]) -> _Broker | None:
        """The port of broker ``node_id`` at ``address`` (opened on first use) if the
        gateway's own Metadata names that broker there; ``None`` if it does not: such a
        node is never connected to, whoever named it.

        The brokers are asked again when a reply names a broker they did not (a broker
        joined or moved), at most once per ``_CLUSTER_REFRESH_S``."""
        if self._cluster.get(node_id) != address:
            asked = time.monotonic()
            async with self._cluster_lock:
                # Not again if another reply's check refreshed the view meanwhile, or lately.
                if asked - self._cluster_asked >= _CLUSTER_REFRESH_S:
                    await self._refresh_cluster()
            if self._cluster.get(node_id) != address:
                now = time.monotonic()
                if now - self._unconfirmed_logged >= 10.0:
                    self._unconfirmed_logged = now
                    logger.warning(
                        "a reply names broker %s at %s:%s, which the brokers' own metadata "
                        "does not: left out of the reply",
                        node_id,
                        *address,
                    )
                return None
        return await self._broker(node_id, address)

    async def _refresh_cluster(self) -> None:
        """The brokers, as a Metadata request of the gateway's own to the bootstrap servers
        answers (on a connection kept for it); ports already open follow a moved broker."""
        self._cluster_asked = time.monotonic()
        try:
            if self._cluster_link is None:
                self._cluster_link = await self._connect_cluster()
            reader, writer, version = self._cluster_link
            self._cluster_calls += 1
            async with asyncio.timeout(10.0):
                reply = await connection.call(
                    reader, writer, _metadata_request(version), self._cluster_calls
                )
        except Exception as error:  # unreachable, refused, or a reply kio cannot read
            logger.warning("cannot ask the brokers for their nodes: %s", error)
            if self._cluster_link is not None:
                await _close(self._cluster_link[1])
                self._cluster_link = None
            return
        self._cluster = {int(b.node_id): (str(b.host), int(b.port)) for b in reply.brokers}
        for node_id, broker in self._brokers.items():
            address = self._cluster.get(node_id)
            if address is not None and address != broker.address:
                logger.info("broker %s moved to %s:%s", node_id, *address)
                broker.address = address  # new connections go there

    async def _connect_cluster(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
        """The gateway's own connection to a bootstrap server, and the Metadata version it
        asks with (ApiVersions v0, which every broker answers)."""
        reader, writer = await self._connect_bootstrap()
        try:
            async with asyncio.timeout(10.0):
                versions = await connection.call(reader, writer, ApiVersionsV0Request(), 0)
            if versions.error_code != ErrorCode.none:
                raise UpstreamError(f"ApiVersions: {versions.error_code.name.upper()}")
            ranges = {
                int(k.api_key): (int(k.min_version), int(k.max_version)) for k in versions.api_keys
            }
            low, high = ranges.get(METADATA, (0, -1))
            version = min(high, _REWRITTEN_MAX[METADATA])
            if version < max(low, 1):
                raise UpstreamError(f"no Metadata version in common (the broker's: {low}-{high})")
        except BaseException:
            await _close(writer)
            raise
        return reader, writer, version

    async def _broker(self, node_id: int, address: tuple[str, int]) -> _Broker:
        """The local port of broker ``node_id``, opened on first use; its connections go to
        ``address`` (from the gateway's own Metadata) from now on."""
        async with self._broker_lock:
            broker = self._brokers.get(node_id)
            if broker is None:
                server = await asyncio.get_running_loop().create_server(
                    lambda: self._broker_port_connection(node_id), self.config.host, 0
                )
                broker = self._brokers[node_id] = _Broker(node_id, address, server)
                logger.info("broker %s (%s:%s) on port %s", node_id, *address, broker.port)
            elif broker.address != address:
                # New connections go to the broker's new address.
                broker.address = address
            return broker

    async def _find_coordinator(
        self,
        body: Any,
        version: int,
        key_type: int,
        keys: tuple[str, ...],
        coordinator_port: bool,
    ) -> Any:
        owners: dict[str, tuple[int, str, int]] = {}
        if key_type == GROUP_KEY_TYPE and not coordinator_port:
            # A broker's answer: the listener says who coordinates these groups.
            owners = await self._owners(keys)

        async def place(
            key: str, node_id: int, host: str, port: int, error: ErrorCode
        ) -> tuple[Any, ...]:
            if key_type == GROUP_KEY_TYPE:
                if coordinator_port and error != ErrorCode.none:
                    return (node_id, host, port, error)  # the listener's refusal, as it is
                # The listener's answer on the coordinator ports; for a broker's, the
                # listener's if it gave one, else ours coordinates the group.
                owner = (node_id, host, port) if coordinator_port else owners.get(key)
                return (*await self._coordinator_local(owner), ErrorCode.none)
            if error != ErrorCode.none:
                return (node_id, host, port, error)
            # A transaction (or share) coordinator: a broker the gateway's own Metadata names.
            broker = await self._confirmed(node_id, (host, port))
            if broker is None:
                return (-1, "", -1, ErrorCode.coordinator_not_available)
            return (node_id, self.config.host, broker.port, error)

        if version < 4:
            node_id, host, port, error = await place(
                keys[0] if keys else "",
                int(body.node_id),
                str(body.host),
                int(body.port),
                body.error_code,
            )
            fields: dict[str, Any] = {"node_id": i32(node_id), "host": host, "port": i32(port)}
            if error != body.error_code:
                fields.update(error_code=error, error_message=None)
            return _replace(body, fields)
        coordinators = []
        for entry in body.coordinators:
            node_id, host, port, error = await place(
                str(entry.key),
                int(entry.node_id),
                str(entry.host),
                int(entry.port),
                entry.error_code,
            )
            coordinators.append(
                dataclasses.replace(
                    entry,
                    node_id=i32(node_id),
                    host=host,
                    port=i32(port),
                    error_code=error,
                    error_message=entry.error_message if error == entry.error_code else None,
                )
            )
        return dataclasses.replace(body, coordinators=tuple(coordinators))

    async def _coordinator_local(self, owner: tuple[int, str, int] | None) -> tuple[int, str, int]:
        """The local node standing for the coordinator listener ``owner`` (node id, host,
        port): the coordinator port for the configured one (or no owner known), else that
        peer's port."""
        # Not by node id: the configured address may be a Service, whose every connection
        # may reach another replica, so only the owner's own address reaches it each time.
        if owner is None or owner[1:] == self.config.coordinator:
            return self.config.coordinator_node_id, self.config.host, self.port
        address = (owner[1], owner[2])
        async with self._broker_lock:
            peer = self._peers.get(address)
            if peer is None:
                server = await asyncio.start_server(
                    lambda r, w: self._serve_peer_port(address, r, w),
                    self.config.host,
                    0,
                    limit=_COORDINATOR_STREAM_LIMIT,
                )
                node_id = self.config.coordinator_node_id + 1 + len(self._peers)
                peer = self._peers[address] = _PeerCoordinator(node_id, address, server)
                logger.info("coordinator %s:%s on port %s", *address, peer.port)
        return peer.node_id, self.config.host, peer.port

    async def _owners(self, keys: tuple[str, ...]) -> dict[str, tuple[int, str, int]]:
        """Who coordinates each group, as the configured listener answers FindCoordinator
        (v4, batched); groups it refuses, and any failure, are left out (the caller then
        names the configured listener, as with a single coordinator)."""
        if not keys:
            return {}
        async with self._resolver_lock:
            try:
                if self._resolver is None:
                    self._resolver = await self._connect_listener(self.config.coordinator)
                self._resolver_calls += 1
                request = FindCoordinatorRequest(
                    key_type=i8(GROUP_KEY_TYPE), coordinator_keys=tuple(keys)
                )
                async with asyncio.timeout(10.0):
                    reply = await connection.call(*self._resolver, request, self._resolver_calls)
            except (OSError, TimeoutError, framing.FrameError, UpstreamError) as error:
                logger.info("cannot ask the coordinator listener who coordinates: %s", error)
                if self._resolver is not None:
                    await _close(self._resolver[1])
                    self._resolver = None
                return {}
        return {
            str(entry.key): (int(entry.node_id), str(entry.host), int(entry.port))
            for entry in reply.coordinators
            if entry.error_code == ErrorCode.none
        }

    def _merge_versions(self, body: Any, coordinator_port: bool) -> Any:
        """The brokers' ApiVersions, the replies the gateway rewrites capped at the versions
        kio reads (a client never sends one the gateway could not rewrite); on the
        coordinator port, the group APIs' ranges are the listener's (a group API the
        listener does not serve is not advertised there)."""
        if body.error_code != ErrorCode.none or not body.api_keys:
            return body
        version_type = type(body.api_keys[0])
        keys = []
        for key in body.api_keys:
            api_key, low, high = int(key.api_key), int(key.min_version), int(key.max_version)
            if coordinator_port and api_key in GROUP_APIS and self._listener_versions:
                continue
            if api_key in _REWRITTEN_MAX:
                high = min(high, _REWRITTEN_MAX[api_key])
                if high < low:
                    continue
                key = dataclasses.replace(key, max_version=i16(high))
            keys.append(key)
        if coordinator_port:
            for api_key in sorted(GROUP_APIS & self._listener_versions.keys()):
                low, high = self._listener_versions[api_key]
                if api_key in _REWRITTEN_MAX:
                    high = min(high, _REWRITTEN_MAX[api_key])
                keys.append(
                    version_type(api_key=i16(api_key), min_version=i16(low), max_version=i16(high))
                )
        keys.sort(key=lambda key: int(key.api_key))
        return dataclasses.replace(body, api_keys=tuple(keys))


# The newest ApiVersions response layout: v5 (KIP-1242) changed only what the broker checks.
_API_VERSIONS_LAYOUT = 4


def _unpinned_api_versions(payload: bytes) -> bytes:
    """An ApiVersions v5+ request without the ClusterId and NodeId that name the node the
    client means (KIP-1242, null and -1: not known): on the coordinator port that is the
    coordinator's node, which the broker answering the request is not, and it would answer
    REBOOTSTRAP_REQUIRED (and a ClusterId alone is INVALID_REQUEST). Anything unexpected in
    the bytes leaves them as they are."""
    try:
        (version,) = struct.unpack_from(">h", payload, 2)
        if version < 5:
            return payload
        # Request header v2: api key, version, correlation id, client id, tagged fields.
        (client_id_length,) = struct.unpack_from(">h", payload, 8)
        at = 10 + max(client_id_length, 0)
        at = _skip_tagged_fields(payload, at)
        # Body: ClientSoftwareName, ClientSoftwareVersion (compact strings), ClusterId
        # (compact nullable string), NodeId (int32).
        for _ in range(2):
            length, at = _uvarint(payload, at)
            at += max(length - 1, 0)
        cluster_id_at = at
        length, at = _uvarint(payload, at)
        at += max(length - 1, 0)
        if at + 4 > len(payload):
            return payload
    except (struct.error, IndexError, ValueError):
        return payload
    return payload[:cluster_id_at] + b"\x00" + struct.pack(">i", -1) + payload[at + 4 :]


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 28:
            raise ValueError("varint too long")


def _skip_tagged_fields(data: bytes, at: int) -> int:
    count, at = _uvarint(data, at)
    for _ in range(count):
        _, at = _uvarint(data, at)
        size, at = _uvarint(data, at)
        at += size
    return at


def _kio_max_version(api_key: int) -> int:
    version = 0
    while framing.request_type(api_key, version + 1) is not None:
        version += 1
    return version


# The highest version of each rewritten reply that kio reads (ListGroups: the broker ports
# answer it themselves).
_REWRITTEN_MAX = {
    api_key: _kio_max_version(api_key)
    for api_key in (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, LIST_GROUPS)
}


def _replace(body: Any, fields: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(body)}
    return dataclasses.replace(body, **{k: v for k, v in fields.items() if k in names})


def _error_code(payload: bytes) -> int | None:
    """The int16 after a reply's correlation id (ApiVersions' error code)."""
    if len(payload) < _CORRELATION.size + 2:
        return None
    return int.from_bytes(payload[_CORRELATION.size : _CORRELATION.size + 2], "big", signed=True)


def _metadata_request(version: int) -> Any:
    """A Metadata request of ``version`` for no topic: the brokers only."""
    schema = framing.request_type(METADATA, version)
    assert schema is not None
    return schema(
        **{
            name: value
            for name, value in {
                "topics": (),
                "allow_auto_topic_creation": False,
                "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False,
            }.items()
            if name in {f.name for f in dataclasses.fields(schema)}
        }
    )


def _no_groups(version: int, correlation_id: int) -> bytes:
    """A framed ListGroups reply of ``version`` listing no group: a broker port's answer.

    Through the gateway every group's coordinator is the coordinator (FindCoordinator names
    it whichever node is asked), and a client lists groups by asking every node of the
    cluster, the coordinator's node included: so the coordinator's list, of what the
    gateway's group may see, is the listing. A broker's own list would add the brokers'
    mirrored copies of the coordinator's groups (classic, state unknown: the group twice)
    and every other tenant's, which the client could neither describe nor join."""
    schema = framing.response_type(LIST_GROUPS, version)
    fields = {"throttle_time": datetime.timedelta(0), "error_code": ErrorCode.none, "groups": ()}
    names = {f.name for f in dataclasses.fields(schema)}
    body = schema(**{name: value for name, value in fields.items() if name in names})
    return framing.encode_response(LIST_GROUPS, version, correlation_id, body)


async def _first_to_end(*pumps: Any) -> None:
    """Run both directions of a connection; when one ends (or fails), end the other."""
    tasks = [asyncio.ensure_future(pump) for pump in pumps]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in done:
        task.result()  # the failure, if any, closes the connection with its reason


class _Lane:
    """One upstream of the coordinator port: it answers in order, so a FIFO of futures."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_bytes: int
    ) -> None:
        self.writer = writer
        self._waiting: collections.deque[tuple[int, asyncio.Future[bytes]]] = collections.deque()
        self._reader = asyncio.ensure_future(self._read(reader, max_bytes))

    @property
    def ended(self) -> asyncio.Future[None]:
        """Done once the upstream connection is closed (or broke the protocol)."""
        return self._reader

    def send(self, payload: bytes, correlation_id: int) -> asyncio.Future[bytes]:
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if self._reader.done():
            reply.set_exception(UpstreamError("the upstream connection is closed"))
            return reply
        self._waiting.append((correlation_id, reply))
        _write_frame(self.writer, payload)
        return reply

    async def _read(self, reader: asyncio.StreamReader, max_bytes: int) -> None:
        error: BaseException = UpstreamError("the upstream closed the connection")
        try:
            while (payload := await framing.read_frame(reader, max_bytes)) is not None:
                if not self._waiting:
                    raise framing.FrameError("a reply to no request")
                correlation_id, reply = self._waiting.popleft()
                if framing.peek_correlation(payload) != correlation_id:
                    raise framing.FrameError(
                        f"reply {framing.peek_correlation(payload)} to request {correlation_id}"
                    )
                reply.set_result(payload)
        except (framing.FrameError, ConnectionError, ssl.SSLError) as failure:
            error = failure
        except asyncio.CancelledError:
            error = UpstreamError("closed")
        finally:
            while self._waiting:
                _, reply = self._waiting.popleft()
                reply.set_exception(error)

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        await _close(self.writer)


# --- the broker ports -------------------------------------------------------------------

# The requests whose replies the gateway rewrites (on every port).
_REWRITTEN = frozenset({API_VERSIONS, METADATA, DESCRIBE_CLUSTER, FIND_COORDINATOR})
# Flow control on the broker ports: a transport holding more than this toward a side that
# reads slower than the other side sends (a client behind its broker's Fetch replies) stops
# the sending side being read until it is down to _WRITE_LOW. It bounds what a connection
# buffers; high enough that a client keeping up never makes the gateway pause its broker.
_WRITE_HIGH = 1024 * 1024
_WRITE_LOW = 256 * 1024
# How a frame on a broker port goes: its bytes pass on as they come, or it is gathered whole
# (to be read, then forwarded or rewritten), or its bytes are dropped as they come (a reply
# the gateway answers itself).
_PASS, _GATHER, _DROP = range(3)


@dataclass(slots=True)
class _Outstanding:
    """A request on a broker port awaiting its reply: its correlation id, and what its reply
    needs to be rewritten (``None``: it passes as it is)."""

    correlation_id: int
    entry: _Pending | None
    # A Produce request with acks=0: Kafka's broker sends no reply, but one that does (tansu)
    # is matched too.
    optional: bool = False
    # An optional request given up (too many outstanding): a reply to it matches no more.
    forgotten: bool = False


class _Refused(asyncio.Protocol):
    """A connection past a port's limit: closed at once."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _BrokerConnection:
    """A client's connection to a broker port and the gateway's connection to that broker,
    each side a ``_Frames`` forwarding what it receives to the other side's transport.
    ``start`` runs the gateway's part (connecting to the broker, then ``run``) once the client
    is connected; its first failure or either side's end ends both (``end``).

    Replies are matched to requests in order, as a Kafka broker answers a connection's
    requests one at a time in the order they came (its ``RequestChannel`` mutes the
    connection until the reply is sent), never by correlation id alone, which the client
    chooses: every request is noted in ``outstanding``, in order, the ones that pass through
    undecoded included. A Produce request with acks=0 expects no reply (Kafka's broker sends
    none, and its ``NetworkClient`` expects none); a broker that answers one anyway (tansu
    does) is matched too, in its place, and a later reply means none is coming. A reply
    whose correlation id is not the oldest outstanding request's (past those acks=0 ones),
    or a request reusing the correlation id of one outstanding, ends the connection: a reply
    is never read as another request's."""

    def __init__(
        self, config: GatewayConfig, start: Callable[[_BrokerConnection], asyncio.Future[None]]
    ) -> None:
        self.config = config
        self.outstanding: collections.deque[_Outstanding] = collections.deque()
        self.outstanding_ids: set[int] = set()
        # The optional ones among them (not forgotten), oldest first; how many others.
        self.optional: collections.deque[_Outstanding] = collections.deque()
        self.awaited = 0
        self.client = _Requests(self, config.max_request_bytes)
        self.upstream = _Replies(self, config.max_response_bytes)
        self.client.other, self.upstream.other = self.upstream, self.client
        self.tasks: set[asyncio.Future[None]] = set()
        self.entry: Callable[[framing.RequestHeader, bytes | None], _Pending]
        self.rewrite: Callable[[bytes, _Pending], Awaitable[bytes]]
        self._start = start
        self._task: asyncio.Future[None] | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def started(self) -> None:
        self._task = self._start(self)

    async def run(
        self,
        transport: asyncio.BaseTransport,
        entry: Callable[[framing.RequestHeader, bytes | None], _Pending],
        rewrite: Callable[[bytes, _Pending], Awaitable[bytes]],
    ) -> None:
        """Forward between the client and ``transport`` (the broker's, handshakes done) until
        either side ends; raises the failure that ended them, if any."""
        self.entry, self.rewrite = entry, rewrite
        transport.set_protocol(self.upstream)
        self.upstream.attach(transport)
        self.client.release("upstream")
        await self._done

    def expect(
        self, correlation_id: int, entry: _Pending | None, *, optional: bool = False
    ) -> _Outstanding:
        """Note a request forwarded to the broker (``optional``: one it need not answer)."""
        if correlation_id in self.outstanding_ids:
            raise framing.FrameError(
                f"correlation id {correlation_id} reused while its request awaits its reply"
            )
        request = _Outstanding(correlation_id, entry, optional)
        self.outstanding.append(request)
        self.outstanding_ids.add(correlation_id)
        if not optional:
            self.awaited += 1
            if self.awaited >= _MAX_OUTSTANDING:
                self.client.pause("in flight")
            return request
        self.optional.append(request)
        if len(self.optional) > _MAX_OUTSTANDING:
            # A producer sending acks=0 to a broker that never answers them: not tracked for
            # ever. A reply to one given up would close the connection.
            given_up = self.optional.popleft()
            given_up.forgotten = True
            self.outstanding_ids.discard(given_up.correlation_id)
            while self.outstanding and self.outstanding[0].forgotten:
                self.outstanding.popleft()
        return request

    def answered(self, correlation_id: int) -> _Outstanding:
        """The request a reply with ``correlation_id`` answers: the oldest outstanding, past
        the acks=0 Produce requests before it that it does not answer."""
        while self.outstanding:
            oldest = self.outstanding.popleft()
            if oldest.forgotten:
                continue
            self.outstanding_ids.discard(oldest.correlation_id)
            if oldest.optional:
                self.optional.popleft()  # the oldest of them
                if oldest.correlation_id == correlation_id:
                    return oldest
                continue  # never answered, as Kafka's broker does
            self.awaited -= 1
            if self.awaited < _MAX_OUTSTANDING:
                self.client.resume("in flight")
            if correlation_id != oldest.correlation_id:
                raise framing.FrameError(
                    f"reply {correlation_id} while the oldest request awaiting one is "
                    f"{oldest.correlation_id}"
                )
            return oldest
        raise framing.FrameError(f"a reply ({correlation_id}) to no request")

    @property
    def ended(self) -> bool:
        return self._done.done()

    def end(self, error: BaseException | None = None) -> None:
        if self._done.done():
            return
        if error is None:
            self._done.set_result(None)
        else:
            self._done.set_exception(error)

    def close(self) -> None:
        self.end()
        if not self._done.cancelled():
            self._done.exception()  # reported by ``run`` if it got that far, else moot
        for task in self.tasks:
            task.cancel()
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()  # what is written is still sent


class _Frames(asyncio.Protocol):
    """One side of a broker port's connection: what its transport receives is cut into
    frames as it arrives and written to the other side's transport. Only each frame's size
    and first bytes are looked at (``decide``), and a frame passes on as its bytes come (a
    Fetch reply of several MB reaches the client while the broker is still sending it), in
    the pieces the transport hands over; nothing of it is kept. A frame ``decide`` gathers
    instead (a request or reply the gateway reads, at most ``max_gathered_bytes``, or
    ``max_metadata_reply_bytes`` for a Metadata reply) is given whole to ``whole``; one it
    drops is not kept either, and ``whole`` gets ``None`` at its end. While ``whole``'s
    answer is awaited (a rewritten reply), this side is not read and what follows waits, so
    that frames keep their order."""

    other: _Frames

    def __init__(self, connection: _BrokerConnection, head: int, max_bytes: int) -> None:
        self.connection = connection
        self.transport: asyncio.Transport | None = None
        # Where frames go: the other side's transport.
        self._sink: asyncio.Transport
        # The bytes of a frame's start that ``decide`` needs at least (after the size).
        self._head = head
        self._max_bytes = max_bytes
        # The current frame: its bytes not received yet, how they go, and (gathered) those
        # received.
        self._remaining = 0
        self._mode = _PASS
        self._payload = bytearray()
        # The start of a frame too short yet to decide on, and how long it must get (from
        # its size prefix on) before ``decide`` is asked again.
        self._partial = bytearray()
        self._need = 0
        # What arrived while this side waits (for the broker's connection, or for a reply
        # being rewritten), fed on once the wait is over.
        self._held: bytearray | None = None
        self._eof = False
        self._paused: set[str] = set()

    # -- what a side decides (``_Requests``, ``_Replies``) -----------------------------

    def decide(self, data: bytes, start: int, end: int, size: int) -> int | None:
        """How the frame at ``data[start]`` (its size prefix, ``size``, then at least
        ``head`` bytes; what has arrived ends at ``end``) goes: ``_PASS``, ``_GATHER`` or
        ``_DROP``; or ``None`` until ``self._need`` bytes of it have arrived."""
        raise NotImplementedError

    def whole(self, payload: bytes | None) -> Awaitable[bytes] | None:
        """A gathered frame's payload (``None`` for a dropped one): forwarded (or answered)
        here (``None``), or what to await for the payload to forward in its place."""
        raise NotImplementedError

    # -- the transport's side ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach(transport)

    def attach(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        self.transport = typing.cast(asyncio.Transport, transport)
        self.other._sink = self.transport
        self.transport.set_write_buffer_limits(_WRITE_HIGH, _WRITE_LOW)
        if self._paused:
            self.transport.pause_reading()

    def pause(self, reason: str) -> None:
        """Stop reading this side (until every reason given is resumed)."""
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self._paused:
            return
        self._paused.discard(reason)
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        # This side's transport holds too much of what the other side sent: stop reading it.
        self.other.pause("full")

    def resume_writing(self) -> None:
        self.other.resume("full")

    def data_received(self, data: bytes) -> None:
        if self.connection.ended:
            return
        if self._held is not None:
            self._held += data
            # Not read meanwhile (uvloop starts reading a server's connection after
            # ``connection_made``, whatever it paused).
            if self._paused and self.transport is not None:
                self.transport.pause_reading()
            return
        if self._mode == _PASS and self._remaining >= len(data):
            # Inside a frame that passes on: by far the most bytes, handed on as they are.
            self._remaining -= len(data)
            self._sink.write(data)
            return
        try:
            self._feed(data)
        except Exception as error:  # a hostile frame: this connection ends with the reason
            self.connection.end(error)

    def _feed(self, data: bytes) -> None:
        if self._partial:
            self._partial += data
            if len(self._partial) < self._need:
                return
            data, self._partial = bytes(self._partial), bytearray()
        view = memoryview(data)
        end = len(data)
        # data[run:at] passes on in one write: the bytes of this piece from frames that pass.
        at = run = 0
        while at < end:
            if self._remaining:
                take = min(self._remaining, end - at)
                if self._mode == _GATHER:
                    self._payload += view[at : at + take]
                at += take
                self._remaining -= take
                if self._mode == _PASS:
                    continue
                run = at
                if self._remaining:
                    continue
                payload = bytes(self._payload) if self._mode == _GATHER else None
                self._payload, self._mode = bytearray(), _PASS
                waiting = self.whole(payload)
                if waiting is not None:
                    self._wait(waiting, data[at:])
                    return
                continue
            if end - at < 4 + self._head:
                if end - at >= 4:
                    self._size(data, at)  # a bad size ends the connection without waiting
                self._hold(data, at, 4 + self._head)
                break
            size = self._size(data, at)
            mode = self.decide(data, at, end, size)
            if mode is None:
                self._hold(data, at, self._need)
                break
            if mode == _PASS:
                self._remaining = 4 + size
                continue
            if run < at:
                self._sink.write(view[run:at])
            self._mode = mode
            at += 4
            self._remaining = size
            run = at
        if run < at:
            self._sink.write(view[run:at])

    def _hold(self, data: bytes, start: int, need: int) -> None:
        """Keep the start of a frame until ``need`` bytes of it (from its size on) came."""
        self._partial = bytearray(data[start:])
        self._need = need

    def _size(self, data: bytes, start: int) -> int:
        size = int.from_bytes(data[start : start + 4], "big", signed=True)
        if size < self._head or size > self._max_bytes:
            raise framing.FrameTooLarge(
                f"frame of {size} bytes (from {self._head} to {self._max_bytes})"
            )
        return size

    def _gathered(self, size: int, limit: int, what: str) -> int:
        """``_GATHER``, for a frame no larger than ``limit``."""
        if size > limit:
            raise framing.FrameTooLarge(f"{what} of {size} bytes (the limit is {limit})")
        return _GATHER

    def _wait(self, waiting: Awaitable[bytes], rest: bytes) -> None:
        self._held = bytearray(rest)
        self.pause("rewrite")
        task = asyncio.ensure_future(self._forward(waiting))
        self.connection.tasks.add(task)
        task.add_done_callback(self._forwarded)

    async def _forward(self, waiting: Awaitable[bytes]) -> None:
        payload = await waiting
        # Two writes: no copy of the payload just to prefix its size.
        self._sink.write(len(payload).to_bytes(4, "big"))
        self._sink.write(payload)

    def _forwarded(self, task: asyncio.Future[None]) -> None:
        self.connection.tasks.discard(task)
        if task.cancelled():
            return
        if (error := task.exception()) is not None:
            self.connection.end(error)
            return
        self.release("rewrite")

    def release(self, reason: str) -> None:
        """Read again, and forward first what was held while ``reason`` paused this side."""
        assert self._held is not None
        held, self._held = bytes(self._held), None
        self.resume(reason)
        if held and not self.connection.ended:
            try:
                self._feed(held)
            except Exception as error:
                self.connection.end(error)
        if self._eof and self._held is None:
            self._ended()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.connection.end(exc)
        elif self._held is not None:
            self._eof = True  # once what is held is forwarded
        else:
            self._ended()

    def _ended(self) -> None:
        if 0 < len(self._partial) < 4:
            self.connection.end(framing.FrameError("connection closed inside a frame's size"))
        elif self._partial or self._remaining:
            self.connection.end(framing.FrameError("connection closed inside a frame"))
        else:
            self.connection.end()


class _Requests(_Frames):
    """The client's side: every request expecting a reply is noted (``expect``) as it
    passes; a FindCoordinator request is gathered whole, its keys being what its reply
    needs."""

    def __init__(self, connection: _BrokerConnection, max_bytes: int) -> None:
        super().__init__(connection, _FIXED_HEADER.size, max_bytes)
        # Held until the broker is connected: there is nowhere to forward to before.
        self._held = bytearray()
        self.pause("upstream")
        self._gathering: _Outstanding | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.connection.started()

    def decide(self, data: bytes, start: int, end: int, size: int) -> int | None:
        api_key, version, correlation_id = _FIXED_HEADER.unpack_from(data, start + 4)
        if api_key == PRODUCE:
            try:
                acks = _produce_acks(data, start, end, size)
            except _NeedMore as more:
                self._need = more.size
                return None
            if acks == 0:
                self.connection.expect(correlation_id, None, optional=True)
                return _PASS
        elif api_key == LIST_GROUPS and framing.request_type(LIST_GROUPS, version) is None:
            raise framing.FrameError(f"ListGroups v{version}, which the gateway cannot answer")
        entry: _Pending | None = None
        if api_key in _REWRITTEN or api_key == LIST_GROUPS:
            entry = (api_key, version, GROUP_KEY_TYPE, ())
        request = self.connection.expect(correlation_id, entry)
        if api_key == FIND_COORDINATOR:
            self._gathering = request
            return self._gathered(size, self.connection.config.max_gathered_bytes, "request")
        return _PASS

    def whole(self, payload: bytes | None) -> None:
        assert payload is not None
        assert self._gathering is not None
        header = framing.peek_request_header(payload)
        self._gathering.entry = self.connection.entry(header, payload)
        self._gathering = None
        self._sink.write(len(payload).to_bytes(4, "big"))
        self._sink.write(payload)
        return None


class _Replies(_Frames):
    """The broker's side: each reply answers the oldest outstanding request; the replies to
    the requests the gateway rewrites are gathered whole and rewritten, a ListGroups reply
    is dropped and answered with no group (``_no_groups``), the others pass on."""

    def __init__(self, connection: _BrokerConnection, max_bytes: int) -> None:
        super().__init__(connection, _CORRELATION.size, max_bytes)
        self._answered: _Outstanding | None = None

    def decide(self, data: bytes, start: int, end: int, size: int) -> int:
        (correlation_id,) = _CORRELATION.unpack_from(data, start + 4)
        request = self._answered = self.connection.answered(correlation_id)
        if request.entry is None:
            return _PASS
        if request.entry[0] == LIST_GROUPS:
            return _DROP
        config = self.connection.config
        if request.entry[0] == METADATA:
            return self._gathered(size, config.max_metadata_reply_bytes, "Metadata reply")
        return self._gathered(size, config.max_gathered_bytes, "reply")

    def whole(self, payload: bytes | None) -> Awaitable[bytes] | None:
        request = self._answered
        assert request is not None
        assert request.entry is not None
        if payload is None:
            self._sink.write(_no_groups(request.entry[1], request.correlation_id))
            return None
        return self.connection.rewrite(payload, request.entry)


class _NeedMore(Exception):
    """More of a frame's start is needed: ``size`` bytes of it, from its size prefix on."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _produce_acks(data: bytes, start: int, end: int, size: int) -> int:
    """The acks of the Produce request framed at ``data[start]`` (``end``: where what has
    arrived ends; ``size``: the frame's), as Kafka's broker reads it: request header v1
    (client id) or, from v9, v2 (then tagged fields); from v3 the transactional id (a compact
    string from v9); then acks. ``_NeedMore`` until enough of the frame has come;
    ``FrameError`` when the frame ends first or acks come later than ``_PRODUCE_HEAD_MAX``."""
    frame_end = start + 4 + size
    at = start + 4 + _FIXED_HEADER.size
    version = int.from_bytes(data[start + 6 : start + 8], "big", signed=True)

    def take(count: int) -> int:
        nonlocal at
        if count < 0 or at + count > frame_end:
            raise framing.FrameError("a Produce request that ends before its acks")
        if at + count - start > 4 + _PRODUCE_HEAD_MAX:
            raise framing.FrameError(f"a Produce request's acks after {_PRODUCE_HEAD_MAX} bytes")
        if at + count > end:
            raise _NeedMore(at + count - start)
        at += count
        return at - count

    def int16() -> int:
        offset = take(2)
        return int.from_bytes(data[offset : offset + 2], "big", signed=True)

    def uvarint() -> int:
        value = 0
        for shift in range(0, 35, 7):
            byte = data[take(1)]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise framing.FrameError("a varint of more than 5 bytes in a Produce request")

    flexible = version >= 9
    client_id = int16()
    if client_id < -1:
        raise framing.FrameError(f"a client id of length {client_id}")
    take(max(client_id, 0))
    if flexible:
        for _ in range(uvarint()):  # the header's tagged fields
            uvarint()
            take(uvarint())
    if version >= 3:  # the transactional id
        if flexible:
            take(max(uvarint() - 1, 0))
        else:
            length = int16()
            if length < -1:
                raise framing.FrameError(f"a transactional id of length {length}")
            take(max(length, 0))
    return int16()
