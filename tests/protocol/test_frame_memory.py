"""Memory a ``kgo coordinator`` process gives back after clients leave large frames unfinished.

48 connections each send 8 MB frames' first bytes and stop. Without tokens, the listener
holds what arrived (the frames are within its limit) and gives it all back when the
connections close, round after round: when the stream's own heap buffer held such frames, the
second round kept 67 to 260 MB after the connections were gone (the allocator keeps a freed
block of a size it has seen freed before). Unauthenticated, the frames are refused on their
size (512 KiB before authentication) and nothing is held.

The frames are sent whole but for their last 64 KiB, one connection after the other.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable

import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.wire import framing
from tests.protocol import served
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

CONNECTIONS = 48
FRAME = framing.DEFAULT_MAX_FRAME_BYTES  # 8 MiB: the most the listener takes
SENT = FRAME - 64 * 1024  # all but the last 64 KiB
MB = 1024 * 1024
# Generous but meaningful: the allocator's slack may stay, not the frames (48 x 8 MB): with
# the stream's heap buffer, 67-260 MB stayed.
KEPT_BOUND_MB = 32
# While the frames are unfinished the listener holds what arrived: most of 48 x 8 MB.
HELD_MB = CONNECTIONS * SENT / MB * 0.75


async def rss_until(
    process: served.Served, done: Callable[[float], bool], what: str, bound_s: float = 60
) -> float:
    deadline = time.monotonic() + bound_s
    while True:
        rss = process.rss_mb()
        if done(rss):
            return rss
        assert time.monotonic() < deadline, f"{what}: RSS {rss:.0f} MB"
        await asyncio.sleep(0.25)


async def settled(process: served.Served) -> float:
    """The RSS once two readings a second apart differ by less than 2 MB."""
    previous = process.rss_mb()
    for _ in range(30):
        await asyncio.sleep(1)
        current = process.rss_mb()
        if abs(current - previous) < 2:
            return current
        previous = current
    return previous


async def unfinished_frames(connections: list[Connection]) -> None:
    # An ApiVersions v3 header, then filler: the frame is never completed.
    head = struct.pack(">ihhih", FRAME, 18, 3, 1, -1)
    filler = b"\0" * (SENT - len(head) + 4)
    for connection in connections:
        connection.writer.write(head + filler)
        await connection.writer.drain()


async def test_unfinished_large_frames_are_given_back(
    broker: embedded.EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """On a listener without tokens (every connection may send 8 MB frames), as reported."""
    directory = tmp_path_factory.mktemp("memory")
    process = await served.coordinator(broker.bootstrap, directory, tokens=False)
    try:
        before = await settled(process)
        figures = [f"before {before:.0f} MB"]
        for round_ in (1, 2):
            connections = [await Connection.open(process.port) for _ in range(CONNECTIONS)]
            await unfinished_frames(connections)
            during = await rss_until(process, lambda rss: rss > before + HELD_MB, "frames held")
            for connection in connections:
                await connection.close()
            after = await rss_until(
                process, lambda rss: rss < before + KEPT_BOUND_MB, f"round {round_} given back"
            )
            after = min(after, await settled(process))
            figures.append(f"round {round_}: during {during:.0f} MB, after {after:.0f} MB")
        print("; ".join(figures))
        assert process.alive()
    finally:
        process.stop()


async def test_unauthenticated_large_frames_are_refused_on_their_size(
    broker: embedded.EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> None:
    process = await served.coordinator(broker.bootstrap, tmp_path_factory.mktemp("memory"))
    try:
        before = await settled(process)
        connections = [await Connection.open(process.port) for _ in range(CONNECTIONS)]
        try:
            for connection in connections:
                connection.writer.write(struct.pack(">ihhih", FRAME, 18, 3, 1, -1))
                connection.writer.write(b"\0" * MB)
            for connection in connections:
                assert await connection.closed_by_peer()
        finally:
            for connection in connections:
                await connection.close()
        after = await settled(process)
        print(f"unauthenticated: before {before:.0f} MB, after {after:.0f} MB")
        assert after < before + 32
        assert process.alive()
    finally:
        process.stop()
