"""Properties of classic groups over random request sequences.

Clients (two dynamic, two static) join, sync (the leader with an assignment), heartbeat and
leave in random order while time passes; after every step:

* handlers change nothing: the shard's state is the same before and after a handler runs,
  until its result is replayed (sans-IO);
* the group's bookkeeping is consistent (awaiting counts, leader, static members, protocol
  counts), and every member awaiting its JoinGroup answer has a parked request, and only
  those: nobody is parked forever, nobody is answered who did not ask;
* replay from the log rebuilds what Kafka's load rebuilds: a Stable or Empty group loads as
  it is live (generation, protocol, leader, members and their assignments).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_group_operator.coordinator import classic_group, errors, messages, result
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_records import records as schema
from tests.coordinator.harness import Harness

GROUP = "g"
PROTOCOLS = (
    (schema.ClassicProtocol("range", b"a"),),
    (schema.ClassicProtocol("range", b"b"), schema.ClassicProtocol("roundrobin", b"b")),
    (schema.ClassicProtocol("roundrobin", b"c"), schema.ClassicProtocol("range", b"c")),
)
INSTANCES = (None, None, "pod-0", "pod-1")


@dataclass
class Client:
    instance_id: str | None
    member_id: str = ""
    generation: int = -1
    # The member id its parked JoinGroup waits under (a real client learns it from the answer).
    awaiting: str = ""
    synced: bool = False


@dataclass
class Run:
    h: Harness
    clients: list[Client]
    parked: set[result.DeferredKey] = field(default_factory=set)


def _apply(run: Run, handler: Any) -> Any:
    """Call a handler, check it changed nothing, replay its result, track parked requests."""
    before = run.h.shard.canonical_state()
    try:
        outcome = handler()
    except errors.CoordinatorError:
        assert run.h.shard.canonical_state() == before
        return None
    assert run.h.shard.canonical_state() == before
    run.h.apply(outcome)
    if isinstance(outcome.response, result.Deferred):
        run.parked.add(outcome.response.key)
    for completion in outcome.completions:
        run.parked.discard(completion.key)
    return outcome.response


def _learn(client: Client, response: Any) -> None:
    if isinstance(response, messages.ClassicJoinResponse):
        client.member_id, client.generation = response.member_id, response.generation_id
        client.awaiting, client.synced = "", False
    elif isinstance(response, result.Failed) and isinstance(
        response.error, errors.MemberIdRequired
    ):
        client.member_id = response.error.member_id


def _step(run: Run, op: tuple[str, int, int]) -> None:
    kind, index, value = op
    h, client = run.h, run.clients[index]
    # Answers to parked joins teach their clients their generation.
    for completion in h.completions:
        if completion.key.kind == "join" and isinstance(
            completion.response, messages.ClassicJoinResponse
        ):
            for other in run.clients:
                if completion.key.member_id in (other.member_id, other.awaiting):
                    _learn(other, completion.response)
    h.completions.clear()
    if kind == "next":
        # What a well-behaved client does next: join, sync once joined, else heartbeat.
        if not client.member_id and not client.awaiting:
            kind, value = "join", 1
        elif client.awaiting:
            kind, value = "tick", 1  # its JoinGroup is in flight: it waits
        elif not client.synced:
            kind = "sync"
        else:
            kind = "heartbeat"
    if kind == "join":
        request = messages.ClassicJoinRequest(
            group_id=GROUP,
            member_id=client.member_id if value % 2 else "",
            instance_id=client.instance_id,
            protocol_type="consumer",
            protocols=PROTOCOLS[value % len(PROTOCOLS)],
            session_timeout_ms=6_000,
            rebalance_timeout_ms=9_000,
            subscribed_topic_names=(),
            require_known_member_id=value % 3 == 0,
            client_id=f"c{index}",
        )
        response = _apply(run, lambda: h.shard.classic_join(request, h.now_ms))
        _learn(client, response)
        if isinstance(response, result.Deferred):
            client.awaiting = response.key.member_id
    elif kind == "sync":
        leader_assignment = tuple(
            (other.member_id, f"{other.member_id}@{client.generation}".encode())
            for other in run.clients
            if other.member_id
        )
        request = messages.ClassicSyncRequest(
            GROUP,
            client.member_id,
            client.generation,
            client.instance_id,
            assignments=leader_assignment,
        )
        synced = _apply(run, lambda: h.shard.classic_sync(request, h.now_ms))
        client.synced = synced is not None
    elif kind == "heartbeat":
        request = messages.ClassicHeartbeatRequest(
            GROUP, client.member_id, client.generation, client.instance_id
        )
        beat = _apply(run, lambda: h.shard.classic_heartbeat(request, h.now_ms))
        if beat is None or beat.rebalance_in_progress:
            # Told to rejoin (or unknown): a client joins again, with its id if it has one.
            client.synced = False
            client.awaiting = ""
            if beat is None:
                client.member_id = ""
    elif kind == "leave":
        leave = messages.ClassicLeaveRequest(
            GROUP, (messages.ClassicLeavingMember(client.member_id, client.instance_id),)
        )
        _apply(run, lambda: h.shard.classic_leave(leave, h.now_ms))
    else:
        h.now_ms += value * 250
        _apply(run, lambda: h.shard.on_timer(h.now_ms))


def _check_bookkeeping(run: Run) -> None:
    group = run.h.shard._classic_groups.get(GROUP)
    if group is None:
        assert not {key for key in run.parked if key.kind == "join"}
        return
    members = group.members
    assert group.awaiting_join_count == sum(m.awaiting_join for m in members.values())
    if members:
        assert group.leader_id in members
    assert group.static_members == {
        m.instance_id: m.member_id for m in members.values() if m.instance_id is not None
    }
    counts = collections.Counter(name for m in members.values() for name in m.protocol_names())
    assert +group.supported_protocols == counts
    # A static member replaced before it synced stays pending sync under its old id, as in
    # Kafka (ClassicGroup.replaceStaticMember leaves pendingSyncMembers alone; the pending sync
    # expiry then removes nobody and rebalances). Static ids are the instance id, "-", a
    # suffix (Kafka's generateMemberId).
    replaced = group.pending_sync - set(members)
    assert all(
        any(old.startswith(f"{instance}-") for instance in group.static_members) for old in replaced
    ), (replaced, group.static_members)
    assert not group.pending_join & set(members)
    parked_joins = {key.member_id for key in run.parked if key.kind == "join"}
    assert parked_joins == {m.member_id for m in members.values() if m.awaiting_join}
    parked_syncs = {key.member_id for key in run.parked if key.kind == "sync"}
    assert {m.member_id for m in members.values() if m.awaiting_sync} <= parked_syncs


def _persisted_view(group: classic_group.ClassicGroup) -> tuple[Any, ...]:
    return (
        group.state,
        group.generation,
        group.protocol_name,
        group.leader_id if group.members else None,
        [(m.member_id, m.instance_id, m.assignment) for m in group.members.values()],
    )


def _check_replay(run: Run) -> None:
    live = run.h.shard._classic_groups.get(GROUP)
    loaded = run.h.replayed()._classic_groups.get(GROUP)
    if live is None:
        assert loaded is None
        return
    if live.state.value in ("Stable", "Empty"):
        assert loaded is not None
        assert _persisted_view(loaded) == _persisted_view(live)


# Most steps are what a client does next; the rest disturb (a join with other protocols, a
# stale sync or heartbeat, a leave, time passing). Groups of two clients settle more often.
_ops = st.integers(2, len(INSTANCES)).flatmap(
    lambda clients: st.lists(
        st.tuples(
            st.sampled_from(["next"] * 8 + ["join", "sync", "heartbeat", "leave", "tick", "tick"]),
            st.integers(0, clients - 1),
            st.integers(0, 11),
        ),
        max_size=60,
    )
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops)
def test_classic_group_invariants_and_replay(ops: list[tuple[str, int, int]]) -> None:
    counter = itertools.count()
    run = Run(
        Harness(
            settings=coordinator_config.CoordinatorConfig(
                initial_rebalance_delay_ms=500, new_member_join_timeout_ms=4_000
            ),
            new_uuid=lambda: f"u{next(counter)}",
        ),
        [Client(instance_id) for instance_id in INSTANCES],
    )
    for op in ops:
        _step(run, op)
        _check_bookkeeping(run)
        _check_replay(run)
