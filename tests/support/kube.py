"""A Kubernetes API for kopf to run against in tests, and the operator running on it.

``ApiServer`` is kmock's ``KubernetesEmulator`` plus the API-server behaviour kopf relies on
and the emulator lacks: every object gets a ``uid``, a ``creationTimestamp`` and a
``generation`` (bumped on spec changes), and every change a new ``resourceVersion``; a
failed JSON-patch ``test`` answers 422 (not 500); lists carry a resourceVersion and a watch
from a resourceVersion replays what happened since, so no event is lost between a list and
its watch or across a reconnect; a PUT replaces an object (the ``update`` verb), refused with
409 when the body's resourceVersion is not the object's (what makes Leases locks).
``reject`` makes it refuse chosen requests with a chosen status (a 422 for an invalid
object, a 403 for a missing RBAC rule), as a real API server would, and counts them.

``RunningOperator`` runs the real operator (``kopf.operator`` with our handlers) in its own
thread and event loop, as kopf must not share pytest-asyncio's loop: kopf cancels tasks it
did not start when it stops.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import aiohttp
import aiohttp.web
import attrs
import jsonpatch
import kopf
from kmock._internal import aiobus, enums, k8s, references, rendering

from kafka_group_operator import handlers
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import lifecycle

T = TypeVar("T")

RESOURCES = {
    "kafkagroups.io/v1alpha1/consumergroups": dict(
        kind="ConsumerGroup",
        singular="consumergroup",
        shortnames={"cg"},
        categories={"kafkagroups"},
        subresources={"status", "scale"},
    ),
    "kafkagroups.io/v1alpha1/offsetsnapshots": dict(
        kind="OffsetSnapshot",
        singular="offsetsnapshot",
        shortnames={"osnap"},
        categories={"kafkagroups"},
        subresources={"status"},
    ),
    "apps/v1/statefulsets": dict(
        kind="StatefulSet", singular="statefulset", subresources={"status", "scale"}
    ),
    "v1/services": dict(kind="Service", singular="service", subresources={"status"}),
    "v1/secrets": dict(kind="Secret", singular="secret", subresources=set()),
    "v1/pods": dict(kind="Pod", singular="pod", subresources={"status"}),
    "v1/events": dict(kind="Event", singular="event", subresources=set()),
    "coordination.k8s.io/v1/leases": dict(kind="Lease", singular="lease", subresources=set()),
    # kopf's peering objects: replicas keep their keep-alives in the status.
    "kopf.dev/v1/clusterkopfpeerings": dict(
        kind="ClusterKopfPeering",
        singular="clusterkopfpeering",
        namespaced=False,
        subresources=set(),
    ),
    # kopf waits for these two to be discoverable before it watches anything.
    "v1/namespaces": dict(kind="Namespace", singular="namespace", namespaced=False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(
        kind="CustomResourceDefinition", singular="customresourcedefinition", namespaced=False
    ),
}
VERBS = {"get", "list", "watch", "create", "patch", "delete"}


@attrs.define(eq=False)
class RecordingBus(aiobus.Bus[Any]):
    """A watch bus that also keeps every event, keyed by resourceVersion, for replays."""

    counter: Any = None
    history: list[tuple[int, Any]] = attrs.field(factory=list)

    async def put(self, *items: Any) -> None:
        stamped = []
        for item in items:
            if item.get("type") == "DELETED":
                # A deletion is a change too; the object is gone, so only the event carries it.
                item = copy.deepcopy(item)
                item["object"].setdefault("metadata", {})["resourceVersion"] = str(
                    next(self.counter)
                )
            version = int(item["object"]["metadata"]["resourceVersion"])
            self.history.append((version, item))
            stamped.append(item)
        await super().put(*stamped)


@attrs.define(frozen=True)
class Rejection:
    """Requests of ``action`` on ``resource`` (``name`` or any) answered with ``status``."""

    resource: str
    action: str
    status: int
    reason: str
    message: str
    name: str | None = None


@attrs.define(kw_only=True)
class ApiServer(k8s.KubernetesEmulator):
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)
    rejections: list[Rejection] = attrs.field(factory=list, init=False)
    # How many requests each rejection refused.
    rejected: collections.Counter[Rejection] = attrs.field(factory=collections.Counter, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = collections.defaultdict(lambda: RecordingBus(counter=self._versions))
        for key, info in RESOURCES.items():
            self.resources[key] = k8s.KubernetesEmulator.ResourceInfo(
                **{"namespaced": True, "verbs": VERBS, **info}
            )

    def _next_version(self) -> str:
        return str(next(self._versions))

    def reject(
        self,
        resource: str,
        status: int,
        message: str,
        action: str = "create",
        name: str | None = None,
    ) -> Rejection:
        """Refuse ``action`` on ``resource`` (``name``, or any) with ``status`` from now on."""
        reasons = {400: "BadRequest", 403: "Forbidden", 422: "Invalid"}
        rejection = Rejection(resource, action, status, reasons.get(status, "Error"), message, name)
        self.rejections.append(rejection)
        return rejection

    def _rejection(self, request: rendering.Request) -> Rejection | None:
        # A create names its object in the body, every other request in the path.
        body = request.data if isinstance(request.data, dict) else {}
        name = request.name or (body.get("metadata") or {}).get("name")
        action = request.action
        if _is_replace(request):
            action = enums.action.UPDATE  # a PUT is an update too, for RBAC as for us
        for rejection in self.rejections:
            if (
                request.resource == references.resource(rejection.resource)
                and action == enums.action(rejection.action.upper())
                and rejection.name in (None, name)
            ):
                return rejection
        return None

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None:
            rejection = self._rejection(request)
            if rejection is not None:
                self.rejected[rejection] += 1
                return await self._render_error(
                    k8s.KubernetesError(
                        status=rejection.status, reason=rejection.reason, message=rejection.message
                    )
                )
            if _is_replace(request):
                return await self._replace(request)
            error = await self._prepare(request)
            if error is not None:
                return await self._render_error(error)
        return await super()._handle(request)

    async def _replace(self, request: rendering.Request) -> Any:
        """PUT: the body becomes the object, if its resourceVersion (when given) is current."""
        assert request.resource is not None
        assert request.name is not None
        body = request.data if isinstance(request.data, dict) else None
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            current = self._current(request)
            if current is None:
                error = k8s.KubernetesError(status=404, reason="NotFound", message="not found")
            elif body is None or (body.get("metadata") or {}).get("name") != request.name:
                error = k8s.KubernetesError(
                    status=400, reason="BadRequest", message="the body must name the object"
                )
            elif (body.get("metadata") or {}).get("resourceVersion") not in (
                None,
                current["metadata"].get("resourceVersion"),
            ):
                error = k8s.KubernetesError(
                    status=409, reason="Conflict", message="the object has been modified"
                )
            else:
                replaced = copy.deepcopy(body)
                metadata = replaced.setdefault("metadata", {})
                kept = ("uid", "creationTimestamp", "generation", "namespace")
                metadata.update(
                    {k: current["metadata"][k] for k in kept if k in current["metadata"]}
                )
                if replaced.get("spec") != current.get("spec"):
                    metadata["generation"] = current["metadata"].get("generation", 1) + 1
                metadata["resourceVersion"] = self._next_version()
                self.objects[key].create(replaced)
                raw = self.objects[key].raw
                await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
                return aiohttp.web.json_response(copy.deepcopy(raw))
        return await self._render_error(error)

    async def _prepare(self, request: rendering.Request) -> k8s.KubernetesError | None:
        """Stamp metadata into the request the emulator is about to apply."""
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            if "name" not in metadata and "generateName" in metadata:
                metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
            if request.namespace and "namespace" not in metadata:
                metadata["namespace"] = request.namespace
            metadata.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_version(),
                generation=1,
                creationTimestamp=_now(),
            )
        elif request.action == enums.action.UPDATE and request.name is not None:
            current = self._current(request)
            if current is None:
                return None  # the emulator answers 404
            if isinstance(request.data, list):
                try:
                    jsonpatch.apply_patch(current, request.data, in_place=False)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as failure:
                    return k8s.KubernetesError(status=422, reason="Invalid", message=str(failure))
                request.data.append(
                    {
                        "op": "add",
                        "path": "/metadata/resourceVersion",
                        "value": self._next_version(),
                    }
                )
                if request.subresource != "status" and any(
                    str(op.get("path", "")).startswith("/spec") for op in request.data
                ):
                    request.data.append(
                        {
                            "op": "add",
                            "path": "/metadata/generation",
                            "value": current["metadata"].get("generation", 1) + 1,
                        }
                    )
            elif isinstance(request.data, dict):
                metadata = request.data.setdefault("metadata", None) or {}
                request.data["metadata"] = metadata
                expected = metadata.get("resourceVersion")
                if expected is not None and expected != current["metadata"].get("resourceVersion"):
                    # A precondition on the version, as the API server checks it.
                    return k8s.KubernetesError(
                        status=409, reason="Conflict", message="the object has been modified"
                    )
                metadata["resourceVersion"] = self._next_version()
                if request.subresource != "status" and "spec" in request.data:
                    new_spec = jsonpatch.JsonPatch.from_diff(
                        current.get("spec") or {},
                        _merged(current.get("spec") or {}, request.data["spec"]),
                    )
                    if list(new_spec):
                        metadata["generation"] = current["metadata"].get("generation", 1) + 1
                if request.subresource == "status":
                    # The status subresource changes nothing but the status.
                    for key in [k for k in request.data if k not in ("status", "metadata")]:
                        del request.data[key]
        elif request.action == enums.action.DELETE and request.name is not None:
            current = self._current(request)
            meta = (current or {}).get("metadata", {})
            if current is not None and meta.get("finalizers") and not meta.get("deletionTimestamp"):
                # Mark for deletion as a change with its own resourceVersion.
                key = (request.resource, request.namespace, request.name)
                async with self._lock:
                    self.objects[key].patch(
                        {
                            "metadata": {
                                "deletionTimestamp": _now(),
                                "resourceVersion": self._next_version(),
                            }
                        }
                    )
                    raw = self.objects[key].raw
                    await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return None

    def _current(self, request: rendering.Request) -> dict[str, Any] | None:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    async def _serve_list(self, request: rendering.Request) -> Any:
        # Any version at or before the snapshot is safe: a watch from it replays the rest.
        async with self._lock:
            version = self._peek_version()
        payload = await super()._serve_list(request)
        payload["metadata"]["resourceVersion"] = version
        return payload

    def _peek_version(self) -> str:
        version = next(self._versions)
        # itertools.count cannot be peeked; the skipped number is simply never used.
        return str(version)

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        yield b""
        assert request.resource is not None
        bus = self._buses[request.resource]
        since = request.params.get("resourceVersion", "")
        check = self._KubernetesEmulator__check  # type: ignore[attr-defined]
        async with self._lock:
            # Mark the bus inside the lock: nothing can change between the replay and the stream.
            marker = await bus.mark()
            if since.isdigit():
                events = [event for version, event in bus.history if version > int(since)]
            else:
                objects = self._KubernetesEmulator__get_objs(request, strict=False)  # type: ignore[attr-defined]
                events = [
                    {"type": "ADDED", "object": obj.raw} for obj in objects if not obj.deleted
                ]
        try:
            for event in events:
                metadata = event["object"].get("metadata", {})
                if check(
                    request,
                    request.resource,
                    metadata.get("namespace"),
                    metadata.get("name"),
                    strict=False,
                ):
                    yield event
            async for event in bus.stream(since=marker):
                metadata = event["object"].get("metadata", {})
                if check(
                    request,
                    request.resource,
                    metadata.get("namespace"),
                    metadata.get("name"),
                    strict=False,
                ):
                    yield event
        finally:
            await bus.unmark(marker)

    # Conveniences for tests.
    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        key = (references.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)


def _is_replace(request: rendering.Request) -> bool:
    return (
        request.method == enums.method.PUT and request.name is not None and not request.subresource
    )


def _merged(base: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return patch
    result = dict(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merged(base.get(key), value)
    return result


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunningOperator:
    """The operator (kopf + our handlers + the embedded coordinator) in a thread of its own."""

    def __init__(
        self,
        config: operator_config.OperatorConfig,
        wait_for_coordinator: bool = True,
        peering: tuple[str, int] | None = None,
    ) -> None:
        self.config = config
        self.wait_for_coordinator = wait_for_coordinator
        # (name, priority) of a ClusterKopfPeering to join, as the chart's replicas do; None:
        # standalone.
        self.peering = peering
        self.memo = kopf.Memo()
        self.memo[lifecycle.CONFIG_KEY] = config
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="operator", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(
                kopf.operator(
                    standalone=self.peering is None,
                    peering_name=None if self.peering is None else self.peering[0],
                    priority=None if self.peering is None else self.peering[1],
                    clusterwide=True,
                    memo=self.memo,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                )
            )
        except BaseException as error:  # reported by __aexit__ / start
            self.error = error
        finally:
            loop.close()
            self._ready.set()

    async def __aenter__(self) -> RunningOperator:
        handlers.load()
        self._thread.start()
        await asyncio.to_thread(self._ready.wait, 60)
        if self.error is not None:
            raise RuntimeError(f"the operator failed to start: {self.error!r}") from self.error
        if not self.wait_for_coordinator:
            return self
        # Ready means kopf runs; the coordinator runs once it is stored in the memo, and
        # knows every group once it has read their tokens.
        await self.wait_for(lambda: lifecycle.started(self.memo) is not None, 60)
        await self.wait_for(lambda: self.state.tokens.loaded, 60)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._thread.is_alive():
            return  # stopped already (a test that restarts the operator)
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 60)
        assert not self._thread.is_alive(), "the operator did not stop"

    @property
    def state(self) -> lifecycle.OperatorState:
        return lifecycle.state_of(self.memo)

    @property
    def alive(self) -> bool:
        """Started and not stopped yet."""
        return self._thread.is_alive()

    async def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` in the operator's loop (where the runtime lives) and await it."""
        assert self._loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def wait_for(self, predicate: Any, within: float = 30, interval: float = 0.05) -> Any:
        """Poll ``predicate`` (sync or async) until it returns something truthy."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if self.error is not None:
                raise RuntimeError(f"the operator stopped: {self.error!r}") from self.error
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"condition not met within {within}s")
            await asyncio.sleep(interval)


def operator_config_for(
    api: ApiServer, bootstrap: str, **overrides: Any
) -> operator_config.OperatorConfig:
    """An operator on a fresh state topic and a free API port, talking to ``api``."""
    from kafka_group_operator.embedded import broker as embedded

    port = embedded.free_port()
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "state_topic": f"kgo-state-{uuid.uuid4().hex[:8]}",
        "state_partitions": 2,
        "api_host": "127.0.0.1",
        "api_port": port,
        "coordinator_url": f"http://127.0.0.1:{port}",
        "kafka_port": embedded.free_port(),
        "metrics_port": embedded.free_port(),
        "status_interval_seconds": 0.5,
        "kube_server": str(api.url).rstrip("/"),
        **overrides,
    }
    return operator_config.OperatorConfig(**settings)


async def api_call(api: ApiServer, method: str, path: str, body: Any = None) -> None:
    """One request to the API server as a client (kubectl) would send it; fails on an error."""
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"{str(api.url).rstrip('/')}{path}", json=body, headers=headers
        ) as response,
    ):
        assert response.status < 300, await response.text()
