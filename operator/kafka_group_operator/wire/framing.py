"""Kafka's framing: size-prefixed frames, request and response headers, kio (de)serialisation.

Every Kafka request and response is a frame: a big-endian int32 size, then that many bytes.
A request frame starts with a request header: ``api_key`` (int16), ``api_version`` (int16),
``correlation_id`` (int32), a nullable int16-length ``client_id`` (header v1), and, for a
*flexible* API version, tagged fields (header v2). A response frame starts with the
correlation id (header v0), plus tagged fields (header v1) for flexible versions, except
ApiVersions, whose responses always use header v0 so that a client that does not know the
broker's versions yet can read them (Kafka's ``ApiKeys.responseHeaderVersion``).

Bodies are read and written with ``kio``'s types, generated from Kafka's message schemas;
nothing here describes a message by hand. Tagged fields a peer sends that the schema does
not define are ignored, as Kafka ignores them (``tagged``). The listener and the gateway share these
functions; the gateway reads no further than ``peek_request_header``.
"""

from __future__ import annotations

import asyncio
import functools
import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import read_unsigned_varint
from kio.static.primitive import i16, i32

from kafka_group_operator.wire import tagged

API_VERSIONS_KEY = 18

# A frame larger than this closes the connection (Kafka's socket.request.max.bytes does the
# same). Coordinator requests are small: even a commit of 100,000 partitions fits.
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024

_SIZE = struct.Struct(">i")
_FIXED_HEADER = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")


class FrameError(Exception):
    """The peer broke the framing or sent an unreadable request: close its connection."""


class FrameTooLarge(FrameError):
    pass


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes | None:
    """The next frame's payload; ``None`` when the peer closed between frames.

    Raises ``FrameTooLarge`` for a size above ``max_bytes`` (or negative) before reading the
    payload, and ``FrameError`` when the peer closes inside a frame.
    """
    try:
        prefix = await reader.readexactly(_SIZE.size)
    except asyncio.IncompleteReadError as error:
        if not error.partial:
            return None
        raise FrameError("connection closed inside a frame's size") from None
    (size,) = _SIZE.unpack(prefix)
    if size < 0 or size > max_bytes:
        raise FrameTooLarge(f"frame of {size} bytes (the limit is {max_bytes})")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError(f"connection closed inside a frame of {size} bytes") from None


def frame(payload: bytes) -> bytes:
    """``payload`` with its size prefix."""
    return _SIZE.pack(len(payload)) + payload


