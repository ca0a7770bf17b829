"""A classic group as Kafka runs it (``ClassicGroup``): the leader assigns, the coordinator relays.

Members join with a protocol type (``consumer``, ``connect``, ...) and the protocols they
support, each with opaque metadata. When a rebalance completes the coordinator selects the
protocol every member supports that most members prefer (``select_protocol``), bumps the
generation, and hands the leader (the first member to join, or the first to rejoin when the
leader does not) every member's metadata for that protocol. The leader's SyncGroup carries
each member's assignment as opaque bytes, which the coordinator stores (``GroupMetadata``
record) and relays to each member as it is.

Kafka keeps most of a classic group in memory only: who is joining, who is awaiting a
response, the rebalance in progress. Only ``GroupMetadataValue`` records are written (when a
rebalance completes, when the group empties, when a static member is replaced without a
rebalance, when the group is created or converted), and a load rebuilds the group from the
latest one, in STABLE (or EMPTY without members), exactly as ``GroupMetadataManager.replay``
does. Here the in-memory part changes only by replay too, of a *soft record*
(``ClassicGroupUpdated``) carrying the group's next state: a handler works on a copy
(``copy``) through the methods below, which mirror Kafka's ``ClassicGroup`` one for one, and
returns that copy as a soft record beside the durable records; the runtime replays both once
the durable ones are written, and never writes the soft one. Every state change goes through
``transition_to``, which checks ``group_state.VALID_PREVIOUS_CLASSIC_STATES``; replay checks
the transitions a copy took again.

Futures are not part of the group: a member only says whether it awaits a JoinGroup or
SyncGroup response (``ClassicMember.awaiting_join``/``awaiting_sync``). Handlers answer a
parked request with a ``result.Completion`` for its key; the runtime holds the request.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kafka_group_operator.coordinator import consumer_protocol, errors, group_state, result
from kafka_group_records import records as schema

State = group_state.ClassicGroupState

CONSUMER_PROTOCOL_TYPE = "consumer"


@dataclass(frozen=True, slots=True)
class ClassicMember:
    """One member (Kafka's ``ClassicGroupMember``); immutable, replaced on every change."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[schema.ClassicProtocol, ...]
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False
    # Joined in the rebalance under way: its join times out, heartbeats do not excuse it.
    is_new: bool = False

    @property
    def is_static(self) -> bool:
        return self.instance_id is not None

    def protocol_names(self) -> frozenset[str]:
        return frozenset(protocol.name for protocol in self.protocols)

    def metadata(self, protocol_name: str | None) -> bytes:
        for protocol in self.protocols:
            if protocol.name == protocol_name:
                return protocol.metadata
        raise errors.InconsistentState(
            f"member {self.member_id} does not support protocol {protocol_name!r}"
        )

    def vote(self, candidates: frozenset[str]) -> str:
        """The first protocol in the member's own order that every member supports."""
        for protocol in self.protocols:
            if protocol.name in candidates:
                return protocol.name
        raise errors.InconsistentState(f"member {self.member_id} supports no candidate protocol")

    def matches(self, protocols: tuple[schema.ClassicProtocol, ...]) -> bool:
        return protocols == self.protocols

    def has_satisfied_heartbeat(self) -> bool:
        """Kafka's: members awaiting a rebalance answer need not heartbeat, new ones must."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync


@dataclass(frozen=True, slots=True)
class JoinMember:
    """A member as the leader's JoinGroup response lists it."""

    member_id: str
    instance_id: str | None
    metadata: bytes


class ClassicGroup:
    """Hard and soft state of one classic group; see the module docstring for who mutates it."""

    def __init__(
        self,
        group_id: str,
        state: State = State.EMPTY,
        *,
        generation: int = 0,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        leader_id: str | None = None,
        state_timestamp: int | None = None,
    ) -> None:
        self.group_id = group_id
        self.state = state
        self.previous_state = State.DEAD
        # When the group entered its state (KIP-211's currentStateTimestamp); None unknown.
        self.state_timestamp = state_timestamp
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.generation = generation
        self.leader_id = leader_id
        self.members: dict[str, ClassicMember] = {}
        self.static_members: dict[str, str] = {}
        # Dynamic members told MEMBER_ID_REQUIRED that have not joined with their id yet.
        self.pending_join: set[str] = set()
        # Members of the generation that have not sent SyncGroup yet.
        self.pending_sync: set[str] = set()
        self.supported_protocols: collections.Counter[str] = collections.Counter()
        self.awaiting_join_count = 0
        self.subscribed_topics: frozenset[str] | None = None
        # A member joined during the initial rebalance: its delay is extended once more.
        self.new_member_added = False
        # The initial rebalance's next delay and the time left after it (Kafka passes them
        # to its timer task; the timer here has only a key).
        self.initial_delay: tuple[int, int] | None = None
        # Transitions taken since the last replay, for replay to check again.
        self.transitions: list[tuple[State, State]] = []

    # -----------------------------------------------------------------------------------
    # Copies and records

    def copy(self) -> ClassicGroup:
        """A copy a handler may change; members are immutable and shared."""
        other = ClassicGroup.__new__(ClassicGroup)
        other.__dict__.update(self.__dict__)
        other.members = dict(self.members)
        other.static_members = dict(self.static_members)
        other.pending_join = set(self.pending_join)
        other.pending_sync = set(self.pending_sync)
        other.supported_protocols = collections.Counter(self.supported_protocols)
        other.transitions = []
        return other

    @classmethod
    def from_record(cls, group_id: str, value: schema.GroupMetadataValue) -> ClassicGroup:
        """The group a load rebuilds from its latest record (``GroupMetadataManager.replay``):
        STABLE with its members, or EMPTY; each member supports the selected protocol only."""
        protocol_type = value.protocol_type or None
        group = cls(
            group_id,
            State.STABLE if value.members else State.EMPTY,
            generation=value.generation,
            protocol_type=protocol_type,
            protocol_name=value.protocol,
            leader_id=value.leader,
            state_timestamp=(
                None if value.current_state_timestamp == -1 else value.current_state_timestamp
            ),
        )
        for member in value.members:
            rebalance_timeout = member.rebalance_timeout
            group.add(
                ClassicMember(
                    member_id=member.member_id,
                    instance_id=member.group_instance_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    rebalance_timeout_ms=(
                        member.session_timeout if rebalance_timeout == -1 else rebalance_timeout
                    ),
                    session_timeout_ms=member.session_timeout,
                    protocol_type=value.protocol_type,
                    protocols=(schema.ClassicProtocol(value.protocol or "", member.subscription),),
                    assignment=member.assignment,
                )
            )
        group.subscribed_topics = group.compute_subscribed_topics()
        return group

    def metadata_value(self, assignments: Mapping[str, bytes]) -> schema.GroupMetadataValue:
        """Kafka's ``newGroupMetadataRecord``: the group with ``assignments`` for its members."""
        members = []
        for member in self.members.values():
            if self.protocol_name is None:
                raise errors.InconsistentState(
                    f"classic group {self.group_id}: members but no protocol to write"
                )
            members.append(
                schema.GroupMetadataMember(
                    member_id=member.member_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    session_timeout=member.session_timeout_ms,
                    subscription=member.metadata(self.protocol_name),
                    assignment=assignments[member.member_id],
                    group_instance_id=member.instance_id,
                    rebalance_timeout=member.rebalance_timeout_ms,
                )
            )
        return schema.GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp=self._timestamp(),
            members=tuple(members),
        )

    def empty_metadata_value(self) -> schema.GroupMetadataValue:
        """Kafka's ``newEmptyGroupMetadataRecord``: written when a join creates the group."""
        return schema.GroupMetadataValue(
            protocol_type="",
            generation=0,
            protocol=None,
            leader=None,
            current_state_timestamp=self._timestamp(),
        )

    def _timestamp(self) -> int:
        return -1 if self.state_timestamp is None else self.state_timestamp

    # -----------------------------------------------------------------------------------
    # Reads

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_join

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.awaiting_join_count and not self.pending_join

    def not_yet_rejoined(self) -> list[ClassicMember]:
        return [member for member in self.members.values() if not member.awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout of the members (Kafka's)."""
        return max((member.rebalance_timeout_ms for member in self.members.values()), default=0)

    def can_rebalance(self) -> bool:
        return self.state in group_state.VALID_PREVIOUS_CLASSIC_STATES[State.PREPARING_REBALANCE]

    def validate_member(self, member_id: str, instance_id: str | None) -> ClassicMember:
        """Kafka's ``validateMember``: a known instance id mapped to this member id, and a
        known member id."""
        if instance_id is not None:
            holder = self.static_members.get(instance_id)
            if holder is None:
                raise errors.UnknownMemberId(f"Instance id {instance_id} is unknown.")
            if holder != member_id:
                raise errors.FencedInstanceId(
                    f"Instance id {instance_id} belongs to member {holder}."
                )
        member = self.members.get(member_id)
        if member is None:
            raise errors.UnknownMemberId(f"Member {member_id} is not in group {self.group_id}.")
        return member

    def supports_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        names = list(names)
        if self.state is State.EMPTY:
            return bool(protocol_type) and bool(names)
        size = len(self.members)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols.get(name, 0) == size for name in names
        )

    def select_protocol(self) -> str:
        """The protocol every member supports that most members list first among those.

        Ties (Kafka breaks them by hash order) go to the protocol that got its first vote
        earliest, members in join order.
        """
        if not self.members:
            raise errors.InconsistentState(f"classic group {self.group_id}: no member to vote")
        size = len(self.members)
        candidates = frozenset(
            name for name, count in self.supported_protocols.items() if count == size
        )
        votes: collections.Counter[str] = collections.Counter(
            member.vote(candidates) for member in self.members.values()
        )
        return max(votes, key=lambda name: votes[name])

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """Kafka's ``computeSubscribedTopics``: the topics of a ``consumer`` group's members,
        None when unknown (other protocol type, no protocol yet, unreadable metadata)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        try:
            for member in self.members.values():
                metadata = member.metadata(self.protocol_name)
                topics.update(consumer_protocol.subscribed_topics(metadata))
        except (consumer_protocol.MalformedConsumerProtocol, errors.InconsistentState):
            return None
        return frozenset(topics)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed_topics is None:
            return self.uses_consumer_protocol()
        return topic in self.subscribed_topics

    def join_members(self) -> tuple[JoinMember, ...]:
        """Every member with its metadata for the selected protocol (the leader's list)."""
        if self.state in (State.DEAD, State.PREPARING_REBALANCE):
            raise errors.InconsistentState(
                f"classic group {self.group_id} has no member list in {self.state.value}"
            )
        return tuple(
            JoinMember(member.member_id, member.instance_id, member.metadata(self.protocol_name))
            for member in self.members.values()
        )

    def group_assignment(self) -> dict[str, bytes]:
        return {member.member_id: member.assignment for member in self.members.values()}

    # -----------------------------------------------------------------------------------
    # Changes (on a copy; see the module docstring)

    def transition_to(self, state: State, now_ms: int) -> None:
        group_state.check_classic_transition(self.group_id, self.state, state, "transition")
        self.transitions.append((self.state, state))
        self.previous_state = self.state
        self.state = state
        self.state_timestamp = now_ms

    def put(self, member: ClassicMember) -> None:
        """Replace a member's value by one with the same id and protocols (flags, assignment)."""
        old = self.members[member.member_id]
        if old.protocols != member.protocols:
            raise errors.InconsistentState("put() does not change protocols; use update_member")
        self.awaiting_join_count += int(member.awaiting_join) - int(old.awaiting_join)
        self.members[member.member_id] = member

    def add(self, member: ClassicMember) -> None:
        if member.instance_id is not None:
            if member.instance_id in self.static_members:
                raise errors.InconsistentState(
                    f"static member {member.instance_id} is already in group {self.group_id}"
                )
            self.static_members[member.instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.protocol_type != member.protocol_type:
            raise errors.InconsistentState("the group and member's protocol type must be the same")
        if not self.supports_protocols(member.protocol_type, member.protocol_names()):
            raise errors.InconsistentState("none of the member's protocols can be supported")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names())
        if member.awaiting_join:
            self.awaiting_join_count += 1
        self.pending_join.discard(member.member_id)

    def remove(self, member_id: str) -> None:
        removed = self.members.pop(member_id, None)
        if removed is not None:
            self.supported_protocols.subtract(removed.protocol_names())
            if removed.awaiting_join:
                self.awaiting_join_count -= 1
            if removed.instance_id is not None:
                self.static_members.pop(removed.instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_join.discard(member_id)
        self.pending_sync.discard(member_id)

    def add_pending_member(self, member_id: str) -> None:
        if member_id in self.members:
            raise errors.InconsistentState(f"pending member {member_id} is already a member")
        self.pending_join.add(member_id)

    def update_member(
        self,
        member: ClassicMember,
        protocols: tuple[schema.ClassicProtocol, ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        awaiting_join: bool,
    ) -> ClassicMember:
        self.supported_protocols.subtract(member.protocol_names())
        updated = dataclasses.replace(
            member,
            protocols=protocols,
            rebalance_timeout_ms=rebalance_timeout_ms,
            session_timeout_ms=session_timeout_ms,
            awaiting_join=awaiting_join,
        )
        self.supported_protocols.update(updated.protocol_names())
        self.awaiting_join_count += int(awaiting_join) - int(member.awaiting_join)
        self.members[member.member_id] = updated
        return updated

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> ClassicMember:
        """The member of ``old_id`` under ``new_id``, keeping everything else (its assignment
        too). Callers complete the old id's parked requests with FENCED_INSTANCE_ID first."""
        removed = self.members.pop(old_id, None)
        if removed is None:
            raise errors.InconsistentState(f"cannot replace non-existing member {old_id}")
        if removed.awaiting_join:
            self.awaiting_join_count -= 1
        replacement = dataclasses.replace(
            removed, member_id=new_id, awaiting_join=False, awaiting_sync=False, is_new=False
        )
        self.members[new_id] = replacement
        if self.is_leader(old_id):
            self.leader_id = new_id
        self.static_members[instance_id] = new_id
        return replacement

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else elect the first member that did; False when the
        group has no leader or nobody rejoined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    def init_next_generation(self, now_ms: int) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(State.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(State.EMPTY, now_ms)
        self.pending_sync.clear()


@dataclass(frozen=True, slots=True)
class ClassicGroupUpdated(result.SoftRecord):
    """Soft record: the classic group's next state (``None``: it is gone from memory)."""

    group_id: str
    group: ClassicGroup | None
