"""The runtime's load form: offset commits replayed from their bytes (``loader.Survivors``)
give exactly the state, timers and answers of every record decoded and replayed, and the
garbage collector's pause around loads is undone whatever overlaps it."""

from __future__ import annotations

import gc
import random
import threading
import tracemalloc
import weakref

import pytest

from kafka_group_operator.coordinator import messages, shard
from kafka_group_operator.runtime import errors, loader
from kafka_group_records import codec, records
from tests.coordinator import harness

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000


def _commit(
    group: str, topic: str, partition: int, value: records.OffsetCommitValue | None
) -> records.Record:
    return records.Record(records.OffsetCommitKey(group, topic, partition), value)


def _value(rng: random.Random, offset: int) -> records.OffsetCommitValue:
    """Mostly the coordinator's own form (kept as bytes), some with metadata or an explicit
    expiry (decoded), with commit times spread over retention's reach."""
    stamp = NOW_MS - rng.randrange(0, 10 * DAY_MS)
    shape = rng.random()
    if shape < 0.1:
        return records.OffsetCommitValue(offset, 2, "checkpoint-metadata", stamp)
    if shape < 0.2:
        return records.OffsetCommitValue(offset, -1, "", stamp, stamp + rng.randrange(DAY_MS))
    return records.OffsetCommitValue(offset, rng.randrange(5), "", stamp)


def _log(seed: int) -> list[tuple[bytes, bytes | None]]:
    """A state partition's log: a group with members (subscribed to one topic, with offsets
    of it and of another one), member-less groups' offsets rewritten and deleted."""
    rng = random.Random(seed)
    group = harness.Harness(now_ms=NOW_MS)
    group.topics({harness.TOPIC: 4, "other": 2})
    group.configure()
    response = group.heartbeat("m-1", messages.JOIN_EPOCH).response
    group.heartbeat("m-1", response.member_epoch, owned=response.assignment or {})
    log = list(group.log)
    log += [
        _commit(harness.GROUP, topic, p, _value(rng, p))
        for topic in (harness.TOPIC, "other")
        for p in range(2)
    ]
    keys = [(f"group-{g}", f"topic-{t}", p) for g in range(20) for t in range(3) for p in range(4)]
    for step in range(3_000):
        group_id, topic, partition = rng.choice(keys)
        value = None if rng.random() < 0.05 else _value(rng, step)
        log.append(_commit(group_id, topic, partition, value))
    encoded = [codec.encode_record(record) for record in log]
    # Key version 0 (older Kafka) has the same layout: kept as bytes too.
    version_0 = codec.encode_key(records.OffsetCommitKey("group-v0", "topic-0", 0))
    encoded.append((b"\x00\x00" + version_0[2:], codec.encode_value(_value(rng, 1))))
    return encoded


def _loaded_as_records(log: list[tuple[bytes, bytes | None]]) -> shard.CoordinatorShard:
    fresh = shard.CoordinatorShard()
    for record in loader.decode_survivors(loader.compact(log)):
        fresh.replay(record)
    fresh.on_loaded(NOW_MS)
    return fresh


def _loaded_split(
    log: list[tuple[bytes, bytes | None]], ahead: bool = False
) -> shard.CoordinatorShard:
    survivors = loader.compact(log)
    decoder = loader.SurvivorDecoder()
    before = loader.decode_ahead(dict(list(survivors.items())[::2]), decoder.one) if ahead else None
    split = loader.decode_split(survivors, 0, before, decoder)
    fresh = shard.CoordinatorShard()
    for record in split.records:
        fresh.replay(record)
    fresh.replay_encoded_offset_commits(split.offset_commits)
    fresh.on_loaded(NOW_MS)
    return fresh


