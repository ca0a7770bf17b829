"""Converting a group between the classic and the consumer protocol (Kafka 4's online migration).

Kafka's ``group.consumer.migration.policy`` (``config.MigrationPolicy``) allows two conversions
of a non-empty group, both done here as Kafka's ``GroupMetadataManager`` does them:

* Upgrade (``convertToConsumerGroup``): a KIP-848 member joins a classic group whose protocol
  type is ``consumer``. The classic group is tombstoned and a consumer group written in its
  place: group and target epochs = the generation, every member at that epoch, STABLE, its
  target and current assignment what the leader last assigned it, its classic metadata kept
  (so it goes on speaking JoinGroup as a classic member of the consumer group). Parked
  JoinGroup and SyncGroup requests are answered REBALANCE_IN_PROGRESS; the joining member's
  heartbeat then runs on the converted group (a new member: a new group epoch, the assignor).
  A member whose assignment cannot be read makes the upgrade fail, as Kafka's does
  (GROUP_ID_NOT_FOUND to the joining member).
* Downgrade (``convertToClassicGroup``): the last KIP-848 member of a consumer group leaves
  (or is fenced) and only classic members remain. The consumer group is tombstoned and a
  classic group written: Stable at the group epoch, the protocol voted, each member assigned
  its target as a ``ConsumerProtocolAssignment`` at its subscription's version; then it
  rebalances, so that the leader assigns from then on.

A ConsumerGroup resource that asks for server-side assignment (``spec.assignment: Server``)
is never downgraded: its members stay members of a consumer group, as they are today.

Records are ordered so that live replay only walks legal transitions: the consumer group's
epoch first, then its members (ASSIGNING), their targets and the target epoch (RECONCILING),
then their current assignments (STABLE); a downgrade's tombstones take members first.

Two members that the leader gave the same partition (a broken custom assignor) cannot both
own it in a consumer group: the partition is taken from both, as Kafka's sticky assignors
take a same-generation double claim from both claimants, and the drop is logged.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import uuid
from collections.abc import Collection, Mapping

from kafka_group_operator.coordinator import (
    classic_group,
    classic_rebalance,
    consumer_protocol,
    errors,
    group,
    group_state,
    membership,
    messages,
    result,
    timers,
)
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import records as coordinator_records
from kafka_group_records import records as schema

logger = logging.getLogger(__name__)

State = group_state.ClassicGroupState


def can_upgrade(
    existing: classic_group.ClassicGroup, settings: coordinator_config.CoordinatorConfig
) -> bool:
    """Kafka's ``validateOnlineUpgrade``."""
    if not settings.migration_policy.upgrade:
        logger.info("classic group %s: online upgrade is disabled", existing.group_id)
        return False
    if not existing.uses_consumer_protocol():
        logger.info(
            "classic group %s does not speak the consumer protocol: no upgrade",
            existing.group_id,
        )
        return False
    return len(existing.members) <= settings.consumer_max_size


def upgrade_records(
    existing: classic_group.ClassicGroup,
    topics: Mapping[str, schema.TopicMetadata],
) -> list[schema.Record]:
    """The records that replace ``existing`` by a consumer group of the same members.

    ``topics``: the broker's topic metadata by name (partitions of other topics are dropped).
    Raises ``GroupIdNotFound`` when a member's subscription or assignment cannot be read.
    """
    group_id = existing.group_id
    epoch = existing.generation
    assignments: dict[str, dict[str, frozenset[int]]] = {}
    subscriptions: dict[str, consumer_protocol.Subscription] = {}
    try:
        for member in existing.members.values():
            metadata = member.metadata(existing.protocol_name)
            subscriptions[member.member_id] = consumer_protocol.decode_subscription(metadata)
            assignments[member.member_id] = consumer_protocol.decode_assignment(member.assignment)
    except (consumer_protocol.MalformedConsumerProtocol, errors.InconsistentState) as error:
        logger.warning("cannot upgrade classic group %s: %s", group_id, error)
        raise errors.GroupIdNotFound(
            f"Cannot upgrade the classic group {group_id}: the embedded consumer protocol is "
            f"malformed."
        ) from None
    targets = _single_owner(group_id, assignments, topics)
    names = sorted(
        {name for subscription in subscriptions.values() for name in subscription.topics}
        | {name for target in assignments.values() for name in target}
    )
    records = [
        coordinator_records.new_group_metadata_tombstone(group_id),
        coordinator_records.new_group_epoch_record(group_id, epoch),
        coordinator_records.new_partition_metadata_record(
            group_id, [topics[name] for name in names if name in topics]
        ),
    ]
    for member in existing.members.values():
        subscription = subscriptions[member.member_id]
        records.append(
            coordinator_records.new_member_subscription_record(
                group_id,
                member.member_id,
                schema.ConsumerGroupMemberMetadataValue(
                    instance_id=member.instance_id,
                    rack_id=subscription.rack_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    subscribed_topic_names=tuple(sorted(set(subscription.topics))),
                    rebalance_timeout_ms=member.rebalance_timeout_ms,
                    classic_member_metadata=schema.ClassicMemberMetadata(
                        member.session_timeout_ms, member.protocols
                    ),
                ),
            )
        )
    for member_id in existing.members:
        records.append(
            coordinator_records.new_target_assignment_record(
                group_id, member_id, targets[member_id]
            )
        )
    records.append(coordinator_records.new_target_assignment_epoch_record(group_id, epoch))
    for member_id in existing.members:
        records.append(
            coordinator_records.new_current_assignment_record(
                group_id,
                member_id,
                member_epoch=epoch,
                previous_member_epoch=epoch,
                state=group_state.MemberState.STABLE,
                assigned=targets[member_id],
                pending_revocation={},
            )
        )
    return records


