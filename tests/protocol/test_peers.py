"""The Kafka listeners' peers map (``kgo coordinator --kafka-peers``): parsing, the checks,
which listener serves a group, and node ids every coordinator derives alike."""

from __future__ import annotations

import pytest

from kafka_group_operator.protocol import peers
from kafka_group_records import partitioning


def test_parse_sets_ranges_and_plus() -> None:
    parsed = peers.parse_kafka_peers("0-1+4=a:9092, 2=[::1]:9093")
    assert parsed == {0: ("a", 9092), 1: ("a", 9092), 4: ("a", 9092), 2: ("::1", 9093)}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0=a", "is not host:port"),
        ("0=a:0", "is not host:port"),
        ("0=a:65536", "is not host:port"),
        ("a:9092", "is not PARTITIONS=HOST:PORT"),
        ("0=a:9092,0=b:9092", "partition 0 is given to a:9092 and b:9092"),
        ("x=a:9092", "is not a partition number"),
    ],
)
def test_malformed_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        peers.parse_kafka_peers(spec)


def test_checks_of_the_map() -> None:
    with pytest.raises(ValueError, match="outside the state topic's 0-3"):
        peers.KafkaPeers(4, frozenset({0}), {7: ("b", 1)})
    with pytest.raises(ValueError, match="served here and given to a peer"):
        peers.KafkaPeers(4, frozenset({0}), {0: ("b", 1)})
    # A map of every listener names this one too, with its own address: accepted.
    both = peers.KafkaPeers(4, frozenset({0, 1}), {0: ("a", 1), 2: ("b", 1)}, own=("a", 1))
    assert both.addresses() == [("b", 1)]


def test_locate_by_kafka_partition_for() -> None:
    directory = peers.KafkaPeers(4, frozenset({0, 1}), {2: ("b", 9092)})
    for number in range(40):
        group = f"g{number}"
        partition = partitioning.partition_for(group, 4)
        location = directory.locate(group)
        assert location.partition == partition
        assert location.is_self is (partition in (0, 1))
        assert location.address == (
            None if partition in (0, 1, 3) else ("b", 9092)
        )  # 3: no peer known


def test_node_ids_are_derived_from_the_address_apart_from_brokers() -> None:
    first = peers.node_id_for(("a", 9092))
    assert first == peers.node_id_for(("a", 9092))
    assert first != peers.node_id_for(("a", 9093))
    assert first != peers.node_id_for(("b", 9092))
    assert peers.FIRST_NODE_ID <= first < 2**31
