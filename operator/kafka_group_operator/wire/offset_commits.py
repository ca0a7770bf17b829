"""Member-less offset commits to the brokers' groups, every group over one connection per broker.

The offset mirror (``runtime.mirror``) copies each group's committed offsets into the
brokers' own group of the same id. librdkafka commits only as a consumer of one group (its
``group.id`` is fixed per client), so mirroring N groups with it took N clients: three
threads, a bootstrap and a coordinator connection each, and each client's timers polling
the brokers. At a thousand groups per replica that was over a thousand threads and twice
the machine's load. Its admin client's ``alter_consumer_group_offsets`` takes any group,
but its coordinator requests can abort the whole process when a connection drops
(confluentinc/librdkafka#4605).

So the commits are sent here, as Kafka's admin client sends AlterConsumerGroupOffsets:
FindCoordinator for the group (its answer kept until the brokers say the coordinator
moved), then one OffsetCommit with generation -1, no member id and no instance id, which a
broker accepts while its group has no members. Every group shares one connection per
broker (requests pipelined, replies matched by correlation id); TLS and SASL as the other
clients of the operator, from the same librdkafka properties (``connection``). Versions
are the highest both sides know: OffsetCommit v2 to v8 (v9 and later are KIP-848 members'
commits), FindCoordinator v1 to v6.

The same way, a group that leaves the operator under ``deletionPolicy: Delete`` has its
brokers' group deleted (DeleteGroups v0 to v2): the mirror's copy of the offsets goes with
the coordinator's, and a later group of the same id adopts nothing.

A reply's error for a partition is reported by name (``UNKNOWN_MEMBER_ID`` when the
brokers' group still has active members); a connection that fails, or a reply that does not
come within the timeout, fails the whole request, closes that connection and forgets the
coordinators found through it. Nothing is retried here but a commit sent to a coordinator
that moved (once, after finding the new one): the mirror retries the rest at its interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import itertools
import logging
import typing
from collections.abc import Mapping
from typing import Any

from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.delete_groups.v2.request import DeleteGroupsRequest as _DeleteGroupsV2
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v6.request import FindCoordinatorRequest as _FindCoordinatorV6
from kio.schema.offset_commit.v8.request import OffsetCommitRequest as _OffsetCommitV8
from kio.static.primitive import i8, i32, i64

from kafka_group_operator.wire import connection, framing

logger = logging.getLogger(__name__)

# API keys as Kafka's message schemas define them (kio is generated from those).
OFFSET_COMMIT = int(_OffsetCommitV8.__api_key__)
FIND_COORDINATOR = int(_FindCoordinatorV6.__api_key__)
DELETE_GROUPS = int(_DeleteGroupsV2.__api_key__)
# (lowest, highest) versions sent. OffsetCommit v0 and v1 are gone from Kafka 4; v9 and
# later carry KIP-848 member epochs (and topic ids from v10).
_OFFSET_COMMIT_VERSIONS = (2, 8)
_FIND_COORDINATOR_VERSIONS = (1, 6)
_DELETE_GROUPS_VERSIONS = (0, 2)
# FindCoordinator's key type for a consumer group (Kafka's CoordinatorType.GROUP).
_GROUP_KEY_TYPE = i8(0)
_COORDINATOR_MOVED = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available})
CLIENT_ID = "kgo-offset-mirror"

TopicPartition = tuple[str, int]


class CommitFailed(Exception):
    """A request failed as a whole: no connection, no reply in time, or a refusal."""


def _schema(api_key: int, version: int, kind: str) -> type[Any]:
    name = {
        OFFSET_COMMIT: "offset_commit",
        FIND_COORDINATOR: "find_coordinator",
        DELETE_GROUPS: "delete_groups",
    }[api_key]
    module = importlib.import_module(f"kio.schema.{name}.v{version}.{kind}")
    classes = {
        (OFFSET_COMMIT, "request"): "OffsetCommitRequest",
        (FIND_COORDINATOR, "request"): "FindCoordinatorRequest",
        (DELETE_GROUPS, "request"): "DeleteGroupsRequest",
    }
    return getattr(module, classes[(api_key, kind)])  # type: ignore[no-any-return]


def _nested(schema: type[Any], field_name: str) -> type[Any]:
    """The entity type of a tuple field of ``schema`` (kio's generated annotations)."""
    hints = typing.get_type_hints(schema)
    (inner, _) = typing.get_args(hints[field_name])
    return inner  # type: ignore[no-any-return]


def _build(schema: type[Any], **values: Any) -> Any:
    """``schema(**values)`` with only the fields this version has."""
    names = {field.name for field in dataclasses.fields(schema)}
    return schema(**{k: v for k, v in values.items() if k in names})


def offset_commit_request(
    version: int, group_id: str, offsets: Mapping[TopicPartition, tuple[int, str]]
) -> Any:
    """A member-less OffsetCommit of ``offsets`` ({(topic, partition): (offset, metadata)})."""
    request = _schema(OFFSET_COMMIT, version, "request")
    topic_type = _nested(request, "topics")
    partition_type = _nested(topic_type, "partitions")
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), (offset, metadata) in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(
            _build(
                partition_type,
                partition_index=i32(partition),
                committed_offset=i64(offset),
                committed_leader_epoch=i32(-1),
                committed_metadata=metadata,
                commit_timestamp=i64(-1),
            )
        )
    return _build(
        request,
        group_id=group_id,
        generation_id_or_member_epoch=i32(-1),
        generation_id=i32(-1),
        member_id="",
        group_instance_id=None,
        # v2 to v4: -1 keeps the brokers' offsets.retention.minutes.
        retention_time_ms=i64(-1),
        topics=tuple(
            _build(topic_type, name=topic, partitions=tuple(partitions))
            for topic, partitions in by_topic.items()
        ),
    )


