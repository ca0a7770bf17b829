"""The test API server's additions to kmock behave like a real API server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.kmock(cls=kube.ApiServer)]

PODS = "/api/v1/namespaces/ns/pods"


async def _request(
    api: kube.ApiServer, method: str, path: str, body: Any = None, content_type: str | None = None
) -> tuple[int, Any]:
    headers = {"Content-Type": content_type} if content_type else {}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"{str(api.url).rstrip('/')}{path}", data=json.dumps(body), headers=headers
        ) as response,
    ):
        return response.status, await response.json()


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"x": 1}}


async def test_uids_versions_and_generations(kmock: kube.ApiServer) -> None:
    status, created = await _request(kmock, "POST", PODS, _pod("p"))
    assert status == 200
    meta = created["metadata"]
    assert meta["uid"]
    assert meta["creationTimestamp"]
    assert meta["generation"] == 1
    _, labelled = await _request(
        kmock,
        "PATCH",
        f"{PODS}/p",
        {"metadata": {"labels": {"a": "b"}}},
        "application/merge-patch+json",
    )
    assert int(labelled["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert labelled["metadata"]["generation"] == 1
    _, respecced = await _request(
        kmock, "PATCH", f"{PODS}/p", {"spec": {"x": 2}}, "application/merge-patch+json"
    )
    assert respecced["metadata"]["generation"] == 2


async def test_failed_json_patch_test_is_422(kmock: kube.ApiServer) -> None:
    await _request(kmock, "POST", PODS, _pod("p"))
    patch = [
        {"op": "test", "path": "/spec/x", "value": 99},
        {"op": "replace", "path": "/spec/x", "value": 3},
    ]
    status, body = await _request(kmock, "PATCH", f"{PODS}/p", patch, "application/json-patch+json")
    assert status == 422, body
    assert kmock.get("v1/pods", "ns", "p")["spec"] == {"x": 1}  # type: ignore[index]


async def test_watch_from_a_resource_version_loses_nothing(kmock: kube.ApiServer) -> None:
    await _request(kmock, "POST", PODS, _pod("a"))
    _, listing = await _request(kmock, "GET", PODS)
    version = listing["metadata"]["resourceVersion"]
    # Changes between the list and the watch must be replayed by the watch.
    await _request(kmock, "POST", PODS, _pod("b"))
    await _request(kmock, "DELETE", f"{PODS}/a")
    seen: list[tuple[str, str]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{str(kmock.url).rstrip('/')}{PODS}",
            params={"watch": "true", "resourceVersion": version},
        ) as response,
    ):

        async def read() -> None:
            async for line in response.content:
                if line.strip():
                    event = json.loads(line)
                    seen.append((event["type"], event["object"]["metadata"]["name"]))
                if len(seen) == 3:
                    return

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.2)
        await _request(kmock, "POST", PODS, _pod("c"))
        await asyncio.wait_for(reader, 5)
    assert seen == [("ADDED", "b"), ("DELETED", "a"), ("ADDED", "c")]
