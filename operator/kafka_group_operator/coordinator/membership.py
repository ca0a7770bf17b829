"""Membership handlers: heartbeat (join, reconcile, leave), static members, expiry, configuration.

Each handler reads the groups' hard state, validates the request (raising a
``CoordinatorError``), and returns the records that express the change plus the response. It
never mutates hard state; only the soft state below is touched here:

* ``Deadlines``: session and rebalance timers (armed by heartbeats, as Kafka's timers are);
* the broker's topic metadata, fed by ``update_topics``.

Records are ordered so that replaying them one at a time only walks legal transitions
(``group_state``): the group-epoch bump comes before a new member's subscription, a
replaced static member's current assignment is tombstoned before its successor claims the
same partitions, and removed members go before the group's own records.

KIP-848 in one paragraph: a change of membership, subscription, topic metadata or group
configuration bumps the group epoch; when the group epoch is ahead of the target-assignment
epoch the assignor runs (owned = the current target, generation = the assignment epoch) and
writes a new target at the group epoch; every member then reconciles toward its target on
its own heartbeats (``reconciliation``), revoking before anything is handed over.

Classic-protocol members (``classic``) join through the same heartbeat: their requests carry
``classic`` metadata (kept in the subscription record, whose session timeout arms their
session timer), report owned partitions when joining, and may take over an active static
member's instance id.
"""

from __future__ import annotations

import itertools
import logging
import operator
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import NamedTuple, TypeVar

from kafka_group_operator.assignors import api as assignor_api
from kafka_group_operator.coordinator import (
    errors,
    group,
    group_state,
    messages,
    reconciliation,
    result,
    timers,
)
from kafka_group_operator.coordinator import records as coordinator_records
from kafka_group_records import records as schema

logger = logging.getLogger(__name__)

TopicIdAssignment = coordinator_records.TopicIdAssignment
MemberState = group_state.MemberState
Subscription = schema.ConsumerGroupMemberMetadataValue
T = TypeVar("T")

# A target is not handed out at once: reconciliation revokes every partition before it
# assigns it elsewhere. So a cooperative assignor's hold-back round (for clients that would
# otherwise own a partition twice) only delays a complete target; its eager twin computes
# the same balanced, sticky target in one call.
_EAGER_TWINS = {"cooperative-sticky": "sticky"}
# An assignor without a twin that still holds partitions back is rerun (owned = the previous
# round) until everything is assigned. Two rounds suffice; the cap guards the loop.
_MAX_ASSIGNOR_ROUNDS = 3


class _Candidate(NamedTuple):
    """A member as the assignor will see it: subscription and current target.

    A named tuple rather than a dataclass: a rebalance builds one per member, and a tuple
    is several times cheaper to build.
    """

    subscription: Subscription
    target: TopicIdAssignment


