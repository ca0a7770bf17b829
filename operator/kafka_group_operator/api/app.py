"""The member API's aiohttp application: routes, authentication and error mapping.

``build_app(runtime, token_store)`` serves the coordinator ``runtime`` (any object with the
``Coordinator`` methods below, normally ``runtime.coordinator_runtime.CoordinatorRuntime``)
over HTTP. Handlers are thin: decode with ``wire``, call the runtime, encode the reply.

Every failure leaves as a Kafka-style error body ``{"error", "code", "message"}``: a
``CoordinatorError`` with its own HTTP status, a malformed body, group or query as 400
``INVALID_REQUEST``, anything unexpected as a logged 500 ``UNKNOWN_SERVER_ERROR``.

With a ``discovery.Directory`` (coordinators that split the state topic), a
``NOT_COORDINATOR`` body also names the group's coordinator, ``"coordinator": {"partition",
"url"}``, and ``GET /v1/groups/{group}/coordinator`` answers who it is.

With an internal token, the internal API (``api.internal``: the control plane's calls on the
groups served here) is served under ``/internal/v1``, authenticated by that token instead of
the group tokens.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from kafka_group_operator.access import discovery, tokens
from kafka_group_operator.api import internal, openapi, wire
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.runtime import coordinator_runtime

logger = logging.getLogger(__name__)

# Heartbeats and commits are small; anything larger is a mistake or an attack.
MAX_BODY_BYTES = 1024 * 1024
_T = TypeVar("_T")
# A member's heartbeat, commit or fetch that meets its group's partition loading is held until
# the load ends, at most this long, before COORDINATOR_LOAD_IN_PROGRESS: a member backs off up
# to a second between retries, so an immediate refusal would leave it waiting for its next
# attempt after the load (a takeover's load takes about a second). The Kafka listener answers
# at once, as Kafka's coordinator does.
LOAD_WAIT_S = 2.0


class Coordinator(Protocol):
    """What the API needs from the coordinator runtime."""

    async def heartbeat(self, request: messages.HeartbeatRequest) -> messages.HeartbeatResponse: ...

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse: ...

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse: ...

    async def describe_group(self, group_id: str) -> messages.GroupDescription: ...

    async def delete_offsets(
        self, request: messages.OffsetDeleteRequest
    ) -> messages.OffsetDeleteResponse: ...

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None: ...

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None: ...

    async def group_lag(self, group_id: str) -> dict[tuple[str, int], int]: ...

    async def group_lag_report(self, group_id: str) -> coordinator_runtime.GroupLag:
        """The lag from cached log ends and their age; never waits for the brokers."""
        ...

    def unhealthy_partitions(self) -> list[int]:
        """State partitions that cannot serve until the process restarts (a task of theirs
        died, or their load failed for good); empty while all serve."""
        ...

    async def list_groups(self) -> list[str]: ...

    async def read_fence(self, group_id: str, all_partitions: bool = False) -> dict[int, int]:
        """Load markers appended through the coordinator's writer; their offsets."""
        ...

    async def until_loaded(self, group_id: str, timeout_s: float) -> None:
        """Return once the group's partition is not loading, or after ``timeout_s``."""
        ...


