"""The record codec against Kafka's bytes: worked examples, every version read, round trips."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_group_operator.coordinator import group_state
from kafka_group_records import codec, records

TOPIC_ID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace("|", " "))


# ---------------------------------------------------------------------------------------
# Worked examples (Kafka's encoding, computed from its message schemas)


def test_record_types_and_value_versions_are_kafkas() -> None:
    # The key version is the record type: the "validVersions" of each key schema in
    # apache/kafka group-coordinator/src/main/resources/common/message/ (OffsetCommitKey
    # "0-1", GroupMetadataKey "2", ConsumerGroupMetadataKey "3",
    # ConsumerGroupPartitionMetadataKey "4", ConsumerGroupMemberMetadataKey "5",
    # ConsumerGroupTargetAssignmentMetadataKey "6", ConsumerGroupTargetAssignmentMemberKey
    # "7", ConsumerGroupCurrentMemberAssignmentKey "8").
    assert (codec.OFFSET_COMMIT_KEY_V0, codec.OFFSET_COMMIT_KEY_V1) == (0, 1)
    assert codec.GROUP_METADATA_KEY == 2
    assert codec.CONSUMER_GROUP_METADATA_KEY == 3
    assert codec.CONSUMER_GROUP_PARTITION_METADATA_KEY == 4
    assert codec.CONSUMER_GROUP_MEMBER_METADATA_KEY == 5
    assert codec.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY == 6
    assert codec.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY == 7
    assert codec.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY == 8
    # OffsetCommitValue.json: "validVersions": "0-4"; version 1 is the only one with
    # expireTimestamp, version 3 the newest non-flexible one (leaderEpoch since 3).
    assert codec.OFFSET_COMMIT_VALUE_EXPIRING_VERSION == 1
    assert codec.OFFSET_COMMIT_VALUE_WRITE_VERSION == 3
    # Errors.java: CORRUPT_MESSAGE(2, ...), UNSUPPORTED_VERSION(35, ...).
    assert (codec.CodecError.code, codec.CodecError.name) == (2, "CORRUPT_MESSAGE")
    assert (codec.UnknownRecordType.code, codec.UnknownRecordType.name) == (
        35,
        "UNSUPPORTED_VERSION",
    )


def test_offset_commit_key_v1_bytes() -> None:
    key = records.OffsetCommitKey("g1", "orders", 3)
    expected = _hex("00 01 | 00 02 67 31 | 00 06 6f 72 64 65 72 73 | 00 00 00 03")
    assert codec.encode_key(key) == expected
    assert codec.decode_key(expected) == key


def test_offset_commit_key_v0_reads_like_v1() -> None:
    v0 = _hex("00 00 | 00 02 67 31 | 00 06 6f 72 64 65 72 73 | 00 00 00 03")
    assert codec.decode_key(v0) == records.OffsetCommitKey("g1", "orders", 3)


def test_offset_commit_value_v3_bytes() -> None:
    value = records.OffsetCommitValue(42, leader_epoch=5, commit_timestamp=1700000000000)
    expected = _hex(
        "00 03 | 00 00 00 00 00 00 00 2a | 00 00 00 05 | 00 00 | 00 00 01 8b cf e5 68 00"
    )
    assert codec.encode_value(value) == expected
    assert codec.decode_value(records.OffsetCommitKey("g1", "orders", 3), expected) == value


def test_offset_commit_value_v4_bytes_are_read() -> None:
    v4 = _hex("00 04 | 00 00 00 00 00 00 00 2a | 00 00 00 05 | 01 | 00 00 01 8b cf e5 68 00 | 00")
    key = records.OffsetCommitKey("g1", "orders", 3)
    assert codec.decode_value(key, v4) == records.OffsetCommitValue(
        42, leader_epoch=5, commit_timestamp=1700000000000
    )


def test_offset_commit_value_v4_skips_the_topic_id_tag() -> None:
    # Kafka 4.1 adds tag 0 = topicId (16 bytes); an older reader skips it.
    v4 = _hex(
        "00 04 | 00 00 00 00 00 00 00 07 | ff ff ff ff | 03 6d 64 | 00 00 00 00 00 00 00 09 |"
        "01 | 00 10" + TOPIC_ID.hex
    )
    key = records.OffsetCommitKey("g", "t", 0)
    assert codec.decode_value(key, v4) == records.OffsetCommitValue(
        7, leader_epoch=-1, metadata="md", commit_timestamp=9
    )


@pytest.mark.parametrize(
    ("version", "body", "expected"),
    [
        (0, "00 00 00 00 00 00 00 07 | 00 01 6d | 00 00 00 00 00 00 00 09",
         records.OffsetCommitValue(7, metadata="m", commit_timestamp=9)),
        (1, "00 00 00 00 00 00 00 07 | 00 01 6d | 00 00 00 00 00 00 00 09 |"
            "00 00 00 00 00 00 00 0b",
         records.OffsetCommitValue(7, metadata="m", commit_timestamp=9, expire_timestamp=11)),
        (2, "00 00 00 00 00 00 00 07 | 00 01 6d | 00 00 00 00 00 00 00 09",
         records.OffsetCommitValue(7, metadata="m", commit_timestamp=9)),
        (3, "00 00 00 00 00 00 00 07 | 00 00 00 02 | 00 01 6d | 00 00 00 00 00 00 00 09",
         records.OffsetCommitValue(7, leader_epoch=2, metadata="m", commit_timestamp=9)),
    ],
)  # fmt: skip
def test_offset_commit_value_every_old_version(
    version: int, body: str, expected: records.OffsetCommitValue
) -> None:
    data = version.to_bytes(2, "big") + _hex(body)
    assert codec.decode_value(records.OffsetCommitKey("g", "t", 0), data) == expected


def test_an_explicit_expiry_is_written_as_version_1() -> None:
    value = records.OffsetCommitValue(7, metadata="m", commit_timestamp=9, expire_timestamp=11)
    encoded = codec.encode_value(value)
    assert encoded[:2] == b"\x00\x01"
    assert codec.decode_value(records.OffsetCommitKey("g", "t", 0), encoded) == value


def test_group_metadata_key_v2_bytes_and_empty_group_value() -> None:
    key = records.GroupMetadataKey("g1")
    assert codec.encode_key(key) == _hex("00 02 | 00 02 67 31")
    # An empty classic group, GroupMetadataValue v3 as Kafka's newEmptyGroupMetadataRecord
    # writes it: protocolType "", generation 0, protocol null, leader null,
    # currentStateTimestamp 5, members [].
    value_bytes = _hex(
        "00 03 | 00 00 | 00 00 00 00 | ff ff | ff ff | 00 00 00 00 00 00 00 05 | 00 00 00 00"
    )
    decoded = codec.decode_value(key, value_bytes)
    assert decoded == records.GroupMetadataValue("", 0, None, None, 5, (), version=3)
    assert codec.encode_value(decoded) == value_bytes


_CLASSIC_MEMBER = records.GroupMetadataMember(
    member_id="m1",
    client_id="c",
    client_host="/h",
    session_timeout=10_000,
    subscription=b"sub",
    assignment=b"as",
    group_instance_id="i1",
    rebalance_timeout=30_000,
)
# GroupMetadataValue.json, field by field: each version adds (1) rebalanceTimeout, (2)
# currentStateTimestamp, (3) groupInstanceId; 4 is flexible (compact strings, bytes and
# arrays, a tagged-field section closing each struct).
_GROUP_METADATA_VERSIONS = {
    0: "00 00 | 00 08 636f6e73756d6572 | 00 00 00 03 | 00 05 72616e6765 | 00 02 6d31"
    " | 00 00 00 01 | 00 02 6d31 | 00 01 63 | 00 02 2f68 | 00 00 27 10"
    " | 00 00 00 03 737562 | 00 00 00 02 6173",
    1: "00 01 | 00 08 636f6e73756d6572 | 00 00 00 03 | 00 05 72616e6765 | 00 02 6d31"
    " | 00 00 00 01 | 00 02 6d31 | 00 01 63 | 00 02 2f68 | 00 00 75 30 | 00 00 27 10"
    " | 00 00 00 03 737562 | 00 00 00 02 6173",
    2: "00 02 | 00 08 636f6e73756d6572 | 00 00 00 03 | 00 05 72616e6765 | 00 02 6d31"
    " | 00 00 00 00 00 00 00 05 | 00 00 00 01 | 00 02 6d31 | 00 01 63 | 00 02 2f68"
    " | 00 00 75 30 | 00 00 27 10 | 00 00 00 03 737562 | 00 00 00 02 6173",
    3: "00 03 | 00 08 636f6e73756d6572 | 00 00 00 03 | 00 05 72616e6765 | 00 02 6d31"
    " | 00 00 00 00 00 00 00 05 | 00 00 00 01 | 00 02 6d31 | 00 02 6931 | 00 01 63"
    " | 00 02 2f68 | 00 00 75 30 | 00 00 27 10 | 00 00 00 03 737562 | 00 00 00 02 6173",
    4: "00 04 | 09 636f6e73756d6572 | 00 00 00 03 | 06 72616e6765 | 03 6d31"
    " | 00 00 00 00 00 00 00 05 | 02 | 03 6d31 | 03 6931 | 02 63 | 03 2f68"
    " | 00 00 75 30 | 00 00 27 10 | 04 737562 | 03 6173 | 00 | 00",
}


@pytest.mark.parametrize("version", sorted(_GROUP_METADATA_VERSIONS))
def test_group_metadata_value_bytes_of_every_version(version: int) -> None:
    data = _hex(_GROUP_METADATA_VERSIONS[version])
    # What each version can carry: the rest reads as Kafka's defaults.
    member = _CLASSIC_MEMBER
    if version < 3:
        member = dataclasses.replace(member, group_instance_id=None)
    if version < 1:
        member = dataclasses.replace(member, rebalance_timeout=-1)
    expected = records.GroupMetadataValue(
        protocol_type="consumer",
        generation=3,
        protocol="range",
        leader="m1",
        current_state_timestamp=5 if version >= 2 else -1,
        members=(member,),
        version=version,
    )
    key = records.GroupMetadataKey("g")
    assert codec.decode_value(key, data) == expected
    assert codec.encode_value(expected) == data


def test_group_metadata_value_refuses_leftovers_nulls_and_unknown_versions() -> None:
    key = records.GroupMetadataKey("g")
    good = _hex(_GROUP_METADATA_VERSIONS[3])
    with pytest.raises(codec.CodecError, match="left over"):
        codec.decode_value(key, good + b"\x00")
    with pytest.raises(codec.CodecError):
        codec.decode_value(key, good[:-1])
    null_assignment = good[: -len("as") - 4] + _hex("ff ff ff ff")
    with pytest.raises(codec.CodecError, match="null"):
        codec.decode_value(key, null_assignment)
    with pytest.raises(codec.UnsupportedValueVersion):
        codec.decode_value(key, b"\x00\x05" + good[2:])


def test_group_config_client_assignment_is_tag_1_and_absent_for_server() -> None:
    key = records.GroupConfigKey("g")
    server = records.GroupConfigValue()
    client = records.GroupConfigValue(client_assignment=True)
    server_bytes = codec.encode_value(server)
    client_bytes = codec.encode_value(client)
    # Server keeps the bytes written before the field existed: an empty tag section.
    assert server_bytes.endswith(b"\x01\x00")
    # One tagged field: tag 1, one byte, 1.
    assert client_bytes == server_bytes[:-1] + _hex("01 | 01 01 01")
    assert codec.decode_value(key, client_bytes) == client
    assert codec.decode_value(key, server_bytes) == server


def test_consumer_group_metadata_bytes() -> None:
    key = records.ConsumerGroupMetadataKey("g1")
    assert codec.encode_key(key) == _hex("00 03 | 00 02 67 31")
    value = records.ConsumerGroupMetadataValue(epoch=7)
    assert codec.encode_value(value) == _hex("00 00 | 00 00 00 07 | 00")


# ConsumerGroupCurrentMemberAssignmentValue v0 as Kafka lays it out
# (group-coordinator/src/main/resources/common/message/
# ConsumerGroupCurrentMemberAssignmentValue.json, flexible from version 0): MemberEpoch int32,
# PreviousMemberEpoch int32, State int8, AssignedPartitions and PartitionsPendingRevocation
# as compact arrays of TopicPartitions {TopicId uuid, Partitions compact int32 array, tagged
# fields}, then the value's tagged fields. State ids are Kafka's MemberState
# (group-coordinator/.../coordinator/group/modern/MemberState.java): STABLE 0,
# UNREVOKED_PARTITIONS 1, UNRELEASED_PARTITIONS 2, UNKNOWN 127.
KAFKA_STABLE, KAFKA_UNREVOKED, KAFKA_UNRELEASED, KAFKA_UNKNOWN = 0, 1, 2, 127


def _current_assignment_fields(state: int) -> str:
    """Version, epochs 3 and 2, ``state``, assigned {TOPIC_ID: [0, 1]}, nothing pending."""
    return (
        f"00 00 | 00 00 00 03 | 00 00 00 02 | {state:02x} |"
        "02 |" + TOPIC_ID.hex + "| 03 00 00 00 00 00 00 00 01 | 00 |"
        "01"
    )


def _current_assignment(state: int) -> records.ConsumerGroupCurrentMemberAssignmentValue:
    return records.ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=3,
        previous_member_epoch=2,
        state=state,
        assigned_partitions=(records.TopicPartitions(TOPIC_ID, (0, 1)),),
        partitions_pending_revocation=(),
    )


@pytest.mark.parametrize(
    ("name", "kafka_id"),
    [
        ("STABLE", KAFKA_STABLE),
        ("UNREVOKED_PARTITIONS", KAFKA_UNREVOKED),
        ("UNRELEASED_PARTITIONS", KAFKA_UNRELEASED),
        ("UNKNOWN", KAFKA_UNKNOWN),
    ],
)
def test_current_member_assignment_bytes_are_kafkas(name: str, kafka_id: int) -> None:
    """Written exactly as Kafka writes the value (no tagged field), and Kafka's bytes read
    as Kafka means them: its STABLE (0) is STABLE."""
    key = records.ConsumerGroupCurrentMemberAssignmentKey("g1", "m")
    assert codec.encode_key(key) == _hex("00 08 | 00 02 67 31 | 00 01 6d")
    value = _current_assignment(group_state.MemberState[name].value)
    kafkas = _hex(_current_assignment_fields(kafka_id) + "| 00")
    assert codec.encode_value(value) == kafkas
    assert codec.decode_value(key, kafkas) == value


def test_current_member_assignment_with_a_later_kafka_tag() -> None:
    """A tagged field a later Kafka adds is skipped, as Kafka's readers keep it aside."""
    key = records.ConsumerGroupCurrentMemberAssignmentKey("g1", "m")
    data = _hex(_current_assignment_fields(KAFKA_STABLE) + "| 01 | 00 02 aa bb")
    assert codec.decode_value(key, data) == _current_assignment(KAFKA_STABLE)