class Membership:
    def __init__(
        self,
        groups: Mapping[str, group.ConsumerGroup],
        assignors: Mapping[str, assignor_api.PartitionAssignor],
        deadlines: timers.Deadlines,
    ) -> None:
        self._groups = groups
        self._assignors = assignors
        self._deadlines = deadlines
        # name -> metadata, as last fed by the runtime; None until the first feed, and then
        # groups keep the metadata in their records (after a restart nothing is "deleted").
        self.topic_feed: dict[str, schema.TopicMetadata] | None = None

    def on(self, groups: Mapping[str, group.ConsumerGroup]) -> Membership:
        """The same handlers over ``groups`` (a group about to be written, e.g. converted
        from a classic group, over the real ones); they share the soft state."""
        other = Membership(groups, self._assignors, self._deadlines)
        other.topic_feed = self.topic_feed
        return other

    # -----------------------------------------------------------------------------------
    # Heartbeat

    def heartbeat(
        self, request: messages.HeartbeatRequest, now_ms: int
    ) -> result.Result[messages.HeartbeatResponse]:
        self._validate_heartbeat(request)
        if request.member_epoch in (messages.LEAVE_EPOCH, messages.STATIC_LEAVE_EPOCH):
            return self._leave(request, now_ms)
        existing = self._groups.get(request.group_id)
        replaced: group.Member | None = None
        if request.member_epoch == messages.JOIN_EPOCH:
            member, replaced = self._resolve_joining(existing, request)
        else:
            member = self._resolve_heartbeating(existing, request)
        group_id, member_id = request.group_id, request.member_id
        base = member if member is not None else replaced
        settings = existing.settings if existing is not None else group.DEFAULT_CONFIG
        old_subscription = base.subscription() if base is not None else None
        subscription = self._subscription(request, old_subscription, settings)

        records: list[schema.Record] = []
        group_epoch = existing.group_epoch if existing is not None else 0
        assignment_epoch = existing.assignment_epoch if existing is not None else 0
        bump = base is None or _affects_assignment(old_subscription, subscription)
        # Only a rebalance looks at the group's topics: a steady heartbeat stays O(1).
        topics: dict[str, schema.TopicMetadata] | None = None
        if bump:
            group_epoch += 1
            records.append(coordinator_records.new_group_epoch_record(group_id, group_epoch))
            topics = self._topics_for(
                existing, _names_after(existing, old_subscription, subscription)
            )
            if topics != self._group_topics(existing):
                records.append(
                    coordinator_records.new_partition_metadata_record(group_id, topics.values())
                )
        if member is None or not member.has_subscription or subscription != old_subscription:
            records.append(
                coordinator_records.new_member_subscription_record(
                    group_id, member_id, subscription
                )
            )
        if existing is not None and not existing.members and _recorded_empty(existing):
            records.append(coordinator_records.new_group_lifecycle_record(group_id, -1))

        targets: Mapping[str, TopicIdAssignment] = existing.target if existing is not None else {}
        if group_epoch > assignment_epoch:
            candidates = self._candidates(existing, exclude=replaced)
            inherited = targets.get(replaced.member_id, {}) if replaced is not None else None
            own_target = targets.get(member_id, {}) if inherited is None else inherited
            candidates[member_id] = _Candidate(subscription, own_target)
            if topics is None:
                topics = self._group_topics(existing)
            target_records, targets = self._assign(
                group_id, settings, candidates, topics, assignment_epoch, group_epoch
            )
            records.extend(target_records)
            assignment_epoch = group_epoch
        elif replaced is not None:
            # A returning static member inherits its predecessor's target: nothing moves.
            inherited_target = targets.get(replaced.member_id, {})
            records.append(
                coordinator_records.new_target_assignment_record(
                    group_id, member_id, inherited_target
                )
            )
            targets = {member_id: inherited_target}

        if replaced is not None and replaced.has_current_assignment:
            records.append(
                coordinator_records.new_current_assignment_tombstone(group_id, replaced.member_id)
            )
        current = _current_of(member, replaced)
        owned = self._owned(existing, request)
        released = replaced.member_id if replaced is not None else None
        owners = existing.owners if existing is not None else {}

        def is_free(topic_id: uuid.UUID, partition: int) -> bool:
            owner = owners.get((topic_id, partition))
            return owner is None or owner in (member_id, released)

        next_current = reconciliation.reconcile(
            current, targets.get(member_id, {}), assignment_epoch, owned, is_free
        )
        stored = current_assignment_of(member) if member is not None else None
        if (
            member is None
            or not member.has_current_assignment
            or next_current != stored
            or replaced is not None
        ):
            records.append(_current_record(group_id, member_id, next_current))
        if replaced is not None:
            assert existing is not None
            records.extend(member_tombstones(existing, replaced, skip_current=True))

        self._arm_member_timers(group_id, member_id, next_current, subscription, settings, now_ms)
        # The assignment goes out when it changed, and whenever the member reports owning
        # something else: a member whose last response was lost learns it again (and one
        # still revoking is reminded what to keep).
        send_assignment = (
            request.member_epoch == messages.JOIN_EPOCH
            or stored is None
            or next_current.assigned != stored.assigned
            or (owned is not None and owned != next_current.assigned)
        )
        response = messages.HeartbeatResponse(
            member_id=member_id,
            member_epoch=next_current.member_epoch,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            assignment=(
                _by_name(next_current.assigned, self._names(existing, topics or {}))
                if send_assignment
                else None
            ),
        )
        return result.Result(response, records)

    def _validate_heartbeat(self, request: messages.HeartbeatRequest) -> None:
        if not request.group_id:
            raise errors.InvalidRequest("GroupId can't be empty.")
        if not request.member_id:
            raise errors.InvalidRequest("MemberId can't be empty: the member generates it.")
        if request.member_epoch < messages.STATIC_LEAVE_EPOCH:
            raise errors.InvalidRequest(f"MemberEpoch {request.member_epoch} is invalid.")
        if request.instance_id == "":
            raise errors.InvalidRequest("InstanceId can't be empty.")
        if request.rebalance_timeout_ms is not None and request.rebalance_timeout_ms <= 0:
            raise errors.InvalidRequest("RebalanceTimeoutMs must be positive.")
        if request.server_assignor is not None and request.server_assignor not in self._assignors:
            raise errors.UnsupportedAssignor(
                f"ServerAssignor {request.server_assignor!r} is not supported."
            )
        # A classic member's JoinGroup reports what it still owns (its subscription's owned
        # partitions): that is how it revokes.
        if (
            request.member_epoch == messages.JOIN_EPOCH
            and request.owned_partitions
            and request.classic is None
        ):
            raise errors.InvalidRequest("TopicPartitions must be empty when (re-)joining.")

    def _resolve_joining(
        self, existing: group.ConsumerGroup | None, request: messages.HeartbeatRequest
    ) -> tuple[group.Member | None, group.Member | None]:
        """The joining member if it is known (a rejoin), and the static member it replaces."""
        member = existing.members.get(request.member_id) if existing is not None else None
        if (
            member is not None
            and request.instance_id is not None
            and member.instance_id not in (None, request.instance_id)
        ):
            raise errors.ConflictingRequest(
                f"Member {request.member_id} can't change its InstanceId."
            )
        if existing is None or request.instance_id is None:
            return member, None
        holder = existing.member_for_instance(request.instance_id)
        if holder is None or holder.member_id == request.member_id:
            return member, None
        # A classic static member that joins without a member id replaces the holder of its
        # instance id at once (KIP-345): the old member id is fenced from then on.
        if holder.member_epoch != messages.STATIC_LEAVE_EPOCH and request.classic is None:
            raise errors.UnreleasedInstanceId(
                f"Static member {holder.member_id} with instance id {request.instance_id} "
                "is still active."
            )
        if member is not None:
            raise errors.ConflictingRequest(
                f"Member {request.member_id} already exists and can't take over "
                f"instance id {request.instance_id}."
            )
        return None, holder

    def _resolve_heartbeating(
        self, existing: group.ConsumerGroup | None, request: messages.HeartbeatRequest
    ) -> group.Member:
        member = self._known_member(existing, request)
        received = request.member_epoch
        if received > member.member_epoch:
            raise errors.FencedMemberEpoch(
                f"Member epoch {received} is ahead of the coordinator's {member.member_epoch}."
            )
        if received < member.member_epoch:
            owned = self._owned(existing, request)
            if (
                owned is None
                or received != member.previous_member_epoch
                or not reconciliation.is_subset(owned, member.assigned)
            ):
                raise errors.FencedMemberEpoch(
                    f"Member epoch {received} is behind the coordinator's {member.member_epoch}."
                )
        return member

    def _known_member(
        self, existing: group.ConsumerGroup | None, request: messages.HeartbeatRequest
    ) -> group.Member:
        """The member a heartbeat or leave names; zombies of a static instance are fenced."""
        if existing is None:
            raise errors.UnknownMemberId(f"Group {request.group_id} has no members.")
        if request.instance_id is not None:
            holder_id = existing.static_members.get(request.instance_id)
            if holder_id is None:
                raise errors.UnknownMemberId(f"Instance id {request.instance_id} is unknown.")
            if holder_id != request.member_id:
                raise errors.FencedInstanceId(
                    f"Instance id {request.instance_id} belongs to member {holder_id}."
                )
        member = existing.members.get(request.member_id)
        if member is None or not member.has_subscription:
            raise errors.UnknownMemberId(f"Member {request.member_id} is not in the group.")
        return member

    def _subscription(
        self,
        request: messages.HeartbeatRequest,
        old: Subscription | None,
        settings: schema.GroupConfigValue,
    ) -> Subscription:
        # None in a request means "unchanged" (KIP-848); a first join falls back to the
        # topics the operator configured for the group.
        if request.subscribed_topic_names is not None:
            topic_names = tuple(sorted(set(request.subscribed_topic_names)))
        elif old is not None:
            topic_names = old.subscribed_topic_names
        else:
            topic_names = tuple(sorted(set(settings.topics)))
        return Subscription(
            instance_id=_given(request.instance_id, old.instance_id if old else None),
            rack_id=_given(request.rack_id, old.rack_id if old else None),
            client_id=request.client_id or (old.client_id if old else ""),
            client_host=request.client_host or (old.client_host if old else ""),
            subscribed_topic_names=topic_names,
            subscribed_topic_regex=None,
            rebalance_timeout_ms=_given(
                request.rebalance_timeout_ms, old.rebalance_timeout_ms if old else -1
            ),
            server_assignor=_given(request.server_assignor, old.server_assignor if old else None),
            classic_member_metadata=request.classic,
        )

    def _owned(
        self, existing: group.ConsumerGroup | None, request: messages.HeartbeatRequest
    ) -> TopicIdAssignment | None:
        if request.owned_partitions is None:
            return None
        if not request.owned_partitions:
            return {}
        ids = existing.topic_ids_by_name if existing is not None else {}
        owned: dict[uuid.UUID, frozenset[int]] = {}
        for name, partitions in request.owned_partitions.items():
            topic_id = ids.get(name)
            if topic_id is not None and partitions:
                owned[topic_id] = frozenset(partitions)
            elif partitions:
                # A deleted or unsubscribed topic: the claim says nothing the group keeps,
                # as Kafka's assignors drop it too.
                logger.info(
                    "group %s: member %s reports %s partitions %s the group does not know: dropped",
                    request.group_id,
                    request.member_id,
                    name,
                    sorted(partitions),
                )
        return owned

    def _arm_member_timers(
        self,
        group_id: str,
        member_id: str,
        current: reconciliation.CurrentAssignment,
        subscription: Subscription,
        settings: schema.GroupConfigValue,
        now_ms: int,
    ) -> None:
        self._deadlines.arm(
            timers.session_key(group_id, member_id),
            now_ms + session_timeout_ms(subscription, settings),
        )
        rebalance_key = timers.rebalance_key(group_id, member_id)
        if current.state is MemberState.UNREVOKED_PARTITIONS:
            armed = self._deadlines.get(rebalance_key)
            # Armed once per epoch: the member has the whole timeout to revoke (Kafka).
            if armed is None or armed.tag != current.member_epoch:
                timeout = rebalance_timeout_ms(subscription, settings)
                self._deadlines.arm(rebalance_key, now_ms + timeout, current.member_epoch)

    # -----------------------------------------------------------------------------------
    # Leaving, removal and expiry

    def _leave(
        self, request: messages.HeartbeatRequest, now_ms: int
    ) -> result.Result[messages.HeartbeatResponse]:
        existing = self._groups.get(request.group_id)
        member = self._known_member(existing, request)
        assert existing is not None
        settings = existing.settings
        response = messages.HeartbeatResponse(
            member_id=member.member_id,
            member_epoch=request.member_epoch,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
        )
        if request.member_epoch == messages.LEAVE_EPOCH:
            return result.Result(
                response, self.removal_records(existing, [member.member_id], now_ms)
            )
        if member.instance_id is None:
            raise errors.ConflictingRequest("Only a static member can leave with epoch -2.")
        # The member keeps its assignment for the session timeout; what it was revoking is
        # released, since a stopped consumer holds nothing.
        self._deadlines.arm(
            timers.session_key(existing.group_id, member.member_id),
            now_ms + settings.session_timeout_ms,
        )
        if member.member_epoch == messages.STATIC_LEAVE_EPOCH:
            return result.Result(response, [])
        away = reconciliation.CurrentAssignment(
            member_epoch=messages.STATIC_LEAVE_EPOCH,
            previous_member_epoch=member.member_epoch,
            state=MemberState.STABLE,
            assigned=member.assigned,
            pending_revocation={},
        )
        return result.Result(response, [_current_record(existing.group_id, member.member_id, away)])

    def remove_members(
        self, request: messages.RemoveMembersRequest, now_ms: int
    ) -> result.Result[dict[str, str | None]]:
        existing = self._groups.get(request.group_id)
        if existing is None:
            raise errors.GroupIdNotFound(f"Group {request.group_id} does not exist.")
        outcome: dict[str, str | None] = {}
        leaving: list[str] = []
        for instance_id in request.instance_ids:
            member = existing.member_for_instance(instance_id)
            if member is None:
                outcome[instance_id] = errors.UnknownMemberId.name
            else:
                outcome[instance_id] = None
                if member.member_id not in leaving:
                    leaving.append(member.member_id)
        records = self.removal_records(existing, leaving, now_ms) if leaving else []
        return result.Result(outcome, records)

    def removal_records(
        self, existing: group.ConsumerGroup, member_ids: Iterable[str], now_ms: int
    ) -> list[schema.Record]:
        """Permanent leave of ``member_ids``: their partitions are freed at once."""
        leaving = [existing.members[member_id] for member_id in member_ids]
        group_id = existing.group_id
        group_epoch = existing.group_epoch + 1
        records = [coordinator_records.new_group_epoch_record(group_id, group_epoch)]
        for member in leaving:
            records.extend(member_tombstones(existing, member))
        gone = {member.member_id for member in leaving}
        remaining = {
            member_id: member
            for member_id, member in existing.members.items()
            if member_id not in gone
        }
        if not remaining:
            records.append(coordinator_records.new_group_lifecycle_record(group_id, now_ms))
        names = {name for member in remaining.values() for name in member.subscribed_topic_names}
        topics = self._topics_for(existing, names, leaving=frozenset(gone))
        if topics != self._group_topics(existing):
            records.append(
                coordinator_records.new_partition_metadata_record(group_id, topics.values())
            )
        candidates = {
            member_id: _Candidate(member.subscription(), existing.target.get(member_id, {}))
            for member_id, member in remaining.items()
        }
        target_records, _ = self._assign(
            group_id,
            existing.settings,
            candidates,
            topics,
            existing.assignment_epoch,
            group_epoch,
        )
        records.extend(target_records)
        return records

    # -----------------------------------------------------------------------------------
    # Configuration and topic metadata

    def configure_group(self, settings: messages.GroupSettings, now_ms: int) -> result.Result[None]:
        if not settings.group_id:
            raise errors.InvalidRequest("GroupId can't be empty.")
        if settings.assignor not in self._assignors:
            raise errors.UnsupportedAssignor(f"Assignor {settings.assignor!r} is not supported.")
        if settings.session_timeout_ms <= 0:
            raise errors.InvalidSessionTimeout("The session timeout must be positive.")
        for name in ("rebalance_timeout_ms", "heartbeat_interval_ms", "offsets_retention_ms"):
            if getattr(settings, name) <= 0:
                raise errors.InvalidRequest(f"{name} must be positive.")
        config = coordinator_records.group_config_from_settings(settings)
        existing = self._groups.get(settings.group_id)
        old = existing.settings if existing is not None else group.DEFAULT_CONFIG
        if config.assignment_paused and existing is not None:
            # Pausing keeps every member's target in the config record (so that it
            # survives restarts and compaction), for the resume to hand back.
            kept = old.paused_targets if old.assignment_paused else _paused_targets(existing)
            config = replace(config, paused_targets=kept)
        if existing is not None and existing.config == config:
            return result.Result(None, [])
        group_id = settings.group_id
        config_record = coordinator_records.new_group_config_record(group_id, config)
        if (
            existing is None
            or not existing.members
            or (old.assignor, old.assignment_paused) == (config.assignor, config.assignment_paused)
        ):
            return result.Result(None, [config_record])
        # A new assignor or a pause changes every member's target: a new group epoch. The
        # bump goes first so that the group passes through ASSIGNING.
        group_epoch = existing.group_epoch + 1
        records = [coordinator_records.new_group_epoch_record(group_id, group_epoch), config_record]
        resumed = (
            {
                target.member_id: coordinator_records.from_topic_partitions(target.topic_partitions)
                for target in old.paused_targets
            }
            if old.assignment_paused and not config.assignment_paused
            else None
        )
        target_records, _ = self._assign(
            group_id,
            config,
            self._candidates(existing),
            self._group_topics(existing),
            existing.assignment_epoch,
            group_epoch,
            owned_before_pause=resumed,
        )
        records.extend(target_records)
        return result.Result(None, records)

    def update_topics(
        self, topics: Mapping[str, messages.TopicInfo], now_ms: int
    ) -> result.Result[None]:
        """Take the broker's metadata and rebalance the groups whose subscribed topics changed.

        ``topics`` is a snapshot of every topic (absent = does not exist), not a delta. The
        feed is soft state and is kept at once: groups are compared with it again on every
        later membership change, and a runtime that loses a write reloads the shard, which
        starts without a feed.
        """
        feed = {name: _topic_metadata(info) for name, info in topics.items()}
        previous = self.topic_feed
        if previous == feed:
            return result.Result(None, [])
        changed = (
            None
            if previous is None
            else {
                name
                for name in previous.keys() | feed.keys()
                if previous.get(name) != feed.get(name)
            }
        )
        self.topic_feed = feed
        records: list[schema.Record] = []
        for existing in self._groups.values():
            if not existing.members:
                continue
            names = set(existing.subscribed_topics)
            if changed is not None and names.isdisjoint(changed):
                continue
            group_topics = self._topics_for(existing, names)
            if group_topics == self._group_topics(existing):
                continue
            group_id = existing.group_id
            group_epoch = existing.group_epoch + 1
            records.append(coordinator_records.new_group_epoch_record(group_id, group_epoch))
            records.append(
                coordinator_records.new_partition_metadata_record(group_id, group_topics.values())
            )
            target_records, _ = self._assign(
                group_id,
                existing.settings,
                self._candidates(existing),
                group_topics,
                existing.assignment_epoch,
                group_epoch,
            )
            records.extend(target_records)
        return result.Result(None, records)

    # -----------------------------------------------------------------------------------
    # Target assignment

    def _assign(
        self,
        group_id: str,
        settings: schema.GroupConfigValue,
        candidates: Mapping[str, _Candidate],
        topics: Mapping[str, schema.TopicMetadata],
        assignment_epoch: int,
        group_epoch: int,
        owned_before_pause: Mapping[str, TopicIdAssignment] | None = None,
    ) -> tuple[list[schema.Record], dict[str, TopicIdAssignment]]:
        """Run the assignor and return the target records (changed members only + epoch).

        On a resume, ``owned_before_pause`` gives each member's target from before the
        pause: the assignor sees it as owned (the current targets are all empty), so that
        a sticky assignor hands every member back what it had.
        """
        if settings.assignment_paused or not candidates:
            # A paused group's target is empty: every member revokes, cooperatively.
            targets: dict[str, TopicIdAssignment] = {member_id: {} for member_id in candidates}
        else:
            assignor_input = candidates
            if owned_before_pause:
                assignor_input = {
                    member_id: candidate._replace(target=owned_before_pause[member_id])
                    if not candidate.target and member_id in owned_before_pause
                    else candidate
                    for member_id, candidate in candidates.items()
                }
            targets = self._run_assignor(settings, assignor_input, topics, assignment_epoch)
        records = [
            coordinator_records.new_target_assignment_record(group_id, member_id, target)
            for member_id, target in sorted(targets.items())
            if (
                candidates[member_id].target is not target
                and candidates[member_id].target != target
            )
            or self._is_new_target(group_id, member_id)
        ]
        records.append(
            coordinator_records.new_target_assignment_epoch_record(group_id, group_epoch)
        )
        return records, targets

    def _is_new_target(self, group_id: str, member_id: str) -> bool:
        existing = self._groups.get(group_id)
        return existing is None or member_id not in existing.target

    def _run_assignor(
        self,
        settings: schema.GroupConfigValue,
        candidates: Mapping[str, _Candidate],
        topics: Mapping[str, schema.TopicMetadata],
        assignment_epoch: int,
    ) -> dict[str, TopicIdAssignment]:
        assignor = self._assignors.get(settings.assignor)
        if assignor is None:
            raise errors.UnsupportedAssignor(f"Assignor {settings.assignor!r} is not supported.")
        assignor = self._assignors.get(_EAGER_TWINS.get(settings.assignor, ""), assignor)
        names = {metadata.topic_id: name for name, metadata in topics.items()}
        subscribed = {
            name
            for candidate in candidates.values()
            for name in candidate.subscription.subscribed_topic_names
            if name in topics
        }
        partitions_per_topic = {name: topics[name].num_partitions for name in sorted(subscribed)}
        partition_racks = {
            name: [frozenset(p.racks) for p in topics[name].partition_metadata]
            for name in partitions_per_topic
            if any(p.racks for p in topics[name].partition_metadata)
        }
        # Members mostly share a few subscriptions: build each topic set once.
        topic_sets: dict[tuple[str, ...], frozenset[str]] = {}
        members: dict[str, assignor_api.MemberSubscription] = {}
        # Members whose whole current target is in their ``owned``: when the assignor gives
        # exactly that back (most members of a rebalance), the target mapping is reused.
        whole: set[str] = set()
        for member_id, candidate in candidates.items():
            names_subscribed = candidate.subscription.subscribed_topic_names
            member_topics = topic_sets.get(names_subscribed)
            if member_topics is None:
                member_topics = topic_sets[names_subscribed] = (
                    frozenset(names_subscribed) & subscribed
                )
            owned: list[assignor_api.TopicPartition] = []
            is_whole = True
            for topic_id, parts in candidate.target.items():
                name = names.get(topic_id)
                if name is None or not parts:
                    is_whole = False
                else:
                    owned.extend(zip(itertools.repeat(name), sorted(parts)))
            if is_whole:
                whole.add(member_id)
            members[member_id] = assignor_api.MemberSubscription(
                topics=member_topics,
                owned=tuple(owned),
                generation=assignment_epoch,
                rack=candidate.subscription.rack_id,
                instance_id=candidate.subscription.instance_id,
            )
        # Every topic in partitions_per_topic has a subscriber, by construction.
        total = sum(partitions_per_topic.values())
        generation = assignment_epoch
        spec = assignor_api.GroupSpec(members, partitions_per_topic, partition_racks)
        for _ in range(_MAX_ASSIGNOR_ROUNDS):
            try:
                assigned = assignor.assign(spec)
            except assignor_api.AssignorError as exc:
                raise errors.CoordinatorError(f"Assignor {assignor.name} failed: {exc}") from exc
            if sum(len(parts) for parts in assigned.values()) >= total:
                break
            generation += 1
            spec = assignor_api.GroupSpec(
                {
                    member_id: replace(
                        member, owned=tuple(assigned.get(member_id, ())), generation=generation
                    )
                    for member_id, member in members.items()
                },
                partitions_per_topic,
                partition_racks,
            )
        ids = {name: metadata.topic_id for name, metadata in topics.items()}
        by_topic, partition_of = operator.itemgetter(0), operator.itemgetter(1)
        targets: dict[str, TopicIdAssignment] = {}
        for member_id, candidate in candidates.items():
            given = assigned.get(member_id, ())
            if member_id in whole and members[member_id].owned == tuple(given):
                targets[member_id] = candidate.target
                continue
            # An assignor's lists are sorted by (topic, partition): one run per topic.
            targets[member_id] = {
                ids[name]: frozenset(map(partition_of, run))
                for name, run in itertools.groupby(given, by_topic)
            }
        return targets

    def _candidates(
        self, existing: group.ConsumerGroup | None, exclude: group.Member | None = None
    ) -> dict[str, _Candidate]:
        if existing is None:
            return {}
        return {
            member_id: _Candidate(member.subscription(), existing.target.get(member_id, {}))
            for member_id, member in existing.members.items()
            if member is not exclude
        }

    # -----------------------------------------------------------------------------------
    # Topic metadata

    def _topics_for(
        self,
        existing: group.ConsumerGroup | None,
        names: Iterable[str],
        leaving: frozenset[str] = frozenset(),
    ) -> dict[str, schema.TopicMetadata]:
        """The metadata the group should record: its subscribed ``names`` (unknown topics
        left out), plus every topic a member other than ``leaving`` still holds.

        Members report owned partitions by topic name. A topic nobody subscribes to any
        more stays in the record while someone still holds its partitions, so that the
        name keeps resolving and those partitions count as owned until really released.
        """
        feed = self.topic_feed
        stored = self._group_topics(existing)
        source = feed if feed is not None else stored
        topics = {name: source[name] for name in sorted(names) if name in source}
        unsubscribed = (
            {}
            if existing is None
            else {
                topic_id: metadata
                for topic_id, metadata in existing.topics.items()
                if metadata.topic_name not in topics
            }
        )
        if existing is not None and unsubscribed:
            # Usually every recorded topic is still subscribed and nothing is scanned.
            held = {
                topic_id
                for (topic_id, _), owner in existing.owners.items()
                if topic_id in unsubscribed and owner not in leaving
            }
            for topic_id in held:
                metadata = unsubscribed[topic_id]
                if metadata.topic_name in topics:
                    continue
                if feed is not None:
                    # A deleted (or re-created) topic's partitions are gone: nothing to keep.
                    current = feed.get(metadata.topic_name)
                    if current is None or current.topic_id != topic_id:
                        continue
                    metadata = current
                topics[metadata.topic_name] = metadata
        return dict(sorted(topics.items()))

    @staticmethod
    def _group_topics(existing: group.ConsumerGroup | None) -> dict[str, schema.TopicMetadata]:
        if existing is None:
            return {}
        return {metadata.topic_name: metadata for metadata in existing.topics.values()}

    def _names(
        self, existing: group.ConsumerGroup | None, topics: Mapping[str, schema.TopicMetadata]
    ) -> dict[uuid.UUID, str]:
        names = {metadata.topic_id: name for name, metadata in topics.items()}
        if existing is not None:
            for topic_id, metadata in existing.topics.items():
                names.setdefault(topic_id, metadata.topic_name)
        return names


