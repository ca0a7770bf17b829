"""ConsumerProtocolSubscription and ConsumerProtocolAssignment bytes as each client family
writes them, read by ``protocol.consumer_protocol``.

Where each vector comes from:

- Java: kafka-clients 4.4.0's ``ConsumerProtocol.serializeSubscription`` /
  ``serializeAssignment`` at versions 0-3, run on a JVM for topics [orders, payments], no
  user data, owned orders-0 and orders-2, generation 7, rack "rack-a" (the assignment:
  orders-1, payments-0);
- librdkafka (confluent-kafka 2.16): ``rd_kafka_consumer_protocol_member_metadata_new``
  writes version 3, an empty (not null) user data, an empty owned list, the generation
  (-1 on a first join) and the rack, ``client.rack``, whose default is the empty string;
- kafka-python 3.0: ``ConsumerProtocolSubscription(0, topics, b"")``, checked below against
  the installed package's own encoder;
- sarama: ``ConsumerGroupMemberMetadata.encode``, version 0 below Kafka 2.4 (and always in
  sarama 1.22), 1 (owned partitions) from 2.4, 2 (generation) from 3.2; no user data is null;
- segmentio kafka-go: ``groupMetadata`` of version 1 that ends after its (null) user data,
  with no owned partitions;
- franz-go: ``kmsg.ConsumerMemberMetadata`` of version 3 (range and roundrobin: null user
  data, no owned partitions, the generation, a null rack).

The live client tests (``test_go_clients``, ``test_classic_clients``) check that what the
clients really send on a first join is these bytes.
"""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KafkaPython

from kafka_group_operator.protocol import consumer_protocol
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from tests.protocol.test_classic import (
    INCONSISTENT_GROUP_PROTOCOL,
    MEMBER_ID_REQUIRED,
    assignment,
    join,
    server_assigned,
    sync,
)
from tests.protocol.test_kip848 import topic_id
from tests.protocol.test_listener import assert_serving
from tests.protocol.test_old_versions import string
from tests.protocol.wire import Connection

ORDERS = "0006" + b"orders".hex()
PAYMENTS = "0008" + b"payments".hex()
NULL_BYTES, EMPTY_BYTES, NULL_STRING, EMPTY_STRING = "ffffffff", "00000000", "ffff", "0000"
BOTH_TOPICS = "00000002" + ORDERS + PAYMENTS
ONE_TOPIC = "00000001" + ORDERS
OWNED = "00000001" + ORDERS + "00000002" + "00000000" + "00000002"  # orders-0, orders-2
NO_OWNED = "00000000"

JAVA = {
    0: "0000" + BOTH_TOPICS + NULL_BYTES,
    1: "0001" + BOTH_TOPICS + NULL_BYTES + OWNED,
    2: "0002" + BOTH_TOPICS + NULL_BYTES + OWNED + "00000007",
    3: "0003" + BOTH_TOPICS + NULL_BYTES + OWNED + "00000007" + "0006" + b"rack-a".hex(),
}
# Exactly as kafka-clients 4.4.0 printed them (see the module's docstring).
JAVA_PRINTED = {
    0: "00000000000200066f726465727300087061796d656e7473ffffffff",
    1: "00010000000200066f726465727300087061796d656e7473ffffffff0000000100066f7264657273"
    "000000020000000000000002",
    2: "00020000000200066f726465727300087061796d656e7473ffffffff0000000100066f7264657273"
    "00000002000000000000000200000007",
    3: "00030000000200066f726465727300087061796d656e7473ffffffff0000000100066f7264657273"
    "0000000200000000000000020000000700067261636b2d61",
}
JAVA_ASSIGNMENT = (
    "00000002" + ORDERS + "00000001" + "00000001" + PAYMENTS + "00000001" + "00000000" + NULL_BYTES
)
JAVA_ASSIGNMENT_PRINTED = (
    "00000002" + "00066f7264657273000000010000000100087061796d656e74730000000100000000ffffffff"
)

