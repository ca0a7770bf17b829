"""The bounds check in front of kio's reader: no length or count passes that does not fit the
frame, and no frame kio writes itself is refused.

kio's native reader reserves memory for every element an array declares, so a frame that
declares 2^32-2 aborts the process that reads it: such frames are only ever given to kio in
a separate process (``test_hostile_frames_are_refused_by_the_framing``); in this process
kio only reads frames the check passed.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.list_groups.v5.request import ListGroupsRequest
from kio.schema.offset_commit.v2.request import OffsetCommitRequest
from kio.serial import entity_reader
from kio.serial.errors import BufferUnderflow, NegativeByteLength

from kafka_group_operator.protocol import dispatch
from kafka_group_operator.wire import bounds, framing
from tests.cli.conftest import ROOT
from tests.protocol import frames

SCHEMAS = frames.all_schemas()
# kio's errors that mean a length or count did not fit (what the check must catch first).
LENGTH_ERRORS = (BufferUnderflow, NegativeByteLength, MemoryError)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: f"{s.__module__[11:]}")
@settings(
    max_examples=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_kio_encodings_pass_and_mutations_never_pass_a_length_kio_trips_on(
    schema: type[Any], data: st.DataObject
) -> None:
    encoded = frames.encode(data.draw(frames.entities(schema), label="entity"))
    # Whatever kio writes passes, and ends where kio's reader ends.
    assert bounds.check(schema, encoded) == len(encoded)
    _, size = entity_reader(schema)(encoded, 0)
    assert size == len(encoded)
    # Mutated: refused, or read by kio without a length error and to the same end.
    mutated = data.draw(frames.mutated(encoded), label="mutated")
    try:
        end = bounds.check(schema, mutated)
    except bounds.BoundsError:
        return
    try:
        _, size = entity_reader(schema)(mutated, 0)
    except LENGTH_ERRORS as error:
        pytest.fail(f"the check passed a frame kio reads past: {error!r}")
    except Exception:
        return  # refused by kio for its value (a bad UTF-8 string, an unknown tag, ...)
    assert size == end


def test_the_17_byte_list_groups_frame_is_refused_naming_its_field() -> None:
    body = frames.HUGE_COMPACT  # states_filter declares 2^32-2 elements
    with pytest.raises(bounds.BoundsError) as refused:
        bounds.check(ListGroupsRequest, body)
    assert str(refused.value) == (
        "ListGroupsRequest.states_filter: 4294967294 elements declared, 0 bytes left"
    )
    assert len(frames.request_frame(ListGroupsRequest, body)) == 24


@pytest.mark.parametrize(
    ("schema", "body", "message"),
    [
        # An array count above bytes left / the element's fewest bytes (a compact string:
        # 1 byte), here 3 strings declared in 2 bytes.
        (DescribeGroupsRequest, b"\x04\x01\x01", "3 elements declared, 2 bytes left"),
        # A string length beyond the frame.
        (DescribeGroupsRequest, b"\x02\x10abc\x00\x00", "15 bytes declared, 5 bytes left"),
        # Null where the schema has none (a group id).
        (DescribeGroupsRequest, b"\x02\x00\x00\x00", "null where the schema has no null"),
        # A null array where the schema has none: DescribeGroups v5's groups (compact: 0),
        # OffsetCommit v2's topics (int32: -1), as Kafka's generated readers refuse them.
        (DescribeGroupsRequest, b"\x00\x00\x00", "groups: null where the schema has no null"),
        (
            OffsetCommitRequest,
            b"\x00\x00" + b"\0" * 14 + b"\xff\xff\xff\xff",
            "topics: null where the schema has no null",
        ),
        # A varint of 6 bytes.
        (DescribeGroupsRequest, b"\xff\xff\xff\xff\xff\x01", "a varint of more than 5 bytes"),
        # Non-flexible: an int32 array count of -2, an int16 string length of -3.
        (OffsetCommitRequest, b"\xff\xfd", "length -3"),
        (OffsetCommitRequest, b"\x00\x00" + b"\0" * 14 + b"\xff\xff\xff\xfe", "length -2"),
        # 2 topics of at least 6 bytes each (name, partitions) in 6 bytes.
        (OffsetCommitRequest, b"\x00\x00" + b"\0" * 14 + b"\0\0\0\x02" + b"\0" * 6, "2 elements"),
        # A fixed-width field cut short.
        (OffsetCommitRequest, b"\x00\x00\x00", "the frame ends inside a field"),
    ],
)
def test_lengths_and_counts_that_do_not_fit_are_refused(
    schema: type[Any], body: bytes, message: str
) -> None:
    with pytest.raises(bounds.BoundsError, match=message):
        bounds.check(schema, body)


# ConsumerGroupHeartbeat v0's shortest body with a tagged-fields section of its own.
HEARTBEAT_PREFIX = b"\x02g\x02m" + b"\0" * 4 + b"\0\0" + b"\0" * 4 + b"\0\0\0"


def test_tagged_fields_are_checked_against_their_declared_size() -> None:
    schema = ConsumerGroupHeartbeatRequest
    # An unknown tag with its 2 bytes: skipped, as Kafka skips it.
    assert bounds.check(schema, HEARTBEAT_PREFIX + b"\x01\x63\x02ab") == len(HEARTBEAT_PREFIX) + 5
    # An unknown tag declaring more bytes than left.
    with pytest.raises(bounds.BoundsError, match="100 bytes declared, 2 bytes left"):
        bounds.check(schema, HEARTBEAT_PREFIX + b"\x01\x63\x64ab")
    # More tags than bytes could hold.
    with pytest.raises(bounds.BoundsError, match="tagged fields: 200 elements declared"):
        bounds.check(schema, HEARTBEAT_PREFIX + b"\xc8\x01\x63\x00")


def test_a_known_tagged_field_must_take_exactly_its_declared_size() -> None:
    # Fetch v12's cluster_id is a tagged compact string (tag 0).
    from kio.schema.fetch.v12.request import FetchRequest

    lay = bounds.layout.layout(FetchRequest)
    assert 0 in lay.tags  # cluster_id: a compact string tag
    body = frames.minimal_body(lay)[:-1]  # without its empty tagged section
    exact = body + b"\x01\x00\x04\x04abc"  # tag 0, 4 bytes: the string "abc"
    assert bounds.check(FetchRequest, exact) == len(exact)
    long = body + b"\x01\x00\x05\x04abcd"  # declares 5 bytes, the value takes 4
    with pytest.raises(bounds.BoundsError, match="field 0 declares 5 bytes, its value takes 4"):
        bounds.check(FetchRequest, long)
    short = body + b"\x01\x00\x03\x04abc"  # declares 3 bytes: the string runs past them
    with pytest.raises(bounds.BoundsError, match="cluster_id: 3 bytes declared, 2 bytes left"):
        bounds.check(FetchRequest, short)
    huge = body + b"\x01\x00\x06" + frames.HUGE_COMPACT + b"\0"  # a huge string in the tag
    with pytest.raises(bounds.BoundsError, match="cluster_id: 4294967294 bytes declared"):
        bounds.check(FetchRequest, huge)


def test_caps_bound_named_top_level_arrays() -> None:
    body = b"\x04\x02a\x02b\x02c\x00\x00"  # DescribeGroups v5: groups a, b, c
    assert bounds.check(DescribeGroupsRequest, body, caps={"groups": 3}) == len(body)
    with pytest.raises(bounds.BoundsError, match="groups: 3 elements, the limit is 2"):
        bounds.check(DescribeGroupsRequest, body, caps={"groups": 2})


def test_the_header_tagged_section_is_bounded() -> None:
    header = struct.pack(">hhih", 16, 5, 1, -1)
    with pytest.raises(framing.FrameError, match="tagged fields declared"):
        framing.read_request(header + frames.HUGE_COMPACT)


def test_responses_with_trailing_bytes_are_refused() -> None:
    from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse

    payload = frames.response_payload(
        FindCoordinatorResponse,
        frames.minimal_body(bounds.layout.layout(FindCoordinatorResponse)),
    )
    assert framing.read_response(payload, FindCoordinatorResponse)[0] == 7
    with pytest.raises(framing.FrameError, match="1 bytes after the response"):
        framing.read_response(payload + b"\0", FindCoordinatorResponse)


REFUSE_ALL = """
import sys
from kafka_group_operator.wire import framing
from tests.protocol import frames

