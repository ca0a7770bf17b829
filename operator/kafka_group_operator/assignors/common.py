"""What every assignor shares: member order, usable subscriptions, racks and claim resolution.

These helpers turn a ``GroupSpec`` into plain indexed data (members by position in the
canonical order, partitions as per-topic lists) so that the algorithms can count instead of
search. Kafka's rules they encode:

* Member order (``AbstractPartitionAssignor.MemberInfo``): static members first, by instance
  id, then dynamic members by member id.
* Topics without metadata are skipped; so are topics with no partitions.
* Conflicting claims on one partition (``AbstractStickyAssignor``): the strictly highest
  generation keeps it, a tie means nobody keeps it, and a missing generation counts as -1.
* Rack awareness (KIP-881, ``useRackAwareAssignment``): only when some member has a rack,
  member racks meet partition racks, and not every partition has replicas on every rack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kafka_group_operator.assignors import api

# Values of a partition's slot in ``Claims.owner``: a member's position, or one of these.
FREE = -1
TIED = -2

DEFAULT_GENERATION = -1


def member_order(members: Mapping[str, api.MemberSubscription]) -> list[str]:
    """Member ids, static members first by instance id, then the others by member id."""
    static = sorted(
        (subscription.instance_id, member_id)
        for member_id, subscription in members.items()
        if subscription.instance_id is not None
    )
    dynamic = sorted(
        member_id for member_id, subscription in members.items() if subscription.instance_id is None
    )
    return [member_id for _, member_id in static] + dynamic


def usable_topics(
    subscriptions: Iterable[api.MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> list[frozenset[str]]:
    """Each member's subscribed topics that have metadata and at least one partition."""
    # Members usually share one subscription object, so intersect each distinct set once.
    cache: dict[frozenset[str], frozenset[str]] = {}
    result = []
    for subscription in subscriptions:
        topics = subscription.topics
        usable = cache.get(topics)
        if usable is None:
            usable = frozenset(topic for topic in topics if partitions_per_topic.get(topic, 0) > 0)
            cache[topics] = usable
        result.append(usable)
    return result


def subscribers_by_topic(topics_of: Sequence[frozenset[str]]) -> dict[str, list[int]]:
    """Topic -> positions of its subscribers, ascending; shared lists, do not mutate.

    Members are grouped by subscription first, so equal subscriptions cost one pass over
    the topics instead of one per member.
    """
    groups: dict[frozenset[str], list[int]] = {}
    for index, topics in enumerate(topics_of):
        groups.setdefault(topics, []).append(index)
    subscribers: dict[str, list[int]] = {}
    merged: set[str] = set()
    for topics, members in groups.items():
        for topic in topics:
            current = subscribers.get(topic)
            if current is None:
                subscribers[topic] = members
            elif topic in merged:
                current.extend(members)
            else:
                subscribers[topic] = current + members
                merged.add(topic)
    for topic in merged:
        subscribers[topic].sort()
    return subscribers


