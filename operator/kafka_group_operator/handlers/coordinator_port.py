"""The control plane's port to the group coordinator: the handlers never assume it is in-process.

With several operator replicas, kopf's handlers run on one of them while each group is
coordinated by whichever replica holds its state partition's Lease. ``CoordinatorPort`` is
every call the handlers make on a group; three implementations:

* ``api.internal.InProcessCoordinator``: the runtime of this process (one replica, or a group
  whose partition this replica serves);
* ``RemoteCoordinator``: the internal API of one replica, over HTTP;
* ``RoutingCoordinator``: what the handlers use. It tries the local runtime first; a group
  it does not serve (``NOT_COORDINATOR``) goes to its coordinator, found as a Kafka client
  finds one: ask a replica (``GET /internal/v1/groups/{g}/coordinator`` on the Service's URL),
  send there, follow the ``NOT_COORDINATOR`` hints, and keep the answer until the next
  ``NOT_COORDINATOR`` or a connection failure. A coordinator that cannot be found is
  ``COORDINATOR_NOT_AVAILABLE``, which the handlers retry like any coordinator error.

A read fence over state partitions (the scheduled compaction's, over every partition) is
not a group's call: each partition is fenced by its own coordinator, found as a group of that
partition is (``partition_probe`` names one), all asked at once. A partition whose
coordinator cannot be found or does not answer fails the call with ``PartitionsNotFenced``,
naming each such partition and why, and the caller tries again later; the partitions that
were fenced only got a marker, which changes no state.

A group's token and its offset mirror live in the memory of the replica that coordinates it,
not in the state topic. So the router remembers the last token and mirror target it was given
for each group and hands them again to the first coordinator it reaches the group on after a
change or a failure (a replica restarted under its own name and address too): after a
failover the new coordinator gets them on the control plane's next call, at the latest the
status daemon's (every ``statusIntervalSeconds``).
"""

from __future__ import annotations

import asyncio
import functools
import urllib.parse
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import aiohttp

from kafka_group_operator.api import internal, wire
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.runtime import coordinator_runtime, mirror
from kafka_group_records import partitioning

T = TypeVar("T")

# How many NOT_COORDINATOR hints one call follows before giving up (then it is retried).
MAX_HOPS = 3
# Above the mirror's own request timeout (10 s), as a flush waits for one attempt.
REQUEST_TIMEOUT_SECONDS = 30.0


class CoordinatorPort(internal.GroupCalls, internal.PartitionFences, Protocol):
    """Every call the control plane makes on a group's coordinator: the group calls, its
    offset mirror and token, which live in the coordinator's memory, and read fences over
    state partitions."""

    async def configure_mirror(self, group_id: str, target: mirror.MirrorTarget | None) -> None: ...

    async def mirror_status(self, group_id: str) -> mirror.MirrorStatus | None: ...

    async def remove_mirror(self, group_id: str) -> None: ...

    async def flush_mirror(self, group_id: str) -> mirror.MirrorStatus | None: ...

    async def set_token(self, group_id: str, token: str) -> None: ...

    async def discard_token(self, group_id: str) -> None: ...


