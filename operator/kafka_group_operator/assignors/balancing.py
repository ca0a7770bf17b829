"""The balance-first, then sticky engine behind ``sticky``, ``cooperative-sticky`` and ``uniform``.

Goals in order, as Kafka's ``AbstractStickyAssignor``: (1) balance, (2) rack alignment where
rack awareness applies, (3) stickiness.

Balance (the ``StickyAssignor`` javadoc rule): counts differ by at most one, or a member
with 2+ fewer partitions than another cannot take any of that member's partitions. Per
topic this reads: the most loaded member holding a partition of the topic has at most one
more partition than the least loaded subscriber of the topic. With equal subscriptions it
is simply max - min <= 1.

Two paths, chosen like Kafka's two builders:

* Equal subscriptions (the common case, and the one that must be fast): Kafka's
  ``ConstrainedAssignmentBuilder``, step for step. With P partitions and N members every
  member gets ``P // N`` (the low quota) and ``P % N`` of them one more. In member order, a
  member holding a high quota's worth keeps that many while high-quota slots remain;
  anyone else keeps at most the low quota. A member that must give some up keeps its claims
  in partition-then-topic order (t0p0, t1p0, t0p1, ...), so it keeps a share of each topic
  and the topics stay balanced across members. The free partitions (topics sorted,
  partitions ascending) are then dealt round-robin to the members below the low quota,
  each leaving the round when it reaches it, and what is left goes one each to the members
  at the low quota, first come first served. Rounds are dealt by slicing rather than
  per-partition bookkeeping. Example: C0, C1, C2 on t0..t3 with two partitions each,
  nothing owned: dealt as C0 ``[t0p0, t1p1, t3p0]``, C1 ``[t0p1, t2p0, t3p1]``, C2
  ``[t1p0, t2p1]``. When C1 leaves, C0 and C2 keep theirs and C1's three go in order:
  t0p1 to C0, which is then full, t2p0 and t3p1 to C2.
* Unequal subscriptions: keep every claim, give each free partition to the least loaded
  subscriber (topics with the fewest subscribers first; an aligned one when it is as
  little loaded), then, most loaded member first, move partitions (newly given ones before
  kept ones) to the least loaded subscriber of a topic the giver holds while it has 2+
  fewer. Each move lowers the sum of squared counts, so this ends. Claims are not moved for
  rack alignment here: without quotas, doing so can swap partitions back and forth between
  rounds.

Cooperative mode then holds back every partition given to a member other than the one
that still holds it (or that two members claim at the same generation): the holder sees it
missing, revokes it, and the next round hands it over.
"""

from __future__ import annotations

import heapq
import operator
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from kafka_group_operator.assignors import api, common


@dataclass(frozen=True, slots=True)
class Options:
    rack_aware: bool
    cooperative: bool
    # The KIP-848 server-side assignors reject a subscription to a topic without metadata.
    require_metadata: bool


def assign(spec: api.GroupSpec, options: Options) -> api.GroupAssignment:
    counts = spec.partitions_per_topic
    if options.require_metadata:
        missing = common.missing_topics(spec.members, counts)
        if missing:
            raise api.AssignorError(f"subscribed topics have no metadata: {', '.join(missing)}")
    order = common.member_order(spec.members)
    if not order:
        return {}
    subscriptions = [spec.members[member_id] for member_id in order]
    topics_of = common.usable_topics(subscriptions, counts)
    subscribed: set[str] = set()
    for topics in set(topics_of):
        subscribed.update(topics)
    claims = common.resolve_claims(subscriptions, topics_of, counts, subscribed)
    racks = _racks(spec, subscriptions, topics_of, subscribed, options)
    # usable_topics hands equal subscriptions out as one object: identity is the fast check.
    first = topics_of[0]
    homogeneous = all(topics is first or topics == first for topics in topics_of)
    if homogeneous:
        if racks is not None:
            _drop_misaligned_claims(claims, racks, topics_of)
        lists = _assign_equal(claims, sorted(subscribed), counts, racks, options)
    else:
        lists = _assign_unequal(claims, topics_of, subscribed, racks, options)
    return common.sorted_assignment(order, lists)


def _racks(
    spec: api.GroupSpec,
    subscriptions: list[api.MemberSubscription],
    topics_of: list[frozenset[str]],
    subscribed: set[str],
    options: Options,
) -> common.Racks | None:
    if not options.rack_aware:
        return None
    member_racks = [subscription.rack for subscription in subscriptions]
    if not common.rack_aware(
        member_racks, sorted(subscribed), spec.partitions_per_topic, spec.partition_racks
    ):
        return None
    return common.Racks(member_racks, spec.partition_racks)


