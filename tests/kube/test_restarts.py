"""Operator restarts under running consumers: real members of the member library, kopf with
our handlers against the API server, the embedded coordinator on the real broker.

Each restart is a new operator on the same state topic, as the Deployment's Recreate strategy
makes one. Members heartbeat through the whole restart, including the moment the member API
listens again but the groups' tokens may not be read yet.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from kafka_group_operator.member import GroupMember, MemberConfig, group_member
from tests.kube.test_consumer_groups import NS, create, group_body, token_of
from tests.member.test_group_member import Running
from tests.support import kube

pytestmark = [
    pytest.mark.kube,
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.kmock(cls=kube.ApiServer),
]

GROUP_ID = f"{NS}.orders"
RESTARTS = 10


class Watched:
    """A member with every ownership change it went through, as its callbacks report them."""

    def __init__(self, config: MemberConfig) -> None:
        self.changes: list[tuple[str, frozenset[tuple[str, int]]]] = []
        # What the callbacks say it owns: the consumer thread reports an assignment once
        # it consumes it, a moment after the heartbeat thread received it.
        self.owned: frozenset[tuple[str, int]] = frozenset()
        self.lock = threading.Lock()

        def record(kind: str) -> Any:
            def callback(partitions: frozenset[tuple[str, int]]) -> None:
                with self.lock:
                    self.changes.append((kind, partitions))
                    if kind == "assigned":
                        self.owned |= partitions
                    else:
                        self.owned -= partitions

            return callback

        member = GroupMember(
            config,
            on_assigned=record("assigned"),
            on_revoked=record("revoked"),
            on_lost=record("lost"),
        )
        self.running = Running(member).start()

    @property
    def assignment(self) -> frozenset[tuple[str, int]]:
        return self.running.member.assignment


@pytest.mark.timeout(600)
async def test_operator_restarts_never_hurt_a_running_consumer(
    kmock: kube.ApiServer, operator: kube.RunningOperator, topic: str, broker: Any
) -> None:
    # A restart takes seconds; the session (90 s) and the members' loss deadline (60 s) are
    # longer than the defaults only so that a very slow machine cannot fail the test: what is
    # tested is that nothing but the outage itself reaches the members.
    await create(kmock, group_body(topic, broker.bootstrap, replicas=2, sessionTimeoutSeconds=90))
    await operator.wait_for(lambda: operator.state.tokens.token_for(GROUP_ID))
    members = [
        Watched(
            MemberConfig(
                group_id=GROUP_ID,
                coordinator_url=operator.config.coordinator_url,
                topics=(topic,),
                bootstrap_servers=broker.bootstrap,
                token=token_of(kmock),
                instance_id=f"orders-{ordinal}",
                lost_after_ms=60_000,
            )
        )
        for ordinal in range(2)
    ]
    current = operator
    try:
        await operator.wait_for(
            lambda: all(len(m.owned) == 2 and m.owned == m.assignment for m in members),
            within=60,
            interval=0.1,
        )
        before = [m.assignment for m in members]
        settled = [len(m.changes) for m in members]

        for _ in range(RESTARTS):
            await current.__aexit__(None, None, None)
            current = kube.RunningOperator(operator.config)
            await current.__aenter__()  # returns once the tokens are read again
            back = time.monotonic()
            # Long enough for every member to heartbeat against the new operator: their
            # retry backoff during the outage is at most BACKOFF_MAX_S (with 20 % jitter).
            await asyncio.sleep(
                max(0.0, group_member.BACKOFF_MAX_S * 1.2 + 0.5 - (time.monotonic() - back))
            )
            assert [m.running.failure for m in members] == [None, None]
        description = await current.call(current.state.runtime.describe_group(GROUP_ID))
        after = [m.assignment for m in members]
        await current.__aexit__(None, None, None)
    finally:
        for member in members:
            member.running.stop(permanent=False)
        await current.__aexit__(None, None, None)  # a no-op unless a restart failed midway

    assert [m.running.failure for m in members] == [None, None]
    assert [m.changes[n:] for m, n in zip(members, settled, strict=True)] == [[], []]
    assert after == before
    by_instance = {m.instance_id: m.assignment for m in description.members}
    assert {
        instance: frozenset((t, p) for t, parts in assignment.items() for p in parts)
        for instance, assignment in by_instance.items()
    } == {"orders-0": before[0], "orders-1": before[1]}
