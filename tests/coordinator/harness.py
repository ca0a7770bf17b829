"""A coordinator shard driven the way the runtime drives it, for scenario and property tests.

``Harness`` plays the runtime's part without I/O: it calls a handler, keeps the returned
records in a log (the state topic), replays them into the shard, and returns the result.
``replayed()`` loads that log into a fresh shard, which is how the tests check that replay
from scratch rebuilds exactly the live state.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import messages, records, result, shard
from kafka_group_records import records as schema

T = TypeVar("T")

GROUP = "orders"
TOPIC = "events"
TOPIC_ID = schema.topic_id_for_name(TOPIC)
DEFAULT_SETTINGS = messages.GroupSettings(GROUP, topics=(TOPIC,))


class Harness:
    def __init__(
        self,
        now_ms: int = 1_000,
        settings: coordinator_config.CoordinatorConfig = coordinator_config.DEFAULT,
        new_uuid: Callable[[], str] | None = None,
    ) -> None:
        self.settings = settings
        self.shard = shard.CoordinatorShard(settings=settings)
        if new_uuid is not None:
            self.shard._rebalance._new_uuid = new_uuid
        self.shard.on_loaded(now_ms)
        self.log: list[schema.Record] = []
        self.now_ms = now_ms
        # Answers to parked requests, by key, in the order the runtime would give them.
        self.completed: dict[result.DeferredKey, result.Completion] = {}
        self.completions: list[result.Completion] = []

    def apply(self, outcome: result.Result[T]) -> result.Result[T]:
        """Replay as the runtime does: records (kept in the log), soft records, then the
        completions of parked requests."""
        for record in outcome.records:
            self.log.append(record)
            self.shard.replay(record)
        for soft in outcome.soft:
            self.shard.replay_soft(soft)
        for completion in outcome.completions:
            self.completed[completion.key] = completion
            self.completions.append(completion)
        return outcome

    def topics(self, partitions: Mapping[str, int]) -> result.Result[None]:
        return self.apply(
            self.shard.update_topics(
                {name: messages.TopicInfo(name, count) for name, count in partitions.items()},
                self.now_ms,
            )
        )

    def configure(self, **overrides: Any) -> result.Result[None]:
        settings = dataclasses.replace(DEFAULT_SETTINGS, **overrides)
        return self.apply(self.shard.configure_group(settings, self.now_ms))

    def heartbeat(
        self,
        member_id: str,
        epoch: int,
        *,
        owned: Mapping[str, frozenset[int]] | None = None,
        instance_id: str | None = None,
        topics: tuple[str, ...] | None = None,
        group_id: str = GROUP,
    ) -> result.Result[messages.HeartbeatResponse]:
        if epoch == messages.JOIN_EPOCH and topics is None:
            topics = (TOPIC,)
        request = messages.HeartbeatRequest(
            group_id=group_id,
            member_id=member_id,
            member_epoch=epoch,
            instance_id=instance_id,
            subscribed_topic_names=topics,
            owned_partitions=owned,
        )
        return self.apply(self.shard.heartbeat(request, self.now_ms))

    def commit(
        self, member_id: str, epoch: int, partitions: Mapping[tuple[str, int], int]
    ) -> result.Result[messages.OffsetCommitResponse]:
        request = messages.OffsetCommitRequest(
            GROUP,
            member_id,
            epoch,
            {tp: messages.CommitOffset(offset) for tp, offset in partitions.items()},
        )
        return self.apply(self.shard.commit_offsets(request, self.now_ms))

    def tick(self, advance_ms: int) -> result.Result[None]:
        self.now_ms += advance_ms
        return self.apply(self.shard.on_timer(self.now_ms))

    def replayed(self) -> shard.CoordinatorShard:
        fresh = shard.CoordinatorShard(settings=self.settings)
        for record in self.log:
            fresh.replay(record)
        fresh.on_loaded(self.now_ms)
        return fresh


def parts(*partitions: int) -> dict[str, frozenset[int]]:
    """An assignment of the test topic, as heartbeats carry it."""
    return {TOPIC: frozenset(partitions)} if partitions else {}


def ids(*partitions: int) -> dict[uuid.UUID, frozenset[int]]:
    """The same assignment keyed by topic id, as records carry it."""
    return {TOPIC_ID: frozenset(partitions)} if partitions else {}


def current(
    member_id: str,
    epoch: int,
    previous: int,
    state: int,
    assigned: tuple[int, ...] = (),
    pending: tuple[int, ...] = (),
) -> schema.Record:
    return records.new_current_assignment_record(
        GROUP,
        member_id,
        member_epoch=epoch,
        previous_member_epoch=previous,
        state=state,
        assigned={TOPIC_ID: frozenset(assigned)},
        pending_revocation={TOPIC_ID: frozenset(pending)},
    )


def target(member_id: str, *partitions: int) -> schema.Record:
    return records.new_target_assignment_record(GROUP, member_id, {TOPIC_ID: frozenset(partitions)})


def subscription(member_id: str, instance_id: str | None = None) -> schema.Record:
    return records.new_member_subscription_record(
        GROUP,
        member_id,
        schema.ConsumerGroupMemberMetadataValue(
            instance_id=instance_id, subscribed_topic_names=(TOPIC,)
        ),
    )


def topic_metadata(partitions: int) -> schema.Record:
    return records.new_partition_metadata_record(
        GROUP, [schema.TopicMetadata(TOPIC_ID, TOPIC, partitions)]
    )