def _drop_misaligned_claims(
    claims: common.Claims, racks: common.Racks, topics_of: list[frozenset[str]]
) -> None:
    """Free a claim whose replicas are on other racks, if a subscriber on such a rack exists.

    Rack alignment ranks above stickiness (KIP-881), but only a claim that some other
    subscriber could serve locally is worth moving; the freed partition goes back to its
    previous holder when no aligned member has room for it.
    """
    subscriber_racks: dict[str, set[str]] = defaultdict(set)
    for index, topics in enumerate(topics_of):
        rack = racks.member_racks[index]
        if rack is not None:
            for topic in topics:
                subscriber_racks[topic].add(rack)
    for index, mine in enumerate(claims.kept):
        rack = racks.member_racks[index]
        if rack is None or not mine:
            continue
        aligned = []
        for claim in mine:
            topic, partition = claim
            replica_racks = racks.replica_racks(topic, partition)
            if rack in replica_racks or replica_racks.isdisjoint(subscriber_racks[topic]):
                aligned.append(claim)
            else:
                claims.owner[topic][partition] = common.FREE
        mine[:] = aligned


def _free_partitions(owner: dict[str, list[int]], topics: list[str]) -> list[api.TopicPartition]:
    free: list[api.TopicPartition] = []
    for topic in topics:
        slots = owner[topic]
        free.extend([(topic, partition) for partition, holder in enumerate(slots) if holder < 0])
    return free


# Kafka keeps a member's first claims in this order: partition number, then topic. With
# several topics that spreads what a member keeps across them (t0p0, t1p0, t0p1, ...), so a
# member that must give up half keeps half of each topic.
_PARTITION_MAJOR = operator.itemgetter(1, 0)


_UNDER, _AT_LOW, _FULL = 0, 1, 2


@dataclass(slots=True)
class _Quotas:
    """Who may still take partitions, as Kafka's ``ConstrainedAssignmentBuilder`` tracks it.

    ``status[member]`` is ``_UNDER`` below the low quota, ``_AT_LOW`` at exactly the low
    quota while it may still take one of the ``extra_left`` high-quota slots, ``_FULL``
    otherwise. ``queue`` lists the members in the order they reached the low quota: the
    extra slots go to its ``_AT_LOW`` members first come, first served.
    """

    low: int
    extra_left: int
    status: list[int]
    queue: list[int]

    def under(self) -> list[int]:
        return [index for index, status in enumerate(self.status) if status == _UNDER]

    def at_low(self) -> list[int]:
        return [index for index in self.queue if self.status[index] == _AT_LOW]

    def reached_low(self, index: int) -> None:
        self.status[index] = _AT_LOW if self.extra_left > 0 else _FULL
        self.queue.append(index)

    def take_extra(self, index: int) -> None:
        self.status[index] = _FULL
        self.extra_left -= 1
        if self.extra_left == 0:
            # No slot is left: every member at the low quota is full (Kafka clears its list).
            for queued in self.queue:
                self.status[queued] = _FULL


def _assign_equal(
    claims: common.Claims,
    topics: list[str],
    counts: Mapping[str, int],
    racks: common.Racks | None,
    options: Options,
) -> list[list[api.TopicPartition]]:
    """Kafka's ``ConstrainedAssignmentBuilder``: keep claims up to quota, deal the rest."""
    owner = claims.owner
    kept = claims.kept
    members = len(kept)
    total = sum(counts[topic] for topic in topics)
    low_quota, extra = divmod(total, members)
    high_quota = low_quota + 1 if extra else low_quota

    # assignOwnedPartitions: in member order, a member with a high quota's worth of claims
    # keeps that many while high-quota slots remain; any other keeps at most the low quota
    # and, while slots remain, may take one more later.
    quotas = _Quotas(low_quota, extra, [_UNDER] * members, [])
    for index, mine in enumerate(kept):
        held = len(mine)
        if held < low_quota:
            continue
        if held >= high_quota and quotas.extra_left > 0:
            quotas.take_extra(index)
            quota = high_quota
        else:
            quotas.reached_low(index)
            quota = low_quota
        if held > quota:
            mine.sort(key=_PARTITION_MAJOR)
            for topic, partition in mine[quota:]:
                owner[topic][partition] = common.FREE
            del mine[quota:]

    fresh: list[list[api.TopicPartition]] = [[] for _ in range(members)]
    if racks is not None:
        _deal_aligned(claims, topics, racks, quotas, fresh)
    _deal(_free_partitions(owner, topics), kept, fresh, quotas)

    if options.cooperative and claims.any_claim:
        fresh = [common.hold_back(claims, index, mine) for index, mine in enumerate(fresh)]
    return [mine + new for mine, new in zip(kept, fresh, strict=True)]


