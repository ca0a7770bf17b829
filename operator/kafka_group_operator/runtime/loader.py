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
unreadable or unfitting checkpoint, or one older than the topic keeps tombstones
(``delete.retention.ms``, see ``checkpoints``), means reading every partition from the start.

The runtime's loads (``load_survivors``) hand offset commits written in the coordinator's own
form to the shard undecoded (``coordinator.offsets.EncodedCommit``: the group and partition
names shared between keys, the value's bytes as they are); every other record is decoded.
Decoding 100,000 survivors into records was most of a takeover's CPU. ``load`` decodes
everything into records, for callers that want the records themselves.

The cyclic garbage collector is paused while a load decodes and builds (``collector_paused``):
a load allocates objects by the hundred thousand, none of them garbage, and each collection
it triggers walks every object of the process, the partitions already served included. The
pause covers only that CPU-bound work, never a wait for the brokers, so garbage of the rest
of the process waits for a collection at most as long as a decode takes. The loaded state is
not frozen afterwards (``gc.freeze``), which would keep later full collections off it: most
of it is offsets kept as bytes, which the collector does not track anyway, and a frozen
partition given up would keep whatever cyclic garbage it left until a ``gc.unfreeze``, which
is process-wide (reference counting would still free everything else of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import queue
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_group_operator.coordinator import offsets
from kafka_group_operator.runtime import checkpoints, errors, topic, writer
from kafka_group_records import codec, records

logger = logging.getLogger(__name__)

T = TypeVar("T")
D = TypeVar("D")
Item = TypeVar("Item")

MARKER_KEY = codec.encode_key(records.LoadMarkerKey())
# How many records one consume() call may hand over; large batches keep Python out of the way.
_CONSUME_BATCH = 10_000
# How long one consume() call waits: it returns before that only with a full batch, so the
# marker that ends a load is handed over up to this long after it arrived.
_CONSUME_WAIT_S = 0.01
# Reading the topic's delete.retention.ms before using a checkpoint.
_ADMIN_TIMEOUT_S = 10.0
# A load whose read waits this long at a last stable offset below its marker reports a hanging
# transaction (``_HangingTransactions``), and again at this interval while it lasts. Every
# transaction of the partition's writer was completed before its marker was written, so only
# a transaction Kafka never completed holds the read back for long.
_HANGING_AFTER_S = 30.0
_HANGING_CHECK_S = 5.0


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
    return _decode_all(survivors, partition, codec.decode_record, decoded_before)


def decode_ahead(
    survivors: Mapping[bytes, bytes | None],
    one: Callable[[bytes, bytes], Item] = codec.decode_record,  # type: ignore[assignment]
) -> dict[bytes, tuple[bytes, Item]]:
    """Decodes what can be decoded now (each with ``one``), keeping the bytes each record came
    from; failures are left for the final decode to report."""
    decoded: dict[bytes, tuple[bytes, Item]] = {}
    for key, value in survivors.items():
        if value is not None:
            try:
                decoded[key] = (value, one(key, value))
            except codec.CodecError:
                continue
    return decoded


@dataclass
class Survivors:
    """A compacted partition's live records as the runtime replays them: offset commits in
    the coordinator's own form, undecoded, and every other record decoded, each list in log
    order. While loading, replaying an offset commit changes only the group's offsets and
    replaying any other record never touches them, so the two lists replay to the state of
    the one log (``replay`` both into a shard)."""

    records: list[records.Record] = field(default_factory=list)
    offset_commits: list[offsets.EncodedCommit] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records) + len(self.offset_commits)


# The value of an offset commit as the coordinator writes it: version 3, metadata length 0 at
# byte 14 (after version, offset, leader epoch), ``offsets.ENCODED_VALUE_SIZE`` bytes in all.
_ENCODED_VALUE_HEADER = codec.encode_value(records.OffsetCommitValue(0, 0, "", 0))[:2]
_OFFSET_COMMIT_KEY_VERSIONS = (
    codec.encode_key(records.OffsetCommitKey("g", "t", 0))[:2],
    struct.pack(">h", codec.OFFSET_COMMIT_KEY_V0),
)
_KEY_GROUP_LENGTH = struct.Struct(">h")
_NO_METADATA = b"\x00\x00"


class SurvivorDecoder:
    """Decodes one partition's survivors for ``Survivors``. An offset commit key is its
    group's name and then (topic, partition), which repeat across the partition's keys: each
    distinct byte string of either is decoded once, by the codec, and shared after."""

    def __init__(self) -> None:
        self._groups: dict[bytes, str] = {}
        self._partitions: dict[bytes, tuple[str, int]] = {}

    def one(self, key: bytes, value: bytes) -> records.Record | offsets.EncodedCommit:
        if (
            len(value) == offsets.ENCODED_VALUE_SIZE
            and value[:2] == _ENCODED_VALUE_HEADER
            and value[14:16] == _NO_METADATA
            and key[:2] in _OFFSET_COMMIT_KEY_VERSIONS
        ):
            length: int = _KEY_GROUP_LENGTH.unpack_from(key, 2)[0]
            if length >= 0:
                group_bytes, rest = key[4 : 4 + length], key[4 + length :]
                group = self._groups.get(group_bytes)
                partition = self._partitions.get(rest)
                if group is None or partition is None:
                    # The codec decides what a valid key is (and raises for any other).
                    decoded = codec.decode_key(key)
                    assert isinstance(decoded, records.OffsetCommitKey)
                    group = self._groups.setdefault(group_bytes, decoded.group)
                    partition = self._partitions.setdefault(
                        rest, (decoded.topic, decoded.partition)
                    )
                return group, partition, value
        return codec.decode_record(key, value)


def decode_split(
    survivors: Mapping[bytes, bytes | None],
    partition: int = -1,
    decoded_before: Mapping[bytes, tuple[bytes, records.Record | offsets.EncodedCommit]]
    | None = None,
    decoder: SurvivorDecoder | None = None,
) -> Survivors:
    """``decode_survivors`` for ``Survivors``: the same records, offset commits of the
    coordinator's own form left undecoded."""
    one = (decoder or SurvivorDecoder()).one
    split = Survivors()
    for item in _decode_all(survivors, partition, one, decoded_before):
        if isinstance(item, tuple):
            split.offset_commits.append(item)
        else:
            split.records.append(item)
    return split


def _decode_all(
    survivors: Mapping[bytes, bytes | None],
    partition: int,
    one: Callable[[bytes, bytes], Item],
    decoded_before: Mapping[bytes, tuple[bytes, Item]] | None,
) -> list[Item]:
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
            decoded.append(one(key, value))
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


_collector_lock = threading.Lock()
_collector_pauses = 0
_collector_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (see the module's docstring). Pauses
    may overlap, in threads of their own: the collector is back on, if it was on before the
    first, when the last ends. Reference counting frees everything as usual meanwhile."""
    global _collector_pauses, _collector_was_enabled
    with _collector_lock:
        if not _collector_pauses:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_pauses += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_pauses -= 1
            if not _collector_pauses and _collector_was_enabled:
                gc.enable()


def replay_order(log: Iterable[tuple[bytes, bytes | None]]) -> list[records.Record]:
    """The records a load replays for ``log`` (one partition's key/value bytes, in order)."""
    return decode_survivors(compact(log))


@dataclass(frozen=True)
class _Decoding(Generic[D]):
    """How a load decodes a partition's survivors: ``ahead`` what the checkpoint holds while
    the tail is read, then ``final`` the whole, reusing what ``ahead`` decoded."""

    ahead: Callable[[Mapping[bytes, bytes | None]], Mapping[bytes, tuple[bytes, object]]]
    final: Callable[
        [Mapping[bytes, bytes | None], int, Mapping[bytes, tuple[bytes, object]] | None], D
    ]


_RECORDS_DECODING: _Decoding[list[records.Record]] = _Decoding(
    decode_ahead,
    decode_survivors,  # type: ignore[arg-type]  # what ``ahead`` gives back: records
)


def _records_decoding() -> _Decoding[list[records.Record]]:
    return _RECORDS_DECODING


def _split_decoding() -> _Decoding[Survivors]:
    # One decoder per partition and load: its shared names live as long as the load.
    decoder = SurvivorDecoder()
    return _Decoding(
        lambda survivors: decode_ahead(survivors, decoder.one),
        lambda survivors, partition, before: decode_split(
            survivors,
            partition,
            before,  # type: ignore[arg-type]  # what ``ahead`` gave back
            decoder,
        ),
    )


class _HangingTransactions:
    """Tells when a partition's read is held back by a transaction Kafka never completed.

    A ``read_committed`` read stops at the partition's last stable offset: the first offset of
    its oldest open transaction. The load's marker is written after the writer's producer
    completed every transaction of its own, so a read that waits at a last stable offset
    below the marker for ``_HANGING_AFTER_S`` waits on a hanging transaction: one whose
    commit or abort marker never reached the partition (seen on Apache Kafka after a broker
    restart cut a commit short; Kafka's ``kafka-transactions.sh find-hanging`` finds them).
    The read cannot go past it without taking its records for committed or aborted, which
    only the brokers may decide, so the partition stays loading and this says, once and
    then every ``after_s``, what an administrator can do."""

    def __init__(self, topic: str, after_s: float) -> None:
        self._topic = topic
        self._after_s = after_s
        self._check_s = min(_HANGING_CHECK_S, after_s)
        self._next_check = time.monotonic() + self._check_s
        # Per partition: the last stable offset the read waits at, and since when.
        self._waiting: dict[int, tuple[int, float]] = {}
        self._reported: dict[int, float] = {}

    def check(
        self, consumer: Consumer, loading: Collection[int], markers: Mapping[int, int]
    ) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self._check_s
        for partition in loading:
            marker = markers.get(partition)
            if marker is None:
                continue
            where = TopicPartition(self._topic, partition)
            try:
                position = consumer.position([where])[0].offset
                # With read_committed, the high mark is the last stable offset.
                _, stable = consumer.get_watermark_offsets(where, _HANGING_CHECK_S, cached=False)
            except KafkaException:
                continue
            # A position below zero: nothing handed over yet, the read waits where it began.
            if stable > marker or 0 <= position < stable:
                self._waiting.pop(partition, None)  # readable, or still being read
                continue
            waited_at, since = self._waiting.setdefault(partition, (stable, now))
            if waited_at != stable:
                self._waiting[partition] = (stable, now)
                continue
            last = self._reported.get(partition)
            if now - since < self._after_s or (last is not None and now - last < self._after_s):
                continue
            self._reported[partition] = now
            logger.error(
                "state partition %d cannot load: its last stable offset has stayed at %d for "
                "%.0f s, below this load's marker at offset %d. A transaction that began at "
                "offset %d is hanging: the brokers never completed it. The partition's groups "
                "stay unavailable until it is aborted with Kafka's tool: kafka-transactions.sh "
                "--bootstrap-server <brokers> abort --topic %s --partition %d --start-offset %d "
                "(see docs/troubleshooting.md)",
                partition,
                stable,
                now - since,
                marker,
                stable,
                self._topic,
                partition,
                stable,
                extra={"hanging": (self._topic, partition, stable)},
            )


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
        hanging_after_s: float = _HANGING_AFTER_S,
    ) -> None:
        self.topic = topic
        self._hanging_after_s = hanging_after_s
        # Checkpoints are used only when the topic's partition count is known to match.
        self._checkpoint_uri = checkpoint_uri if partition_count is not None else None
        self._admin_config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": bootstrap_servers,
            **kafka_config,
        }
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
        await self._load(partitions, _records_decoding, build, on_loaded)

    async def load_survivors(
        self,
        partitions: Collection[int],
        build: Callable[[int, Survivors], T],
        on_loaded: Callable[[int, T | BaseException], None],
    ) -> None:
        """``load``, with each partition's survivors as ``Survivors`` (the runtime's load)."""
        await self._load(partitions, _split_decoding, build, on_loaded)

    async def _load(
        self,
        partitions: Collection[int],
        decoding: Callable[[], _Decoding[D]],
        build: Callable[[int, D], T],
        on_loaded: Callable[[int, T | BaseException], None],
    ) -> None:
        nonces = {partition: self._writer.marker_nonce("load") for partition in partitions}
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        markers: queue.SimpleQueue[tuple[int, int | None]] = queue.SimpleQueue()

        def finished(partition: int, outcome: T | BaseException) -> None:
            loop.call_soon_threadsafe(on_loaded, partition, outcome)

        # Reading starts while the markers are written: the reader needs only the nonces.
        reading = asyncio.ensure_future(
            asyncio.to_thread(self._read, nonces, markers, decoding, build, finished, stop)
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
        decoding: Callable[[], _Decoding[D]],
        build: Callable[[int, D], T],
        finished: Callable[[int, T | BaseException], None],
        stop: threading.Event,
    ) -> None:
        started = time.monotonic()
        survivors: dict[int, dict[bytes, bytes | None]] = {p: {} for p in nonces}
        # Where each partition's read starts: after what the checkpoint covers, or at 0.
        starts = dict.fromkeys(nonces, 0)
        seeded = dict.fromkeys(nonces, 0)
        decoders = {p: decoding() for p in nonces}
        ahead: dict[int, Mapping[bytes, tuple[bytes, object]]] = {}
        if self._checkpoint_uri is not None:
            found = self._checkpoint(self._checkpoint_uri, list(nonces))
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
            with collector_paused():
                for p in nonces:
                    if seeded[p]:
                        ahead[p] = decoders[p].ahead(survivors[p])
            read = 0
            written: dict[int, int] = {}
            hanging = _HangingTransactions(self.topic, self._hanging_after_s)
            while survivors and not stop.is_set():
                self._check_markers(consumer, markers, survivors, starts, seeded, ahead, written)
                hanging.check(consumer, survivors, written)
                batch = consumer.consume(_CONSUME_BATCH, _CONSUME_WAIT_S)
                read += len(batch)
                # Partitions read again from their start: the rest of this batch is of the
                # read given up.
                restarted: set[int] = set()
                for message in batch:
                    if message.error() is not None:
                        self._log_error(message.error())
                        continue
                    partition = message.partition()
                    log = None if partition is None else survivors.get(partition)
                    if partition is None or log is None:
                        continue  # already loaded: a late message of the last fetch
                    if restarted and partition in restarted:
                        continue  # of the read given up
                    key = message.key()
                    if key != MARKER_KEY:
                        if key is not None:
                            # Re-inserting moves the key to where its newest record sits.
                            log.pop(key, None)
                            log[key] = message.value()
                        continue
                    if not self._is_marker(message.value(), nonces[partition]):
                        continue
                    offset = message.offset()
                    if offset is not None and offset < starts[partition]:
                        # Read before the writer reported its offset: a start past the log's
                        # end sent the consumer back to the earliest offset
                        # (``auto.offset.reset``), on top of the checkpoint's survivors.
                        self._drop_checkpoint(
                            consumer, partition, offset, survivors, starts, seeded, ahead
                        )
                        restarted.add(partition)
                        continue
                    del survivors[partition]
                    consumer.incremental_unassign([TopicPartition(self.topic, partition)])
                    finished(
                        partition,
                        self._build(
                            partition, log, decoders[partition], build, ahead.pop(partition, None)
                        ),
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
        ahead: dict[int, Mapping[bytes, tuple[bytes, object]]],
        written: dict[int, int],
    ) -> None:
        """A marker written before where a partition's read starts means the log is shorter
        than the checkpoint says: that read would never reach the marker, and the checkpoint
        is of another log. Read that partition from the start instead. A partition without a
        marker (``None``: its writer was fenced) is no longer read. Each marker's offset goes
        into ``written``."""
        while True:
            try:
                partition, offset = markers.get_nowait()
            except queue.Empty:
                return
            if offset is not None:
                written[partition] = offset
            if partition in survivors and offset is None:
                del survivors[partition]
                consumer.incremental_unassign([TopicPartition(self.topic, partition)])
                continue
            if partition not in survivors or offset is None or offset >= starts[partition]:
                continue
            self._drop_checkpoint(consumer, partition, offset, survivors, starts, seeded, ahead)

    def _drop_checkpoint(
        self,
        consumer: Consumer,
        partition: int,
        marker: int,
        survivors: dict[int, dict[bytes, bytes | None]],
        starts: dict[int, int],
        seeded: dict[int, int],
        ahead: dict[int, Mapping[bytes, tuple[bytes, object]]],
    ) -> None:
        """Forget the checkpoint's survivors of a partition whose marker sits below where the
        checkpoint said its log goes on (and what was decoded of them ahead), and read that
        partition from its start."""
        logger.warning(
            "state partition %d ends at offset %d, before the %d the checkpoint covers "
            "(the topic was recreated?): loading it from the log alone",
            partition,
            marker,
            starts[partition],
        )
        survivors[partition] = {}
        ahead.pop(partition, None)
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
        decoding: _Decoding[D],
        build: Callable[[int, D], T],
        decoded_before: Mapping[bytes, tuple[bytes, object]] | None = None,
    ) -> T | BaseException:
        try:
            with collector_paused():
                return build(partition, decoding.final(log, partition, decoded_before))
        except Exception as error:
            logger.exception("state partition %d failed to load", partition)
            return error

    def _checkpoint(self, uri: str, wanted: list[int]) -> checkpoints.Checkpoint | None:
        try:
            retention = topic.delete_retention_ms(
                AdminClient(self._admin_config), self.topic, _ADMIN_TIMEOUT_S
            )
        except errors.StateTopicUnavailable as error:
            logger.warning("no compaction checkpoint used: %s; loading the whole log", error)
            return None
        with collector_paused():
            return checkpoints.newest(
                uri,
                self.topic,
                self._partition_count,
                wanted,
                now_ms=self._clock_ms(),
                delete_retention_ms=retention,
            )

    @staticmethod
    def _log_error(error: KafkaError | None) -> None:
        if error is not None:
            logger.warning("reading the state topic: %s", error.str())
