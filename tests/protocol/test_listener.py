"""The coordinator listener on the wire: framing, ApiVersions, Metadata, FindCoordinator,
SASL/PLAIN with the group tokens, TLS, and bad input that only affects its connection.

Expected bytes and error codes are Kafka's (``clients/src/main/resources/common/message``
schemas and ``org.apache.kafka.common.protocol.Errors``), written out here, not taken from
our own encoder.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import ipaddress
import logging
import struct
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsV3
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v0.request import FindCoordinatorRequest as FindCoordinatorV0
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest as FindCoordinatorV3
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as FindCoordinatorV6
from kio.schema.metadata.v1.request import MetadataRequest as MetadataV1
from kio.schema.metadata.v1.request import MetadataRequestTopic as MetadataTopicV1
from kio.schema.metadata.v12.request import MetadataRequest as MetadataV12
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from kafka_group_operator.protocol import dispatch, routes
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import framing
from tests.protocol.conftest import TOKENS
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

# Kafka's Errors: UNKNOWN_TOPIC_OR_PARTITION(3), GROUP_AUTHORIZATION_FAILED(30),
# UNSUPPORTED_SASL_MECHANISM(33), UNSUPPORTED_VERSION(35), INVALID_REQUEST(42),
# SASL_AUTHENTICATION_FAILED(58).
UNKNOWN_TOPIC_OR_PARTITION = 3
GROUP_AUTHORIZATION_FAILED = 30
UNSUPPORTED_SASL_MECHANISM = 33
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
SASL_AUTHENTICATION_FAILED = 58


def api_versions_v3() -> ApiVersionsV3:
    return ApiVersionsV3(client_software_name="tests", client_software_version="1.0")


async def assert_serving(port: int) -> None:
    """A fresh connection is answered: the listener survived whatever came before."""
    connection = await Connection.open(port)
    try:
        response = await connection.call(api_versions_v3())
        assert response.error_code == 0
    finally:
        await connection.close()


def plain(username: str, password: str) -> bytes:
    # RFC 4616: [authzid] NUL authcid NUL passwd
    return b"\0" + username.encode() + b"\0" + password.encode()


async def authenticated(port: int, group: str, token: str) -> Connection:
    connection = await Connection.open(port)
    handshake = await connection.call(SaslHandshakeRequest(mechanism="PLAIN"))
    assert handshake.error_code == 0
    assert handshake.mechanisms == ("PLAIN",)
    reply = await connection.call(SaslAuthenticateRequest(auth_bytes=plain(group, token)))
    assert reply.error_code == 0, reply
    return connection


# ---------------------------------------------------------------------------------------
# ApiVersions


async def test_api_versions_advertises_the_dispatch_table(
    open_listener: protocol_listener.Listener,
) -> None:
    connection = await Connection.open(open_listener.port)
    try:
        for request in (ApiVersionsV0(), api_versions_v3()):
            response = await connection.call(request)
            assert response.error_code == 0
            advertised = {
                key.api_key: (key.min_version, key.max_version) for key in response.api_keys
            }
            assert advertised == {
                key: (route.min_version, route.max_version) for key, route in routes.ROUTES.items()
            }
        # The APIs of the issue, with their Kafka keys.
        assert {18, 3, 10, 17, 36, 68, 69, 8, 9, 16, 15, 42} <= set(advertised)
    finally:
        await connection.close()


async def test_unsupported_api_versions_version_is_answered_in_v0(
    open_listener: protocol_listener.Listener,
) -> None:
    """As Kafka (KIP-511, ApiVersionsRequest.getErrorResponse): a v0 response with
    UNSUPPORTED_VERSION and the ApiVersions range, under a v0 response header."""
    connection = await Connection.open(open_listener.port)
    try:
        # RequestHeader v2 of ApiVersions v99: key 18, version 99, correlation 7, client
        # id "c" (int16 length), no tagged fields; an empty body the broker never parses.
        await connection.send_raw(framing.frame(struct.pack(">hhih", 18, 99, 7, 1) + b"c\0"))
        payload = await connection.read_raw()
        # ResponseHeader v0 (correlation id), then ApiVersionsResponse v0: error_code int16,
        # api_keys array (int32 count) of (api_key, min_version, max_version) int16s.
        assert payload == struct.pack(">ihihhh", 7, UNSUPPORTED_VERSION, 1, 18, 0, 4)
        # The connection stays open: the client retries with a version it shares.
        assert (await connection.call(ApiVersionsV0())).error_code == 0
    finally:
        await connection.close()


# ---------------------------------------------------------------------------------------
# Metadata and FindCoordinator


async def test_metadata_names_this_node_and_the_known_topics(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    for _ in range(100):  # the runtime polls topic metadata every 500 ms
        if topic in runtime.known_topics():
            break
        await asyncio.sleep(0.1)
    connection = await Connection.open(open_listener.port)
    try:
        response = await connection.call(
            MetadataV12(
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        (broker,) = response.brokers
        assert (broker.host, broker.port) == ("127.0.0.1", open_listener.port)
        by_name = {t.name: t for t in response.topics}
        described = by_name[topic]
        assert described.error_code == 0
        assert str(described.topic_id) == runtime.known_topics()[topic].topic_id
        assert [p.partition_index for p in described.partitions] == [0, 1, 2]
        assert {p.leader_id for p in described.partitions} == {broker.node_id}

        older = await connection.call(
            MetadataV1(topics=(MetadataTopicV1(name=topic), MetadataTopicV1(name="no-such-topic")))
        )
        assert [(t.name, t.error_code) for t in older.topics] == [
            (topic, 0),
            ("no-such-topic", UNKNOWN_TOPIC_OR_PARTITION),
        ]
        # An empty name: unknown, named "" (before v12 a topic's name cannot be null).
        empty = await connection.call(MetadataV1(topics=(MetadataTopicV1(name=""),)))
        assert [(t.name, t.error_code) for t in empty.topics] == [("", UNKNOWN_TOPIC_OR_PARTITION)]
    finally:
        await connection.close()


async def test_find_coordinator_answers_itself_for_every_group(
    open_listener: protocol_listener.Listener,
) -> None:
    connection = await Connection.open(open_listener.port)
    port = open_listener.port
    try:
        v0 = await connection.call(FindCoordinatorV0(key="orders"))
        assert (v0.error_code, v0.host, v0.port) == (0, "127.0.0.1", port)
        v3 = await connection.call(FindCoordinatorV3(key="orders", key_type=0))
        assert (v3.error_code, v3.node_id, v3.port) == (0, v0.node_id, port)
        # A transaction coordinator (key type 1) is the brokers' business.
        txn = await connection.call(FindCoordinatorV3(key="tx", key_type=1))
        assert txn.error_code == INVALID_REQUEST
        batched = await connection.call(
            FindCoordinatorV6(key_type=0, coordinator_keys=("a", "b", ""))
        )
        assert [(c.key, c.error_code, c.port) for c in batched.coordinators] == [
            ("a", 0, port),
            ("b", 0, port),
            ("", INVALID_REQUEST, -1),
        ]
    finally:
        await connection.close()


# ---------------------------------------------------------------------------------------
# SASL/PLAIN with the group tokens


async def test_sasl_plain_authenticates_a_group_with_its_token(
    secured_listener: protocol_listener.Listener,
) -> None:
    connection = await authenticated(secured_listener.port, "group-a", TOKENS["group-a"])
    try:
        response = await connection.call(
            FindCoordinatorV6(key_type=0, coordinator_keys=("group-a", "group-b"))
        )
        assert [(c.key, c.error_code) for c in response.coordinators] == [
            ("group-a", 0),
            ("group-b", GROUP_AUTHORIZATION_FAILED),
        ]
    finally:
        await connection.close()


@pytest.mark.parametrize(
    ("username", "password"),
    [("group-a", "token-b"), ("group-b", "token-a"), ("group-a", "wrong"), ("unknown", "token-a")],
)
async def test_a_wrong_token_fails_authentication_and_closes(
    secured_listener: protocol_listener.Listener, username: str, password: str
) -> None:
    connection = await Connection.open(secured_listener.port)
    try:
        await connection.call(SaslHandshakeRequest(mechanism="PLAIN"))
        reply = await connection.call(SaslAuthenticateRequest(auth_bytes=plain(username, password)))
        assert reply.error_code == SASL_AUTHENTICATION_FAILED
        assert await connection.closed_by_peer()
    finally:
        await connection.close()


async def test_only_plain_is_offered(secured_listener: protocol_listener.Listener) -> None:
    connection = await Connection.open(secured_listener.port)
    try:
        reply = await connection.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"))
        assert (reply.error_code, reply.mechanisms) == (UNSUPPORTED_SASL_MECHANISM, ("PLAIN",))
    finally:
        await connection.close()


async def test_requests_before_authentication_close_the_connection(
    secured_listener: protocol_listener.Listener,
) -> None:
    """As Kafka's SaslServerAuthenticator: only ApiVersions and SASL before authenticating."""
    connection = await Connection.open(secured_listener.port)
    try:
        assert (await connection.call(api_versions_v3())).error_code == 0
        await connection.send_raw(framing.encode_request(FindCoordinatorV0(key="group-a"), 2))
        assert await connection.closed_by_peer()
    finally:
        await connection.close()
    await assert_serving(secured_listener.port)


