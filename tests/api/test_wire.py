"""The member API's JSON decoding: strict, and every malformed body is an INVALID_REQUEST."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_group_operator.api import wire
from kafka_group_operator.coordinator import errors, messages


def test_heartbeat_decodes_every_field() -> None:
    request = wire.decode_heartbeat(
        "g",
        {
            "memberId": "m1",
            "memberEpoch": 0,
            "instanceId": "g-0",
            "rack": "a",
            "rebalanceTimeoutMs": 1000,
            "subscribedTopicNames": ["orders"],
            "serverAssignor": "uniform",
            "ownedPartitions": {"orders": [2, 0]},
            "clientId": "c",
        },
        "10.0.0.1",
    )
    assert request == messages.HeartbeatRequest(
        group_id="g",
        member_id="m1",
        member_epoch=0,
        instance_id="g-0",
        rack_id="a",
        rebalance_timeout_ms=1000,
        subscribed_topic_names=("orders",),
        server_assignor="uniform",
        owned_partitions={"orders": frozenset({0, 2})},
        client_id="c",
        client_host="10.0.0.1",
    )


def test_heartbeat_leaves_absent_optional_fields_unchanged() -> None:
    request = wire.decode_heartbeat("g", {"memberId": "m1", "memberEpoch": 5}, "")
    assert request.owned_partitions is None
    assert request.subscribed_topic_names is None
    assert request.instance_id is None


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ([], "'body' must be an object"),
        ({"memberEpoch": 0}, "missing field(s): memberId"),
        ({"memberId": "m", "memberEpoch": "0"}, "'memberEpoch' must be an integer"),
        ({"memberId": "m", "memberEpoch": True}, "'memberEpoch' must be an integer"),
        ({"memberId": "m", "memberEpoch": -3}, "'memberEpoch' must be between -2"),
        ({"memberId": "", "memberEpoch": 0}, "'memberId' must be a non-empty string"),
        ({"memberId": "m", "memberEpoch": 0, "owned": {}}, "unknown field(s): owned"),
        (
            {"memberId": "m", "memberEpoch": 0, "ownedPartitions": {"t": [-1]}},
            "'ownedPartitions.t[]' must be between 0",
        ),
        (
            {"memberId": "m", "memberEpoch": 0, "ownedPartitions": {"t": 1}},
            "'ownedPartitions.t' must be an array",
        ),
        (
            {"memberId": "m", "memberEpoch": 0, "subscribedTopicNames": "t"},
            "'subscribedTopicNames' must be an array",
        ),
        ({"memberId": "m" * 300, "memberEpoch": 0}, "at most 249 characters"),
    ],
)
def test_malformed_heartbeats_are_invalid_requests(body: Any, complaint: str) -> None:
    with pytest.raises(errors.InvalidRequest) as raised:
        wire.decode_heartbeat("g", body, "")
    assert complaint in raised.value.message
    assert raised.value.to_dict()["code"] == 42


def test_commit_decodes_offsets_and_admin_identity() -> None:
    request = wire.decode_commit(
        "g",
        {
            "memberId": "",
            "memberEpoch": -1,
            "offsets": [
                {"topic": "t", "partition": 1, "offset": 10, "metadata": "x", "leaderEpoch": 3},
                {"topic": "t", "partition": 0, "offset": 0},
            ],
        },
    )
    assert request.member_id == ""
    assert request.member_epoch == -1
    assert request.offsets == {
        ("t", 1): messages.CommitOffset(offset=10, metadata="x", leader_epoch=3),
        ("t", 0): messages.CommitOffset(offset=0),
    }


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ({"memberId": "m", "memberEpoch": 1, "offsets": []}, "'offsets' must be a non-empty"),
        ({"memberId": "m", "memberEpoch": 1}, "missing field(s): offsets"),
        (
            {"memberId": "m", "memberEpoch": 1, "offsets": [{"topic": "t", "partition": 0}]},
            "missing field(s): offset",
        ),
        (
            {
                "memberId": "m",
                "memberEpoch": 1,
                "offsets": [{"topic": "t", "partition": 0, "offset": -5}],
            },
            "'offsets[0].offset' must be between 0",
        ),
        (
            {
                "memberId": "m",
                "memberEpoch": 1,
                "offsets": [{"topic": "t", "partition": 0, "offset": 1, "metadata": 7}],
            },
            "'offsets[0].metadata' must be a string",
        ),
    ],
)
def test_malformed_commits_are_invalid_requests(body: Any, complaint: str) -> None:
    with pytest.raises(errors.InvalidRequest) as raised:
        wire.decode_commit("g", body)
    assert complaint in raised.value.message


def test_fetch_query() -> None:
    request = wire.decode_fetch(
        "g", {"partition": ["a.b:0", "a.b:12"], "memberId": ["m"], "memberEpoch": ["4"]}
    )
    assert request == messages.OffsetFetchRequest(
        group_id="g", partitions=(("a.b", 0), ("a.b", 12)), member_id="m", member_epoch=4
    )
    assert wire.decode_fetch("g", {}).partitions is None


@pytest.mark.parametrize(
    "query",
    [
        {"partition": ["nocolon"]},
        {"partition": ["t:x"]},
        {"memberId": ["m"]},
        {"memberId": ["m"], "memberEpoch": ["x"]},
        {"group": ["other"]},
    ],
)
def test_malformed_fetch_queries_are_invalid_requests(query: dict[str, list[str]]) -> None:
    with pytest.raises(errors.InvalidRequest):
        wire.decode_fetch("g", query)


def test_heartbeat_reply_omits_an_unchanged_assignment() -> None:
    unchanged = messages.HeartbeatResponse("m", 3, 500)
    assert wire.encode_heartbeat(unchanged) == {
        "memberId": "m",
        "memberEpoch": 3,
        "heartbeatIntervalMs": 500,
    }
    changed = messages.HeartbeatResponse("m", 4, 500, {"t": frozenset({3, 1})})
    assert wire.encode_heartbeat(changed)["assignment"] == {"t": [1, 3]}


# A lone UTF-16 surrogate: what JSON's "\ud800" escape decodes to. No record can encode it.
LONE = "m\ud800"
HEARTBEAT = {"memberId": "m", "memberEpoch": 0}
COMMIT_ENTRY = {"topic": "t", "partition": 0, "offset": 1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**HEARTBEAT, "memberId": LONE}, "memberId"),
        ({**HEARTBEAT, "instanceId": LONE}, "instanceId"),
        ({**HEARTBEAT, "rack": LONE}, "rack"),
        ({**HEARTBEAT, "serverAssignor": LONE}, "serverAssignor"),
        ({**HEARTBEAT, "clientId": LONE}, "clientId"),
        ({**HEARTBEAT, "subscribedTopicNames": ["t", LONE]}, "subscribedTopicNames[]"),
        ({**HEARTBEAT, "memberEpoch": 3, "ownedPartitions": {LONE: [0]}}, "ownedPartitions key"),
    ],
)
def test_a_lone_surrogate_in_a_heartbeat_is_an_invalid_request(
    body: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.InvalidRequest) as raised:
        wire.decode_heartbeat("g", body, "")
    assert raised.value.message == f"field '{field}' must be valid Unicode (no lone surrogate)"


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({**COMMIT_ENTRY, "topic": LONE}, "offsets[0].topic"),
        ({**COMMIT_ENTRY, "metadata": LONE}, "offsets[0].metadata"),
    ],
)
def test_a_lone_surrogate_in_a_commit_is_an_invalid_request(
    entry: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.InvalidRequest) as raised:
        wire.decode_commit("g", {"memberId": "m", "memberEpoch": 1, "offsets": [entry]})
    assert raised.value.message == f"field '{field}' must be valid Unicode (no lone surrogate)"
    with pytest.raises(errors.InvalidRequest, match="'memberId' must be valid Unicode"):
        wire.decode_commit("g", {"memberId": LONE, "memberEpoch": 1, "offsets": [COMMIT_ENTRY]})


def test_a_surrogate_encoded_as_utf8_is_refused_too() -> None:
    """json.loads decodes bytes with "surrogatepass": "\xed\xa0\x80" becomes a lone surrogate."""
    body = wire.parse_json(b'{"memberId": "m\xed\xa0\x80", "memberEpoch": 0}')
    with pytest.raises(errors.InvalidRequest, match="'memberId' must be valid Unicode"):
        wire.decode_heartbeat("g", body, "")


def test_a_lone_surrogate_in_a_query_or_group_is_an_invalid_request() -> None:
    with pytest.raises(errors.InvalidRequest, match="'partition' must be valid Unicode"):
        wire.decode_fetch("g", {"partition": [f"{LONE}:0"]})
    with pytest.raises(errors.InvalidRequest, match="'memberId' must be valid Unicode"):
        wire.decode_fetch("g", {"memberId": [LONE], "memberEpoch": ["1"]})
    with pytest.raises(errors.InvalidRequest, match="'group' must be valid Unicode"):
        wire.group_id(LONE)
    with pytest.raises(errors.InvalidRequest, match="'group' must be at most 249"):
        wire.group_id("g" * 250)
    assert wire.group_id("orders-é") == "orders-é"


def test_unknown_field_names_are_echoed_escaped_and_bounded() -> None:
    body = {**HEARTBEAT, **{f"{LONE}{index}": 1 for index in range(7)}}
    with pytest.raises(errors.InvalidRequest) as raised:
        wire.decode_heartbeat("g", body, "")
    assert raised.value.message == (
        "unknown field(s): m\\ud8000, m\\ud8001, m\\ud8002, m\\ud8003, m\\ud8004 and 2 more"
    )
    raised.value.message.encode()  # nothing unencodable is echoed back


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        (b"[" * 100_000, "nested too deeply"),
        (b'{"memberId": "m", "memberEpoch": NaN}', "NaN is not a JSON number"),
        (b'{"memberId": "m", "memberEpoch": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"memberEpoch": ' + b"7" * 5_000 + b"}", "not valid JSON"),
        (b'{"memberEpoch": 1e99999999999999999999}', "a number out of range"),  # for Decimal
    ],
)
def test_hostile_json_is_an_invalid_request(raw: bytes, complaint: str) -> None:
    with pytest.raises(errors.InvalidRequest) as raised:
        wire.parse_json(raw)
    assert complaint in raised.value.message


def test_integral_numbers_are_integers_as_json_schema_says() -> None:
    """JSON Schema's integer (the OpenAPI type) includes 5.0; digits are never rounded."""
    body = wire.parse_json(
        b'{"memberId": "m", "memberEpoch": 3.0, "offsets": [{"topic": "t", "partition": 1e0,'
        b' "offset": 12345678901234567.0, "leaderEpoch": -1.00}]}'
    )
    request = wire.decode_commit("g", body)
    assert request.member_epoch == 3
    assert type(request.member_epoch) is int
    assert request.offsets == {("t", 1): messages.CommitOffset(offset=12345678901234567)}
    assert type(next(iter(request.offsets))[1]) is int


