"""Kafka's binary encoding of state-topic records: ``records`` dataclasses <-> bytes.

Framing is Kafka's ``CoordinatorRecordSerde``: a record key is ``int16 key_version`` followed
by the key struct, a record value is ``int16 value_version`` followed by the value struct, and
a tombstone is a null value. The key version *is* the record type, so a decoder first reads
it, then decodes the value with the schema that type and the value version select.

Kafka's schemas (``group-coordinator/src/main/resources/common/message``), as written and read:

* OffsetCommitKey: key versions 0 and 1 (same layout), written as 1: ``group string,
  topic string, partition int32``.
* OffsetCommitValue: read versions 0-4, written as 3 (as 1 when the value carries an explicit
  ``expire_timestamp``, as Kafka does). Version 4 is flexible; its tagged fields are skipped.
* GroupMetadata (key 2, classic groups): ``group string``; value versions 0-4, read and
  written at the version it carries (Kafka writes 3): ``protocolType string, generation
  int32, protocol nullable string, leader nullable string, currentStateTimestamp int64
  (2+), members [memberId string, groupInstanceId nullable string (3+), clientId string,
  clientHost string, rebalanceTimeout int32 (1+), sessionTimeout int32, subscription bytes,
  assignment bytes]``. Version 4 is flexible (compact strings, bytes and arrays, tagged
  fields, skipped on reading); the fields a version lacks read as Kafka's defaults (-1,
  null).
* KIP-848 records, keys 3-8 (non-flexible ``string`` fields), values version 0 (flexible:
  compact strings and arrays, a tagged-field section closing every struct). On reading a
  member's metadata the tagged ``ClassicMemberMetadata`` (tag 0: ``session_timeout_ms int32,
  supported_protocols compact_array[name compact_string, metadata compact_bytes,
  tagged_fields], tagged_fields``) is read and written: it marks a classic-protocol member.

Every string, compact or not, is at most 32,767 UTF-8 bytes: Kafka's generated message
code refuses a longer one both when writing (``'<field>' field is too long to be
serialized``) and when reading (``string field <field> had invalid length``), see
``generator/src/main/java/org/apache/kafka/message/MessageDataGenerator.java``. So does this
codec, with a ``CodecError``; a string that is not encodable as UTF-8 (a lone surrogate) is
a ``CodecError`` too.

Member states in ``ConsumerGroupCurrentMemberAssignmentValue.State`` are Kafka's
``MemberState`` ids (STABLE 0, UNREVOKED_PARTITIONS 1, UNRELEASED_PARTITIONS 2, UNKNOWN 127),
and the value is written exactly as Kafka writes it, with no tagged field of ours: a value
Kafka wrote reads as Kafka means it, and ours reads the same in Kafka.

Our own records use key versions far above Kafka's, so Kafka's loader skips them as unknown
types; their keys follow Kafka's non-flexible key style and their values Kafka's flexible
style, version 0, so that fields can later be added as tagged fields:

* 1000 GroupConfig: key ``group_id string``; value ``assignor compact_string,
  session_timeout_ms int32, rebalance_timeout_ms int32, heartbeat_interval_ms int32,
  offsets_retention_ms int64, assignment_paused int8 (0/1), topics compact_array[compact_string],
  tagged_fields``. Tag 0, present only while paused with targets to keep, is
  ``paused_targets compact_array[member_id compact_string, topic_partitions
  compact_array[TopicPartitions], tagged_fields]`` (TopicPartitions as in Kafka's
  ``ConsumerGroupTargetAssignmentMemberValue``); versions without it read it as empty.
  Tag 1, present only for ``spec.assignment: Client``, is ``client_assignment int8`` (1);
  a value without it is ``Server``, so those records keep their bytes.
* 1001 GroupLifecycle: key ``group_id string``; value ``empty_since_ms int64, tagged_fields``.
* 1002 GroupOwner: key ``group_id string``; value ``namespace compact_string,
  name compact_string, uid compact_string, tagged_fields``.
* 1100 LoadMarker: key with no fields (one key per partition); value ``nonce compact_string,
  written_at_ms int64, tagged_fields``.

Decoding is the loader's hot path, so offset-commit records are decoded with precompiled
``struct`` formats, and group and topic names are shared between keys through a small cache.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import ClassVar

from kafka_group_records import records

# Key versions, i.e. record types.
OFFSET_COMMIT_KEY_V0 = 0
OFFSET_COMMIT_KEY_V1 = 1
GROUP_METADATA_KEY = 2
CONSUMER_GROUP_METADATA_KEY = 3
CONSUMER_GROUP_PARTITION_METADATA_KEY = 4
CONSUMER_GROUP_MEMBER_METADATA_KEY = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY = 8
GROUP_CONFIG_KEY = 1000
GROUP_LIFECYCLE_KEY = 1001
GROUP_OWNER_KEY = 1002
LOAD_MARKER_KEY = 1100

OFFSET_COMMIT_VALUE_WRITE_VERSION = 3
OFFSET_COMMIT_VALUE_EXPIRING_VERSION = 1

# Kafka's generated code refuses strings longer than this many bytes (see above).
MAX_STRING_BYTES = 0x7FFF

# Kafka's tag of ConsumerGroupMemberMetadataValue.ClassicMemberMetadata
# (group-coordinator/src/main/resources/common/message/ConsumerGroupMemberMetadataValue.json).
MEMBER_CLASSIC_METADATA_TAG = 0

# GroupConfigValue's tagged field for the targets kept while paused (our record, our tags).
GROUP_CONFIG_PAUSED_TARGETS_TAG = 0
# GroupConfigValue's tagged field marking ``spec.assignment: Client``.
GROUP_CONFIG_CLIENT_ASSIGNMENT_TAG = 1
# GroupMetadataValue: the versions Kafka defines, the first flexible one, and the one written.
GROUP_METADATA_VALUE_VERSIONS = range(5)
GROUP_METADATA_FLEXIBLE_VERSION = 4
GROUP_METADATA_WRITE_VERSION = 3


class CodecError(ValueError):
    """Bytes that are not a valid record. Carries Kafka's ``CORRUPT_MESSAGE`` code."""

    code: ClassVar[int] = 2
    name: ClassVar[str] = "CORRUPT_MESSAGE"


