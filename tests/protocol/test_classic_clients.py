"""Unmodified classic-protocol clients through the gateway, against the embedded broker and
the coordinator listener: kafka-python (classic), confluent-kafka classic with ``range``
(eager) and with ``cooperative-sticky``. Each joins, consumes every record from where the
group committed, and commits to the coordinator. A mixed group: a member of our library
(HTTP member API) and a classic consumer split one group's partitions."""

from __future__ import annotations

import asyncio
import datetime
import logging
import pathlib
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import test_utils
from confluent_kafka import Consumer
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import RebalanceInProgressError as KafkaRebalanceInProgressError
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.types import GroupId
from kio.static.primitive import i32Timedelta

from kafka_group_operator.api import app
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import GroupMember, MemberConfig
from kafka_group_operator.protocol import gateway as protocol_gateway
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import connection as kafka_connection
from tests.protocol.test_classic import subscription
from tests.protocol.test_kip848 import topic_id
from tests.protocol.wire import Connection
from tests.support import topics

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="package")]

PARTITIONS, PER_PARTITION = 3, 5
# How long a condition of the mixed-group test may take on a loaded machine.
WAIT_S = 60


@pytest.fixture(scope="module")
def classic_topic(broker: embedded.EmbeddedBroker) -> str:
    return topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION)


@pytest_asyncio.fixture(loop_scope="package", scope="module")
async def open_gateway(
    broker: embedded.EmbeddedBroker, open_listener: protocol_listener.Listener
) -> AsyncIterator[protocol_gateway.Gateway]:
    """A gateway in front of the listener without tokens: any group id joins."""
    served = protocol_gateway.Gateway(
        protocol_gateway.GatewayConfig(
            bootstrap_servers=kafka_connection.parse_servers(broker.bootstrap),
            coordinator=("127.0.0.1", open_listener.port),
            port=0,
        )
    )
    await served.start()
    yield served
    await served.stop()


def expected_records(committed: dict[int, int]) -> list[tuple[int, int, bytes]]:
    return sorted(
        (partition, offset, f"m{offset}".encode())
        for partition in range(PARTITIONS)
        for offset in range(committed.get(partition, 0), PER_PARTITION)
    )


class RejoinReasons(logging.Handler):
    """kafka-python's own account of each decision to join the group again: its coordinator
    logs the reason (``need_rejoin: True (...)``) at DEBUG, once per look while it holds."""

    LOGGER = "kafka.coordinator.consumer"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []
        self.reading = False  # set once the first record is read
        self.late: list[str] = []  # reasons given after that, each once

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("need_rejoin: True"):
            self.reasons.append(message)
            if self.reading and message not in self.late:
                self.late.append(message)


def consume_kafka_python(
    port: int, group: str, topic: str, expected: int
) -> tuple[list[tuple[int, int, bytes]], list[str]]:
    """Every record read (each once), and kafka-python's reasons for any rejoin after the
    first record was read."""
    rejoins = RejoinReasons()
    logger = logging.getLogger(RejoinReasons.LOGGER)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(rejoins)
    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}",
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=10_000,
        heartbeat_interval_ms=500,
    )
    records: dict[tuple[int, int], bytes] = {}
    everything = {TopicPartition(topic, partition) for partition in range(PARTITIONS)}

    def read(timeout_ms: int) -> None:
        for batch in consumer.poll(timeout_ms=timeout_ms).values():
            records.update(((m.partition, m.offset), m.value) for m in batch)
            rejoins.reading = True

    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, (
                f"read {len(records)} of {expected} records; kafka-python's rejoins: "
                f"{rejoins.reasons}"
            )
            read(200)
            at_end = consumer.assignment() == everything and all(
                consumer.position(partition) == PER_PARTITION for partition in everything
            )
            if len(records) < expected or not at_end:
                continue
            end = time.monotonic() + 1  # a second more, for anything that should not come
            while time.monotonic() < end:
                read(100)
            try:
                consumer.commit()
                break
            except KafkaRebalanceInProgressError:
                # kafka-python refuses a commit, before sending anything, while it is
                # joining the group again; its error says to poll, then commit again. An
                # eager (range) member reads again from the committed offsets after a
                # rejoin. Why it rejoined is asserted by the caller.
                continue
    finally:
        consumer.close()
        logger.removeHandler(rejoins)
        logger.setLevel(level)
    return sorted((p, o, v) for (p, o), v in records.items()), rejoins.late