# ---------------------------------------------------------------------------------------
# TLS


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls_when_given_a_certificate(
    runtime: coordinator_runtime.CoordinatorRuntime, tmp_path: Path
) -> None:
    import ssl

    cert, key = self_signed(tmp_path)
    served = protocol_listener.Listener(
        runtime,
        None,
        protocol_listener.ListenerConfig(port=0, certificate_file=str(cert), key_file=str(key)),
    )
    await served.start()
    try:
        client = ssl.create_default_context(cafile=str(cert))
        connection = await Connection.open(served.port, tls=client)
        try:
            assert (await connection.call(api_versions_v3())).error_code == 0
        finally:
            await connection.close()
        # A plaintext client gets no Kafka answer from a TLS listener.
        plain_connection = await Connection.open(served.port)
        try:
            await plain_connection.send_raw(framing.encode_request(api_versions_v3(), 1))
            assert await plain_connection.closed_by_peer()
        finally:
            await plain_connection.close()
    finally:
        await served.stop()


# ---------------------------------------------------------------------------------------
# Bad input: only that connection is affected


async def test_unsupported_versions_and_unknown_apis_close_only_that_connection(
    open_listener: protocol_listener.Listener,
) -> None:
    """Kafka's RequestContext.parseRequest raises InvalidRequestException for them and the
    socket server closes the connection."""
    port = open_listener.port
    bystander = await Connection.open(port)
    try:
        for key, version in [(3, 99), (10, 7), (68, 2), (0, 9), (1, 12), (999, 0), (-1, 0)]:
            connection = await Connection.open(port)
            try:
                await connection.send_raw(framing.frame(struct.pack(">hhih", key, version, 1, -1)))
                assert await connection.closed_by_peer(), (key, version)
            finally:
                await connection.close()
        assert (await bystander.call(api_versions_v3())).error_code == 0
    finally:
        await bystander.close()


