"""The control plane's port reaching a group coordinated by another replica.

Two real coordinator runtimes split one state topic on the embedded broker, each serving its
member API and the internal API over HTTP, with a directory naming the other. The port the
handlers use lives beside runtime ``a``; every call on a group of ``b``'s partitions must reach
``b`` (found through ``a``'s ``GET .../coordinator``), act there and nowhere else, and come
back as the in-process call would. Then ``b`` restarts on the same address with an empty
token store: the port's next calls hand it the group's token and mirror again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from kafka_group_jobs import topics as job_topics
from kafka_group_operator.access import discovery, tokens
from kafka_group_operator.api import app as api_app
from kafka_group_operator.api import internal
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.handlers import coordinator_port
from kafka_group_operator.jobs import compaction
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.runtime import coordinator_runtime, mirror
from kafka_group_records import partitioning
from tests.runtime import logs
from tests.support import groups, topics

pytestmark = pytest.mark.broker

PARTITIONS = 4
SETS = {"a": frozenset({0, 1}), "b": frozenset({2, 3})}
INTERNAL_TOKEN = "internal-secret"


def _group_on(partitions: frozenset[int], prefix: str) -> str:
    index = 0
    while partitioning.partition_for(f"{prefix}{index}", PARTITIONS) not in partitions:
        index += 1
    return f"{prefix}{index}"


@dataclass
class Replica:
    runtime: coordinator_runtime.CoordinatorRuntime
    tokens: tokens.GroupTokens
    local: internal.InProcessCoordinator
    url: str


@contextlib.asynccontextmanager
async def replica(
    bootstrap: str, topic: str, name: str, ports: dict[str, int]
) -> AsyncIterator[Replica]:
    urls = {key: f"http://127.0.0.1:{port}" for key, port in ports.items()}
    config = coordinator_runtime.RuntimeConfig(
        bootstrap_servers=bootstrap,
        topic=topic,
        partitions=PARTITIONS,
        write_timeout_ms=5000,
        metadata_interval_ms=500,
        served_partitions=SETS[name],
    )
    directory = discovery.Directory(
        PARTITIONS,
        SETS[name],
        urls[name],
        {p: urls[other] for other in SETS if other != name for p in SETS[other]},
    )
    async with groups.running(config) as runtime:
        store = tokens.GroupTokens()
        local = internal.InProcessCoordinator(runtime, store)
        runner = web.AppRunner(
            api_app.build_app(runtime, store, directory, local, INTERNAL_TOKEN), access_log=None
        )
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", ports[name]).start()
        try:
            yield Replica(runtime, store, local, urls[name])
        finally:
            await runner.cleanup()


def _settings(group: str, topic: str) -> messages.GroupSettings:
    return messages.GroupSettings(
        group_id=group, session_timeout_ms=30_000, heartbeat_interval_ms=500, topics=(topic,)
    )


async def _heartbeat(url: str, group: str, token: str | None) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"memberId": "m-1", "memberEpoch": 0, "instanceId": "pod-0", "subscribedTopicNames": []}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/groups/{group}/heartbeat", json=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def test_the_port_reaches_the_replica_that_coordinates_the_group(
    broker: embedded.EmbeddedBroker,
) -> None:
    state_topic = logs.unique_topic()
    data_topic = topics.create_topic(broker.bootstrap, 2)
    ports = {name: embedded.free_port() for name in SETS}
    remote_group = _group_on(SETS["b"], "remote-")
    local_group = _group_on(SETS["a"], "local-")
    async with replica(broker.bootstrap, state_topic, "a", ports) as a:
        port = coordinator_port.RoutingCoordinator(
            a.local, discovery_url=a.url, internal_token=INTERNAL_TOKEN, advertised_url=a.url
        )
        target = mirror.MirrorTarget(broker.bootstrap, {"client.id": "not-sent"}, 0.2)
        try:
            async with replica(broker.bootstrap, state_topic, "b", ports) as b:
                await _act_through_the_port(
                    port, a, b, remote_group, local_group, data_topic, target
                )
            # b restarts at the same address with an empty token store and no mirror: the
            # first call fails (nobody answers), a later one hands b the token and mirror.
            with pytest.raises(errors.CoordinatorNotAvailable):
                await port.describe_group(remote_group)
            async with replica(broker.bootstrap, state_topic, "b", ports) as b2:
                assert b2.tokens.token_for(remote_group) is None
                description = await coordinator_port.wait_for(
                    lambda: port.describe_group(remote_group), 30
                )
                assert description.group_id == remote_group
                assert b2.tokens.token_for(remote_group) == f"token-of-{remote_group}"
                assert b2.runtime.mirror.status(remote_group) is not None
                # What b acknowledged before its restart is read back from the state topic.
                offsets = await port.fetch_offsets(messages.OffsetFetchRequest(remote_group))
                assert offsets.offsets[(data_topic, 0)].metadata == "adopted"
        finally:
            await port.close()


async def _act_through_the_port(
    port: coordinator_port.RoutingCoordinator,
    a: Replica,
    b: Replica,
    remote_group: str,
    local_group: str,
    data_topic: str,
    target: mirror.MirrorTarget,
) -> None:
    for group in (remote_group, local_group):
        await port.configure_group(_settings(group, data_topic))
        await port.set_token(group, f"token-of-{group}")
    assert port.owner_url(remote_group) == b.url
    assert port.owner_url(local_group) == coordinator_port.LOCAL
    # An administrative commit (adoption's) while the group has no member.
    commit = messages.OffsetCommitRequest(
        group_id=remote_group,
        member_id="",
        member_epoch=messages.LEAVE_EPOCH,
        offsets={(data_topic, 0): messages.CommitOffset(0, "adopted")},
    )
    assert (await port.commit_offsets(commit)).errors == {}
    fetched = await port.fetch_offsets(messages.OffsetFetchRequest(remote_group))
    assert fetched == await b.runtime.fetch_offsets(messages.OffsetFetchRequest(remote_group))
    assert fetched.offsets[(data_topic, 0)].metadata == "adopted"
    assert await port.group_lag(remote_group) == await b.runtime.group_lag(remote_group)

    # The token reached the coordinator: a member of the remote group is served by b with
    # it, and refused without it.
    assert b.tokens.token_for(remote_group) == f"token-of-{remote_group}"
    status, _ = await _heartbeat(b.url, remote_group, None)
    assert status == 401
    status, answer = await _heartbeat(b.url, remote_group, f"token-of-{remote_group}")
    assert status == 200, answer

    owner = messages.GroupOwner("shop", "orders", "uid-1")
    claimed = await port.claim_group(messages.ClaimGroupRequest(remote_group, owner))
    assert claimed == owner
    assert await b.runtime.group_owner(remote_group) == owner
    with pytest.raises(errors.NotCoordinator):
        await a.runtime.group_owner(remote_group)
    assert await port.group_owner(remote_group) == owner

    described = await port.describe_group(remote_group)
    assert described == await b.runtime.describe_group(remote_group)
    assert [member.instance_id for member in described.members] == ["pod-0"]

    # The mirror runs on the coordinator, with the coordinator's own Kafka settings.
    await port.configure_mirror(remote_group, target)
    assert a.runtime.mirror.status(remote_group) is None
    flushed = await port.flush_mirror(remote_group)
    assert flushed is not None
    assert flushed.reason is mirror.MirrorReason.CAUGHT_UP, flushed.message
    assert await port.mirror_status(remote_group) == b.runtime.mirror.status(remote_group)

    removed = await port.remove_members(
        messages.RemoveMembersRequest(remote_group, ("pod-0", "pod-9"))
    )
    assert removed["pod-0"] is None
    assert removed["pod-9"] == errors.UnknownMemberId.name
    assert (await b.runtime.describe_group(remote_group)).members == ()

    # Taking a token or a mirror away reaches the coordinator too, from a port that has not
    # met the group yet (the local runtime does not serve it).
    fresh = coordinator_port.RoutingCoordinator(
        a.local, discovery_url=a.url, internal_token=INTERNAL_TOKEN, advertised_url=a.url
    )
    try:
        await fresh.remove_mirror(remote_group)
        assert b.runtime.mirror.status(remote_group) is None
        await fresh.discard_token(remote_group)
        assert b.tokens.token_for(remote_group) is None
    finally:
        await fresh.close()
    await port.set_token(remote_group, f"token-of-{remote_group}")
    await port.configure_mirror(remote_group, target)
    assert b.tokens.token_for(remote_group) == f"token-of-{remote_group}"
    assert b.runtime.mirror.status(remote_group) is not None

    # The same calls on a group of a's partitions never leave the process.
    await port.claim_group(messages.ClaimGroupRequest(local_group, owner))
    assert await a.runtime.group_owner(local_group) == owner
    assert b.tokens.token_for(local_group) is None
    assert a.tokens.token_for(local_group) == f"token-of-{local_group}"


async def test_the_internal_api_needs_the_internal_token_and_validates_bodies(
    broker: embedded.EmbeddedBroker,
) -> None:
    ports = {name: embedded.free_port() for name in SETS}
    group = _group_on(SETS["a"], "guarded-")
    async with (
        replica(broker.bootstrap, logs.unique_topic(), "a", ports) as a,
        aiohttp.ClientSession() as session,
    ):
        path = f"{a.url}{internal.PREFIX}/groups/{group}/owner"
        async with session.get(path) as response:
            assert response.status == 401
            assert (await response.json())["error"] == errors.GroupAuthorizationFailed.name
        # A group token is no internal token.
        a.tokens.set(group, "group-token")
        async with session.get(path, headers={"Authorization": "Bearer group-token"}) as response:
            assert response.status == 403
        auth = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}
        settings_path = f"{a.url}{internal.PREFIX}/groups/{group}/settings"
        hostile_bodies: list[object] = [
            [],
            {"assignor": "range"},
            {**_wire_settings(), "sessionTimeoutMs": -1},
        ]
        for hostile in hostile_bodies:
            async with session.put(settings_path, json=hostile, headers=auth) as response:
                assert response.status == 400
                assert (await response.json())["error"] == errors.InvalidRequest.name
        async with session.put(settings_path, json=_wire_settings(), headers=auth) as response:
            assert response.status == 200
        # A group of b's partitions is not forwarded: NOT_COORDINATOR naming b.
        other = _group_on(SETS["b"], "elsewhere-")
        async with session.get(
            f"{a.url}{internal.PREFIX}/groups/{other}/owner", headers=auth
        ) as response:
            body = await response.json()
            assert body["error"] == errors.NotCoordinator.name
            assert body["coordinator"]["url"] == f"http://127.0.0.1:{ports['b']}"
        remote = coordinator_port.RemoteCoordinator(a.url, INTERNAL_TOKEN, session)
        with pytest.raises(coordinator_port.CoordinatorMoved) as moved:
            await remote.group_owner(other)
        assert moved.value.url == f"http://127.0.0.1:{ports['b']}"
        assert await remote.find(other) == f"http://127.0.0.1:{ports['b']}"
        assert await remote.find(group) == a.url


def _wire_settings() -> dict[str, object]:
    return internal.encode_settings(messages.GroupSettings(group_id="unused"))


def test_codecs_round_trip() -> None:
    description = messages.GroupDescription(
        group_id="g",
        state="Stable",
        group_epoch=3,
        assignment_epoch=3,
        assignor="uniform",
        members=(
            messages.MemberDescription(
                member_id="m",
                instance_id=None,
                rack_id="r1",
                member_epoch=3,
                state="STABLE",
                subscribed_topic_names=("t",),
                assignment={"t": frozenset({0, 2})},
                target_assignment={"t": frozenset({0})},
                partitions_pending_revocation={"t": frozenset({2})},
                client_id="c",
                client_host="/10.0.0.1",
                classic=True,
            ),
        ),
        group_type="classic",
        protocol_type="connect",
    )
    assert internal.decode_description(internal.encode_description(description)) == description
    settings = messages.GroupSettings("g", assignor="range", assignment_paused=True, topics=("t",))
    assert internal.decode_settings("g", internal.encode_settings(settings)) == settings
    client = messages.GroupSettings("g", topics=("t",), client_assignment=True)
    assert internal.decode_settings("g", internal.encode_settings(client)) == client
    # A replica that predates the field sends none: Server.
    older = {k: v for k, v in internal.encode_settings(client).items() if k != "clientAssignment"}
    assert internal.decode_settings("g", older).client_assignment is False
    status = mirror.MirrorStatus(mirror.MirrorReason.MIRROR_FAILED, "refused", 2, 3, 12.5)
    assert internal.decode_mirror_status(internal.encode_mirror_status(status)) == status
    assert internal.decode_mirror_status(internal.encode_mirror_status(None)) is None
    target = mirror.MirrorTarget("k:9092", {"sasl.password": "secret"}, 2.0, 5.0)
    sent = internal.encode_mirror_target(target)
    assert "secret" not in str(sent)
    assert internal.decode_mirror_target(sent) == mirror.MirrorTarget("k:9092", {}, 2.0, 5.0)
    with pytest.raises(errors.InvalidRequest, match="intervalSeconds"):
        internal.decode_mirror_target({**sent, "intervalSeconds": float("nan")})
    lag = {("t", 0): 5, ("t", 1): 0}
    assert internal.decode_lag(internal.encode_lag(lag)) == lag
    owner = messages.GroupOwner("ns", "n", "u")
    assert internal.decode_owner(internal.encode_owner(owner)) == owner


async def test_wait_for_gives_up_on_errors_that_are_not_retriable() -> None:
    calls = 0

    async def refuse() -> None:
        nonlocal calls
        calls += 1
        raise errors.GroupIdNotFound("no such group")

    with pytest.raises(errors.GroupIdNotFound):
        await coordinator_port.wait_for(refuse, 5)
    assert calls == 1


async def test_a_fence_over_every_partition_asks_each_partitions_coordinator(
    broker: embedded.EmbeddedBroker,
) -> None:
    """The compaction's fence: a fences its partitions, b its own (reached through the internal
    API); without b nothing answers for b's partitions, and the call names them."""
    state_topic = logs.unique_topic()
    ports = {name: embedded.free_port() for name in SETS}
    on_a, on_b = _group_on(SETS["a"], "fenced-a-"), _group_on(SETS["b"], "fenced-b-")
    async with replica(broker.bootstrap, state_topic, "a", ports) as a:
        port = _fencing_port(a)
        try:
            async with replica(broker.bootstrap, state_topic, "b", ports) as b:
                assert not (await a.runtime.commit_offsets(groups.admin_commit(on_a, 4))).errors
                assert not (await b.runtime.commit_offsets(groups.admin_commit(on_b, 5))).errors
                before = job_topics.stable_ends(broker.bootstrap, state_topic, range(PARTITIONS))
                ends = await compaction.fence_every_partition(port, PARTITIONS)
                assert sorted(ends) == list(range(PARTITIONS))
                # One marker in each partition, appended by the partition's coordinator past
                # what it acknowledged; b's were asked of b, not of a's runtime.
                after = job_topics.stable_ends(broker.bootstrap, state_topic, range(PARTITIONS))
                assert all(before[p] <= ends[p] < after[p] for p in range(PARTITIONS))
                for partition in SETS["b"]:
                    probe = coordinator_port.partition_probe(partition, PARTITIONS)
                    assert port.owner_url(probe) == b.url
                # b's partitions alone, asked of b directly, and nothing of a's there.
                async with aiohttp.ClientSession() as session:
                    remote = coordinator_port.RemoteCoordinator(b.url, INTERNAL_TOKEN, session)
                    assert sorted(await remote.read_fence(SETS["b"])) == sorted(SETS["b"])
                    with pytest.raises(errors.NotCoordinator):
                        await remote.read_fence((0, 2))
            # b is gone: its partitions cannot be fenced, and the error names them.
            with pytest.raises(coordinator_port.PartitionsNotFenced) as refused:
                await compaction.fence_every_partition(port, PARTITIONS)
            assert sorted(refused.value.failed) == sorted(SETS["b"])
            assert refused.value.retriable
            assert "state partitions [2, 3]" in str(refused.value)
            await _the_schedule_waits_for_a_fence(port)
            await _a_replica_without_partition_0_leaves_the_schedule(port, broker, state_topic)
            # A later attempt, once b is back, fences every partition again.
            async with replica(broker.bootstrap, state_topic, "b", ports):
                again = await coordinator_port.wait_for(
                    lambda: compaction.fence_every_partition(port, PARTITIONS), 30
                )
                assert all(again[p] > ends[p] for p in range(PARTITIONS))
        finally:
            await port.close()