@pytest.mark.parametrize(
    ("number", "complaint"),
    [
        (b"5.5", "must be an integer"),
        (b"1e-999999999", "must be an integer"),
        (b"1e-999999999999999999", "must be an integer"),
        (b"1e999999999", "must be between -2 and 2147483647"),  # refused before int()
        (b"2147483648", "must be between -2 and 2147483647"),
        (b"2147483648.0", "must be between -2 and 2147483647"),
        (b"true", "must be an integer"),
    ],
)
def test_numbers_outside_the_kafka_field_are_refused(number: bytes, complaint: str) -> None:
    body = wire.parse_json(b'{"memberId": "m", "memberEpoch": ' + number + b"}")
    with pytest.raises(errors.InvalidRequest, match=complaint):
        wire.decode_heartbeat("g", body, "")


def test_offsets_are_int64_and_partitions_int32() -> None:
    def commit(partition: int, offset: int) -> messages.OffsetCommitRequest:
        entry = {"topic": "t", "partition": partition, "offset": offset}
        return wire.decode_commit("g", {"memberId": "m", "memberEpoch": 1, "offsets": [entry]})

    assert commit(wire.INT32_MAX, wire.INT64_MAX).offsets[("t", wire.INT32_MAX)].offset == (
        wire.INT64_MAX
    )
    with pytest.raises(errors.InvalidRequest, match=r"'offsets\[0\].offset' must be between"):
        commit(0, wire.INT64_MAX + 1)
    with pytest.raises(errors.InvalidRequest, match=r"'offsets\[0\].partition' must be between"):
        commit(wire.INT32_MAX + 1, 0)