async def test_oversized_frames_close_the_connection(
    open_listener: protocol_listener.Listener,
) -> None:
    connection = await Connection.open(open_listener.port)
    try:
        too_large = open_listener.config.max_frame_bytes + 1
        await connection.send_raw(struct.pack(">i", too_large) + b"\0" * 64)
        assert await connection.closed_by_peer()
    finally:
        await connection.close()
    connection = await Connection.open(open_listener.port)
    try:
        await connection.send_raw(struct.pack(">i", -5))
        assert await connection.closed_by_peer()
    finally:
        await connection.close()
    await assert_serving(open_listener.port)


async def test_malformed_bodies_close_the_connection(
    open_listener: protocol_listener.Listener,
) -> None:
    valid = framing.encode_request(FindCoordinatorV3(key="orders", key_type=0), 1)
    header_end = 4 + 8 + 2 + len("kgo")
    for broken in (
        framing.frame(b"\x00\x03"),  # shorter than a request header
        framing.frame(valid[4:-1]),  # body cut short
        framing.frame(valid[4:] + b"extra"),  # bytes after the request
        framing.frame(valid[4:header_end] + b"\x7f\xff"),  # a string longer than the frame
    ):
        connection = await Connection.open(open_listener.port)
        try:
            await connection.send_raw(broken)
            assert await connection.closed_by_peer(), broken
        finally:
            await connection.close()
    await assert_serving(open_listener.port)


