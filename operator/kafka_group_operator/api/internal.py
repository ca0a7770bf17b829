"""The internal API: what the control plane asks of the replica that coordinates a group.

With several replicas, kopf's handlers run on one of them while each group is coordinated by
the holder of its state partition. The handlers reach that replica here, under
``/internal/v1/groups/{group}/...``, with the replicas' shared internal token as bearer (never
a group token: members cannot configure, delete or release groups).

Only the local runtime answers. A group whose partition is not served here is answered
``NOT_COORDINATOR`` (with the directory's hint, as the member API does), never forwarded, so a
request cannot loop between replicas.

``InProcessCoordinator`` is the same set of calls on the local runtime; the internal API is
that object over HTTP. Calls that only change this process's memory (the group's token, its
offset mirror) also check that the group's partition is served here (a token or a mirror
given is kept, one taken away is dropped, either way), so that the caller learns who the
coordinator is and goes on there.

One call is not a group's: ``POST /internal/v1/read-fence`` with ``{"partitions": [...]}``
fences state partitions served here (a load marker appended to each, as a job's read fence;
``wire.encode_read_fence``'s answer). It is all or nothing: one partition not served here
fails the whole call with the error saying why (``NOT_COORDINATOR`` for one served
elsewhere), and no marker is appended. The control plane asks each partition's coordinator
for its own, for a compaction over every partition (``jobs.compaction``).

Bodies are JSON, camelCase, validated as strictly as the member API's (``wire``): a malformed
one is a 400 ``INVALID_REQUEST`` naming the field. A mirror target travels without Kafka
client settings: those are the operator's own, the same on every replica, so each replica
uses its own and no credential crosses the wire.
"""

from __future__ import annotations

import decimal
import hmac
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from kafka_group_operator.access import tokens
from kafka_group_operator.api import wire
from kafka_group_operator.coordinator import errors, messages
from kafka_group_operator.runtime import mirror

PREFIX = "/internal/v1"
Json = dict[str, Any]


class MirrorControl(Protocol):
    """The runtime's offset mirror, as the control plane drives it."""

    def configure(self, group_id: str, target: mirror.MirrorTarget | None) -> None: ...

    def remove(self, group_id: str) -> None: ...

    def status(self, group_id: str) -> mirror.MirrorStatus | None: ...

    async def flush(self, group_id: str) -> mirror.MirrorStatus | None: ...


class GroupCalls(Protocol):
    """The calls on a group that the control plane makes, whether the coordinator is in this
    process (``GroupAdmin``) or behind the internal API (``handlers.coordinator_port``)."""

    async def configure_group(self, settings: messages.GroupSettings) -> None: ...

    async def describe_group(self, group_id: str) -> messages.GroupDescription: ...

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse: ...

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse: ...

    async def group_lag(self, group_id: str) -> dict[tuple[str, int], int]: ...

    async def remove_members(
        self, request: messages.RemoveMembersRequest
    ) -> dict[str, str | None]: ...

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None: ...

    async def claim_group(self, request: messages.ClaimGroupRequest) -> messages.GroupOwner: ...

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None: ...

    async def release_group(self, request: messages.ReleaseGroupRequest) -> bool: ...


class PartitionFences(Protocol):
    """A read fence over chosen state partitions (``CoordinatorRuntime.read_fence_partitions``,
    or each partition's coordinator through the internal API): the exclusive end a reader must
    cover in each, past every write its coordinator acknowledged before the call."""

    async def read_fence(self, partitions: Collection[int]) -> dict[int, int]: ...


class GroupAdmin(GroupCalls, Protocol):
    """What the control plane needs from a coordinator runtime (``CoordinatorRuntime``)."""

    @property
    def mirror(self) -> MirrorControl: ...

    async def read_fence_partitions(self, partitions: Collection[int]) -> dict[int, int]: ...


class MutableTokens(tokens.TokenStore, Protocol):
    def set(self, group_id: str, token: str) -> None: ...

    def discard(self, group_id: str) -> None: ...