class CoordinatorMoved(errors.NotCoordinator):
    """NOT_COORDINATOR naming the group's coordinator (``url``)."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url


class PartitionsNotFenced(errors.CoordinatorNotAvailable):
    """Some state partitions could not be fenced (``failed``: partition -> why); retriable."""

    def __init__(self, failed: dict[int, errors.CoordinatorError]) -> None:
        reasons = "; ".join(
            f"{partition}: {error.name}: {error}" for partition, error in sorted(failed.items())
        )
        super().__init__(
            f"no read fence for state partitions {sorted(failed)} (retry later): {reasons}"
        )
        self.failed = failed


@functools.cache
def partition_probe(partition: int, partitions: int) -> str:
    """A group id on state partition ``partition`` of ``partitions``: who coordinates it
    coordinates the partition (the directories answer for groups)."""
    if not 0 <= partition < partitions:
        raise ValueError(f"state partition {partition} is outside 0-{partitions - 1}")
    index = 0
    while partitioning.partition_for(f"kgo-partition-{partition}.{index}", partitions) != partition:
        index += 1
    return f"kgo-partition-{partition}.{index}"


def _quoted(group_id: str) -> str:
    return urllib.parse.quote(group_id, safe="")


@dataclass
class RemoteCoordinator:
    """The internal API of the replica at ``url`` (see ``api.internal``)."""

    url: str
    internal_token: str
    session: aiohttp.ClientSession

    async def _request(self, method: str, group_id: str, path: str = "", body: Any = None) -> Any:
        return await self._send(method, f"/groups/{_quoted(group_id)}{path}", body)

    async def _send(self, method: str, path: str, body: Any = None) -> Any:
        target = f"{self.url}{internal.PREFIX}{path}"
        headers = {"Authorization": f"Bearer {self.internal_token}"}
        try:
            async with self.session.request(
                method,
                target,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
            ) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as error:
            raise errors.CoordinatorNotAvailable(
                f"the coordinator at {self.url} cannot be reached: {error or type(error).__name__}"
            ) from error
        try:
            decoded = wire.parse_json(raw) if raw else {}
        except errors.InvalidRequest:
            decoded = None
        if 200 <= status < 300 and isinstance(decoded, dict):
            return decoded
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), str):
            error_class = errors.BY_NAME.get(decoded["error"], errors.CoordinatorError)
            message = str(decoded.get("message", ""))
            hint = decoded.get("coordinator")
            hinted = hint.get("url") if isinstance(hint, dict) else None
            if issubclass(error_class, errors.NotCoordinator) and isinstance(hinted, str):
                raise CoordinatorMoved(message, hinted)
            if status == 404 and error_class is errors.InvalidRequest:
                # The route itself is missing: a replica without the internal API.
                raise errors.CoordinatorNotAvailable(
                    f"{self.url} serves no internal API: {message}"
                )
            raise error_class(message)
        raise errors.CoordinatorNotAvailable(f"HTTP {status} from the coordinator at {self.url}")

    async def find(self, group_id: str) -> str:
        """The URL of ``group_id``'s coordinator, as this replica knows it."""
        found = await self._request("GET", group_id, "/coordinator")
        url = found.get("url")
        if found.get("self") is True:
            return url if isinstance(url, str) and url else self.url
        if isinstance(url, str) and url:
            return url
        raise errors.CoordinatorNotAvailable(
            f"{self.url} does not know who coordinates partition {found.get('partition')}"
        )

    async def configure_group(self, settings: messages.GroupSettings) -> None:
        await self._request(
            "PUT", settings.group_id, "/settings", internal.encode_settings(settings)
        )

    async def describe_group(self, group_id: str) -> messages.GroupDescription:
        return internal.decode_description(await self._request("GET", group_id))

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse:
        if request.partitions is not None or request.member_id is not None:
            raise errors.InvalidRequest("the internal API fetches a group's offsets whole")
        return internal.decode_fetch_response(
            await self._request("GET", request.group_id, "/offsets")
        )

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse:
        body = {
            "memberId": request.member_id,
            "memberEpoch": request.member_epoch,
            "offsets": [
                {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset.offset,
                    "metadata": offset.metadata,
                    "leaderEpoch": offset.leader_epoch,
                }
                for (topic, partition), offset in sorted(request.offsets.items())
            ],
        }
        return internal.decode_commit_response(
            await self._request("POST", request.group_id, "/offsets", body)
        )

    async def group_lag(self, group_id: str) -> dict[tuple[str, int], int]:
        return internal.decode_lag(await self._request("GET", group_id, "/lag"))

    async def remove_members(self, request: messages.RemoveMembersRequest) -> dict[str, str | None]:
        answer = await self._request(
            "POST",
            request.group_id,
            "/remove-members",
            {"instanceIds": list(request.instance_ids)},
        )
        results = answer.get("results")
        if not isinstance(results, dict) or not all(
            isinstance(value, str | None) for value in results.values()
        ):
            raise errors.CoordinatorError("malformed remove-members answer")
        return {str(key): value for key, value in results.items()}

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None:
        return internal.decode_owner((await self._request("GET", group_id, "/owner")).get("owner"))

    async def claim_group(self, request: messages.ClaimGroupRequest) -> messages.GroupOwner:
        answer = await self._request(
            "POST", request.group_id, "/owner", {"owner": internal.encode_owner(request.owner)}
        )
        owner = internal.decode_owner(answer.get("owner"))
        if owner is None:
            raise errors.CoordinatorError("the claim was answered without an owner")
        return owner

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None:
        await self._request(
            "POST",
            request.group_id,
            "/delete",
            {"force": request.force, "ownerUid": request.owner_uid},
        )

    async def release_group(self, request: messages.ReleaseGroupRequest) -> bool:
        answer = await self._request(
            "POST", request.group_id, "/release", {"ownerUid": request.owner_uid}
        )
        return answer.get("released") is True

    async def read_fence(self, partitions: Collection[int]) -> dict[int, int]:
        answer = await self._send("POST", "/read-fence", internal.encode_fence_request(partitions))
        return internal.decode_fence_response(answer, partitions)

    async def configure_mirror(self, group_id: str, target: mirror.MirrorTarget | None) -> None:
        if target is None:
            await self.remove_mirror(group_id)
            return
        await self._request("PUT", group_id, "/mirror", internal.encode_mirror_target(target))

    async def mirror_status(self, group_id: str) -> mirror.MirrorStatus | None:
        return internal.decode_mirror_status(await self._request("GET", group_id, "/mirror"))

    async def remove_mirror(self, group_id: str) -> None:
        await self._request("DELETE", group_id, "/mirror")

    async def flush_mirror(self, group_id: str) -> mirror.MirrorStatus | None:
        return internal.decode_mirror_status(await self._request("POST", group_id, "/mirror/flush"))

    async def set_token(self, group_id: str, token: str) -> None:
        await self._request("PUT", group_id, "/token", {"token": token})

    async def discard_token(self, group_id: str) -> None:
        await self._request("DELETE", group_id, "/token")