class UnknownRecordType(CodecError):
    """A key version no schema here knows; loaders skip such records with a warning."""

    code, name = 35, "UNSUPPORTED_VERSION"

    def __init__(self, key_version: int) -> None:
        super().__init__(f"unknown record type (key version {key_version})")
        self.key_version = key_version


class UnsupportedValueVersion(CodecError):
    """A known record type whose value version is outside the versions this codec reads."""

    code, name = 35, "UNSUPPORTED_VERSION"


_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_VERSION_AND_LENGTH = struct.Struct(">hh")
# OffsetCommitValue: the common layouts unpacked in one call.
_OFFSET_V0_HEAD = struct.Struct(">qh")  # offset, metadata length
_OFFSET_V3_HEAD = struct.Struct(">qih")  # offset, leader epoch, metadata length
_OFFSET_V3_EMPTY_METADATA = struct.Struct(">qihq")  # ... with metadata "" and the timestamp
_OFFSET_V1_TAIL = struct.Struct(">qq")  # commit timestamp, expire timestamp
_OFFSET_V3_HEADER = _INT16.pack(OFFSET_COMMIT_VALUE_WRITE_VERSION)

# ---------------------------------------------------------------------------------------
# Shared names: a log holds millions of keys over few groups and topics, so decoded keys
# reuse one str per distinct name instead of allocating a copy each.

_NAME_CACHE: dict[bytes, str] = {}
_NAME_CACHE_LIMIT = 1 << 16


def _name(raw: bytes) -> str:
    cached = _NAME_CACHE.get(raw)
    if cached is None:
        cached = raw.decode()
        if len(_NAME_CACHE) >= _NAME_CACHE_LIMIT:
            _NAME_CACHE.clear()
        _NAME_CACHE[raw] = cached
    return cached


# ---------------------------------------------------------------------------------------
# Writing


class _Writer:
    """Appends Kafka primitive types to a buffer."""

    __slots__ = ("buffer",)

    def __init__(self, version: int | None) -> None:
        """Starts with ``version`` as Kafka's int16 header; ``None`` for a bare section."""
        self.buffer = bytearray() if version is None else bytearray(_INT16.pack(version))

    def int8(self, value: int) -> None:
        self.buffer += _INT8.pack(value)

    def int32(self, value: int) -> None:
        self.buffer += _INT32.pack(value)

    def int64(self, value: int) -> None:
        self.buffer += _INT64.pack(value)

    def uuid(self, value: uuid.UUID) -> None:
        self.buffer += value.bytes

    def string(self, value: str) -> None:
        raw = _utf8(value)
        self.buffer += _INT16.pack(len(raw))
        self.buffer += raw

    def uvarint(self, value: int) -> None:
        while value >= 0x80:
            self.buffer.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buffer.append(value)

    def compact_string(self, value: str | None) -> None:
        if value is None:
            self.uvarint(0)
            return
        raw = _utf8(value)
        self.uvarint(len(raw) + 1)
        self.buffer += raw

    def nullable_string(self, value: str | None) -> None:
        if value is None:
            self.buffer += _INT16.pack(-1)
        else:
            self.string(value)

    def bytes32(self, value: bytes) -> None:
        self.buffer += _INT32.pack(len(value))
        self.buffer += value

    def compact_bytes(self, value: bytes) -> None:
        self.uvarint(len(value) + 1)
        self.buffer += value

    def compact_strings(self, values: tuple[str, ...]) -> None:
        self.uvarint(len(values) + 1)
        for value in values:
            self.compact_string(value)

    def compact_int32s(self, values: tuple[int, ...]) -> None:
        self.uvarint(len(values) + 1)
        self.buffer += struct.pack(f">{len(values)}i", *values)

    def no_tagged_fields(self) -> None:
        self.buffer.append(0)

    def topic_partitions(self, entries: tuple[records.TopicPartitions, ...]) -> None:
        self.uvarint(len(entries) + 1)
        for entry in entries:
            self.uuid(entry.topic_id)
            self.compact_int32s(entry.partitions)
            self.no_tagged_fields()

    def done(self) -> bytes:
        return bytes(self.buffer)