async def test_a_client_gone_mid_request_does_not_disturb_others(
    open_listener: protocol_listener.Listener,
) -> None:
    bystander = await Connection.open(open_listener.port)
    try:
        request = framing.encode_request(api_versions_v3(), 1)
        for cut in (2, 6, len(request) // 2, len(request) - 1):
            leaver = await Connection.open(open_listener.port)
            await leaver.send_raw(request[:cut])
            await leaver.close()
        # Pipelined requests on one connection are answered in order.
        await bystander.send_raw(request + framing.encode_request(ApiVersionsV0(), 2))
        first, second = await bystander.read_raw(), await bystander.read_raw()
        assert first is not None
        assert second is not None
        assert struct.unpack_from(">i", first)[0] == 1
        assert struct.unpack_from(">i", second)[0] == 2
    finally:
        await bystander.close()
    await assert_serving(open_listener.port)


async def test_idle_and_stalled_connections_are_closed(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    served = protocol_listener.Listener(
        runtime, None, protocol_listener.ListenerConfig(port=0, idle_timeout_s=0.5)
    )
    await served.start()
    try:
        idle = await Connection.open(served.port)
        stalled = await Connection.open(served.port)
        try:
            # Half a request, then nothing (a slow sender holds no connection for ever).
            await stalled.send_raw(framing.encode_request(api_versions_v3(), 1)[:7])
            assert await idle.closed_by_peer()
            assert await stalled.closed_by_peer()
        finally:
            await idle.close()
            await stalled.close()
        await assert_serving(served.port)
    finally:
        await served.stop()


async def test_a_request_trickled_in_slower_than_the_idle_timeout_is_closed(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    """The idle timeout bounds a whole request, not the gap between its bytes: a client
    sending a byte every 0.2 s with a 0.5 s timeout is closed before its request is whole."""
    served = protocol_listener.Listener(
        runtime, None, protocol_listener.ListenerConfig(port=0, idle_timeout_s=0.5)
    )
    await served.start()
    try:
        slow = await Connection.open(served.port)
        request = framing.encode_request(api_versions_v3(), 1)
        sent = 0

        async def trickle() -> None:
            nonlocal sent
            for byte in range(len(request)):
                with contextlib.suppress(ConnectionError):
                    await slow.send_raw(request[byte : byte + 1])
                sent += 1
                await asyncio.sleep(0.2)

        trickling = asyncio.create_task(trickle())
        try:
            assert await slow.closed_by_peer()
            assert sent < len(request)
        finally:
            trickling.cancel()
            await slow.close()
        await assert_serving(served.port)
    finally:
        await served.stop()


async def test_a_client_that_does_not_read_its_answers_is_closed(
    runtime: coordinator_runtime.CoordinatorRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests pipelined and answers never read: once the answers fill the socket's buffers,
    the listener stops serving that connection, and after ``idle_timeout_s`` drops it with
    the answers it still holds."""
    served = protocol_listener.Listener(
        runtime, None, protocol_listener.ListenerConfig(port=0, idle_timeout_s=0.5)
    )
    await served.start()
    caplog.set_level(logging.INFO, logger=protocol_listener.__name__)
    try:
        reader = await Connection.open(served.port)
        local = reader.writer.get_extra_info("sockname")[1]
        requests = 40_000  # about 17 MB of answers: more than loopback's socket buffers
        request = framing.encode_request(api_versions_v3(), 1)
        reader.writer.write(request * requests)
        closing = f"closing the idle connection of 127.0.0.1:{local}"
        deadline = time.monotonic() + 60
        while not any(closing in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "a client that does not read was kept"
            await asyncio.sleep(0.1)
        answered = 0
        # Dropped, maybe inside an answer: the rest of the stream ends or is reset.
        with contextlib.suppress(ConnectionError, framing.FrameError):
            while await reader.read_raw() is not None:
                answered += 1
        assert 0 < answered < requests
        await reader.close()
        await assert_serving(served.port)
    finally:
        await served.stop()


async def test_an_answer_given_at_once_never_overtakes_one_that_waits(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    """A route's ``answer_now`` answers in the callback that read the request, unless a
    request before it on the connection is still being served: answers go out in order."""
    entered, release = asyncio.Event(), asyncio.Event()
    answered_now: list[int] = []
    metadata, versions = routes.ROUTES[3], routes.ROUTES[framing.API_VERSIONS_KEY]

    async def waiting(context: dispatch.RequestContext, body: object) -> object:
        entered.set()
        await release.wait()
        return await metadata.handler(context, body)

    def at_once(context: dispatch.RequestContext, body: object) -> object:
        answered_now.append(context.header.correlation_id)
        return context.response(error_code=ErrorCode.none, api_keys=())

    table = {
        **routes.ROUTES,
        3: dataclasses.replace(metadata, handler=waiting),
        versions.api_key: dataclasses.replace(versions, answer_now=at_once),
    }
    served = protocol_listener.Listener(
        runtime, None, protocol_listener.ListenerConfig(port=0), table=table
    )
    await served.start()
    try:
        connection = await Connection.open(served.port)
        try:
            await connection.send_raw(
                framing.encode_request(
                    MetadataV12(
                        topics=None,
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False,
                    ),
                    1,
                )
                + framing.encode_request(api_versions_v3(), 2)
            )
            await asyncio.wait_for(entered.wait(), 30)
            # Another connection's round trip: the listener has read all that was sent.
            await assert_serving(served.port)
            assert 2 not in answered_now
            release.set()
            first, second = await connection.read_raw(), await connection.read_raw()
            assert first is not None
            assert second is not None
            assert [struct.unpack_from(">i", p)[0] for p in (first, second)] == [1, 2]
            assert 2 in answered_now
        finally:
            await connection.close()
    finally:
        release.set()
        await served.stop()


async def test_a_wildcard_address_is_not_advertised(
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    served = protocol_listener.Listener(
        runtime, None, protocol_listener.ListenerConfig(host="0.0.0.0", port=0)
    )
    await served.start()
    try:
        connection = await Connection.open(served.port)
        try:
            found = await connection.call(FindCoordinatorV0(key="orders"))
            assert found.host not in ("", "0.0.0.0")
            assert found.port == served.port
        finally:
            await connection.close()
    finally:
        await served.stop()


async def test_request_headers_with_tagged_fields_and_null_client_ids(
    open_listener: protocol_listener.Listener,
) -> None:
    """Bytes written out from Kafka's RequestHeader.json and FindCoordinatorRequest.json."""
    from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse

    connection = await Connection.open(open_listener.port)
    try:
        # RequestHeader v2 (flexible): api_key 10, api_version 4, correlation_id 5, client_id
        # "c" (nullable int16-length string, even in v2), then tagged fields: one unknown
        # field (tag 7, size 2, "xy"), which a broker skips (RequestHeader.json defines none).
        header = struct.pack(">hhih", 10, 4, 5, 1) + b"c" + bytes([1, 7, 2]) + b"xy"
        # FindCoordinatorRequest v4: key_type int8 0, coordinator_keys compact array of one
        # compact string "g" (lengths are stored plus one), no tagged fields.
        body = bytes([0, 2, 2]) + b"g" + bytes([0])
        await connection.send_raw(framing.frame(header + body))
        payload = await connection.read_raw()
        assert payload is not None
        correlation, response = framing.read_response(payload, FindCoordinatorResponse)
        assert correlation == 5
        assert [(c.key, c.error_code) for c in response.coordinators] == [("g", 0)]
        # RequestHeader v1 with a null client id (length -1), FindCoordinatorRequest v0 ("g").
        await connection.send_raw(
            framing.frame(struct.pack(">hhih", 10, 0, 6, -1) + struct.pack(">h", 1) + b"g")
        )
        payload = await connection.read_raw()
        assert payload is not None
        # ResponseHeader v0 then FindCoordinatorResponse v0: error_code, node_id, host, port.
        host = b"127.0.0.1"
        node_id = open_listener.config.node_id
        assert payload == struct.pack(">ihih", 6, 0, node_id, len(host)) + host + struct.pack(
            ">i", open_listener.port
        )
    finally:
        await connection.close()
