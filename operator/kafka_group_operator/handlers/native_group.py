"""The brokers' own consumer group of a ConsumerGroup's id: mirroring, adoption, moving out.

* Mirroring (``spec.offsets.mirrorToKafka``, on by default): the runtime's ``mirror`` copies
  the committed offsets into the native group (see ``runtime.mirror``); its per-group status
  becomes the ``OffsetsMirrored`` condition.
* Adoption (``spec.offsets.adopt: IfEmpty``, the default): on the first reconciliation, when
  the coordinator has no offsets for the group, the native group's committed offsets of the
  subscribed topics are imported in one administrative commit through the coordinator (as a
  reset is), recorded in ``status.adoption`` with an Event; ``Adopted`` says how it ended.
  While the native group still has active members, adoption waits (``Adopted=False``,
  ``NativeMembersActive``) and the group's pods are not started: two coordinators must never
  own one group at once.
* Moving out: before a ``Retain`` group leaves the operator, ``flush`` mirrors what its
  members committed last, so plain Kafka consumers of the same ``group.id`` resume there.
* Deletion: a ``Delete`` group leaving the operator takes the native group with it
  (``delete_native``, Kafka's DeleteGroups): else the mirror's copy of its offsets (or
  those it adopted) would outlive it, and a group created again with the id would adopt them.

The check and the import are two steps: a native consumer that starts between them is not
held back by the import; the mirror, refused while that consumer runs, then says so.

Whether the native group has active members is asked the way the brokers decide it
themselves: the offsets just read are committed back unchanged, member-less, which a broker
accepts only while the group has no members (Kafka's ``validateOffsetCommit``: a member epoch
of -1 is accepted only for an empty group; ``UNKNOWN_MEMBER_ID`` otherwise). A DescribeGroups
would not do: some brokers (tansu) answer it without members. And every request goes through
a consumer of the group that never subscribes, not the admin client, whose coordinator
requests can abort the process when a connection drops (confluentinc/librdkafka#4605).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

import kopf
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from kafka_group_operator.coordinator import errors as coordinator_errors
from kafka_group_operator.coordinator import messages
from kafka_group_operator.handlers import coordinator_port, kafka_probe, lifecycle
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.manifests import conditions
from kafka_group_operator.runtime import mirror
from kafka_group_operator.specs import consumer_group as specs
from kafka_group_operator.specs import errors as spec_errors
from kafka_group_operator.wire import connection, offset_commits

OFFSETS_MIRRORED = "OffsetsMirrored"
ADOPTED = "Adopted"
# status.adoption lists at most this many offsets (``partitions`` counts them all).
ADOPTION_LISTED = 100
_QUIET: dict[str, str | int | float | bool] = {"log_level": 0, "log.connection.close": False}
_TIMEOUT_SECONDS = 10.0


class NativeMembersActive(spec_errors.SpecError):
    """The native group still has active consumers: adoption waits until they have left."""

    reason = "NativeMembersActive"


class AdoptionFailed(spec_errors.SpecError):
    """The native group's offsets could not be read or imported (retried with backoff)."""

    reason = "AdoptionFailed"


def mirror_target(
    group: specs.ConsumerGroupSpec, kafka_config: Mapping[str, str]
) -> mirror.MirrorTarget | None:
    """Where the group's offsets are mirrored; None when ``mirrorToKafka`` is off."""
    if not group.mirror_to_kafka:
        return None
    return mirror.MirrorTarget(
        group.kafka.bootstrap_servers, dict(kafka_config), float(group.mirror_interval_seconds)
    )


def mirror_condition(enabled: bool, status: mirror.MirrorStatus | None) -> conditions.Condition:
    """``OffsetsMirrored`` from the mirror's status of the group."""
    if not enabled:
        return conditions.Condition(
            OFFSETS_MIRRORED, False, "MirrorDisabled", "spec.offsets.mirrorToKafka is false"
        )
    if status is None:
        return conditions.Condition(OFFSETS_MIRRORED, None, "Pending", "not mirrored yet")
    if status.reason is mirror.MirrorReason.CAUGHT_UP:
        return conditions.Condition(OFFSETS_MIRRORED, True, status.reason.value, status.message)
    if status.reason is mirror.MirrorReason.MIRROR_FAILED:
        return conditions.Condition(OFFSETS_MIRRORED, False, status.reason.value, status.message)
    return conditions.Condition(OFFSETS_MIRRORED, None, status.reason.value, status.message)


