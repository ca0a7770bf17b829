"""ApiVersions, Metadata and FindCoordinator: the listener presents itself as a one-node
cluster whose node coordinates every group.

When several coordinators split the state topic (``Services.peers``: a static map, or the
partition Leases' holders), FindCoordinator names each group's own coordinator
(``COORDINATOR_NOT_AVAILABLE``, retriable, for a partition no peer is known to serve: not in
the map, or between two holders of its Lease), and Metadata lists every coordinator as a
node (leading no partition), so that a client finds the coordinator it was sent to among
the nodes."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_group_operator.coordinator import errors
from kafka_group_operator.protocol import dispatch, peers

# FindCoordinator key types (Kafka's FindCoordinatorRequest.CoordinatorType).
GROUP_KEY_TYPE = 0

_NO_TOPIC_ID = uuid.UUID(int=0)


async def api_versions(ctx: dispatch.RequestContext, request: Any) -> Any:
    keys = [
        ctx.nested(
            "ApiVersion",
            api_key=route.api_key,
            min_version=route.min_version,
            max_version=route.max_version,
        )
        for route in sorted(ctx.services.routes.values(), key=lambda r: r.api_key)
    ]
    return ctx.response(
        error_code=ErrorCode.none,
        api_keys=tuple(keys),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )


async def metadata(ctx: dispatch.RequestContext, request: Any) -> Any:
    """This node and the cluster's topics as the coordinator last polled them; every
    partition's leader is this node (clients only need the names, counts and ids)."""
    node = ctx.services.node
    known = ctx.coordinator.known_topics()
    requested = request.topics
    if requested is None or (ctx.api_version == 0 and not requested):
        names = sorted(known)
    else:
        names = []
        for wanted in requested:
            name = wanted.name
            if name is None and getattr(wanted, "topic_id", None) is not None:
                name = next(
                    (n for n, t in known.items() if t.topic_id == str(wanted.topic_id)), None
                )
            names.append(name if name is not None else "")
    topics = []
    for name in names:
        info = known.get(name)
        if info is None:
            topics.append(
                ctx.nested(
                    "MetadataResponseTopic",
                    error_code=ErrorCode.unknown_topic_or_partition,
                    # Null (a topic asked by an unknown id) only where the version has it.
                    name=name or (None if ctx.api_version >= 12 else ""),
                    topic_id=_NO_TOPIC_ID,
                    is_internal=False,
                    partitions=(),
                    topic_authorized_operations=-2147483648,
                )
            )
            continue
        partitions = tuple(
            ctx.nested(
                "MetadataResponsePartition",
                error_code=ErrorCode.none,
                partition_index=index,
                leader_id=node.node_id,
                leader_epoch=-1,
                replica_nodes=(node.node_id,),
                isr_nodes=(node.node_id,),
                offline_replicas=(),
            )
            for index in range(info.num_partitions)
        )
        topics.append(
            ctx.nested(
                "MetadataResponseTopic",
                error_code=ErrorCode.none,
                name=name,
                topic_id=uuid.UUID(info.topic_id) if info.topic_id else _NO_TOPIC_ID,
                is_internal=False,
                partitions=partitions,
                topic_authorized_operations=-2147483648,
            )
        )
    brokers = tuple(
        ctx.nested(
            "MetadataResponseBroker",
            node_id=each.node_id,
            host=each.host,
            port=each.port,
            rack=None,
        )
        for each in [node, *_peer_nodes(ctx)]
    )
    return ctx.response(
        brokers=brokers,
        cluster_id=ctx.services.cluster_id,
        controller_id=node.node_id,
        topics=tuple(topics),
        error_code=ErrorCode.none,
    )


def _peer_nodes(ctx: dispatch.RequestContext) -> list[dispatch.Node]:
    directory = ctx.services.peers
    if directory is None:
        return []
    own = ctx.services.node
    return [
        dispatch.Node(peers.node_id_for(address), *address)
        for address in directory.addresses()
        if peers.node_id_for(address) != own.node_id
    ]


def _coordinator_of(ctx: dispatch.RequestContext, key: str) -> dispatch.Node:
    """The node coordinating group ``key``; ``CoordinatorNotAvailable`` if none is known."""
    directory = ctx.services.peers
    if directory is None:
        return ctx.services.node
    location = directory.locate(key)
    if location.is_self:
        return ctx.services.node
    if location.address is None:
        raise errors.CoordinatorNotAvailable(
            f"no coordinator is known for state partition {location.partition} "
            f"(group {key!r}): not in --kafka-peers, or its Lease is changing hands"
        )
    return dispatch.Node(peers.node_id_for(location.address), *location.address)


def _coordinator_error(ctx: dispatch.RequestContext, key: str, key_type: int) -> Any:
    if key_type != GROUP_KEY_TYPE:
        # Transactions and share groups are the brokers' (the gateway routes those there).
        return errors.InvalidRequest(
            f"this listener coordinates consumer groups only (key type {key_type})"
        )
    if not key:
        return errors.InvalidRequest("empty group id")
    try:
        ctx.authorize(key)
    except errors.CoordinatorError as error:
        return error
    return None


def _find(ctx: dispatch.RequestContext, key: str, key_type: int) -> tuple[Any, dispatch.Node]:
    """The error for ``key`` (None if it is served) and its coordinator's node."""
    error = _coordinator_error(ctx, key, key_type)
    if error is not None:
        return error, ctx.services.node
    try:
        return None, _coordinator_of(ctx, key)
    except errors.CoordinatorError as unknown:
        return unknown, ctx.services.node


async def find_coordinator(ctx: dispatch.RequestContext, request: Any) -> Any:
    """Each group's coordinator: v0-v3 one ``key``, v4+ a batch of ``coordinator_keys``."""
    key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
    if ctx.api_version < 4:
        error, node = _find(ctx, request.key, key_type)
        return ctx.response(
            error_code=dispatch.error_code(error),
            error_message=error.message if error else None,
            node_id=-1 if error else node.node_id,
            host="" if error else node.host,
            port=-1 if error else node.port,
        )
    coordinators = []
    for key in request.coordinator_keys:
        error, node = _find(ctx, key, key_type)
        coordinators.append(
            ctx.nested(
                "Coordinator",
                key=key,
                node_id=-1 if error else node.node_id,
                host="" if error else node.host,
                port=-1 if error else node.port,
                error_code=dispatch.error_code(error),
                error_message=error.message if error else None,
            )
        )
    return ctx.response(coordinators=tuple(coordinators))