FIRST_JOINS = {
    "librdkafka": "0003" + ONE_TOPIC + EMPTY_BYTES + NO_OWNED + "ffffffff" + EMPTY_STRING,
    "kafka-python": "0000" + ONE_TOPIC + EMPTY_BYTES,
    "sarama v0 (and 1.22)": "0000" + ONE_TOPIC + NULL_BYTES,
    "sarama v1": "0001" + ONE_TOPIC + NULL_BYTES + NO_OWNED,
    "sarama v2": "0002" + ONE_TOPIC + NULL_BYTES + NO_OWNED + "ffffffff",
    "segmentio kafka-go": "0001" + ONE_TOPIC + NULL_BYTES,
    "franz-go": "0003" + ONE_TOPIC + NULL_BYTES + NO_OWNED + "ffffffff" + NULL_STRING,
}


def owned_of(subscription: object) -> dict[str, tuple[int, ...]]:
    return {
        entry.topic: tuple(entry.partitions)
        for entry in getattr(subscription, "owned_partitions", ())
    }


def test_the_java_vectors_are_what_kafka_clients_printed() -> None:
    assert JAVA == JAVA_PRINTED
    assert JAVA_ASSIGNMENT == JAVA_ASSIGNMENT_PRINTED


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_java_subscriptions_of_every_version(version: int) -> None:
    read = consumer_protocol.read_subscription(bytes.fromhex(JAVA[version]))
    assert read.topics == ("orders", "payments")
    assert read.user_data is None
    assert owned_of(read) == ({"orders": (0, 2)} if version >= 1 else {})
    assert getattr(read, "generation_id", -1) == (7 if version >= 2 else -1)
    assert getattr(read, "rack_id", None) == ("rack-a" if version >= 3 else None)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_java_assignments_of_every_version(version: int) -> None:
    data = struct.pack(">h", version) + bytes.fromhex(JAVA_ASSIGNMENT)
    read = consumer_protocol.read_assignment(data)
    assert {tp.topic: tuple(tp.partitions) for tp in read.assigned_partitions} == {
        "orders": (1,),
        "payments": (0,),
    }
    assert read.user_data is None


@pytest.mark.parametrize("client", list(FIRST_JOINS))
def test_every_client_familys_first_join(client: str) -> None:
    read = consumer_protocol.read_subscription(bytes.fromhex(FIRST_JOINS[client]))
    assert read.topics == ("orders",)
    assert owned_of(read) == {}
    assert getattr(read, "generation_id", -1) == -1
    assert getattr(read, "rack_id", None) == ("" if client == "librdkafka" else None)


def test_kafka_pythons_own_encoder_writes_its_vector() -> None:
    encoded = KafkaPython(0, ["orders"], b"").encode()
    assert encoded.hex() == FIRST_JOINS["kafka-python"]


def test_segmentio_ends_its_version_1_after_the_user_data() -> None:
    """The bytes that were answered INCONSISTENT_GROUP_PROTOCOL: owned partitions missing."""
    read = consumer_protocol.read_subscription(bytes.fromhex(FIRST_JOINS["segmentio kafka-go"]))
    assert read.__version__ == 1
    assert read.owned_partitions == ()


def test_missing_trailing_fields_take_their_defaults() -> None:
    """Each Java v3 subscription cut at a field boundary after its topics."""
    full = bytes.fromhex(JAVA[3])
    topics_end = 2 + len(bytes.fromhex(BOTH_TOPICS))
    cuts = {
        topics_end: ({}, -1, None),  # no user data either
        topics_end + 4: ({}, -1, None),
        topics_end + 4 + len(bytes.fromhex(OWNED)): ({"orders": (0, 2)}, -1, None),
        len(full) - 8: ({"orders": (0, 2)}, 7, None),
    }
    for cut, (owned, generation, rack) in cuts.items():
        read = consumer_protocol.read_subscription(full[:cut])
        assert read.topics == ("orders", "payments")
        assert (owned_of(read), read.generation_id, read.rack_id) == (owned, generation, rack)


def test_a_field_cut_short_takes_its_default_and_so_do_the_rest() -> None:
    full = bytes.fromhex(JAVA[3])
    owned_start = 2 + len(bytes.fromhex(BOTH_TOPICS)) + 4
    read = consumer_protocol.read_subscription(full[: owned_start + 9])  # inside "orders"
    assert (owned_of(read), read.generation_id, read.rack_id) == ({}, -1, None)