# ---------------------------------------------------------------------------------------
# Helpers


def _paused_targets(existing: group.ConsumerGroup) -> tuple[schema.MemberTarget, ...]:
    """Every member's current target, as the config record keeps it while paused."""
    return tuple(
        schema.MemberTarget(member_id, coordinator_records.to_topic_partitions(target))
        for member_id, target in sorted(existing.target.items())
        if member_id in existing.members and target
    )


def session_timeout_ms(subscription: Subscription, settings: schema.GroupConfigValue) -> int:
    """A classic member's own session timeout (from its JoinGroup), else the group's."""
    classic = subscription.classic_member_metadata
    return classic.session_timeout_ms if classic is not None else settings.session_timeout_ms


def rebalance_timeout_ms(subscription: Subscription, settings: schema.GroupConfigValue) -> int:
    """The member's own ``max.poll.interval.ms`` when it sent one, else the group's."""
    if subscription.rebalance_timeout_ms > 0:
        return subscription.rebalance_timeout_ms
    return settings.rebalance_timeout_ms


def current_assignment_of(member: group.Member) -> reconciliation.CurrentAssignment:
    return reconciliation.CurrentAssignment(
        member_epoch=member.member_epoch,
        previous_member_epoch=member.previous_member_epoch,
        state=member.state,
        assigned=member.assigned,
        pending_revocation=member.pending_revocation,
    )


