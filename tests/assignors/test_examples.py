"""Worked examples: Kafka's javadoc examples, conflicting claims, member order and racks."""

from __future__ import annotations

import pytest

from kafka_group_operator import assignors
from kafka_group_operator.assignors import api, rounds

Member = api.MemberSubscription


def tp(name: str) -> api.TopicPartition:
    """``"t0p2"`` -> ``("t0", 2)``."""
    topic, partition = name.split("p")
    return (topic, int(partition))


def tps(*names: str) -> list[api.TopicPartition]:
    return sorted(tp(name) for name in names)


def spec(members: dict[str, Member], **counts: int) -> api.GroupSpec:
    return api.GroupSpec(members=members, partitions_per_topic=counts)


def on(*topics: str, owned: tuple[str, ...] = (), generation: int | None = None) -> Member:
    return Member(frozenset(topics), tuple(tp(name) for name in owned), generation)


def test_range_javadoc() -> None:
    group = spec({"C0": on("t0", "t1"), "C1": on("t0", "t1")}, t0=3, t1=3)
    assert assignors.get("range").assign(group) == {
        "C0": tps("t0p0", "t0p1", "t1p0", "t1p1"),
        "C1": tps("t0p2", "t1p2"),
    }


def test_roundrobin_javadoc_equal_subscriptions() -> None:
    group = spec({"C0": on("t0", "t1"), "C1": on("t0", "t1")}, t0=3, t1=3)
    assert assignors.get("roundrobin").assign(group) == {
        "C0": tps("t0p0", "t0p2", "t1p1"),
        "C1": tps("t0p1", "t1p0", "t1p2"),
    }


UNEQUAL = {"C0": on("t0"), "C1": on("t0", "t1"), "C2": on("t0", "t1", "t2")}


def test_roundrobin_javadoc_unequal_subscriptions() -> None:
    assert assignors.get("roundrobin").assign(spec(UNEQUAL, t0=1, t1=2, t2=3)) == {
        "C0": tps("t0p0"),
        "C1": tps("t1p0"),
        "C2": tps("t1p1", "t2p0", "t2p1", "t2p2"),
    }


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_sticky_javadoc_equal_subscriptions(name: str) -> None:
    """Three members on t0..t3 (two partitions each); then C1 leaves and only its
    partitions move."""
    assignor = assignors.get(name)
    topics = ("t0", "t1", "t2", "t3")
    first = assignor.assign(
        spec({c: on(*topics) for c in ("C0", "C1", "C2")}, **dict.fromkeys(topics, 2))
    )
    assert first == {
        "C0": tps("t0p0", "t1p1", "t3p0"),
        "C1": tps("t0p1", "t2p0", "t3p1"),
        "C2": tps("t1p0", "t2p1"),
    }
    remaining = {c: Member(frozenset(topics), tuple(first[c]), generation=1) for c in ("C0", "C2")}
    # The javadoc's second step (C0 gets t2p0, C2 t0p1) predates Kafka's
    # ConstrainedAssignmentBuilder, whose assignRoundRobin deals C1's t0p1, t2p0, t3p1 in
    # order to the members below quota: t0p1 to C0 (now full), then t2p0 and t3p1 to C2.
    assert assignor.assign(spec(remaining, **dict.fromkeys(topics, 2))) == {
        "C0": tps("t0p0", "t0p1", "t1p1", "t3p0"),
        "C2": tps("t1p0", "t2p0", "t2p1", "t3p1"),
    }


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky", "uniform"])
def test_sticky_javadoc_unequal_subscriptions(name: str) -> None:
    """Round-robin would give C2 four partitions; sticky balances to 1/2/3, then keeps
    everything when C0 leaves."""
    assignor = assignors.get(name)
    first = assignor.assign(spec(UNEQUAL, t0=1, t1=2, t2=3))
    assert first == {
        "C0": tps("t0p0"),
        "C1": tps("t1p0", "t1p1"),
        "C2": tps("t2p0", "t2p1", "t2p2"),
    }
    after = {c: Member(UNEQUAL[c].topics, tuple(first[c]), 1) for c in ("C1", "C2")}
    assert assignor.assign(spec(after, t0=1, t1=2, t2=3)) == {
        "C1": tps("t0p0", "t1p0", "t1p1"),
        "C2": tps("t2p0", "t2p1", "t2p2"),
    }


def test_cooperative_hands_over_in_two_rounds() -> None:
    """C0 owns both partitions and C1 joins: C0 revokes one, C1 gets it next round."""
    group = spec({"C0": on("t0", owned=("t0p0", "t0p1"), generation=1), "C1": on("t0")}, t0=2)
    assert rounds.settle(assignors.get("cooperative-sticky"), group) == [
        {"C0": tps("t0p0"), "C1": []},
        {"C0": tps("t0p0"), "C1": tps("t0p1")},
    ]
    # Eager: the target at once; the second round only confirms that nothing moves.
    target = {"C0": tps("t0p0"), "C1": tps("t0p1")}
    assert rounds.settle(assignors.get("sticky"), group) == [target, target]


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky", "uniform"])
def test_highest_generation_keeps_a_conflicting_claim(name: str) -> None:
    """B's claim on t0p0 is stale (generation 1 < 2); None counts as -1, below 0."""
    group = spec(
        {
            "A": on("t0", owned=("t0p0",), generation=2),
            "B": on("t0", owned=("t0p0", "t0p1"), generation=1),
            "C": on("t0", owned=("t0p2", "t0p1"), generation=None),
        },
        t0=3,
    )
    assert assignors.get(name).assign(group) == {
        "A": tps("t0p0"),
        "B": tps("t0p1"),
        "C": tps("t0p2"),
    }


