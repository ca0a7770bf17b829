"""JSON bodies of the member API to and from the coordinator's request and response types.

Pure functions, no HTTP. Field names are camelCase (DESIGN §2); partitions travel as
``{"topic": [0, 1, 2]}`` maps. Every decoder validates strictly and raises ``InvalidRequest``
(Kafka code 42, HTTP 400) naming the offending field, so a malformed body can never reach
the coordinator or turn into a 500. In particular every string must be encodable as UTF-8
(JSON's ``"\ud800"`` escape decodes to a lone surrogate, which no record can hold), and
every number must fit the Kafka field it fills (INT32 or INT64).
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Mapping
from typing import Any

from kafka_group_operator.coordinator import errors, messages

# Kafka's limits: group and topic names are at most 249 characters on the wire.
MAX_NAME_LENGTH = 249
MAX_METADATA_LENGTH = 4096
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Json = dict[str, Any]


def _fail(field: str, expected: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(f"field '{field}' must be {expected}")


def _object(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(field, "an object")
    return value


def parse_json(raw: bytes) -> object:
    """A request body: strict JSON (no ``NaN``/``Infinity``), any failure an ``InvalidRequest``."""
    try:
        # Decimal keeps 12345678901234567.0 exact, so an integral number loses no digit.
        return json.loads(raw, parse_float=decimal.Decimal, parse_constant=_refuse_constant)
    except RecursionError:
        # The C decoder recurses once per nesting level: "[[[[...", 100k deep, ends here.
        raise errors.InvalidRequest("body is not valid JSON: nested too deeply") from None
    except decimal.InvalidOperation:
        # An exponent beyond what Decimal holds, e.g. 1e99999999999999999999.
        raise errors.InvalidRequest("body is not valid JSON: a number out of range") from None
    except (ValueError, UnicodeDecodeError) as error:
        # json's messages name a position ("Expecting value: line 1 column 1 (char 0)").
        raise errors.InvalidRequest(f"body is not valid JSON: {error}") from None


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _int(value: object, field: str, minimum: int, maximum: int = INT32_MAX) -> int:
    # bool is an int in Python but never a valid number on the wire.
    if isinstance(value, bool) or not isinstance(value, int | decimal.Decimal):
        raise _fail(field, "an integer")
    # A Decimal is compared exactly and before int(), which "1e999999999" would make huge.
    if not minimum <= value <= maximum:
        raise _fail(field, f"between {minimum} and {maximum}")
    if isinstance(value, decimal.Decimal):
        # JSON Schema's "integer", which the OpenAPI document declares, includes 5.0.
        if value != value.to_integral_value():
            raise _fail(field, "an integer")
        return int(value)
    return value


# ASCII digits only: int() would also take "²", "٣", " 7", "+7" and "7_0". Ten digits hold
# any INT32; the OpenAPI document declares the same pattern.
_INT32_TEXT = re.compile(r"-?[0-9]{1,10}")


def _int_text(text: str, field: str, minimum: int, maximum: int = INT32_MAX) -> int:
    """A query-string INT32: optional minus and ASCII digits, within the Kafka range."""
    if not _INT32_TEXT.fullmatch(text):
        raise _fail(field, f"an integer between {minimum} and {maximum}")
    return _int(int(text), field, minimum, maximum)


def _unicode(value: str, field: str) -> str:
    """``value`` if it is valid Unicode text, i.e. holds no lone UTF-16 surrogate."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _fail(field, "valid Unicode (no lone surrogate)") from None
    return value


def _str(value: object, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty):
        raise _fail(field, "a non-empty string" if not allow_empty else "a string")
    if len(value) > MAX_NAME_LENGTH:
        raise _fail(field, f"at most {MAX_NAME_LENGTH} characters")
    return _unicode(value, field)


def group_id(value: str) -> str:
    """The group id of a request path."""
    return _str(value, "group")


def _optional_str(body: Mapping[str, Any], field: str) -> str | None:
    value = body.get(field)
    return None if value is None else _str(value, field)


def _check_fields(
    body: Mapping[str, Any], allowed: frozenset[str], required: frozenset[str]
) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise errors.InvalidRequest(f"unknown field(s): {_names(unknown)}")
    missing = sorted(required - set(body))
    if missing:
        raise errors.InvalidRequest(f"missing field(s): {', '.join(missing)}")


