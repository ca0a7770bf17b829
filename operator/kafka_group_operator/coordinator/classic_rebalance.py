"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup and the timers of classic groups (Kafka's rebalance).

A port of ``GroupMetadataManager``'s ``classicGroupJoinToClassicGroup``,
``classicGroupSyncToClassicGroup``, ``classicGroupHeartbeatToClassicGroup``,
``classicGroupLeaveToClassicGroup`` and their timer operations, method for method, onto
``classic_group.ClassicGroup``. The rebalance in one paragraph:

A join (a new member, a member with new metadata, the leader) moves the group to
PreparingRebalance. Joins are parked (``result.Deferred``) until every known member has
joined again, or the rebalance timeout (the longest of the members') passes; a new group
waits ``initial_rebalance_delay_ms`` first, extended while members keep arriving. Then
dynamic members that did not rejoin are removed, the generation is bumped, the protocol
selected, and every parked join is answered (the leader's with every member's metadata): the
group is CompletingRebalance. The leader's SyncGroup writes the group with its assignments
(``GroupMetadata`` record); once written, every parked SyncGroup gets its member's bytes and
the group is Stable. A member whose session passes without a heartbeat, or that leaves, or
that does not sync in time, starts the next rebalance.

Static members (KIP-345): a known ``group.instance.id`` joining without a member id takes
over the old member id's place (its assignment, its leadership); the old id's parked
requests are answered FENCED_INSTANCE_ID. In Stable, when the selected protocol would not
change, that takes no rebalance: the group is written with the new id and the member gets
the current generation (the leader, from JoinGroup v9, with ``skip_assignment``). Static
members that miss a rebalance are not removed by it, only by their session timeout.

Each handler works on a copy of the group (``_Round``) and returns it as a soft record with
the durable records and the parked requests' completions (see ``result``). Timers are the
shard's ``Deadlines``, armed and cancelled here as Kafka schedules and cancels its timer
tasks; a handler run by a timer looks the group up again, since it may have changed type or
gone since.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, MutableMapping
from typing import Any

from kafka_group_operator.coordinator import (
    classic_group,
    errors,
    group_state,
    messages,
    result,
    timers,
)
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import records as coordinator_records
from kafka_group_records import records as schema

logger = logging.getLogger(__name__)

State = group_state.ClassicGroupState
ClassicGroup = classic_group.ClassicGroup
ClassicMember = classic_group.ClassicMember


def _random_uuid() -> str:
    return str(uuid.uuid4())


class _Round:
    """One handler's work on one group: the copy it changes, what it writes, whom it answers.

    ``own`` is the key under which the request itself is parked, once it is; completing that
    key answers the request directly instead of through the runtime.
    """

    def __init__(self, group: ClassicGroup, now_ms: int) -> None:
        self.group = group
        self.now_ms = now_ms
        self.records: list[schema.Record] = []
        self.completions: list[result.Completion] = []
        self.own: result.DeferredKey | None = None
        self.answered = False
        self.response: Any = None
        self.error: errors.CoordinatorError | None = None

    def answer(self, response: Any = None, error: errors.CoordinatorError | None = None) -> None:
        self.answered, self.response, self.error = True, response, error

    def complete(
        self,
        key: result.DeferredKey,
        response: Any = None,
        error: errors.CoordinatorError | None = None,
    ) -> None:
        if key == self.own and not self.answered:
            self.answer(response, error)
        else:
            self.completions.append(result.Completion(key, response, error))

    def complete_join(
        self,
        member: ClassicMember,
        response: Any = None,
        error: errors.CoordinatorError | None = None,
    ) -> bool:
        """Kafka's ``completeJoinFuture``: only a member awaiting its join response."""
        if not member.awaiting_join:
            return False
        self.group.put(dataclasses.replace(member, awaiting_join=False))
        self.complete(result.join_key(self.group.group_id, member.member_id), response, error)
        return True

    def complete_sync(
        self,
        member: ClassicMember,
        response: Any = None,
        error: errors.CoordinatorError | None = None,
    ) -> bool:
        if not member.awaiting_sync:
            return False
        self.group.put(dataclasses.replace(member, awaiting_sync=False))
        self.complete(result.sync_key(self.group.group_id, member.member_id), response, error)
        return True

    def result(self, *, changed: bool = True) -> result.Result[Any]:
        soft: list[result.SoftRecord] = (
            [classic_group.ClassicGroupUpdated(self.group.group_id, self.group)] if changed else []
        )
        completions = self.completions
        if self.answered:
            if self.own is not None:
                # The request was parked under ``own`` and answered at once: an older request
                # still parked under that key (a retry of the same member) is superseded.
                completions = [
                    result.Completion(
                        self.own, error=errors.RebalanceInProgress("superseded by a newer request")
                    ),
                    *completions,
                ]
            response = self.response if self.error is None else result.Failed(self.error)
            return result.Result(response, self.records, soft, completions)
        if self.own is None:
            raise errors.InconsistentState("a classic request was neither answered nor parked")
        return result.Result(result.Deferred(self.own), self.records, soft, completions)


class ClassicRebalance:
    def __init__(
        self,
        groups: MutableMapping[str, ClassicGroup],
        deadlines: timers.Deadlines,
        settings: coordinator_config.CoordinatorConfig,
        new_uuid: Callable[[], str] = _random_uuid,
    ) -> None:
        # Read-only here: only replay changes it (``MutableMapping`` for the shard's sake).
        self._groups = groups
        self._deadlines = deadlines
        self._settings = settings
        self._new_uuid = new_uuid

    # -----------------------------------------------------------------------------------
    # JoinGroup

    def join(
        self,
        request: messages.ClassicJoinRequest,
        now_ms: int,
        preceding: list[schema.Record] | None = None,
    ) -> result.Result[Any]:
        """Kafka's ``classicGroupJoinToClassicGroup``; ``preceding`` are records to write
        first (the tombstones of an empty consumer group this group replaces)."""
        live = self._groups.get(request.group_id)
        is_new = live is None
        if live is None:
            if request.member_id:
                raise errors.UnknownMemberId(
                    f"Group {request.group_id} does not exist: join without a member id."
                )
            group = ClassicGroup(request.group_id, State.EMPTY, state_timestamp=now_ms)
        else:
            group = live.copy()
        work = _Round(group, now_ms)
        work.records.extend(preceding or ())
        written_before = len(work.records)
        if not self._accepts_joining_member(group, request.member_id):
            group.remove(request.member_id)
            work.answer(error=errors.GroupMaxSizeReached(f"Group {group.group_id} is full."))
        elif not request.member_id:
            self._join_new_member(work, request)
        else:
            self._join_existing_member(work, request)
        if is_new and len(work.records) == written_before:
            # Kafka commits a group a join created with an empty GroupMetadata record.
            work.records.append(
                coordinator_records.new_group_metadata_record(
                    group.group_id, group.empty_metadata_value()
                )
            )
        return work.result()

    def _accepts_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        limit = self._settings.classic_max_size
        state = group.state
        if state in (State.EMPTY, State.DEAD):
            return True
        if state is State.PREPARING_REBALANCE:
            # Counting awaiting members lets the last members to rejoin be the ones left out.
            member = group.members.get(member_id)
            return (member is not None and member.awaiting_join) or (
                group.awaiting_join_count < limit
            )
        return member_id in group.members or len(group.members) < limit

    def _join_new_member(self, work: _Round, request: messages.ClassicJoinRequest) -> None:
        group = work.group
        if group.state is State.DEAD:
            work.answer(error=errors.CoordinatorNotAvailable(f"Group {group.group_id} is dead."))
            return
        if not group.supports_protocols(
            request.protocol_type, (protocol.name for protocol in request.protocols)
        ):
            work.answer(error=_inconsistent(group, request))
            return
        prefix = request.instance_id if request.instance_id is not None else request.client_id
        new_id = f"{prefix}-{self._new_uuid()}"
        if request.instance_id is not None:
            existing_id = group.static_members.get(request.instance_id)
            if existing_id is not None:
                logger.info(
                    "static member %s joins classic group %s in %s without a member id: "
                    "replacing member %s",
                    request.instance_id,
                    group.group_id,
                    group.state.value,
                    existing_id,
                )
                self._update_static_member(work, request, existing_id, new_id)
            else:
                self._add_member(work, request, new_id)
        elif request.require_known_member_id:
            # KIP-394: the member comes back with this id; until then it is pending, for
            # its session timeout.
            group.add_pending_member(new_id)
            self._arm_heartbeat(group.group_id, new_id, request.session_timeout_ms, work.now_ms)
            work.answer(error=errors.MemberIdRequired(new_id))
        else:
            self._add_member(work, request, new_id)

    def _join_existing_member(self, work: _Round, request: messages.ClassicJoinRequest) -> None:
        group = work.group
        member_id = request.member_id
        if group.state is State.DEAD:
            work.answer(error=errors.CoordinatorNotAvailable(f"Group {group.group_id} is dead."))
            return
        if not group.supports_protocols(
            request.protocol_type, (protocol.name for protocol in request.protocols)
        ):
            work.answer(error=_inconsistent(group, request))
            return
        if group.is_pending_member(member_id):
            if request.instance_id is not None:
                work.answer(
                    error=errors.InvalidRequest(
                        f"Member {member_id} was given its id as a dynamic member; it can't "
                        f"join with group.instance.id {request.instance_id}."
                    )
                )
                return
            self._add_member(work, request, member_id)
            return
        try:
            member = group.validate_member(member_id, request.instance_id)
        except errors.CoordinatorError as error:
            work.answer(error=error)
            return
        state = group.state
        if state is State.PREPARING_REBALANCE:
            self._update_member(work, request, member)
        elif state is State.COMPLETING_REBALANCE:
            if member.matches(request.protocols):
                # The same metadata (it lost the response): the current generation again.
                work.answer(self._join_response(group, member_id, leader_list=True))
            else:
                self._update_member(work, request, member)
        elif state is State.STABLE:
            if group.is_leader(member_id) or not member.matches(request.protocols):
                # A leader's join forces a rebalance: that is how it reassigns when the
                # topics change (their metadata does not).
                self._update_member(work, request, member)
            else:
                work.answer(self._join_response(group, member_id, leader_list=False))
        else:
            logger.warning(
                "member %s rejoins classic group %s in state %s", member_id, group.group_id, state
            )
            work.answer(error=errors.UnknownMemberId(f"Group {group.group_id} is empty."))

    @staticmethod
    def _join_response(
        group: ClassicGroup, member_id: str, *, leader_list: bool, skip_assignment: bool = False
    ) -> messages.ClassicJoinResponse:
        members: tuple[messages.ClassicJoinMember, ...] = ()
        if leader_list and group.is_leader(member_id):
            members = tuple(
                messages.ClassicJoinMember(m.member_id, m.instance_id, m.metadata)
                for m in group.join_members()
            )
        return messages.ClassicJoinResponse(
            member_id=member_id,
            generation_id=group.generation,
            protocol_name=group.protocol_name,
            protocol_type=group.protocol_type,
            leader=group.leader_id or "",
            members=members,
            skip_assignment=skip_assignment,
        )

    def _update_member(
        self, work: _Round, request: messages.ClassicJoinRequest, member: ClassicMember
    ) -> None:
        """Kafka's ``updateMemberThenRebalanceOrCompleteJoin``."""
        work.group.update_member(
            member,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            awaiting_join=True,
        )
        work.own = result.join_key(work.group.group_id, member.member_id)
        self._maybe_prepare_rebalance_or_complete_join(work)

    def _add_member(
        self, work: _Round, request: messages.ClassicJoinRequest, member_id: str
    ) -> None:
        """Kafka's ``addMemberThenRebalanceOrCompleteJoin``."""
        group = work.group
        member = ClassicMember(
            member_id=member_id,
            instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=request.protocols,
            awaiting_join=True,
            is_new=True,
        )
        if group.state is State.PREPARING_REBALANCE and group.previous_state is State.EMPTY:
            group.new_member_added = True
        group.add(member)
        work.own = result.join_key(group.group_id, member_id)
        # A parked JoinGroup cannot heartbeat, and a client that gave up retries with a new
        # member: new members time out of the rebalance instead.
        self._arm_heartbeat(
            group.group_id, member_id, self._settings.new_member_join_timeout_ms, work.now_ms
        )
        self._maybe_prepare_rebalance_or_complete_join(work)

    def _update_static_member(
        self, work: _Round, request: messages.ClassicJoinRequest, old_id: str, new_id: str
    ) -> None:
        """Kafka's ``updateStaticMemberThenRebalanceOrCompleteJoin``."""
        group = work.group
        assert request.instance_id is not None
        current_leader = group.leader_id
        old = group.members[old_id]
        # The old id's parked requests are a zombie's: fenced at once.
        work.complete_join(old, error=errors.FencedInstanceId(f"Member {old_id} was replaced."))
        old = group.members[old_id]
        work.complete_sync(old, error=errors.FencedInstanceId(f"Member {old_id} was replaced."))
        self._cancel_heartbeat(group.group_id, old_id)
        replaced = group.replace_static_member(request.instance_id, old_id, new_id)
        self._arm_heartbeat(group.group_id, new_id, replaced.session_timeout_ms, work.now_ms)
        updated = group.update_member(
            replaced,
            request.protocols,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            awaiting_join=True,
        )
        work.own = result.join_key(group.group_id, new_id)
        if group.state is State.STABLE:
            if (group.protocol_name or "") == group.select_protocol():
                # No rebalance: write the group with the new member id, then answer with the
                # current generation.
                work.records.append(
                    coordinator_records.new_group_metadata_record(
                        group.group_id, group.metadata_value(group.group_assignment())
                    )
                )
                if request.supports_skip_assignment:
                    # KIP-814: a returning leader is told who the members are, and to keep
                    # the assignment it has rather than compute one.
                    is_leader = group.is_leader(new_id)
                    response = self._join_response(
                        group, new_id, leader_list=is_leader, skip_assignment=is_leader
                    )
                else:
                    # Older clients are told the old leader id: even a returning leader
                    # then acts as a follower and does not reassign.
                    response = dataclasses.replace(
                        self._join_response(group, new_id, leader_list=False),
                        leader=current_leader or "",
                    )
                work.complete_join(updated, response)
            else:
                self._maybe_prepare_rebalance_or_complete_join(work)
        elif group.state is State.COMPLETING_REBALANCE:
            # The leader may already have assigned to the old id: rebalance again.
            self._prepare_rebalance(work)
        elif group.state in (State.EMPTY, State.DEAD):
            raise errors.InconsistentState(
                f"classic group {group.group_id} in {group.state.value} has static member "
                f"{request.instance_id}"
            )
        else:
            self._maybe_complete_join_phase(work)

    # -----------------------------------------------------------------------------------
    # The join phase

    def _maybe_prepare_rebalance_or_complete_join(self, work: _Round) -> None:
        if work.group.can_rebalance():
            self._prepare_rebalance(work)
        else:
            self._maybe_complete_join_phase(work)

    def _prepare_rebalance(self, work: _Round) -> None:
        group = work.group
        if group.state is State.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_with_error(
                work, errors.RebalanceInProgress(f"Group {group.group_id} is rebalancing.")
            )
        self._remove_sync_expiration(group)
        initial = group.state is State.EMPTY
        if initial:
            # A new group: give more members the time to join before the first round.
            delay = self._settings.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.initial_delay = (delay, remaining)
            self._deadlines.arm(
                timers.classic_join_key(group.group_id),
                work.now_ms + delay,
                timers.JOIN_INITIAL_DELAY,
            )
        group.transition_to(State.PREPARING_REBALANCE, work.now_ms)
        logger.info(
            "preparing to rebalance classic group %s with old generation %d",
            group.group_id,
            group.generation,
        )
        if not initial:
            self._maybe_complete_join_else_schedule(work)

    def _maybe_complete_join_else_schedule(self, work: _Round) -> None:
        group = work.group
        if group.has_all_members_joined():
            self._complete_join(work)
        else:
            self._deadlines.arm(
                timers.classic_join_key(group.group_id),
                work.now_ms + group.rebalance_timeout_ms(),
                timers.JOIN_COMPLETE,
            )

    def _maybe_complete_join_phase(self, work: _Round) -> None:
        group = work.group
        if group.state is not State.PREPARING_REBALANCE:
            return
        if group.previous_state is State.EMPTY:
            return  # the initial rebalance ends with its delay
        if not group.has_all_members_joined():
            return
        self._complete_join(work)

    def _try_complete_initial_rebalance(self, work: _Round) -> None:
        group = work.group
        delay, remaining = group.initial_delay or (0, 0)
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            next_delay = min(self._settings.initial_rebalance_delay_ms, remaining)
            group.initial_delay = (next_delay, max(remaining - delay, 0))
            self._deadlines.arm(
                timers.classic_join_key(group.group_id),
                work.now_ms + next_delay,
                timers.JOIN_INITIAL_DELAY,
            )
        else:
            self._complete_join(work)

    def _complete_join(self, work: _Round) -> None:
        """Kafka's ``completeClassicGroupJoin``."""
        group = work.group
        group_id = group.group_id
        self._deadlines.cancel(timers.classic_join_key(group_id))
        group.initial_delay = None
        gone = [member for member in group.not_yet_rejoined() if not member.is_static]
        for member in gone:
            group.remove(member.member_id)
            self._cancel_heartbeat(group_id, member.member_id)
        if gone:
            logger.info(
                "classic group %s removed dynamic members who did not rejoin: %s",
                group_id,
                [member.member_id for member in gone],
            )
        if group.state is State.DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined: wait another round for the session timeouts to remove them.
            logger.error("classic group %s: no member rejoined", group_id)
            self._deadlines.arm(
                timers.classic_join_key(group_id),
                work.now_ms + group.rebalance_timeout_ms(),
                timers.JOIN_COMPLETE,
            )
            return
        group.init_next_generation(work.now_ms)
        if group.state is State.EMPTY:
            logger.info("classic group %s with generation %d is empty", group_id, group.generation)
            work.records.append(
                coordinator_records.new_group_metadata_record(group_id, group.metadata_value({}))
            )
            return
        logger.info(
            "stabilized classic group %s generation %d with %d members",
            group_id,
            group.generation,
            len(group.members),
        )
        for member in list(group.members.values()):
            work.complete_join(
                member, self._join_response(group, member.member_id, leader_list=True)
            )
            self._arm_heartbeat(group_id, member.member_id, member.session_timeout_ms, work.now_ms)
            current = group.members[member.member_id]
            if current.is_new:
                group.put(dataclasses.replace(current, is_new=False))
            group.pending_sync.add(member.member_id)
        self._deadlines.arm(
            timers.classic_sync_key(group_id),
            work.now_ms + group.rebalance_timeout_ms(),
            group.generation,
        )

    # -----------------------------------------------------------------------------------
    # Assignment propagation

    def _reset_and_propagate_assignment_with_error(
        self, work: _Round, error: errors.CoordinatorError
    ) -> None:
        group = work.group
        for member in list(group.members.values()):
            group.put(dataclasses.replace(member, assignment=b""))
        self._propagate_assignment(work, error)

    def _set_and_propagate_assignment(self, work: _Round, assignment: dict[str, bytes]) -> None:
        group = work.group
        for member in list(group.members.values()):
            group.put(dataclasses.replace(member, assignment=assignment.get(member.member_id, b"")))
        self._propagate_assignment(work, None)

    def _propagate_assignment(self, work: _Round, error: errors.CoordinatorError | None) -> None:
        group = work.group
        for member in list(group.members.values()):
            if error is None and not member.assignment:
                logger.warning(
                    "sending an empty assignment to member %s of classic group %s, generation %d",
                    member.member_id,
                    group.group_id,
                    group.generation,
                )
            response = (
                None
                if error is not None
                else messages.ClassicSyncResponse(
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    raw_assignment=member.assignment,
                )
            )
            if work.complete_sync(member, response, error):
                # Its session restarts: an expiry while it waited was ignored.
                self._arm_heartbeat(
                    group.group_id, member.member_id, member.session_timeout_ms, work.now_ms
                )

    def _remove_sync_expiration(self, group: ClassicGroup) -> None:
        group.pending_sync.clear()
        self._deadlines.cancel(timers.classic_sync_key(group.group_id))

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if group.state in (State.COMPLETING_REBALANCE, State.STABLE) and group.pending_sync:
            return
        self._deadlines.cancel(timers.classic_sync_key(group.group_id))

    # -----------------------------------------------------------------------------------
    # SyncGroup

    def sync(self, request: messages.ClassicSyncRequest, now_ms: int) -> result.Result[Any]:
        live = self._groups[request.group_id]
        if live.state is State.EMPTY:
            raise errors.UnknownMemberId(f"Group {request.group_id} is empty.")
        self._validate_sync(live, request)
        state = live.state
        if state is State.PREPARING_REBALANCE:
            raise errors.RebalanceInProgress(f"Group {request.group_id} is rebalancing.")
        if state is State.STABLE:
            member = live.members[request.member_id]
            if request.member_id in live.pending_sync:
                group = live.copy()
                self._remove_pending_sync_member(group, request.member_id)
                soft: list[result.SoftRecord] = [
                    classic_group.ClassicGroupUpdated(group.group_id, group)
                ]
            else:
                soft = []
            response = messages.ClassicSyncResponse(
                protocol_type=live.protocol_type,
                protocol_name=live.protocol_name,
                raw_assignment=member.assignment,
            )
            return result.Result(response, [], soft)
        # CompletingRebalance: park until the leader's assignment is written.
        group = live.copy()
        work = _Round(group, now_ms)
        member = group.members[request.member_id]
        group.put(dataclasses.replace(member, awaiting_sync=True))
        work.own = result.sync_key(group.group_id, request.member_id)
        self._remove_pending_sync_member(group, request.member_id)
        if group.is_leader(request.member_id):
            logger.info(
                "assignment received from leader %s of classic group %s for generation %d",
                request.member_id,
                group.group_id,
                group.generation,
            )
            assignment = dict(request.assignments)
            missing = [m for m in group.members if m not in assignment]
            for member_id in missing:
                assignment[member_id] = b""
            if missing:
                logger.warning(
                    "classic group %s generation %d: empty assignments for members %s",
                    group.group_id,
                    group.generation,
                    missing,
                )
            work.records.append(
                coordinator_records.new_group_metadata_record(
                    group.group_id, group.metadata_value(assignment)
                )
            )
            # What Kafka does once that record is written (answered only after it is here).
            self._set_and_propagate_assignment(work, assignment)
            group.transition_to(State.STABLE, now_ms)
        return work.result()

    @staticmethod
    def _validate_sync(group: ClassicGroup, request: messages.ClassicSyncRequest) -> None:
        if group.state is State.DEAD:
            raise errors.CoordinatorNotAvailable(f"Group {group.group_id} is dead.")
        group.validate_member(request.member_id, request.instance_id)
        if request.generation_id != group.generation:
            raise errors.IllegalGeneration(
                f"Generation {request.generation_id} is not the group's {group.generation}."
            )
        if _inconsistent_field(request.protocol_type, group.protocol_type) or _inconsistent_field(
            request.protocol_name, group.protocol_name
        ):
            raise errors.InconsistentGroupProtocol(
                f"Protocol {request.protocol_type}/{request.protocol_name} is not the group's "
                f"{group.protocol_type}/{group.protocol_name}."
            )

    # -----------------------------------------------------------------------------------
    # Heartbeat

    def heartbeat(
        self, request: messages.ClassicHeartbeatRequest, now_ms: int
    ) -> result.Result[messages.ClassicHeartbeatResponse]:
        group = self._groups[request.group_id]
        if group.state is State.DEAD:
            raise errors.CoordinatorNotAvailable(f"Group {group.group_id} is dead.")
        member = group.validate_member(request.member_id, request.instance_id)
        if request.generation_id != group.generation:
            raise errors.IllegalGeneration(
                f"Generation {request.generation_id} is not the group's {group.generation}."
            )
        answer = group_state.CLASSIC_HEARTBEAT_ANSWER[group.state]
        if answer == errors.UnknownMemberId.name:
            raise errors.UnknownMemberId(f"Group {group.group_id} is empty.")
        self._arm_heartbeat(group.group_id, member.member_id, member.session_timeout_ms, now_ms)
        rebalancing = answer == errors.RebalanceInProgress.name
        return result.Result(messages.ClassicHeartbeatResponse(rebalance_in_progress=rebalancing))

    # -----------------------------------------------------------------------------------
    # LeaveGroup

    def leave(
        self, request: messages.ClassicLeaveRequest, now_ms: int
    ) -> result.Result[messages.ClassicLeaveResponse]:
        live = self._groups[request.group_id]
        if live.state is State.DEAD:
            raise errors.CoordinatorNotAvailable(f"Group {live.group_id} is dead.")
        group = live.copy()
        work = _Round(group, now_ms)
        outcome: list[str | None] = []
        for entry in request.members:
            if not entry.member_id:
                # Removal by instance id alone (KIP-345's admin removal).
                holder = (
                    group.static_members.get(entry.instance_id)
                    if entry.instance_id is not None
                    else None
                )
                if holder is None:
                    outcome.append(errors.UnknownMemberId.name)
                    continue
                self._remove_current_member(work, holder)
            elif group.is_pending_member(entry.member_id):
                group.remove(entry.member_id)
                self._cancel_heartbeat(group.group_id, entry.member_id)
            else:
                try:
                    group.validate_member(entry.member_id, entry.instance_id)
                except errors.CoordinatorError as error:
                    outcome.append(error.name)
                    continue
                self._remove_current_member(work, entry.member_id)
            outcome.append(None)
        if None in outcome:
            if group.state in (State.STABLE, State.COMPLETING_REBALANCE):
                self._maybe_prepare_rebalance_or_complete_join(work)
            elif group.state is State.PREPARING_REBALANCE:
                self._maybe_complete_join_phase(work)
        work.answer(messages.ClassicLeaveResponse(tuple(outcome)))
        outcome_result: result.Result[messages.ClassicLeaveResponse] = work.result(
            changed=None in outcome
        )
        return outcome_result

    def _remove_current_member(self, work: _Round, member_id: str) -> None:
        group = work.group
        self._cancel_heartbeat(group.group_id, member_id)
        logger.info("member %s left classic group %s", member_id, group.group_id)
        # A new member may still be parked in the join phase: tell it to join again.
        work.complete_join(
            group.members[member_id], error=errors.UnknownMemberId(f"Member {member_id} left.")
        )
        group.remove(member_id)

    # -----------------------------------------------------------------------------------
    # Timers (the shard calls these for due deadlines of its classic groups)

    def expire_heartbeat(self, group_id: str, member_id: str, now_ms: int) -> result.Result[None]:
        """Kafka's ``expireClassicGroupMemberHeartbeat``."""
        live = self._groups.get(group_id)
        if live is None or live.state is State.DEAD:
            return result.Result(None)
        if live.is_pending_member(member_id):
            group = live.copy()
            work = _Round(group, now_ms)
            logger.info("pending member %s of classic group %s timed out", member_id, group_id)
            group.remove(member_id)
            if group.state is State.PREPARING_REBALANCE and group.has_all_members_joined():
                self._complete_join(work)
            return self._timer_result(work)
        member = live.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return result.Result(None)
        group = live.copy()
        work = _Round(group, now_ms)
        logger.info("member %s of classic group %s failed: removing it", member_id, group_id)
        work.complete_join(member, error=errors.UnknownMemberId(f"Member {member_id} timed out."))
        group.remove(member_id)
        if group.state in (State.STABLE, State.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(work)
        elif group.state is State.PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(work)
        return self._timer_result(work)

    def expire_join(self, group_id: str, tag: int, now_ms: int) -> result.Result[None]:
        live = self._groups.get(group_id)
        if live is None or live.state is not State.PREPARING_REBALANCE:
            return result.Result(None)
        work = _Round(live.copy(), now_ms)
        if tag == timers.JOIN_INITIAL_DELAY:
            self._try_complete_initial_rebalance(work)
        else:
            self._complete_join(work)
        return self._timer_result(work)

    def expire_sync(self, group_id: str, generation: int, now_ms: int) -> result.Result[None]:
        """Kafka's ``expirePendingSync``: members of the generation that never synced are
        removed, and the group rebalances."""
        live = self._groups.get(group_id)
        if live is None or generation != live.generation:
            return result.Result(None)
        if live.state not in (State.COMPLETING_REBALANCE, State.STABLE) or not live.pending_sync:
            return result.Result(None)
        group = live.copy()
        work = _Round(group, now_ms)
        late = sorted(group.pending_sync)
        for member_id in late:
            group.remove(member_id)
            self._cancel_heartbeat(group_id, member_id)
        logger.info("classic group %s removed members that did not sync: %s", group_id, late)
        self._prepare_rebalance(work)
        return self._timer_result(work)

    @staticmethod
    def _timer_result(work: _Round) -> result.Result[None]:
        soft: list[result.SoftRecord] = [
            classic_group.ClassicGroupUpdated(work.group.group_id, work.group)
        ]
        return result.Result(None, work.records, soft, work.completions)

    def prepare_rebalance(self, group: ClassicGroup, now_ms: int) -> _Round:
        """Start a rebalance of ``group`` (a copy the caller owns): a conversion's first step."""
        work = _Round(group, now_ms)
        self._prepare_rebalance(work)
        return work

    def arm_heartbeats(self, group: ClassicGroup, now_ms: int) -> None:
        """Every member's session from ``now_ms`` (a load or a conversion, as Kafka's)."""
        for member in group.members.values():
            self._arm_heartbeat(group.group_id, member.member_id, member.session_timeout_ms, now_ms)

    def cancel_timers(self, group: ClassicGroup) -> None:
        """Every timer of a group leaving memory (deleted or converted)."""
        for member_id in [*group.members, *group.pending_join]:
            self._cancel_heartbeat(group.group_id, member_id)
        self._deadlines.cancel(timers.classic_join_key(group.group_id))
        self._deadlines.cancel(timers.classic_sync_key(group.group_id))

    # -----------------------------------------------------------------------------------
    # Helpers

    def _arm_heartbeat(self, group_id: str, member_id: str, timeout_ms: int, now_ms: int) -> None:
        self._deadlines.arm(timers.classic_heartbeat_key(group_id, member_id), now_ms + timeout_ms)

    def _cancel_heartbeat(self, group_id: str, member_id: str) -> None:
        self._deadlines.cancel(timers.classic_heartbeat_key(group_id, member_id))


def _inconsistent(
    group: ClassicGroup, request: messages.ClassicJoinRequest
) -> errors.InconsistentGroupProtocol:
    names = ", ".join(protocol.name for protocol in request.protocols) or "none"
    return errors.InconsistentGroupProtocol(
        f"Protocol type {request.protocol_type!r} with protocols [{names}] is not supported by "
        f"group {group.group_id} (protocol type {group.protocol_type!r})."
    )


def _inconsistent_field(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
