"""The gateway's resource bounds, measured on ``kgo gateway`` as a process and on real clients:

- unfinished frames cost little: on the coordinator port a request is read whole only up to
  ``MAX_GATHERED_BYTES`` (larger ones close the connection at once); on a broker port a
  100 MB frame passes to the broker as its bytes come; and once the connections close, the
  process is back to its size before (RSS before, during and after);
- a large OffsetCommit from a real client still fits the coordinator port's bound;
- past ``--max-connections`` open connections on a port, more are closed as they come, and
  the open ones are served.

Before these bounds, four unfinished 100 MB frames grew the gateway by about 380 MB, and it
stayed that large after they closed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.metadata.v12.request import MetadataRequest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.wire import connection as kafka_connection
from kafka_group_operator.wire import framing
from tests.cli.conftest import ROOT
from tests.protocol.test_gateway_cli import CLEAN
from tests.protocol.test_gateway_upstream_trust import broker_port, replies_until_closed
from tests.support import processes, topics

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

MIB = 1024 * 1024
ALL_TOPICS = MetadataRequest(
    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@contextlib.asynccontextmanager
async def gateway_process(
    bootstrap: str, *extra: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """``kgo gateway`` (no coordinator listener: these frames never get that far)."""
    port = embedded.free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kafka_group_operator",
        "gateway",
        "--bootstrap",
        bootstrap,
        "--coordinator",
        f"127.0.0.1:{embedded.free_port()}",
        "--port",
        str(port),
        *extra,
        cwd=ROOT,
        env={**os.environ, **CLEAN},
        stderr=subprocess.DEVNULL,
    )
    try:
        await processes.until_accepting(port, process, "kgo gateway")
        yield process, port
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)


async def unfinished(
    port: int, api_key: int, size: int, sent: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sends a request frame of ``size`` bytes, ``sent`` of them, and no
    more (a request header of ``api_key``, then zeros)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(struct.pack(">ihhih", size, api_key, 4, 1, -1))
    chunk, left = bytes(MIB), sent - 10
    with contextlib.suppress(ConnectionError):
        while left > 0:
            writer.write(chunk[:left])
            left -= len(chunk)
            await writer.drain()
    return reader, writer


async def settled_rss(pid: int, at_most: float, within_s: float = 20) -> float:
    """The process's RSS once it is at most ``at_most`` MiB, or after ``within_s``."""
    deadline = time.monotonic() + within_s
    for _ in range(int(within_s / 0.2)):
        if (rss := rss_mib(pid)) <= at_most or time.monotonic() > deadline:
            return rss
        await asyncio.sleep(0.2)
    return rss_mib(pid)


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the gateway closes the connection (an end or a reset) within 10 s, sending
    nothing."""
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionError:
        return True


async def test_unfinished_frames_cost_the_gateway_little_and_nothing_once_closed() -> None:
    # A broker of its own: 400 MB of frames pass to it.
    with embedded.running_broker() as broker:
        async with gateway_process(broker.bootstrap) as (process, port):
            local = await broker_port(_Ports(port))  # the broker port opens
            for _ in range(3):  # warm: the code paths served once
                await broker_port(_Ports(port))
            before = rss_mib(process.pid)
            limit = protocol_gateway.MAX_GATHERED_BYTES
            # The coordinator port: a request larger than a group request may be is refused
            # before its bytes are read.
            for _ in range(4):
                reader, writer = await unfinished(port, 3, 100_000_000, 8 * MIB)
                assert await closed(reader)
                writer.close()
            # Within the bound and unfinished: held, each at most the bound.
            held = [await unfinished(port, 3, limit, limit - 1024) for _ in range(8)]
            # A broker port: 100 MB frames pass on to the broker as they come.
            held += [await unfinished(local, 1, 100_000_000, 99_000_000) for _ in range(4)]
            await asyncio.sleep(1.0)  # what is sent has arrived (it is on loopback)
            during = rss_mib(process.pid)
            assert all(not reader.at_eof() for reader, _ in held)
            for _, writer in held:
                writer.close()
            after = await settled_rss(process.pid, before + 4)
        # 8 MiB held on the coordinator port, plus the allocator's and the loop's slack.
        assert during - before < 8 * limit / MIB + 24, (before, during, after)
        assert after - before <= 4, (before, during, after)


class _Ports:
    """What ``broker_port`` reads of a gateway: its port and coordinator node id."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.config = protocol_gateway.GatewayConfig(bootstrap_servers=(), coordinator=("", 0))


async def test_a_large_offset_commit_from_a_real_client_fits(
    broker: embedded.EmbeddedBroker, open_listener: protocol_listener.Listener
) -> None:
    # 2,000 partitions with 400 bytes of metadata each: an OffsetCommit of about 850 KB,
    # what a consumer of many partitions (or Kafka Streams, which writes metadata) sends.
    partitions, metadata = 2_000, "m" * 400
    topic = topics.create_topic(broker.bootstrap, partitions)
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", open_listener.port),
            port=0,
        )
    )
    await served.start()
    group = f"big-commit-{uuid.uuid4().hex[:6]}"

    def commit_and_read_back() -> list[tuple[int, int, str | None]]:
        consumer = Consumer(
            {"bootstrap.servers": f"127.0.0.1:{served.port}", "group.id": group, "log_level": 0}
        )
        try:
            offsets = [
                TopicPartition(topic, p, p + 1, metadata=metadata) for p in range(partitions)
            ]
            consumer.commit(offsets=offsets, asynchronous=False)
            read = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 60)
            return [(tp.partition, tp.offset, tp.metadata) for tp in read]
        finally:
            consumer.close()

    try:
        committed = await asyncio.to_thread(commit_and_read_back)
    finally:
        await served.stop()
    assert committed == [(p, p + 1, metadata) for p in range(partitions)]


async def test_connections_past_the_limit_are_closed_and_the_others_served(
    broker: embedded.EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    limit = 4
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", embedded.free_port()),
            port=0,
            max_connections=limit,
        )
    )
    await served.start()
    caplog.set_level(logging.WARNING, logger=protocol_gateway.__name__)
    try:
        local = await broker_port(served)
        for port in (served.port, local):
            opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(limit)]
            try:
                extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1", port)
                assert await closed(extra_reader)  # at once
                extra_writer.close()
                for index, (reader, writer) in enumerate(opened):
                    writer.write(framing.encode_request(ALL_TOPICS, index))
                    assert len(await replies_until_closed(reader, 1)) == 1
                # One closes: a new one is served.
                opened.pop()[1].close()
                for _ in range(100):  # its end reaches the gateway
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(framing.encode_request(ALL_TOPICS, 1))
                    if await replies_until_closed(reader, 1, within_s=10):
                        opened.append((reader, writer))
                        break
                    writer.close()
                else:
                    raise AssertionError("no connection served after one closed")
            finally:
                for _, writer in opened:
                    writer.close()
    finally:
        await served.stop()
    for name in ("coordinator port", "port of broker"):
        assert any(
            name in r.getMessage() and f"{limit} are open" in r.getMessage() for r in caplog.records
        )
