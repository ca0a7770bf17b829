"""Repeat an assignment until it settles, as a group does over successive rebalances.

Each next round takes the previous result as every member's ``owned`` partitions, all at
one common generation (the highest so far plus one), and the loop stops after the first
round that revokes nothing from its input. Eager assignors settle in at most two rounds;
``cooperative-sticky`` needs a second round to hand over what the first one revoked.
"""

from __future__ import annotations

from dataclasses import replace

from kafka_group_operator.assignors import api, common

ROUND_LIMIT = 20


class UnsettledError(api.AssignorError):
    """The assignment still revoked partitions after ``ROUND_LIMIT`` rounds."""


def revokes(spec: api.GroupSpec, assignment: api.GroupAssignment) -> bool:
    """Whether some member loses a partition it owned in ``spec``."""
    for member_id, subscription in spec.members.items():
        if subscription.owned and not set(subscription.owned) <= set(assignment[member_id]):
            return True
    return False


def next_spec(spec: api.GroupSpec, assignment: api.GroupAssignment) -> api.GroupSpec:
    """The input of the following round: owned = ``assignment`` at one newer generation."""
    generation = 1 + max(
        (
            common.DEFAULT_GENERATION if member.generation is None else member.generation
            for member in spec.members.values()
        ),
        default=common.DEFAULT_GENERATION,
    )
    members = {
        member_id: replace(subscription, owned=tuple(assignment[member_id]), generation=generation)
        for member_id, subscription in spec.members.items()
    }
    return replace(spec, members=members)


def settle(
    assignor: api.PartitionAssignor, spec: api.GroupSpec, limit: int = ROUND_LIMIT
) -> list[api.GroupAssignment]:
    """Every round's assignment, up to and including the first that revokes nothing."""
    results = []
    for _ in range(limit):
        assignment = assignor.assign(spec)
        results.append(assignment)
        if not revokes(spec, assignment):
            return results
        spec = next_spec(spec, assignment)
    raise UnsettledError(f"{assignor.name} did not settle in {limit} rounds")