def build_adoption(source: str, offsets: Mapping[tuple[str, int], int], now: str) -> dict[str, Any]:
    """``status.adoption`` for an import of ``offsets`` from ``source``."""
    listed = sorted(offsets.items())[:ADOPTION_LISTED]
    return {
        "source": source,
        "partitions": len(offsets),
        "offsets": [
            {"topic": topic, "partition": partition, "offset": offset}
            for (topic, partition), offset in listed
        ],
        "time": now,
    }


def read_native_offsets(
    bootstrap_servers: str,
    kafka_config: Mapping[str, str],
    group_id: str,
    partitions: Mapping[str, int],
) -> dict[tuple[str, int], tuple[int, str]]:
    """The native group's committed ``(offset, metadata)`` of every partition of the given
    topics that has one, after checking it has no active member (blocking).

    Raises ``NativeMembersActive`` when the brokers refuse a member-less commit of those same
    offsets, and ``AdoptionFailed`` when they cannot be read."""
    consumer = Consumer(
        {
            **kafka_config,
            **_QUIET,
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "enable.auto.commit": False,
            "session.timeout.ms": round(_TIMEOUT_SECONDS * 1000),
        }
    )
    try:
        wanted = [
            KafkaTopicPartition(topic, index)
            for topic, count in sorted(partitions.items())
            for index in range(count)
        ]
        try:
            committed = consumer.committed(wanted, timeout=_TIMEOUT_SECONDS) if wanted else []
        except KafkaException as error:
            raise AdoptionFailed(
                f"cannot read the offsets of the native group {group_id}: {error.args[0]}"
            ) from None
        found = {
            (tp.topic, tp.partition): (tp.offset, tp.metadata or "")
            for tp in committed
            if tp.error is None and tp.offset >= 0
        }
        if not found:
            return found
        probe = [
            KafkaTopicPartition(topic, partition, offset, metadata=metadata)
            for (topic, partition), (offset, metadata) in sorted(found.items())
        ]
        try:
            answered = consumer.commit(offsets=probe, asynchronous=False)
            refused = [tp.error for tp in answered or () if tp.error is not None]
        except KafkaException as error:
            refused = [error.args[0]]
        if any(_is_unknown_member(error) for error in refused):
            raise NativeMembersActive(
                f"the native group {group_id} on {bootstrap_servers} still has active "
                "members; adoption waits until they have stopped"
            )
        if refused:
            raise AdoptionFailed(f"the native group {group_id} cannot be checked: {refused[0]}")
        return found
    finally:
        consumer.close()


def _is_unknown_member(error: object) -> bool:
    name = getattr(error, "name", None)
    return callable(name) and name() == "UNKNOWN_MEMBER_ID"


