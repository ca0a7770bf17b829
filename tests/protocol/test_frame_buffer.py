"""``framing.FrameBuffer``, the listener's framing of bytes as they arrive, against
``framing.read_frame`` (the stream reader clients use) as the reference: the same frames
out of any split of the same bytes, the same refusals, the same words for a stream cut short.
"""

from __future__ import annotations

import asyncio
import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_group_operator.wire import framing

LIMIT = 256 * 1024
# Mostly small frames, now and then one above the 64 KiB from which frames are filled into
# a memory mapping as they arrive.
PAYLOADS = st.lists(
    st.one_of(
        st.binary(max_size=300),
        st.integers(64 * 1024 - 8, 200 * 1024).map(lambda n: bytes(range(256)) * (n // 256)),
    ),
    max_size=8,
)


def frames_of(payloads: list[bytes]) -> bytes:
    return b"".join(framing.frame(payload) for payload in payloads)


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


async def read_all(stream: bytes, max_bytes: int) -> tuple[list[bytes], str | None]:
    """What ``read_frame`` reads from ``stream`` then its end: the payloads, and the error
    that ended it (``None``: a clean end between frames)."""
    reader = asyncio.StreamReader(limit=1 << 30)
    reader.feed_data(stream)
    reader.feed_eof()
    read: list[bytes] = []
    try:
        while (payload := await framing.read_frame(reader, max_bytes)) is not None:
            read.append(payload)
    except framing.FrameError as error:
        return read, str(error)
    return read, None


def take_all(buffer: framing.FrameBuffer, max_bytes: int) -> list[bytes]:
    taken = []
    while (payload := buffer.take(max_bytes)) is not None:
        taken.append(payload)
    return taken


@settings(max_examples=150, deadline=None)
@given(payloads=PAYLOADS, cuts=st.lists(st.integers(0, 1 << 20), max_size=12), end=st.data())
def test_any_split_gives_the_frames_read_frame_reads(
    payloads: list[bytes], cuts: list[int], end: st.DataObject
) -> None:
    stream = frames_of(payloads)
    # The stream may end anywhere: cut short inside a frame, as a client gone mid-request.
    stream = stream[: end.draw(st.integers(0, len(stream)), label="end")]
    expected, error = asyncio.run(read_all(stream, LIMIT))
    buffer = framing.FrameBuffer()
    taken: list[bytes] = []
    for chunk in split(stream, cuts):
        buffer.feed(chunk)
        taken += take_all(buffer, LIMIT)
        # What is held outside a large frame's mapping: part of one small frame at most.
        assert buffer.buffered() < 64 * 1024 + 4
    assert taken == expected
    assert buffer.cut_short() == error
    buffer.close()
    assert buffer.take(LIMIT) is None


def test_a_size_over_the_limit_is_refused_before_its_payload_arrives() -> None:
    buffer = framing.FrameBuffer()
    buffer.feed(framing.frame(b"small"))
    buffer.feed(struct.pack(">i", 1000)[:3])
    assert buffer.take(999) == b"small"
    assert buffer.take(999) is None  # the size is not whole yet
    buffer.feed(struct.pack(">i", 1000)[3:])
    with pytest.raises(framing.FrameTooLarge, match="frame of 1000 bytes"):
        buffer.take(999)
    negative = framing.FrameBuffer()
    negative.feed(struct.pack(">i", -2))
    with pytest.raises(framing.FrameTooLarge, match="frame of -2 bytes"):
        negative.take(999)


def test_a_large_frame_is_filled_into_its_mapping_as_it_arrives() -> None:
    """Its bytes are not kept in the buffer, and a frame after it is read as usual."""
    payload = bytes(range(256)) * 1024  # 256 KiB
    stream = framing.frame(payload) + framing.frame(b"next")
    buffer = framing.FrameBuffer()
    taken: list[bytes] = []
    for start in range(0, len(stream), 1000):
        buffer.feed(stream[start : start + 1000])
        assert buffer.buffered() <= 1000
        taken += take_all(buffer, len(payload))
    assert taken == [payload, b"next"]
    assert buffer.cut_short() is None