def _deal_aligned(
    claims: common.Claims,
    topics: list[str],
    racks: common.Racks,
    quotas: _Quotas,
    fresh: list[list[api.TopicPartition]],
) -> None:
    """Give free partitions to members on a replica's rack, up to the low quota each."""
    owner = claims.owner
    kept = claims.kept
    waiting: dict[str, deque[int]] = defaultdict(deque)
    room = [0] * len(kept)
    for index in quotas.under():
        room[index] = quotas.low - len(kept[index])
        rack = racks.member_racks[index]
        if rack is not None:
            waiting[rack].append(index)
    for topic in topics if waiting else ():
        slots = owner[topic]
        for partition, holder in enumerate(slots):
            if holder >= 0:
                continue
            for rack in sorted(racks.replica_racks(topic, partition)):
                queue = waiting.get(rack)
                if not queue:
                    continue
                index = queue.popleft()
                fresh[index].append((topic, partition))
                slots[partition] = index
                room[index] -= 1
                if room[index] > 0:
                    queue.append(index)
                else:
                    quotas.reached_low(index)
                break
    _return_unplaced(claims, topics, quotas, fresh)


def _return_unplaced(
    claims: common.Claims,
    topics: list[str],
    quotas: _Quotas,
    fresh: list[list[api.TopicPartition]],
) -> None:
    """A freed, misaligned claim that no aligned member took returns to its holder."""
    owner = claims.owner
    claimant = claims.claimant
    for topic in topics:
        slots = owner[topic]
        previous = claimant.get(topic)
        if previous is None:
            continue
        for partition, holder in enumerate(slots):
            index = previous[partition]
            if holder >= 0 or index < 0:
                continue
            status = quotas.status[index]
            if status == _UNDER:
                if len(claims.kept[index]) + len(fresh[index]) + 1 == quotas.low:
                    quotas.reached_low(index)
            elif status == _AT_LOW:
                quotas.take_extra(index)
            else:
                continue
            fresh[index].append((topic, partition))
            slots[partition] = index


def _deal(
    free: list[api.TopicPartition],
    kept: list[list[api.TopicPartition]],
    fresh: list[list[api.TopicPartition]],
    quotas: _Quotas,
) -> None:
    """Kafka's ``assignRoundRobin``: ``free`` in order, round-robin over the members below
    the low quota (each leaving the round once it reaches it and queueing for one more),
    then one each to the members queued at the low quota. A full round is one strided slice.
    """
    active = quotas.under()
    need = {index: quotas.low - len(kept[index]) - len(fresh[index]) for index in active}
    start = dealt = 0
    for level in sorted(set(need.values())):
        width = len(active)
        end = start + (level - dealt) * width
        for offset, index in enumerate(active):
            fresh[index].extend(free[start + offset : end : width])
        start, dealt = end, level
        remaining: list[int] = []
        for index in active:
            if need[index] > level:
                remaining.append(index)
            else:
                quotas.reached_low(index)
        active = remaining
    for index, partition in zip(quotas.at_low(), free[start:], strict=False):
        fresh[index].append(partition)


def _assign_unequal(
    claims: common.Claims,
    topics_of: list[frozenset[str]],
    subscribed: set[str],
    racks: common.Racks | None,
    options: Options,
) -> list[list[api.TopicPartition]]:
    owner = claims.owner
    members = len(topics_of)
    subscribers = common.subscribers_by_topic(topics_of)
    held: list[dict[str, list[api.TopicPartition]]] = [{} for _ in range(members)]
    load = [0] * members
    for index, mine in enumerate(claims.kept):
        load[index] = len(mine)
        holding = held[index]
        for claim in mine:
            holding.setdefault(claim[0], []).append(claim)

    # Topics with the fewest possible subscribers first: they have the least choice.
    by_choice = sorted(subscribed, key=lambda topic: (len(subscribers[topic]), topic))
    for topic in by_choice:
        _give_free(topic, owner[topic], subscribers[topic], held, load, racks)
    shared = {topic: subscribers[topic] for topic in by_choice if len(subscribers[topic]) > 1}
    while _balance_sweep(shared, topics_of, held, load):
        pass

    lists: list[list[api.TopicPartition]] = []
    for index in range(members):
        partitions = [claim for group in held[index].values() for claim in group]
        if options.cooperative and claims.any_claim:
            partitions = common.hold_back(claims, index, partitions)
        lists.append(partitions)
    return lists