def _current_of(
    member: group.Member | None, replaced: group.Member | None
) -> reconciliation.CurrentAssignment:
    """Where reconciliation starts: the member itself, its static predecessor, or nothing."""
    source = replaced if replaced is not None else member
    if source is None:
        return reconciliation.NEW_MEMBER
    current = current_assignment_of(source)
    if source.member_epoch == messages.STATIC_LEAVE_EPOCH:
        # Back from a temporary leave: resume at the epoch it had before leaving, holding
        # what it held. UNRELEASED makes reconciliation compare that with the target again
        # (the member may have left before receiving all of it).
        epoch = source.previous_member_epoch
        current = reconciliation.CurrentAssignment(
            epoch, epoch, MemberState.UNRELEASED_PARTITIONS, source.assigned, {}
        )
    return current


def group_tombstones(existing: group.ConsumerGroup, *, keep_config: bool) -> list[schema.Record]:
    """Tombstones for every record of the group: members first, the group epoch last.

    That order takes the group through EMPTY to DEAD. ``keep_config`` leaves the GroupConfig
    record (retention expiry: the operator's resource still exists).
    """
    group_id = existing.group_id
    records: list[schema.Record] = []
    for member_id in sorted(existing.members):
        records.extend(member_tombstones(existing, existing.members[member_id]))
    for member_id in sorted(existing.target.keys() - existing.members.keys()):
        records.append(coordinator_records.new_target_assignment_tombstone(group_id, member_id))
    if existing.has_target_epoch:
        records.append(coordinator_records.new_target_assignment_epoch_tombstone(group_id))
    if existing.has_partition_metadata:
        records.append(coordinator_records.new_partition_metadata_tombstone(group_id))
    if existing.config is not None and not keep_config:
        records.append(coordinator_records.new_group_config_tombstone(group_id))
    if existing.empty_since_ms is not None:
        records.append(coordinator_records.new_group_lifecycle_tombstone(group_id))
    if existing.has_group_epoch:
        records.append(coordinator_records.new_group_epoch_tombstone(group_id))
    return records


