"""The snapshot's and restore's reader keeps a record by its key's first bytes
(``source.read(commits_of=...)``): exactly the rows the transforms would keep of it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafka_group_jobs import columns, decoding
from kafka_group_records import codec, records

# Names that start with one another, a non-ASCII one and the empty one.
GROUPS = ("g", "g2", "gg", "G", "é", "")


def _commit_value(offset: int) -> bytes:
    return codec.encode_value(records.OffsetCommitValue(offset=offset, commit_timestamp=1))


def _key_and_value(
    kind: str, group: str, number: int, tombstone: bool
) -> tuple[bytes, bytes | None]:
    if kind == "commit":
        key = codec.encode_key(records.OffsetCommitKey(group, f"t{number % 3}", number))
        return key, None if tombstone else _commit_value(number)
    if kind == "commit-v0":  # Kafka's older key version, same fields
        key = codec.encode_key(records.OffsetCommitKey(group, "t", number))
        return b"\x00\x00" + key[2:], None if tombstone else _commit_value(number)
    if kind == "unknown":  # a record type of a newer Kafka: passed over by both
        return b"\x00\x63" + codec.encode_key(records.GroupConfigKey(group))[2:], b"\x00\x00"
    if kind == "marker":
        return codec.encode_key(records.LoadMarkerKey()), None
    made = {
        "group-metadata": records.GroupMetadataKey,
        "consumer-group": records.ConsumerGroupMetadataKey,
        "config": records.GroupConfigKey,
        "lifecycle": records.GroupLifecycleKey,
    }[kind](group)
    return codec.encode_key(made), None


KINDS = (
    *("commit", "commit-v0", "group-metadata", "consumer-group"),
    *("config", "lifecycle", "unknown", "marker"),
)
RECORDS = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.sampled_from(GROUPS),
        st.integers(0, 20),
        st.booleans(),
    ),
    max_size=40,
)


@given(RECORDS, st.sampled_from(GROUPS))
def test_the_key_prefixes_keep_the_group_s_commits_and_nothing_else(
    entries: list[tuple[str, str, int, bool]], group: str
) -> None:
    prefixes = codec.offset_commit_key_prefixes(group)
    for offset, (kind, owner, number, tombstone) in enumerate(entries):
        key, value = _key_and_value(kind, owner, number, tombstone)
        row = decoding.decode_row(0, offset, 1, key, value)
        wanted = row[5] == columns.OFFSET_COMMIT and row[6] == group
        assert key.startswith(prefixes) == wanted, (kind, owner, group)