def _lowest(heap: list[tuple[int, int]], load: list[int]) -> int:
    """The least loaded member in a lazily updated min-heap of (load, member)."""
    while True:
        entry_load, index = heap[0]
        if entry_load == load[index]:
            return index
        if entry_load < load[index]:
            heapq.heapreplace(heap, (load[index], index))
        else:
            heapq.heappop(heap)


def _give_free(
    topic: str,
    slots: list[int],
    subscribers: list[int],
    held: list[dict[str, list[api.TopicPartition]]],
    load: list[int],
    racks: common.Racks | None,
) -> None:
    free = [partition for partition, holder in enumerate(slots) if holder < 0]
    if not free:
        return
    heap = [(load[index], index) for index in subscribers]
    heapq.heapify(heap)
    by_rack: dict[str, list[tuple[int, int]]] = {}
    if racks is not None:
        for index in subscribers:
            rack = racks.member_racks[index]
            if rack is not None:
                by_rack.setdefault(rack, []).append((load[index], index))
        for members_on_rack in by_rack.values():
            heapq.heapify(members_on_rack)
    for partition in free:
        chosen = _lowest(heap, load)
        if racks is not None and by_rack:
            # An aligned member wins only if it is as little loaded as the least loaded.
            for rack in sorted(racks.replica_racks(topic, partition)):
                aligned = by_rack.get(rack)
                if aligned:
                    candidate = _lowest(aligned, load)
                    if load[candidate] <= load[chosen]:
                        chosen = candidate
                        break
        held[chosen].setdefault(topic, []).append((topic, partition))
        slots[partition] = chosen
        load[chosen] += 1


def _balance_sweep(
    shared: dict[str, list[int]],
    topics_of: list[frozenset[str]],
    held: list[dict[str, list[api.TopicPartition]]],
    load: list[int],
) -> int:
    """One pass of moves, most loaded member first; returns the number of moves.

    The most loaded member gives one partition to the least loaded subscriber of any topic
    it holds, if that one has 2+ fewer, and goes back in line. Giving from the top keeps
    moves to what balance needs: a member is never drained below what a later, more loaded
    giver would have handed over anyway. A member that cannot give leaves the line; since
    later moves can lower a subscriber's count, the caller repeats until a pass moves
    nothing, and a pass that moves nothing is exactly the balance rule holding.
    """
    # Only a member 2+ above the least loaded possible taker can give: usually none or few.
    floor = min((load[i] for i, topics in enumerate(topics_of) if topics), default=0)
    givers = [index for index in range(len(load)) if load[index] >= floor + 2]
    if not givers:
        return 0
    # Least loaded subscriber per shared topic; counts go up and down, so every change
    # pushes a fresh entry and ``_lowest`` discards stale ones.
    least = {
        topic: [(load[index], index) for index in members] for topic, members in shared.items()
    }
    for entries in least.values():
        heapq.heapify(entries)
    most = [(-load[index], index) for index in givers]
    heapq.heapify(most)
    moves = 0
    while most:
        negative, giver = heapq.heappop(most)
        if -negative != load[giver]:
            continue
        best_topic = None
        best_taker = giver
        for topic, partitions in held[giver].items():
            candidates = least.get(topic)
            if candidates is None or not partitions:
                continue
            taker = _lowest(candidates, load)
            if load[taker] < load[best_taker]:
                best_topic, best_taker = topic, taker
        if best_topic is None or load[giver] < load[best_taker] + 2:
            continue
        # Newly given partitions sit at the end: they move before anything kept.
        claim = held[giver][best_topic].pop()
        held[best_taker].setdefault(best_topic, []).append(claim)
        load[giver] -= 1
        load[best_taker] += 1
        for topic in topics_of[giver]:
            candidates = least.get(topic)
            if candidates is not None:
                heapq.heappush(candidates, (load[giver], giver))
        heapq.heappush(most, (-load[giver], giver))
        heapq.heappush(most, (-load[best_taker], best_taker))
        moves += 1
    return moves
