"""A member whose coordinator is fenced by a newer one on the same state topic.

The old coordinator keeps running and answers ``NOT_COORDINATOR``; the member's address (a
Kubernetes Service, here a loopback proxy) now leads to the new one. The member must treat
``NOT_COORDINATOR`` as retriable, never fatal, and, as Kafka's consumer rediscovers its
coordinator on it, leave the kept-alive connection to the fenced coordinator for a new one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_group_operator.commands import demo
from kafka_group_operator.coordinator import errors
from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.member import GroupMember, MemberConfig, client
from tests.member import proxy
from tests.member.test_group_member import Running

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SESSION_TIMEOUT_MS = 4_000


@pytest.fixture
def group(broker: embedded.EmbeddedBroker) -> Iterator[demo.LocalGroup]:
    suffix = uuid.uuid4().hex[:8]
    local = demo.LocalGroup(
        group=f"handover-{suffix}",
        topic=f"handover-{suffix}",
        partitions=2,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=100,
        state_partitions=1,
    )
    local.start(broker)
    try:
        yield local
    finally:
        local.stop()


def member_config(group: demo.LocalGroup, url: str, instance: str) -> MemberConfig:
    assert group.broker is not None
    settings: dict[str, Any] = {
        "group_id": group.group,
        "coordinator_url": url,
        "token": group.token,
        "topics": (group.topic,),
        "bootstrap_servers": group.broker.bootstrap,
        "instance_id": instance,
        "commit_interval_ms": 200,
        "lost_after_ms": SESSION_TIMEOUT_MS // 2,
    }
    return MemberConfig(**settings)


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_member_of_a_fenced_coordinator_moves_to_the_new_one(group: demo.LocalGroup) -> None:
    assert group.broker is not None
    producer = demo.Producer(group.broker.bootstrap, group.topic, group.partitions, rate=100)
    producer.start()
    service = proxy.Proxy("127.0.0.1", port(group.coordinator_url))
    first = Running(GroupMember(member_config(group, service.url, "member-0"))).start()
    old_process, old_url = group.coordinator, group.coordinator_url
    second: Running | None = None
    try:
        first.wait_assigned(2)
        first.wait_for(10)
        # The replacement coordinator starts on the same state topic (the old one runs on),
        # and the Service selects it from now on: new connections lead there.
        group.start_coordinator()
        service.retarget("127.0.0.1", port(group.coordinator_url))
        # A member joining through the new coordinator makes it write: its transactional
        # producer fences the old one's.
        second = Running(GroupMember(member_config(group, group.coordinator_url, "member-1")))
        second.start()
        old = client.CoordinatorClient(old_url, group.group, group.token)
        deadline = time.monotonic() + 30
        while True:
            try:
                old.describe()
            except errors.NotCoordinator:
                break  # fenced, and says so
            assert time.monotonic() < deadline, "the old coordinator was never fenced"
            time.sleep(0.1)
        old.close()
        # The member follows the Service to the new coordinator: both members settle there.
        group.wait_settled({"member-0", "member-1"}, timeout=30)
        assert first.failure is None
        assert first.member.assignment == group.ownership()["member-0"]
        processed = len(first.processed)
        first.wait_for(processed + 5)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        producer.stop()
        service.close()
        if old_process is not None and old_process.poll() is None:
            old_process.terminate()
            old_process.wait(15)
