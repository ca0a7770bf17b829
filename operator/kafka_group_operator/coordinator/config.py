"""The coordinator's own settings, the same for every group (Kafka's ``GroupCoordinatorConfig``).

Per-group settings come from the ConsumerGroup resource (the GroupConfig record); these are
the broker-level ones Kafka has for classic groups and for moving groups between protocols.
Defaults are Kafka's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class MigrationPolicy(enum.Enum):
    """Kafka's ``group.consumer.migration.policy``: which conversions of a non-empty group
    between the classic and the consumer protocol are allowed."""

    BIDIRECTIONAL = "bidirectional"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    DISABLED = "disabled"

    @property
    def upgrade(self) -> bool:
        """A KIP-848 member may join a classic group, which becomes a consumer group."""
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.UPGRADE)

    @property
    def downgrade(self) -> bool:
        """When the last KIP-848 member leaves, the classic members become a classic group."""
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.DOWNGRADE)


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    # group.min.session.timeout.ms / group.max.session.timeout.ms: a JoinGroup outside them
    # is INVALID_SESSION_TIMEOUT.
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    # group.initial.rebalance.delay.ms: how long a new classic group waits for more members
    # before its first rebalance (extended, up to the rebalance timeout, while they come).
    initial_rebalance_delay_ms: int = 3_000
    # group.max.size (classic groups) and group.consumer.max.size (consumer groups, checked
    # by conversions).
    classic_max_size: int = 2**31 - 1
    consumer_max_size: int = 2**31 - 1
    # How long a new member's JoinGroup may be parked (Kafka's 5 minutes).
    new_member_join_timeout_ms: int = 300_000
    migration_policy: MigrationPolicy = MigrationPolicy.BIDIRECTIONAL


DEFAULT = CoordinatorConfig()


def parse_migration_policy(name: str) -> MigrationPolicy:
    """Kafka's case-insensitive policy name; ValueError naming the choices otherwise (Kafka
    reads an unknown name as ``disabled``, a silent surprise this refuses instead)."""
    try:
        return MigrationPolicy(name.strip().lower())
    except ValueError:
        choices = ", ".join(policy.value for policy in MigrationPolicy)
        raise ValueError(f"migration policy {name!r} is not one of {choices}") from None