def _single_owner(
    group_id: str,
    assignments: Mapping[str, Mapping[str, frozenset[int]]],
    topics: Mapping[str, schema.TopicMetadata],
) -> dict[str, dict[uuid.UUID, frozenset[int]]]:
    """Each member's partitions by topic id: partitions of unknown topics or beyond a topic's
    count are dropped, and so is a partition given to two members (from both)."""
    claims: collections.Counter[tuple[str, int]] = collections.Counter(
        (name, partition)
        for assigned in assignments.values()
        for name, partitions in assigned.items()
        for partition in partitions
    )
    targets: dict[str, dict[uuid.UUID, frozenset[int]]] = {}
    for member_id, assigned in assignments.items():
        target: dict[uuid.UUID, frozenset[int]] = {}
        for name, partitions in assigned.items():
            metadata = topics.get(name)
            kept = frozenset(
                p
                for p in partitions
                if metadata is not None
                and 0 <= p < metadata.num_partitions
                and claims[(name, p)] == 1
            )
            dropped = sorted(partitions - kept)
            if dropped:
                logger.warning(
                    "classic group %s: member %s's %s partitions %s dropped (an unknown topic, "
                    "beyond its partitions, or assigned to another member too)",
                    group_id,
                    member_id,
                    name,
                    dropped,
                )
            if kept and metadata is not None:
                target[metadata.topic_id] = kept
        targets[member_id] = target
    return targets


def can_downgrade(
    existing: group.ConsumerGroup,
    leaving: Collection[str],
    settings: coordinator_config.CoordinatorConfig,
) -> bool:
    """Kafka's ``validateOnlineDowngradeWithFencedMember``, for members leaving together; a
    resource asking for server-side assignment keeps its consumer group."""
    if existing.config is not None and not existing.config.client_assignment:
        return False
    if not any(
        member_id in existing.members
        and existing.members[member_id].subscription().classic_member_metadata is None
        for member_id in leaving
    ):
        return False
    remaining = [m for member_id, m in existing.members.items() if member_id not in leaving]
    if not remaining or any(
        member.subscription().classic_member_metadata is None for member in remaining
    ):
        return False
    if not settings.migration_policy.downgrade:
        logger.info("consumer group %s: online downgrade is disabled", existing.group_id)
        return False
    return len(remaining) <= settings.classic_max_size


def downgrade(
    existing: group.ConsumerGroup,
    leaving: Collection[str],
    rebalance: classic_rebalance.ClassicRebalance,
    now_ms: int,
) -> tuple[list[schema.Record], list[result.SoftRecord]]:
    """The records and the soft record that replace ``existing`` by a classic group of the
    members not ``leaving``, which then rebalances (``can_downgrade`` has passed)."""
    group_id = existing.group_id
    converted = classic_group.ClassicGroup(
        group_id,
        State.STABLE,
        generation=existing.group_epoch,
        protocol_type=classic_group.CONSUMER_PROTOCOL_TYPE,
        state_timestamp=now_ms,
    )
    for member_id, member in existing.members.items():
        if member_id in leaving:
            continue
        subscription = member.subscription()
        metadata = subscription.classic_member_metadata
        assert metadata is not None
        converted.add(
            classic_group.ClassicMember(
                member_id=member_id,
                instance_id=member.instance_id,
                client_id=member.client_id,
                client_host=member.client_host,
                rebalance_timeout_ms=membership.rebalance_timeout_ms(
                    subscription, existing.settings
                ),
                session_timeout_ms=metadata.session_timeout_ms,
                protocol_type=classic_group.CONSUMER_PROTOCOL_TYPE,
                protocols=metadata.supported_protocols,
            )
        )
    converted.protocol_name = converted.select_protocol()
    converted.subscribed_topics = converted.compute_subscribed_topics()
    for classic_member in list(converted.members.values()):
        target = existing.by_name(existing.target.get(classic_member.member_id, {}))
        try:
            version = consumer_protocol.version_of(classic_member.metadata(converted.protocol_name))
        except consumer_protocol.MalformedConsumerProtocol:
            version = 0
        converted.put(
            dataclasses.replace(
                classic_member, assignment=consumer_protocol.encode_assignment(target, version)
            )
        )
    records = membership.group_tombstones(existing, keep_config=True)
    records.append(
        coordinator_records.new_group_metadata_record(
            group_id, converted.metadata_value(converted.group_assignment())
        )
    )
    rebalance.arm_heartbeats(converted, now_ms)
    work = rebalance.prepare_rebalance(converted, now_ms)
    records.extend(work.records)
    return records, [classic_group.ClassicGroupUpdated(group_id, converted)]


def fail_parked(
    existing: classic_group.ClassicGroup, error: errors.CoordinatorError
) -> list[result.Completion]:
    """Answer every parked JoinGroup and SyncGroup of a group leaving memory."""
    completions = []
    for member in existing.members.values():
        if member.awaiting_join:
            completions.append(
                result.Completion(result.join_key(existing.group_id, member.member_id), error=error)
            )
        if member.awaiting_sync:
            completions.append(
                result.Completion(result.sync_key(existing.group_id, member.member_id), error=error)
            )
    return completions


def arm_sessions(
    existing: classic_group.ClassicGroup, deadlines: timers.Deadlines, now_ms: int
) -> None:
    """The converted members' sessions, from their classic session timeouts (Kafka's)."""
    for member in existing.members.values():
        deadlines.arm(
            timers.session_key(existing.group_id, member.member_id),
            now_ms + member.session_timeout_ms,
        )


def leave_response(
    request: messages.HeartbeatRequest, interval_ms: int
) -> messages.HeartbeatResponse:
    return messages.HeartbeatResponse(
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        heartbeat_interval_ms=interval_ms,
    )