refused = 0
for schema in frames.routed_requests() + [
    s for key in frames.GATEWAY_REQUESTS for s in frames.versions_of(key, "request")
]:
    for where, body in frames.hostile_bodies(schema):
        try:
            framing.read_request(frames.request_frame(schema, body)[4:])
        except framing.FrameError:
            refused += 1
        else:
            sys.exit(f"{where} passed")
for key in frames.GATEWAY_REPLIES:
    for schema in frames.versions_of(key, "response"):
        for where, body in frames.hostile_bodies(schema):
            try:
                framing.read_response(frames.response_payload(schema, body), schema)
            except framing.FrameError:
                refused += 1
            else:
                sys.exit(f"{where} passed")
print(refused)
"""


def test_hostile_frames_are_refused_by_the_framing() -> None:
    """Every API version the listener routes, FindCoordinator requests and the replies the
    gateway rewrites: each array and length at every depth declaring 2^32-2 (2^31-1 when not
    flexible). In a process of its own: without the check, kio aborts it."""
    run = subprocess.run(
        [sys.executable, "-c", REFUSE_ALL], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert int(run.stdout) > 500


@pytest.mark.parametrize("version", [0, 4, 5])
def test_a_response_encoded_in_parts_is_the_response_encoded_whole(version: int) -> None:
    """DescribeGroups v0 (no throttle time), v4 (not flexible), v5 (flexible)."""
    schema = framing.response_type(15, version)
    module = sys.modules[schema.__module__]
    described = [
        dispatch.build(
            module.DescribedGroup,
            {
                "error_code": ErrorCode.none,
                "group_id": f"g{i}",
                "group_state": "Dead",
                "protocol_type": "",
                "protocol_data": "",
                "members": (),
                "authorized_operations": -(2**31),
            },
        )
        for i in range(250)
    ]
    whole = dispatch.build(
        schema, {"throttle_time": dispatch.NO_THROTTLE, "groups": tuple(described)}
    )
    parts = [framing.encode_entities(described[i : i + 100]) for i in range(0, 250, 100)]
    last = dispatch.build(
        schema, {"throttle_time": dispatch.NO_THROTTLE, "groups": tuple(described[200:])}
    )
    assert framing.encode_response_around(15, version, 9, last, "groups", parts, 250) == (
        framing.encode_response(15, version, 9, whole)
    )