def find_coordinator_request(version: int, group_id: str) -> Any:
    request = _schema(FIND_COORDINATOR, version, "request")
    if version >= 4:  # KIP-699: batched keys
        return request(key_type=_GROUP_KEY_TYPE, coordinator_keys=(group_id,))
    return _build(request, key=group_id, key_type=_GROUP_KEY_TYPE)


def coordinator_of(reply: Any) -> tuple[str, int]:
    """(host, port) from a FindCoordinator reply; ``CommitFailed`` naming its error."""
    if hasattr(reply, "coordinators"):
        if len(reply.coordinators) != 1:
            raise CommitFailed(f"FindCoordinator answered {len(reply.coordinators)} keys, not 1")
        reply = reply.coordinators[0]
    if reply.error_code != ErrorCode.none:
        raise CommitFailed(f"FindCoordinator: {reply.error_code.name.upper()}")
    if not reply.host or not 0 < int(reply.port) < 65536:
        raise CommitFailed(
            f"FindCoordinator answered no usable address ({reply.host}:{reply.port})"
        )
    return str(reply.host), int(reply.port)


def partition_errors(
    reply: Any, offsets: Mapping[TopicPartition, tuple[int, str]]
) -> dict[TopicPartition, ErrorCode]:
    """Each partition of ``offsets`` the reply does not confirm, with its error."""
    confirmed: set[TopicPartition] = set()
    failed: dict[TopicPartition, ErrorCode] = {}
    for topic in reply.topics:
        for partition in topic.partitions:
            tp = (str(topic.name), int(partition.partition_index))
            if tp not in offsets:
                continue
            if partition.error_code == ErrorCode.none:
                confirmed.add(tp)
            else:
                failed[tp] = partition.error_code
    for tp in offsets:
        if tp not in confirmed:
            failed.setdefault(tp, ErrorCode.unknown_server_error)
    return failed


def _pick(ours: tuple[int, int], theirs: tuple[int, int] | None, api: str) -> int:
    if theirs is None:
        raise CommitFailed(f"the broker does not serve {api}")
    version = min(ours[1], theirs[1])
    if version < max(ours[0], theirs[0]):
        raise CommitFailed(f"no {api} version both sides know (broker: v{theirs[0]}-v{theirs[1]})")
    return version