def test_a_rebalance_timeout_must_be_positive() -> None:
    """The coordinator refuses 0 (RebalanceTimeoutMs must be positive); so does the edge."""
    with pytest.raises(errors.InvalidRequest, match="'rebalanceTimeoutMs' must be between 1"):
        wire.decode_heartbeat("g", {**HEARTBEAT, "rebalanceTimeoutMs": 0}, "")
    assert (
        wire.decode_heartbeat("g", {**HEARTBEAT, "rebalanceTimeoutMs": 1}, "").rebalance_timeout_ms
        == 1
    )


@pytest.mark.parametrize(
    "query",
    [
        {"partition": ["t:²"]},  # int() takes superscript and other Unicode digits
        {"partition": ["t:٣"]},
        {"partition": ["t: 1"]},
        {"partition": ["t:+1"]},
        {"partition": ["t:1_0"]},
        {"partition": ["t:" + "9" * 5_000]},  # int() refuses over 4,300 digits: was a 500
        {"partition": ["t:2147483648"]},
        {"partition": ["t:00000000001"]},
        {"partition": ["t:-1"]},
        {"memberId": ["m"], "memberEpoch": ["²"]},
        {"memberId": ["m"], "memberEpoch": [" 4"]},
        {"memberId": ["m"], "memberEpoch": ["9" * 5_000]},
        {"memberId": ["m"], "memberEpoch": ["-2"]},
    ],
)
def test_query_numbers_are_ascii_digits_in_range(query: dict[str, list[str]]) -> None:
    with pytest.raises(errors.InvalidRequest):
        wire.decode_fetch("g", query)


def test_query_numbers_at_the_edges_of_int32() -> None:
    request = wire.decode_fetch(
        "g", {"partition": ["a:b:2147483647", "t:0"], "memberId": ["m"], "memberEpoch": ["-1"]}
    )
    assert request.partitions == (("a:b", wire.INT32_MAX), ("t", 0))
    assert request.member_epoch == -1