def _fencing_port(a: Replica) -> coordinator_port.RoutingCoordinator:
    """The control plane's port beside ``a``, able to fence every state partition."""
    return coordinator_port.RoutingCoordinator(
        a.local,
        discovery_url=a.url,
        internal_token=INTERNAL_TOKEN,
        advertised_url=a.url,
        state_partitions=PARTITIONS,
    )


async def test_a_fence_refused_for_an_unserved_partition_succeeds_once_it_is_served(
    broker: embedded.EmbeddedBroker,
) -> None:
    """The compaction's retry: while nobody serves b's partitions the fence fails naming
    exactly them; once b serves them, the same port's next fence covers every partition with
    ends its coordinators took then (past what b acknowledged meanwhile, past the markers the
    refused attempt left on a's partitions), nothing carried over from the refused attempt."""
    state_topic = logs.unique_topic()
    ports = {name: embedded.free_port() for name in SETS}
    every = range(PARTITIONS)
    on_b = _group_on(SETS["b"], "served-later-")
    async with replica(broker.bootstrap, state_topic, "a", ports) as a:
        port = _fencing_port(a)
        try:
            start = job_topics.stable_ends(broker.bootstrap, state_topic, every)
            with pytest.raises(coordinator_port.PartitionsNotFenced) as refused:
                await compaction.fence_every_partition(port, PARTITIONS)
            assert sorted(refused.value.failed) == sorted(SETS["b"])
            assert refused.value.retriable
            async with replica(broker.bootstrap, state_topic, "b", ports) as b:
                assert not (await b.runtime.commit_offsets(groups.admin_commit(on_b, 7))).errors
                before = job_topics.stable_ends(broker.bootstrap, state_topic, every)
                # The refused attempt still marked a's partitions; b's commit is in its own.
                grown = {*SETS["a"], partitioning.partition_for(on_b, PARTITIONS)}
                assert all(before[p] > start[p] for p in grown), (start, before)
                ends = await compaction.fence_every_partition(port, PARTITIONS)
                after = job_topics.stable_ends(broker.bootstrap, state_topic, every)
                assert sorted(ends) == list(every)
                # Each end is where this attempt's own marker went, in every partition.
                assert all(before[p] <= ends[p] < after[p] for p in every), (before, ends, after)
                for partition in SETS["b"]:
                    probe = coordinator_port.partition_probe(partition, PARTITIONS)
                    assert port.owner_url(probe) == b.url
        finally:
            await port.close()