def test_a_newer_version_reads_as_the_newest_known_and_extra_bytes_are_ignored() -> None:
    future = struct.pack(">h", 9) + bytes.fromhex(JAVA[3])[2:] + b"\x00\x01new field"
    read = consumer_protocol.read_subscription(future)
    assert read.__version__ == 3
    assert (read.topics, owned_of(read), read.rack_id) == (
        ("orders", "payments"),
        {"orders": (0, 2)},
        "rack-a",
    )


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x00", id="half a version"),
        pytest.param(b"\xff\xff" + bytes.fromhex(ONE_TOPIC), id="negative version"),
        pytest.param(b"\x00\x00", id="no topics"),
        pytest.param(b"\x00\x00\xff\xff\xff\xff", id="null topics"),
        pytest.param(b"\x00\x00" + struct.pack(">i", 2**31 - 2), id="2^31-2 topics"),
        pytest.param(b"\x00\x00" + struct.pack(">i", 3) + bytes.fromhex(ORDERS), id="3 of 1"),
        pytest.param(b"\x00\x00\x00\x00\x00\x01\x7f\xff", id="a topic longer than the bytes"),
    ],
)
def test_no_whole_topic_list_is_malformed(data: bytes) -> None:
    with pytest.raises(consumer_protocol.MalformedMetadata):
        consumer_protocol.read_subscription(data)


def test_huge_counts_in_trailing_fields_allocate_nothing() -> None:
    """A count kio's native reader would have trusted (and aborted the process on)."""
    data = bytes.fromhex("0001" + ONE_TOPIC + NULL_BYTES) + struct.pack(">i", 2**31 - 2)
    assert owned_of(consumer_protocol.read_subscription(data)) == {}
    nested = bytes.fromhex("0001" + ONE_TOPIC + NULL_BYTES + "00000001" + ORDERS) + struct.pack(
        ">i", 2**31 - 2
    )
    assert owned_of(consumer_protocol.read_subscription(nested)) == {}


def test_invalid_utf8_is_replaced_as_java_replaces_it() -> None:
    data = b"\x00\x00" + struct.pack(">ih", 1, 2) + b"\xff\xfe"
    assert consumer_protocol.read_subscription(data).topics == ("\ufffd\ufffd",)


# ---------------------------------------------------------------------------------------
# On the wire: JoinGroup carrying these bytes


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="package")
async def test_join_group_accepts_segmentios_subscription(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
    topic: str,
) -> None:
    """It was answered INCONSISTENT_GROUP_PROTOCOL, and kafka-go retried every 5 ms."""
    await topic_id(runtime, topic)
    segmentio = bytes.fromhex("0001" + "00000001") + string(topic) + bytes.fromhex(NULL_BYTES)
    # A Server-mode resource: the coordinator reads the subscription and assigns (a group
    # of the Kafka protocol alone is a classic group that relays the bytes unread).
    group = await server_assigned(runtime, topic)
    connection = await Connection.open(open_listener.port)
    try:
        joined = await connection.call(join(group, topic, metadata=segmentio))
        assert joined.error_code == MEMBER_ID_REQUIRED
        joined = await connection.call(join(group, topic, joined.member_id, metadata=segmentio))
        assert joined.error_code == 0
        synced = await connection.call(sync(group, joined.member_id, joined.generation_id))
        assert (synced.error_code, assignment(synced.assignment)) == (0, {topic: (0, 1, 2)})
    finally:
        await connection.close()


@pytest.mark.broker
@pytest.mark.asyncio(loop_scope="package")
async def test_a_subscription_declaring_2_billion_topics_is_refused_not_allocated(
    open_listener: protocol_listener.Listener,
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> None:
    """kio's native reader reserved 16 GiB for these 6 bytes and aborted the process. The
    group is Server-mode: the coordinator reads the subscription (a classic group relays it)."""
    hostile = struct.pack(">hi", 0, 2**31 - 16)
    group = await server_assigned(runtime, "t")
    connection = await Connection.open(open_listener.port)
    try:
        joined = await connection.call(join(group, "t", metadata=hostile))
        assert joined.error_code == INCONSISTENT_GROUP_PROTOCOL
    finally:
        await connection.close()
    await assert_serving(open_listener.port)