def test_tied_claim_is_kept_by_nobody() -> None:
    group = spec(
        {
            "A": on("t0", owned=("t0p0", "t0p1"), generation=3),
            "B": on("t0", owned=("t0p0", "t0p2"), generation=3),
        },
        t0=4,
    )
    # Eager: the tied partition is free and goes wherever balance puts it.
    eager = assignors.get("sticky").assign(group)
    assert tp("t0p1") in eager["A"]
    assert tp("t0p2") in eager["B"]
    assert sorted(eager["A"] + eager["B"]) == tps("t0p0", "t0p1", "t0p2", "t0p3")
    # Cooperative: both may still be consuming it, so this round gives it to nobody.
    assert assignors.get("cooperative-sticky").assign(group) == {
        "A": tps("t0p1"),
        "B": tps("t0p2", "t0p3"),
    }


@pytest.mark.parametrize("name", ["range", "roundrobin", "sticky"])
def test_static_members_come_first_by_instance_id(name: str) -> None:
    group = spec(
        {
            "a-dynamic": on("t0"),
            "z-static": Member(frozenset({"t0"}), instance_id="grp-0"),
            "b-static": Member(frozenset({"t0"}), instance_id="grp-1"),
        },
        t0=5,
    )
    counts = {member: len(parts) for member, parts in assignors.get(name).assign(group).items()}
    assert counts == {"z-static": 2, "b-static": 2, "a-dynamic": 1}


def test_topics_without_metadata_are_skipped_or_rejected() -> None:
    group = spec({"A": on("t0", "gone"), "B": on("t0")}, t0=2)
    for name in ("range", "roundrobin", "sticky", "cooperative-sticky"):
        assignment = assignors.get(name).assign(group)
        assert sorted(assignment["A"] + assignment["B"]) == tps("t0p0", "t0p1")
    with pytest.raises(api.AssignorError, match="gone"):
        assignors.get("uniform").assign(group)


def test_registry_names_every_assignor() -> None:
    assert sorted(assignors.ASSIGNORS) == [
        "cooperative-sticky",
        "range",
        "roundrobin",
        "sticky",
        "uniform",
    ]
    with pytest.raises(api.AssignorError, match="valid: cooperative-sticky, range"):
        assignors.get("balanced")


RACKED = {"t0": [frozenset({"a"}), frozenset({"a"}), frozenset({"b"}), frozenset({"b"})]}


def racked(members: dict[str, Member]) -> api.GroupSpec:
    return api.GroupSpec(members=members, partitions_per_topic={"t0": 4}, partition_racks=RACKED)


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky", "range"])
def test_rack_aware_assignors_align_partitions(name: str) -> None:
    group = racked(
        {"m1": Member(frozenset({"t0"}), rack="b"), "m2": Member(frozenset({"t0"}), rack="a")}
    )
    assert assignors.get(name).assign(group) == {
        "m1": tps("t0p2", "t0p3"),
        "m2": tps("t0p0", "t0p1"),
    }


def test_uniform_and_roundrobin_ignore_racks() -> None:
    group = racked(
        {"m1": Member(frozenset({"t0"}), rack="b"), "m2": Member(frozenset({"t0"}), rack="a")}
    )
    for name in ("uniform", "roundrobin"):
        assert assignors.get(name).assign(group) == {
            "m1": tps("t0p0", "t0p2"),
            "m2": tps("t0p1", "t0p3"),
        }


def test_range_rack_matching_stays_within_quotas() -> None:
    """Three partitions on racks a, b, c: m1 (rack c) takes p2 first, then fills to its
    quota of two with p1; m2 (rack a) gets p0."""
    group = api.GroupSpec(
        members={
            "m1": Member(frozenset({"t0"}), rack="c"),
            "m2": Member(frozenset({"t0"}), rack="a"),
        },
        partitions_per_topic={"t0": 3},
        partition_racks={"t0": [frozenset({"a"}), frozenset({"b"}), frozenset({"c"})]},
    )
    assert assignors.get("range").assign(group) == {"m1": tps("t0p1", "t0p2"), "m2": tps("t0p0")}


def test_sticky_moves_misaligned_claims_to_their_rack() -> None:
    group = racked(
        {
            "m1": Member(frozenset({"t0"}), owned=(("t0", 0), ("t0", 1)), generation=1, rack="b"),
            "m2": Member(frozenset({"t0"}), owned=(("t0", 2), ("t0", 3)), generation=1, rack="a"),
        }
    )
    aligned = {"m1": tps("t0p2", "t0p3"), "m2": tps("t0p0", "t0p1")}
    assert assignors.get("sticky").assign(group) == aligned
    assert rounds.settle(assignors.get("cooperative-sticky"), group) == [
        {"m1": [], "m2": []},
        aligned,
    ]


@pytest.mark.parametrize("name", ["sticky", "cooperative-sticky"])
def test_misaligned_claims_stay_when_no_aligned_member_has_room(name: str) -> None:
    """A and B (rack a) each hold one partition on rack a and one on racks b and c; C (rack
    c) is full. Dropping those claims for alignment would only swap them between A and B."""
    racks = [frozenset({"c"}), frozenset({"a"}), frozenset({"a"})] + [frozenset({"b", "c"})] * 2
    owned = {"A": (("t0", 1), ("t0", 4)), "B": (("t0", 2), ("t0", 3)), "C": (("t0", 0),)}
    group = api.GroupSpec(
        members={
            member: Member(frozenset({"t0"}), claims, 1, "c" if member == "C" else "a")
            for member, claims in owned.items()
        },
        partitions_per_topic={"t0": 5},
        partition_racks={"t0": racks},
    )
    assert assignors.get(name).assign(group) == {
        member: sorted(claims) for member, claims in owned.items()
    }
