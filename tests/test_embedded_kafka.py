"""The Apache Kafka the tests and ``kgo dev up --broker kafka`` run: its pom, its cache, a
node's restart, a cluster of three."""

from __future__ import annotations

import base64
import time
import uuid
import xml.etree.ElementTree as ElementTree

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from kafka_group_operator.embedded import kafka
from tests.support import topics

POM = "{http://maven.apache.org/POM/4.0.0}"


def test_the_pom_declares_the_version_the_module_runs() -> None:
    root = ElementTree.parse(kafka.pom()).getroot()
    version = root.find(f"{POM}properties/{POM}kafka.version")
    assert version is not None
    assert version.text == kafka.KAFKA_VERSION
    artifacts = {
        dependency.findtext(f"{POM}artifactId")
        for dependency in root.iter(f"{POM}dependency")
        if dependency.findtext(f"{POM}groupId") == "org.apache.kafka"
    }
    assert artifacts == {"kafka_2.13", "kafka-server", "kafka-tools", "kafka-clients"}


def test_the_jars_are_cached_outside_the_clone_by_version() -> None:
    lib = kafka.distribution()
    assert lib.parent.name == f"kafka-{kafka.KAFKA_VERSION}"
    assert (lib / ".complete").exists()
    assert (lib / f"kafka_2.13-{kafka.KAFKA_VERSION}.jar").exists()
    assert (lib / f"kafka-tools-{kafka.KAFKA_VERSION}.jar").exists()


def test_a_cluster_id_is_kraft_shaped() -> None:
    ids = {kafka.new_cluster_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) == 22 and "=" not in i for i in ids)


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kafka-storage format --cluster-id -eW...`` reads the id as an option and fails (a
    3-broker fixture failed so, one start in 64); Kafka's ``Uuid.randomUuid`` draws again."""
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))
    assert base64.urlsafe_b64encode(dashed.bytes).startswith(b"-")
    plain = uuid.UUID(bytes=b"\x10" + bytes(15))
    drawn = iter([dashed, plain])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(drawn))
    assert kafka.new_cluster_id() == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")


@pytest.mark.broker
def test_a_node_keeps_its_topics_across_a_restart(kafka_broker: kafka.KafkaCluster) -> None:
    from tests.support import topics

    topic = topics.create_topic(kafka_broker.bootstrap, 2, messages_per_partition=3)
    kafka_broker.restart()
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    described = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(described.partitions) == 2


@pytest.mark.broker
def test_the_cluster_replicates_new_topics_three_ways(kafka_cluster: kafka.KafkaCluster) -> None:
    from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    name = "replicated-by-default"
    admin.create_topics([NewTopic(name, 2)])[name].result(30)
    # CreateTopics is answered before every broker knows the topic: the one a DescribeConfigs
    # goes to may still call it unknown.
    topics.wait_for_leaders(kafka_cluster.bootstrap, name, 2)
    described = admin.list_topics(name, timeout=10).topics[name]
    assert all(len(p.replicas) == 3 for p in described.partitions.values())
    resource = ConfigResource(ResourceType.TOPIC, name)
    deadline = time.monotonic() + 30
    while True:
        try:
            configs = admin.describe_configs([resource])[resource].result(30)
            break
        except KafkaException as error:
            unknown = error.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            if not unknown or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert configs["min.insync.replicas"].value == "2"