def _utf8(value: str) -> bytes:
    """``value`` as UTF-8, refused as Kafka refuses it when longer than 32,767 bytes."""
    try:
        raw = value.encode()
    except UnicodeEncodeError as error:
        raise CodecError(f"string is not encodable as UTF-8: {error.reason}") from None
    if len(raw) > MAX_STRING_BYTES:
        raise CodecError(f"string of {len(raw)} bytes exceeds Kafka's {MAX_STRING_BYTES}")
    return raw


def _encode_offset_commit_value(value: records.OffsetCommitValue) -> bytes:
    if value.expire_timestamp != -1:
        # Only version 1 can carry an explicit expiry (and it has no leader epoch).
        writer = _Writer(OFFSET_COMMIT_VALUE_EXPIRING_VERSION)
        writer.int64(value.offset)
        writer.string(value.metadata)
        writer.int64(value.commit_timestamp)
        writer.int64(value.expire_timestamp)
        return writer.done()
    if not value.metadata:
        return _OFFSET_V3_HEADER + _OFFSET_V3_EMPTY_METADATA.pack(
            value.offset, value.leader_epoch, 0, value.commit_timestamp
        )
    writer = _Writer(OFFSET_COMMIT_VALUE_WRITE_VERSION)
    writer.int64(value.offset)
    writer.int32(value.leader_epoch)
    writer.string(value.metadata)
    writer.int64(value.commit_timestamp)
    return writer.done()


def _encode_group_metadata_value(value: records.GroupMetadataValue) -> bytes:
    """Kafka's GroupMetadataValue at ``value.version``; fields that version lacks are left out
    (they are "ignorable" in Kafka's schema), as Kafka's generated writer does."""
    version = value.version
    if version not in GROUP_METADATA_VALUE_VERSIONS:
        raise UnsupportedValueVersion(f"GroupMetadataValue version {version} (writes 0-4)")
    writer = _Writer(version)
    flexible = version >= GROUP_METADATA_FLEXIBLE_VERSION
    string = writer.compact_string if flexible else writer.string
    nullable = writer.compact_string if flexible else writer.nullable_string
    data = writer.compact_bytes if flexible else writer.bytes32
    string(value.protocol_type)
    writer.int32(value.generation)
    nullable(value.protocol)
    nullable(value.leader)
    if version >= 2:
        writer.int64(value.current_state_timestamp)
    if flexible:
        writer.uvarint(len(value.members) + 1)
    else:
        writer.int32(len(value.members))
    for member in value.members:
        string(member.member_id)
        if version >= 3:
            nullable(member.group_instance_id)
        string(member.client_id)
        string(member.client_host)
        if version >= 1:
            writer.int32(member.rebalance_timeout)
        writer.int32(member.session_timeout)
        data(member.subscription)
        data(member.assignment)
        if flexible:
            writer.no_tagged_fields()
    if flexible:
        writer.no_tagged_fields()
    return writer.done()


def encode_key(key: records.RecordKey) -> bytes:
    """Kafka's bytes for ``key``: its key version (the record type), then its fields."""
    if isinstance(key, records.OffsetCommitKey):
        group, topic = _utf8(key.group), _utf8(key.topic)
        return b"".join(
            (
                _VERSION_AND_LENGTH.pack(OFFSET_COMMIT_KEY_V1, len(group)),
                group,
                _INT16.pack(len(topic)),
                topic,
                _INT32.pack(key.partition),
            )
        )
    if isinstance(key, records.LoadMarkerKey):
        return _INT16.pack(LOAD_MARKER_KEY)
    writer = _Writer(_KEY_VERSIONS[type(key)])
    if isinstance(key, records.GroupMetadataKey):
        writer.string(key.group)
    else:
        writer.string(key.group_id)
    if isinstance(
        key,
        records.ConsumerGroupMemberMetadataKey
        | records.ConsumerGroupTargetAssignmentMemberKey
        | records.ConsumerGroupCurrentMemberAssignmentKey,
    ):
        writer.string(key.member_id)
    return writer.done()


