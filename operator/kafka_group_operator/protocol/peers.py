"""Which coordinator listener serves a group when several coordinators split the state topic.

The Kafka-protocol twin of ``access.discovery.Directory``: ``kgo coordinator --partitions 0-24``
serves only those state partitions, and ``--kafka-peers 25-49=b:9092,...`` names the Kafka
listener of the coordinator serving each other one. FindCoordinator then answers a group's
own coordinator (as a Kafka broker names the leader of the group's ``__consumer_offsets``
partition), and Metadata lists every coordinator as a node, so that a client which met one
through FindCoordinator finds it among the cluster's nodes.

With Leases (the operator's replicas, ``handlers.lease_shards``) the split is not fixed:
``LeasePeers`` answers from the elector's view, this listener for the partitions its runtime
serves, else the Kafka listener of the Lease's holder, whose address comes from the holder's
identity (``address_template``: ``{identity}.<statefulset>-headless.<namespace>.svc:9092``,
as the member API's peer URL). The listener and FindCoordinator use either through ``Peers``.

Node ids are derived from the listener's address (``node_id_for``): every coordinator gives
the same id to the same listener without agreeing on anything else, and two listeners never
share one (a client that took two coordinators for one node would send a group's requests
to the wrong one). Specs are hostile input: a malformed one raises ``ValueError`` naming it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kafka_group_operator.access import discovery
from kafka_group_records import partitioning

Address = tuple[str, int]

# Listener node ids start here, apart from the brokers' (as ``ListenerConfig.node_id``).
FIRST_NODE_ID = 1_000_000
_NODE_ID_SPAN = 1_000_000_000


def node_id_for(address: Address) -> int:
    """The node id of the listener at ``address``, the same in every coordinator."""
    host, port = address
    return FIRST_NODE_ID + zlib.crc32(f"{host}:{port}".encode()) % _NODE_ID_SPAN


def parse_address(text: str) -> Address:
    host, colon, port = text.strip().rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text.strip()!r} is not host:port")
    return host.strip("[]"), int(port)


def parse_kafka_peers(spec: str) -> dict[int, Address]:
    """``"0-24=a:9092,25-49=b:9092"`` -> {partition: (host, port)}; a SET of several items is
    written with ``+`` (``0-9+20=a:9092``), as ``--peers``. A partition named twice is an
    error."""
    peers: dict[int, Address] = {}
    for entry in spec.split(","):
        partitions, equals, address = entry.strip().partition("=")
        if not equals:
            raise ValueError(f"{spec!r}: {entry.strip()!r} is not PARTITIONS=HOST:PORT")
        try:
            parsed = parse_address(address)
        except ValueError as error:
            raise ValueError(f"{spec!r}: {error}") from None
        for partition in discovery.parse_partition_set(partitions.replace("+", ",")):
            if partition in peers and peers[partition] != parsed:
                raise ValueError(
                    f"{spec!r}: partition {partition} is given to "
                    f"{peers[partition][0]}:{peers[partition][1]} and {parsed[0]}:{parsed[1]}"
                )
            peers[partition] = parsed
    return peers


@dataclass(frozen=True)
class Location:
    """A group's coordinator: this listener, a peer's, or unknown (no peer serves it)."""

    partition: int
    is_self: bool
    address: Address | None


class Peers(Protocol):
    """Who coordinates a group, for a listener among several splitting the state topic."""

    @property
    def own(self) -> Address | None:
        """This listener's advertised address, when the peers know it."""
        ...

    def locate(self, group_id: str) -> Location: ...

    def addresses(self) -> list[Address]:
        """Every other coordinator's listener, each once, in a stable order."""
        ...


