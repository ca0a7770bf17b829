"""A steady heartbeat's answer is encoded from a template (``kip848.steady_answer``): the
bytes must be kio's own encoding of the same ConsumerGroupHeartbeatResponse, in every
version the listener serves, for any member id, epoch and interval."""

from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta

from kafka_group_operator.protocol import dispatch, kip848, routes
from kafka_group_operator.wire import framing

INT32 = st.integers(-(2**31), 2**31 - 1)
VERSIONS = range(routes.ROUTES[68].min_version, routes.ROUTES[68].max_version + 1)


@settings(max_examples=300, deadline=None)
@given(
    member_id=st.text(max_size=200),
    epoch=INT32,
    interval_ms=st.integers(0, 2**31 - 1),
    correlation_id=INT32,
    version=st.sampled_from(VERSIONS),
)
def test_the_template_is_kios_encoding(
    member_id: str, epoch: int, interval_ms: int, correlation_id: int, version: int
) -> None:
    schema = framing.response_type(68, version)
    body = schema(
        throttle_time=dispatch.NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        member_id=member_id,
        member_epoch=i32(epoch),
        heartbeat_interval=i32Timedelta.parse(datetime.timedelta(milliseconds=interval_ms)),
        assignment=None,
    )
    template = kip848.steady_answer(member_id, epoch, interval_ms)
    framed = framing.encode_response(68, version, correlation_id, template)
    assert framed == framing.encode_response(68, version, correlation_id, body)
    correlation, read = framing.read_response(framed[4:], schema)
    assert (correlation, read) == (correlation_id, body)
