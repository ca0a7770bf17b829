"""Appends encoded records to the state topic and reports when the brokers hold them.

Each state partition has its own transactional producers, created at the partition's first
write, whose transactional ids are derived from the topic and the partition
(``transactional_id``). This is Kafka's zombie fencing: a new holder's ``init_transactions``
fences every older producer with that id, so once another coordinator has taken a partition
this one can never again commit a write to it. An append is one transaction
(``acks=all``): it completes only when the transaction is committed, which is what lets
the runtime reply "committed", and readers that use ``read_committed`` never see a write
that was not.

A partition has ``LANES`` producers, used in turn, because Kafka makes a transaction wait
while the previous one of its ``transactional.id`` still has its markers written. Lane 0
decides who holds the partition: a start fences lane 0 first, then the other lanes, then
writes its load marker, and a lane that started is used only after lane 0 committed since.
So of two coordinators started at once, the one that fenced lane 0 last holds the partition
even where the other fenced a lane after it: the other's next transaction is on lane 0,
which fails, and it never uses the lane it won; the holder's write on that lane fails
(retriably), and the lane is started again once lane 0 committed. Only lane 0's failures
can fence a writer for good (below); another lane's failure drops that lane alone, and when
that lane was fenced the writer asks lane 0 at once (a check marker in a lane-0
transaction), so that a writer that lost the partition says so at its first failed write.
Every lane of an older holder is fenced before the new holder's load marker (a start that
cannot fence one fails, and the next start fences lane 0 again), so a load reads everything
any lane of an older holder committed; once it holds the partition, a lane that fails to
start again is left out for a while and lane 0 writes alone.

Outcomes of an append:

* committed: the last record's offset is returned;
* fenced (``WriterFenced``): sticky for the partition; its producer is dropped and none is
  ever created again, so this process cannot fence the newer holder back. The brokers'
  "fenced" alone is not proof: a start of this writer's own that timed out and was given
  up may still complete later with a newer epoch. Another coordinator always writes a take
  marker before it fences (below), so the writer reads the log for one first; without it
  the write failed (``WriteFailed``) and the next append starts a new producer. A fatal
  producer error is read the same way: a producer fenced while it adds the partition to its
  transaction fails the next records with a bare "fatal error";
* anything else (``WriteFailed``): the transaction is aborted, and the broker's answer to
  the abort tells whether the partition was fenced meanwhile (a fenced write may first show
  only as a timeout). When even the abort fails, the records may or may not be in the log:
  the producer is dropped, and the next append creates a new one, whose
  ``init_transactions`` settles the old producer's transaction before anything new is
  written.

A new producer would fence whoever holds the partition now, so after such an unknown outcome
the writer first looks whether another coordinator took the partition since this writer's
last committed record: every coordinator's load and fence-check markers carry a nonce naming
its writer (``marker_nonce``), and the writer appends a plain probe marker and reads the log
from the earliest of its lanes' last committed records to the probe (``read_uncommitted``:
its own unsettled transaction must not block the read). A foreign coordinator's marker there
means this writer was fenced. A writer appends a plain "take" marker before and right after
lane 0's ``init_transactions`` (and a load's own marker after the other lanes'), so that a
fencing that cut an older holder's transaction short has its marker ahead of that holder's
probe (the one before unless the holder committed in between, the one after unless the
holder's probe won the time between fencing and marker, milliseconds on a quiet machine and
a second or more on a loaded one: a holder told "fenced" that finds no marker looks again a
write timeout later; a heuristic for processes that were never meant to share a partition,
which leases rule out); probe markers themselves are no evidence (the holder in doubt writes
them).

Markers outside transactions (take, probe, and the load marker of a producer that starts
now: ``append_marker``) go through one plain producer per writer, shared by all partitions.
A load thus costs each partition one ``init_transactions`` per lane and plain produces, no
transaction of its own.

librdkafka's transactional calls block, so each partition's producer runs them on a thread
of its own: partitions commit in parallel, and one partition's appends stay in order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from kafka_group_operator.runtime import errors
from kafka_group_records import codec, records

logger = logging.getLogger(__name__)

EncodedRecord = tuple[bytes, bytes | None]

# A newer producer holds this transactional.id. librdkafka reports it locally as _FENCED,
# brokers as PRODUCER_FENCED or, from older brokers, INVALID_PRODUCER_EPOCH.
# The least time a probe read is given to reach its probe marker (see _read_to_a_probe).
_PROBE_READ_MIN_S = 10.0
_FENCED_CODES = frozenset(
    {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)


# Nonces of markers written by coordinators start so. Markers with other nonces come from the
# jobs of earlier versions, which appended their own; jobs now ask the coordinator (read_fence).
COORDINATOR_NONCE_PREFIX = "coordinator-"
# The purpose word of a probe marker's nonce (``_read_to_a_probe``).
_PROBE = "probe"


# Transactional producers ("lanes") per state partition, used in turn (see
# ``_PartitionProducer._next_lane``). Every coordinator of a state topic must use the same
# number: a new holder fences the lanes it knows of, and a lane it does not know would go on
# writing.
LANES = 2


def transactional_id(topic: str, partition: int, lane: int = 0) -> str:
    """The ``transactional.id`` of lane ``lane`` of the producers writing ``partition`` of
    ``topic``: whoever writes that partition uses these ids, so the newest holder fences every
    older one on every lane. Lane 0, the lane that decides who holds the partition, keeps the
    id of the single producer of earlier versions, which a holder of this version therefore
    fences too."""
    if lane == 0:
        return f"{topic}.{partition}.writer"
    return f"{topic}.{partition}.writer.{lane}"


def transactional_ids(topic: str, partition: int) -> tuple[str, ...]:
    """Every ``transactional.id`` a holder of ``partition`` writes with, lane by lane."""
    return tuple(transactional_id(topic, partition, lane) for lane in range(LANES))


class _MarkerProducer:
    """The one plain producer of a writer: markers appended outside any transaction (take and
    probe markers, and a load marker right after a new producer's fencing), for every
    partition. Plain and not idempotent: a marker written twice is harmless, and an
    idempotent produce costs some brokers an update of shared producer state (tansu keeps
    every idempotent producer it ever saw in one metadata document). Created at the first
    marker and shared, so a start-up that takes every partition opens one connection for
    its markers instead of two producers per partition."""

    def __init__(self, config: Mapping[str, str | int | bool]) -> None:
        self._config = {
            key: value
            for key, value in config.items()
            if key not in ("enable.idempotence", "transaction.timeout.ms")
        }
        self._config["enable.idempotence"] = False
        self._timeout_s = int(config["message.timeout.ms"]) / 1000
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def append(self, topic: str, partition: int, key: bytes, value: bytes | None) -> int:
        """Append one record and wait for the brokers; its offset. Any partition's thread may
        call it: whichever thread polls serves every delivery, each wakes its own caller."""
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self._config)
            producer = self._producer
        done = threading.Event()
        outcome: list[KafkaError | int] = []

        def delivered(error: KafkaError | None, message: Message) -> None:
            outcome.append(error if error is not None else (message.offset() or 0))
            done.set()

        producer.produce(topic, value, key, partition=partition, on_delivery=delivered)
        # message.timeout.ms bounds the delivery report; the margin covers a busy machine.
        deadline = time.monotonic() + self._timeout_s + 5
        while not done.is_set() and time.monotonic() < deadline:
            producer.poll(0.01)
        if not outcome:
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT))
        if isinstance(outcome[0], KafkaError):
            raise KafkaException(outcome[0])
        return outcome[0]

    def close(self, timeout_s: float) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(timeout_s)


class _PartitionProducer:
    """One partition's transactional producers (its lanes) and the thread their blocking calls
    run on."""

    def __init__(
        self,
        config: Mapping[str, str | int | bool],
        reader_config: Mapping[str, str | int | bool],
        topic: str,
        partition: int,
        nonce_prefix: str,
        markers: _MarkerProducer,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self._nonce_prefix = nonce_prefix
        self._markers = markers
        self._reader_config = dict(reader_config)
        self._configs = [
            {**config, "transactional.id": transactional_id(topic, partition, lane)}
            for lane in range(LANES)
        ]
        self._timeout_s = int(config["message.timeout.ms"]) / 1000
        self._thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"state-writer-{partition}"
        )
        # Lane 0's producer: whoever fenced lane 0 last holds the partition.
        self._producer: Producer | None = None
        # A producer of lane 0 whose init_transactions timed out: the next start resumes it.
        self._starting: Producer | None = None
        # The other lanes' producers that run, and those whose init_transactions timed out.
        self._followers: dict[int, Producer] = {}
        self._starting_followers: dict[int, Producer] = {}
        # Lanes started since lane 0 last committed: not used until it commits again.
        self._unverified: set[int] = set()
        # A lane that failed is started again only after lane 0 committed since (so a writer
        # that lost the partition does not fence the new holder's lane first), and not
        # before this time after a start of it failed.
        self._followers_may_start = False
        self._followers_retry_at = 0.0
        # The lane of the last transaction.
        self._last_lane = 0
        # Offset of the last record this writer committed to the partition (-1: none yet).
        self._last_committed = -1
        # Per lane, the offset of its last committed record, or of the take marker before
        # this writer's latest start if later: a probe reads from the earliest of them (see
        # ``_read_to_a_probe``).
        self._committed_on = [-1] * LANES
        # A transaction of this writer ended with an unknown outcome: look before re-fencing.
        self._in_doubt = False
        # Dropped producers whose last transaction may still be ending, and until when (_drop).
        self._retired: list[tuple[float, Producer]] = []
        # Where the probe reads have got to without finding another coordinator's marker.
        self._probed_to = 0
        # Set in this thread once fenced: appends already queued behind the one that found
        # out must not start a new producer (which would fence the new holder back).
        self.fenced = False

    async def call(self, function: object, *args: object) -> int:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, function, *args)  # type: ignore[arg-type]

    def mark(self, marker: EncodedRecord) -> int:
        """In the partition's thread: append a marker (a record never replayed) that lands
        after this writer holds the partition; its offset. A writer that starts its producer
        now writes it plainly right after the fencing, as the second take marker (its
        ``init_transactions`` just settled every older holder's transaction, so the marker
        follows everything they committed); one whose producer runs already commits it in a
        transaction, which fails if another coordinator fenced it since."""
        if self._producer is None and not self.fenced:
            return self._start_producer(marker)
        return self.transact([marker], on_lane_0=True)

    def _start_producer(self, marker: EncodedRecord | None = None) -> int:
        """New transactional producers, lane 0 first, that fenced every older holder; the
        offset of the marker written after the fencing (``marker``, or a take marker)."""
        try:
            if self._in_doubt and self._last_committed >= 0:
                self._look_for_a_new_holder()
            self._in_doubt = False
            # Said before it fences: an older holder whose write the fencing cut short
            # probes the log after it, and so finds this marker (see the module docstring).
            before = self._append_plain_marker("take")
            # A start that timed out resumes with the same producer (librdkafka's advice):
            # a new one would ask the brokers for a new epoch again, and an overloaded
            # broker might never get through.
            self._starting = self._starting or Producer(self._configs[0])
            self._starting.init_transactions(self._timeout_s)
        except KafkaException as error:
            failure: KafkaError = error.args[0]
            if failure.fatal() or not failure.retriable():
                self._starting = None
            raise errors.WriteFailed(
                f"cannot start the state producer: {failure.str()}", failure.name()
            ) from error
        self._producer, self._starting = self._starting, None
        self._last_lane = 0
        # Anything another coordinator took the partition with follows the first take
        # marker: until every lane has committed, a probe reads from there.
        self._committed_on = [before] * LANES
        # And once more after: the older holder may have committed between the first
        # marker and the fencing, and its probe reads only from its lanes' last commits on.
        after = self._append_plain_marker("take")
        # The other lanes are fenced after lane 0, so a start that lost lane 0 to another
        # can never have fenced that one's other lanes after it verified them (see
        # ``transact``); what is written after this follows every older holder's commit on
        # any lane.
        not_started = self._start_followers()
        if not_started:
            # An older holder's lane left unfenced could still commit after this start's
            # marker: acknowledged there, yet not read by this load. The start fails; the
            # next one fences lane 0 again and resumes the lane's start.
            lane, failure = min(not_started.items())
            self._drop(resume_starts=True)
            raise errors.WriteFailed(
                f"cannot start the state producer: lane {lane} did not start ({failure.str()})",
                failure.name(),
            )
        if marker is None:
            return after
        try:
            return self._markers.append(self.topic, self.partition, *marker)
        except KafkaException as error:
            raise errors.WriteFailed(
                f"cannot write a marker: {error.args[0].str()}", "COORDINATOR_NOT_AVAILABLE"
            ) from error

    def _start_followers(self) -> dict[int, KafkaError]:
        """Start (fence) every lane but lane 0 that does not run; each is unverified until
        lane 0 commits. A lane that cannot start now is left out for a while (lane 0 alone
        carries the writes meanwhile), and returned with its failure."""
        self._followers_may_start = False
        not_started: dict[int, KafkaError] = {}
        for lane in range(1, LANES):
            if lane in self._followers:
                continue
            producer = self._starting_followers.pop(lane, None) or Producer(self._configs[lane])
            try:
                producer.init_transactions(self._timeout_s)
            except KafkaException as error:
                failure: KafkaError = error.args[0]
                if not failure.fatal() and failure.retriable():
                    self._starting_followers[lane] = producer
                self._followers_retry_at = time.monotonic() + self._timeout_s
                not_started[lane] = failure
                logger.info(
                    "state partition %d: lane %d did not start (%s)",
                    self.partition,
                    lane,
                    failure.str(),
                )
                continue
            self._followers[lane] = producer
            self._unverified.add(lane)
        return not_started

    def _next_lane(self, on_lane_0: bool) -> int:
        """The lane of the next transaction. Lanes in turn: the brokers answer a transaction's
        first AddPartitionsToTxn with CONCURRENT_TRANSACTIONS while the previous transaction
        of the same transactional.id still has its markers written, and librdkafka then waits
        20 ms before it asks again; the other lane's last transaction ended a whole
        transaction earlier. Lane 0 whenever another lane started since lane 0 last
        committed: only lane 0 says who holds the partition, and a writer that lost it may
        still hold another lane (two coordinators that start at once each fence the other
        lanes in turn); once lane 0 commits after a lane's start, that start came after every
        other holder's fencing of the lane."""
        if (
            self._followers_may_start
            and len(self._followers) < LANES - 1
            and time.monotonic() >= self._followers_retry_at
        ):
            self._start_followers()
        lane = (self._last_lane + 1) % LANES
        if on_lane_0 or self._unverified or (lane != 0 and lane not in self._followers):
            lane = 0
        self._last_lane = lane
        return lane

    def transact(self, batch: Sequence[EncodedRecord], on_lane_0: bool = False) -> int:
        """In the partition's thread: one transaction holding ``batch``; its last offset."""
        if self.fenced:
            raise self._fenced(KafkaError(KafkaError._FENCED))
        if self._retired:
            self._end_retired(time.monotonic())
        if self._producer is None:
            self._start_producer()
        lane = self._next_lane(on_lane_0)
        # Every raise below deletes this name first: the failure's traceback holds this
        # frame, and must not keep a dropped producer (its threads, its connections) alive
        # for as long as someone holds the failure, or until the next full collection.
        producer = self._lane_producer(lane)
        last_offset = -1
        failures: list[KafkaError] = []

        def delivered(error: KafkaError | None, message: Message) -> None:
            nonlocal last_offset
            if error is not None:
                failures.append(error)
                return
            offset = message.offset()
            if offset is not None and offset > last_offset:
                last_offset = offset

        try:
            producer.begin_transaction()
            for key, value in batch:
                while True:
                    try:
                        producer.produce(
                            self.topic, value, key, partition=self.partition, on_delivery=delivered
                        )
                        break
                    except BufferError:
                        # The local queue is full: let deliveries drain it, then go on.
                        producer.poll(0.001)
        except KafkaException as error:
            settled = self._settle(error.args[0], lane)
            del producer
            raise settled from error
        except Exception as error:
            # A record that could not even be queued: nothing of this transaction may land.
            self._drop()
            del producer
            raise errors.WriteFailed(
                f"cannot queue state records: {error}", "INVALID_RECORD"
            ) from error
        # A commit that timed out may be called again for its final outcome (librdkafka);
        # once more is enough, as every record times out within message.timeout.ms.
        for attempt in range(2):
            try:
                producer.commit_transaction(self._timeout_s)
                break
            except KafkaException as error:
                kafka_error: KafkaError = error.args[0]
                if attempt == 0 and kafka_error.retriable() and not kafka_error.fatal():
                    continue
                settled = self._settle(kafka_error, lane)
                del producer
                raise settled from error
        if failures:  # committed, yet a delivery failed: cannot happen; trust nothing
            self._drop()
            del producer
            raise errors.WriteFailed(f"state topic write failed: {failures[0].str()}", "UNKNOWN")
        self._last_committed = max(self._last_committed, last_offset)
        self._committed_on[lane] = max(self._committed_on[lane], last_offset)
        if lane == 0:
            self._unverified.clear()
            self._followers_may_start = True
        return last_offset

    def _look_for_a_new_holder(self) -> None:
        """Raise ``WriterFenced`` if another coordinator wrote a marker to the partition after
        this writer's last committed record (see the module's docstring)."""
        try:
            self._read_to_a_probe()
        except (KafkaException, BufferError, codec.CodecError) as error:
            raise errors.WriteFailed(
                f"cannot check who holds state partition {self.partition}: {error}",
                "COORDINATOR_NOT_AVAILABLE",
            ) from error

    def _read_to_a_probe(self) -> None:
        # A new consumer's connection and first fetches take seconds on a busy machine: a
        # deadline of a short write timeout alone would never let it reach the probe.
        deadline = time.monotonic() + max(2 * self._timeout_s, _PROBE_READ_MIN_S)
        key = codec.encode_record(
            records.Record(records.LoadMarkerKey(), records.LoadMarkerValue("", 0))
        )[0]
        end = self._append_plain_marker(_PROBE)
        consumer = Consumer(
            {
                **self._reader_config,
                "group.id": f"{self.topic}.probe",
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
            }
        )
        try:
            # What an earlier probe read already holds no foreign marker: each retry (each
            # appending a probe of its own) goes on from there, so a slow read still ends.
            # From the earliest of the lanes' last commits: a new holder fences the other
            # lanes after lane 0 and its take markers, so one of them may have committed
            # after those markers while lane 0's last commit was before them.
            start = max(min(self._committed_on) + 1, self._probed_to, 0)
            consumer.assign([TopicPartition(self.topic, self.partition, start)])
            partition = [TopicPartition(self.topic, self.partition)]
            while time.monotonic() < deadline:
                for message in consumer.consume(1000, 0.2):
                    if message.error() is not None or message.key() != key:
                        continue
                    marker = message.value()
                    found = codec.decode_value(records.LoadMarkerKey(), marker) if marker else None
                    # A probe says nothing of who holds the partition: an old holder in
                    # doubt writes one too.
                    if (
                        isinstance(found, records.LoadMarkerValue)
                        and found.nonce.startswith(COORDINATOR_NONCE_PREFIX)
                        and not found.nonce.startswith(self._nonce_prefix)
                        and f"-{_PROBE}-" not in found.nonce
                    ):
                        raise self._fenced(KafkaError(KafkaError._FENCED))
                # Everything before the probe is read once the position reaches it: the probe
                # itself is this writer's own and need not be read.
                position = consumer.position(partition)[0].offset
                self._probed_to = max(self._probed_to, position)
                if position >= end:
                    return
        finally:
            consumer.close()
        raise errors.WriteFailed(
            "cannot read the partition to the probe", "COORDINATOR_NOT_AVAILABLE"
        )

    def _marker(self, purpose: str) -> EncodedRecord:
        """A load marker naming this writer (a record never replayed)."""
        nonce = f"{self._nonce_prefix}{purpose}-{uuid.uuid4().hex}"
        return codec.encode_record(
            records.Record(records.LoadMarkerKey(), records.LoadMarkerValue(nonce, 0))
        )

    def _append_plain_marker(self, purpose: str) -> int:
        """A load marker naming this writer, appended outside any transaction; its offset."""
        key, value = self._marker(purpose)
        try:
            return self._markers.append(self.topic, self.partition, key, value)
        except KafkaException as error:
            raise errors.WriteFailed(
                f"cannot write a {purpose} marker: {error.args[0].str()}",
                "COORDINATOR_NOT_AVAILABLE",
            ) from error

    def _settle(self, error: KafkaError, lane: int) -> errors.StateTopicError:
        """The error to raise for a transaction on ``lane`` that failed with ``error``. Unless
        the producer is fenced or broken, abort the transaction: the broker then tells
        whether another producer took over (the failure may only have been a timeout so
        far)."""
        if error.code() not in _FENCED_CODES and not error.fatal():
            try:
                # No name for the producer in this frame: the failure returned may carry a
                # traceback through it (the lane-0 check below), and must not keep a dropped
                # producer (its threads, its connections) alive.
                self._lane_producer(lane).abort_transaction(self._timeout_s)
            except KafkaException as abort_error:
                error = abort_error.args[0]
            else:
                return errors.WriteFailed(
                    f"state topic write failed (aborted): {error.str()}", error.name()
                )
        if lane != 0:
            # Another lane says nothing of who holds the partition (a coordinator that lost
            # lane 0 in a start may have fenced it after this one): it is started again once
            # lane 0 committed since, and only lane 0 can fence the writer for good.
            fenced = error.code() in _FENCED_CODES or error.fatal()
            self._drop_follower(lane, in_doubt=not fenced)
            failed = errors.WriteFailed(
                f"state topic write failed on lane {lane}: {error.str()}", error.name()
            )
            if not fenced:
                return failed
            # Had another coordinator taken the partition, lane 0 fails too: ask it now, so
            # that a writer that lost the partition says so at its first failed write.
            try:
                self.transact([self._marker("check")], on_lane_0=True)
            except errors.WriterFenced as lost:
                return lost
            except errors.WriteFailed as unknown:
                return errors.WriteFailed(f"{failed}; {unknown}", error.name())
            return failed
        # Whatever went wrong, this producer is not trusted again. A fenced one is never
        # replaced; any other is, and the new one's init_transactions settles what this
        # one left open (committed or aborted) before anything new is written.
        if error.code() in _FENCED_CODES or error.fatal():
            self._drop()
            # A fatal error may be a fence in disguise: a producer fenced while it adds the
            # partition to its transaction fails the next produce with a bare "fatal error"
            # (librdkafka). Look for a new holder before anything is started again.
            return self._fenced_by_whom(error)
        self._drop(in_doubt=True)
        return errors.WriteFailed(f"state topic write failed: {error.str()}", error.name())

    def _fenced_by_whom(self, error: KafkaError) -> errors.StateTopicError:
        """``WriterFenced`` if another coordinator's take marker follows this writer's last
        commit; otherwise the producer failed for good on its own, or one of this writer's own
        abandoned producers fenced it (see the module docstring), and the write merely
        failed."""
        try:
            self._look_for_a_new_holder()
            if error.code() in _FENCED_CODES:
                # Fenced, and no other coordinator's marker yet. A new holder writes its second
                # take marker as soon as its fencing returns, but the brokers fail this
                # writer's transaction at once (Kafka does), and on a loaded machine the probe
                # can win by a second or more. A new producer would fence that holder back, so
                # look once more, a write timeout later, before blaming a producer of this
                # writer's own.
                time.sleep(self._timeout_s)
                self._look_for_a_new_holder()
        except errors.WriterFenced as fenced:
            return fenced
        except errors.WriteFailed as unknown:
            self._in_doubt = True
            return errors.WriteFailed(
                f"state topic write failed: {error.str()}; {unknown}", error.name()
            )
        self._in_doubt = False
        if error.code() not in _FENCED_CODES:
            logger.warning(
                "state partition %d: the producer failed for good (%s); no other coordinator "
                "took the partition, so a new producer is started",
                self.partition,
                error.str(),
            )
            return errors.WriteFailed(f"state topic write failed: {error.str()}", error.name())
        logger.warning(
            "state partition %d: a producer of this coordinator's own fenced the current one "
            "(%s); no other coordinator took the partition, so a new producer is started",
            self.partition,
            error.str(),
        )
        return errors.WriteFailed(
            f"state topic write failed: fenced by an earlier producer of this coordinator "
            f"({error.str()})",
            error.name(),
        )

    def _lane_producer(self, lane: int) -> Producer:
        producer = self._producer if lane == 0 else self._followers[lane]
        assert producer is not None
        return producer

    def _fenced(self, error: KafkaError) -> errors.WriterFenced:
        self.fenced = True
        return errors.WriterFenced(
            self.partition,
            f"state partition {self.partition}: another coordinator's producer took "
            f"{transactional_id(self.topic, self.partition)!r} ({error.str()})",
        )

    def _drop_follower(self, lane: int, in_doubt: bool) -> None:
        """Drop another lane's producer, retired as ``_drop`` retires one in doubt."""
        producer = self._followers.pop(lane, None)
        self._unverified.discard(lane)
        self._followers_may_start = False
        if producer is not None:
            with contextlib.suppress(KafkaException):
                producer.purge()
                producer.flush(0)
            if in_doubt:
                self._retired.append((time.monotonic() + 2 * self._timeout_s, producer))

    def _drop(self, in_doubt: bool = False, resume_starts: bool = False) -> None:
        """Drop the producer; it ends now, unless its last transaction's outcome is unknown
        (``in_doubt``): then the writer looks for a new holder before it fences again, and
        the producer is retired for twice the write timeout first: the end of that
        transaction (a commit that timed out goes on inside librdkafka) may still be on its
        way to the brokers, and ended there the transaction stops holding back
        ``read_committed`` readers at once rather than when the brokers time it out. Other
        lanes' starts that timed out are kept for the next start to resume when
        ``resume_starts`` (a start that failed for want of them)."""
        if in_doubt:
            self._in_doubt = True
        # The other lanes go too: the next start fences them again after lane 0.
        for lane in list(self._followers):
            self._drop_follower(lane, in_doubt=False)
        if not resume_starts:
            self._starting_followers.clear()
        producer, self._producer = self._producer, None
        now = time.monotonic()
        self._end_retired(now)
        if producer is not None:
            # Fail whatever the producer still holds; librdkafka destroys it with the object.
            # A producer in a fatal state (fenced) may raise here too: that must not cut
            # short the caller's verdict, or a fenced writer would go on as merely failed
            # and start a producer that fences the new holder back.
            with contextlib.suppress(KafkaException):
                producer.purge()
                producer.flush(0)
            if in_doubt:
                self._retired.append((now + 2 * self._timeout_s, producer))

    def _end_retired(self, now: float) -> None:
        self._retired = [(until, kept) for until, kept in self._retired if until > now]

    def close(self, timeout_s: float) -> None:
        """In the partition's thread: abort an unfinished transaction, drop the producers."""
        self._retired.clear()
        self._starting_followers.clear()
        producers = [self._producer, *self._followers.values()]
        self._producer, self._followers = None, {}
        for producer in producers:
            if producer is None:
                continue
            try:
                producer.abort_transaction(timeout_s)
            except KafkaException as error:
                # Not in a transaction, or the brokers are away: the next holder's
                # init_transactions aborts whatever is left open.
                logger.debug("state producer of partition %d: %s", self.partition, error)

    def shutdown(self, timeout_s: float) -> None:
        try:
            self._thread.submit(self.close, timeout_s).result(timeout_s + 1)
        except (concurrent.futures.TimeoutError, RuntimeError):
            logger.warning("state producer of partition %d did not stop in time", self.partition)
        self._thread.shutdown(wait=False)


class StateWriter:
    """The state topic's only writer: one transactional producer per partition written."""

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
            # Concurrent requests are already batched by the per-partition queues, and a
            # commit sends what it holds at once: waiting would only add latency, and every
            # idle producer's threads would wake at that interval.
            "linger.ms": 0,
            "socket.nagle.disable": True,
            # Kafka's offsets.commit.timeout.ms: how long a write may wait for the brokers.
            "message.timeout.ms": timeout_ms,
            # librdkafka requires it to be at least message.timeout.ms; the broker aborts a
            # transaction its producer left open (a crash) after this long.
            "transaction.timeout.ms": max(timeout_ms, 1_000),
            # Find a restarted broker within a second rather than librdkafka's default 10.
            "reconnect.backoff.max.ms": 1000,
            **kafka_config,
        }
        self._reader_config: dict[str, str | int | bool] = {
            "bootstrap.servers": bootstrap_servers,
            **kafka_config,
        }
        self._producers: dict[int, _PartitionProducer] = {}
        self._markers = _MarkerProducer(self._config)
        self._fenced: set[int] = set()
        self._nonce_prefix = f"{COORDINATOR_NONCE_PREFIX}{uuid.uuid4().hex[:16]}-"
        self._running = False
        self._lock = threading.Lock()

    def start(self) -> None:
        self._running = True

    def fenced(self, partition: int) -> bool:
        return partition in self._fenced

    def marker_nonce(self, purpose: str) -> str:
        """A nonce for a marker this writer appends: unique, and naming this writer."""
        return f"{self._nonce_prefix}{purpose}-{uuid.uuid4().hex}"

    async def append(self, partition: int, batch: Sequence[EncodedRecord]) -> int:
        """Produce ``batch`` to ``partition`` in one transaction; once it is committed, return
        the offset of the last record (-1 for an empty batch). Raises ``WriterFenced`` when
        another coordinator holds the partition, ``WriteFailed`` when the outcome is unknown."""
        if not batch:
            self._check(partition)
            return -1
        return await self._call(partition, "transact", batch)

    async def append_marker(self, partition: int, marker: EncodedRecord) -> int:
        """Append a marker record (never replayed: a load, read-fence or fence-check marker)
        that lands after everything any coordinator committed to ``partition`` before this
        writer held it; its offset. Fails as ``append`` does. Cheaper than ``append`` when
        the partition's producer starts now (a load): the marker is then written plainly
        right after the producer's fencing, not in a transaction of its own."""
        return await self._call(partition, "mark", marker)

    def _check(self, partition: int) -> None:
        if not self._running:
            raise errors.WriteFailed("the state writer is stopped", "COORDINATOR_NOT_AVAILABLE")
        if partition in self._fenced:
            raise errors.WriterFenced(partition, f"state partition {partition} was fenced")

    async def _call(self, partition: int, method: str, argument: object) -> int:
        self._check(partition)
        with self._lock:
            producer = self._producers.get(partition)
            if producer is None:
                producer = _PartitionProducer(
                    self._config,
                    self._reader_config,
                    self.topic,
                    partition,
                    self._nonce_prefix,
                    self._markers,
                )
                self._producers[partition] = producer
        try:
            return await producer.call(getattr(producer, method), argument)
        except RuntimeError as error:  # the writer stopped meanwhile
            raise errors.WriteFailed(
                f"the state writer is stopped: {error}", "COORDINATOR_NOT_AVAILABLE"
            ) from error
        except errors.WriterFenced:
            self._fenced.add(partition)
            raise

    def stop(self, timeout_s: float = 5.0) -> None:
        self._running = False
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        # In parallel: each close may wait for the brokers.
        threads = [
            threading.Thread(target=producer.shutdown, args=(timeout_s,), daemon=True)
            for producer in producers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout_s + 2)
        self._markers.close(timeout_s)
