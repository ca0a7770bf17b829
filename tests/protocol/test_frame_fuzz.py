"""The fuzzer: random and mutated frames of every API version the listener routes, sent
authenticated to a real ``kgo coordinator`` and through a real ``kgo gateway``, at least
20,000 of them per run; the processes stay up and two canary groups keep committing.

Frames come from hypothesis: kio entities of each routed request schema (naming the fuzzing
group half the time, so that requests get past authorization), encoded, then mutated (bytes
flipped, huge lengths and counts spliced in, cut short, extended), and frames with random
headers and bodies. Each hypothesis example is a batch of frames, sent over several
connections at once: every frame is answered (with its own correlation id) or closes its
connection, which is then opened again; a frame left unanswered a while (a JoinGroup waiting
for its rebalance) is given up with its connection.

Through the gateway only the group APIs are sent (the rest goes to the embedded broker, which
is not under test), never as the gateway's own group (whose canary commits there), and
FindCoordinator only as v0 or v4+ with its key type kept 0 (v1-v3 and other key types go to
the broker too).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import routes
from kafka_group_operator.wire import framing
from tests.protocol import frames, served
from tests.protocol.wire import Connection

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

# Per run: examples x frames per example x targets >= 20,000 cases.
EXAMPLES = 220
FRAMES_PER_EXAMPLE = 60
WORKERS = 8  # connections per target
# A frame neither answered nor refused within this long is given up with its connection.
PATIENCE_S = 3.0

ROUTED = frames.routed_requests()
# Not through the gateway: FindCoordinator v1-v3 (a mutated key type would go to the broker).
GATEWAY_SCHEMAS = [
    schema
    for schema in ROUTED
    if schema.__api_key__ in protocol_gateway.GROUP_APIS
    and not (schema.__api_key__ == 10 and 1 <= schema.__version__ <= 3)
]
OTHER_KEYS = (0, 1, 2, 11, 12, 19, 32, 50, 999, -1)
# Where a body starts in ``frames.request_frame``: size, header v2 with client id "fuzz".
_BODY = 4 + 10 + len("fuzz") + 1


@st.composite
def mutated_frame(draw: st.DrawFn, schemas: list[type[Any]], group: str) -> tuple[bytes, bool]:
    """A request frame and whether it may go through the gateway."""
    schema = draw(st.sampled_from(schemas))
    body = frames.encode(draw(frames.entities(schema, group)))
    if draw(st.booleans()):
        body = draw(frames.mutated(body))
    frame = bytearray(frames.request_frame(schema, body, draw(st.integers(0, 2**31 - 1))))
    if schema.__api_key__ == 10 and schema.__version__ >= 4 and len(frame) > _BODY:
        frame[_BODY] = 0  # the key type
    return bytes(frame), schema in GATEWAY_SCHEMAS


@st.composite
def random_frame(draw: st.DrawFn) -> tuple[bytes, bool]:
    key = draw(st.sampled_from([*routes.ROUTES, *OTHER_KEYS]))
    version = draw(st.integers(-1, 20))
    correlation = draw(st.integers(-(2**31), 2**31 - 1))
    header = struct.pack(">hhi", key, version, correlation)
    header += draw(st.sampled_from([b"\xff\xff", b"\x00\x04fuzz", b""]))
    body = draw(st.binary(max_size=120))
    through_gateway = key in protocol_gateway.GROUP_APIS and key != 10
    return framing.frame(header + body), through_gateway


def cases(group: str) -> st.SearchStrategy[list[tuple[bytes, bool]]]:
    one = st.one_of(
        mutated_frame(ROUTED, group), mutated_frame(GATEWAY_SCHEMAS, group), random_frame()
    )
    return st.lists(one, min_size=FRAMES_PER_EXAMPLE, max_size=FRAMES_PER_EXAMPLE)


@dataclass
class Target:
    """Connections to one process: authenticated as ``group`` when ``token`` is given."""

    port: int
    group: str | None
    token: str | None
    sent: int = 0
    answered: int = 0
    closed: int = 0
    given_up: int = 0
    _idle: asyncio.Queue[Connection | None] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        for _ in range(WORKERS):
            self._idle.put_nowait(None)

    async def _connection(self) -> Connection:
        held = await self._idle.get()
        if held is not None:
            return held
        try:
            if self.token is None:
                return await Connection.open(self.port)
            assert self.group is not None
            return await served.authenticated(self.port, self.group, self.token)
        except BaseException:
            self._idle.put_nowait(None)
            raise

    async def send(self, frame: bytes) -> None:
        connection = await self._connection()
        keep: Connection | None = None
        try:
            await connection.send_raw(frame)
            self.sent += 1
            try:
                reply = await asyncio.wait_for(
                    framing.read_frame(connection.reader, 1 << 26), PATIENCE_S
                )
            except TimeoutError:
                self.given_up += 1
                return
            except (ConnectionError, framing.FrameError):
                reply = None
            if reply is None:
                self.closed += 1
                return
            # An answer is to this request: its correlation id comes first.
            assert reply[:4] == frame[8:12], "a reply to another request"
            self.answered += 1
            keep = connection
        finally:
            if keep is None:
                await connection.close()
            self._idle.put_nowait(keep)

    async def close(self) -> None:
        while not self._idle.empty():
            held = self._idle.get_nowait()
            if held is not None:
                await held.close()


@dataclass
class Fuzzing:
    stack: served.Stack
    listener: Target
    gateway: Target

    @property
    def cases(self) -> int:
        return self.listener.sent + self.gateway.sent


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def fuzzing(hostile_stack: served.Stack) -> AsyncIterator[Fuzzing]:
    listener = Target(hostile_stack.coordinator.port, served.FUZZ, served.FUZZ_TOKEN)
    gateway = Target(hostile_stack.gateway.port, None, None)
    try:
        yield Fuzzing(hostile_stack, listener, gateway)
    finally:
        await listener.close()
        await gateway.close()


def generate() -> list[tuple[bytes, bool]]:
    """Hypothesis' batches of frames (generated up front, then sent all at once)."""
    batches: list[list[tuple[bytes, bool]]] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=cases(served.FUZZ))
    def collect(batch: list[tuple[bytes, bool]]) -> None:
        batches.append(batch)

    collect()
    return [case for batch in batches for case in batch]


async def test_fuzzed_frames_leave_the_processes_serving(fuzzing: Fuzzing) -> None:
    generated = generate()
    listener, gateway = fuzzing.listener, fuzzing.gateway
    processes = (fuzzing.stack.coordinator, fuzzing.stack.gateway)
    for start in range(0, len(generated), 4 * WORKERS):
        part = generated[start : start + 4 * WORKERS]
        jobs = [listener.send(frame) for frame, _ in part]
        jobs += [gateway.send(frame) for frame, through in part if through]
        await asyncio.gather(*jobs)
        for process in processes:
            assert process.alive(), (
                [frame.hex() for frame, _ in part],
                process.log_text()[-3000:],
            )
    print(
        f"fuzz cases: {fuzzing.cases} (listener {listener.sent}: {listener.answered} answered, "
        f"{listener.closed} closed, {listener.given_up} given up; gateway {gateway.sent}: "
        f"{gateway.answered} answered, {gateway.closed} closed, {gateway.given_up} given up)"
    )
    assert fuzzing.cases >= 20_000
    await fuzzing.stack.still_serving()
