"""The gateway (``kgo gateway``): a Kafka-protocol proxy next to an unmodified Kafka client.

Kafka clients ask whichever broker they are connected to for their group's coordinator, so
the redirect to the operator's coordinator listener has to happen on the client's own
connections. The gateway listens on loopback:

- the **coordinator port** (the client's bootstrap address): group and offset APIs
  (``GROUP_APIS``) go to the coordinator listener, on a connection the gateway authenticated
  with SASL/PLAIN as the group (username = group id, password = the group's token);
  everything else (ApiVersions, Metadata, ...) goes to a broker, so that the client sees one
  consistent cluster: the brokers' topics and nodes, and our coordinator;
- one **broker port** per upstream broker, opened when a reply first names that broker: every
  request goes to that broker;
- one **peer coordinator port** per other coordinator listener, opened when FindCoordinator
  first names one (several coordinators splitting the state topic, ``protocol.peers``): it
  serves like the coordinator port, with that listener for the group APIs. A group's
  coordinator follows the listeners' answers: the coordinator port's FindCoordinator is
  answered by the listener, and a broker's answer for a group is replaced by the listener's
  (asked on a connection of the gateway's own), so that a client sent back by
  ``NOT_COORDINATOR`` lands on the group's coordinator whichever node it asks.

Requests are forwarded byte for byte; the gateway reads no further than the request header,
and keeps, per connection, the correlation ids of the requests whose replies it rewrites:
``Metadata`` and ``DescribeCluster`` (broker addresses -> the broker ports, plus the
coordinator nodes), ``FindCoordinator`` (a group's coordinator -> the coordinator port or a
peer coordinator port, a transaction coordinator -> its broker port) and ``ApiVersions``
(those three capped at the versions kio reads; on the coordinator port, the group APIs'
versions are the listener's). Produce and Fetch payloads are never decoded. Rewritten
replies are read and written with kio's types.

Toward the brokers, TLS and SASL (PLAIN, SCRAM-SHA-256/512) come from librdkafka-style
properties (``upstream_security``); the client talks plaintext to loopback. A connection
whose client or upstream breaks the protocol, or whose upstream cannot be reached, is closed
alone: the gateway and every other connection go on serving.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import ssl
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import scramp  # type: ignore[import-untyped]
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v1.request import MetadataRequest
from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.static.primitive import i8, i16, i32

from kafka_group_operator.protocol import framing

logger = logging.getLogger(__name__)

# API keys (Kafka's ApiKeys).
PRODUCE = 0
METADATA = 3
FIND_COORDINATOR = 10
API_VERSIONS = framing.API_VERSIONS_KEY
DESCRIBE_CLUSTER = 60
# What a consumer group's coordinator serves: OffsetCommit, OffsetFetch, FindCoordinator
# (group keys), JoinGroup, Heartbeat, LeaveGroup, SyncGroup, DescribeGroups, ListGroups,
# DeleteGroups, OffsetDelete, ConsumerGroupHeartbeat, ConsumerGroupDescribe.
GROUP_APIS = frozenset({8, 9, 10, 11, 12, 13, 14, 15, 16, 42, 47, 68, 69})
# FindCoordinator's key types (Kafka's FindCoordinatorRequest.CoordinatorType).
GROUP_KEY_TYPE = 0

# Kafka's socket.request.max.bytes: the largest request a broker accepts.
MAX_REQUEST_BYTES = 100 * 1024 * 1024
# Fetch replies are bounded by the client's fetch.max.bytes / receive.message.max.bytes
# (librdkafka's default is 100 MB); this bounds what a broken upstream can make us buffer.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024

# Requests of one client connection on the coordinator port awaiting their replies.
MAX_IN_FLIGHT = 64
# Stream buffers: a Fetch reply of several MB is read without pausing the socket each MB.
STREAM_LIMIT = 8 * 1024 * 1024

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_CORRELATION = struct.Struct(">i")


class GatewayConfigError(ValueError):
    """The gateway's settings are unusable (named property and reason)."""


class UpstreamError(Exception):
    """An upstream could not be reached, or refused the gateway's authentication."""


@dataclass(frozen=True)
class Sasl:
    mechanism: str
    username: str
    password: str


@dataclass(frozen=True)
class Security:
    """How the gateway connects to one side: TLS (a context) and SASL (credentials)."""

    tls: ssl.SSLContext | None = None
    sasl: Sasl | None = None


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


