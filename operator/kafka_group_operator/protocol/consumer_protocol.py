"""The ``consumer`` protocol's embedded bytes: ``ConsumerProtocolSubscription`` (a JoinGroup
protocol's metadata) and ``ConsumerProtocolAssignment`` (a SyncGroup assignment), read as
leniently as Kafka reads them.

Both are an int16 version, then that version's struct (Kafka's ``ConsumerProtocol``).
Clients write them in many ways, and Kafka's brokers never refused one for its trailing
fields:

- a classic group reads the version, then only the version-0 fields (topics, user data) and
  nothing after them (``ClassicGroup.computeSubscribedTopics``); a subscription it cannot
  read is logged, never refused;
- segmentio kafka-go writes version 1 and stops after its user data, with no owned
  partitions; sarama's reader accepts that on purpose ("misbehaving 3rd party clients");
- Java's ``ConsumerProtocol`` reads a version above the newest it knows as the newest
  ("new versions cannot remove or reorder any of the existing fields"), and ignores bytes
  after the last field it knows.

So here: the version is capped at the newest kio defines; the first field (the topics, the
assigned partitions) must be whole, as the coordinator cannot serve a member without it
(Kafka's consumer groups answer INCONSISTENT_GROUP_PROTOCOL then); every later field that
is missing or cut short takes its default, as do the fields after it; bytes after the last
known field are ignored. The fields, their order and their types are kio's (generated from
Kafka's message schemas), walked with ``cursor`` rather than kio's native reader: these
bytes are inside a request, so no frame check has bounded their counts.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from kafka_group_operator.protocol import cursor

NEWEST_VERSION = 3


class MalformedMetadata(ValueError):
    """The bytes are no subscription or assignment: no version, or no whole first field."""


def _types(name: str, entity: str) -> Mapping[int, type[Any]]:
    return {
        version: getattr(importlib.import_module(f"kio.schema.{name}.v{version}.data"), entity)
        for version in range(NEWEST_VERSION + 1)
    }


SUBSCRIPTION_TYPES = _types("consumer_protocol_subscription", "ConsumerProtocolSubscription")
ASSIGNMENT_TYPES = _types("consumer_protocol_assignment", "ConsumerProtocolAssignment")


def read_subscription(data: bytes) -> Any:
    """The kio ``ConsumerProtocolSubscription`` of the version ``data`` declares (the newest
    for a newer one); ``MalformedMetadata`` when it has no version or no whole topic list."""
    return _read(SUBSCRIPTION_TYPES, data)


def read_assignment(data: bytes) -> Any:
    """The kio ``ConsumerProtocolAssignment``, read as ``read_subscription`` reads."""
    return _read(ASSIGNMENT_TYPES, data)


def _read(by_version: Mapping[int, type[Any]], data: bytes) -> Any:
    reader = cursor.Cursor(data)
    try:
        version = reader.int16()
    except cursor.Truncated:
        raise MalformedMetadata("no version") from None
    if version < 0:
        raise MalformedMetadata(f"version {version}")
    schema = by_version[min(version, NEWEST_VERSION)]
    values: dict[str, Any] = {}
    for index, (name, read, _) in enumerate(_fields(schema)):
        try:
            values[name] = read(reader)
        except (cursor.Truncated, cursor.Malformed) as error:
            if index == 0:
                raise MalformedMetadata(f"{name}: {error}") from None
            break  # this field and those after it take their defaults
    return schema(**{**_defaults(schema), **values})


# ---------------------------------------------------------------------------------------
# The readers of a kio entity's fields, from its dataclass fields (in wire order).

_Read = Callable[[cursor.Cursor], Any]
_PRIMITIVES: Mapping[str, tuple[Callable[[cursor.Cursor], Any], int]] = {
    "int16": (cursor.Cursor.int16, 2),
    "int32": (cursor.Cursor.int32, 4),
    "int64": (cursor.Cursor.int64, 8),
    "string": (cursor.Cursor.string, 2),
    "bytes": (cursor.Cursor.nullable_bytes, 4),
}


_FIELDS: dict[type[Any], tuple[tuple[str, _Read, int], ...]] = {}


def _fields(schema: type[Any]) -> tuple[tuple[str, _Read, int], ...]:
    """(name, reader, fewest bytes it reads) of each field of ``schema``."""
    fields = _FIELDS.get(schema)
    if fields is None:
        fields = _FIELDS[schema] = tuple(_field(field) for field in dataclasses.fields(schema))
    return fields


def _field(field: dataclasses.Field[Any]) -> tuple[str, _Read, int]:
    kind: Any = field.type
    assert not isinstance(kind, str), "kio's entities have evaluated annotations"
    nullable = False
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        nullable = True
    if typing.get_origin(kind) is tuple:
        (element, _) = typing.get_args(kind)
        read_element: _Read
        if isinstance(element, type) and dataclasses.is_dataclass(element):
            read_element, size = _entity(element)
        else:
            read_element, size = _primitive(field, False)
        return field.name, _array(field.name, read_element, size, nullable), 4
    read, size = _primitive(field, nullable)
    return field.name, read, size


def _entity(schema: type[Any]) -> tuple[_Read, int]:
    """A nested entity's reader (every field whole) and its fewest bytes."""
    fields = _fields(schema)

    def read(reader: cursor.Cursor) -> Any:
        return schema(**{name: read_field(reader) for name, read_field, _ in fields})

    return read, sum(size for _, _, size in fields)


def _primitive(field: dataclasses.Field[Any], nullable: bool) -> tuple[_Read, int]:
    kafka_type = field.metadata["kafka_type"]
    if kafka_type == "string" and nullable:
        return cursor.Cursor.nullable_string, 2
    return _PRIMITIVES[kafka_type]


def _array(name: str, read_element: _Read, element_size: int, nullable: bool) -> _Read:
    def read(reader: cursor.Cursor) -> tuple[Any, ...] | None:
        count = reader.count(max(element_size, 1))
        if count < 0:
            if nullable:
                return None
            raise cursor.Malformed(f"{name} is null")
        return tuple(read_element(reader) for _ in range(count))

    return read


_DEFAULTS: dict[type[Any], dict[str, Any]] = {}


def _defaults(schema: type[Any]) -> dict[str, Any]:
    """Each field's default: the schema's, or empty for an array without one."""
    defaults = _DEFAULTS.get(schema)
    if defaults is None:
        defaults = _DEFAULTS[schema] = {}
        for field in dataclasses.fields(schema):
            if field.default is not dataclasses.MISSING:
                defaults[field.name] = field.default
            elif typing.get_origin(field.type) is tuple:
                defaults[field.name] = ()
    return defaults
