"""``roundrobin``: Kafka's ``RoundRobinAssignor``.

All partitions of all subscribed topics (topics sorted, partitions ascending) are dealt in
turn over the members in their canonical order, each partition to the next member that
subscribes to its topic. Balanced (max - min <= 1) when subscriptions are equal; not
sticky; no rack awareness. Javadoc example: C0 on t0, C1 on t0 and t1, C2 on t0, t1 and t2,
with 1, 2 and 3 partitions: C0 ``[t0p0]``, C1 ``[t1p0]``, C2 ``[t1p1, t2p0, t2p1, t2p2]``.
"""

from __future__ import annotations

import bisect

from kafka_group_operator.assignors import api, common


class RoundRobinAssignor:
    name = "roundrobin"

    def assign(self, spec: api.GroupSpec) -> api.GroupAssignment:
        counts = spec.partitions_per_topic
        order = common.member_order(spec.members)
        topics_of = common.usable_topics((spec.members[member] for member in order), counts)
        lists: list[list[api.TopicPartition]] = [[] for _ in order]
        subscribers = common.subscribers_by_topic(topics_of)
        members = len(order)
        # The circular iterator's position: the member that the next partition tries first.
        cursor = 0
        for topic in sorted(subscribers):
            eligible = subscribers[topic]
            count = len(eligible)
            first = bisect.bisect_left(eligible, cursor)
            # Consecutive partitions of one topic simply walk its subscribers in a circle.
            for offset in range(counts[topic]):
                index = eligible[(first + offset) % count]
                lists[index].append((topic, offset))
            last = eligible[(first + counts[topic] - 1) % count]
            cursor = (last + 1) % members
        return common.sorted_assignment(order, lists)