def parse_servers(servers: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` -> ((host, port), ...); ``GatewayConfigError`` if malformed."""
    parsed = []
    for server in servers.split(","):
        server = server.strip()
        if not server:
            continue
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise GatewayConfigError(f"{server!r} is not host:port")
        parsed.append((host.strip("[]"), int(port)))
    if not parsed:
        raise GatewayConfigError("no server given")
    return tuple(parsed)


def tls_context(
    ca_file: str | None = None,
    certificate_file: str | None = None,
    key_file: str | None = None,
    key_password: str | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client TLS context: the system's CAs or ``ca_file``, an optional client certificate."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    if certificate_file:
        context.load_cert_chain(certificate_file, key_file, key_password)
    return context


def upstream_security(properties: Mapping[str, str]) -> Security:
    """The brokers' ``Security`` from librdkafka properties (those members read from
    ``KGO_KAFKA_CONFIG_DIR``): ``security.protocol``, ``ssl.ca.location``,
    ``ssl.certificate.location``, ``ssl.key.location``, ``ssl.key.password``,
    ``ssl.endpoint.identification.algorithm``, ``sasl.mechanism(s)``, ``sasl.username``,
    ``sasl.password``. Other properties (client tuning) are not the gateway's and ignored."""
    protocol = properties.get("security.protocol", "plaintext").strip().lower()
    if protocol not in ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"):
        raise GatewayConfigError(f"security.protocol {protocol!r} is not supported")
    tls = None
    if protocol in ("ssl", "sasl_ssl"):
        verify = properties.get("ssl.endpoint.identification.algorithm", "https").lower()
        try:
            tls = tls_context(
                properties.get("ssl.ca.location"),
                properties.get("ssl.certificate.location"),
                properties.get("ssl.key.location"),
                properties.get("ssl.key.password"),
                check_hostname=verify != "none",
            )
        except (OSError, ssl.SSLError) as error:
            raise GatewayConfigError(f"TLS settings: {error}") from None
    sasl = None
    if protocol.startswith("sasl_"):
        mechanism = (
            properties.get("sasl.mechanism") or properties.get("sasl.mechanisms") or "GSSAPI"
        ).strip()
        if mechanism not in SASL_MECHANISMS:
            raise GatewayConfigError(
                f"sasl.mechanism {mechanism!r} is not supported (one of {SASL_MECHANISMS})"
            )
        username, password = properties.get("sasl.username"), properties.get("sasl.password")
        if not username or not password:
            raise GatewayConfigError(f"SASL {mechanism} needs sasl.username and sasl.password")
        sasl = Sasl(mechanism, username, password)
    return Security(tls, sasl)


# --- upstream connections -------------------------------------------------------------


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: Any, correlation_id: int
) -> Any:
    """The gateway's own request on a fresh upstream connection (before any client's)."""
    writer.write(framing.encode_request(body, correlation_id, client_id="kgo-gateway"))
    await writer.drain()
    payload = await framing.read_frame(reader)
    if payload is None:
        raise UpstreamError("the upstream closed the connection")
    schema = framing.response_type(body.__api_key__, body.__version__)
    correlation, response = framing.read_response(payload, schema)
    if correlation != correlation_id:
        raise UpstreamError(f"reply {correlation} to request {correlation_id}")
    return response


async def authenticate(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sasl: Sasl
) -> None:
    """SaslHandshake v1 then SaslAuthenticate v1 (KIP-152): PLAIN (RFC 4616) in one round,
    SCRAM (RFC 5802, as Kafka's KIP-84) in two, the server's signature checked."""
    handshake = await _call(reader, writer, SaslHandshakeRequest(mechanism=sasl.mechanism), -1)
    if handshake.error_code != ErrorCode.none:
        raise UpstreamError(
            f"SASL mechanism {sasl.mechanism} refused ({handshake.error_code.name.upper()}); "
            f"the server offers {list(handshake.mechanisms)}"
        )

    async def step(message: bytes, correlation_id: int) -> bytes:
        reply = await _call(
            reader, writer, SaslAuthenticateRequest(auth_bytes=message), correlation_id
        )
        if reply.error_code != ErrorCode.none:
            raise UpstreamError(
                f"SASL {sasl.mechanism} authentication failed: "
                f"{reply.error_message or reply.error_code.name.upper()}"
            )
        return bytes(reply.auth_bytes)

    if sasl.mechanism == "PLAIN":
        await step(f"\0{sasl.username}\0{sasl.password}".encode(), -2)
        return
    client = scramp.ScramClient([sasl.mechanism], sasl.username, sasl.password)
    server_first = await step(client.get_client_first().encode(), -2)
    try:
        client.set_server_first(server_first.decode())
        server_final = await step(client.get_client_final().encode(), -3)
        client.set_server_final(server_final.decode())
    except (scramp.ScramException, UnicodeError) as error:
        raise UpstreamError(f"SASL {sasl.mechanism}: {error}") from None


async def connect(
    address: tuple[str, int], security: Security, timeout_s: float = 10.0
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An upstream connection, TLS and SASL done; ``UpstreamError`` if that fails."""
    host, port = address
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host,
                port,
                ssl=security.tls,
                server_hostname=host if security.tls else None,
                limit=STREAM_LIMIT,
            ),
            timeout_s,
        )
    except (OSError, ssl.SSLError, TimeoutError) as error:
        raise UpstreamError(f"cannot connect to {host}:{port}: {error}") from None
    if security.sasl is not None:
        try:
            await asyncio.wait_for(authenticate(reader, writer, security.sasl), timeout_s)
        except (OSError, ssl.SSLError, TimeoutError, framing.FrameError) as error:
            writer.close()
            raise UpstreamError(f"authenticating to {host}:{port}: {error}") from None
        except UpstreamError:
            writer.close()
            raise
    return reader, writer


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
        self._listener_node_id: int | None = None
        # The listener's API versions, from the gateway's ApiVersions on each connection.
        self._listener_versions: dict[int, tuple[int, int]] = {}

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
            self._serve_coordinator_port, self.config.host, self.config.port, limit=STREAM_LIMIT
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

    # -- connections ------------------------------------------------------------------

    async def _serve(self, name: str, serve: Any, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await serve
        except (framing.FrameError, UpstreamError) as error:
            logger.info("closing a client connection on the %s: %s", name, error)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # a peer went away
        except asyncio.CancelledError:
            pass  # stop()
        except Exception:
            logger.exception("closing a client connection on the %s after an internal error", name)
        finally:
            self._connections.discard(task)
            await _close(writer)

    async def _serve_broker_port(
        self, node_id: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self._serve(f"port of broker {node_id}", self._pipe(node_id, reader, writer), writer)

    async def _pipe(
        self, node_id: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One upstream: requests and replies pass in order; only the replies whose
        correlation id is in ``pending`` are decoded (and rewritten)."""
        up_reader, up_writer = await connect(
            self._brokers[node_id].address, self.config.brokers_security
        )
        pending: dict[int, _Pending] = {}

        async def requests() -> None:
            while (start := await _frame_start(reader, self.config.max_request_bytes)) is not None:
                size, head = start
                header = framing.peek_request_header(head[4:])
                if header.api_key in (API_VERSIONS, METADATA, DESCRIBE_CLUSTER, FIND_COORDINATOR):
                    payload = head[4:] + await _rest(reader, size - len(head) + 4)
                    pending[header.correlation_id] = self._entry(header, payload)
                    _write_frame(up_writer, payload)
                else:
                    await _cut_through(reader, up_writer, head, size)
                await up_writer.drain()

        async def replies() -> None:
            limit = self.config.max_response_bytes
            while (start := await _frame_start(up_reader, limit, _CORRELATION.size)) is not None:
                size, head = start
                entry = pending.pop(_correlation(head[4:]), None)
                if entry is None:
                    await _cut_through(up_reader, writer, head, size)
                else:
                    payload = head[4:] + await _rest(up_reader, size - len(head) + 4)
                    payload = await self._rewrite(payload, entry, coordinator_port=False)
                    _write_frame(writer, payload)
                await writer.drain()

        try:
            await _first_to_end(requests(), replies())
        finally:
            await _close(up_writer)

    async def _serve_coordinator_port(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        route = self._route(reader, writer, self.config.coordinator)
        await self._serve("coordinator port", route, writer)

    async def _serve_peer_port(
        self,
        address: tuple[str, int],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        route = self._route(reader, writer, address)
        await self._serve(f"port of coordinator {address[0]}:{address[1]}", route, writer)

    async def _route(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        listener: tuple[str, int],
    ) -> None:
        """Two upstreams (the ``listener`` for ``GROUP_APIS``, a broker for the rest), each
        opened on first use; replies go back in request order, as Kafka clients expect."""
        lanes: dict[str, _Lane] = {}
        # Bounded: a client that sends without reading stops being read (as a broker mutes it).
        order: asyncio.Queue[tuple[asyncio.Future[bytes], _Pending]] = asyncio.Queue(MAX_IN_FLIGHT)

        async def lane(kind: str) -> _Lane:
            if kind not in lanes:
                if kind == "listener":
                    up_reader, up_writer = await self._connect_listener(listener)
                else:
                    up_reader, up_writer = await self._connect_bootstrap()
                lanes[kind] = _Lane(up_reader, up_writer, self.config.max_response_bytes)
            return lanes[kind]

        async def requests() -> None:
            while (
                payload := await framing.read_frame(reader, self.config.max_request_bytes)
            ) is not None:
                header = framing.peek_request_header(payload)
                if header.api_key == PRODUCE:
                    # No partition leads here; and acks=0 has no reply to keep in order.
                    raise framing.FrameError("Produce on the coordinator port")
                entry = self._entry(header, payload)
                if header.api_key == API_VERSIONS:
                    # Its reply advertises the listener's versions: know them first.
                    await lane("listener")
                to_listener = header.api_key in GROUP_APIS and (
                    header.api_key != FIND_COORDINATOR or entry[2] == GROUP_KEY_TYPE
                )
                target = await lane("listener" if to_listener else "broker")
                await order.put((target.send(payload, header.correlation_id), entry))
                await target.writer.drain()

        async def replies() -> None:
            while True:
                reply, entry = await order.get()
                payload = await reply
                if entry[0] in (API_VERSIONS, METADATA, DESCRIBE_CLUSTER, FIND_COORDINATOR):
                    payload = await self._rewrite(payload, entry, coordinator_port=True)
                _write_frame(writer, payload)
                await writer.drain()

        try:
            await _first_to_end(requests(), replies())
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
            versions = await _call(
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
            if address == self.config.coordinator and self._listener_node_id is None:
                # Its own node id (its Metadata's controller): FindCoordinator answers that
                # name it mean the coordinator port, whatever address it advertises.
                metadata = await _call(up_reader, up_writer, MetadataRequest(topics=()), -5)
                self._listener_node_id = int(metadata.controller_id)
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

    def _entry(self, header: framing.RequestHeader, payload: bytes) -> _Pending:
        key_type = GROUP_KEY_TYPE
        keys: tuple[str, ...] = ()
        if header.api_key == FIND_COORDINATOR:
            # Its reply depends on the key type and keys: the one request body the gateway
            # reads.
            _, body = framing.read_request(payload)
            key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
            keys = (str(body.key),) if header.api_version < 4 else tuple(body.coordinator_keys)
        return header.api_key, header.api_version, key_type, keys

    async def _rewrite(self, payload: bytes, entry: _Pending, *, coordinator_port: bool) -> bytes:
        api_key, version, key_type, keys = entry
        try:
            schema = framing.response_type(api_key, version)
            correlation_id, body = framing.read_response(payload, schema)
        except Exception as error:  # kio raises assorted errors on malformed input
            if api_key == API_VERSIONS:
                # An UNSUPPORTED_VERSION answer comes in v0 (KIP-511): pass it on as is.
                return payload
            raise framing.FrameError(f"unreadable reply of API key {api_key}: {error}") from None
        if api_key == API_VERSIONS:
            body = self._merge_versions(body, coordinator_port)
        elif api_key == METADATA:
            brokers = [await self._local(b, b.node_id) for b in body.brokers]
            brokers += self._coordinator_node(brokers, "node_id")
            body = dataclasses.replace(body, brokers=tuple(brokers))
        elif api_key == DESCRIBE_CLUSTER:
            brokers = [await self._local(b, b.broker_id) for b in body.brokers]
            brokers += self._coordinator_node(brokers, "broker_id")
            body = dataclasses.replace(body, brokers=tuple(brokers))
        elif api_key == FIND_COORDINATOR:
            body = await self._find_coordinator(body, version, key_type, keys, coordinator_port)
        return framing.encode_response(api_key, version, correlation_id, body)[4:]

    def _coordinator_node(self, brokers: list[Any], id_field: str) -> list[Any]:
        """The coordinator (at the coordinator port) and each other coordinator seen so far
        (at its peer port) as nodes of a Metadata or DescribeCluster reply, unless a broker
        already has the id. FindCoordinator names these nodes; a client that does not find
        one among the cluster's nodes drops its coordinator connection at each metadata
        refresh (librdkafka closes it as a "nodename change" after every JoinGroup). They
        lead no partition and none is the controller: the brokers' partitions and controller
        id are the brokers' own."""
        nodes = [(self.config.coordinator_node_id, self.port)]
        nodes += [(peer.node_id, peer.port) for peer in self._peers.values()]
        taken = {int(getattr(b, id_field)) for b in brokers}
        if not brokers:
            return []
        return [
            _replace(
                brokers[0],
                {id_field: i32(node_id), "host": self.config.host, "port": i32(port), "rack": None},
            )
            for node_id, port in nodes
            if node_id not in taken
        ]

    async def _local(self, node: Any, node_id: int) -> Any:
        """``node`` (a broker of a reply) with the address of its local port."""
        broker = await self._broker(int(node_id), (str(node.host), int(node.port)))
        return dataclasses.replace(node, host=self.config.host, port=i32(broker.port))

    async def _broker(self, node_id: int, address: tuple[str, int]) -> _Broker:
        async with self._broker_lock:
            broker = self._brokers.get(node_id)
            if broker is None:
                server = await asyncio.start_server(
                    lambda r, w: self._serve_broker_port(node_id, r, w),
                    self.config.host,
                    0,
                    limit=STREAM_LIMIT,
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
            broker = await self._broker(node_id, (host, port))
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
        if (
            owner is None
            or owner[0] == self._listener_node_id
            or owner[1:] == self.config.coordinator
        ):
            return self.config.coordinator_node_id, self.config.host, self.port
        address = (owner[1], owner[2])
        async with self._broker_lock:
            peer = self._peers.get(address)
            if peer is None:
                server = await asyncio.start_server(
                    lambda r, w: self._serve_peer_port(address, r, w),
                    self.config.host,
                    0,
                    limit=STREAM_LIMIT,
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
                reply = await asyncio.wait_for(
                    _call(*self._resolver, request, self._resolver_calls), 10.0
                )
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


def _kio_max_version(api_key: int) -> int:
    version = 0
    while framing.request_type(api_key, version + 1) is not None:
        version += 1
    return version


# The highest version of each rewritten reply that kio reads.
_REWRITTEN_MAX = {
    api_key: _kio_max_version(api_key) for api_key in (METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER)
}


def _replace(body: Any, fields: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(body)}
    return dataclasses.replace(body, **{k: v for k, v in fields.items() if k in names})


# The request header's fixed part: api key, api version, correlation id.
_REQUEST_HEAD = 8
# Pass-through frames are forwarded in pieces of at most this, as they arrive.
_CHUNK = 1024 * 1024


async def _frame_start(
    reader: asyncio.StreamReader, max_bytes: int, head: int = _REQUEST_HEAD
) -> tuple[int, bytes] | None:
    """The size of the next frame and its first bytes (size prefix and ``head`` more);
    ``None`` when the peer closed between frames."""
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return None
        raise framing.FrameError("connection closed inside a frame's size") from None
    size = int.from_bytes(prefix, "big", signed=True)
    if size < head or size > max_bytes:
        raise framing.FrameTooLarge(f"frame of {size} bytes (from {head} to {max_bytes})")
    return size, prefix + await _rest(reader, head)


async def _rest(reader: asyncio.StreamReader, size: int) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise framing.FrameError("connection closed inside a frame") from None


async def _cut_through(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, size: int
) -> None:
    """Forward a frame whose first bytes are ``head`` as its bytes arrive (a Fetch reply of
    several MB reaches the client while the broker is still sending it)."""
    writer.write(head)
    remaining = size + 4 - len(head)
    while remaining:
        chunk = await reader.read(min(remaining, _CHUNK))
        if not chunk:
            raise framing.FrameError("connection closed inside a frame")
        writer.write(chunk)
        remaining -= len(chunk)
        await writer.drain()


def _correlation(payload: bytes) -> int:
    if len(payload) < _CORRELATION.size:
        raise framing.FrameError("reply shorter than its correlation id")
    (correlation_id,) = _CORRELATION.unpack_from(payload)
    return int(correlation_id)


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
                if _correlation(payload) != correlation_id:
                    raise framing.FrameError(
                        f"reply {_correlation(payload)} to request {correlation_id}"
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
