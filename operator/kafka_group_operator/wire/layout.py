"""kio's message schemas as wire layouts: what each field looks like in a frame's bytes.

kio describes every Kafka message as dataclasses whose fields carry Kafka's type in their
metadata; its native reader compiles those into a parse plan. The code that must walk a
frame's bytes *without* decoding them (the bounds check, ``bounds``, and the stripping of
unknown tagged fields, ``tagged``) needs the same plan in Python; ``layout(schema)`` builds it
once per type (cached) with kio's own introspection helpers, by kio's reader's rules:

- fixed-width primitives (ints, bools, error codes, timedeltas, datetimes, uuids; nullable
  ones too: a null uuid or datetime is still 16 or 8 bytes);
- strings, bytes and ``records``: an int16 (strings) or int32 (bytes) length with -1 for null
  in non-flexible versions; an unsigned varint length + 1 (0: null) in flexible ones;
- arrays: an int32 count (-1: null) in non-flexible versions, an unsigned varint count + 1
  (0: null) in flexible ones; elements are never null;
- structs inline, a nullable struct behind an int8 marker (-1: null);
- in a flexible version, every struct ends with a tagged-fields section: a count, then per
  field its tag, its size and its value. A tagged primitive is read as non-nullable (kio's
  reader does so), a tagged struct as nullable when its type is optional;
- a request header's client id is an int16-length nullable string in every header version
  (Kafka keeps it so that any broker can read who sent a request it cannot parse).

A struct's ``minimum`` is the fewest bytes it can take on the wire: the bounds check divides
the bytes left by an element's minimum to bound an array's count.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

# Widths of kio's fixed-width Kafka types.
FIXED_WIDTHS: Mapping[str, int] = {
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
# Length-prefixed types: int16 length (strings) or int32 (bytes, records) when not flexible.
_LENGTH_PREFIXED: Mapping[str, int] = {"string": 2, "bytes": 4, "records": 4}


class LayoutError(ValueError):
    """A kio schema uses a type this module does not know (a newer kio)."""


class Kind(enum.Enum):
    FIXED = "fixed"  # ``width`` bytes
    STRING = "string"  # length-prefixed; ``width`` is the legacy length's width (2 or 4)
    STRUCT = "struct"  # ``struct``, behind an int8 marker when ``nullable``
    ARRAY = "array"  # ``element`` repeated, behind a count


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: Kind
    width: int = 0
    nullable: bool = False
    struct: Layout | None = None
    element: Field | None = None
    # Encoded as in non-flexible versions even in a flexible struct (a header's client id).
    legacy: bool = False

    def compact(self, flexible: bool) -> bool:
        """Whether its lengths and counts are varints (in a struct of that flexibility)."""
        return flexible and not self.legacy

    def minimum(self, flexible: bool) -> int:
        """The fewest bytes this field takes (null where it may be, empty otherwise)."""
        flexible = self.compact(flexible)
        if self.kind is Kind.FIXED:
            return self.width
        if self.kind is Kind.STRUCT:
            assert self.struct is not None
            return 1 if self.nullable else self.struct.minimum
        if flexible:
            return 1  # a varint length or count
        return self.width if self.kind is Kind.STRING else 4


@dataclass(frozen=True, slots=True)
class Layout:
    """One struct (a message or a nested entity) of one version."""

    schema: type[Any]
    flexible: bool
    fields: tuple[Field, ...]  # untagged, in wire order
    tags: Mapping[int, Field]  # tagged fields by tag (flexible versions only)
    minimum: int

    @property
    def name(self) -> str:
        return str(self.schema.__name__)


_LAYOUTS: dict[type[Any], Layout] = {}


def layout(schema: type[Any]) -> Layout:
    """The wire layout of kio's entity type ``schema`` (cached per type)."""
    found = _LAYOUTS.get(schema)
    if found is None:
        found = _LAYOUTS[schema] = _layout(schema)
    return found


def _layout(schema: type[Any]) -> Layout:
    flexible = bool(schema.__flexible__)
    fields: list[Field] = []
    tags: dict[int, Field] = {}
    for field in dataclasses.fields(schema):
        tag = get_field_tag(field)
        if schema.__name__ == "RequestHeader" and field.name == "client_id":
            fields.append(Field(field.name, Kind.STRING, width=2, nullable=True, legacy=True))
        elif tag is None:
            fields.append(_field(field, flexible, tagged=False))
        else:
            tags[int(tag)] = _field(field, flexible, tagged=True)
    if tags and not flexible:
        raise LayoutError(f"{schema.__name__}: tagged fields in a non-flexible version")
    minimum = sum(f.minimum(flexible) for f in fields) + (1 if flexible else 0)
    return Layout(schema, flexible, tuple(fields), tags, minimum)


def _field(field: dataclasses.Field[Any], flexible: bool, *, tagged: bool) -> Field:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        nullable = is_optional(field)
        return Field(field.name, Kind.STRUCT, nullable=nullable, struct=layout(kind.type_))
    if isinstance(kind, EntityTupleField):
        element = Field(field.name, Kind.STRUCT, struct=layout(kind.type_))
        return Field(field.name, Kind.ARRAY, element=element, nullable=is_optional(field))
    element = _primitive(field.name, get_schema_field_type(field))
    if isinstance(kind, PrimitiveTupleField):
        return Field(field.name, Kind.ARRAY, element=element, nullable=is_optional(field))
    if element.kind is Kind.STRING and not tagged and is_optional(field):
        return dataclasses.replace(element, nullable=True)
    return element


def _primitive(name: str, kafka_type: str) -> Field:
    width = FIXED_WIDTHS.get(kafka_type)
    if width is not None:
        return Field(name, Kind.FIXED, width=width)
    width = _LENGTH_PREFIXED.get(kafka_type)
    if width is None:
        raise LayoutError(f"field {name}: no layout for Kafka type {kafka_type!r}")
    return Field(name, Kind.STRING, width=width)