@dataclass
class InProcessCoordinator:
    """The control plane's calls on the runtime of this process (see the module docstring).

    ``kafka_config`` completes mirror targets: the operator's own Kafka client settings.
    """

    runtime: GroupAdmin
    tokens: MutableTokens
    kafka_config: Mapping[str, str] = field(default_factory=dict)

    async def serves(self, group_id: str) -> None:
        """Nothing if the group's partition is served here; else the coordinator error
        saying why (``NOT_COORDINATOR``, ``COORDINATOR_LOAD_IN_PROGRESS``)."""
        await self.runtime.group_owner(group_id)

    async def configure_group(self, settings: messages.GroupSettings) -> None:
        await self.runtime.configure_group(settings)

    async def describe_group(self, group_id: str) -> messages.GroupDescription:
        return await self.runtime.describe_group(group_id)

    async def fetch_offsets(
        self, request: messages.OffsetFetchRequest
    ) -> messages.OffsetFetchResponse:
        return await self.runtime.fetch_offsets(request)

    async def commit_offsets(
        self, request: messages.OffsetCommitRequest
    ) -> messages.OffsetCommitResponse:
        return await self.runtime.commit_offsets(request)

    async def group_lag(self, group_id: str) -> dict[tuple[str, int], int]:
        return await self.runtime.group_lag(group_id)

    async def remove_members(self, request: messages.RemoveMembersRequest) -> dict[str, str | None]:
        return await self.runtime.remove_members(request)

    async def group_owner(self, group_id: str) -> messages.GroupOwner | None:
        return await self.runtime.group_owner(group_id)

    async def claim_group(self, request: messages.ClaimGroupRequest) -> messages.GroupOwner:
        return await self.runtime.claim_group(request)

    async def delete_group(self, request: messages.DeleteGroupRequest) -> None:
        await self.runtime.delete_group(request)

    async def release_group(self, request: messages.ReleaseGroupRequest) -> bool:
        return await self.runtime.release_group(request)

    async def read_fence(self, partitions: Collection[int]) -> dict[int, int]:
        return await self.runtime.read_fence_partitions(partitions)

    async def configure_mirror(self, group_id: str, target: mirror.MirrorTarget | None) -> None:
        await self.serves(group_id)
        if target is not None:
            target = mirror.MirrorTarget(
                target.bootstrap_servers,
                dict(self.kafka_config),
                target.interval_seconds,
                target.request_timeout_seconds,
            )
        self.runtime.mirror.configure(group_id, target)

    async def mirror_status(self, group_id: str) -> mirror.MirrorStatus | None:
        await self.serves(group_id)
        return self.runtime.mirror.status(group_id)

    async def remove_mirror(self, group_id: str) -> None:
        # Stopped here whoever serves the group (one left from before a failover must stop);
        # then the caller learns whether the coordinator is elsewhere, to stop it there too.
        self.runtime.mirror.remove(group_id)
        await self.serves(group_id)

    async def flush_mirror(self, group_id: str) -> mirror.MirrorStatus | None:
        await self.serves(group_id)
        return await self.runtime.mirror.flush(group_id)

    async def set_token(self, group_id: str, token: str) -> None:
        self.tokens.set(group_id, token)
        await self.serves(group_id)

    async def discard_token(self, group_id: str) -> None:
        self.tokens.discard(group_id)
        await self.serves(group_id)


# --- JSON codecs (both directions; the remote client decodes what the server encodes) ---


