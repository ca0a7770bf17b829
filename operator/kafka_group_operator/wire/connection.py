"""Connections of our own to Kafka brokers: TCP, TLS and SASL (PLAIN, SCRAM), then kio.

The gateway connects to the brokers and to the coordinator listener with these; the offset
mirror (``offset_commits``) commits to the brokers' groups with them. Security comes from the
librdkafka properties the rest of the operator reads (``upstream_security``), so one
``KafkaConfig`` configures every client, ours and librdkafka's alike.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import scramp  # type: ignore[import-untyped]
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from kafka_group_operator.wire import framing

# Stream buffers of connections made here: a large reply is read without pausing the
# socket each MB.
STREAM_LIMIT = 8 * 1024 * 1024

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class ConfigError(ValueError):
    """Connection settings are unusable (named property and reason)."""


class UpstreamError(Exception):
    """A broker (or the coordinator listener) could not be reached, or refused our
    authentication."""


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


def parse_servers(servers: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` -> ((host, port), ...); ``ConfigError`` if malformed."""
    parsed = []
    for server in servers.split(","):
        server = server.strip()
        if not server:
            continue
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{server!r} is not host:port")
        parsed.append((host.strip("[]"), int(port)))
    if not parsed:
        raise ConfigError("no server given")
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
        raise ConfigError(f"security.protocol {protocol!r} is not supported")
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
            raise ConfigError(f"TLS settings: {error}") from None
    sasl = None
    if protocol.startswith("sasl_"):
        mechanism = (
            properties.get("sasl.mechanism") or properties.get("sasl.mechanisms") or "GSSAPI"
        ).strip()
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"sasl.mechanism {mechanism!r} is not supported (one of {SASL_MECHANISMS})"
            )
        username, password = properties.get("sasl.username"), properties.get("sasl.password")
        if not username or not password:
            raise ConfigError(f"SASL {mechanism} needs sasl.username and sasl.password")
        sasl = Sasl(mechanism, username, password)
    return Security(tls, sasl)


# --- upstream connections -------------------------------------------------------------


async def call(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    body: Any,
    correlation_id: int,
    client_id: str = "kgo-gateway",
) -> Any:
    """One request on a connection with nothing else in flight: its reply's body."""
    writer.write(framing.encode_request(body, correlation_id, client_id=client_id))
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
    handshake = await call(reader, writer, SaslHandshakeRequest(mechanism=sasl.mechanism), -1)
    if handshake.error_code != ErrorCode.none:
        raise UpstreamError(
            f"SASL mechanism {sasl.mechanism} refused ({handshake.error_code.name.upper()}); "
            f"the server offers {list(handshake.mechanisms)}"
        )

    async def step(message: bytes, correlation_id: int) -> bytes:
        reply = await call(
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
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=security.tls,
                server_hostname=host if security.tls else None,
                limit=STREAM_LIMIT,
            )
    except (OSError, ssl.SSLError, TimeoutError) as error:
        raise UpstreamError(f"cannot connect to {host}:{port}: {error}") from None
    if security.sasl is not None:
        try:
            async with asyncio.timeout(timeout_s):
                await authenticate(reader, writer, security.sasl)
        except (OSError, ssl.SSLError, TimeoutError, framing.FrameError) as error:
            writer.close()
            raise UpstreamError(f"authenticating to {host}:{port}: {error}") from None
        except UpstreamError:
            writer.close()
            raise
    return reader, writer