@dataclass(frozen=True)
class KafkaPeers:
    """This listener serves ``served`` (``None``: every partition); ``peers`` the others.
    One map may name every listener, this one included (as ``own``, its advertised address):
    entries of served partitions must then name ``own``."""

    partitions: int
    served: frozenset[int] | None = None
    peers: Mapping[int, Address] = field(default_factory=dict)
    own: Address | None = None

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"the state topic has {self.partitions} partitions")
        outside = sorted(p for p in self.peers if not 0 <= p < self.partitions)
        if outside:
            raise ValueError(
                f"partitions {discovery.format_partition_set(set(outside))} are outside the "
                f"state topic's 0-{self.partitions - 1}"
            )
        own = set(range(self.partitions)) if self.served is None else self.served
        clashes = sorted(p for p in own & set(self.peers) if self.peers[p] != self.own)
        if clashes:
            raise ValueError(
                f"partitions {discovery.format_partition_set(set(clashes))} are served here "
                "and given to a peer"
            )

    def locate(self, group_id: str) -> Location:
        partition = partitioning.partition_for(group_id, self.partitions)
        if self.served is None or partition in self.served:
            return Location(partition, True, None)
        return Location(partition, False, self.peers.get(partition))

    def addresses(self) -> list[Address]:
        """Every peer listener, each once, in a stable order."""
        return sorted({address for address in self.peers.values() if address != self.own})


def address_template(template: str) -> Callable[[str], Address]:
    """A replica's listener address from its identity: ``template`` with ``{identity}``
    replaced, as ``host:port``; ``ValueError`` naming a template that cannot give one."""
    if "{identity}" not in template:
        raise ValueError(f"the address template {template!r} has no {{identity}}")
    parse_address(template.replace("{identity}", "replica-0"))

    def address_of(identity: str) -> Address:
        return parse_address(template.replace("{identity}", identity))

    return address_of


def address_map(addresses: Mapping[str, Address]) -> Callable[[str], Address]:
    """A replica's listener address from a map by identity (``kgo coordinator
    --lease-kafka-replicas``, tests on loopback); ``ValueError`` for a replica not in it."""

    def address_of(identity: str) -> Address:
        try:
            return addresses[identity]
        except KeyError:
            raise ValueError(f"no Kafka listener is known for replica {identity!r}") from None

    return address_of


@dataclass(frozen=True)
class LeasePeers:
    """The peers of a replica on partition Leases (see the module docstring).

    ``serving(p)`` is whether the local runtime has taken partition p, ``holder(p)`` the
    identity of p's Lease holder as this replica last read it (None: nobody known, which
    FindCoordinator answers with the retriable ``COORDINATOR_NOT_AVAILABLE``), and
    ``address_of`` a replica's listener address by identity. The replicas are fixed (the
    StatefulSet's pods), so Metadata names every one of them, alive or not.
    """

    partitions: int
    identity: str
    replicas: Sequence[str]
    address_of: Callable[[str], Address]
    serving: Callable[[int], bool]
    holder: Callable[[int], str | None]

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"the state topic has {self.partitions} partitions")
        if self.identity not in self.replicas:
            raise ValueError(f"{self.identity!r} is not among the replicas {list(self.replicas)}")
        addresses = [self.address_of(replica) for replica in self.replicas]
        if len(set(addresses)) != len(addresses):
            # Two replicas at one address would be one node to a client.
            raise ValueError(f"replicas share a listener address: {addresses}")

    @property
    def own(self) -> Address:
        return self.address_of(self.identity)

    def locate(self, group_id: str) -> Location:
        partition = partitioning.partition_for(group_id, self.partitions)
        if self.serving(partition):
            return Location(partition, True, None)
        holder = self.holder(partition)
        if holder is None:
            return Location(partition, False, None)
        # Held here but not taken yet (the runtime is about to): this listener, which
        # answers COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR until it serves.
        if holder == self.identity:
            return Location(partition, True, None)
        try:
            return Location(partition, False, self.address_of(holder))
        except ValueError:  # a foreign holder whose name makes no address: nobody known
            return Location(partition, False, None)

    def addresses(self) -> list[Address]:
        own = self.own
        return sorted({self.address_of(r) for r in self.replicas if self.address_of(r) != own})
