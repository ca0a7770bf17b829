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
                "offsets": [
                    {"topic": "t", "partition": 0, "offset": 1},
                    {"topic": "t", "partition": 0, "offset": 2},
                ],
            },
            "committed twice",
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