def _fetch_all(coordinator: shard.CoordinatorShard) -> dict[str, object]:
    return {
        group_id: coordinator.fetch_offsets(messages.OffsetFetchRequest(group_id))
        for group_id in coordinator.list_groups()
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("ahead", [False, True])
def test_offsets_replayed_from_their_bytes_load_the_same_state(seed: int, ahead: bool) -> None:
    log = _log(seed)
    expected, split = _loaded_as_records(log), _loaded_split(log, ahead)

    # Timers first: arming retention must not need the offsets decoded.
    assert split.armed_timers() == expected.armed_timers()
    assert split.next_deadline_ms() == expected.next_deadline_ms()
    assert split.canonical_state() == expected.canonical_state()
    assert _fetch_all(split) == _fetch_all(expected)


def test_live_writes_over_offsets_kept_as_bytes_match_decoded_ones() -> None:
    log = _log(4)
    expected, split = _loaded_as_records(log), _loaded_split(log)
    later = [
        # Over a value kept as bytes: a commit, one with an explicit expiry, a deletion.
        _commit("group-1", "topic-0", 0, records.OffsetCommitValue(9, 1, "", NOW_MS)),
        _commit("group-2", "topic-1", 1, records.OffsetCommitValue(9, -1, "", NOW_MS, NOW_MS + 5)),
        _commit("group-3", "topic-2", 2, None),
        _commit("group-4", "topic-0", 3, records.OffsetCommitValue(9, 1, "m", NOW_MS)),
    ]
    for record in later:
        expected.replay(record)
        split.replay(record)
    encoded = [
        ("group-5", ("topic-1", 0), codec.encode_value(records.OffsetCommitValue(7, 0, "", NOW_MS)))
    ]
    expected.replay(_commit("group-5", "topic-1", 0, records.OffsetCommitValue(7, 0, "", NOW_MS)))
    split.replay_encoded_offset_commits(encoded)

    assert split.armed_timers() == expected.armed_timers()
    assert split.canonical_state() == expected.canonical_state()
    # Expiry reads the offsets too: the same tombstones, a day of retention at a time.
    for day in range(1, 12):
        assert (
            split.on_timer(NOW_MS + day * DAY_MS).records
            == expected.on_timer(NOW_MS + day * DAY_MS).records
        )


def test_only_the_coordinators_own_form_is_kept_as_bytes() -> None:
    def split(value: records.OffsetCommitValue) -> loader.Survivors:
        key, data = codec.encode_record(_commit("g", "t", 0, value))
        assert data is not None
        return loader.decode_split({key: data})

    own = split(records.OffsetCommitValue(5, 1, "", NOW_MS))
    assert own.records == []
    assert own.offset_commits == [
        ("g", ("t", 0), codec.encode_value(records.OffsetCommitValue(5, 1, "", NOW_MS)))
    ]
    for other in (
        records.OffsetCommitValue(5, 1, "metadata", NOW_MS),
        records.OffsetCommitValue(5, -1, "", NOW_MS, NOW_MS + 1),
    ):
        assert split(other).records == [_commit("g", "t", 0, other)]
        assert split(other).offset_commits == []


def test_keys_share_their_names_between_offsets() -> None:
    value = codec.encode_value(records.OffsetCommitValue(5, 1, "", NOW_MS))
    survivors = {
        codec.encode_key(records.OffsetCommitKey(f"g-{g}", "t", p)): value
        for g in range(3)
        for p in range(2)
    }
    commits = loader.decode_split(survivors).offset_commits
    assert [(g, tp) for g, tp, _ in commits] == [
        (f"g-{g}", ("t", p)) for g in range(3) for p in range(2)
    ]
    assert commits[0][1] is commits[2][1] is commits[4][1]
    assert commits[0][0] is commits[1][0]


@pytest.mark.parametrize(
    "key",
    [
        b"\x00\x01\x00\x09g",  # truncated
        b"\x00\x01\x00\x01\xff\x00\x01t\x00\x00\x00\x00",  # a group name that is not UTF-8
        b"\x00\x01\x00\x01g\x00\x05t\x00\x00",  # a topic longer than the key
    ],
)
def test_an_undecodable_key_fails_the_load_in_either_form(key: bytes) -> None:
    value = codec.encode_value(records.OffsetCommitValue(5, 1, "", NOW_MS))
    valid = codec.encode_key(records.OffsetCommitKey("g", "t", 0))
    # Its names already known from a valid key must not let it through.
    survivors = {valid: value, key: value}
    with pytest.raises(errors.LoadFailed):
        loader.decode_split(survivors, 3)
    with pytest.raises(errors.LoadFailed):
        loader.decode_survivors(survivors, 3)


def test_the_collector_pause_ends_with_the_last_of_overlapping_loads() -> None:
    assert gc.isenabled()
    started, finish = threading.Event(), threading.Event()

    def other_load() -> None:
        with loader.collector_paused():
            started.set()
            finish.wait(10)

    thread = threading.Thread(target=other_load)
    with loader.collector_paused():
        thread.start()
        assert started.wait(10)
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other load still runs
    finish.set()
    thread.join(10)
    assert gc.isenabled()

    gc.disable()
    try:
        with loader.collector_paused():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_repeated_loads_and_releases_do_not_grow_memory() -> None:
    """A partition taken and given up again and again: each shard is freed by reference
    counting alone when given up (no cycle waits for the collector), and memory stays flat."""
    log = [
        codec.encode_record(
            _commit(f"group-{g}", "topic", p, records.OffsetCommitValue(p, 0, "", NOW_MS))
        )
        for g in range(100)
        for p in range(50)
    ]

    def load_and_release() -> None:
        with loader.collector_paused():
            loaded = _loaded_split(log)
        loaded.fetch_offsets(messages.OffsetFetchRequest("group-1"))
        freed = weakref.ref(loaded)
        del loaded
        assert freed() is None

    gc.collect()
    tracemalloc.start()
    try:
        gc.disable()  # nothing may rely on the collector
        load_and_release()
        baseline = tracemalloc.get_traced_memory()[0]
        for _ in range(10):
            load_and_release()
        grown = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        gc.enable()
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes more after 10 loads"
