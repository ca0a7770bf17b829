"""``range``: Kafka's ``RangeAssignor``, with KIP-881 rack awareness.

Per topic, independently: its subscribers in canonical order, ``n`` partitions and ``k``
subscribers; each gets ``n // k`` contiguous partitions and the first ``n % k`` one more.
Only the per-topic spread is balanced (within one); extras pile on the first members of
every topic. Topics with equal partition counts and equal subscribers are co-partitioned:
partition p of each goes to the same member. Not sticky. Javadoc example: C0 and C1 on t0
and t1 with three partitions each: C0 ``[t0p0, t0p1, t1p0, t1p1]``, C1 ``[t0p2, t1p2]``.

Rack awareness applies when Kafka's does (``common.rack_aware`` per topic): partitions are
first matched to members on a replica's rack within the same per-topic quotas (together
for co-partitioned topics), then the rest are filled by plain range logic, so balance and
co-partitioning win over alignment.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Mapping

from kafka_group_operator.assignors import api, common


class _TopicState:
    """One topic's quotas while racks are matched first (Kafka's ``TopicAssignmentState``)."""

    __slots__ = ("assigned", "consumers", "extra", "per_member", "topic", "unassigned")

    def __init__(self, topic: str, count: int, consumers: list[int]) -> None:
        self.topic = topic
        self.consumers = consumers
        self.per_member, self.extra = divmod(count, len(consumers))
        # An insertion-ordered dict: ascending partitions with O(1) removal.
        self.unassigned: dict[int, None] = dict.fromkeys(range(count))
        self.assigned: dict[int, int] = dict.fromkeys(consumers, 0)

    def room(self, member: int) -> int:
        limit = self.per_member + (1 if self.extra > 0 else 0)
        return max(0, limit - self.assigned[member])

    def give(
        self, member: int, partitions: list[int], lists: list[list[api.TopicPartition]]
    ) -> None:
        lists[member].extend((self.topic, partition) for partition in partitions)
        before = self.assigned[member]
        self.assigned[member] = before + len(partitions)
        if before <= self.per_member < before + len(partitions):
            self.extra -= 1
        for partition in partitions:
            del self.unassigned[partition]

    def fill(
        self, may_take: Callable[[int, int], bool], lists: list[list[api.TopicPartition]]
    ) -> None:
        """Kafka's ``assignRanges``: each member in order takes what it may, up to its room."""
        for member in self.consumers:
            if not self.unassigned:
                return
            room = self.room(member)
            if room == 0:
                continue
            allowed = (p for p in self.unassigned if may_take(member, p))
            chosen = list(itertools.islice(allowed, room))
            if chosen:
                self.give(member, chosen, lists)


class RangeAssignor:
    name = "range"

    def assign(self, spec: api.GroupSpec) -> api.GroupAssignment:
        counts = spec.partitions_per_topic
        order = common.member_order(spec.members)
        subscriptions = [spec.members[member] for member in order]
        topics_of = common.usable_topics(subscriptions, counts)
        subscribers = common.subscribers_by_topic(topics_of)
        lists: list[list[api.TopicPartition]] = [[] for _ in order]
        member_racks = [subscription.rack for subscription in subscriptions]
        racks = common.Racks(member_racks, spec.partition_racks)
        aware: set[str] = set()
        if any(rack is not None for rack in member_racks):
            aware = {
                topic
                for topic, members in subscribers.items()
                if common.rack_aware(
                    (member_racks[index] for index in members),
                    [topic],
                    counts,
                    spec.partition_racks,
                )
            }
        if aware:
            self._assign_rack_aware(subscribers, counts, racks, aware, lists)
        else:
            for topic in sorted(subscribers):
                members = subscribers[topic]
                partitions = [(topic, partition) for partition in range(counts[topic])]
                per_member, extra = divmod(len(partitions), len(members))
                start = 0
                # With fewer partitions than members only the first ``extra`` get any.
                receiving = members if per_member else members[:extra]
                for position, index in enumerate(receiving):
                    end = start + per_member + (1 if position < extra else 0)
                    lists[index].extend(partitions[start:end])
                    start = end
        return common.sorted_assignment(order, lists)

    @staticmethod
    def _assign_rack_aware(
        subscribers: dict[str, list[int]],
        counts: Mapping[str, int],
        racks: common.Racks,
        aware: set[str],
        lists: list[list[api.TopicPartition]],
    ) -> None:
        states = {
            topic: _TopicState(topic, counts[topic], subscribers[topic])
            for topic in sorted(subscribers)
        }
        groups: dict[tuple[tuple[int, ...], int], list[_TopicState]] = defaultdict(list)
        for topic, state in states.items():
            groups[(tuple(state.consumers), counts[topic])].append(state)
        for (consumers, count), group in groups.items():
            if len(group) > 1:
                _match_co_partitioned(list(consumers), count, group, racks, lists)
            elif group[0].topic in aware:
                topic = group[0].topic

                def aligned(member: int, partition: int, topic: str = topic) -> bool:
                    return racks.matches(member, topic, partition)

                group[0].fill(aligned, lists)
        for state in states.values():
            state.fill(_anyone, lists)


def _anyone(member: int, partition: int) -> bool:
    return True


def _match_co_partitioned(
    consumers: list[int],
    count: int,
    group: list[_TopicState],
    racks: common.Racks,
    lists: list[list[api.TopicPartition]],
) -> None:
    """Give partition p of every co-partitioned topic to the first member aligned for all."""
    remaining = list(consumers)
    for partition in range(count):
        for member in remaining:
            if all(
                racks.matches(member, state.topic, partition) and state.room(member) > 0
                for state in group
            ):
                for state in group:
                    state.give(member, [partition], lists)
                if not any(state.room(member) > 0 for state in group):
                    remaining.remove(member)
                break
        if not remaining:
            return