async def _the_schedule_waits_for_a_fence(port: coordinator_port.RoutingCoordinator) -> None:
    """Without a fence the scheduled compaction runs nothing: it tries again while that fits
    before its next scheduled time, else gives up until then."""
    settings = compaction.CompactionSchedule("0 3 * * *", "file:///nowhere", "kgo")
    due = datetime.datetime.now(datetime.UTC)
    logger = logging.getLogger("compaction-test")
    kube = kube_client.KubeClient()  # never used: nothing runs
    operator = compaction.Operator(port, PARTITIONS, kube, {}, "unused:9092", "unused")
    with _records(logger) as logged:
        waiting = asyncio.create_task(
            compaction._compact_due(settings, lambda: operator, logger, due, 0.05)
        )
        while sum("waits for a read fence" in line for line in logged) < 3:
            assert not waiting.done()
            await asyncio.sleep(0.05)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert all("no read fence for state partitions [2, 3]" in line for line in logged)
    with _records(logger) as logged:
        # A retry a day later would come after the next scheduled time.
        await compaction._compact_due(settings, lambda: operator, logger, due, 86_400.0)
        (line,) = logged
        assert line.startswith(f"compaction due at {due} not run: no read fence before")
    await kube.close()


async def _a_replica_without_partition_0_leaves_the_schedule(
    port: coordinator_port.RoutingCoordinator, broker: embedded.EmbeddedBroker, state_topic: str
) -> None:
    """Every replica keeps the schedule; one that does not coordinate state partition 0 runs
    nothing when a compaction is due, not even a fence: no marker is appended anywhere."""
    settings = compaction.CompactionSchedule("0 3 * * *", "file:///nowhere", "kgo")
    due = datetime.datetime.now(datetime.UTC)
    logger = logging.getLogger("compaction-test")
    logger.setLevel(logging.INFO)  # the line is an INFO: two replicas of three say it each time
    kube = kube_client.KubeClient()  # never used: nothing runs
    served = SETS["a"]
    operator = compaction.Operator(
        port, PARTITIONS, kube, {}, "unused:9092", "unused", compacts=lambda: False
    )
    before = job_topics.stable_ends(broker.bootstrap, state_topic, served)
    with _records(logger) as logged:
        # Bounded: a replica that went for the fence would wait for it until tomorrow.
        await asyncio.wait_for(
            compaction._compact_due(settings, lambda: operator, logger, due, 0.05), 10
        )
    assert logged == [f"compaction due at {due} left to the replica coordinating state partition 0"]
    assert job_topics.stable_ends(broker.bootstrap, state_topic, served) == before
    await kube.close()


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _records(logger: logging.Logger) -> Iterator[list[str]]:
    """The messages ``logger`` logs meanwhile."""
    lines: list[str] = []
    handler = _Lines(lines)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


