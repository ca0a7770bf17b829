"""What the operator tells the embedded coordinator about a ConsumerGroup.

Pure: ``ConsumerGroupSpec`` in, ``messages.GroupSettings`` out. The reset/restore flow pauses
assignment too; it passes ``paused_for_reset`` so that ``spec.paused`` and a running reset
both keep partitions unassigned and neither unpauses the other.
"""

from __future__ import annotations

from kafka_group_operator.coordinator import messages
from kafka_group_operator.specs import consumer_group


def build_group_settings(
    group: consumer_group.ConsumerGroupSpec, *, paused_for_reset: bool = False
) -> messages.GroupSettings:
    return messages.GroupSettings(
        group_id=group.group_id,
        assignor=group.assignor,
        session_timeout_ms=group.session_timeout_seconds * 1000,
        rebalance_timeout_ms=group.rebalance_timeout_seconds * 1000,
        offsets_retention_ms=group.offsets_retention_minutes * 60_000,
        assignment_paused=group.paused or paused_for_reset,
        topics=group.topics,
        client_assignment=group.assignment == "Client",
    )
