"""Unknown tagged fields: Kafka skips them, kio refuses them; this drops them first.

A flexible message version ends every entity (the message itself and each nested struct)
with a tagged-fields section, and a newer peer may put tags there that the schema we read
with does not define: KIP-482 lets a message grow that way without a new version. Kafka's
generated readers keep such fields aside as unknown and go on; kio's reader raises on them.
``strip_unknown_tags`` walks a flexible entity by its kio schema and copies its bytes without
the tags the schema does not define, so that kio can then read it. It is only used once a
strict read has failed: the common case pays nothing.

Only the tagged sections are rewritten; every other byte is copied as it is.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.readers import read_unsigned_varint

# Fixed widths of kio's primitive types.
_FIXED = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
# Compact (flexible) strings and bytes: an unsigned varint length + 1 (0: null), the bytes.
_COMPACT = frozenset({"string", "bytes", "records"})


class TaggedFieldsError(ValueError):
    """The bytes do not follow the schema (truncated, or a type this walker does not know)."""


def strip_unknown_tags(schema: type[Any], data: bytes, offset: int = 0) -> tuple[bytes, int]:
    """The bytes of the ``schema`` entity at ``offset`` without unknown tagged fields, and the
    offset where the entity ended in ``data``. ``schema`` must be a flexible version."""
    out = bytearray()
    end = _entity(schema, data, offset, out)
    return bytes(out), end


def _entity(schema: type[Any], data: bytes, offset: int, out: bytearray) -> int:
    known_tags: set[int] = set()
    for field in dataclasses.fields(schema):
        field_tag = get_field_tag(field)
        if field_tag is not None:
            known_tags.add(int(field_tag))
            continue
        offset = _field(field, data, offset, out)
    count, offset = _uvarint(data, offset)
    kept: list[tuple[int, bytes]] = []
    for _ in range(count):
        tag, offset = _uvarint(data, offset)
        size, offset = _uvarint(data, offset)
        value = _take(data, offset, size)
        offset += size
        if tag in known_tags:
            kept.append((tag, value))
    out += _encode_uvarint(len(kept))
    for tag, value in kept:
        out += _encode_uvarint(tag) + _encode_uvarint(len(value)) + value
    return offset


def _field(field: dataclasses.Field[Any], data: bytes, offset: int, out: bytearray) -> int:
    kind = classify_field(field)
    if isinstance(kind, PrimitiveField):
        return _primitive(get_schema_field_type(field), data, offset, out)
    if isinstance(kind, EntityField):
        if is_optional(field):
            # A nullable struct starts with an int8 marker: -1 null, 1 present.
            marker = _take(data, offset, 1)
            out += marker
            offset += 1
            if marker == b"\xff":
                return offset
        return _entity(kind.type_, data, offset, out)
    # Arrays: an unsigned varint length + 1 (0: null), then the elements.
    start = offset
    length, offset = _uvarint(data, offset)
    out += data[start:offset]
    for _ in range(max(length - 1, 0)):
        if isinstance(kind, EntityTupleField):
            offset = _entity(kind.type_, data, offset, out)
        else:
            assert isinstance(kind, PrimitiveTupleField)
            offset = _primitive(get_schema_field_type(field), data, offset, out)
    return offset


def _primitive(kafka_type: str, data: bytes, offset: int, out: bytearray) -> int:
    width = _FIXED.get(kafka_type)
    if width is None:
        if kafka_type not in _COMPACT:
            raise TaggedFieldsError(f"no reader for kafka type {kafka_type!r}")
        start = offset
        length, offset = _uvarint(data, offset)
        width = max(length - 1, 0)
        out += data[start:offset]
    out += _take(data, offset, width)
    return offset + width


def _take(data: bytes, offset: int, size: int) -> bytes:
    if offset + size > len(data):
        raise TaggedFieldsError("the message ends inside a field")
    return data[offset : offset + size]


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    if offset >= len(data):
        raise TaggedFieldsError("the message ends inside a length")
    value, used = read_unsigned_varint(data, offset)
    return int(value), offset + used


def _encode_uvarint(value: int) -> bytes:
    encoded = bytearray()
    while value >= 0x80:
        encoded.append((value & 0x7F) | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)