def test_member_metadata_bytes_and_classic_metadata_tag() -> None:
    key = records.ConsumerGroupMemberMetadataKey("g1", "m")
    value = records.ConsumerGroupMemberMetadataValue(
        instance_id="i",
        rack_id=None,
        client_id="c",
        client_host="h",
        subscribed_topic_names=("t",),
        subscribed_topic_regex=None,
        rebalance_timeout_ms=5000,
        server_assignor="uniform",
    )
    fields = "02 69 | 00 | 02 63 | 02 68 | 02 02 74 | 00 | 00 00 13 88 | 08 75 6e 69 66 6f 72 6d"
    assert codec.encode_value(value) == _hex("00 00 |" + fields + "| 00")
    # ClassicMemberMetadata (tag 0): sessionTimeoutMs 45000, no protocols, no tags.
    classic = "00 00 af c8 | 01 | 00"
    with_tag = _hex("00 00 |" + fields + "| 01 | 00 06 |" + classic)
    classic_value = dataclasses.replace(
        value, classic_member_metadata=records.ClassicMemberMetadata(45_000, ())
    )
    assert codec.decode_value(key, with_tag) == classic_value
    assert codec.encode_value(classic_value) == with_tag


def test_group_config_keeps_paused_targets_in_tag_0() -> None:
    value = records.GroupConfigValue(
        assignor="sticky",
        session_timeout_ms=1,
        rebalance_timeout_ms=2,
        heartbeat_interval_ms=3,
        offsets_retention_ms=4,
        assignment_paused=True,
        topics=("t",),
        paused_targets=(records.MemberTarget("m", (records.TopicPartitions(TOPIC_ID, (5,)),)),),
    )
    fields = (
        "00 00 | 07 73 74 69 63 6b 79 | 00 00 00 01 | 00 00 00 02 | 00 00 00 03 |"
        "00 00 00 00 00 00 00 04 | 01 | 02 02 74"
    )
    # One tagged field, tag 0, 27 bytes: [member "m", [TOPIC_ID: [5]], no tags].
    tagged = "01 | 00 | 1b | 02 | 02 6d | 02" + TOPIC_ID.hex + "| 02 00 00 00 05 | 00 | 00"
    expected = _hex(fields + "|" + tagged)
    assert codec.encode_value(value) == expected
    assert codec.decode_value(records.GroupConfigKey("g"), expected) == value
    # Written by a version without paused targets: no tagged field, read as none.
    unpaused = codec.decode_value(records.GroupConfigKey("g"), _hex(fields + "| 00"))
    assert unpaused == records.GroupConfigValue("sticky", 1, 2, 3, 4, True, ("t",))


