"""The gateway's upstream security: librdkafka properties -> TLS and SASL; TLS and SASL/PLAIN
against a real TLS coordinator listener; SCRAM-SHA-256/512 against a SASL server built on
``scramp``'s server side (the embedded broker speaks neither TLS nor SASL)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import scramp  # type: ignore[import-untyped]
from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup

from kafka_group_operator.access import tokens
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_operator.wire import framing
from tests.protocol.test_listener import self_signed
from tests.protocol.wire import Connection

ASYNC = pytest.mark.asyncio(loop_scope="package")

GROUP, TOKEN = "secure-group", "secure-token"


def test_properties_to_security(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    plain = kafka_connection.upstream_security({})
    assert plain == kafka_connection.Security()
    secured = kafka_connection.upstream_security(
        {
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(cert),
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "app",
            "sasl.password": "secret",
            "fetch.min.bytes": "1",  # a client setting, not the gateway's
        }
    )
    assert secured.sasl == kafka_connection.Sasl("SCRAM-SHA-512", "app", "secret")
    assert secured.tls is not None
    assert secured.tls.check_hostname
    unchecked = kafka_connection.upstream_security(
        {"security.protocol": "ssl", "ssl.endpoint.identification.algorithm": "none"}
    )
    assert unchecked.tls is not None
    assert not unchecked.tls.check_hostname
    assert unchecked.sasl is None


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"security.protocol": "kerberos"}, "security.protocol 'kerberos'"),
        ({"security.protocol": "sasl_plaintext"}, "sasl.mechanism 'GSSAPI'"),
        (
            {"security.protocol": "sasl_plaintext", "sasl.mechanism": "OAUTHBEARER"},
            "sasl.mechanism 'OAUTHBEARER'",
        ),
        (
            {"security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN"},
            "needs sasl.username and sasl.password",
        ),
        ({"security.protocol": "ssl", "ssl.ca.location": "/nonexistent/ca.crt"}, "TLS settings"),
    ],
)
def test_unusable_properties_are_refused_by_name(properties: dict[str, str], message: str) -> None:
    with pytest.raises(protocol_gateway.GatewayConfigError, match=message):
        kafka_connection.upstream_security(properties)


@pytest_asyncio.fixture(loop_scope="package")
async def tls_listener(
    runtime: coordinator_runtime.CoordinatorRuntime, tmp_path: Path
) -> AsyncIterator[tuple[protocol_listener.Listener, Path]]:
    cert, key = self_signed(tmp_path)
    served = protocol_listener.Listener(
        runtime,
        tokens.GroupTokens({GROUP: TOKEN}),
        protocol_listener.ListenerConfig(port=0, certificate_file=str(cert), key_file=str(key)),
    )
    await served.start()
    yield served, cert
    await served.stop()


@ASYNC
async def test_tls_and_plain_upstream_from_properties(
    tls_listener: tuple[protocol_listener.Listener, Path], tmp_path: Path
) -> None:
    listener, cert = tls_listener
    address = ("127.0.0.1", listener.port)
    good = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(cert),
        "sasl.mechanism": "PLAIN",
        "sasl.username": GROUP,
        "sasl.password": TOKEN,
    }
    reader, writer = await kafka_connection.connect(
        address, kafka_connection.upstream_security(good)
    )
    # Authenticated over TLS: the group's offsets are served on this connection.
    connection = Connection(reader, writer)
    try:
        request = OffsetFetchRequest(
            groups=(OffsetFetchRequestGroup(group_id=GROUP, topics=None),),  # type: ignore[arg-type]
            require_stable=False,
        )
        assert (await connection.call(request)).groups[0].error_code == ErrorCode.none
    finally:
        await connection.close()
    with pytest.raises(kafka_connection.UpstreamError, match="authentication failed"):
        await kafka_connection.connect(
            address, kafka_connection.upstream_security({**good, "sasl.password": "wrong"})
        )
    # A certificate the CA file does not vouch for is refused.
    (tmp_path / "other").mkdir()
    other_ca, _ = self_signed(tmp_path / "other")
    with pytest.raises(kafka_connection.UpstreamError, match="cannot connect"):
        await kafka_connection.connect(
            address,
            kafka_connection.upstream_security({**good, "ssl.ca.location": str(other_ca)}),
        )


@ASYNC
async def test_gateway_reaches_a_tls_listener_as_the_group(
    tls_listener: tuple[protocol_listener.Listener, Path], broker: embedded.EmbeddedBroker
) -> None:
    listener, cert = tls_listener
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", listener.port),
            coordinator_security=kafka_connection.Security(
                kafka_connection.tls_context(str(cert)),
                kafka_connection.Sasl("PLAIN", GROUP, TOKEN),
            ),
            port=0,
        )
    )
    await served.start()
    try:
        connection = await Connection.open(served.port)  # plaintext on loopback
        try:
            request = OffsetFetchRequest(
                groups=(OffsetFetchRequestGroup(group_id=GROUP, topics=None),),  # type: ignore[arg-type]
                require_stable=False,
            )
            assert (await connection.call(request)).groups[0].error_code == ErrorCode.none
        finally:
            await connection.close()
    finally:
        await served.stop()


# ---------------------------------------------------------------------------------------
# SCRAM


class ScramServer:
    """SaslHandshake v1 and SaslAuthenticate v1 with a SCRAM server (``scramp``), as a
    Kafka broker runs them (KIP-84); ``forge`` corrupts the server's final signature."""

    def __init__(self, mechanism: str, users: dict[str, str], forge: bool = False) -> None:
        self.mechanism = scramp.ScramMechanism(mechanism)
        self.users = {user: self.mechanism.make_auth_info(pw) for user, pw in users.items()}
        self.forge = forge
        self.authenticated: list[str] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server: Any = None
        users: list[str] = []

        def lookup(user: str) -> Any:
            users.append(user)
            return self.users[user]

        try:
            while (payload := await framing.read_frame(reader)) is not None:
                header, request = framing.read_request(payload)
                schema = framing.response_type(header.api_key, header.api_version)
                if header.api_key == 17:  # SaslHandshake
                    ok = request.mechanism == self.mechanism.name
                    server = self.mechanism.make_server(lookup)
                    body = schema(
                        error_code=ErrorCode.none if ok else ErrorCode.unsupported_sasl_mechanism,
                        mechanisms=(self.mechanism.name,),
                    )
                else:  # SaslAuthenticate
                    message = bytes(request.auth_bytes).decode()
                    try:
                        if server.stage is None:
                            server.set_client_first(message)
                            reply = server.get_server_first()
                        else:
                            server.set_client_final(message)
                            reply = server.get_server_final()
                            self.authenticated.append(users[-1])
                            if self.forge:
                                reply = "v=" + "A" * 44
                        body = schema(
                            error_code=ErrorCode.none,
                            error_message=None,
                            auth_bytes=reply.encode(),
                            session_lifetime=datetime.timedelta(0),
                        )
                    except (scramp.ScramException, KeyError) as error:
                        body = schema(
                            error_code=ErrorCode.sasl_authentication_failed,
                            error_message=f"Authentication failed: {error}",
                            auth_bytes=b"",
                            session_lifetime=datetime.timedelta(0),
                        )
                writer.write(
                    framing.encode_response(
                        header.api_key, header.api_version, header.correlation_id, body
                    )
                )
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@ASYNC
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_upstream(mechanism: str) -> None:
    server = ScramServer(mechanism, {"app": "pencil"})
    port = await server.start()
    address = ("127.0.0.1", port)
    try:
        security = kafka_connection.upstream_security(
            {
                "security.protocol": "sasl_plaintext",
                "sasl.mechanism": mechanism,
                "sasl.username": "app",
                "sasl.password": "pencil",
            }
        )
        _, writer = await kafka_connection.connect(address, security)
        writer.close()
        assert server.authenticated == ["app"]
        wrong = kafka_connection.Security(sasl=kafka_connection.Sasl(mechanism, "app", "nope"))
        with pytest.raises(kafka_connection.UpstreamError, match="authentication failed"):
            await kafka_connection.connect(address, wrong)
        other = "SCRAM-SHA-512" if mechanism == "SCRAM-SHA-256" else "SCRAM-SHA-256"
        mismatch = kafka_connection.Security(sasl=kafka_connection.Sasl(other, "app", "pencil"))
        with pytest.raises(kafka_connection.UpstreamError, match="UNSUPPORTED_SASL_MECHANISM"):
            await kafka_connection.connect(address, mismatch)
    finally:
        await server.stop()


@ASYNC
async def test_scram_server_signature_is_checked() -> None:
    # A server that does not know the password cannot fake the final signature (RFC 5802 §9).
    server = ScramServer("SCRAM-SHA-256", {"app": "pencil"}, forge=True)
    port = await server.start()
    try:
        security = kafka_connection.Security(
            sasl=kafka_connection.Sasl("SCRAM-SHA-256", "app", "pencil")
        )
        with pytest.raises(kafka_connection.UpstreamError, match="SCRAM-SHA-256"):
            await kafka_connection.connect(("127.0.0.1", port), security)
    finally:
        await server.stop()


@ASYNC
async def test_unreachable_upstream_is_one_error() -> None:
    port = embedded.free_port()
    with pytest.raises(kafka_connection.UpstreamError, match=f"cannot connect to 127.0.0.1:{port}"):
        await kafka_connection.connect(("127.0.0.1", port), kafka_connection.Security())


def test_tls_context_checks_the_certificate_chain(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path)
    context = kafka_connection.tls_context(str(cert))
    assert context.verify_mode == ssl.CERT_REQUIRED