class _BrokerConnection:
    """One authenticated connection; requests pipelined, replies matched by correlation id."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        versions: Mapping[int, tuple[int, int]],
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.offset_commit_version = _pick(
            _OFFSET_COMMIT_VERSIONS, versions.get(OFFSET_COMMIT), "OffsetCommit"
        )
        self.find_coordinator_version = _pick(
            _FIND_COORDINATOR_VERSIONS, versions.get(FIND_COORDINATOR), "FindCoordinator"
        )
        # Picked when used: a broker that cannot delete groups can still be mirrored to.
        self.versions = dict(versions)
        self._correlation = itertools.count(1)
        self._pending: dict[int, tuple[type[Any], asyncio.Future[Any]]] = {}
        self._reading = asyncio.create_task(self._read_replies())
        self.closed = False

    @classmethod
    async def open(
        cls, address: tuple[str, int], security: connection.Security, timeout_s: float
    ) -> _BrokerConnection:
        try:
            reader, writer = await connection.connect(address, security, timeout_s)
        except connection.UpstreamError as error:
            raise CommitFailed(str(error)) from None
        try:
            async with asyncio.timeout(timeout_s):
                reply = await connection.call(
                    reader,
                    writer,
                    ApiVersionsRequest(
                        client_software_name="kgo-offset-mirror",
                        client_software_version="1",
                    ),
                    0,
                    client_id=CLIENT_ID,
                )
            if reply.error_code != ErrorCode.none:
                raise CommitFailed(f"ApiVersions: {reply.error_code.name.upper()}")
            versions = {
                int(key.api_key): (int(key.min_version), int(key.max_version))
                for key in reply.api_keys
            }
            return cls(reader, writer, versions)
        except CommitFailed:
            writer.close()
            raise
        except Exception as error:  # no connection, no reply in time, or an unreadable one
            writer.close()
            raise CommitFailed(
                f"{address[0]}:{address[1]}: {error or type(error).__name__}"
            ) from None
        except BaseException:
            writer.close()
            raise

    async def request(self, body: Any) -> Any:
        if self.closed:
            raise CommitFailed("the connection is closed")
        correlation_id = next(self._correlation)
        schema = framing.response_type(body.__api_key__, body.__version__)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = (schema, reply)
        try:
            self._writer.write(framing.encode_request(body, correlation_id, client_id=CLIENT_ID))
            return await reply
        finally:
            self._pending.pop(correlation_id, None)

    async def _read_replies(self) -> None:
        error: BaseException = CommitFailed("the broker closed the connection")
        try:
            while True:
                payload = await framing.read_frame(self._reader)
                if payload is None:
                    break
                correlation_id = framing.peek_correlation(payload)
                waiting = self._pending.get(correlation_id)
                if waiting is None:
                    continue  # its caller gave up (timeout): nothing waits for it
                schema, reply = waiting
                try:
                    _, body = framing.read_response(payload, schema)
                except Exception as bad:  # a reply kio cannot read fails its request alone
                    if not reply.done():
                        reply.set_exception(CommitFailed(f"unreadable reply: {bad}"))
                    continue
                if not reply.done():
                    reply.set_result(body)
        except (OSError, framing.FrameError, asyncio.IncompleteReadError) as broken:
            error = CommitFailed(f"connection lost: {broken or type(broken).__name__}")
        finally:
            self.closed = True
            for _, reply in list(self._pending.values()):
                if not reply.done():
                    reply.set_exception(error)
            self._writer.close()

    async def close(self) -> None:
        self.closed = True
        self._writer.close()
        self._reading.cancel()
        with contextlib.suppress(BaseException):
            await self._reading


class OffsetCommitter:
    """Member-less commits to one Kafka cluster's groups (see the module's docstring)."""

    def __init__(
        self,
        bootstrap_servers: str,
        properties: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """``connection.ConfigError`` when the servers or the security settings are unusable."""
        self._bootstrap = connection.parse_servers(bootstrap_servers)
        self._security = connection.upstream_security(dict(properties or {}))
        self._timeout_s = timeout_s
        self._connections: dict[tuple[str, int], _BrokerConnection] = {}
        self._opening: dict[tuple[str, int], asyncio.Lock] = {}
        self._coordinators: dict[str, tuple[str, int]] = {}
        self._next_bootstrap = 0

    @property
    def connections(self) -> int:
        """Connections open now (one per broker used, whatever the number of groups)."""
        return sum(1 for c in self._connections.values() if not c.closed)

    async def commit(
        self, group_id: str, offsets: Mapping[TopicPartition, tuple[int, str]]
    ) -> dict[TopicPartition, str]:
        """Commit ``offsets`` to ``group_id``: the error name of each partition not committed
        (empty when all were). ``CommitFailed`` when the request failed as a whole."""
        if not offsets:
            return {}
        for attempt in range(2):
            address = await self._coordinator(group_id)
            broker = await self._connection(address)
            request = offset_commit_request(broker.offset_commit_version, group_id, offsets)
            reply = await self._send(broker, address, request)
            if getattr(reply, "error_code", ErrorCode.none) != ErrorCode.none:
                code = reply.error_code  # a top-level error (versions that have one)
                failed = dict.fromkeys(offsets, code)
            else:
                failed = partition_errors(reply, offsets)
            if attempt == 0 and any(code in _COORDINATOR_MOVED for code in failed.values()):
                self._coordinators.pop(group_id, None)
                continue
            if any(code in _COORDINATOR_MOVED for code in failed.values()):
                self._coordinators.pop(group_id, None)
            return {tp: code.name.upper() for tp, code in failed.items()}
        raise AssertionError("unreachable")

    async def delete_group(self, group_id: str) -> str | None:
        """Delete the brokers' group ``group_id`` with its committed offsets (DeleteGroups, as
        ``kafka-consumer-groups.sh --delete`` sends it): None once it is gone (or never was),
        else the brokers' error name (``NON_EMPTY_GROUP`` while it has active members).
        ``CommitFailed`` when the request failed as a whole, or the brokers cannot delete."""
        for attempt in range(2):
            address = await self._coordinator(group_id)
            broker = await self._connection(address)
            version = _pick(
                _DELETE_GROUPS_VERSIONS, broker.versions.get(DELETE_GROUPS), "DeleteGroups"
            )
            request = _schema(DELETE_GROUPS, version, "request")(groups_names=(group_id,))
            reply = await self._send(broker, address, request)
            codes = [result.error_code for result in reply.results if result.group_id == group_id]
            code = codes[0] if len(codes) == 1 else ErrorCode.unknown_server_error
            if code in _COORDINATOR_MOVED:
                self._coordinators.pop(group_id, None)
                if attempt == 0:
                    continue
            if code in (ErrorCode.none, ErrorCode.group_id_not_found):
                return None
            return str(code.name.upper())
        raise AssertionError("unreachable")

    async def close(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        self._coordinators.clear()
        for broker in connections:
            await broker.close()

    async def _coordinator(self, group_id: str) -> tuple[str, int]:
        known = self._coordinators.get(group_id)
        if known is not None:
            return known
        errors = []
        for _ in range(len(self._bootstrap)):
            address = self._bootstrap[self._next_bootstrap % len(self._bootstrap)]
            try:
                broker = await self._connection(address)
                request = find_coordinator_request(broker.find_coordinator_version, group_id)
                found = coordinator_of(await self._send(broker, address, request))
            except CommitFailed as error:
                errors.append(str(error))
                self._next_bootstrap += 1
                continue
            self._coordinators[group_id] = found
            return found
        raise CommitFailed("; ".join(errors))

    async def _connection(self, address: tuple[str, int]) -> _BrokerConnection:
        broker = self._connections.get(address)
        if broker is not None and not broker.closed:
            return broker
        lock = self._opening.setdefault(address, asyncio.Lock())
        async with lock:
            broker = self._connections.get(address)
            if broker is None or broker.closed:
                broker = await _BrokerConnection.open(address, self._security, self._timeout_s)
                self._connections[address] = broker
            return broker

    async def _send(self, broker: _BrokerConnection, address: tuple[str, int], body: Any) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await broker.request(body)
        except TimeoutError:
            # A broker that does not answer in time is not trusted with the next request.
            self._drop(address, broker)
            await broker.close()
            raise CommitFailed(
                f"no answer from {address[0]}:{address[1]} within {self._timeout_s:g} s"
            ) from None
        except CommitFailed:
            # Lost, or it carried a reply kio could not read: not trusted with the next one.
            self._drop(address, broker)
            await broker.close()
            raise

    def _drop(self, address: tuple[str, int], broker: _BrokerConnection) -> None:
        if self._connections.get(address) is broker:
            del self._connections[address]
        # Coordinators learnt through it may be stale too: found again on next use.
        for group_id in [g for g, a in self._coordinators.items() if a == address]:
            del self._coordinators[group_id]