def test_load_marker_key_has_no_fields() -> None:
    assert codec.encode_key(records.LoadMarkerKey()) == _hex("04 4c")
    assert codec.decode_key(_hex("04 4c")) == records.LoadMarkerKey()


def test_tombstones_decode_to_none() -> None:
    key_bytes, value_bytes = codec.encode_record(
        records.Record(records.OffsetCommitKey("g", "t", 1), None)
    )
    assert value_bytes is None
    assert codec.decode_record(key_bytes, None) == records.Record(
        records.OffsetCommitKey("g", "t", 1), None
    )


# ---------------------------------------------------------------------------------------
# Errors


def test_unknown_record_type_names_the_key_version() -> None:
    with pytest.raises(codec.UnknownRecordType) as raised:
        codec.decode_key(_hex("00 09 | 00 01 67"))
    assert raised.value.key_version == 9
    assert raised.value.name == "UNSUPPORTED_VERSION"


def test_unsupported_value_version() -> None:
    with pytest.raises(codec.UnsupportedValueVersion):
        codec.decode_value(records.OffsetCommitKey("g", "t", 0), _hex("00 05 00"))
    with pytest.raises(codec.UnsupportedValueVersion):
        codec.decode_value(records.ConsumerGroupMetadataKey("g"), _hex("00 01 00 00 00 01 00"))


