"""Only runtime/ writes the state topic: a scan of every Kafka producer's call site.

Jobs read and plan; only the coordinator writes. The coordinator's writer (``runtime.writer``,
a transactional producer per state partition) is what makes ``acks=all`` plus replay safe: a
second writer could erase or reorder what the coordinator acknowledged. The import-linter
contract "Only runtime/ writes the state topic" keeps everyone else from the writer module;
this test finds every other way to produce: a confluent-kafka producer class imported or
named, and every ``produce``/``produce_batch`` call, in any module of the product outside
runtime/. The few that remain write data topics, for the demo and the dev setup, and are
listed here with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[2] / "operator"
RUNTIME = SOURCES / "kafka_group_operator" / "runtime"
PRODUCER_CLASSES = frozenset({"Producer", "SerializingProducer", "AIOProducer"})
PRODUCE_METHODS = frozenset({"produce", "produce_batch"})

# Producers of data topics, never of the state topic: file -> why.
DATA_TOPIC_PRODUCERS = {
    "kafka_group_operator/commands/demo.py": "the demo's producer of its data topic",
    "kafka_group_operator/commands/dev.py": "`kgo dev produce`: messages for a data topic",
    "kafka_group_operator/embedded/kafka.py": (
        "a new Apache Kafka node's warm-up: one transaction to a topic of its own, deleted"
    ),
}


def producer_sites(source: str) -> list[str]:
    """Where ``source`` imports or names a Kafka producer class, or calls ``produce``."""
    sites = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("confluent_kafka"):
            sites += [
                f"{node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name in PRODUCER_CLASSES
            ]
        elif isinstance(node, ast.Attribute) and node.attr in PRODUCER_CLASSES:
            sites.append(f"{node.lineno}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in PRODUCE_METHODS
        ):
            sites.append(f"{node.lineno}: .{node.func.attr}(")
    return sorted(sites)


def test_the_scan_finds_a_producer_however_it_is_spelled() -> None:
    assert producer_sites(
        "from confluent_kafka import Consumer, Producer as P\n"
        "import confluent_kafka\n"
        "confluent_kafka.SerializingProducer({})\n"
        "P({}).produce('state', b'v', b'k')\n"
    ) == ["1: import Producer", "3: .SerializingProducer", "4: .produce("]
    assert producer_sites("from confluent_kafka import Consumer\nConsumer({}).poll(1)\n") == []


def test_nothing_outside_runtime_produces_but_the_data_topic_producers() -> None:
    found: dict[str, list[str]] = {}
    for path in sorted(SOURCES.rglob("*.py")):
        if RUNTIME in path.parents:
            continue
        sites = producer_sites(path.read_text(encoding="utf-8"))
        if sites:
            found[path.relative_to(SOURCES).as_posix()] = sites
    unexpected = {name: sites for name, sites in found.items() if name not in DATA_TOPIC_PRODUCERS}
    assert unexpected == {}, "only the coordinator's runtime may write the state topic"
    # The list stays true: each data-topic producer it names is still there.
    assert sorted(found) == sorted(DATA_TOPIC_PRODUCERS)


def test_the_runtime_writer_is_the_producer_of_the_state_topic() -> None:
    """The scan looks where the producer is: runtime/writer.py holds one."""
    assert producer_sites((RUNTIME / "writer.py").read_text(encoding="utf-8")) != []