def missing_topics(
    members: Mapping[str, api.MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> list[str]:
    """Subscribed topics that have no metadata, sorted."""
    subscribed: set[str] = set()
    for topics in {subscription.topics for subscription in members.values()}:
        subscribed.update(topics)
    return sorted(topic for topic in subscribed if topic not in partitions_per_topic)


def sorted_assignment(
    order: Sequence[str], lists: Sequence[list[api.TopicPartition]]
) -> api.GroupAssignment:
    """The result mapping, every member present and every list sorted by (topic, partition)."""
    assignment: api.GroupAssignment = {}
    for member_id, partitions in zip(order, lists, strict=True):
        partitions.sort()
        assignment[member_id] = partitions
    return assignment


@dataclass(frozen=True, slots=True)
class Racks:
    """The racks of the members (by position) and of each partition's replicas."""

    member_racks: Sequence[str | None]
    partition_racks: Mapping[str, Sequence[frozenset[str]]]

    def matches(self, member: int, topic: str, partition: int) -> bool:
        """Whether the member's rack holds a replica; a member without a rack matches all."""
        rack = self.member_racks[member]
        if rack is None:
            return True
        racks = self.partition_racks.get(topic)
        return racks is not None and partition < len(racks) and rack in racks[partition]

    def replica_racks(self, topic: str, partition: int) -> frozenset[str]:
        racks = self.partition_racks.get(topic)
        if racks is None or partition >= len(racks):
            return frozenset()
        return racks[partition]


def rack_aware(
    member_racks: Iterable[str | None],
    topics: Iterable[str],
    partitions_per_topic: Mapping[str, int],
    partition_racks: Mapping[str, Sequence[frozenset[str]]],
) -> bool:
    """Kafka's ``useRackAwareAssignment`` over the given topics."""
    consumer_racks = {rack for rack in member_racks if rack is not None}
    if not consumer_racks:
        return False
    all_racks: set[str] = set()
    per_partition: list[frozenset[str]] = []
    for topic in topics:
        racks = partition_racks.get(topic, ())
        for partition in range(partitions_per_topic[topic]):
            replica_racks = racks[partition] if partition < len(racks) else frozenset()
            per_partition.append(replica_racks)
            all_racks.update(replica_racks)
    if consumer_racks.isdisjoint(all_racks):
        return False
    return not all(replica_racks == all_racks for replica_racks in per_partition)


@dataclass(slots=True)
class Claims:
    """Owned partitions after conflicts are resolved.

    ``owner[topic][partition]`` is the position of the member that keeps its claim, ``FREE``
    or (before ``kept`` is built) ``TIED``. ``kept[member]`` lists the member's surviving
    claims on topics it still subscribes to, in its own order. ``claimant`` is a copy of
    ``owner`` taken before anything was dropped: the cooperative rule holds back a partition
    from anyone but the member that still holds it.
    """

    owner: dict[str, list[int]]
    kept: list[list[api.TopicPartition]]
    claimant: dict[str, list[int]]
    any_claim: bool


def resolve_claims(
    subscriptions: Sequence[api.MemberSubscription],
    topics_of: Sequence[frozenset[str]],
    partitions_per_topic: Mapping[str, int],
    subscribed_topics: Iterable[str],
) -> Claims:
    """Decide who keeps each claimed partition; every subscribed topic gets an owner list."""
    owner: dict[str, list[int]] = {
        topic: [FREE] * partitions_per_topic[topic] for topic in subscribed_topics
    }
    generations = [
        DEFAULT_GENERATION if subscription.generation is None else subscription.generation
        for subscription in subscriptions
    ]
    tie_generation: dict[api.TopicPartition, int] = {}
    # Claims are optimistically kept as they come; any conflict or repeat means a second pass.
    kept: list[list[api.TopicPartition]] = []
    unsubscribed: list[api.TopicPartition] = []
    contested = False
    any_claim = False
    for index, subscription in enumerate(subscriptions):
        mine: list[api.TopicPartition] = []
        kept.append(mine)
        if not subscription.owned:
            continue
        generation = generations[index]
        topics = topics_of[index]
        last_topic = None
        slots: list[int] | None = None
        size = 0
        wanted = False
        for claim in subscription.owned:
            topic, partition = claim
            # Owned lists come grouped by topic: look the topic up once per run.
            if topic != last_topic:
                last_topic = topic
                slots = owner.get(topic)
                if slots is None:
                    # A claim on a topic nobody subscribes to still says who holds it now.
                    count = partitions_per_topic.get(topic, 0)
                    if count > 0:
                        slots = owner[topic] = [FREE] * count
                size = 0 if slots is None else len(slots)
                wanted = topic in topics
            if slots is None or not 0 <= partition < size:
                continue
            any_claim = True
            current = slots[partition]
            if current == FREE:
                slots[partition] = index
                if wanted:
                    mine.append(claim)
                else:
                    unsubscribed.append(claim)
                continue
            contested = True
            if current == index:
                continue
            rival = tie_generation[claim] if current == TIED else generations[current]
            if generation > rival:
                slots[partition] = index
                tie_generation.pop(claim, None)
            elif generation == rival:
                slots[partition] = TIED
                tie_generation[claim] = generation
    claimant = {topic: slots[:] for topic, slots in owner.items()} if any_claim else {}
    for topic, partition in tie_generation:
        owner[topic][partition] = FREE
    if not contested:
        for topic, partition in unsubscribed:
            owner[topic][partition] = FREE
        return Claims(owner=owner, kept=kept, claimant=claimant, any_claim=any_claim)
    for index, subscription in enumerate(subscriptions):
        mine = kept[index]
        mine.clear()
        if not subscription.owned:
            continue
        topics = topics_of[index]
        for claim in dict.fromkeys(subscription.owned):
            topic, partition = claim
            slots = owner.get(topic)
            if slots is None or not 0 <= partition < len(slots) or slots[partition] != index:
                continue
            if topic in topics:
                mine.append(claim)
            else:
                slots[partition] = FREE
    return Claims(owner=owner, kept=kept, claimant=claimant, any_claim=any_claim)


def hold_back(
    claims: Claims, member: int, partitions: list[api.TopicPartition]
) -> list[api.TopicPartition]:
    """The cooperative rule: drop partitions another member still holds (or two claim)."""
    claimant = claims.claimant
    kept = []
    for claim in partitions:
        slots = claimant.get(claim[0])
        if slots is None:
            kept.append(claim)
            continue
        holder = slots[claim[1]]
        if holder in (FREE, member):
            kept.append(claim)
    return kept