COORDINATOR_KEY = web.AppKey("coordinator", Coordinator)
TOKENS_KEY = web.AppKey("tokens", tokens.TokenStore)
DIRECTORY_KEY = web.AppKey("directory", discovery.Directory)
_OPENAPI_KEY = web.AppKey("openapi", bytes)
_PUBLIC_PATHS = frozenset({"/healthz", "/openapi.json"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error_response(error: errors.CoordinatorError, status: int | None = None) -> web.Response:
    headers = {"Retry-After": "1"} if error.retriable and error.http_status == 503 else None
    return web.json_response(
        wire.error_body(error), status=status or error.http_status, headers=headers
    )


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except errors.GroupAuthorizationFailed as error:
        # No credentials at all is 401 (with the challenge); wrong credentials are 403.
        if tokens.bearer_token(request.headers.get("Authorization")) is None:
            response = _error_response(error, status=401)
            response.headers["WWW-Authenticate"] = 'Bearer realm="kafka-group-operator"'
            return response
        return _error_response(error)
    except errors.NotCoordinator as error:
        response = _error_response(error)
        hint = _coordinator_hint(request)
        if hint is not None:
            response.text = json.dumps({**wire.error_body(error), "coordinator": hint})
        return response
    except errors.CoordinatorError as error:
        return _error_response(error)
    except web.HTTPException as http_error:
        if http_error.status < 400:
            raise
        # Routing errors (404 unknown path, 405 wrong method) in the same error shape; a 405
        # keeps the Allow header RFC 9110 requires.
        routing = errors.InvalidRequest(f"{request.method} {request.path}: {http_error.reason}")
        allow = {"Allow": http_error.headers["Allow"]} if "Allow" in http_error.headers else None
        return web.json_response(wire.error_body(routing), status=http_error.status, headers=allow)
    except Exception:
        logger.exception("unexpected failure serving %s %s", request.method, request.path)
        return web.json_response(
            wire.error_body(errors.CoordinatorError("internal error, see the coordinator log")),
            status=500,
        )


def _coordinator_hint(request: web.Request) -> dict[str, object] | None:
    """Where the group of ``request`` is coordinated, for a NOT_COORDINATOR body; None when
    no directory is configured or the path names no (valid) group."""
    directory = request.app.get(DIRECTORY_KEY)
    raw_group = request.match_info.get("group")
    if directory is None or raw_group is None:
        return None
    try:
        owner = directory.owner(wire.group_id(raw_group))
    except errors.CoordinatorError:
        return None
    # A fenced partition is in our set but served elsewhere now: we do not know where.
    url = None if owner.is_self else owner.url
    return {"partition": owner.partition, "url": url}


def _auth_middleware(store: tokens.TokenStore | None) -> Middleware:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        group = request.match_info.get("group")
        if internal.is_internal(request.path):
            # Routed only when an internal token is configured (else a 404).
            if internal.INTERNAL_TOKEN_KEY in request.app:
                internal.authorize(request)
        elif store is not None and group is not None and request.path not in _PUBLIC_PATHS:
            # Before the coordinator check, on every replica (``access.tokens`` says why).
            await tokens.authenticate(
                store, group, tokens.bearer_token(request.headers.get("Authorization"))
            )
        return await handler(request)

    return authenticate


async def _json_body(request: web.Request) -> object:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise errors.InvalidRequest(f"body larger than {MAX_BODY_BYTES} bytes")
    # read(n) returns what has arrived, up to n bytes: a large body takes several reads.
    raw = bytearray()
    while chunk := await request.content.read(MAX_BODY_BYTES + 1 - len(raw)):
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise errors.InvalidRequest(f"body larger than {MAX_BODY_BYTES} bytes")
    return wire.parse_json(bytes(raw))


def _coordinator(request: web.Request) -> Coordinator:
    return request.app[COORDINATOR_KEY]


def _group(request: web.Request) -> str:
    return wire.group_id(request.match_info["group"])


def _client_host(request: web.Request) -> str:
    return request.remote or ""


async def _served(request: web.Request, group_id: str, call: Callable[[], Awaitable[_T]]) -> _T:
    """``call()``; met by a load, once more after it (``LOAD_WAIT_S``)."""
    try:
        return await call()
    except errors.CoordinatorLoadInProgress:
        await _coordinator(request).until_loaded(group_id, LOAD_WAIT_S)
        return await call()


async def _heartbeat(request: web.Request) -> web.Response:
    heartbeat = wire.decode_heartbeat(
        _group(request), await _json_body(request), _client_host(request)
    )
    coordinator = _coordinator(request)
    response = await _served(request, heartbeat.group_id, lambda: coordinator.heartbeat(heartbeat))
    return web.json_response(wire.encode_heartbeat(response))


async def _commit(request: web.Request) -> web.Response:
    commit = wire.decode_commit(_group(request), await _json_body(request))
    coordinator = _coordinator(request)
    response = await _served(request, commit.group_id, lambda: coordinator.commit_offsets(commit))
    return web.json_response(wire.encode_commit(response))


async def _fetch(request: web.Request) -> web.Response:
    query: Mapping[str, list[str]] = {
        key: request.query.getall(key) for key in set(request.query.keys())
    }
    fetch = wire.decode_fetch(_group(request), query)
    coordinator = _coordinator(request)
    response = await _served(request, fetch.group_id, lambda: coordinator.fetch_offsets(fetch))
    return web.json_response(wire.encode_fetch(response))


async def _delete_offsets(request: web.Request) -> web.Response:
    """Kafka's OffsetDelete: ``?partition=topic:0&partition=topic:1`` (at least one)."""
    query: Mapping[str, list[str]] = {
        key: request.query.getall(key) for key in set(request.query.keys())
    }
    delete = wire.decode_offset_delete(_group(request), query)
    coordinator = _coordinator(request)
    response = await _served(request, delete.group_id, lambda: coordinator.delete_offsets(delete))
    return web.json_response(wire.encode_offset_delete(response))


async def _delete_group(request: web.Request) -> web.Response:
    """Kafka's DeleteGroups for one group: its offsets and membership go; refused while it
    has members (NON_EMPTY_GROUP), or when a ConsumerGroup resource owns it."""
    group = _group(request)
    coordinator = _coordinator(request)

    async def delete() -> None:
        owner = await coordinator.group_owner(group)
        if owner is not None:
            # Its lifecycle is the resource's: deleting the group is deleting the resource.
            raise errors.GroupAuthorizationFailed(
                f"group {group!r} is managed by ConsumerGroup {owner.namespace}/{owner.name}: "
                "delete that resource instead"
            )
        await coordinator.delete_group(messages.DeleteGroupRequest(group))

    await _served(request, group, delete)
    return web.json_response({"groupId": group, "deleted": True})


async def _describe(request: web.Request) -> web.Response:
    group = _group(request)
    coordinator = _coordinator(request)
    description = await coordinator.describe_group(group)
    report = await coordinator.group_lag_report(group)
    return web.json_response(
        wire.encode_description(description, report.lag, report.log_end_age_ms)
    )


async def _list(request: web.Request) -> web.Response:
    """The groups this caller may see: with tokens, those whose token it presents."""
    coordinator = _coordinator(request)
    store = request.app.get(TOKENS_KEY)
    presented = tokens.bearer_token(request.headers.get("Authorization"))
    if store is not None and presented is None:
        raise errors.GroupAuthorizationFailed(
            "missing bearer token: send 'Authorization: Bearer <a group token>'"
        )
    listed = []
    authorized = store is None
    for group_id in await coordinator.list_groups():
        if store is not None:
            try:
                tokens.authorize(store, group_id, presented)
            except errors.GroupAuthorizationFailed:
                continue
            authorized = True
        try:
            description = await coordinator.describe_group(group_id)
        except errors.GroupIdNotFound:  # expired or deleted since it was listed
            continue
        listed.append(
            {
                "groupId": description.group_id,
                "state": description.state,
                "members": len(description.members),
                "groupEpoch": description.group_epoch,
                "assignor": description.assignor,
            }
        )
    if not authorized:
        # A token that opens no group is a wrong token, not an empty list (Kafka refuses a
        # principal without DESCRIBE on any group the same way for a named group).
        raise errors.GroupAuthorizationFailed(
            "the token is not valid for any group this coordinator serves"
        )
    return web.json_response({"groups": listed})


async def _read_fence(request: web.Request) -> web.Response:
    """A job's read fence (the body is optional: ``{}`` fences the group's partition)."""
    group = _group(request)
    raw = await _json_body(request) if request.can_read_body else {}
    ends = await _coordinator(request).read_fence(group, wire.decode_read_fence(raw))
    return web.json_response(wire.encode_read_fence(ends))


async def _find_coordinator(request: web.Request) -> web.Response:
    """The group's coordinator, from the partition set and the peers map (no state read)."""
    group = _group(request)
    directory = request.app.get(DIRECTORY_KEY)
    if directory is None:
        # Serving every partition, on whatever URL the caller used.
        return web.json_response({"partition": None, "url": None, "self": True})
    owner = directory.owner(group)
    return web.json_response(
        {"partition": owner.partition, "url": owner.url, "self": owner.is_self}
    )


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[_OPENAPI_KEY], content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    # Such a state partition serves none of its groups until the process restarts; failing
    # the liveness probe makes Kubernetes restart the pod, which loads it afresh.
    unhealthy = _coordinator(request).unhealthy_partitions()
    if unhealthy:
        return web.json_response(
            {"status": "unhealthy", "unhealthyPartitions": sorted(unhealthy)}, status=503
        )
    return web.json_response({"status": "ok"})


def build_app(
    runtime: Coordinator,
    token_store: tokens.TokenStore | None,
    directory: discovery.Directory | None = None,
    internal_coordinator: internal.InProcessCoordinator | None = None,
    internal_token: str | None = None,
) -> web.Application:
    """The member API over ``runtime``; ``token_store=None`` serves without authentication;
    ``directory`` names the coordinators of the partitions ``runtime`` does not serve; with
    ``internal_coordinator`` (the same runtime) and ``internal_token``, the internal API."""
    app = web.Application(
        middlewares=[_errors_middleware, _auth_middleware(token_store)],
        client_max_size=MAX_BODY_BYTES,
    )
    app[COORDINATOR_KEY] = runtime
    if token_store is not None:
        app[TOKENS_KEY] = token_store
    if directory is not None:
        app[DIRECTORY_KEY] = directory
    # The document of this server: its security is the one it runs with.
    app[_OPENAPI_KEY] = json.dumps(openapi.document(token_store is not None)).encode()
    app.router.add_post("/v1/groups/{group}/heartbeat", _heartbeat)
    app.router.add_post("/v1/groups/{group}/offsets", _commit)
    app.router.add_get("/v1/groups/{group}/offsets", _fetch)
    app.router.add_delete("/v1/groups/{group}/offsets", _delete_offsets)
    app.router.add_post("/v1/groups/{group}/read-fence", _read_fence)
    app.router.add_get("/v1/groups/{group}/coordinator", _find_coordinator)
    app.router.add_get("/v1/groups/{group}", _describe)
    app.router.add_delete("/v1/groups/{group}", _delete_group)
    if internal_coordinator is not None:
        if not internal_token:
            raise ValueError("the internal API needs an internal token")
        internal.add_routes(app, internal_coordinator, internal_token)
        app.router.add_get(f"{internal.PREFIX}/groups/{{group}}/coordinator", _find_coordinator)
    app.router.add_get("/v1/groups", _list)
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_get("/healthz", _health)
    return app
