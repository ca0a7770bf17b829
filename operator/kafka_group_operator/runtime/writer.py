"""Appends encoded records to the state topic and reports when the brokers hold them.

An idempotent producer with ``acks=all``: an append completes only when every in-sync
replica has every record, which is what lets the runtime reply "committed". librdkafka
reports deliveries from ``poll()``; a dedicated thread polls, so that a delivery wakes the
waiting coroutine at once instead of at the next tick of some event-loop timer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaError, Message, Producer

from kafka_group_operator.runtime import errors

logger = logging.getLogger(__name__)

EncodedRecord = tuple[bytes, bytes | None]

# The broker no longer accepts this producer's id or epoch (e.g. it restarted and lost its
# idempotence state): only a new producer, with a new id, can write again.
_PRODUCER_STATE_LOST = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
    }
)


class _Append:
    """One append: resolves its future, with the last record's offset, when the last of its
    records is acknowledged."""

    __slots__ = ("failure", "future", "last_offset", "loop", "remaining", "writer_broken")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, count: int, writer_broken: threading.Event
    ) -> None:
        self.loop = loop
        self.writer_broken = writer_broken
        self.future: asyncio.Future[int] = loop.create_future()
        self.remaining = count
        self.failure: KafkaError | None = None
        self.last_offset = -1

    def delivered(self, error: KafkaError | None, message: Message) -> None:
        # Runs in the poll thread; only counts there and hands the outcome to the loop.
        if error is not None and self.failure is None:
            self.failure = error
            if error.fatal() or error.code() in _PRODUCER_STATE_LOST:
                self.writer_broken.set()
        elif error is None:
            offset = message.offset()
            if offset is not None and offset > self.last_offset:
                self.last_offset = offset
        self.remaining -= 1
        if self.remaining == 0:
            self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if self.future.done():
            return
        if self.failure is None:
            self.future.set_result(self.last_offset)
        else:
            self.future.set_exception(
                errors.WriteFailed(
                    f"state topic write failed: {self.failure.str()}", self.failure.name()
                )
            )


class StateWriter:
    """The state topic's only producer."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        timeout_ms: int,
        kafka_config: Mapping[str, str],
    ) -> None:
        self.topic = topic
        self._config: dict[str, str | int | bool] = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            # Concurrent requests are already batched by the per-partition queues.
            "linger.ms": 1,
            # Kafka's offsets.commit.timeout.ms: how long a write may wait for the brokers.
            "message.timeout.ms": timeout_ms,
            # Find a restarted broker within a second rather than librdkafka's default 10.
            "reconnect.backoff.max.ms": 1000,
            **kafka_config,
        }
        self._producer: Producer | None = None
        self._stopping = threading.Event()
        # Set on a fatal producer error (e.g. a fenced idempotent producer): replace it.
        self._broken = threading.Event()
        self._poller: threading.Thread | None = None

    def start(self) -> None:
        self._producer = Producer(self._config)
        self._stopping.clear()
        self._poller = threading.Thread(target=self._poll, name="state-writer-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stopping.is_set():
            producer = self._producer
            if producer is not None:
                producer.poll(0.1)

    async def append(self, partition: int, batch: Sequence[EncodedRecord]) -> int:
        """Produce ``batch`` to ``partition`` in order; once all are acknowledged, return the
        offset of the last one (-1 for an empty batch)."""
        if self._producer is None:
            raise errors.WriteFailed("the state writer is stopped", "COORDINATOR_NOT_AVAILABLE")
        if not batch:
            return -1
        if self._broken.is_set():
            self._replace_producer()
        pending = _Append(asyncio.get_running_loop(), len(batch), self._broken)
        produce = self._producer.produce
        try:
            for key, value in batch:
                while True:
                    try:
                        produce(
                            self.topic,
                            value,
                            key,
                            partition=partition,
                            on_delivery=pending.delivered,
                        )
                        break
                    except BufferError:
                        # The local queue is full: let deliveries drain it, then go on.
                        await asyncio.sleep(0.001)
        except Exception as error:
            # A record that was never queued will never be reported: fail the append now.
            raise errors.WriteFailed(
                f"cannot queue state records: {error}", "INVALID_RECORD"
            ) from error
        return await pending.future

    def _replace_producer(self) -> None:
        logger.warning("the state producer hit a fatal error; starting a new one")
        self._broken.clear()
        old, self._producer = self._producer, Producer(self._config)
        if old is not None:
            # Fail whatever the old producer still holds, so that no append waits forever.
            old.purge()
            old.flush(1)

    def stop(self, timeout_s: float = 5.0) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            remaining = producer.flush(timeout_s)
            if remaining:
                logger.warning("%d state records were still unacknowledged at stop", remaining)
        self._stopping.set()
        if self._poller is not None:
            self._poller.join(timeout_s)
            self._poller = None