def _fail(name: str, expected: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(f"{name}: expected {expected}")


def _object(value: object, name: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(name, "an object")
    return value


def _string(value: object, name: str, *, optional: bool = False, empty: bool = True) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not empty and not value):
        raise _fail(name, "a string" if empty else "a non-empty string")
    return value


def _integer(value: object, name: str, minimum: int = -(2**63), maximum: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise _fail(name, f"an integer in [{minimum}, {maximum}]")
    return value


def _number(value: object) -> float | None:
    """A JSON number as a float (``wire.parse_json`` reads fractions as ``Decimal``)."""
    if isinstance(value, bool) or not isinstance(value, int | float | decimal.Decimal):
        return None
    return float(value)


def _seconds(value: object, name: str) -> float:
    seconds = _number(value)
    if seconds is None:
        raise _fail(name, "a number of seconds")
    if not math.isfinite(seconds) or not 0 < seconds <= 86_400:
        raise _fail(name, "a number of seconds in (0, 86400]")
    return seconds


def _strings(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _fail(name, "an array of strings")
    return tuple(_string(item, f"{name}[]") for item in value)


def encode_settings(settings: messages.GroupSettings) -> Json:
    return {
        "assignor": settings.assignor,
        "sessionTimeoutMs": settings.session_timeout_ms,
        "rebalanceTimeoutMs": settings.rebalance_timeout_ms,
        "heartbeatIntervalMs": settings.heartbeat_interval_ms,
        "offsetsRetentionMs": settings.offsets_retention_ms,
        "assignmentPaused": settings.assignment_paused,
        "topics": list(settings.topics),
        "clientAssignment": settings.client_assignment,
    }


def decode_settings(group_id: str, value: object) -> messages.GroupSettings:
    body = _object(value, "body")
    paused = body.get("assignmentPaused")
    if not isinstance(paused, bool):
        raise _fail("assignmentPaused", "a boolean")
    # Absent from replicas that predate it: Server.
    client_assignment = body.get("clientAssignment", False)
    if not isinstance(client_assignment, bool):
        raise _fail("clientAssignment", "a boolean")
    return messages.GroupSettings(
        group_id=group_id,
        assignor=_string(body.get("assignor"), "assignor", empty=False),
        session_timeout_ms=_integer(body.get("sessionTimeoutMs"), "sessionTimeoutMs", 1),
        rebalance_timeout_ms=_integer(body.get("rebalanceTimeoutMs"), "rebalanceTimeoutMs", 1),
        heartbeat_interval_ms=_integer(body.get("heartbeatIntervalMs"), "heartbeatIntervalMs", 1),
        offsets_retention_ms=_integer(body.get("offsetsRetentionMs"), "offsetsRetentionMs", 1),
        assignment_paused=paused,
        topics=_strings(body.get("topics"), "topics"),
        client_assignment=client_assignment,
    )


def _encode_member(member: messages.MemberDescription) -> Json:
    return {
        "memberId": member.member_id,
        "instanceId": member.instance_id,
        "rack": member.rack_id,
        "memberEpoch": member.member_epoch,
        "state": member.state,
        "subscribedTopicNames": list(member.subscribed_topic_names),
        "assignment": wire.encode_partitions(member.assignment),
        "targetAssignment": wire.encode_partitions(member.target_assignment),
        "partitionsPendingRevocation": wire.encode_partitions(member.partitions_pending_revocation),
        "clientId": member.client_id,
        "clientHost": member.client_host,
        "classic": member.classic,
        "sessionExpiresInMs": member.session_expires_in_ms,
    }


def _decode_member(value: object, name: str) -> messages.MemberDescription:
    body = _object(value, name)
    classic = body.get("classic", False)
    if not isinstance(classic, bool):
        raise _fail(f"{name}.classic", "a boolean")
    return messages.MemberDescription(
        member_id=_string(body.get("memberId"), f"{name}.memberId"),
        instance_id=_string(body.get("instanceId"), f"{name}.instanceId", optional=True),
        rack_id=_string(body.get("rack"), f"{name}.rack", optional=True),
        member_epoch=_integer(body.get("memberEpoch"), f"{name}.memberEpoch"),
        state=_string(body.get("state"), f"{name}.state"),
        subscribed_topic_names=_strings(
            body.get("subscribedTopicNames"), f"{name}.subscribedTopicNames"
        ),
        assignment=wire.decode_partitions(body.get("assignment"), f"{name}.assignment"),
        target_assignment=wire.decode_partitions(
            body.get("targetAssignment"), f"{name}.targetAssignment"
        ),
        partitions_pending_revocation=wire.decode_partitions(
            body.get("partitionsPendingRevocation"), f"{name}.partitionsPendingRevocation"
        ),
        client_id=_string(body.get("clientId", ""), f"{name}.clientId"),
        client_host=_string(body.get("clientHost", ""), f"{name}.clientHost"),
        classic=classic,
        session_expires_in_ms=_optional_integer(
            body.get("sessionExpiresInMs"), f"{name}.sessionExpiresInMs"
        ),
    )


def _optional_integer(value: object, name: str) -> int | None:
    return None if value is None else _integer(value, name, 0)


def encode_description(description: messages.GroupDescription) -> Json:
    return {
        "groupId": description.group_id,
        "state": description.state,
        "groupEpoch": description.group_epoch,
        "assignmentEpoch": description.assignment_epoch,
        "assignor": description.assignor,
        "sessionTimeoutMs": description.session_timeout_ms,
        "members": [_encode_member(member) for member in description.members],
        "groupType": description.group_type,
        "protocolType": description.protocol_type,
    }


def decode_description(value: object) -> messages.GroupDescription:
    body = _object(value, "body")
    members = body.get("members")
    if not isinstance(members, list):
        raise _fail("members", "an array")
    return messages.GroupDescription(
        group_id=_string(body.get("groupId"), "groupId"),
        state=_string(body.get("state"), "state"),
        group_epoch=_integer(body.get("groupEpoch"), "groupEpoch"),
        assignment_epoch=_integer(body.get("assignmentEpoch"), "assignmentEpoch"),
        assignor=_string(body.get("assignor"), "assignor"),
        session_timeout_ms=_optional_integer(body.get("sessionTimeoutMs"), "sessionTimeoutMs"),
        members=tuple(
            _decode_member(member, f"members[{index}]") for index, member in enumerate(members)
        ),
        # Absent from replicas that predate classic groups: a consumer group.
        group_type=_string(body.get("groupType", "consumer"), "groupType"),
        protocol_type=_string(body.get("protocolType", "consumer"), "protocolType"),
    )


def decode_fetch_response(value: object) -> messages.OffsetFetchResponse:
    """The inverse of ``wire.encode_fetch``."""
    entries = _object(value, "body").get("offsets")
    if not isinstance(entries, list):
        raise _fail("offsets", "an array")
    offsets: dict[messages.TopicPartition, messages.CommittedOffset] = {}
    for index, entry_value in enumerate(entries):
        name = f"offsets[{index}]"
        entry = _object(entry_value, name)
        key = (
            _string(entry.get("topic"), f"{name}.topic"),
            _integer(entry.get("partition"), f"{name}.partition", 0),
        )
        offsets[key] = messages.CommittedOffset(
            offset=_integer(entry.get("offset"), f"{name}.offset"),
            metadata=_string(entry.get("metadata"), f"{name}.metadata"),
            leader_epoch=_integer(entry.get("leaderEpoch"), f"{name}.leaderEpoch"),
            commit_timestamp=_integer(entry.get("commitTimestamp"), f"{name}.commitTimestamp"),
        )
    return messages.OffsetFetchResponse(offsets)


def decode_commit_response(value: object) -> messages.OffsetCommitResponse:
    """The inverse of ``wire.encode_commit``."""
    entries = _object(value, "body").get("errors")
    if not isinstance(entries, list):
        raise _fail("errors", "an array")
    failed: dict[messages.TopicPartition, str] = {}
    for index, entry_value in enumerate(entries):
        name = f"errors[{index}]"
        entry = _object(entry_value, name)
        key = (
            _string(entry.get("topic"), f"{name}.topic"),
            _integer(entry.get("partition"), f"{name}.partition", 0),
        )
        failed[key] = _string(entry.get("error"), f"{name}.error")
    return messages.OffsetCommitResponse(errors=failed)


def encode_lag(lag: Mapping[messages.TopicPartition, int]) -> Json:
    return {
        "lag": [
            {"topic": topic, "partition": partition, "lag": value}
            for (topic, partition), value in sorted(lag.items())
        ]
    }


def decode_lag(value: object) -> dict[tuple[str, int], int]:
    entries = _object(value, "body").get("lag")
    if not isinstance(entries, list):
        raise _fail("lag", "an array")
    lag: dict[tuple[str, int], int] = {}
    for index, entry_value in enumerate(entries):
        name = f"lag[{index}]"
        entry = _object(entry_value, name)
        key = (
            _string(entry.get("topic"), f"{name}.topic"),
            _integer(entry.get("partition"), f"{name}.partition", 0),
        )
        lag[key] = _integer(entry.get("lag"), f"{name}.lag")
    return lag


def encode_owner(owner: messages.GroupOwner | None) -> Json | None:
    if owner is None:
        return None
    return {"namespace": owner.namespace, "name": owner.name, "uid": owner.uid}


def decode_owner(value: object, name: str = "owner") -> messages.GroupOwner | None:
    if value is None:
        return None
    body = _object(value, name)
    return messages.GroupOwner(
        namespace=_string(body.get("namespace"), f"{name}.namespace", empty=False),
        name=_string(body.get("name"), f"{name}.name", empty=False),
        uid=_string(body.get("uid"), f"{name}.uid"),
    )


# A state topic has far fewer partitions (Kafka's __consumer_offsets has 50).
MAX_FENCE_PARTITIONS = 10_000


def encode_fence_request(partitions: Collection[int]) -> Json:
    return {"partitions": sorted(set(partitions))}


def decode_fence_request(value: object) -> tuple[int, ...]:
    """``{"partitions": [0, 3]}``: a non-empty array of distinct partition numbers (whether
    each is one of the topic's is the runtime's to say)."""
    body = _object(value, "body")
    unknown = sorted(set(body) - {"partitions"})
    if unknown:
        shown = ", ".join(ascii(name)[1:-1][:64] for name in unknown[:5])
        raise errors.InvalidRequest(f"unknown field(s): {shown}")
    raw = body.get("partitions")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_FENCE_PARTITIONS:
        raise _fail("partitions", f"an array of 1 to {MAX_FENCE_PARTITIONS} partition numbers")
    partitions = tuple(_integer(item, "partitions[]", 0, 2**31 - 1) for item in raw)
    if len(set(partitions)) != len(partitions):
        raise _fail("partitions", "distinct partition numbers")
    return partitions


def decode_fence_response(value: object, asked: Collection[int]) -> dict[int, int]:
    """The inverse of ``wire.encode_read_fence``, checked to cover exactly ``asked``."""
    raw = _object(value, "body").get("endOffsets")
    ends: dict[int, int] = {}
    for key, end in _object(raw, "endOffsets").items():
        if not isinstance(key, str) or not (key.isascii() and key.isdigit() and len(key) <= 10):
            raise _fail("endOffsets", "partition numbers as keys")
        ends[int(key)] = _integer(end, f"endOffsets.{key}", 0)
    if set(ends) != set(asked):
        raise errors.CoordinatorError(
            f"a read fence of partitions {sorted(set(asked))} answered for {sorted(ends)}"
        )
    return ends


def encode_mirror_target(target: mirror.MirrorTarget) -> Json:
    return {
        "bootstrapServers": target.bootstrap_servers,
        "intervalSeconds": target.interval_seconds,
        "requestTimeoutSeconds": target.request_timeout_seconds,
    }


def decode_mirror_target(value: object) -> mirror.MirrorTarget:
    body = _object(value, "body")
    return mirror.MirrorTarget(
        bootstrap_servers=_string(body.get("bootstrapServers"), "bootstrapServers", empty=False),
        interval_seconds=_seconds(body.get("intervalSeconds"), "intervalSeconds"),
        request_timeout_seconds=_seconds(
            body.get("requestTimeoutSeconds"), "requestTimeoutSeconds"
        ),
    )


def encode_mirror_status(status: mirror.MirrorStatus | None) -> Json:
    if status is None:
        return {"status": None}
    return {
        "status": {
            "reason": status.reason.value,
            "message": status.message,
            "behind": status.behind,
            "failures": status.failures,
            "caughtUpAt": status.caught_up_at,
        }
    }


def decode_mirror_status(value: object) -> mirror.MirrorStatus | None:
    raw = _object(value, "body").get("status")
    if raw is None:
        return None
    body = _object(raw, "status")
    try:
        reason = mirror.MirrorReason(body.get("reason"))
    except ValueError:
        raise _fail("status.reason", "a mirror reason") from None
    raw_time = body.get("caughtUpAt")
    caught_up_at = None if raw_time is None else _number(raw_time)
    if raw_time is not None and (caught_up_at is None or not math.isfinite(caught_up_at)):
        raise _fail("status.caughtUpAt", "a time or null")
    return mirror.MirrorStatus(
        reason=reason,
        message=_string(body.get("message"), "status.message"),
        behind=_integer(body.get("behind"), "status.behind", 0),
        failures=_integer(body.get("failures"), "status.failures", 0),
        caught_up_at=caught_up_at,
    )


# --- the server side ---

INTERNAL_KEY = web.AppKey("internal", InProcessCoordinator)
INTERNAL_TOKEN_KEY = web.AppKey("internal_token", str)


def is_internal(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def authorize(request: web.Request) -> None:
    """The internal token, or 401 (none presented) / 403 (another one)."""
    presented = tokens.bearer_token(request.headers.get("Authorization"))
    expected = request.app[INTERNAL_TOKEN_KEY]
    if presented is None or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise errors.GroupAuthorizationFailed(
            "the internal API needs the replicas' internal token"
            if presented is None
            else "wrong internal token"
        )


def _local(request: web.Request) -> InProcessCoordinator:
    return request.app[INTERNAL_KEY]


def _group(request: web.Request) -> str:
    return wire.group_id(request.match_info["group"])


async def _body(request: web.Request) -> object:
    return wire.parse_json(await request.read())


async def _configure(request: web.Request) -> web.Response:
    await _local(request).configure_group(decode_settings(_group(request), await _body(request)))
    return web.json_response({})


async def _describe(request: web.Request) -> web.Response:
    return web.json_response(
        encode_description(await _local(request).describe_group(_group(request)))
    )


async def _fetch(request: web.Request) -> web.Response:
    response = await _local(request).fetch_offsets(messages.OffsetFetchRequest(_group(request)))
    return web.json_response(wire.encode_fetch(response))


async def _commit(request: web.Request) -> web.Response:
    commit = wire.decode_commit(_group(request), await _body(request))
    return web.json_response(wire.encode_commit(await _local(request).commit_offsets(commit)))


async def _lag(request: web.Request) -> web.Response:
    return web.json_response(encode_lag(await _local(request).group_lag(_group(request))))


async def _remove_members(request: web.Request) -> web.Response:
    body = _object(await _body(request), "body")
    instance_ids = _strings(body.get("instanceIds"), "instanceIds")
    results = await _local(request).remove_members(
        messages.RemoveMembersRequest(_group(request), instance_ids)
    )
    return web.json_response({"results": results})


async def _owner(request: web.Request) -> web.Response:
    owner = await _local(request).group_owner(_group(request))
    return web.json_response({"owner": encode_owner(owner)})


async def _claim(request: web.Request) -> web.Response:
    owner = decode_owner(_object(await _body(request), "body").get("owner"))
    if owner is None:
        raise _fail("owner", "an object")
    claimed = await _local(request).claim_group(messages.ClaimGroupRequest(_group(request), owner))
    return web.json_response({"owner": encode_owner(claimed)})


async def _release(request: web.Request) -> web.Response:
    body = _object(await _body(request), "body")
    released = await _local(request).release_group(
        messages.ReleaseGroupRequest(_group(request), _string(body.get("ownerUid"), "ownerUid"))
    )
    return web.json_response({"released": released})


async def _delete(request: web.Request) -> web.Response:
    body = _object(await _body(request), "body")
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise _fail("force", "a boolean")
    await _local(request).delete_group(
        messages.DeleteGroupRequest(
            _group(request),
            force=force,
            owner_uid=_string(body.get("ownerUid"), "ownerUid", optional=True),
        )
    )
    return web.json_response({})


async def _put_mirror(request: web.Request) -> web.Response:
    target = decode_mirror_target(await _body(request))
    await _local(request).configure_mirror(_group(request), target)
    return web.json_response({})


async def _get_mirror(request: web.Request) -> web.Response:
    status = await _local(request).mirror_status(_group(request))
    return web.json_response(encode_mirror_status(status))


async def _delete_mirror(request: web.Request) -> web.Response:
    await _local(request).remove_mirror(_group(request))
    return web.json_response({})


async def _flush_mirror(request: web.Request) -> web.Response:
    status = await _local(request).flush_mirror(_group(request))
    return web.json_response(encode_mirror_status(status))


async def _put_token(request: web.Request) -> web.Response:
    token = _string(_object(await _body(request), "body").get("token"), "token", empty=False)
    await _local(request).set_token(_group(request), token)
    return web.json_response({})


async def _delete_token(request: web.Request) -> web.Response:
    await _local(request).discard_token(_group(request))
    return web.json_response({})


async def _read_fence(request: web.Request) -> web.Response:
    partitions = decode_fence_request(await _body(request))
    return web.json_response(wire.encode_read_fence(await _local(request).read_fence(partitions)))


def add_routes(app: web.Application, local: InProcessCoordinator, internal_token: str) -> None:
    """Serve the internal API on ``app`` (``GET .../coordinator`` is added by ``app``)."""
    if not internal_token:
        raise ValueError("the internal API needs a non-empty internal token")
    app[INTERNAL_KEY] = local
    app[INTERNAL_TOKEN_KEY] = internal_token
    group = f"{PREFIX}/groups/{{group}}"
    router = app.router
    router.add_put(f"{group}/settings", _configure)
    router.add_get(group, _describe)
    router.add_get(f"{group}/offsets", _fetch)
    router.add_post(f"{group}/offsets", _commit)
    router.add_get(f"{group}/lag", _lag)
    router.add_post(f"{group}/remove-members", _remove_members)
    router.add_get(f"{group}/owner", _owner)
    router.add_post(f"{group}/owner", _claim)
    router.add_post(f"{group}/release", _release)
    router.add_post(f"{group}/delete", _delete)
    router.add_put(f"{group}/mirror", _put_mirror)
    router.add_get(f"{group}/mirror", _get_mirror)
    router.add_delete(f"{group}/mirror", _delete_mirror)
    router.add_post(f"{group}/mirror/flush", _flush_mirror)
    router.add_put(f"{group}/token", _put_token)
    router.add_delete(f"{group}/token", _delete_token)
    router.add_post(f"{PREFIX}/read-fence", _read_fence)
