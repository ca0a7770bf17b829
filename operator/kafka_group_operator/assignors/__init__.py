"""Partition assignors: range, roundrobin, sticky, cooperative-sticky and uniform, one interface.

Pure algorithms: no I/O, no third-party imports. ``ASSIGNORS`` maps each assignor's name
to it; ``get(name)`` looks one up.
"""

from __future__ import annotations

from kafka_group_operator.assignors import api, ranges, round_robin, sticky, uniform

ASSIGNORS: dict[str, api.PartitionAssignor] = {
    assignor.name: assignor
    for assignor in (
        ranges.RangeAssignor(),
        round_robin.RoundRobinAssignor(),
        sticky.StickyAssignor(),
        sticky.CooperativeStickyAssignor(),
        uniform.UniformAssignor(),
    )
}


class UnknownAssignorError(api.AssignorError):
    """No assignor has the requested name."""


def get(name: str) -> api.PartitionAssignor:
    """The assignor called ``name``; the error lists the valid names."""
    try:
        return ASSIGNORS[name]
    except KeyError:
        valid = ", ".join(sorted(ASSIGNORS))
        raise UnknownAssignorError(f"unknown assignor {name!r}; valid: {valid}") from None