def consume_confluent_classic(
    port: int, group: str, topic: str, expected: int, strategy: str
) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": group,
            "group.protocol": "classic",
            "partition.assignment.strategy": strategy,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    records: list[tuple[Any, ...]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records) < expected:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.partition(), message.offset(), message.value()))
        end = time.monotonic() + 1
        while time.monotonic() < end:
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                records.append((message.partition(), message.offset(), message.value()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return records


async def committed(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, topic: str
) -> dict[int, int]:
    fetched = await runtime.fetch_offsets(messages.OffsetFetchRequest(group))
    return {p: c.offset for (t, p), c in fetched.offsets.items() if t == topic}


@pytest.mark.parametrize(
    "client",
    ["kafka-python", "confluent-range", "confluent-cooperative-sticky"],
)
async def test_classic_client_joins_consumes_from_committed_and_commits(
    client: str,
    open_gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    classic_topic: str,
) -> None:
    await topic_id(runtime, classic_topic)
    group = f"classic-{client}-{uuid.uuid4().hex[:6]}"
    # Partition 1 resumes after its committed offset; the others start from the earliest.
    await runtime.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=group,
            member_id="",
            member_epoch=-1,
            offsets={(classic_topic, 1): messages.CommitOffset(3)},
        )
    )
    expected = expected_records({1: 3})
    if client == "kafka-python":
        records, late_rejoins = await asyncio.to_thread(
            consume_kafka_python, open_gateway.port, group, classic_topic, len(expected)
        )
        # A rejoin once reading had begun may only be the client's own decision (its view of
        # the topic's metadata changed), never the coordinator's: in a group of one member it
        # has no reason to start a rebalance, nor to fence or forget the member.
        assert all(
            "joined_subscription != subscription" in reason
            or "assignment_snapshot != metadata_snapshot" in reason
            for reason in late_rejoins
        ), late_rejoins
    else:
        strategy = client.removeprefix("confluent-")
        records = await asyncio.to_thread(
            consume_confluent_classic,
            open_gateway.port,
            group,
            classic_topic,
            len(expected),
            strategy,
        )
    assert sorted(records) == expected
    # The commit reached the coordinator, and the member left on close.
    assert await committed(runtime, group, classic_topic) == dict.fromkeys(
        range(PARTITIONS), PER_PARTITION
    )
    described = await runtime.describe_group(group)
    assert described.members == ()


class ClassicThread:
    """A confluent-kafka classic (cooperative-sticky) consumer polling in a thread."""

    def __init__(self, port: int, group: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": f"127.0.0.1:{port}",
                "group.id": group,
                "group.protocol": "classic",
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 300,
                "auto.offset.reset": "earliest",
                "auto.commit.interval.ms": 200,
                "log_level": 0,
            }
        )
        self.consumer.subscribe([topic])
        self.records: list[tuple[int, int]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                message = self.consumer.poll(0.1)
                if message is not None and message.error() is None:
                    self.records.append((message.partition() or 0, message.offset() or 0))
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)


async def test_mixed_group_library_member_and_classic_member(
    broker: embedded.EmbeddedBroker,
    open_gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    """A member of our library (HTTP member API) and a classic consumer (through the gateway)
    share one group: the partitions are split between them and each consumes its own."""
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=PER_PARTITION)
    await topic_id(runtime, topic)
    group = f"mixed-{uuid.uuid4().hex[:6]}"
    server = test_utils.TestServer(app.build_app(runtime, None))
    await server.start_server()
    library_records: list[tuple[int, int]] = []
    member = GroupMember(
        MemberConfig(
            group_id=group,
            coordinator_url=f"http://127.0.0.1:{server.port}",
            topics=(topic,),
            bootstrap_servers=broker.bootstrap,
            commit_interval_ms=200,
            lost_after_ms=5_000,
        )
    )
    library = threading.Thread(
        target=member.run,
        args=(lambda m: library_records.append((m.partition() or 0, m.offset() or 0)),),
        daemon=True,
    )
    library.start()
    classic: ClassicThread | None = None
    try:
        await wait_for(lambda: len(library_records) >= PARTITIONS * PER_PARTITION)
        classic = ClassicThread(open_gateway.port, group, topic)

        async def split() -> bool:
            described = await runtime.describe_group(group)
            return (
                described.state == "Stable"
                and len(described.members) == 2
                and all(m.assignment.get(topic) for m in described.members)
            )

        await wait_for_async(split)
        described = await runtime.describe_group(group)
        shares = {m.member_id: set(m.assignment[topic]) for m in described.members}
        assert set().union(*shares.values()) == set(range(PARTITIONS))
        assert sum(len(share) for share in shares.values()) == PARTITIONS
        classic_share = next(s for m, s in shares.items() if m != member.member_id)
        await wait_for(lambda: member.assignment and len(member.assignment) < PARTITIONS)

        # New records: each member consumes those of its own partitions.
        await asyncio.to_thread(
            topics.produce, broker.bootstrap, topic, range(PARTITIONS), 3, PER_PARTITION
        )
        fresh = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION, PER_PARTITION + 3)}
        await wait_for(
            lambda: fresh <= set(library_records) | set(classic.records if classic else ())
        )
        assert {p for p, o in classic.records if o >= PER_PARTITION} == classic_share
        assert {p for p, o in library_records if o >= PER_PARTITION} == (
            set(range(PARTITIONS)) - classic_share
        )
    finally:
        if classic is not None:
            await asyncio.to_thread(classic.stop)
        member.stop(permanent=True)
        await asyncio.to_thread(library.join, 30)
        await server.close()


