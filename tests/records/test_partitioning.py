"""``partition_for`` must place groups exactly where Kafka's ``partitionFor`` does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_group_records import partitioning


@pytest.mark.parametrize(
    ("group_id", "hash_code", "partition"),
    [
        # hashCode is Integer.MIN_VALUE: Math.abs would give a negative remainder (-48).
        ("polygenelubricants", -2147483648, 0),
        ("my-group", -1906497762, 12),
        ("payments-consumer", -242238826, 26),
        ("", 0, 0),
        ("é", 233, 33),
        ("a", 97, 47),
        # A character outside the BMP hashes as its two UTF-16 surrogates (0xD83D, 0xDE00).
        ("😀", 0xD83D * 31 + 0xDE00, (0xD83D * 31 + 0xDE00) % 50),
    ],
)
def test_kafka_vectors(group_id: str, hash_code: int, partition: int) -> None:
    assert partitioning.java_string_hash(group_id) == hash_code
    assert partitioning.partition_for(group_id, 50) == partition


def test_utils_abs_maps_min_value_to_zero() -> None:
    assert partitioning.kafka_abs(-(2**31)) == 0
    assert partitioning.kafka_abs(-5) == 5
    assert partitioning.kafka_abs(2**31 - 1) == 2**31 - 1


def _reference_hash(text: str) -> int:
    """Java's definition, written the slow way: s[0]*31^(n-1) + ... + s[n-1], wrapped."""
    encoded = text.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(encoded[i : i + 2], "big") for i in range(0, len(encoded), 2)]
    total: int = sum(unit * 31 ** (len(units) - 1 - i) for i, unit in enumerate(units))
    wrapped = total % 2**32
    return wrapped - 2**32 if wrapped >= 2**31 else wrapped


@given(st.text(max_size=40), st.integers(min_value=1, max_value=500))
def test_partition_is_in_range_and_matches_the_definition(text: str, partitions: int) -> None:
    assert partitioning.java_string_hash(text) == _reference_hash(text)
    partition = partitioning.partition_for(text, partitions)
    assert 0 <= partition < partitions


def test_zero_partitions_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partitioning.partition_for("g", 0)
