"""The operator's coordinator listener: the Kafka protocol beside the member API, with the
group tokens the operator reads from the groups' Secrets."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.schema.delete_groups.v2.request import DeleteGroupsRequest

from tests.kube.test_consumer_groups import NS, create, group_body, token_of
from tests.protocol.test_kip848 import heartbeat, topic_id
from tests.protocol.test_listener import GROUP_AUTHORIZATION_FAILED, authenticated
from tests.support import kube

pytestmark = [pytest.mark.kube, pytest.mark.broker, pytest.mark.kmock(cls=kube.ApiServer)]

GROUP_ID = f"{NS}.orders"


async def test_a_consumer_group_is_served_on_the_kafka_port_with_its_token(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    await create(kmock, group_body(topic, broker.bootstrap, sessionTimeoutSeconds=45))
    await operator.wait_for(lambda: operator.state.tokens.token_for(GROUP_ID))
    listener = operator.state.kafka_listener
    tid = await topic_id(operator.state.runtime, topic)
    connection = await authenticated(listener.port, GROUP_ID, token_of(kmock))
    try:
        joined = await connection.call(
            heartbeat(GROUP_ID, uuid.uuid4().hex, 0, topic=topic, owned_partitions={})
        )
        assert joined.error_code == 0, joined
        assert joined.assignment is not None
        assert {tp.topic_id for tp in joined.assignment.topic_partitions} == {tid}
        other = await connection.call(
            heartbeat("shop.payments", uuid.uuid4().hex, 0, topic=topic, owned_partitions={})
        )
        assert other.error_code == GROUP_AUTHORIZATION_FAILED
        # The group is the resource's: DeleteGroups over the wire is refused.
        deleted = await connection.call(DeleteGroupsRequest(groups_names=(GROUP_ID,)))
        assert deleted.results[0].error_code == GROUP_AUTHORIZATION_FAILED
        left = await connection.call(heartbeat(GROUP_ID, joined.member_id, -1))
        assert left.error_code == 0
    finally:
        await connection.close()
    assert (await operator.state.runtime.describe_group(GROUP_ID)).members == ()