async def adopt(
    state: lifecycle.OperatorState,
    group: specs.ConsumerGroupSpec,
    body: Mapping[str, Any],
    status: Mapping[str, Any],
) -> conditions.Condition | None:
    """Import the native group's offsets if the spec asks for it and nothing was decided yet.

    Returns the ``Adopted`` condition to publish (None when there is nothing to say); a False
    one (``NativeMembersActive``, ``AdoptionFailed``) means it must be tried again later.
    """
    if group.adopt == "Never":
        return None
    decided = conditions.find(status.get("conditions"), ADOPTED)
    if decided is not None and decided.get("status") == "True":
        return None
    coordinators = coordinator_port.port_of(state)
    request = messages.OffsetFetchRequest(group.group_id)
    if (await coordinators.fetch_offsets(request)).offsets:
        return conditions.Condition(
            ADOPTED,
            True,
            "CoordinatorHasOffsets",
            "the coordinator already holds offsets for the group: nothing was imported",
        )
    if await _has_members(coordinators, group.group_id):
        # Its members own the group here already (e.g. before an upgrade): an import would
        # be refused, and would go behind their back.
        return conditions.Condition(
            ADOPTED,
            True,
            "CoordinatorHasMembers",
            "the group already has members here: nothing was imported",
        )
    source = f"kafka://{group.kafka.bootstrap_servers}/{group.group_id}"
    partitions = await kafka_probe.partition_counts(
        group.kafka.bootstrap_servers, state.config.kafka_config
    )
    subscribed = {topic: partitions[topic] for topic in group.topics if topic in partitions}
    try:
        found = await asyncio.to_thread(
            read_native_offsets,
            group.kafka.bootstrap_servers,
            state.config.kafka_config,
            group.group_id,
            subscribed,
        )
    except (NativeMembersActive, AdoptionFailed) as error:
        return conditions.Condition(ADOPTED, False, error.reason, error.message)
    if not found:
        return conditions.Condition(
            ADOPTED, True, "NothingToImport", f"{source} has no committed offsets to import"
        )
    response = await coordinators.commit_offsets(
        messages.OffsetCommitRequest(
            group_id=group.group_id,
            member_id="",
            member_epoch=messages.LEAVE_EPOCH,
            offsets={
                tp: messages.CommitOffset(offset, metadata)
                for tp, (offset, metadata) in found.items()
            },
        )
    )
    if response.errors:
        return conditions.Condition(
            ADOPTED,
            False,
            AdoptionFailed.reason,
            f"the coordinator refused the import of {source}: {dict(response.errors)}",
        )
    offsets = {tp: offset for tp, (offset, _) in found.items()}
    adoption = build_adoption(source, offsets, conditions.now_rfc3339())
    await _patch_adoption(state, body, adoption)
    message = f"imported the committed offsets of {len(offsets)} partition(s) from {source}"
    kopf.event(
        kopf.Body(cast("kopf.RawBody", body)), type="Normal", reason="Adopted", message=message
    )
    return conditions.Condition(ADOPTED, True, "Imported", message)


async def _has_members(coordinators: coordinator_port.CoordinatorPort, group_id: str) -> bool:
    try:
        return bool((await coordinators.describe_group(group_id)).members)
    except coordinator_errors.GroupIdNotFound:
        return False


async def _patch_adoption(
    state: lifecycle.OperatorState, body: Mapping[str, Any], adoption: Mapping[str, Any]
) -> None:
    meta = body.get("metadata") or {}
    await state.kube.patch_status(
        kube_client.CONSUMER_GROUPS, meta.get("namespace"), meta["name"], {"adoption": adoption}
    )


async def flush_before_leaving(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec
) -> mirror.MirrorStatus | None:
    """Mirror the group's last offsets now (its pods are gone); None when it is not mirrored."""
    target = mirror_target(group, state.config.kafka_config)
    if target is None:
        return None
    coordinators = coordinator_port.port_of(state)
    await coordinators.configure_mirror(group.group_id, target)
    return await coordinators.flush_mirror(group.group_id)


async def delete_native(
    state: lifecycle.OperatorState, group: specs.ConsumerGroupSpec
) -> str | None:
    """Delete the native group of the group's id with its offsets; None once it is gone (or
    never was), else why it is still there (``NON_EMPTY_GROUP``: native consumers of the id
    are active; the brokers unreachable or unable to delete groups)."""
    try:
        committer = offset_commits.OffsetCommitter(
            group.kafka.bootstrap_servers, state.config.kafka_config, _TIMEOUT_SECONDS
        )
    except connection.ConfigError as error:
        return str(error)
    try:
        return await committer.delete_group(group.group_id)
    except offset_commits.CommitFailed as error:
        return str(error)
    finally:
        await committer.close()


def condition_patch(
    previous: Any, condition: conditions.Condition, generation: Any, now: str
) -> dict[str, Any]:
    """A status patch carrying only ``condition`` (its transition time kept from ``previous``)."""
    merged = conditions.merge_conditions(
        previous, [condition], generation if isinstance(generation, int) else None, now
    )
    return {"conditions": [item for item in merged if item["type"] == condition.type]}


def raise_if_waiting(condition: conditions.Condition) -> None:
    """Adoption that has not ended holds the reconciliation back (no pods start meanwhile)."""
    if condition.status is False:
        if condition.reason == NativeMembersActive.reason:
            raise NativeMembersActive(condition.message)
        raise AdoptionFailed(condition.message)
