"""Property tests: random member lives against the coordinator, invariants checked after every step.

Hypothesis drives simulated consumers (static and dynamic, on one or two topics) through
joins, heartbeats that report what they own, lost responses, subscription changes,
temporary and permanent leaves, crashes, commits, operator scale-downs, pauses,
partition-count changes and the passage of time (sessions, rebalance timeouts and a short
offsets retention). A simulated consumer does what a real one does: it owns exactly the
assignment of the last response it received, and when it is fenced it drops everything and
rejoins with epoch 0 under the same member id.

After every step:

* no partition is owned by two members, neither in the coordinator's state (assigned or
  pending revocation) nor among the live consumers' own views;
* what a live consumer owns, the coordinator counts as owned by it;
* a live consumer can commit every partition it owns; a zombie cannot commit at all.

Live replay also checks the group-state transition table on every record. At the end the
group must converge once every consumer keeps heartbeating, and replaying the whole log
from scratch must rebuild exactly the live state and its retention deadlines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Mapping

import hypothesis.strategies as st
from hypothesis import HealthCheck, example, given, settings

from kafka_group_operator.coordinator import errors, messages, shard, timers
from tests.coordinator.harness import GROUP, TOPIC, Harness

ASSIGNORS = ("cooperative-sticky", "uniform", "range", "sticky", "roundrobin")
AUDIT = "audit"  # a second topic, with a fixed 3 partitions
SUBSCRIPTIONS = ((TOPIC,), (TOPIC, AUDIT))
STATIC_SLOTS = 4
SLOTS = 6  # slots 4 and 5 are dynamic members (no instance id)
SESSION_MS = 30_000

Partition = tuple[str, int]


def flatten(assignment: Mapping[str, frozenset[int]]) -> frozenset[Partition]:
    return frozenset((topic, p) for topic, parts in assignment.items() for p in parts)


def grouped(partitions: frozenset[Partition]) -> dict[str, frozenset[int]]:
    topics: dict[str, set[int]] = {}
    for topic, partition in partitions:
        topics.setdefault(topic, set()).add(partition)
    return {topic: frozenset(parts) for topic, parts in topics.items()}


def holding(member: messages.MemberDescription) -> frozenset[Partition]:
    """What the coordinator considers the member to own: assigned or still revoking."""
    return flatten(member.assignment) | flatten(member.partitions_pending_revocation)


@dataclasses.dataclass
class Consumer:
    member_id: str
    instance_id: str | None
    topics: tuple[str, ...]
    epoch: int = 0
    owned: frozenset[Partition] = frozenset()


class World:
    def __init__(self, assignor: str, partitions: int) -> None:
        self.harness = Harness()
        self.partitions = {TOPIC: partitions, AUDIT: 3}
        self.harness.topics(self.partitions)
        self.settings = dict(
            assignor=assignor,
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=20_000,
            # Short enough that a few waits expire offsets of unsubscribed topics, and
            # whole empty groups, in the middle of the script.
            offsets_retention_ms=15_000,
            assignment_paused=False,
        )
        self.harness.configure(**self.settings)
        self.consumers: dict[int, Consumer] = {}
        self.incarnations = itertools.count()

    # --- what the coordinator thinks ------------------------------------------------

    def members(self) -> dict[str, messages.MemberDescription]:
        try:
            description = self.harness.shard.describe_group(GROUP)
        except errors.GroupIdNotFound:
            return {}
        return {member.member_id: member for member in description.members}

    def group_epoch(self) -> int:
        try:
            return self.harness.shard.describe_group(GROUP).group_epoch
        except errors.GroupIdNotFound:
            return 0

    def is_live(self, consumer: Consumer) -> bool:
        return consumer.member_id in self.members()

    # --- consumer actions -----------------------------------------------------------

    def start(self, slot: int, topics: tuple[str, ...]) -> None:
        if slot in self.consumers:
            return
        instance_id = f"{GROUP}-{slot}" if slot < STATIC_SLOTS else None
        consumer = Consumer(f"c{slot}-{next(self.incarnations)}", instance_id, topics)
        holder = next(
            (m for m in self.members().values() if instance_id and m.instance_id == instance_id),
            None,
        )
        epoch_before = self.group_epoch()
        try:
            result = self.join(consumer)
        except errors.UnreleasedInstanceId:
            assert holder is not None
            assert holder.member_epoch != messages.STATIC_LEAVE_EPOCH
            return
        assert holder is None or holder.member_epoch == messages.STATIC_LEAVE_EPOCH
        self.consumers[slot] = consumer
        if holder is not None and holder.subscribed_topic_names == topics:
            # A returning static member gets back what it had, as far as its target allows;
            # when it had all of its target, exactly that, and the group epoch stays.
            given = flatten(result.assignment or {})
            target = flatten(holder.target_assignment)
            assert given <= target
            if holder.assignment == holder.target_assignment:
                assert given == target
                assert self.group_epoch() == epoch_before

    def join(self, consumer: Consumer) -> messages.HeartbeatResponse:
        result = self.harness.heartbeat(
            consumer.member_id, 0, instance_id=consumer.instance_id, topics=consumer.topics
        )
        assert result.response.assignment is not None, "a join carries the full assignment"
        consumer.epoch = result.response.member_epoch
        consumer.owned = flatten(result.response.assignment)
        return result.response

    def heartbeat(self, slot: int, *, lost: bool = False, resubscribe: bool = False) -> None:
        consumer = self.consumers.get(slot)
        if consumer is None:
            return
        if resubscribe:
            consumer.topics = SUBSCRIPTIONS[1 - SUBSCRIPTIONS.index(consumer.topics)]
        if consumer.epoch == 0:
            # Fenced earlier: rejoin under the same member id (KIP-1082).
            with contextlib.suppress(errors.UnreleasedInstanceId):
                self.join(consumer)
            return
        live = self.is_live(consumer)
        try:
            result = self.harness.heartbeat(
                consumer.member_id,
                consumer.epoch,
                owned=grouped(consumer.owned),
                instance_id=consumer.instance_id,
                topics=consumer.topics,
            )
        except (errors.UnknownMemberId, errors.FencedInstanceId):
            # Only a member the coordinator already removed is refused here: a zombie
            # that stops for good.
            assert not live
            del self.consumers[slot]
            return
        except errors.FencedMemberEpoch:
            consumer.epoch, consumer.owned = 0, frozenset()
            return
        if lost:
            return  # the consumer never sees this response
        consumer.epoch = result.response.member_epoch
        if result.response.assignment is not None:
            consumer.owned = flatten(result.response.assignment)

    def leave(self, slot: int, temporarily: bool) -> None:
        consumer = self.consumers.pop(slot, None)
        if consumer is None:
            return
        static = consumer.instance_id is not None
        epoch = messages.STATIC_LEAVE_EPOCH if temporarily and static else messages.LEAVE_EPOCH
        live = self.is_live(consumer)
        try:
            self.harness.heartbeat(consumer.member_id, epoch, instance_id=consumer.instance_id)
        except (errors.UnknownMemberId, errors.FencedInstanceId):
            assert not live

    def crash(self, slot: int) -> None:
        self.consumers.pop(slot, None)

    def commit(self, slot: int) -> None:
        consumer = self.consumers.get(slot)
        if consumer is None or consumer.epoch == 0:
            return
        offsets = dict.fromkeys(consumer.owned, 1)
        if self.is_live(consumer):
            member = self.members()[consumer.member_id]
            if member.member_epoch != consumer.epoch:
                # A lost response left the consumer one epoch behind: retry later.
                try:
                    self.harness.commit(consumer.member_id, consumer.epoch, offsets)
                except errors.StaleMemberEpoch:
                    return
                raise AssertionError("a commit at a stale epoch was accepted")
            result = self.harness.commit(consumer.member_id, consumer.epoch, offsets)
            assert result.response.errors == {}
            assert len(result.records) == len(offsets)
        else:
            try:
                self.harness.commit(consumer.member_id, consumer.epoch, offsets)
            except errors.UnknownMemberId:
                return
            raise AssertionError("a zombie's commit was accepted")

    # --- operator and environment ---------------------------------------------------

    def scale_down(self, slot: int) -> None:
        request = messages.RemoveMembersRequest(GROUP, (f"{GROUP}-{slot}",))
        with contextlib.suppress(errors.GroupIdNotFound):
            self.harness.apply(self.harness.shard.remove_members(request, self.harness.now_ms))

    def toggle_pause(self) -> None:
        self.settings["assignment_paused"] = not self.settings["assignment_paused"]
        self.harness.configure(**self.settings)

    def resize(self, partitions: int) -> None:
        # Kafka only ever adds partitions.
        self.partitions[TOPIC] = max(self.partitions[TOPIC], partitions)
        self.harness.topics(self.partitions)

    def wait(self, millis: int) -> None:
        self.harness.tick(millis)

    # --- invariants -----------------------------------------------------------------

    def check(self) -> None:
        members = self.members()
        held: dict[Partition, str] = {}
        for member in members.values():
            for partition in holding(member):
                assert partition not in held, (
                    f"{partition} owned by {held[partition]} and {member.member_id}"
                )
                held[partition] = member.member_id
        in_hand: dict[Partition, str] = {}
        for consumer in self.consumers.values():
            described = members.get(consumer.member_id)
            if described is None:
                continue  # a zombie: its commits are refused, checked in commit()
            assert consumer.owned <= holding(described)
            for partition in consumer.owned:
                assert partition not in in_hand, "two live consumers own the same partition"
                in_hand[partition] = consumer.member_id

    def converge(self) -> None:
        """Everyone keeps heartbeating; absent static members expire; the group settles.

        No consumer that is still a member (or about to rejoin) may be fenced on the way: a
        consumer that heartbeats in time always learns what to revoke, even after a lost
        response, and so never runs into its rebalance timeout.
        """
        survivors = {
            slot
            for slot, consumer in self.consumers.items()
            if consumer.epoch == 0 or self.is_live(consumer)
        }
        # Two rounds before time moves: one to learn the assignment, one to report it.
        for _ in range(2):
            for slot in list(self.consumers):
                self.heartbeat(slot)
        for _ in range(2 + SESSION_MS // 10_000):
            for slot in list(self.consumers):
                self.heartbeat(slot)
            self.wait(10_000)
            self.check()
        for _ in range(10):
            for slot in list(self.consumers):
                self.heartbeat(slot)
            self.check()
        members = self.members()
        assert set(members) == {consumer.member_id for consumer in self.consumers.values()}
        assert survivors <= set(self.consumers), "a consumer that kept heartbeating was fenced"
        if not members:
            return
        state = self.harness.shard.describe_group(GROUP).state
        owned = sorted(p for consumer in self.consumers.values() for p in consumer.owned)
        if self.settings["assignment_paused"]:
            assert state == "Paused"
            assert owned == []
        else:
            assert state == "Stable"
            subscribed = {t for consumer in self.consumers.values() for t in consumer.topics}
            assert owned == sorted(
                (topic, p) for topic in subscribed for p in range(self.partitions[topic])
            )


slots = st.integers(0, SLOTS - 1)
steps = st.one_of(
    st.tuples(st.just("start"), slots),
    st.tuples(st.just("start-both-topics"), slots),
    st.tuples(st.just("heartbeat"), slots),
    st.tuples(st.just("heartbeat"), slots),
    st.tuples(st.just("heartbeat"), slots),
    st.tuples(st.just("heartbeat-lost"), slots),
    st.tuples(st.just("resubscribe"), slots),
    st.tuples(st.just("leave"), slots),
    st.tuples(st.just("leave-temporarily"), slots),
    st.tuples(st.just("crash"), slots),
    st.tuples(st.just("commit"), slots),
    st.tuples(st.just("commit"), slots),
    st.tuples(st.just("scale-down"), st.integers(0, STATIC_SLOTS - 1)),
    st.tuples(st.just("pause"), st.just(0)),
    st.tuples(st.just("resize"), st.integers(1, 12)),
    st.tuples(st.just("wait"), st.integers(1, 25_000)),
    st.tuples(st.just("wait"), st.integers(1, 25_000)),
)


def play(world: World, action: str, argument: int) -> None:
    if action == "start":
        world.start(argument, SUBSCRIPTIONS[0])
    elif action == "start-both-topics":
        world.start(argument, SUBSCRIPTIONS[1])
    elif action == "heartbeat":
        world.heartbeat(argument)
    elif action == "heartbeat-lost":
        world.heartbeat(argument, lost=True)
    elif action == "resubscribe":
        world.heartbeat(argument, resubscribe=True)
    elif action == "leave":
        world.leave(argument, temporarily=False)
    elif action == "leave-temporarily":
        world.leave(argument, temporarily=True)
    elif action == "crash":
        world.crash(argument)
    elif action == "commit":
        world.commit(argument)
    elif action == "scale-down":
        world.scale_down(argument)
    elif action == "pause":
        world.toggle_pause()
    elif action == "resize":
        world.resize(argument)
    else:
        world.wait(argument)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Random scripts seldom keep a group alive past the retention: one that surely expires the
# offsets of a dropped topic in a live group, then the whole emptied group.
@example(
    assignor="cooperative-sticky",
    partitions=3,
    script=[
        ("start-both-topics", 0),
        ("start", 1),
        *[("heartbeat", 0), ("heartbeat", 1)] * 2,
        ("commit", 0),
        ("commit", 1),
        ("resubscribe", 0),
        *[("heartbeat", 0), ("heartbeat", 1)] * 2,
        ("wait", 16_000),
        ("heartbeat", 0),
        ("leave", 0),
        ("leave", 1),
        ("wait", 16_000),
    ],
)
@given(
    assignor=st.sampled_from(ASSIGNORS),
    partitions=st.integers(1, 10),
    script=st.lists(steps, min_size=1, max_size=60),
)
def test_random_lives_keep_every_invariant(
    assignor: str, partitions: int, script: list[tuple[str, int]]
) -> None:
    world = World(assignor, partitions)
    for action, argument in script:
        play(world, action, argument)
        world.check()
    world.converge()

    # Replaying the log from scratch rebuilds exactly the live state, and the same
    # retention deadlines (session deadlines restart at the load, by design).
    loaded = world.harness.replayed()
    assert loaded.canonical_state() == world.harness.shard.canonical_state()
    assert retention_timers(loaded) == retention_timers(world.harness.shard)


def retention_timers(coordinator: shard.CoordinatorShard) -> dict[timers.TimerKey, timers.Armed]:
    return {
        key: armed
        for key, armed in coordinator.armed_timers().items()
        if key.kind is timers.TimerKind.RETENTION
    }
