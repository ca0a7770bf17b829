"""The offset mirror's commits share one connection per broker, whatever the number of groups,
and a broker that misbehaves fails a commit with its reason, never the mirror.

On the real broker: many groups mirrored at once open one connection and no thread, and each
group's offsets read back with librdkafka's admin client, as ``kafka-consumer-groups.sh``
would show them. Against hostile servers on
loopback (one that closes at once, one that answers garbage, one that never answers): the
commit fails with a reason within its timeout, and the committer serves the next commit.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Awaitable, Callable

import pytest

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.runtime import coordinator_runtime, mirror
from kafka_group_operator.wire import connection, offset_commits
from tests.runtime import logs
from tests.runtime.test_mirror import _commit, _config, _create_topic
from tests.support import groups, native_groups

GROUPS = 60


@pytest.mark.broker
async def test_many_groups_share_one_connection_and_start_no_thread(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = _create_topic(broker.bootstrap, 2)
    names = [f"{logs.unique_topic('shared')}-{i}" for i in range(GROUPS)]
    async with groups.running(_config(broker.bootstrap)) as runtime:
        threads_before = threading.active_count()
        for name in names:
            runtime.mirror.configure(name, mirror.MirrorTarget(broker.bootstrap, {}, 0.5))
        # Each group caught up after its own commit: on a broker whose transactions take tens
        # of milliseconds the first groups are mirrored before the last are committed.
        committed_at: dict[str, float] = {}
        for index, name in enumerate(names):
            await _commit(runtime, name, {(topic, 0): index + 1, (topic, 1): 2 * index + 1})
            committed_at[name] = time.time()
        await _all_caught_up_since(runtime, committed_at)
        # Every group's commit went over the same connection: the broker is its own coordinator.
        committers = list(runtime.mirror._committers.values())
        assert len(committers) == 1
        assert committers[0].connections == 1
        assert threading.active_count() <= threads_before
    # What the brokers hold, as kafka-consumer-groups.sh would show it.
    for index in (0, GROUPS // 2, GROUPS - 1):
        await native_groups.wait_for_offsets(
            broker.bootstrap, names[index], {(topic, 0): index + 1, (topic, 1): 2 * index + 1}
        )


async def _all_caught_up_since(
    runtime: coordinator_runtime.CoordinatorRuntime, since: dict[str, float]
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        statuses = [(runtime.mirror.status(name), at) for name, at in since.items()]
        if all(s is not None and s.mirrored and (s.caught_up_at or 0) > at for s, at in statuses):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not all mirrored: {statuses}")


@pytest.mark.broker
async def test_a_committer_commits_the_partitions_refused(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = _create_topic(broker.bootstrap, 2)
    committer = offset_commits.OffsetCommitter(broker.bootstrap, {}, timeout_s=5)
    group = logs.unique_topic("direct")
    try:
        failed = await committer.commit(group, {(topic, 0): (11, "meta"), (topic, 1): (12, "")})
        assert failed == {}
        assert await asyncio.to_thread(native_groups.offsets, broker.bootstrap, group) == {
            (topic, 0): 11,
            (topic, 1): 12,
        }
        # A later commit replaces what it names and leaves the rest.
        assert await committer.commit(group, {(topic, 0): (13, "")}) == {}
        assert await asyncio.to_thread(native_groups.offsets, broker.bootstrap, group) == {
            (topic, 0): 13,
            (topic, 1): 12,
        }
        assert committer.connections == 1
    finally:
        await committer.close()


@pytest.mark.broker
async def test_a_committer_deletes_a_group_and_its_offsets(
    broker: embedded.EmbeddedBroker,
) -> None:
    """DeleteGroups: the brokers' group and its offsets go (a later reader finds none);
    deleting a group that is not there is no error."""
    topic = _create_topic(broker.bootstrap, 2)
    committer = offset_commits.OffsetCommitter(broker.bootstrap, {}, timeout_s=5)
    group = logs.unique_topic("deleted")
    try:
        assert await committer.commit(group, {(topic, 0): (11, ""), (topic, 1): (12, "")}) == {}
        assert await committer.delete_group(group) is None
        assert await asyncio.to_thread(native_groups.offsets, broker.bootstrap, group) == {}
        assert await committer.delete_group(group) is None
        assert await committer.delete_group(logs.unique_topic("never")) is None
    finally:
        await committer.close()


@pytest.mark.broker
@pytest.mark.tansu_deviation("it deletes a group that has active members")
async def test_a_group_with_active_members_is_not_deleted(
    broker: embedded.EmbeddedBroker,
) -> None:
    topic = _create_topic(broker.bootstrap, 2)
    committer = offset_commits.OffsetCommitter(broker.bootstrap, {}, timeout_s=5)
    busy = logs.unique_topic("busy")
    try:
        with native_groups.active_member(broker.bootstrap, busy, topic):
            assert await committer.delete_group(busy) == "NON_EMPTY_GROUP"
    finally:
        await committer.close()


# --- hostile servers -----------------------------------------------------------------------


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _server(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}"


async def _closes_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _answers_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(4)
    writer.write(struct.pack(">i", 7) + b"\xff" * 7)  # a frame no ApiVersions reply is
    await writer.drain()
    await asyncio.sleep(10)


async def _huge_frame(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(4)
    writer.write(struct.pack(">i", 2**31 - 1))
    await writer.drain()
    await asyncio.sleep(10)


async def _never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


@pytest.mark.parametrize(
    "handler", [_closes_at_once, _answers_garbage, _huge_frame, _never_answers]
)
async def test_a_misbehaving_broker_fails_the_commit_with_a_reason(handler: Handler) -> None:
    server, address = await _server(handler)
    committer = offset_commits.OffsetCommitter(address, {}, timeout_s=1.0)
    try:
        for _ in range(2):  # and again: the committer is still usable
            started = time.monotonic()
            with pytest.raises(offset_commits.CommitFailed) as failure:
                await committer.commit("g", {("t", 0): (1, "")})
            assert time.monotonic() - started < 5
            assert str(failure.value)
            assert committer.connections == 0
    finally:
        await committer.close()
        server.close()


async def test_a_mirror_to_a_misbehaving_broker_reports_why_and_keeps_its_task() -> None:
    server, address = await _server(_answers_garbage)
    reads = {"g": {("t", 0): _committed(5)}}
    offsets_mirror = mirror.OffsetMirror(lambda group: reads[group])
    try:
        offsets_mirror.configure("g", mirror.MirrorTarget(address, {}, 0.2, 1.0))
        deadline = time.monotonic() + 10
        status = offsets_mirror.status("g")
        while time.monotonic() < deadline:
            status = offsets_mirror.status("g")
            if status is not None and status.failures >= 2:
                break
            await asyncio.sleep(0.05)
        assert status is not None
        assert status.reason is mirror.MirrorReason.MIRROR_FAILED
        assert status.behind == 1
        assert "127.0.0.1" in status.message
        task = offsets_mirror._groups["g"].task
        assert task is not None
        assert not task.done()
    finally:
        await offsets_mirror.stop()
        server.close()


@pytest.mark.parametrize(
    ("properties", "named"),
    [
        ({"security.protocol": "sasl_ssl", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
        ({"security.protocol": "carrier_pigeon"}, "security.protocol"),
        ({"security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN"}, "sasl.username"),
    ],
)
async def test_settings_the_mirror_cannot_honour_are_its_reason(
    properties: dict[str, str], named: str
) -> None:
    reads = {"g": {("t", 0): _committed(5)}}
    offsets_mirror = mirror.OffsetMirror(lambda group: reads[group])
    try:
        offsets_mirror.configure("g", mirror.MirrorTarget("127.0.0.1:1", properties, 0.2, 1.0))
        status = await offsets_mirror.flush("g")
        assert status is not None
        assert status.reason is mirror.MirrorReason.MIRROR_FAILED
        assert named in status.message
    finally:
        await offsets_mirror.stop()


def test_bad_servers_are_a_config_error() -> None:
    with pytest.raises(connection.ConfigError):
        offset_commits.OffsetCommitter("no-port-here", {})


def _committed(offset: int) -> object:
    from kafka_group_operator.coordinator import messages

    return messages.CommittedOffset(offset, "", -1, 0)
