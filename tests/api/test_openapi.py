"""The OpenAPI document: valid OpenAPI 3.1, and complete for the routes the app serves."""

from __future__ import annotations

import decimal
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from kafka_group_operator.api import app, openapi, wire
from kafka_group_operator.coordinator import errors


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi.document()
    validate(document)
    assert document["openapi"].startswith("3.1")


def test_every_route_is_documented() -> None:
    documented = {
        (method.upper(), path)
        for path, item in openapi.document()["paths"].items()
        for method in item
        if method != "parameters"
    }
    served = {
        (route.method, re.sub(r"\{(\w+)\}", r"{\1}", route.resource.canonical))
        for route in app.build_app(object(), None).router.routes()  # type: ignore[arg-type]
        if route.resource is not None and route.method != "HEAD"
    }
    assert served == documented


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = openapi.document()["components"]["schemas"][name]
    return schema


def _fetch_parameter(name: str) -> dict[str, Any]:
    operation = openapi.document()["paths"]["/v1/groups/{group}/offsets"]["get"]
    (parameter,) = [p for p in operation["parameters"] if p["name"] == name]
    return parameter  # type: ignore[no-any-return]


HEARTBEAT = {"memberId": "m", "memberEpoch": 0}
ENTRY = {"topic": "t", "partition": 0, "offset": 0}


def _heartbeat(field: str, value: object) -> object:
    return wire.decode_heartbeat("g", {**HEARTBEAT, field: value}, "")


def _commit(field: str, value: object) -> object:
    body = {"memberId": "", "memberEpoch": -1, "offsets": [ENTRY]}
    if field == "memberEpoch":
        return wire.decode_commit("g", {**body, field: value})
    return wire.decode_commit("g", {**body, "offsets": [{**ENTRY, field: value}]})


@pytest.mark.parametrize(
    ("decode", "schema", "field"),
    [
        (_heartbeat, _schema("HeartbeatRequest")["properties"], "memberEpoch"),
        (_heartbeat, _schema("HeartbeatRequest")["properties"], "rebalanceTimeoutMs"),
        (_commit, _schema("OffsetCommitRequest")["properties"], "memberEpoch"),
        *[
            (
                _commit,
                _schema("OffsetCommitRequest")["properties"]["offsets"]["items"]["properties"],
                f,
            )
            for f in ("partition", "offset", "leaderEpoch")
        ],
    ],
)
def test_documented_integer_ranges_are_the_decoders(
    decode: Any, schema: dict[str, Any], field: str
) -> None:
    """The document's minimum and maximum are exactly what the server accepts, written as an
    integer or as an integral number (JSON Schema's integer includes 5.0)."""
    minimum, maximum = schema[field]["minimum"], schema[field]["maximum"]
    for value in (minimum, maximum, decimal.Decimal(minimum), decimal.Decimal(f"{maximum}.0")):
        decode(field, value)
    for value in (minimum - 1, maximum + 1, decimal.Decimal(minimum) + decimal.Decimal("0.5")):
        with pytest.raises(errors.InvalidRequest, match=field):
            decode(field, value)


def test_the_partition_query_format_is_declared() -> None:
    pattern = _fetch_parameter("partition")["schema"]["items"]["pattern"]
    for text in ("t:0", "a:b:2147483647", "t:0000000001"):
        assert re.fullmatch(pattern, text)
        wire.decode_fetch("g", {"partition": [text]})
    for text in ("t", ":1", "t:", "t:²", "t:-1", "t:+1", "t: 1", "t:" + "9" * 11):
        assert not re.fullmatch(pattern, text)
        with pytest.raises(errors.InvalidRequest):
            wire.decode_fetch("g", {"partition": [text]})


@settings(max_examples=500, derandomize=True, deadline=None)
@given(
    text=st.from_regex(r"\A[^:]{1,20}:[0-9]{1,10}\Z")
    | st.integers(2_147_483_000, 9_999_999_999).map(lambda n: f"t:{n}")
)
def test_the_pattern_admits_exactly_the_partitions_the_server_decodes(text: str) -> None:
    pattern = _fetch_parameter("partition")["schema"]["items"]["pattern"]
    topic, _, number = text.rpartition(":")
    if int(number) <= wire.INT32_MAX:
        assert re.fullmatch(pattern, text)
        assert wire.decode_fetch("g", {"partition": [text]}).partitions == ((topic, int(number)),)
    else:
        assert not re.fullmatch(pattern, text)
        with pytest.raises(errors.InvalidRequest, match="between 0 and 2147483647"):
            wire.decode_fetch("g", {"partition": [text]})


def test_a_partition_committed_twice_counts_at_its_last_entry() -> None:
    # Kafka's OffsetMetadataManager.commitOffset writes a record per entry, replayed in order:
    # the last one stands. The Kafka listener takes it so; the HTTP API too, as documented.
    offsets = _schema("OffsetCommitRequest")["properties"]["offsets"]
    assert "last entry" in offsets["description"]
    twice = {
        "memberId": "",
        "memberEpoch": -1,
        "offsets": [ENTRY, {**ENTRY, "offset": 9}, {**ENTRY, "partition": 1}],
    }
    decoded = wire.decode_commit("g", twice)
    assert {tp: o.offset for tp, o in decoded.offsets.items()} == {("t", 0): 9, ("t", 1): 0}


def test_the_document_is_the_servers_security() -> None:
    """With tokens every group operation needs the bearer token; without, none does, and
    no 401 or 403 is promised."""
    with_tokens, without = openapi.document(True), openapi.document(False)
    assert with_tokens["security"] == [{"groupToken": []}]
    assert without["security"] == []
    assert "securitySchemes" not in without["components"]
    validate(without)
    for path, item in without["paths"].items():
        for method, operation in item.items():
            if method != "parameters":
                assert not {"401", "403"} & set(operation["responses"]), (method, path)
    assert {"401", "403"} <= set(with_tokens["paths"]["/v1/groups/{group}"]["get"]["responses"])


def test_the_rules_json_schema_can_state_are_in_the_schemas() -> None:
    heartbeat = _schema("HeartbeatRequest")
    # The assignors the coordinator offers.
    assert heartbeat["properties"]["serverAssignor"]["enum"] == [
        "cooperative-sticky", "range", "roundrobin", "sticky", "uniform", None,
    ]  # fmt: skip
    # Joining, a member owns nothing.
    assert heartbeat["if"]["properties"]["memberEpoch"] == {"const": 0}
    # memberId and memberEpoch of a fetch go together.
    member = _fetch_parameter("member")
    assert (member["style"], member["explode"]) == ("form", True)
    assert member["schema"]["dependentRequired"] == {
        "memberId": ["memberEpoch"],
        "memberEpoch": ["memberId"],
    }
    for alone in ({"memberId": ["m"]}, {"memberEpoch": ["1"]}):
        with pytest.raises(errors.InvalidRequest, match="go together"):
            wire.decode_fetch("g", alone)