@pytest.mark.parametrize(
    "data",
    [
        "",
        "00",
        "00 01 | 00 05 67",
        "00 01 | 00 02 67 31 | 00 06 6f 72",
        "00 01 | ff ff | 00 01 74 | 00 00 00 00",
        "00 01 | 00 01 ff | 00 01 74 | 00 00 00 00",
        "00 03 | 00 05 67",
    ],
)
def test_malformed_keys_are_codec_errors(data: str) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode_key(_hex(data))


@pytest.mark.parametrize(
    ("key", "data"),
    [
        (records.OffsetCommitKey("g", "t", 0), "00 03 | 00 00 00 00"),
        # the metadata claims 9 bytes; one follows
        (records.OffsetCommitKey("g", "t", 0), "00 03 | 00 00 00 00 00 00 00 01 | 00 00 00 00 |"
            "00 09 61"),
        (records.OffsetCommitKey("g", "t", 0), "00 04 | 00 00 00 00 00 00 00 01 00 00 00 00 00"),
        (records.ConsumerGroupMetadataKey("g"), "00 00 | 00 00"),
        (records.ConsumerGroupMemberMetadataKey("g", "m"), "00 00 | 05 61"),
        (records.ConsumerGroupTargetAssignmentMemberKey("g", "m"), "00 00 | 00 | 00"),
    ],
)  # fmt: skip
def test_malformed_values_are_codec_errors(key: records.RecordKey, data: str) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode_value(key, _hex(data))