def member_tombstones(
    existing: group.ConsumerGroup, member: group.Member, *, skip_current: bool = False
) -> list[schema.Record]:
    group_id, member_id = existing.group_id, member.member_id
    records = []
    if member.has_current_assignment and not skip_current:
        records.append(coordinator_records.new_current_assignment_tombstone(group_id, member_id))
    if member_id in existing.target:
        records.append(coordinator_records.new_target_assignment_tombstone(group_id, member_id))
    if member.has_subscription:
        records.append(coordinator_records.new_member_subscription_tombstone(group_id, member_id))
    return records


def _current_record(
    group_id: str, member_id: str, current: reconciliation.CurrentAssignment
) -> schema.Record:
    return coordinator_records.new_current_assignment_record(
        group_id,
        member_id,
        member_epoch=current.member_epoch,
        previous_member_epoch=current.previous_member_epoch,
        state=current.state,
        assigned=current.assigned,
        pending_revocation=current.pending_revocation,
    )


def _affects_assignment(old: Subscription | None, new: Subscription) -> bool:
    return old is None or (old.subscribed_topic_names, old.rack_id, old.server_assignor) != (
        new.subscribed_topic_names,
        new.rack_id,
        new.server_assignor,
    )


def _names_after(
    existing: group.ConsumerGroup | None, old: Subscription | None, new: Subscription
) -> set[str]:
    """The group's subscribed topic names once this member's subscription has changed."""
    counts = existing.subscribed_topics if existing is not None else {}
    names = set(counts)
    if old is not None:
        names.difference_update(
            name for name in old.subscribed_topic_names if counts.get(name) == 1
        )
    names.update(new.subscribed_topic_names)
    return names


def _recorded_empty(existing: group.ConsumerGroup) -> bool:
    return existing.empty_since_ms is not None and existing.empty_since_ms >= 0


def _given(value: T | None, fallback: T) -> T:
    return fallback if value is None else value


def _by_name(
    assignment: TopicIdAssignment, names: Mapping[uuid.UUID, str]
) -> dict[str, frozenset[int]]:
    return {names.get(topic, str(topic)): parts for topic, parts in assignment.items() if parts}


def _topic_metadata(info: messages.TopicInfo) -> schema.TopicMetadata:
    topic_id = uuid.UUID(info.topic_id) if info.topic_id else uuid.UUID(int=0)
    if topic_id.int == 0:
        # No id from the broker (or Kafka's zero UUID): one every process derives alike.
        topic_id = schema.topic_id_for_name(info.name)
    racks = tuple(
        schema.PartitionMetadata(partition, tuple(sorted(replica_racks)))
        for partition, replica_racks in enumerate(info.partition_racks)
    )
    return schema.TopicMetadata(topic_id, info.name, info.num_partitions, racks)