def encode_value(value: records.RecordValue) -> bytes:
    """Kafka's bytes for ``value``: its value version, then its fields (never a tombstone)."""
    if isinstance(value, records.OffsetCommitValue):
        return _encode_offset_commit_value(value)
    if isinstance(value, records.GroupMetadataValue):
        return _encode_group_metadata_value(value)
    writer = _Writer(0)
    if isinstance(value, records.ConsumerGroupMetadataValue):
        writer.int32(value.epoch)
    elif isinstance(value, records.ConsumerGroupPartitionMetadataValue):
        writer.uvarint(len(value.topics) + 1)
        for topic in value.topics:
            writer.uuid(topic.topic_id)
            writer.compact_string(topic.topic_name)
            writer.int32(topic.num_partitions)
            writer.uvarint(len(topic.partition_metadata) + 1)
            for partition in topic.partition_metadata:
                writer.int32(partition.partition)
                writer.compact_strings(partition.racks)
                writer.no_tagged_fields()
            writer.no_tagged_fields()
    elif isinstance(value, records.ConsumerGroupMemberMetadataValue):
        writer.compact_string(value.instance_id)
        writer.compact_string(value.rack_id)
        writer.compact_string(value.client_id)
        writer.compact_string(value.client_host)
        writer.compact_strings(value.subscribed_topic_names)
        writer.compact_string(value.subscribed_topic_regex)
        writer.int32(value.rebalance_timeout_ms)
        writer.compact_string(value.server_assignor)
        classic = value.classic_member_metadata
        if classic is not None:
            section = _Writer(None)
            section.int32(classic.session_timeout_ms)
            section.uvarint(len(classic.supported_protocols) + 1)
            for protocol in classic.supported_protocols:
                section.compact_string(protocol.name)
                section.uvarint(len(protocol.metadata) + 1)
                section.buffer += protocol.metadata
                section.no_tagged_fields()
            section.no_tagged_fields()
            payload = section.done()
            writer.uvarint(1)
            writer.uvarint(MEMBER_CLASSIC_METADATA_TAG)
            writer.uvarint(len(payload))
            writer.buffer += payload
            return writer.done()
    elif isinstance(value, records.ConsumerGroupTargetAssignmentMetadataValue):
        writer.int32(value.assignment_epoch)
    elif isinstance(value, records.ConsumerGroupTargetAssignmentMemberValue):
        writer.topic_partitions(value.topic_partitions)
    elif isinstance(value, records.ConsumerGroupCurrentMemberAssignmentValue):
        writer.int32(value.member_epoch)
        writer.int32(value.previous_member_epoch)
        writer.int8(value.state)
        writer.topic_partitions(value.assigned_partitions)
        writer.topic_partitions(value.partitions_pending_revocation)
    elif isinstance(value, records.GroupConfigValue):
        writer.compact_string(value.assignor)
        writer.int32(value.session_timeout_ms)
        writer.int32(value.rebalance_timeout_ms)
        writer.int32(value.heartbeat_interval_ms)
        writer.int64(value.offsets_retention_ms)
        writer.int8(1 if value.assignment_paused else 0)
        writer.compact_strings(value.topics)
        # Tagged fields in tag order, each only when set.
        tagged: list[tuple[int, bytes]] = []
        if value.paused_targets:
            section = _Writer(None)
            section.uvarint(len(value.paused_targets) + 1)
            for target in value.paused_targets:
                section.compact_string(target.member_id)
                section.topic_partitions(target.topic_partitions)
                section.no_tagged_fields()
            tagged.append((GROUP_CONFIG_PAUSED_TARGETS_TAG, section.done()))
        if value.client_assignment:
            tagged.append((GROUP_CONFIG_CLIENT_ASSIGNMENT_TAG, _INT8.pack(1)))
        if tagged:
            writer.uvarint(len(tagged))
            for tag, payload in tagged:
                writer.uvarint(tag)
                writer.uvarint(len(payload))
                writer.buffer += payload
            return writer.done()
    elif isinstance(value, records.GroupLifecycleValue):
        writer.int64(value.empty_since_ms)
    elif isinstance(value, records.GroupOwnerValue):
        writer.compact_string(value.namespace)
        writer.compact_string(value.name)
        writer.compact_string(value.uid)
    else:
        writer.compact_string(value.nonce)
        writer.int64(value.written_at_ms)
    writer.no_tagged_fields()
    return writer.done()


def encode_record(record: records.Record) -> tuple[bytes, bytes | None]:
    """The (key, value) bytes of ``record``; the value is ``None`` for a tombstone."""
    key = encode_key(record.key)
    return key, None if record.value is None else encode_value(record.value)


