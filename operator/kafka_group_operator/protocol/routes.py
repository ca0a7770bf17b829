"""The listener's dispatch table: API key -> handler and the versions served.

Adding an API is one ``Route`` line here. Version ranges are those Kafka's brokers serve
(Kafka 4's message schemas), widened to the group APIs' versions that Kafka 4 removed
(KIP-896) but Kafka 3.x clients still send: OffsetCommit v0/v1 and OffsetFetch v0 have no
kio type and are read by translation (``offsets``). ApiVersions advertises exactly this
table; a request for a version outside it closes the connection unanswered, as Kafka's
brokers do (Kafka 4's ``Processor.parseRequestHeader`` throws ``UnsupportedVersionException``
for any API but ApiVersions, and ``processCompletedReceives`` closes the channel on it), with
a warning naming the client id and the API. DeleteGroups v3, which Kafka 4.4 serves, is not: kio
has no type for it.

A handler is ``async def handler(ctx: dispatch.RequestContext, request) -> response``:
``request`` is kio's type for ``ctx.api_version``; build the response with
``ctx.response(**fields)`` and nested entities with ``ctx.nested("ClassName", **fields)``
(fields the version lacks are dropped). Call ``ctx.authorize(group_id)`` before touching a
group, and turn a ``CoordinatorError`` into the response's error code
(``dispatch.error_code(error)``); anything else a handler raises is logged and closes that
connection only.
"""

from __future__ import annotations

from collections.abc import Mapping

from kafka_group_operator.protocol import classic, cluster, groups, kip848, offsets, sasl
from kafka_group_operator.protocol.dispatch import Route

ROUTES: Mapping[int, Route] = {
    route.api_key: route
    for route in (
        Route(18, 0, 4, cluster.api_versions, before_authentication=True),  # ApiVersions
        Route(17, 1, 1, sasl.sasl_handshake, before_authentication=True),  # SaslHandshake
        Route(36, 0, 2, sasl.sasl_authenticate, before_authentication=True),  # SaslAuthenticate
        Route(3, 0, 12, cluster.metadata),  # Metadata
        Route(10, 0, 6, cluster.find_coordinator),  # FindCoordinator
        Route(  # ConsumerGroupHeartbeat
            68,
            0,
            1,
            kip848.consumer_group_heartbeat,
            answer_now=kip848.consumer_group_heartbeat_now,
        ),
        Route(69, 0, 1, kip848.consumer_group_describe),  # ConsumerGroupDescribe
        Route(11, 0, 9, classic.join_group),  # JoinGroup
        Route(14, 0, 5, classic.sync_group),  # SyncGroup
        Route(12, 0, 4, classic.heartbeat),  # Heartbeat
        Route(13, 0, 5, classic.leave_group),  # LeaveGroup
        # OffsetCommit and OffsetFetch
        Route(8, 0, 10, offsets.offset_commit, translations=offsets.COMMIT_TRANSLATIONS),
        Route(9, 0, 10, offsets.offset_fetch, translations=offsets.FETCH_TRANSLATIONS),
        Route(47, 0, 0, offsets.offset_delete),  # OffsetDelete
        Route(2, 1, 7, offsets.list_offsets),  # ListOffsets (from the brokers)
        Route(16, 0, 5, groups.list_groups),  # ListGroups
        Route(15, 0, 6, groups.describe_groups),  # DescribeGroups
        Route(42, 0, 2, groups.delete_groups),  # DeleteGroups
    )
}