# Where a group was last reached: "local", or a remote coordinator's URL.
LOCAL = "local"


@dataclass
class _Desired:
    """What a group's coordinator must hold in memory, whoever it is."""

    token: str | None = None
    mirror: mirror.MirrorTarget | None = None
    # The endpoint that has it (None: none yet).
    given_to: str | None = None


@dataclass
class RoutingCoordinator:
    """The handlers' port: the local runtime, else the group's coordinator (module docstring).

    Without ``discovery_url`` (a single replica, or no internal token) every call is local,
    and a group served elsewhere fails with ``NOT_COORDINATOR`` as the runtime says.
    ``advertised_url`` is this replica's own address: a hint naming it means the local runtime.
    ``state_partitions`` is the state topic's partition count (for ``read_fence``).
    """

    local: internal.InProcessCoordinator
    discovery_url: str | None = None
    internal_token: str | None = None
    advertised_url: str | None = None
    state_partitions: int | None = None
    _session: aiohttp.ClientSession | None = field(default=None, init=False)
    _owners: dict[str, str] = field(default_factory=dict, init=False)
    _desired: dict[str, _Desired] = field(default_factory=dict, init=False)

    def _remote(self, url: str) -> RemoteCoordinator:
        assert self.internal_token is not None
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return RemoteCoordinator(url, self.internal_token, self._session)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def owner_url(self, group_id: str) -> str | None:
        """Where the group was last reached: ``LOCAL``, a URL, or None (not yet)."""
        return self._owners.get(group_id)

    async def _route(
        self,
        group_id: str,
        call: Callable[[CoordinatorPort], Awaitable[T]],
        *,
        replay: bool = True,
    ) -> T:
        cached = self._owners.get(group_id)
        if cached is None or cached == LOCAL:
            try:
                await self._give(group_id, LOCAL, self.local, replay)
                result = await call(self.local)
            except errors.NotCoordinator:
                self._forget(group_id)
                if self.discovery_url is None or self.internal_token is None:
                    raise
            else:
                self._owners[group_id] = LOCAL
                return result
        url = self._owners.get(group_id)
        for _ in range(MAX_HOPS):
            if url is None:
                found = await self._remote(self.discovery_url or "").find(group_id)
                url = LOCAL if found == self.advertised_url else found
            remote: CoordinatorPort = self.local if url == LOCAL else self._remote(url)
            try:
                await self._give(group_id, url, remote, replay)
                result = await call(remote)
            except CoordinatorMoved as moved:
                self._forget(group_id)
                url = LOCAL if moved.url == self.advertised_url else moved.url
                continue
            except (errors.NotCoordinator, errors.CoordinatorNotAvailable):
                # Gone, or no longer the coordinator without naming the next: ask anew.
                self._forget(group_id)
                raise
            self._owners[group_id] = url
            return result
        self._forget(group_id)
        raise errors.CoordinatorNotAvailable(
            f"the coordinator of {group_id} moved {MAX_HOPS} times in one call; retry"
        )

    def _forget(self, group_id: str) -> None:
        """After a failure: the next coordinator reached, even at the same address (a replica
        restarted under its name), is handed the group's token and mirror again."""
        self._owners.pop(group_id, None)
        desired = self._desired.get(group_id)
        if desired is not None:
            desired.given_to = None

    async def _give(
        self, group_id: str, endpoint: str, target: CoordinatorPort, replay: bool
    ) -> None:
        """Hand ``endpoint`` the group's token and mirror target if it has not got them."""
        desired = self._desired.get(group_id)
        if not replay or desired is None or desired.given_to == endpoint:
            return
        if desired.token is not None:
            await target.set_token(group_id, desired.token)
        if desired.mirror is not None:
            await target.configure_mirror(group_id, desired.mirror)
        desired.given_to = endpoint

    async def configure_group(self, settings: messages.GroupSettings) -> None:
        await self._route(settings.group_id, lambda port: port.configure_group(settings))

    async def describe_group(self, group_id: str) -> messages.GroupDescription:
        return await self._route(group_id, lambda port: port.describe_group(group_id))

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse:
        return await self._route(request.group_id, lambda port: port.fetch_offsets(request))

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse:
        return await self._route(request.group_id, lambda port: port.commit_offsets(request))

    async def group_lag(self, group_id: str) -> dict[tuple[str, int], int]:
        return await self._route(group_id, lambda port: port.group_lag(group_id))

    async def remove_members(self, request: messages.RemoveMembersRequest) -> dict[str, str | None]:
        return await self._route(request.group_id, lambda port: port.remove_members(request))

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None:
        return await self._route(group_id, lambda port: port.group_owner(group_id))

    async def claim_group(self, request: messages.ClaimGroupRequest) -> messages.GroupOwner:
        return await self._route(request.group_id, lambda port: port.claim_group(request))

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None:
        await self._route(request.group_id, lambda port: port.delete_group(request))

    async def release_group(self, request: messages.ReleaseGroupRequest) -> bool:
        return await self._route(request.group_id, lambda port: port.release_group(request))

    async def read_fence(self, partitions: Collection[int]) -> dict[int, int]:
        """Each partition fenced by its coordinator (module docstring); ``PartitionsNotFenced``
        when any could not be."""
        wanted = sorted(set(partitions))
        count = self.state_partitions
        if count is None:
            raise errors.CoordinatorNotAvailable("the state topic's partition count is not known")
        if not wanted or not all(0 <= partition < count for partition in wanted):
            raise errors.InvalidRequest(f"a read fence needs state partitions in 0-{count - 1}")
        outcomes = await asyncio.gather(
            *(self._fence_one(partition, count) for partition in wanted), return_exceptions=True
        )
        ends: dict[int, int] = {}
        failed: dict[int, errors.CoordinatorError] = {}
        for partition, outcome in zip(wanted, outcomes, strict=True):
            if isinstance(outcome, errors.CoordinatorError):
                failed[partition] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                ends[partition] = outcome
        if failed:
            raise PartitionsNotFenced(failed)
        return ends

    async def _fence_one(self, partition: int, count: int) -> int:
        probe = partition_probe(partition, count)
        try:
            fenced = await self._route(
                probe, lambda port: port.read_fence((partition,)), replay=False
            )
        except errors.NotCoordinator:
            # A coordinator remembered from an earlier fence that no longer is one: find the
            # partition's coordinator anew, once.
            fenced = await self._route(
                probe, lambda port: port.read_fence((partition,)), replay=False
            )
        return fenced[partition]

    async def configure_mirror(self, group_id: str, target: mirror.MirrorTarget | None) -> None:
        if target is None:
            await self.remove_mirror(group_id)
            return
        desired = self._desired.setdefault(group_id, _Desired())
        desired.mirror, desired.given_to = target, None
        # Handing the desired state over is the whole call.
        await self._route(group_id, _nothing)

    async def mirror_status(self, group_id: str) -> mirror.MirrorStatus | None:
        return await self._route(group_id, lambda port: port.mirror_status(group_id))

    async def remove_mirror(self, group_id: str) -> None:
        desired = self._desired.get(group_id)
        if desired is not None:
            desired.mirror = None
        # The local runtime stops its mirror of the group (one left from before a failover)
        # whether or not it serves the group; then the coordinator stops its own.
        await self._route(group_id, lambda port: port.remove_mirror(group_id), replay=False)

    async def flush_mirror(self, group_id: str) -> mirror.MirrorStatus | None:
        return await self._route(group_id, lambda port: port.flush_mirror(group_id))

    async def set_token(self, group_id: str, token: str) -> None:
        desired = self._desired.setdefault(group_id, _Desired())
        desired.token, desired.given_to = token, None
        # The control plane's own store keeps every token it set, whoever serves the group.
        self.local.tokens.set(group_id, token)
        await self._route(group_id, _nothing)

    async def discard_token(self, group_id: str) -> None:
        self._desired.pop(group_id, None)
        self.local.tokens.discard(group_id)
        await self._route(group_id, lambda port: port.discard_token(group_id), replay=False)