async def wait_for(condition: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def wait_for_async(condition: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def shares_by_instance(described: messages.GroupDescription, topic: str) -> dict[str, set[int]]:
    return {
        member.instance_id or member.member_id: set(member.assignment.get(topic, ()))
        for member in described.members
    }


async def stable_with(
    runtime: coordinator_runtime.CoordinatorRuntime, group: str, topic: str, count: int
) -> messages.GroupDescription:
    """The group once ``count`` members share every partition, each holding some."""

    async def ready() -> bool:
        try:
            described = await runtime.describe_group(group)
        except errors.GroupIdNotFound:
            return False  # nobody joined yet
        held = [set(m.assignment.get(topic, ())) for m in described.members]
        return (
            described.state == "Stable"
            and len(held) == count
            and all(held)
            and set().union(*held) == set(range(PARTITIONS))
        )

    await wait_for_async(ready)
    return await runtime.describe_group(group)


# A kafka-python member in its own process, so that it can be killed like a pod.
STATIC_CONSUMER = """
import sys
from kafka import KafkaConsumer
port, group, topic, instance, session = sys.argv[1:]
consumer = KafkaConsumer(
    bootstrap_servers=f"127.0.0.1:{port}", group_id=group, group_instance_id=instance or None,
    session_timeout_ms=int(session), heartbeat_interval_ms=300, auto_offset_reset="earliest",
)
consumer.subscribe([topic])
while True:
    consumer.poll(timeout_ms=100)
"""


def static_consumer(
    port: int, group: str, topic: str, instance: str, session_timeout_ms: int = 10_000
) -> subprocess.Popen[bytes]:
    """A kafka-python consumer process; static unless ``instance`` is empty."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            STATIC_CONSUMER,
            str(port),
            group,
            topic,
            instance,
            str(session_timeout_ms),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# A confluent-kafka classic (cooperative-sticky) static member in its own process, so that
# it can be killed like a pod; it auto-commits what it consumes. Its connection events
# (librdkafka's "broker" debug context) go to stderr.
CONFLUENT_STATIC_CONSUMER = """
import sys
from confluent_kafka import Consumer
port, group, topic, instance = sys.argv[1:]
consumer = Consumer({
    "bootstrap.servers": f"127.0.0.1:{port}", "group.id": group,
    "group.instance.id": instance, "group.protocol": "classic",
    "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": 10000,
    "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest",
    "auto.commit.interval.ms": 200, "debug": "broker",
})
consumer.subscribe([topic])
while True:
    consumer.poll(0.1)
"""


def confluent_static_consumer(
    port: int, group: str, topic: str, instance: str, log: pathlib.Path
) -> subprocess.Popen[bytes]:
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", CONFLUENT_STATIC_CONSUMER, str(port), group, topic, instance],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


async def test_confluent_classic_static_member_joins_consumes_and_restarts_in_place(
    broker: embedded.EmbeddedBroker,
    open_gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
    tmp_path: pathlib.Path,
) -> None:
    """A confluent-kafka classic (cooperative-sticky) member with ``group.instance.id``
    joins through the gateway, consumes and commits every record; killed with SIGKILL and
    restarted within the session timeout, it gets the same partitions back without a
    rebalance (0 partitions move). Its coordinator connection is never closed under it:
    librdkafka drops that connection ("nodename change") when the coordinator's node is not
    in a Metadata reply, which it refreshes at each join, so joins looped."""
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=1)
    await topic_id(runtime, topic)
    group = f"confluent-static-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "consumer.log"
    processes = [confluent_static_consumer(open_gateway.port, group, topic, "pod-0", log)]
    try:
        before = await stable_with(runtime, group, topic, 1)
        assert shares_by_instance(before, topic) == {"pod-0": set(range(PARTITIONS))}
        everything = dict.fromkeys(range(PARTITIONS), 1)

        async def all_committed() -> bool:
            return await committed(runtime, group, topic) == everything

        await wait_for_async(all_committed)

        processes[0].kill()
        processes[0].wait(30)
        processes.append(confluent_static_consumer(open_gateway.port, group, topic, "pod-0", log))
        old_id = before.members[0].member_id

        async def replaced() -> bool:
            described = await runtime.describe_group(group)
            ids = {m.instance_id: m.member_id for m in described.members}
            return ids.get("pod-0") not in (None, old_id)

        await wait_for_async(replaced)
        after = await stable_with(runtime, group, topic, 1)
        assert shares_by_instance(after, topic) == {"pod-0": set(range(PARTITIONS))}
        assert after.group_epoch == before.group_epoch
    finally:
        for process in processes:
            process.kill()
            process.wait(30)
    assert coordinator_connections_closed(log.read_text(errors="replace")) == []


def coordinator_connections_closed(log: str) -> list[str]:
    """The states named by librdkafka's lines closing a coordinator connection for a
    "nodename change", but ``TRY_CONNECT``. When a consumer first finds its coordinator, its logical
    coordinator broker may already be in ``TRY_CONNECT`` with no address ("postponing
    connect"), and taking the address is then logged as a close "after 0ms in state
    TRY_CONNECT", with no connection to close (a race within librdkafka, in some runs).
    A connection that was open (``CONNECT``, ``UP`` and the states between) is
    the looping drop this test guards against."""
    closes = re.findall(
        r"Closing connection due to nodename change \(after \d+ms in state (\w+)\)", log
    )
    return [state for state in closes if state != "TRY_CONNECT"]


async def test_a_member_that_joins_but_never_syncs_is_removed_after_its_rebalance_timeout(
    broker: embedded.EmbeddedBroker,
    open_listener: protocol_listener.Listener,
    open_gateway: protocol_gateway.Gateway,
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    """Kafka's sync timeout: a classic member that joins (and so holds every partition) but
    never sends SyncGroup nor a heartbeat is removed after its rebalance timeout (2 s), long
    before its session timeout (120 s, beyond what this test waits); a kafka-python member
    then gets every partition."""
    topic = topics.create_topic(broker.bootstrap, PARTITIONS, messages_per_partition=1)
    await topic_id(runtime, topic)
    group = f"silent-{uuid.uuid4().hex[:6]}"
    # A resource asking for server-side assignment: a consumer group's sync timeout.
    await runtime.configure_group(messages.GroupSettings(group, topics=(topic,)))
    connection = await Connection.open(open_listener.port)
    processes: list[subprocess.Popen[bytes]] = []
    try:

        def join(member_id: str) -> JoinGroupRequest:
            return JoinGroupRequest(
                group_id=GroupId(group),
                session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=120)),
                rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=2)),
                member_id=member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=(JoinGroupRequestProtocol(name="range", metadata=subscription(topic)),),
            )

        required = await connection.call(join(""))
        assert required.error_code == ErrorCode.member_id_required
        joined = await connection.call(join(required.member_id))
        assert joined.error_code == ErrorCode.none
        silent = (await runtime.describe_group(group)).members
        assert [(m.member_id, set(m.assignment[topic])) for m in silent] == [
            (joined.member_id, set(range(PARTITIONS)))
        ]

        processes.append(static_consumer(open_gateway.port, group, topic, ""))

        async def taken_over() -> bool:
            members = (await runtime.describe_group(group)).members
            return [m.member_id for m in members] != [joined.member_id] and len(members) == 1

        await wait_for_async(taken_over)
        after = await stable_with(runtime, group, topic, 1)
        (survivor,) = after.members
        assert survivor.member_id != joined.member_id
        assert set(survivor.assignment[topic]) == set(range(PARTITIONS))
        # The silent member's id is gone for good: its heartbeat is refused.
        refused = await connection.call(
            HeartbeatRequest(
                group_id=GroupId(group),
                generation_id=joined.generation_id,
                member_id=joined.member_id,
                group_instance_id=None,
            )
        )
        assert refused.error_code == ErrorCode.unknown_member_id
    finally:
        await connection.close()
        for process in processes:
            process.kill()
            process.wait(30)
