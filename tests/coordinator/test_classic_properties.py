"""Property test: random lives of classic-protocol consumers (eager and cooperative, static and
dynamic) in one consumer group, invariants checked after every step.

A simulated consumer does what a classic client does: it joins (an eager one first drops
everything; a cooperative one reports what it owns), syncs and then owns exactly the
assignment SyncGroup handed it, heartbeats, joins again when told REBALANCE_IN_PROGRESS (an
eager one dropping everything first), starts over without its member id on UNKNOWN_MEMBER_ID,
and gives everything up when its session may have expired. It can also crash (a static one
comes back under its instance id) or leave.

After every step:

* no partition is owned by two live consumers, in their own views;
* what a live consumer owns, the coordinator counts as held by it;
* a live consumer commits every partition it owns with its generation.

At the end every consumer keeps polling until the group is stable with every partition
assigned, and replaying the log from scratch rebuilds exactly the live state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from kafka_group_operator.coordinator import errors, messages
from kafka_group_records import records as schema
from tests.coordinator.harness import GROUP, TOPIC, Harness

PARTITIONS = 6
SESSION_MS = 10_000
SLOTS = 4  # slots 0 and 1 are static members
EAGER = (schema.ClassicProtocol("range", b""),)
# As a client migrating to cooperative rebalancing offers both: the group's members must
# share a protocol name.
COOPERATIVE = (schema.ClassicProtocol("cooperative-sticky", b""), *EAGER)


@dataclass
class Consumer:
    slot: int
    cooperative: bool
    member_id: str = ""
    generation: int = -1
    owned: frozenset[int] = frozenset()
    needs_join: bool = True
    # When the coordinator last answered it without error: its session runs from there.
    last_ok_ms: int = 0
    running: bool = True

    @property
    def instance_id(self) -> str | None:
        return f"pod-{self.slot}" if self.slot < 2 else None

    def reset(self, forget_id: bool) -> None:
        self.owned, self.needs_join, self.generation = frozenset(), True, -1
        if forget_id:
            self.member_id = ""


@dataclass
class World:
    harness: Harness
    consumers: list[Consumer] = field(default_factory=list)

    def live(self) -> list[Consumer]:
        now = self.harness.now_ms
        return [c for c in self.consumers if c.running and now - c.last_ok_ms < SESSION_MS]

    def expire_sessions(self) -> None:
        """A client whose session may have expired gives up its partitions (as real ones do
        when their heartbeats fail for the session timeout)."""
        now = self.harness.now_ms
        for consumer in self.consumers:
            if consumer.running and now - consumer.last_ok_ms >= SESSION_MS:
                consumer.reset(forget_id=False)

    def poll(self, consumer: Consumer) -> None:
        if not consumer.running:
            return
        shard, now = self.harness.shard, self.harness.now_ms
        try:
            if consumer.needs_join:
                if not consumer.cooperative:
                    consumer.owned = frozenset()
                joined = self.harness.apply(
                    shard.classic_join(
                        messages.ClassicJoinRequest(
                            group_id=GROUP,
                            member_id=consumer.member_id,
                            instance_id=consumer.instance_id,
                            protocol_type="consumer",
                            protocols=COOPERATIVE if consumer.cooperative else EAGER,
                            session_timeout_ms=SESSION_MS,
                            rebalance_timeout_ms=20_000,
                            subscribed_topic_names=(TOPIC,),
                            owned_partitions={TOPIC: consumer.owned} if consumer.owned else {},
                        ),
                        now,
                    )
                ).response
                consumer.member_id, consumer.generation = joined.member_id, joined.generation_id
                synced = shard.classic_sync(
                    messages.ClassicSyncRequest(
                        GROUP, consumer.member_id, consumer.generation, consumer.instance_id
                    ),
                    now,
                ).response
                consumer.owned = synced.assignment.get(TOPIC, frozenset())
                consumer.needs_join = False
            else:
                rejoin = shard.classic_heartbeat(
                    messages.ClassicHeartbeatRequest(
                        GROUP, consumer.member_id, consumer.generation, consumer.instance_id
                    ),
                    now,
                ).response.rebalance_in_progress
                if rejoin:
                    consumer.needs_join = True
                    if not consumer.cooperative:
                        consumer.owned = frozenset()
            consumer.last_ok_ms = now
        except errors.RebalanceInProgress:
            consumer.needs_join = True
            consumer.last_ok_ms = now
        except (errors.UnknownMemberId, errors.IllegalGeneration, errors.FencedInstanceId):
            consumer.reset(forget_id=True)

    def check(self) -> None:
        live = self.live()
        seen: dict[int, int] = {}
        for consumer in live:
            for partition in consumer.owned:
                assert partition not in seen, (
                    f"p{partition}: slots {seen[partition]}, {consumer.slot}"
                )
                seen[partition] = consumer.slot
        described = {m.member_id: m for m in self.harness.shard.describe_group(GROUP).members}
        for consumer in live:
            if not consumer.owned:
                continue
            member = described[consumer.member_id]
            held = member.assignment.get(TOPIC, frozenset()) | (
                member.partitions_pending_revocation.get(TOPIC, frozenset())
            )
            assert consumer.owned <= held
            committed = self.harness.commit(
                consumer.member_id,
                consumer.generation,
                {(TOPIC, p): self.harness.now_ms for p in consumer.owned},
            )
            assert committed.response.errors == {}


steps = st.lists(
    st.tuples(
        st.sampled_from(["poll", "poll", "poll", "crash", "leave", "tick"]),
        st.integers(0, SLOTS - 1),
        st.integers(0, 12_000),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cooperative=st.lists(st.booleans(), min_size=SLOTS, max_size=SLOTS), steps=steps)
def test_random_classic_consumer_lives(
    cooperative: list[bool], steps: list[tuple[str, int, int]]
) -> None:
    harness = Harness()
    harness.topics({TOPIC: PARTITIONS})
    harness.configure(assignor="cooperative-sticky", session_timeout_ms=SESSION_MS)
    world = World(harness, [Consumer(slot, cooperative[slot]) for slot in range(SLOTS)])
    for action, slot, amount in steps:
        consumer = world.consumers[slot]
        if action == "poll":
            world.poll(consumer)
        elif action == "crash":
            # The process dies; a new one (same instance id, no member id) starts later.
            consumer.reset(forget_id=True)
        elif action == "leave" and consumer.member_id and not consumer.needs_join:
            harness.apply(
                harness.shard.classic_leave(
                    messages.ClassicLeaveRequest(
                        GROUP, (messages.ClassicLeavingMember(consumer.member_id),)
                    ),
                    harness.now_ms,
                )
            )
            consumer.reset(forget_id=True)
        elif action == "tick":
            harness.tick(amount)
            world.expire_sessions()
        world.check()

    # Everyone keeps polling: the group converges with every partition owned.
    for _ in range(40):
        harness.tick(1_000)
        for consumer in world.consumers:
            world.poll(consumer)
        world.check()
        described = harness.shard.describe_group(GROUP)
        assigned = {m.member_id: m.assignment.get(TOPIC, frozenset()) for m in described.members}
        if described.state == "Stable" and all(
            not c.needs_join and assigned.get(c.member_id) == c.owned for c in world.consumers
        ):
            break
    assert sorted(p for c in world.consumers for p in c.owned) == list(range(PARTITIONS))
    assert harness.shard.describe_group(GROUP).state == "Stable"
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()
