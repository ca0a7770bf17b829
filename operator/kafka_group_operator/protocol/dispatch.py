"""The listener's dispatch table and what a handler is given.

A ``Route`` maps one API key to its handler and the versions served; ``routes.ROUTES`` is
the table. A handler is ``async (ctx, request) -> response``: ``request`` is kio's request
type of ``ctx.api_version`` and the response must be kio's response type of that version,
built with ``ctx.response`` / ``ctx.nested`` (they pick the version's classes and drop the
fields that version does not have, so one handler serves every version), or that response's
body already encoded (``bytes``: a template for an answer given thousands of times a second).

A route may also have an ``answer_now``: ``(ctx, request) -> response | None``, a plain
function that answers without waiting when it can (a steady heartbeat, from the runtime's
memory) and returns ``None`` otherwise, when ``handler`` serves the request. The listener
tries it in the callback that read the request, so that the commonest request costs no task.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from kafka_group_operator.access import tokens
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.protocol import cursor, peers
from kafka_group_operator.wire import framing

NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))
# Groups a handler serves between two returns to the event loop (a request naming thousands
# must not hold up every other connection's heartbeats).
GROUP_BATCH = 100
# A request header's API key, API version and correlation id, before its client id.
_FIXED_HEADER_SIZE = 8


class Coordinator(Protocol):
    """What the listener needs from the coordinator runtime."""

    async def heartbeat(self, request: messages.HeartbeatRequest) -> messages.HeartbeatResponse: ...

    def heartbeat_now(
        self, request: messages.HeartbeatRequest
    ) -> messages.HeartbeatResponse | None: ...

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse: ...

    async def classic_join(
        self, request: messages.ClassicJoinRequest
    ) -> messages.ClassicJoinResponse: ...

    async def classic_sync(
        self, request: messages.ClassicSyncRequest
    ) -> messages.ClassicSyncResponse: ...

    async def classic_heartbeat(
        self, request: messages.ClassicHeartbeatRequest
    ) -> messages.ClassicHeartbeatResponse: ...

    async def classic_leave(
        self, request: messages.ClassicLeaveRequest
    ) -> messages.ClassicLeaveResponse: ...

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse: ...

    async def delete_offsets(
        self, request: messages.OffsetDeleteRequest
    ) -> messages.OffsetDeleteResponse: ...

    async def describe_group(self, group_id: str) -> messages.GroupDescription: ...

    async def list_groups(self) -> list[str]: ...

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None: ...

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None: ...

    def known_topics(self) -> Mapping[str, messages.TopicInfo]: ...

    async def list_offsets(
        self, wanted: Mapping[messages.TopicPartition, int], read_committed: bool
    ) -> Mapping[messages.TopicPartition, messages.ListedOffset]: ...


@dataclass(frozen=True)
class Node:
    """How clients reach this listener: the one node of its Metadata and FindCoordinator."""

    node_id: int
    host: str
    port: int


@dataclass
class Session:
    """One connection's state."""

    client_host: str
    # SASL: the mechanism chosen by SaslHandshake, then the authenticated group and token.
    mechanism: str | None = None
    principal: str | None = None
    password: str | None = None
    # Set by a handler whose response must be the connection's last (failed authentication).
    close_after_response: bool = False
    # The request being served ("DescribeGroupsRequest v5"), for the log of a failure.
    serving: str | None = None


Handler = Callable[["RequestContext", Any], Awaitable[Any]]


@dataclass(frozen=True)
class Translation:
    """An old version kio has no type for, served as version ``served_as``: ``read`` turns
    its body into kio's request of ``served_as`` (``cursor.Truncated``/``Malformed`` for bad
    bytes), and the response of ``served_as`` is encoded as the old version's is."""

    served_as: int
    read: Callable[[cursor.Cursor], Any]

    def read_request(self, payload: bytes) -> tuple[framing.RequestHeader, Any]:
        """Header (v1: old versions are never flexible) and translated body of a request
        frame; ``FrameError`` for bytes that do not read whole, as ``framing.read_request``."""
        fixed = framing.peek_request_header(payload)
        reader = cursor.Cursor(payload, _FIXED_HEADER_SIZE)
        try:
            client_id = reader.nullable_string()
            body = self.read(reader)
        except ValueError as error:
            raise framing.FrameError(
                f"malformed API key {fixed.api_key} v{fixed.api_version}: {error}"
            ) from None
        if reader.remaining:
            raise framing.FrameError(
                f"API key {fixed.api_key} v{fixed.api_version}: {reader.remaining} bytes "
                "after the request"
            )
        header = framing.RequestHeader(
            fixed.api_key, self.served_as, fixed.correlation_id, client_id
        )
        return header, body


