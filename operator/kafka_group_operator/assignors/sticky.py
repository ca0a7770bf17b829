"""``sticky`` and ``cooperative-sticky``: Kafka's client-side sticky assignors (KIP-54, KIP-429).

Both compute the same balanced, sticky, rack-aware target (``balancing``). ``sticky`` hands
it out at once, which suits the eager protocol where every member has revoked everything
before the round. ``cooperative-sticky`` withholds each partition that moves between
members: the previous holder revokes it this round and the next round assigns it, so no
partition is ever owned twice. Example: C0 owns ``t0p0, t0p1`` at generation 1 and C1
joins: the target is one each, so this round gives C0 ``[t0p0]`` and C1 nothing; the next
round gives C1 ``[t0p1]``.
"""

from __future__ import annotations

from kafka_group_operator.assignors import api, balancing


class StickyAssignor:
    name = "sticky"

    def assign(self, spec: api.GroupSpec) -> api.GroupAssignment:
        options = balancing.Options(rack_aware=True, cooperative=False, require_metadata=False)
        return balancing.assign(spec, options)


class CooperativeStickyAssignor:
    name = "cooperative-sticky"

    def assign(self, spec: api.GroupSpec) -> api.GroupAssignment:
        options = balancing.Options(rack_aware=True, cooperative=True, require_metadata=False)
        return balancing.assign(spec, options)