# ---------------------------------------------------------------------------------------
# Reading


class _Reader:
    """Reads Kafka primitive types from ``data`` starting at ``pos``; checks every bound."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def _take(self, size: int) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise CodecError(f"record truncated: needs {size} bytes at {self.pos}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def int8(self) -> int:
        value: int = _INT8.unpack_from(self._take(1))[0]
        return value

    def int16(self) -> int:
        value: int = _INT16.unpack_from(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack_from(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack_from(self._take(8))[0]
        return value

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self._take(16))

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            if self.pos >= len(self.data):
                raise CodecError("record truncated inside a varint")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CodecError("varint longer than 5 bytes")

    def string(self) -> str:
        length = self.int16()
        if length < 0:
            raise CodecError("null where a string is required")
        return _text(self._take(length))

    def nullable_string(self) -> str | None:
        length = self.int16()
        return None if length < 0 else _text(self._take(length))

    def bytes32(self) -> bytes:
        length = self.int32()
        if length < 0:
            raise CodecError("null where bytes are required")
        return self._take(length)

    def count32(self) -> int:
        count = self.int32()
        if count < 0:
            raise CodecError("null where an array is required")
        return count

    def compact_nullable_string(self) -> str | None:
        length = self.uvarint() - 1
        if length > MAX_STRING_BYTES:
            raise CodecError(f"string of {length} bytes exceeds Kafka's {MAX_STRING_BYTES}")
        return None if length < 0 else _text(self._take(length))

    def compact_string(self) -> str:
        value = self.compact_nullable_string()
        if value is None:
            raise CodecError("null where a compact string is required")
        return value

    def compact_count(self) -> int:
        count = self.uvarint() - 1
        if count < 0:
            raise CodecError("null where an array is required")
        return count

    def compact_strings(self) -> tuple[str, ...]:
        return tuple(self.compact_string() for _ in range(self.compact_count()))

    def compact_int32s(self) -> tuple[int, ...]:
        count = self.compact_count()
        values: tuple[int, ...] = struct.unpack(f">{count}i", self._take(4 * count))
        return values

    def skip(self, size: int) -> None:
        self._take(size)

    def compact_bytes(self) -> bytes:
        """A non-null compact ``bytes`` field."""
        return self._take(self.compact_count())

    def skip_tagged_fields(self) -> set[int]:
        """Skips a tagged-field section; returns the tags it held (their data is ignored)."""
        tags = set()
        for _ in range(self.uvarint()):
            tags.add(self.uvarint())
            self._take(self.uvarint())
        return tags

    def topic_partitions(self) -> tuple[records.TopicPartitions, ...]:
        entries = []
        for _ in range(self.compact_count()):
            topic_id = self.uuid()
            partitions = self.compact_int32s()
            self.skip_tagged_fields()
            entries.append(records.TopicPartitions(topic_id, partitions))
        return tuple(entries)


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as error:
        raise CodecError(f"string is not UTF-8: {error}") from error


def _decode_offset_commit_key(data: bytes) -> records.OffsetCommitKey:
    try:
        group_length = _INT16.unpack_from(data, 2)[0]
        group_end = 4 + group_length
        topic_length = _INT16.unpack_from(data, group_end)[0] if group_length >= 0 else -1
        if topic_length < 0:
            raise CodecError("null where a name is required in an offset commit key")
        topic_end = group_end + 2 + topic_length
        # Reading the partition also proves that both names fit in the buffer.
        partition: int = _INT32.unpack_from(data, topic_end)[0]
        return records.OffsetCommitKey(
            _name(data[4:group_end]), _name(data[group_end + 2 : topic_end]), partition
        )
    except struct.error as error:
        raise CodecError(f"truncated offset commit key: {error}") from error
    except UnicodeDecodeError as error:
        raise CodecError(f"offset commit key is not UTF-8: {error}") from error


def _group_key(cls: Callable[[str], records.RecordKey]) -> Callable[[bytes], records.RecordKey]:
    def decode(data: bytes) -> records.RecordKey:
        return cls(_Reader(data, 2).string())

    return decode


def _member_key(
    cls: Callable[[str, str], records.RecordKey],
) -> Callable[[bytes], records.RecordKey]:
    def decode(data: bytes) -> records.RecordKey:
        reader = _Reader(data, 2)
        return cls(reader.string(), reader.string())

    return decode


def _load_marker_key(data: bytes) -> records.RecordKey:
    return records.LoadMarkerKey()


_KEY_DECODERS: dict[int, Callable[[bytes], records.RecordKey]] = {
    OFFSET_COMMIT_KEY_V0: _decode_offset_commit_key,
    OFFSET_COMMIT_KEY_V1: _decode_offset_commit_key,
    GROUP_METADATA_KEY: _group_key(records.GroupMetadataKey),
    CONSUMER_GROUP_METADATA_KEY: _group_key(records.ConsumerGroupMetadataKey),
    CONSUMER_GROUP_PARTITION_METADATA_KEY: _group_key(records.ConsumerGroupPartitionMetadataKey),
    CONSUMER_GROUP_MEMBER_METADATA_KEY: _member_key(records.ConsumerGroupMemberMetadataKey),
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY: _group_key(
        records.ConsumerGroupTargetAssignmentMetadataKey
    ),
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY: _member_key(
        records.ConsumerGroupTargetAssignmentMemberKey
    ),
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY: _member_key(
        records.ConsumerGroupCurrentMemberAssignmentKey
    ),
    GROUP_CONFIG_KEY: _group_key(records.GroupConfigKey),
    GROUP_LIFECYCLE_KEY: _group_key(records.GroupLifecycleKey),
    GROUP_OWNER_KEY: _group_key(records.GroupOwnerKey),
    LOAD_MARKER_KEY: _load_marker_key,
}

_KEY_VERSIONS: dict[type, int] = {
    records.GroupMetadataKey: GROUP_METADATA_KEY,
    records.ConsumerGroupMetadataKey: CONSUMER_GROUP_METADATA_KEY,
    records.ConsumerGroupPartitionMetadataKey: CONSUMER_GROUP_PARTITION_METADATA_KEY,
    records.ConsumerGroupMemberMetadataKey: CONSUMER_GROUP_MEMBER_METADATA_KEY,
    records.ConsumerGroupTargetAssignmentMetadataKey: CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY,
    records.ConsumerGroupTargetAssignmentMemberKey: CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY,
    records.ConsumerGroupCurrentMemberAssignmentKey: CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY,
    records.GroupConfigKey: GROUP_CONFIG_KEY,
    records.GroupLifecycleKey: GROUP_LIFECYCLE_KEY,
    records.GroupOwnerKey: GROUP_OWNER_KEY,
}


def offset_commit_key_prefixes(group: str) -> tuple[bytes, ...]:
    """The bytes every offset commit key of ``group`` starts with, one per key version that
    holds an offset commit (0 and 1: the same fields, the group first).

    A key that starts with none of them is not an offset commit of ``group``: a reader after
    one group's commits passes over the rest of a state partition without decoding it.
    """
    raw = _utf8(group)
    return tuple(
        _VERSION_AND_LENGTH.pack(version, len(raw)) + raw
        for version in (OFFSET_COMMIT_KEY_V0, OFFSET_COMMIT_KEY_V1)
    )


def key_version(data: bytes) -> int:
    """The record type of encoded key ``data`` without decoding the rest."""
    try:
        version: int = _INT16.unpack_from(data, 0)[0]
    except struct.error as error:
        raise CodecError("a record key needs at least its 2-byte version") from error
    return version


def decode_key(data: bytes) -> records.RecordKey:
    """The key encoded in ``data``; ``UnknownRecordType`` for a key version we lack."""
    decoder = _KEY_DECODERS.get(key_version(data))
    if decoder is None:
        raise UnknownRecordType(key_version(data))
    return decoder(data)


def _decode_offset_commit_value(data: bytes, version: int) -> records.OffsetCommitValue:
    try:
        if version == 3:
            offset, leader_epoch, length = _OFFSET_V3_HEAD.unpack_from(data, 2)
            if length == 0:
                return records.OffsetCommitValue(
                    offset, leader_epoch, "", _INT64.unpack_from(data, 16)[0]
                )
            start = 16
        elif version in (0, 1, 2):
            offset, length = _OFFSET_V0_HEAD.unpack_from(data, 2)
            leader_epoch, start = -1, 12
        elif version == 4:
            return _decode_offset_commit_value_v4(data)
        else:
            raise UnsupportedValueVersion(f"OffsetCommitValue version {version} (reads 0-4)")
        end = start + length
        if length < 0 or end > len(data):
            raise CodecError("bad metadata length in an offset commit value")
        metadata = _text(data[start:end])
        if version == 1:
            commit_timestamp, expire_timestamp = _OFFSET_V1_TAIL.unpack_from(data, end)
        else:
            commit_timestamp, expire_timestamp = _INT64.unpack_from(data, end)[0], -1
        return records.OffsetCommitValue(
            offset, leader_epoch, metadata, commit_timestamp, expire_timestamp
        )
    except struct.error as error:
        raise CodecError(f"truncated offset commit value: {error}") from error


def _decode_offset_commit_value_v4(data: bytes) -> records.OffsetCommitValue:
    reader = _Reader(data, 2)
    offset = reader.int64()
    leader_epoch = reader.int32()
    metadata = reader.compact_string()
    commit_timestamp = reader.int64()
    # Tag 0 is the topic id (Kafka 4.1); the key already names the topic.
    reader.skip_tagged_fields()
    return records.OffsetCommitValue(offset, leader_epoch, metadata, commit_timestamp)


def _partition_metadata_value(reader: _Reader) -> records.RecordValue:
    topics = []
    for _ in range(reader.compact_count()):
        topic_id = reader.uuid()
        name = reader.compact_string()
        num_partitions = reader.int32()
        partitions = []
        for _ in range(reader.compact_count()):
            partition = reader.int32()
            racks = reader.compact_strings()
            reader.skip_tagged_fields()
            partitions.append(records.PartitionMetadata(partition, racks))
        reader.skip_tagged_fields()
        topics.append(records.TopicMetadata(topic_id, name, num_partitions, tuple(partitions)))
    return records.ConsumerGroupPartitionMetadataValue(tuple(topics))


def _member_metadata_value(reader: _Reader) -> records.RecordValue:
    """Reads its own tagged fields: tag 0 is the classic member metadata."""
    instance_id = reader.compact_nullable_string()
    rack_id = reader.compact_nullable_string()
    client_id = reader.compact_string()
    client_host = reader.compact_string()
    subscribed_topic_names = reader.compact_strings()
    subscribed_topic_regex = reader.compact_nullable_string()
    rebalance_timeout_ms = reader.int32()
    server_assignor = reader.compact_nullable_string()
    classic: records.ClassicMemberMetadata | None = None
    for _ in range(reader.uvarint()):
        tag, size = reader.uvarint(), reader.uvarint()
        if tag != MEMBER_CLASSIC_METADATA_TAG:
            reader.skip(size)
            continue
        end = reader.pos + size
        session_timeout_ms = reader.int32()
        protocols = []
        for _ in range(reader.compact_count()):
            name = reader.compact_string()
            metadata = reader.compact_bytes()
            reader.skip_tagged_fields()
            protocols.append(records.ClassicProtocol(name, metadata))
        reader.skip_tagged_fields()
        if reader.pos != end:
            raise CodecError("classic member metadata does not fill its tagged field")
        classic = records.ClassicMemberMetadata(session_timeout_ms, tuple(protocols))
    return records.ConsumerGroupMemberMetadataValue(
        instance_id=instance_id,
        rack_id=rack_id,
        client_id=client_id,
        client_host=client_host,
        subscribed_topic_names=subscribed_topic_names,
        subscribed_topic_regex=subscribed_topic_regex,
        rebalance_timeout_ms=rebalance_timeout_ms,
        server_assignor=server_assignor,
        classic_member_metadata=classic,
    )


def _group_metadata_value(data: bytes, version: int) -> records.GroupMetadataValue:
    if version not in GROUP_METADATA_VALUE_VERSIONS:
        raise UnsupportedValueVersion(f"GroupMetadataValue value version {version} (reads 0-4)")
    reader = _Reader(data, 2)
    flexible = version >= GROUP_METADATA_FLEXIBLE_VERSION
    string = reader.compact_string if flexible else reader.string
    nullable = reader.compact_nullable_string if flexible else reader.nullable_string
    data_field = reader.compact_bytes if flexible else reader.bytes32
    count = reader.compact_count if flexible else reader.count32
    protocol_type = string()
    generation = reader.int32()
    protocol = nullable()
    leader = nullable()
    timestamp = reader.int64() if version >= 2 else -1
    members = []
    for _ in range(count()):
        member_id = string()
        instance_id = nullable() if version >= 3 else None
        client_id = string()
        client_host = string()
        rebalance_timeout = reader.int32() if version >= 1 else -1
        session_timeout = reader.int32()
        subscription = data_field()
        assignment = data_field()
        if flexible:
            reader.skip_tagged_fields()
        members.append(
            records.GroupMetadataMember(
                member_id=member_id,
                client_id=client_id,
                client_host=client_host,
                session_timeout=session_timeout,
                subscription=subscription,
                assignment=assignment,
                group_instance_id=instance_id,
                rebalance_timeout=rebalance_timeout,
            )
        )
    if flexible:
        reader.skip_tagged_fields()
    if reader.pos != len(data):
        raise CodecError(f"GroupMetadataValue has {len(data) - reader.pos} bytes left over")
    return records.GroupMetadataValue(
        protocol_type=protocol_type,
        generation=generation,
        protocol=protocol,
        leader=leader,
        current_state_timestamp=timestamp,
        members=tuple(members),
        version=version,
    )


def _current_assignment_value(reader: _Reader) -> records.RecordValue:
    member_epoch = reader.int32()
    previous_member_epoch = reader.int32()
    state = reader.int8()
    assigned = reader.topic_partitions()
    pending = reader.topic_partitions()
    return records.ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=member_epoch,
        previous_member_epoch=previous_member_epoch,
        state=state,
        assigned_partitions=assigned,
        partitions_pending_revocation=pending,
    )


def _group_config_value(reader: _Reader) -> records.RecordValue:
    """Reads its own tagged fields: tag 0 holds the paused targets."""
    assignor = reader.compact_string()
    session_timeout_ms = reader.int32()
    rebalance_timeout_ms = reader.int32()
    heartbeat_interval_ms = reader.int32()
    offsets_retention_ms = reader.int64()
    assignment_paused = reader.int8() != 0
    topics = reader.compact_strings()
    paused_targets: list[records.MemberTarget] = []
    client_assignment = False
    for _ in range(reader.uvarint()):
        tag = reader.uvarint()
        size = reader.uvarint()
        if tag == GROUP_CONFIG_CLIENT_ASSIGNMENT_TAG:
            if size != 1:
                raise CodecError("client_assignment is one byte")
            client_assignment = reader.int8() != 0
            continue
        if tag != GROUP_CONFIG_PAUSED_TARGETS_TAG:
            reader.skip(size)
            continue
        end = reader.pos + size
        for _ in range(reader.compact_count()):
            member_id = reader.compact_string()
            paused_targets.append(records.MemberTarget(member_id, reader.topic_partitions()))
            reader.skip_tagged_fields()
        if reader.pos != end:
            raise CodecError("paused targets do not fill their tagged field")
    return records.GroupConfigValue(
        assignor=assignor,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        offsets_retention_ms=offsets_retention_ms,
        assignment_paused=assignment_paused,
        topics=topics,
        paused_targets=tuple(paused_targets),
        client_assignment=client_assignment,
    )


def _load_marker_value(reader: _Reader) -> records.RecordValue:
    return records.LoadMarkerValue(nonce=reader.compact_string(), written_at_ms=reader.int64())


# Flexible version-0 values: the field decoder; the closing tagged fields are read after it,
# except by the decoders that interpret some of them.
_READS_OWN_TAGGED_FIELDS = frozenset({_group_config_value, _member_metadata_value})
_FLEXIBLE_VALUE_DECODERS: dict[type, Callable[[_Reader], records.RecordValue]] = {
    records.ConsumerGroupMetadataKey: lambda r: records.ConsumerGroupMetadataValue(r.int32()),
    records.ConsumerGroupPartitionMetadataKey: _partition_metadata_value,
    records.ConsumerGroupMemberMetadataKey: _member_metadata_value,
    records.ConsumerGroupTargetAssignmentMetadataKey: (
        lambda r: records.ConsumerGroupTargetAssignmentMetadataValue(r.int32())
    ),
    records.ConsumerGroupTargetAssignmentMemberKey: (
        lambda r: records.ConsumerGroupTargetAssignmentMemberValue(r.topic_partitions())
    ),
    records.ConsumerGroupCurrentMemberAssignmentKey: _current_assignment_value,
    records.GroupConfigKey: _group_config_value,
    records.GroupLifecycleKey: lambda r: records.GroupLifecycleValue(r.int64()),
    records.GroupOwnerKey: lambda r: records.GroupOwnerValue(
        r.compact_string(), r.compact_string(), r.compact_string()
    ),
    records.LoadMarkerKey: _load_marker_value,
}


def decode_value(key: records.RecordKey, data: bytes | None) -> records.RecordValue | None:
    """The value encoded in ``data`` for a record with ``key``; ``None`` for a tombstone."""
    if data is None:
        return None
    try:
        version: int = _INT16.unpack_from(data, 0)[0]
    except struct.error as error:
        raise CodecError("a record value needs at least its 2-byte version") from error
    if type(key) is records.OffsetCommitKey:
        return _decode_offset_commit_value(data, version)
    if type(key) is records.GroupMetadataKey:
        return _group_metadata_value(data, version)
    decoder = _FLEXIBLE_VALUE_DECODERS[type(key)]
    if version != 0:
        raise UnsupportedValueVersion(f"{type(key).__name__} value version {version} (reads 0)")
    reader = _Reader(data, 2)
    value = decoder(reader)
    if decoder not in _READS_OWN_TAGGED_FIELDS:
        reader.skip_tagged_fields()
    return value


def decode_record(key: bytes, value: bytes | None) -> records.Record:
    """The record stored as ``key``/``value`` bytes (``value`` ``None`` is a tombstone)."""
    if key[:2] == b"\x00\x01" and value is not None and value[:2] == _OFFSET_V3_HEADER:
        # The loader's hot path: an offset commit as we write it, decoded without dispatch.
        return records.Record(_decode_offset_commit_key(key), _decode_offset_commit_value(value, 3))
    decoded_key = decode_key(key)
    return records.Record(decoded_key, decode_value(decoded_key, value))
