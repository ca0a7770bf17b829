"""Reads state-topic partitions from the beginning to their end, at start-up or after a fault.

Finding "the end" must not trust the high watermark: some Kafka-protocol brokers report a
wrong one, and a watermark read before the last write landed is stale anyway. The loader
therefore first appends a ``LoadMarker`` record with a fresh nonce to every partition it
loads, and a partition is read once its own marker comes back. Everything before the
marker is then in, including writes acknowledged to anyone before the load began.

While reading, the loader compacts exactly as Kafka's log cleaner would: the last record per
key bytes wins and keeps its place in the log (the survivors' order is the order of their last
occurrence), and a key whose last record is a tombstone is gone. Only the survivors are
decoded and replayed, so a log that was never compacted loads into the same state as the
compacted one, and loading costs one dict update per record plus one decode per live key.
Markers themselves are never replayed. Unknown record types are skipped with a warning, as
Kafka's loader does; any other undecodable record fails that partition's load.

The loader reads with ``isolation.level=read_committed``: records of a transaction that a
fenced or crashed writer never committed are not state. Writing the marker starts this
process's transactional producer for the partition, which fences any other coordinator's
writer of it first, and the marker lands after that fencing (``StateWriter.append_marker``):
after the marker, no one else can commit to the partition. A partition whose marker cannot
be written because this writer is itself fenced ends its load with ``WriterFenced``.

With a compaction checkpoint configured, each partition starts from the checkpoint's
survivors instead of from nothing, and the log is read from the first offset the checkpoint
does not cover; compaction then continues over that tail exactly as over the whole log, so the
result is the same. A partition whose marker lands before that offset (the topic was
recreated under the checkpoint) drops the checkpoint and is read from the start; a missing,
unreadable or unfitting checkpoint means reading every partition from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from kafka_group_operator.runtime import checkpoints, errors, writer
from kafka_group_records import codec, records

logger = logging.getLogger(__name__)

T = TypeVar("T")

MARKER_KEY = codec.encode_key(records.LoadMarkerKey())
# How many records one consume() call may hand over; large batches keep Python out of the way.
_CONSUME_BATCH = 10_000


def compact(log: Iterable[tuple[bytes, bytes | None]]) -> dict[bytes, bytes | None]:
    """The log as Kafka's cleaner leaves it: last record per key, in last-occurrence order."""
    survivors: dict[bytes, bytes | None] = {}
    for key, value in log:
        if key == MARKER_KEY:
            continue
        # Re-inserting moves the key to the end, where its newest record sits in the log.
        survivors.pop(key, None)
        survivors[key] = value
    return survivors


def decode_survivors(
    survivors: Mapping[bytes, bytes | None],
    partition: int = -1,
    decoded_before: Mapping[bytes, tuple[bytes, records.Record]] | None = None,
) -> list[records.Record]:
    """Decode the live records of a compacted partition (tombstoned keys are gone), reusing
    ``decoded_before[key]`` where its value bytes are still the survivor's."""
    decoded = []
    unknown: dict[int, int] = {}
    known = decoded_before or {}
    for key, value in survivors.items():
        if value is None:
            continue
        early = known.get(key)
        if early is not None and early[0] is value:
            decoded.append(early[1])
            continue
        try:
            decoded.append(codec.decode_record(key, value))
        except codec.UnknownRecordType as error:
            unknown[error.key_version] = unknown.get(error.key_version, 0) + 1
        except codec.CodecError as error:
            raise errors.LoadFailed(
                f"undecodable record in state partition {partition}: {error}"
            ) from error
    for key_version, count in sorted(unknown.items()):
        logger.warning(
            "skipped %d records of unknown type %d in state partition %d",
            count,
            key_version,
            partition,
        )
    return decoded


def decode_ahead(
    survivors: Mapping[bytes, bytes | None],
) -> dict[bytes, tuple[bytes, records.Record]]:
    """Decodes what can be decoded now, keeping the bytes each record came from; failures are
    left for ``decode_survivors`` to report."""
    decoded: dict[bytes, tuple[bytes, records.Record]] = {}
    for key, value in survivors.items():
        if value is not None:
            with contextlib.suppress(codec.CodecError):
                decoded[key] = (value, codec.decode_record(key, value))
    return decoded