async def test_the_internal_read_fence_refuses_hostile_requests(
    broker: embedded.EmbeddedBroker,
) -> None:
    state_topic = logs.unique_topic()
    ports = {name: embedded.free_port() for name in SETS}
    async with (
        replica(broker.bootstrap, state_topic, "a", ports) as a,
        aiohttp.ClientSession() as session,
    ):
        path = f"{a.url}{internal.PREFIX}/read-fence"
        async with session.post(path, json={"partitions": [0]}) as response:
            assert response.status == 401
            assert (await response.json())["error"] == errors.GroupAuthorizationFailed.name
        a.tokens.set("some-group", "group-token")
        wrong = {"Authorization": "Bearer group-token"}
        async with session.post(path, json={"partitions": [0]}, headers=wrong) as response:
            assert response.status == 403
            assert (await response.json())["error"] == errors.GroupAuthorizationFailed.name
        auth = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}
        every = range(PARTITIONS)
        before = job_topics.stable_ends(broker.bootstrap, state_topic, every)
        hostile: list[object] = [
            [],
            "partitions",
            None,
            {},
            {"partitions": []},
            {"partitions": "0"},
            {"partitions": [True]},
            {"partitions": [-1]},
            {"partitions": [0.5]},
            {"partitions": ["0"]},
            {"partitions": [0, 0]},
            {"partitions": [2**40]},
            {"partitions": [PARTITIONS]},  # outside the state topic
            {"partitions": [0], "allPartitions": True},
            {"partitions": list(range(internal.MAX_FENCE_PARTITIONS + 1))},
        ]
        for body in hostile:
            async with session.post(path, json=body, headers=auth) as response:
                assert response.status == 400, body
                assert (await response.json())["error"] == errors.InvalidRequest.name, body
        for raw in (b"", b"{", b'{"partitions": [0]}garbage', b"\xff\xfe", b"[" * 10_000):
            async with session.post(path, data=raw, headers=auth) as response:
                assert response.status == 400, raw[:20]
                assert (await response.json())["error"] == errors.InvalidRequest.name
        async with session.get(path, headers=auth) as response:
            assert response.status == 405
            assert (await response.json())["error"] == errors.InvalidRequest.name
        # All or nothing: a partition served elsewhere refuses the whole call, and no marker
        # is appended to the one served here.
        async with session.post(path, json={"partitions": [0, 2]}, headers=auth) as response:
            assert response.status == 503
            assert (await response.json())["error"] == errors.NotCoordinator.name
        assert job_topics.stable_ends(broker.bootstrap, state_topic, every) == before
        # The server still serves.
        async with session.post(path, json={"partitions": [1, 0]}, headers=auth) as response:
            assert response.status == 200
            answer = await response.json()
        assert answer["fence"] == "coordinator"
        assert sorted(answer["endOffsets"]) == ["0", "1"]
        assert all(answer["endOffsets"][str(p)] >= before[p] for p in (0, 1))


def test_fence_codecs() -> None:
    assert internal.decode_fence_request(internal.encode_fence_request({3, 1})) == (1, 3)
    answer = {"fence": "coordinator", "endOffsets": {"1": 7, "3": 0}}
    assert internal.decode_fence_response(answer, (1, 3)) == {1: 7, 3: 0}
    # An answer that does not cover what was asked, or is malformed, is no fence.
    with pytest.raises(errors.CoordinatorError):
        internal.decode_fence_response(answer, (1,))
    huge = "9" * 5000  # past what int() converts: a clear error, not a ValueError
    malformed = ({"endOffsets": {"x": 1}}, {"endOffsets": {"1": -1}}, {"endOffsets": []}, [])
    for bad in (*malformed, {"endOffsets": {huge: 1}}, {"endOffsets": {"1": int(huge[:4000])}}):
        with pytest.raises(errors.InvalidRequest):
            internal.decode_fence_response(bad, (1,))
    probes = [coordinator_port.partition_probe(p, 50) for p in range(50)]
    assert [partitioning.partition_for(probe, 50) for probe in probes] == list(range(50))