def peek_request_header(payload: bytes) -> RequestHeader:
    """The fixed part of a request header (no client id): enough to route or refuse it."""
    if len(payload) < _FIXED_HEADER.size:
        raise FrameError(f"request of {len(payload)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(payload)
    return RequestHeader(api_key, api_version, correlation_id)


@functools.cache
def request_type(api_key: int, api_version: int) -> type[Any] | None:
    """kio's request type of this API version, ``None`` when kio does not know it."""
    try:
        return load_request_schema(api_key, api_version)
    except (UnknownAPIKey, UnknownEntity):
        return None


@functools.cache
def response_type(api_key: int, api_version: int) -> type[Any]:
    return load_response_schema(api_key, api_version)


def is_flexible(api_key: int, api_version: int) -> bool:
    schema = request_type(api_key, api_version)
    return bool(schema is not None and schema.__flexible__)


def read_request(payload: bytes) -> tuple[RequestHeader, Any]:
    """Header and kio body of a request whose API version kio knows; ``FrameError`` if not,
    or if the bytes do not decode as that request (trailing bytes included)."""
    fixed = peek_request_header(payload)
    schema = request_type(fixed.api_key, fixed.api_version)
    if schema is None:
        raise FrameError(f"unknown API key {fixed.api_key} version {fixed.api_version}")
    try:
        # Header v2 is v1 plus a tagged-fields section. Kafka's RequestHeader defines no
        # tagged field, so a broker skips whatever tags a client sends there; kio's reader
        # would refuse unknown tags, so v1's fields are read and the section is skipped.
        header: Any
        header, offset = entity_reader(RequestHeaderV1)(payload, 0)
        if schema.__flexible__:
            offset = skip_tagged_fields(payload, offset)
        body, end = _read_body(schema, payload, offset)
    except Exception as error:  # kio raises assorted errors on malformed input
        raise FrameError(f"malformed {schema.__name__} v{fixed.api_version}: {error}") from None
    if end != len(payload):
        raise FrameError(
            f"{schema.__name__} v{fixed.api_version}: {len(payload) - end} bytes after the request"
        )
    return RequestHeader(
        fixed.api_key, fixed.api_version, fixed.correlation_id, header.client_id
    ), body


def _read_body(schema: type[Any], payload: bytes, offset: int) -> tuple[Any, int]:
    """The kio body at ``offset`` and the offset after it. A flexible body that kio refuses
    is read again without the tagged fields its schema does not define (a newer client's:
    Kafka ignores them, see ``tagged``)."""
    try:
        body, size = entity_reader(schema)(payload, offset)
        return body, offset + size
    except Exception:
        if not schema.__flexible__:
            raise
    stripped, end = tagged.strip_unknown_tags(schema, payload, offset)
    body, size = entity_reader(schema)(stripped, 0)
    if size != len(stripped):
        raise ValueError(f"{len(stripped) - size} bytes left after the stripped body")
    return body, end


def skip_tagged_fields(payload: bytes, offset: int) -> int:
    """The offset after a tagged-fields section (count, then tag, size and bytes of each)."""
    count, used = read_unsigned_varint(payload, offset)
    offset += used
    for _ in range(count):
        _tag, used = read_unsigned_varint(payload, offset)
        offset += used
        size, used = read_unsigned_varint(payload, offset)
        offset += used + size
        if offset > len(payload):
            raise ValueError("a tagged field runs past the end of the request")
    return offset


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """A framed response: header (v0 for ApiVersions and non-flexible versions, else v1)."""
    buffer = io.BytesIO()
    if api_key != API_VERSIONS_KEY and body.__flexible__:
        entity_writer(ResponseHeaderV1)(
            buffer, ResponseHeaderV1(correlation_id=i32(correlation_id))
        )
    else:
        entity_writer(ResponseHeaderV0)(
            buffer, ResponseHeaderV0(correlation_id=i32(correlation_id))
        )
    entity_writer(type(body))(buffer, body)
    return frame(buffer.getvalue())


def encode_request(body: Any, correlation_id: int, client_id: str | None = "kgo") -> bytes:
    """A framed request with the header its version needs (clients and tests)."""
    buffer = io.BytesIO()
    key, version = i16(body.__api_key__), i16(body.__version__)
    header_schema = RequestHeaderV2 if body.__flexible__ else RequestHeaderV1
    entity_writer(header_schema)(
        buffer,
        header_schema(
            request_api_key=key,
            request_api_version=version,
            correlation_id=i32(correlation_id),
            client_id=client_id,
        ),
    )
    entity_writer(type(body))(buffer, body)
    return frame(buffer.getvalue())


def peek_correlation(payload: bytes) -> int:
    """A response's correlation id (its first field), ``FrameError`` if it has none."""
    if len(payload) < _CORRELATION.size:
        raise FrameError("reply shorter than its correlation id")
    (correlation_id,) = _CORRELATION.unpack_from(payload)
    return int(correlation_id)


def read_response(payload: bytes, schema: type[Any], *, exact: bool = False) -> tuple[int, Any]:
    """Correlation id and kio body of a response of type ``schema`` (clients and tests);
    ``exact``: ``FrameError`` unless the body ends where the frame does (the gateway reads the
    replies it rewrites so)."""
    flexible_header = schema.__api_key__ != API_VERSIONS_KEY and schema.__flexible__
    (correlation_id,) = _CORRELATION.unpack_from(payload, 0)
    offset = _CORRELATION.size
    if flexible_header:
        # Response header v1's tags: none is defined, so all are skipped (as Kafka does).
        offset = skip_tagged_fields(payload, offset)
    body, end = _read_body(schema, payload, offset)
    if exact and end != len(payload):
        raise FrameError(f"{schema.__name__}: {len(payload) - end} bytes after the response")
    return int(correlation_id), body
