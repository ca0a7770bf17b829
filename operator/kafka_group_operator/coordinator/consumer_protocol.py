"""The consumer protocol inside classic groups' opaque bytes (Kafka's ``ConsumerProtocol``).

A classic group relays its members' protocol metadata and the leader's assignments as bytes it
does not interpret. Three places still read them, as Kafka's coordinator does:

* the subscribed topics of a ``consumer`` group (``ClassicGroup.computeSubscribedTopics``),
  which decide whose offsets may expire; read as version 0, the prefix every version shares;
* converting a classic group to a consumer group (KIP-848 member joins it): every member's
  subscription and assignment;
* converting back: each member's target written as a ``ConsumerProtocolAssignment`` at the
  version of that member's subscription.

The message types are kio's (generated from Kafka's schemas). Bytes that are not such a
message raise ``MalformedConsumerProtocol``: Kafka's ``SchemaException``, which callers turn
into what Kafka answers there. A version above the newest known is read as the newest, and
bytes after the struct are ignored, as Kafka's ``ConsumerProtocol`` does.
"""

from __future__ import annotations

import importlib
import io
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.serial.writers import write_int16
from kio.static.primitive import i16, i32

NEWEST_SUBSCRIPTION_VERSION = 3
NEWEST_ASSIGNMENT_VERSION = 3


def _types(name: str, newest: int) -> dict[int, Any]:
    return {
        version: importlib.import_module(f"kio.schema.{name}.v{version}.data")
        for version in range(newest + 1)
    }


_SUBSCRIPTIONS = _types("consumer_protocol_subscription", NEWEST_SUBSCRIPTION_VERSION)
_ASSIGNMENTS = _types("consumer_protocol_assignment", NEWEST_ASSIGNMENT_VERSION)


class MalformedConsumerProtocol(ValueError):
    """Bytes that are not a ConsumerProtocol message (Kafka's ``SchemaException``)."""


@dataclass(frozen=True, slots=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    owned_partitions: Mapping[str, frozenset[int]]
    # The generation the owned partitions were assigned in; -1 unknown (versions < 2).
    generation_id: int
    rack_id: str | None


def _read(types: dict[int, Any], attribute: str, data: bytes, version: int | None) -> Any:
    try:
        (written,) = struct.unpack_from(">h", data, 0)
        if written < 0:
            raise MalformedConsumerProtocol(f"unsupported version {written}")
        read_as = min(written if version is None else version, max(types))
        value, _ = entity_reader(getattr(types[read_as], attribute))(data, 2)
    except MalformedConsumerProtocol:
        raise
    except Exception as error:  # kio raises assorted errors on malformed input
        raise MalformedConsumerProtocol(f"{attribute}: {error}") from None
    return value


def version_of(data: bytes) -> int:
    """The version a ConsumerProtocol message was written at (its int16 header)."""
    try:
        (version,) = struct.unpack_from(">h", data, 0)
    except struct.error:
        raise MalformedConsumerProtocol("no version header") from None
    if version < 0:
        raise MalformedConsumerProtocol(f"unsupported version {version}")
    return int(version)


def subscribed_topics(metadata: bytes) -> frozenset[str]:
    """The topics of a subscription, read as version 0 whatever its version."""
    return frozenset(_read(_SUBSCRIPTIONS, "ConsumerProtocolSubscription", metadata, 0).topics)


def decode_subscription(metadata: bytes) -> Subscription:
    version = version_of(metadata)
    value = _read(_SUBSCRIPTIONS, "ConsumerProtocolSubscription", metadata, None)
    owned: dict[str, frozenset[int]] = {}
    for entry in getattr(value, "owned_partitions", ()):
        owned[entry.topic] = owned.get(entry.topic, frozenset()) | frozenset(entry.partitions)
    return Subscription(
        version=version,
        topics=tuple(value.topics),
        owned_partitions=owned,
        generation_id=int(getattr(value, "generation_id", -1)),
        rack_id=getattr(value, "rack_id", None),
    )


def decode_assignment(data: bytes) -> dict[str, frozenset[int]]:
    """The partitions of a ConsumerProtocolAssignment, by topic name."""
    value = _read(_ASSIGNMENTS, "ConsumerProtocolAssignment", data, None)
    assigned: dict[str, frozenset[int]] = {}
    for entry in value.assigned_partitions:
        assigned[entry.topic] = assigned.get(entry.topic, frozenset()) | frozenset(entry.partitions)
    return assigned


def encode_assignment(assignment: Mapping[str, frozenset[int]], version: int = 0) -> bytes:
    """A ConsumerProtocolAssignment at ``version`` (the newest known if above it), topics
    and partitions sorted, no user data."""
    read_as = min(max(version, 0), NEWEST_ASSIGNMENT_VERSION)
    module = _ASSIGNMENTS[read_as]
    buffer = io.BytesIO()
    write_int16(buffer, i16(read_as))
    entity_writer(module.ConsumerProtocolAssignment)(
        buffer,
        module.ConsumerProtocolAssignment(
            assigned_partitions=tuple(
                module.TopicPartition(
                    topic=TopicName(topic), partitions=tuple(i32(p) for p in sorted(partitions))
                )
                for topic, partitions in sorted(assignment.items())
                if partitions
            ),
            user_data=None,
        ),
    )
    return buffer.getvalue()
