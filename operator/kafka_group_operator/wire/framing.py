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
not define are ignored, as Kafka ignores them (``tagged``).

Nothing a peer sends reaches kio's reader unchecked: kio trusts the counts it reads and would
reserve memory for all the elements an array declares (2^32-2 of them abort the process).
``read_request`` and ``read_response`` first check every length and count of the frame
against the bytes left (``bounds``), then decode; either raises ``FrameError`` on anything
malformed, trailing bytes included. The listener, the gateway and our own clients share them.

Frames arrive either through a stream (``read_frame``, for clients) or as the bytes a
protocol's callback is given (``FrameBuffer``, for the listener, which answers a steady
heartbeat from the callback that read it): both refuse a size above the limit before its
payload arrives, and take memory for a large frame only as its bytes arrive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import mmap
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.serial.readers import read_unsigned_varint
from kio.static.primitive import i16, i32

from kafka_group_operator.wire import bounds, layout, tagged

API_VERSIONS_KEY = 18

# A frame larger than this closes the connection (Kafka's socket.request.max.bytes does the
# same). Coordinator requests are small: even a commit of 100,000 partitions fits.
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024
# Frames above this size are read chunk by chunk as they arrive (``read_frame``).
_CHUNK_BYTES = 64 * 1024

_SIZE = struct.Struct(">i")
_FIXED_HEADER = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")
# A frame's size and response header v0 (the correlation id), or v1 (and no tagged field).
_HEADER_V0 = struct.Struct(">ii")
_HEADER_V1 = struct.Struct(">iiB")


class FrameError(Exception):
    """The peer broke the framing or sent an unreadable request: close its connection."""


class FrameTooLarge(FrameError):
    pass


class RequestHeader(NamedTuple):
    # A named tuple: built for every request, at a fraction of a frozen dataclass's cost.
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
    if size > _CHUNK_BYTES:
        return await _read_large(reader, size)
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError(f"connection closed inside a frame of {size} bytes") from None


