"""``uniform``: the KIP-848 server-side assignor (Kafka's ``UniformAssignor``).

Balance first, then stickiness, over the group's current target assignment (``owned``).
Unlike the client-side assignors it refuses a subscription to a topic without metadata
(``AssignorError``) and ignores racks, as Kafka's does. With unequal subscriptions it
meets the sticky assignors' balance rule, which is stricter than Kafka's "almost balanced"
heterogeneous builder. Example: five partitions of t0, members A and B, A owns all five:
A keeps three, B gets two.
"""

from __future__ import annotations

from kafka_group_operator.assignors import api, balancing


class UniformAssignor:
    name = "uniform"

    def assign(self, spec: api.GroupSpec) -> api.GroupAssignment:
        options = balancing.Options(rack_aware=False, cooperative=False, require_metadata=True)
        return balancing.assign(spec, options)
