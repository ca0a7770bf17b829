"""Pausing and resuming a group's assignment: the resume gives every member back its own."""

from __future__ import annotations

import pytest

from kafka_group_operator.coordinator import messages
from kafka_group_records import records as schema
from tests.coordinator.harness import TOPIC, TOPIC_ID, Harness

Assignment = dict[str, frozenset[int]]


class Members:
    """Members that always report what they were last told to own, as real ones do."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.epochs: dict[str, int] = {}
        self.owned: dict[str, Assignment] = {}

    def join(self, member_id: str) -> None:
        self._beat(member_id, messages.JOIN_EPOCH)

    def _beat(self, member_id: str, epoch: int) -> None:
        owned = self.owned.get(member_id, {})
        reply = self.harness.heartbeat(member_id, epoch, owned=owned).response
        assert reply is not None
        self.epochs[member_id] = reply.member_epoch
        if reply.assignment is not None:
            self.owned[member_id] = {t: p for t, p in reply.assignment.items() if p}

    def settle(self) -> dict[str, frozenset[int]]:
        """Heartbeat every member until a full round changes nothing; what each owns."""
        for _ in range(10):
            before = (dict(self.epochs), dict(self.owned))
            for member_id in sorted(self.epochs):
                self._beat(member_id, self.epochs[member_id])
            if (self.epochs, self.owned) == before:
                return {m: self.owned.get(m, {}).get(TOPIC, frozenset()) for m in self.epochs}
        raise AssertionError("the group did not settle")


def state(harness: Harness) -> str:
    return harness.shard.describe_group("orders").state


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "sticky", "uniform"])
@pytest.mark.parametrize("restart_while_paused", [False, True])
def test_resume_gives_every_member_back_what_it_had_before_the_pause(
    assignor: str, restart_while_paused: bool
) -> None:
    harness = Harness()
    harness.topics({TOPIC: 6})
    harness.configure(assignor=assignor)
    members = Members(harness)
    # m0 first takes everything and keeps 0-2 when m1 joins: a sticky target that a fresh
    # assignment (0, 2, 4 and 1, 3, 5) would not reproduce.
    members.join("m0")
    members.settle()
    members.join("m1")
    before = members.settle()
    assert before == {"m0": frozenset({0, 1, 2}), "m1": frozenset({3, 4, 5})}

    harness.configure(assignor=assignor, assignment_paused=True)
    assert members.settle() == {"m0": frozenset(), "m1": frozenset()}
    assert state(harness) == "Paused"
    if restart_while_paused:
        harness.shard = harness.replayed()

    harness.configure(assignor=assignor)
    assert members.settle() == before
    assert state(harness) == "Stable"
    assert harness.replayed().canonical_state() == harness.shard.canonical_state()


def test_the_paused_config_record_keeps_the_targets_and_the_resume_drops_them() -> None:
    harness = Harness()
    harness.topics({TOPIC: 2})
    harness.configure()
    members = Members(harness)
    members.join("m0")
    members.join("m1")
    members.settle()
    paused = harness.configure(assignment_paused=True)
    [kept] = [r.value for r in paused.records if isinstance(r.key, schema.GroupConfigKey)]
    assert isinstance(kept, schema.GroupConfigValue)
    assert kept.paused_targets == (
        schema.MemberTarget("m0", (schema.TopicPartitions(TOPIC_ID, (0,)),)),
        schema.MemberTarget("m1", (schema.TopicPartitions(TOPIC_ID, (1,)),)),
    )
    # A later change while paused carries them along; the same settings write nothing.
    assert harness.configure(assignment_paused=True).records == []
    changed = harness.configure(assignment_paused=True, session_timeout_ms=30_000)
    [config] = [r.value for r in changed.records if isinstance(r.key, schema.GroupConfigKey)]
    assert isinstance(config, schema.GroupConfigValue)
    assert config.paused_targets == kept.paused_targets
    resumed = harness.configure(session_timeout_ms=30_000)
    [config] = [r.value for r in resumed.records if isinstance(r.key, schema.GroupConfigKey)]
    assert isinstance(config, schema.GroupConfigValue)
    assert config.paused_targets == ()