async def _read_large(reader: asyncio.StreamReader, size: int) -> bytes:
    """A large payload, read chunk by chunk into an anonymous memory mapping of its size.

    The mapping takes memory only for the pages written, as the bytes arrive (a peer that
    declares 8 MB and sends 1 KB costs 1 KB), and it goes back to the system whole when the
    frame is done or abandoned. A buffer grown on the heap instead (the stream's own) can stay
    held by the allocator after the connection closes: dozens of unfinished 8 MB frames kept
    hundreds of MB.
    """
    buffer = mmap.mmap(-1, size)
    try:
        filled = 0
        while filled < size:
            chunk = await reader.read(min(size - filled, _CHUNK_BYTES))
            if not chunk:
                raise FrameError(f"connection closed inside a frame of {size} bytes")
            buffer[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        return buffer[:]
    finally:
        buffer.close()


class FrameBuffer:
    """Frames out of bytes as they arrive (sans-IO): ``feed`` what a connection received,
    then ``take`` whole frames' payloads in order.

    A frame's size is checked against the limit as soon as its prefix is there, before its
    payload arrives (``FrameTooLarge``). Bytes are kept without a copy while they hold whole
    frames (one request per read, the common case, costs one slice), and appended to a
    buffer only when a frame is split between reads. A frame above 64 KiB is filled into an
    anonymous memory mapping of its size as its bytes arrive, as ``read_frame`` does: memory
    for the pages written only, given back whole when the frame is taken or ``close``d.
    """

    __slots__ = ("_at", "_data", "_filled", "_large")

    def __init__(self) -> None:
        self._data: bytes | bytearray = b""
        self._at = 0
        self._large: mmap.mmap | None = None
        self._filled = 0

    def feed(self, data: bytes | bytearray) -> None:
        large = self._large
        if large is not None:
            used = min(len(data), len(large) - self._filled)
            large[self._filled : self._filled + used] = data[:used]
            self._filled += used
            if used == len(data):
                return
            data = data[used:]
        if self._at == len(self._data):
            self._data, self._at = data, 0
            return
        if isinstance(self._data, bytes):
            self._data = bytearray(memoryview(self._data)[self._at :])
            self._at = 0
        elif self._at > _CHUNK_BYTES:
            del self._data[: self._at]
            self._at = 0
        self._data += data

    def buffered(self) -> int:
        """Bytes received and not taken yet, outside a large frame's mapping."""
        return len(self._data) - self._at

    def cut_short(self) -> str | None:
        """What an end of stream here cuts short, as ``read_frame`` says it (``None``: no
        frame was begun)."""
        if self._large is not None:
            return f"connection closed inside a frame of {len(self._large)} bytes"
        left = len(self._data) - self._at
        if not left:
            return None
        if left < _SIZE.size:
            return "connection closed inside a frame's size"
        (size,) = _SIZE.unpack_from(self._data, self._at)
        return f"connection closed inside a frame of {size} bytes"

    def take(self, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes | None:
        """The next whole frame's payload, ``None`` until it has arrived; ``FrameTooLarge``
        for a size above ``max_bytes`` (or negative)."""
        large = self._large
        if large is not None:
            if self._filled < len(large):
                return None
            payload = large[:]
            large.close()
            self._large = None
            return payload
        data, at = self._data, self._at
        if len(data) - at < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(data, at)
        if size < 0 or size > max_bytes:
            raise FrameTooLarge(f"frame of {size} bytes (the limit is {max_bytes})")
        start = at + _SIZE.size
        end = start + size
        if size > _CHUNK_BYTES:
            self._large, self._filled = mmap.mmap(-1, size), 0
            held = data
            self._data, self._at = b"", 0
            self.feed(held[start:])
            return self.take(max_bytes)
        if end > len(data):
            return None
        self._at = end
        if isinstance(data, bytes):
            return data[start:end]
        with memoryview(data) as view:
            return bytes(view[start:end])

    def close(self) -> None:
        """Give back what is held (the connection is gone)."""
        if self._large is not None:
            self._large.close()
            self._large = None
        self._data, self._at = b"", 0


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


def read_request(
    payload: bytes, caps: Mapping[str, int] | None = None, fixed: RequestHeader | None = None
) -> tuple[RequestHeader, Any]:
    """Header and kio body of a request whose API version kio knows; ``FrameError`` if not,
    if a length or count does not fit the frame (or one of ``caps``: top-level array field
    -> most elements, see ``bounds``), or if the bytes do not decode as that request
    (trailing bytes included). ``fixed``: the frame's ``peek_request_header``, if the
    caller has it already."""
    if fixed is None:
        fixed = peek_request_header(payload)
    schema = request_type(fixed.api_key, fixed.api_version)
    if schema is None:
        raise FrameError(f"unknown API key {fixed.api_key} version {fixed.api_version}")
    try:
        # Header v2 is v1 plus a tagged-fields section. Kafka's RequestHeader defines no
        # tagged field, so a broker skips whatever tags a client sends there; kio's reader
        # would refuse unknown tags, so v1's fields are read and the section is skipped.
        # (v1's only length, the int16 client id's, is checked by kio against the bytes.)
        header: Any
        header, offset = _read_header_v1(payload, 0)
        if schema.__flexible__:
            if offset < len(payload) and not payload[offset]:
                offset += 1  # no tagged field (what every client sends)
            else:
                offset = skip_tagged_fields(payload, offset)
        end = bounds.check(schema, payload, offset, caps)
    except Exception as error:  # kio raises assorted errors on malformed input
        raise FrameError(f"malformed {_name(schema)}: {error}") from None
    if end != len(payload):
        raise FrameError(f"{_name(schema)}: {len(payload) - end} bytes after the request")
    try:
        body, _ = _read_body(schema, payload, offset)
    except Exception as error:
        raise FrameError(f"malformed {_name(schema)}: {error}") from None
    return RequestHeader(
        fixed.api_key, fixed.api_version, fixed.correlation_id, header.client_id
    ), body


_read_header_v1 = entity_reader(RequestHeaderV1)


def _name(schema: type[Any]) -> str:
    """How errors name a message: ``ConsumerGroupHeartbeatRequest v1``."""
    return f"{schema.__name__} v{schema.__version__}"


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
    """The offset after a tagged-fields section (count, then tag, size and bytes of each);
    ``ValueError`` when a count or size does not fit in the bytes left."""
    count, used = read_unsigned_varint(payload, offset)
    offset += used
    if count * 2 > len(payload) - offset:  # a tag and a size take a byte each at least
        raise ValueError(f"{count} tagged fields declared, {len(payload) - offset} bytes left")
    for _ in range(count):
        _tag, used = read_unsigned_varint(payload, offset)
        offset += used
        size, used = read_unsigned_varint(payload, offset)
        offset += used + size
        if offset > len(payload):
            raise ValueError("a tagged field runs past the end of the frame")
    return offset


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """A framed response: header (v0 for ApiVersions and non-flexible versions, else v1).
    ``body`` is kio's response, or its bytes already encoded (a handler's template for an
    answer it gives thousands of times a second)."""
    if isinstance(body, bytes):
        flexible = api_key != API_VERSIONS_KEY and response_type(api_key, api_version).__flexible__
        if flexible:
            return _HEADER_V1.pack(len(body) + 5, correlation_id, 0) + body
        return _HEADER_V0.pack(len(body) + 4, correlation_id) + body
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


def encode_entities(entities: Sequence[Any]) -> bytes:
    """The elements of an array, encoded one after the other (no count)."""
    buffer = io.BytesIO()
    for entity in entities:
        entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def encode_response_around(
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: Any,
    field: str,
    elements: Sequence[bytes],
    count: int,
) -> bytes:
    """A framed response like ``encode_response``, whose array ``field`` holds ``count``
    elements already encoded in parts (``encode_entities``): a caller answering thousands
    of groups encodes them a batch at a time, the event loop free between batches, instead
    of in one go here. The fields before ``field`` must be fixed-width (a throttle time)."""
    empty = encode_response(
        api_key, api_version, correlation_id, dataclasses.replace(body, **{field: ()})
    )
    schema = type(body)
    lay = layout.layout(schema)
    start = _SIZE.size + _CORRELATION.size
    if api_key != API_VERSIONS_KEY and schema.__flexible__:
        start += 1  # response header v1: an empty tagged-fields section
    for each in lay.fields:
        if each.name == field:
            break
        if each.kind is not layout.Kind.FIXED:
            raise ValueError(f"{schema.__name__}.{each.name} before {field} is not fixed-width")
        start += each.width
    if lay.flexible:
        marker, prefix = 1, tagged.encode_uvarint(count + 1)
    else:
        marker, prefix = 4, _SIZE.pack(count)
    return frame(empty[_SIZE.size : start] + prefix + b"".join(elements) + empty[start + marker :])


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


def read_response(payload: bytes, schema: type[Any]) -> tuple[int, Any]:
    """Correlation id and kio body of a response of type ``schema``; ``FrameError`` if a
    length or count does not fit the frame, or the bytes are not that response exactly
    (the whole frame: trailing bytes are refused)."""
    flexible_header = schema.__api_key__ != API_VERSIONS_KEY and schema.__flexible__
    name = f"{schema.__name__} v{schema.__version__}"
    try:
        (correlation_id,) = _CORRELATION.unpack_from(payload, 0)
        offset = _CORRELATION.size
        if flexible_header:
            # Response header v1's tags: none is defined, so all are skipped (as Kafka does).
            offset = skip_tagged_fields(payload, offset)
        end = bounds.check(schema, payload, offset)
    except Exception as error:
        raise FrameError(f"malformed {name}: {error}") from None
    if end != len(payload):
        raise FrameError(f"{name}: {len(payload) - end} bytes after the response")
    try:
        body, _ = _read_body(schema, payload, offset)
    except Exception as error:
        raise FrameError(f"malformed {name}: {error}") from None
    return int(correlation_id), body
