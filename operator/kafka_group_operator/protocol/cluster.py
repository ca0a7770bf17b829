"""ApiVersions, Metadata and FindCoordinator: the listener presents itself as a one-node
cluster whose node coordinates every group."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kafka_group_operator.coordinator import errors
from kafka_group_operator.protocol import dispatch

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
                    name=name or None,
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
    broker = ctx.nested(
        "MetadataResponseBroker", node_id=node.node_id, host=node.host, port=node.port, rack=None
    )
    return ctx.response(
        brokers=(broker,),
        cluster_id=ctx.services.cluster_id,
        controller_id=node.node_id,
        topics=tuple(topics),
        error_code=ErrorCode.none,
    )


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


async def find_coordinator(ctx: dispatch.RequestContext, request: Any) -> Any:
    """This node for every group: v0-v3 one ``key``, v4+ a batch of ``coordinator_keys``."""
    node = ctx.services.node
    key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
    if ctx.api_version < 4:
        error = _coordinator_error(ctx, request.key, key_type)
        return ctx.response(
            error_code=dispatch.error_code(error),
            error_message=error.message if error else None,
            node_id=-1 if error else node.node_id,
            host="" if error else node.host,
            port=-1 if error else node.port,
        )
    coordinators = []
    for key in request.coordinator_keys:
        error = _coordinator_error(ctx, key, key_type)
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
