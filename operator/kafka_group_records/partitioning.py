"""Which state-topic partition holds a group: Kafka's ``partitionFor``, bit for bit.

Kafka places a group on ``Utils.abs(groupId.hashCode()) % numPartitions`` of
``__consumer_offsets``. Reproducing it exactly keeps our layout interchangeable with Kafka's
tools and lets the Spark jobs find a group's partition without the operator.

Two Java details matter: ``String.hashCode`` runs over UTF-16 code units with int32
overflow, and ``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0 (``Math.abs`` would leave it
negative). ``"polygenelubricants"`` hashes to exactly ``Integer.MIN_VALUE``.
"""

from __future__ import annotations

import struct

_INT32_MIN = -(2**31)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: sum of UTF-16 code units times powers of 31, as int32."""
    encoded = text.encode("utf-16-be", "surrogatepass")
    units = struct.unpack(f">{len(encoded) // 2}H", encoded)
    value = 0
    for unit in units:
        value = (31 * value + unit) & 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def kafka_abs(value: int) -> int:
    """Kafka's ``Utils.abs``: like ``abs`` except that ``Integer.MIN_VALUE`` becomes 0."""
    return 0 if value == _INT32_MIN else abs(value)


def partition_for(group_id: str, partitions: int) -> int:
    """The state-topic partition of ``group_id`` among ``partitions``, as Kafka computes it."""
    if partitions <= 0:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return kafka_abs(java_string_hash(group_id)) % partitions