async def _nothing(_: CoordinatorPort) -> None:
    return None


class PortOwner(Protocol):
    """What ``port_of`` reads and sets: the running operator's state (``lifecycle``'s
    ``OperatorState``), described here so that this module need not import its user."""

    coordinators: RoutingCoordinator | None

    @property
    def config(self) -> operator_config.OperatorConfig: ...

    @property
    def runtime(self) -> coordinator_runtime.CoordinatorRuntime: ...

    @property
    def tokens(self) -> internal.MutableTokens: ...


def port_of(state: PortOwner) -> RoutingCoordinator:
    """The state's port, built on first use from its runtime, tokens and settings."""
    if state.coordinators is None:
        config = state.config
        local = internal.InProcessCoordinator(state.runtime, state.tokens, config.kafka_config)
        remote = config.internal_token is not None
        leases = config.leases
        state.coordinators = RoutingCoordinator(
            local,
            # The Service's URL: any replica answers who coordinates a group.
            discovery_url=config.coordinator_url if remote else None,
            internal_token=config.internal_token,
            advertised_url=(
                leases.peer_url.format(identity=leases.pod_name) if leases is not None else None
            ),
            state_partitions=config.state_partitions,
        )
    return state.coordinators


async def wait_for(call: Callable[[], Awaitable[T]], within: float, interval: float = 0.2) -> T:
    """``call`` until it stops failing with a retriable coordinator error (for tools and
    tests; the handlers have kopf's retries)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await call()
        except errors.CoordinatorError as error:
            if not error.retriable or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(interval)