# Kafka's generated code refuses any string over 0x7fff bytes
# (generator/src/main/java/org/apache/kafka/message/MessageDataGenerator.java: on write
# "'<name>' field is too long to be serialized", on read "string field <name> had invalid
# length"), compact strings included.
KAFKA_MAX_STRING = 0x7FFF


@pytest.mark.parametrize(
    "value",
    [
        records.ConsumerGroupMemberMetadataValue(client_id="c" * (KAFKA_MAX_STRING + 1)),
        records.ConsumerGroupMemberMetadataValue(instance_id="é" * (KAFKA_MAX_STRING // 2 + 1)),
        records.GroupConfigValue(topics=("t" * (KAFKA_MAX_STRING + 1),)),
        records.LoadMarkerValue(nonce="n" * (KAFKA_MAX_STRING + 1), written_at_ms=0),
    ],
    ids=["client-id", "two-byte-chars", "topic", "nonce"],
)
def test_compact_strings_over_32767_bytes_are_refused_on_encode(
    value: records.RecordValue,
) -> None:
    with pytest.raises(codec.CodecError, match="32767"):
        codec.encode_value(value)


def test_a_compact_string_of_32767_bytes_is_accepted() -> None:
    value = records.ConsumerGroupMemberMetadataValue(client_id="c" * KAFKA_MAX_STRING)
    key = records.ConsumerGroupMemberMetadataKey("g", "m")
    assert codec.decode_value(key, codec.encode_value(value)) == value


def test_compact_strings_over_32767_bytes_are_refused_on_decode() -> None:
    # ConsumerGroupMemberMetadataValue v0: InstanceId null, RackId null, ClientId of 32768
    # bytes (compact length 32769 = uvarint 81 80 02), ...
    data = (
        _hex("00 00 | 00 | 00 | 81 80 02")
        + b"c" * (KAFKA_MAX_STRING + 1)
        + _hex("01 | 01 | 00 | 00 00 00 00 | 00 | 00")
    )
    with pytest.raises(codec.CodecError, match="32767"):
        codec.decode_value(records.ConsumerGroupMemberMetadataKey("g", "m"), data)


@pytest.mark.parametrize(
    "key",
    [
        records.OffsetCommitKey("g" * (KAFKA_MAX_STRING + 1), "t", 0),
        records.ConsumerGroupMemberMetadataKey("g", "m" * (KAFKA_MAX_STRING + 1)),
    ],
    ids=["offset-commit-group", "member-id"],
)
def test_strings_over_32767_bytes_are_refused_in_keys(key: records.RecordKey) -> None:
    with pytest.raises(codec.CodecError, match="32767"):
        codec.encode_key(key)


def test_a_lone_surrogate_is_a_codec_error() -> None:
    with pytest.raises(codec.CodecError, match="UTF-8"):
        codec.encode_key(records.ConsumerGroupMemberMetadataKey("g", "m\ud800"))
    with pytest.raises(codec.CodecError, match="UTF-8"):
        codec.encode_value(records.ConsumerGroupMemberMetadataValue(client_id="\udfff"))


# ---------------------------------------------------------------------------------------
# Round trips for every record type

_names = st.text(max_size=12)
_int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_uuids = st.uuids()
_name_tuples = st.lists(_names, max_size=4).map(tuple)
_topic_partitions = st.lists(
    st.builds(
        records.TopicPartitions,
        topic_id=_uuids,
        partitions=st.lists(_int32, max_size=6).map(tuple),
    ),
    max_size=4,
).map(tuple)

_offset_values = st.one_of(
    st.builds(
        records.OffsetCommitValue,
        offset=_int64,
        leader_epoch=_int32,
        metadata=_names,
        commit_timestamp=_int64,
    ),
    # An explicit expiry is only expressible in version 1, which has no leader epoch.
    st.builds(
        records.OffsetCommitValue,
        offset=_int64,
        leader_epoch=st.just(-1),
        metadata=_names,
        commit_timestamp=_int64,
        expire_timestamp=_int64.filter(lambda value: value != -1),
    ),
)

_pairs: list[st.SearchStrategy[tuple[records.RecordKey, records.RecordValue]]] = [
    st.tuples(st.builds(records.OffsetCommitKey, _names, _names, _int32), _offset_values),
    st.tuples(
        st.builds(records.GroupMetadataKey, _names),
        st.builds(
            records.GroupMetadataValue,
            protocol_type=_names,
            generation=_int32,
            protocol=st.none() | _names,
            leader=st.none() | _names,
            current_state_timestamp=_int64,
            members=st.lists(
                st.builds(
                    records.GroupMetadataMember,
                    member_id=_names,
                    client_id=_names,
                    client_host=_names,
                    session_timeout=_int32,
                    subscription=st.binary(max_size=20),
                    assignment=st.binary(max_size=20),
                    group_instance_id=st.none() | _names,
                    rebalance_timeout=_int32,
                ),
                max_size=3,
            ).map(tuple),
            version=st.sampled_from([3, 4]),
        ),
    ),
    st.tuples(
        st.builds(records.ConsumerGroupMetadataKey, _names),
        st.builds(records.ConsumerGroupMetadataValue, _int32),
    ),
    st.tuples(
        st.builds(records.ConsumerGroupPartitionMetadataKey, _names),
        st.builds(
            records.ConsumerGroupPartitionMetadataValue,
            st.lists(
                st.builds(
                    records.TopicMetadata,
                    topic_id=_uuids,
                    topic_name=_names,
                    num_partitions=_int32,
                    partition_metadata=st.lists(
                        st.builds(records.PartitionMetadata, _int32, _name_tuples), max_size=3
                    ).map(tuple),
                ),
                max_size=3,
            ).map(tuple),
        ),
    ),
    st.tuples(
        st.builds(records.ConsumerGroupMemberMetadataKey, _names, _names),
        st.builds(
            records.ConsumerGroupMemberMetadataValue,
            instance_id=st.none() | _names,
            rack_id=st.none() | _names,
            client_id=_names,
            client_host=_names,
            subscribed_topic_names=_name_tuples,
            subscribed_topic_regex=st.none() | _names,
            rebalance_timeout_ms=_int32,
            server_assignor=st.none() | _names,
        ),
    ),
    st.tuples(
        st.builds(records.ConsumerGroupTargetAssignmentMetadataKey, _names),
        st.builds(records.ConsumerGroupTargetAssignmentMetadataValue, _int32),
    ),
    st.tuples(
        st.builds(records.ConsumerGroupTargetAssignmentMemberKey, _names, _names),
        st.builds(records.ConsumerGroupTargetAssignmentMemberValue, _topic_partitions),
    ),
    st.tuples(
        st.builds(records.ConsumerGroupCurrentMemberAssignmentKey, _names, _names),
        st.builds(
            records.ConsumerGroupCurrentMemberAssignmentValue,
            member_epoch=_int32,
            previous_member_epoch=_int32,
            state=st.integers(-128, 127),
            assigned_partitions=_topic_partitions,
            partitions_pending_revocation=_topic_partitions,
        ),
    ),
    st.tuples(
        st.builds(records.GroupConfigKey, _names),
        st.builds(
            records.GroupConfigValue,
            assignor=_names,
            session_timeout_ms=_int32,
            rebalance_timeout_ms=_int32,
            heartbeat_interval_ms=_int32,
            offsets_retention_ms=_int64,
            assignment_paused=st.booleans(),
            topics=_name_tuples,
            paused_targets=st.lists(
                st.builds(records.MemberTarget, _names, _topic_partitions), max_size=3
            ).map(tuple),
            client_assignment=st.booleans(),
        ),
    ),
    st.tuples(
        st.builds(records.GroupLifecycleKey, _names),
        st.builds(records.GroupLifecycleValue, _int64),
    ),
    st.tuples(
        st.builds(records.GroupOwnerKey, _names),
        st.builds(records.GroupOwnerValue, _names, _names, _names),
    ),
    st.tuples(
        st.just(records.LoadMarkerKey()),
        st.builds(records.LoadMarkerValue, _names, _int64),
    ),
]


@pytest.mark.parametrize("pairs", _pairs, ids=lambda s: repr(s)[:60])
@given(data=st.data())
def test_round_trip(
    pairs: st.SearchStrategy[tuple[records.RecordKey, records.RecordValue]], data: st.DataObject
) -> None:
    key, value = data.draw(pairs)
    for record in (records.Record(key, value), records.Record(key, None)):
        key_bytes, value_bytes = codec.encode_record(record)
        assert codec.decode_record(key_bytes, value_bytes) == record
        assert codec.key_version(key_bytes) == codec.key_version(codec.encode_key(key))


def test_every_record_type_has_a_round_trip_strategy() -> None:
    key_types = {
        records.OffsetCommitKey, records.GroupMetadataKey, records.ConsumerGroupMetadataKey,
        records.ConsumerGroupPartitionMetadataKey, records.ConsumerGroupMemberMetadataKey,
        records.ConsumerGroupTargetAssignmentMetadataKey,
        records.ConsumerGroupTargetAssignmentMemberKey,
        records.ConsumerGroupCurrentMemberAssignmentKey, records.GroupConfigKey,
        records.GroupLifecycleKey, records.GroupOwnerKey, records.LoadMarkerKey,
    }  # fmt: skip
    assert set(records.RecordKey.__args__) == key_types  # type: ignore[attr-defined]
    assert len(_pairs) == len(key_types)


def test_offset_commit_key_prefixes_are_the_group_s_first_bytes_in_both_versions() -> None:
    """OffsetCommitKey.json: versions 0-1, the group first (an int16-length string)."""
    v0, v1 = codec.offset_commit_key_prefixes("g1")
    assert (v0, v1) == (_hex("00 00 | 00 02 67 31"), _hex("00 01 | 00 02 67 31"))
    assert codec.encode_key(records.OffsetCommitKey("g1", "orders", 3)).startswith(v1)
    kafka_v0 = _hex("00 00 | 00 02 67 31 | 00 06 6f 72 64 65 72 73 | 00 00 00 03")
    assert kafka_v0.startswith(v0)
    # The length is part of the prefix: a group whose name starts with another's is apart.
    for other in ("g", "g12", "G1"):
        assert not codec.encode_key(records.OffsetCommitKey(other, "g1", 0)).startswith((v0, v1))
    # Other records of the group are not offset commits.
    assert not codec.encode_key(records.GroupMetadataKey("g1")).startswith((v0, v1))
    assert codec.offset_commit_key_prefixes("é")[1] == _hex("00 01 | 00 02 c3 a9")
    with pytest.raises(codec.CodecError):
        codec.offset_commit_key_prefixes("g" * 40_000)
    with pytest.raises(codec.CodecError):
        codec.offset_commit_key_prefixes("\udcff")  # argv's escape of a byte that is not UTF-8