@dataclass(frozen=True)
class Route:
    api_key: int
    min_version: int
    max_version: int
    handler: Handler
    # Served before SASL authentication (ApiVersions and the SASL APIs only, as Kafka).
    before_authentication: bool = False
    # Versions kio has no type for, read by translation (see ``Translation``).
    translations: Mapping[int, Translation] = field(default_factory=dict)
    # The answer without waiting, or None to leave the request to ``handler`` (see above).
    answer_now: Callable[[RequestContext, Any], Any] | None = None


@dataclass(frozen=True)
class Services:
    """What every connection shares."""

    coordinator: Coordinator
    token_store: tokens.TokenStore | None
    node: Node
    routes: Mapping[int, Route]
    cluster_id: str = "kafka-group-operator"
    # How long SaslAuthenticate waits for the tokens to load (see ``sasl``).
    loading_hold_s: float = 5.0
    # Who serves the groups of other state partitions (None: this listener serves all).
    peers: peers.Peers | None = None
    # Per API key: the most elements of named top-level request arrays (``wire.bounds``).
    caps: Mapping[int, Mapping[str, int]] = field(default_factory=dict)


@dataclass
class RequestContext:
    services: Services
    session: Session
    header: framing.RequestHeader
    _module: Any = field(default=None, repr=False)

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def coordinator(self) -> Coordinator:
        return self.services.coordinator

    def _response_module(self) -> Any:
        if self._module is None:
            schema = framing.response_type(self.header.api_key, self.header.api_version)
            self._module = sys.modules[schema.__module__]
        return self._module

    def response(self, **fields: Any) -> Any:
        """This version's response, from the fields it has (``throttle_time`` defaulted)."""
        schema = framing.response_type(self.header.api_key, self.header.api_version)
        fields.setdefault("throttle_time", NO_THROTTLE)
        return build(schema, fields)

    def nested(self, entity: str, /, **fields: Any) -> Any:
        """This version's nested response entity (e.g. ``MetadataResponseTopic``)."""
        return build(getattr(self._response_module(), entity), fields)

    def topic_ids(self) -> TopicIds:
        return topic_ids(self.coordinator.known_topics())

    def has_field(self, name: str) -> bool:
        schema = framing.response_type(self.header.api_key, self.header.api_version)
        return name in _field_names(schema)

    def authorize(self, group_id: str) -> None:
        """Raise ``GroupAuthorizationFailed`` unless this connection authenticated as the
        group (with its current token); every group is open without a token store."""
        store = self.services.token_store
        if store is None:
            return
        if self.session.principal != group_id:
            raise errors.GroupAuthorizationFailed(
                f"this connection is not authenticated as group {group_id!r}"
            )
        tokens.authorize(store, group_id, self.session.password)


@dataclass(frozen=True)
class TopicIds:
    """Topic names <-> ids (KIP-848 and recent offset APIs speak ids) of the known topics."""

    by_name: Mapping[str, uuid.UUID]
    by_id: Mapping[uuid.UUID, str]


_topic_ids_cache: tuple[Mapping[str, messages.TopicInfo], TopicIds] | None = None


def topic_ids(known: Mapping[str, messages.TopicInfo]) -> TopicIds:
    """The mapping of ``known`` (cached while the runtime keeps the same topics object)."""
    global _topic_ids_cache
    cached = _topic_ids_cache
    if cached is not None and cached[0] is known:
        return cached[1]
    by_name = {name: uuid.UUID(t.topic_id) for name, t in known.items() if t.topic_id}
    ids = TopicIds(by_name, {topic_id: name for name, topic_id in by_name.items()})
    _topic_ids_cache = (known, ids)
    return ids


def build(schema: type[Any], fields: Mapping[str, Any]) -> Any:
    names = _field_names(schema)
    return schema(**{name: value for name, value in fields.items() if name in names})


_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}


def _field_names(schema: type[Any]) -> frozenset[str]:
    names = _FIELD_NAMES.get(schema)
    if names is None:
        names = _FIELD_NAMES[schema] = frozenset(f.name for f in dataclasses.fields(schema))
    return names


def error_code(error: errors.CoordinatorError | None) -> ErrorCode:
    """Kafka's error code of ``error`` (``NONE`` for ``None``)."""
    return ErrorCode(0 if error is None else error.code)