def _names(names: list[str]) -> str:
    """Client-chosen names for an error message: at most five, each escaped to ASCII."""
    shown = ", ".join(ascii(name)[1:-1][:MAX_NAME_LENGTH] for name in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def decode_partitions(value: object, field: str) -> messages.Assignment:
    """``{"topic": [0, 1]}`` into ``{"topic": frozenset({0, 1})}``."""
    topics = _object(value, field)
    decoded: dict[str, frozenset[int]] = {}
    for topic, partitions in topics.items():
        _str(topic, f"{field} key")
        if not isinstance(partitions, list):
            raise _fail(f"{field}.{topic}", "an array of partition numbers")
        decoded[topic] = frozenset(
            _int(partition, f"{field}.{topic}[]", 0) for partition in partitions
        )
    return decoded


def encode_partitions(assignment: messages.Assignment) -> dict[str, list[int]]:
    return {topic: sorted(partitions) for topic, partitions in sorted(assignment.items())}


HEARTBEAT_FIELDS = frozenset(
    {
        "memberId",
        "memberEpoch",
        "instanceId",
        "rack",
        "rebalanceTimeoutMs",
        "subscribedTopicNames",
        "serverAssignor",
        "ownedPartitions",
        "clientId",
    }
)


def decode_heartbeat(group_id: str, value: object, client_host: str) -> messages.HeartbeatRequest:
    body = _object(value, "body")
    _check_fields(body, HEARTBEAT_FIELDS, frozenset({"memberId", "memberEpoch"}))
    topics = body.get("subscribedTopicNames")
    if topics is not None:
        if not isinstance(topics, list):
            raise _fail("subscribedTopicNames", "an array of topic names")
        topics = tuple(_str(topic, "subscribedTopicNames[]") for topic in topics)
    timeout = body.get("rebalanceTimeoutMs")
    owned = body.get("ownedPartitions")
    client_id = body.get("clientId")
    return messages.HeartbeatRequest(
        group_id=group_id,
        member_id=_str(body["memberId"], "memberId"),
        member_epoch=_int(body["memberEpoch"], "memberEpoch", messages.STATIC_LEAVE_EPOCH),
        instance_id=_optional_str(body, "instanceId"),
        rack_id=_optional_str(body, "rack"),
        rebalance_timeout_ms=None if timeout is None else _int(timeout, "rebalanceTimeoutMs", 1),
        subscribed_topic_names=topics,
        server_assignor=_optional_str(body, "serverAssignor"),
        owned_partitions=None if owned is None else decode_partitions(owned, "ownedPartitions"),
        client_id="" if client_id is None else _str(client_id, "clientId", allow_empty=True),
        client_host=client_host,
    )


def encode_heartbeat(response: messages.HeartbeatResponse) -> Json:
    body: Json = {
        "memberId": response.member_id,
        "memberEpoch": response.member_epoch,
        "heartbeatIntervalMs": response.heartbeat_interval_ms,
    }
    if response.assignment is not None:
        body["assignment"] = encode_partitions(response.assignment)
    return body


def decode_commit(group_id: str, value: object) -> messages.OffsetCommitRequest:
    body = _object(value, "body")
    _check_fields(
        body,
        frozenset({"memberId", "memberEpoch", "offsets"}),
        frozenset({"memberId", "memberEpoch", "offsets"}),
    )
    entries = body["offsets"]
    if not isinstance(entries, list) or not entries:
        raise _fail("offsets", "a non-empty array")
    offsets: dict[messages.TopicPartition, messages.CommitOffset] = {}
    for index, entry_value in enumerate(entries):
        field = f"offsets[{index}]"
        entry = _object(entry_value, field)
        _check_fields(
            entry,
            frozenset({"topic", "partition", "offset", "metadata", "leaderEpoch"}),
            frozenset({"topic", "partition", "offset"}),
        )
        metadata = entry.get("metadata", "")
        if not isinstance(metadata, str) or len(metadata) > MAX_METADATA_LENGTH:
            raise _fail(
                f"{field}.metadata", f"a string of at most {MAX_METADATA_LENGTH} characters"
            )
        _unicode(metadata, f"{field}.metadata")
        key = (
            _str(entry["topic"], f"{field}.topic"),
            _int(entry["partition"], f"{field}.partition", 0),
        )
        # A partition given twice counts at its last entry, as Kafka's OffsetCommit (whose
        # records replay in order) and the coordinator's Kafka listener take it.
        offsets.pop(key, None)
        offsets[key] = messages.CommitOffset(
            offset=_int(entry["offset"], f"{field}.offset", 0, INT64_MAX),
            metadata=metadata,
            leader_epoch=_int(entry.get("leaderEpoch", -1), f"{field}.leaderEpoch", -1),
        )
    return messages.OffsetCommitRequest(
        group_id=group_id,
        # An administrative commit sends memberId "" and memberEpoch -1, as Kafka's admin does.
        member_id=_str(body["memberId"], "memberId", allow_empty=True),
        member_epoch=_int(body["memberEpoch"], "memberEpoch", messages.LEAVE_EPOCH),
        offsets=offsets,
    )


def encode_commit(response: messages.OffsetCommitResponse) -> Json:
    return {
        "errors": [
            {
                "topic": topic,
                "partition": partition,
                "error": name,
                "code": errors.BY_NAME[name].code if name in errors.BY_NAME else -1,
            }
            for (topic, partition), name in sorted(response.errors.items())
        ]
    }


def decode_read_fence(value: object) -> bool:
    """A read-fence request body: ``{"allPartitions": bool}`` (optional); whether to fence
    every state partition rather than only the group's."""
    body = _object(value, "body")
    _check_fields(body, frozenset({"allPartitions"}), frozenset())
    all_partitions = body.get("allPartitions", False)
    if not isinstance(all_partitions, bool):
        raise _fail("allPartitions", "a boolean")
    return all_partitions


def encode_read_fence(end_offsets: Mapping[int, int]) -> Json:
    """The exclusive end a reader must cover, per state partition, as the coordinator fenced."""
    return {
        "fence": "coordinator",
        "endOffsets": {str(partition): offset for partition, offset in sorted(end_offsets.items())},
    }


def decode_fetch(group_id: str, query: Mapping[str, list[str]]) -> messages.OffsetFetchRequest:
    """Query ``?partition=topic:0&partition=topic:1&memberId=...&memberEpoch=...``."""
    unknown = sorted(set(query) - {"partition", "memberId", "memberEpoch"})
    if unknown:
        raise errors.InvalidRequest(f"unknown query parameter(s): {_names(unknown)}")
    partitions: list[messages.TopicPartition] = []
    for text in query.get("partition", []):
        topic, separator, number = text.rpartition(":")
        if not separator or not topic:
            raise _fail("partition", "'topic:number'")
        partitions.append((_str(topic, "partition"), _int_text(number, "partition", 0)))
    member_ids = query.get("memberId", [])
    epochs = query.get("memberEpoch", [])
    if len(member_ids) > 1 or len(epochs) > 1 or len(member_ids) != len(epochs):
        raise errors.InvalidRequest("memberId and memberEpoch go together, once each")
    return messages.OffsetFetchRequest(
        group_id=group_id,
        partitions=tuple(partitions) if partitions else None,
        member_id=_str(member_ids[0], "memberId") if member_ids else None,
        member_epoch=(
            _int_text(epochs[0], "memberEpoch", messages.LEAVE_EPOCH) if epochs else None
        ),
    )


def decode_offset_delete(
    group_id: str, query: Mapping[str, list[str]]
) -> messages.OffsetDeleteRequest:
    """Query ``?partition=topic:0&partition=topic:1``: the partitions whose offsets go."""
    unknown = sorted(set(query) - {"partition"})
    if unknown:
        raise errors.InvalidRequest(f"unknown query parameter(s): {_names(unknown)}")
    partitions: list[messages.TopicPartition] = []
    for text in query.get("partition", []):
        topic, separator, number = text.rpartition(":")
        if not separator or not topic:
            raise _fail("partition", "'topic:number'")
        partitions.append((_str(topic, "partition"), _int_text(number, "partition", 0)))
    if not partitions:
        raise errors.InvalidRequest("name at least one partition: ?partition=topic:number")
    return messages.OffsetDeleteRequest(group_id=group_id, partitions=tuple(partitions))


# Kafka's codes of the per-partition errors an OffsetDelete answers (Errors.java).
_PARTITION_ERROR_CODES = {"GROUP_SUBSCRIBED_TO_TOPIC": 86, "UNKNOWN_TOPIC_OR_PARTITION": 3}


def encode_offset_delete(response: messages.OffsetDeleteResponse) -> Json:
    """The partitions whose offsets were kept, with Kafka's error; empty when all went."""
    return {
        "errors": [
            {
                "topic": topic,
                "partition": partition,
                "error": name,
                "code": _PARTITION_ERROR_CODES.get(
                    name, errors.BY_NAME[name].code if name in errors.BY_NAME else -1
                ),
            }
            for (topic, partition), name in sorted(response.errors.items())
        ]
    }


def encode_fetch(response: messages.OffsetFetchResponse) -> Json:
    return {
        "offsets": [
            {
                "topic": topic,
                "partition": partition,
                "offset": committed.offset,
                "metadata": committed.metadata,
                "leaderEpoch": committed.leader_epoch,
                "commitTimestamp": committed.commit_timestamp,
            }
            for (topic, partition), committed in sorted(response.offsets.items())
        ]
    }


def encode_description(
    description: messages.GroupDescription,
    lag: Mapping[messages.TopicPartition, int],
    log_end_age_ms: int | None = None,
) -> Json:
    return {
        "groupId": description.group_id,
        "state": description.state,
        "groupEpoch": description.group_epoch,
        "assignmentEpoch": description.assignment_epoch,
        "assignor": description.assignor,
        "sessionTimeoutMs": description.session_timeout_ms,
        "members": [
            {
                "memberId": member.member_id,
                "instanceId": member.instance_id,
                "rack": member.rack_id,
                "memberEpoch": member.member_epoch,
                "state": member.state,
                "subscribedTopicNames": list(member.subscribed_topic_names),
                "assignment": encode_partitions(member.assignment),
                "targetAssignment": encode_partitions(member.target_assignment),
                "partitionsPendingRevocation": encode_partitions(
                    member.partitions_pending_revocation
                ),
                "clientId": member.client_id,
                "clientHost": member.client_host,
                "sessionExpiresInMs": member.session_expires_in_ms,
            }
            for member in description.members
        ],
        "lag": [
            {"topic": topic, "partition": partition, "lag": value}
            for (topic, partition), value in sorted(lag.items())
        ],
        "totalLag": sum(max(value, 0) for value in lag.values()),
        # Lag comes from log ends cached in the background: how old the oldest one used is.
        "logEndAgeMs": log_end_age_ms,
    }


def error_body(error: errors.CoordinatorError) -> Json:
    return error.to_dict()