def replay_order(log: Iterable[tuple[bytes, bytes | None]]) -> list[records.Record]:
    """The records a load replays for ``log`` (one partition's key/value bytes, in order)."""
    return decode_survivors(compact(log))


class PartitionLoader:
    """Loads a set of partitions: markers first, then one consumer reading them all."""

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        state_writer: writer.StateWriter,
        kafka_config: Mapping[str, str],
        clock_ms: Callable[[], int],
        retry_backoff_s: float = 0.5,
        partition_count: int | None = None,
        checkpoint_uri: str | None = None,
    ) -> None:
        self.topic = topic
        # Checkpoints are used only when the topic's partition count is known to match.
        self._checkpoint_uri = checkpoint_uri if partition_count is not None else None
        self._partition_count = partition_count or 0
        self._writer = state_writer
        self._clock_ms = clock_ms
        self._retry_backoff_s = retry_backoff_s
        self._consumer_config: dict[str, str | int | bool] = {
            "bootstrap.servers": bootstrap_servers,
            # Never joins the group (assign() only): librdkafka merely insists on an id.
            "group.id": f"{topic}.loader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # Only committed transactions are state (see the module's docstring).
            **kafka_config,
            "isolation.level": "read_committed",
        }

    async def write_markers(
        self,
        nonces: Mapping[int, str],
        written: queue.SimpleQueue[tuple[int, int | None]] | None = None,
        fenced: Callable[[int, errors.WriterFenced], None] | None = None,
    ) -> None:
        """Append each partition's marker, retrying while the brokers are away; report each
        marker's offset to ``written``. A partition whose writer is fenced is reported to
        ``fenced`` (and as offset ``None`` to ``written``) and given up."""

        async def one(partition: int, nonce: str) -> None:
            encoded = codec.encode_record(
                records.Record(
                    records.LoadMarkerKey(), records.LoadMarkerValue(nonce, self._clock_ms())
                )
            )
            # Writing the same marker twice is harmless: the first one ends the read.
            while True:
                try:
                    offset = await self._writer.append_marker(partition, encoded)
                    if written is not None:
                        written.put((partition, offset))
                    return
                except errors.WriterFenced as error:
                    logger.warning("state partition %d not loaded: %s", partition, error)
                    if written is not None:
                        written.put((partition, None))
                    if fenced is not None:
                        fenced(partition, error)
                    return
                except errors.WriteFailed as error:
                    logger.warning("load marker for partition %d not written: %s", partition, error)
                    await asyncio.sleep(self._retry_backoff_s)

        await asyncio.gather(*(one(partition, nonce) for partition, nonce in nonces.items()))

    async def load(
        self,
        partitions: Collection[int],
        build: Callable[[int, list[records.Record]], T],
        on_loaded: Callable[[int, T | BaseException], None],
    ) -> None:
        """Load ``partitions``; for each, ``build`` its records (in the reading thread) and
        hand the result, or the failure, to ``on_loaded`` on the event loop."""
        nonces = {partition: self._writer.marker_nonce("load") for partition in partitions}
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        markers: queue.SimpleQueue[tuple[int, int | None]] = queue.SimpleQueue()

        def finished(partition: int, outcome: T | BaseException) -> None:
            loop.call_soon_threadsafe(on_loaded, partition, outcome)

        # Reading starts while the markers are written: the reader needs only the nonces.
        reading = asyncio.ensure_future(
            asyncio.to_thread(self._read, nonces, markers, build, finished, stop)
        )
        try:
            await self.write_markers(nonces, markers, fenced=finished)
            await reading
        finally:
            stop.set()
            if not reading.done():
                reading.cancel()

    def _read(
        self,
        nonces: dict[int, str],
        markers: queue.SimpleQueue[tuple[int, int | None]],
        build: Callable[[int, list[records.Record]], T],
        finished: Callable[[int, T | BaseException], None],
        stop: threading.Event,
    ) -> None:
        started = time.monotonic()
        survivors: dict[int, dict[bytes, bytes | None]] = {p: {} for p in nonces}
        # Where each partition's read starts: after what the checkpoint covers, or at 0.
        starts = dict.fromkeys(nonces, 0)
        seeded = dict.fromkeys(nonces, 0)
        if self._checkpoint_uri is not None:
            found = checkpoints.newest(
                self._checkpoint_uri, self.topic, self._partition_count, list(nonces)
            )
            if found is not None:
                logger.info("loading from compaction checkpoint %s", found.location)
                for index in nonces:
                    survivors[index] = found.survivors.get(index, {})
                    starts[index] = found.manifest.tail_start(index)
                    seeded[index] = len(survivors[index])
        consumer = Consumer(self._consumer_config)
        try:
            consumer.assign(
                [
                    TopicPartition(self.topic, index, starts[index] or OFFSET_BEGINNING)
                    for index in nonces
                ]
            )
            # The checkpoint's records are decoded while librdkafka fetches the tail (and the
            # markers are written): only the keys the tail rewrites are decoded again.
            ahead = {p: decode_ahead(survivors[p]) for p in nonces if seeded[p]}
            read = 0
            while survivors and not stop.is_set():
                self._check_markers(consumer, markers, survivors, starts, seeded)
                batch = consumer.consume(_CONSUME_BATCH, 0.2)
                read += len(batch)
                for message in batch:
                    if message.error() is not None:
                        self._log_error(message.error())
                        continue
                    partition = message.partition()
                    log = None if partition is None else survivors.get(partition)
                    if partition is None or log is None:
                        continue  # already loaded: a late message of the last fetch
                    key = message.key()
                    if key == MARKER_KEY:
                        if self._is_marker(message.value(), nonces[partition]):
                            del survivors[partition]
                            consumer.incremental_unassign([TopicPartition(self.topic, partition)])
                            finished(
                                partition,
                                self._build(partition, log, build, ahead.pop(partition, None)),
                            )
                            logger.info(
                                "state partition %d loaded: %d live keys (%d from the "
                                "checkpoint, log read from offset %d), %.2fs",
                                partition,
                                len(log),
                                seeded[partition],
                                starts[partition],
                                time.monotonic() - started,
                            )
                        continue
                    if key is not None:
                        # Re-inserting moves the key to where its newest record sits.
                        log.pop(key, None)
                        log[key] = message.value()
            logger.info("read %d state records in %.2fs", read, time.monotonic() - started)
        finally:
            consumer.close()

    def _check_markers(
        self,
        consumer: Consumer,
        markers: queue.SimpleQueue[tuple[int, int | None]],
        survivors: dict[int, dict[bytes, bytes | None]],
        starts: dict[int, int],
        seeded: dict[int, int],
    ) -> None:
        """A marker written before where a partition's read starts means the log is shorter
        than the checkpoint says: that read would never reach the marker, and the checkpoint
        is of another log. Read that partition from the start instead. A partition without a
        marker (``None``: its writer was fenced) is no longer read."""
        while True:
            try:
                partition, offset = markers.get_nowait()
            except queue.Empty:
                return
            if partition in survivors and offset is None:
                del survivors[partition]
                consumer.incremental_unassign([TopicPartition(self.topic, partition)])
                continue
            if partition not in survivors or offset is None or offset >= starts[partition]:
                continue
            logger.warning(
                "state partition %d ends at offset %d, before the %d the checkpoint covers "
                "(the topic was recreated?): loading it from the log alone",
                partition,
                offset,
                starts[partition],
            )
            survivors[partition] = {}
            starts[partition] = seeded[partition] = 0
            consumer.incremental_unassign([TopicPartition(self.topic, partition)])
            consumer.incremental_assign([TopicPartition(self.topic, partition, OFFSET_BEGINNING)])

    @staticmethod
    def _is_marker(value: bytes | None, nonce: str) -> bool:
        if value is None:
            return False
        try:
            marker = codec.decode_value(records.LoadMarkerKey(), value)
        except codec.CodecError:
            return False
        return isinstance(marker, records.LoadMarkerValue) and marker.nonce == nonce

    @staticmethod
    def _build(
        partition: int,
        log: dict[bytes, bytes | None],
        build: Callable[[int, list[records.Record]], T],
        decoded_before: Mapping[bytes, tuple[bytes, records.Record]] | None = None,
    ) -> T | BaseException:
        try:
            return build(partition, decode_survivors(log, partition, decoded_before))
        except Exception as error:
            logger.exception("state partition %d failed to load", partition)
            return error

    @staticmethod
    def _log_error(error: KafkaError | None) -> None:
        if error is not None:
            logger.warning("reading the state topic: %s", error.str())
