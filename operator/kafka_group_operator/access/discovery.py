"""Which coordinator serves a group: partition sets, the peers map and the owner's address.

Several coordinators may split one state topic, each serving a set of its partitions
(``kgo coordinator --partitions 0-24``). A group belongs to state partition
``partition_for(group)``; ``Directory`` names the member-API URL of the coordinator serving
each partition, from this coordinator's own set and advertised URL plus a static peers map
(``--peers 25-49=http://b:8080,...``). The member API puts the owner's URL in every
``NOT_COORDINATOR`` answer, as Kafka's FindCoordinator names the coordinator, and serves it
at ``GET /v1/groups/{group}/coordinator``.

Specs are hostile input: a malformed one raises ``ValueError`` with a message naming it.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_group_records import partitioning


def parse_partition_set(spec: str) -> frozenset[int]:
    """``"0-24,30"`` -> {0, ..., 24, 30}: comma-separated numbers and inclusive ranges."""
    served: set[int] = set()
    for item in spec.split(","):
        text = item.strip()
        low, dash, high = text.partition("-")
        try:
            first = int(low, 10)
            last = int(high, 10) if dash else first
        except ValueError:
            raise ValueError(
                f"{spec!r}: {text!r} is not a partition number or a range like 0-24"
            ) from None
        if first < 0 or last < first:
            raise ValueError(f"{spec!r}: {text!r} is not a range of partitions (low-high, >= 0)")
        served.update(range(first, last + 1))
    return frozenset(served)


def format_partition_set(partitions: frozenset[int] | set[int]) -> str:
    """The inverse of ``parse_partition_set``, with ranges merged: {0, 1, 2, 5} -> ``0-2,5``."""
    runs: list[str] = []
    ordered = sorted(partitions)
    start = previous = None
    for partition in [*ordered, None]:
        if partition is not None and previous is not None and partition == previous + 1:
            previous = partition
            continue
        if start is not None:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = partition
    return ",".join(runs)


def check_url(url: str) -> str:
    """``url`` without a trailing slash; ValueError unless it is an http(s) URL with a host."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host")
    return url.rstrip("/")


def parse_peers(spec: str) -> dict[int, str]:
    """``"0-24=http://a:8080,25-49=http://b:8080"`` -> {partition: url}. Entries are
    separated by ``,`` and each is ``SET=URL``; a SET with several items is written with
    ``+`` (``0-9+20=http://a:8080``). A partition named twice is an error."""
    peers: dict[int, str] = {}
    for entry in spec.split(","):
        partitions, equals, url = entry.strip().partition("=")
        if not equals:
            raise ValueError(f"{spec!r}: {entry.strip()!r} is not PARTITIONS=URL")
        checked = check_url(url.strip())
        for partition in parse_partition_set(partitions.replace("+", ",")):
            if partition in peers and peers[partition] != checked:
                raise ValueError(
                    f"{spec!r}: partition {partition} is given to {peers[partition]} and {checked}"
                )
            peers[partition] = checked
    return peers


@dataclass(frozen=True)
class Owner:
    """The coordinator of a group: its state partition, its URL if known, whether it is us."""

    partition: int
    url: str | None
    is_self: bool


@dataclass(frozen=True)
class Directory:
    """Who serves each state partition: this coordinator (``served``, at ``advertised_url``)
    or the peer the map names. ``served=None`` is every partition."""

    partitions: int
    served: frozenset[int] | None = None
    advertised_url: str | None = None
    peers: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        own = set(range(self.partitions)) if self.served is None else self.served
        outside = sorted(p for p in [*own, *self.peers] if not 0 <= p < self.partitions)
        if outside:
            raise ValueError(
                f"partitions {format_partition_set(set(outside))} are outside the state "
                f"topic's 0-{self.partitions - 1}"
            )
        if self.advertised_url is not None:
            # A peers map shared by every process may name this one too, with its own URL.
            clashes = sorted(
                p for p in own if self.peers.get(p, self.advertised_url) != self.advertised_url
            )
            if clashes:
                raise ValueError(
                    f"partitions {format_partition_set(set(clashes))} are served here, but the "
                    "peers map gives them to another URL"
                )

    def owner(self, group_id: str) -> Owner:
        partition = partitioning.partition_for(group_id, self.partitions)
        if self.served is None or partition in self.served:
            return Owner(partition, self.advertised_url, True)
        return Owner(partition, self.peers.get(partition), False)
