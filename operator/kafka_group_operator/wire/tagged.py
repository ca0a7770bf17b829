"""Unknown tagged fields: Kafka skips them, kio refuses them; this drops them first.

A flexible message version ends every entity (the message itself and each nested struct)
with a tagged-fields section, and a newer peer may put tags there that the schema we read
with does not define: KIP-482 lets a message grow that way without a new version. Kafka's
generated readers keep such fields aside as unknown and go on; kio's reader raises on them.
``strip_unknown_tags`` walks a flexible entity by its wire layout (``layout``, shared with the
bounds check) and copies its bytes without the tags the schema does not define, so that kio
can then read it. It is only used once a strict read has failed: the common case pays
nothing. The frame has passed the bounds check (``bounds``) by then, so every length fits.

Only the tagged sections are rewritten; every other byte is copied as it is.
"""

from __future__ import annotations

from typing import Any

from kio.serial.readers import read_unsigned_varint

from kafka_group_operator.wire import layout


class TaggedFieldsError(ValueError):
    """The bytes do not follow the schema (truncated)."""


def strip_unknown_tags(schema: type[Any], data: bytes, offset: int = 0) -> tuple[bytes, int]:
    """The bytes of the ``schema`` entity at ``offset`` without unknown tagged fields, and the
    offset where the entity ended in ``data``. ``schema`` must be a flexible version."""
    out = bytearray()
    end = _struct(layout.layout(schema), data, offset, out)
    return bytes(out), end


def _struct(lay: layout.Layout, data: bytes, offset: int, out: bytearray) -> int:
    for field in lay.fields:
        offset = _field(field, data, offset, out)
    count, offset = _uvarint(data, offset)
    kept: list[tuple[int, bytes]] = []
    for _ in range(count):
        tag, offset = _uvarint(data, offset)
        size, offset = _uvarint(data, offset)
        value = _take(data, offset, size)
        offset += size
        if tag in lay.tags:
            kept.append((tag, value))
    out += encode_uvarint(len(kept))
    for tag, value in kept:
        out += encode_uvarint(tag) + encode_uvarint(len(value)) + value
    return offset


def _field(field: layout.Field, data: bytes, offset: int, out: bytearray) -> int:
    if field.kind is layout.Kind.FIXED:
        out += _take(data, offset, field.width)
        return offset + field.width
    if field.kind is layout.Kind.STRING:
        # Compact strings and bytes: an unsigned varint length + 1 (0: null), the bytes.
        start = offset
        length, offset = _uvarint(data, offset)
        width = max(length - 1, 0)
        out += data[start:offset]
        out += _take(data, offset, width)
        return offset + width
    if field.kind is layout.Kind.STRUCT:
        assert field.struct is not None
        if field.nullable:
            # A nullable struct starts with an int8 marker: -1 null, 1 present.
            marker = _take(data, offset, 1)
            out += marker
            offset += 1
            if marker == b"\xff":
                return offset
        return _struct(field.struct, data, offset, out)
    # Arrays: an unsigned varint length + 1 (0: null), then the elements.
    assert field.element is not None
    start = offset
    length, offset = _uvarint(data, offset)
    out += data[start:offset]
    for _ in range(max(length - 1, 0)):
        offset = _field(field.element, data, offset, out)
    return offset


def _take(data: bytes, offset: int, size: int) -> bytes:
    if offset + size > len(data):
        raise TaggedFieldsError("the message ends inside a field")
    return data[offset : offset + size]


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    if offset >= len(data):
        raise TaggedFieldsError("the message ends inside a length")
    value, used = read_unsigned_varint(data, offset)
    return int(value), offset + used


def encode_uvarint(value: int) -> bytes:
    encoded = bytearray()
    while value >= 0x80:
        encoded.append((value & 0x7F) | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)
