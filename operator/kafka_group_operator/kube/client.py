"""The operator's Kubernetes API client: raw JSON objects over ``kubernetes_asyncio``.

Every Kubernetes call of the operator goes through ``KubeClient``; the handlers never talk to
the API themselves. It is configured from the same credentials kopf logs in with
(``Credentials``, filled by the login handler), so the operator and kopf always reach the same
API server, whether in a cluster, through a kubeconfig or in tests. Objects are plain dicts,
exactly as the API serves them: the builders in ``manifests`` produce dicts too.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from kubernetes_asyncio import client as kube_client

from kafka_group_operator.kube import errors

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Credentials:
    """How to reach the API server (a copy of kopf's ``ConnectionInfo`` fields we use)."""

    server: str
    ca_path: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = None
    certificate_path: str | None = None
    certificate_data: bytes | None = None
    private_key_path: str | None = None
    private_key_data: bytes | None = None


@dataclass(frozen=True, slots=True)
class Kind:
    """Where a kind lives in the API: ``/api/v1`` or ``/apis/<group>/<version>``."""

    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
        if sub is not None:
            base += f"/{sub}"
        return base


STATEFUL_SETS = Kind("apps", "v1", "statefulsets")
SERVICES = Kind("", "v1", "services")
SECRETS = Kind("", "v1", "secrets")
PODS = Kind("", "v1", "pods")
CONSUMER_GROUPS = Kind("kafkagroups.io", "v1alpha1", "consumergroups")
OFFSET_SNAPSHOTS = Kind("kafkagroups.io", "v1alpha1", "offsetsnapshots")
LEASES = Kind("coordination.k8s.io", "v1", "leases")


class KubeClient:
    """Async CRUD on raw objects; errors become ``errors.KubeError`` subclasses."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self._api: Any = None
        # The latest credentials (kopf's login refreshes them): a client on another event
        # loop, such as the Lease elector's, builds its own connection from them.
        self.credentials: Credentials | None = None
        # The client reads certificates only from files; data is kept in temporary ones.
        self._files: list[Any] = []
        self._retired: list[Any] = []
        if credentials is not None:
            self.configure(credentials)

    def configure(self, credentials: Credentials) -> None:
        """(Re)build the underlying client for ``credentials`` (called on every kopf login)."""
        self.credentials = credentials
        configuration = kube_client.Configuration(host=credentials.server.rstrip("/"))
        configuration.verify_ssl = not credentials.insecure
        configuration.ssl_ca_cert = self._path_of(credentials.ca_path, credentials.ca_data)
        if credentials.token:
            configuration.api_key = {"BearerToken": credentials.token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        configuration.cert_file = self._path_of(
            credentials.certificate_path, credentials.certificate_data
        )
        configuration.key_file = self._path_of(
            credentials.private_key_path, credentials.private_key_data
        )
        if self._api is not None:
            # Calls in flight may still use it; it is closed with this client.
            self._retired.append(self._api)
        self._api = kube_client.ApiClient(configuration)

    def _path_of(self, path: str | None, data: bytes | None) -> str | None:
        if path or not data:
            return path
        handle = tempfile.NamedTemporaryFile(suffix=".pem")  # noqa: SIM115 - lives with us
        handle.write(data)
        handle.flush()
        self._files.append(handle)
        return handle.name

    @property
    def configured(self) -> bool:
        return self._api is not None

    async def close(self) -> None:
        for api in [*self._retired, self._api]:
            if api is not None:
                await api.close()
        self._retired.clear()
        self._api = None
        for handle in self._files:
            handle.close()
        self._files.clear()

    async def get(self, kind: Kind, namespace: str | None, name: str) -> JSON:
        return await self._call("GET", kind.path(namespace, name))

    async def get_or_none(self, kind: Kind, namespace: str | None, name: str) -> JSON | None:
        try:
            return await self.get(kind, namespace, name)
        except errors.NotFound:
            return None

    async def list(
        self, kind: Kind, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[JSON]:
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else {}
        listing = await self._call("GET", kind.path(namespace), query=query)
        items = [item for item in listing.get("items") or [] if isinstance(item, dict)]
        # Filter here as well: the selector is advisory for some API servers (and test mocks).
        if labels:
            items = [
                item
                for item in items
                if all(
                    (item.get("metadata", {}).get("labels") or {}).get(k) == v
                    for k, v in labels.items()
                )
            ]
        return items

    async def list_versioned(self, kind: Kind, namespace: str | None) -> tuple[Sequence[JSON], str]:
        """Every object of ``kind`` and the list's resourceVersion (to ``watch`` from)."""
        listing = await self._call("GET", kind.path(namespace))
        items = [item for item in listing.get("items") or [] if isinstance(item, dict)]
        version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        return items, version

    async def watch(
        self, kind: Kind, namespace: str | None, resource_version: str, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, JSON]]:
        """The changes of ``kind`` after ``resource_version``: (``ADDED``, ``MODIFIED`` or
        ``DELETED``, the object), until the server ends the watch (after about
        ``timeout_s``). ``errors.Expired`` when the version is too old (list again); other
        failures as for every call."""
        if self._api is None:
            raise errors.Unreachable("the Kubernetes client is not configured yet (no login)")
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
            "allowWatchBookmarks": "true",
        }
        path = f"{kind.path(namespace)}?{urlencode(query)}"
        try:
            response = await self._api.call_api(
                path,
                "GET",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(
                    total=timeout_s + 30, sock_connect=10, sock_read=timeout_s + 30
                ),
            )
        except (TimeoutError, OSError, aiohttp.ClientError) as error:
            raise errors.Unreachable(f"GET {path}: {error}") from error
        try:
            if response.status == 410:
                raise errors.Expired(f"GET {path}: HTTP 410 (resourceVersion too old)", 410)
            if not 200 <= response.status < 300:
                body = (await response.read()).decode(errors="replace")
                raise _status_error(response.status, body, "GET", path)
            async for line in response.content:
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError as error:
                    raise errors.KubeError(f"GET {path}: a watch event is not JSON") from error
                kind_of_event = event.get("type") if isinstance(event, dict) else None
                changed = event.get("object") if isinstance(event, dict) else None
                if not isinstance(kind_of_event, str) or not isinstance(changed, dict):
                    raise errors.KubeError(f"GET {path}: a malformed watch event")
                if kind_of_event == "ERROR":
                    code = int(changed.get("code") or 0)
                    message = f"GET {path}: {changed.get('message') or 'watch error'}"
                    if code == 410:
                        raise errors.Expired(message, 410)
                    raise errors.KubeError(message, code)
                yield kind_of_event, changed
        except (TimeoutError, OSError, aiohttp.ClientError) as error:
            raise errors.Unreachable(f"GET {path}: {error}") from error
        finally:
            response.release()

    async def create(self, kind: Kind, namespace: str | None, body: Mapping[str, Any]) -> JSON:
        return await self._call("POST", kind.path(namespace), body=dict(body))

    async def patch(
        self, kind: Kind, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> JSON:
        """A JSON merge patch (RFC 7386): maps merge, lists are replaced."""
        return await self._call(
            "PATCH", kind.path(namespace, name), body=dict(patch), content_type=MERGE_PATCH
        )

    async def replace(
        self, kind: Kind, namespace: str | None, name: str, body: Mapping[str, Any]
    ) -> JSON:
        """Replace the object (HTTP PUT, the ``update`` verb) with ``body``.

        ``body``'s ``metadata.resourceVersion`` makes it conditional: the API server applies it
        only to that version of the object and answers 409 (``errors.Conflict``) otherwise.
        """
        return await self._call("PUT", kind.path(namespace, name), body=dict(body))

    async def patch_status(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> JSON:
        """Merge ``status`` into the status subresource.

        With ``resource_version``, the API server applies it only to that version of the
        object (optimistic concurrency) and answers 409 (``errors.Conflict``) otherwise.
        """
        body: JSON = {"status": dict(status)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._call(
            "PATCH", kind.path(namespace, name, "status"), body=body, content_type=MERGE_PATCH
        )

    async def delete(self, kind: Kind, namespace: str | None, name: str) -> None:
        try:
            await self._call("DELETE", kind.path(namespace, name))
        except errors.NotFound:
            return

    async def kind_exists(self, kind: Kind) -> bool:
        """Whether the API serves ``kind`` (e.g. whether a CRD is installed)."""
        version = f"/api/{kind.version}" if not kind.group else f"/apis/{kind.group}/{kind.version}"
        try:
            listing = await self._call("GET", version)
        except errors.NotFound:
            return False
        return any(item.get("name") == kind.plural for item in listing.get("resources") or [])

    async def _call(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        if self._api is None:
            raise errors.Unreachable("the Kubernetes client is not configured yet (no login)")
        if query:
            path = f"{path}?{urlencode(query)}"
        try:
            data = await self._api.call_api(
                path,
                method,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map={200: "object", 201: "object", 202: "object"},
                _return_http_data_only=True,
            )
        except kube_client.ApiException as error:
            raise _wrap(error, method, path) from error
        except (TimeoutError, OSError, aiohttp.ClientError) as error:
            raise errors.Unreachable(f"{method} {path}: {error}") from error
        return data if isinstance(data, dict) else {}


def _wrap(error: Any, method: str, path: str) -> errors.KubeError:
    status = int(error.status or 0)
    detail = str(error.reason or "")
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        detail = json.loads(error.body or "{}").get("message") or detail
    return _status_error(status, detail, method, path)


def _status_error(status: int, detail: str, method: str, path: str) -> errors.KubeError:
    if detail.startswith("{"):
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            detail = json.loads(detail).get("message") or detail
    message = f"{method} {path}: HTTP {status} {detail}".strip()
    if status == 404:
        return errors.NotFound(message, status)
    if status == 409:
        return errors.Conflict(message, status)
    if status in (400, 422):
        return errors.Invalid(message, status)
    if status == 403:
        return errors.Forbidden(message, status)
    if status == 0:
        return errors.Unreachable(message, status)
    return errors.KubeError(message, status)
