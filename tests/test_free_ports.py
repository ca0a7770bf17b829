"""Listeners' ports in tests, the demo and ``kgo dev up``: picked outside the kernel's range
of ephemeral ports, where any outgoing connection could take a port found by binding to 0 as
its local port before the listener binds it (a kube test once waited 60 s on "address
already in use" for its operator's member API)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kafka_group_operator.embedded import broker


def test_free_ports_are_outside_the_ephemeral_range_and_free() -> None:
    low, high = broker._ephemeral_range()
    ports = [broker.free_port() for _ in range(200)]
    assert [p for p in ports if low <= p <= high] == []
    assert all(broker.LOWEST_PICKED <= p < 65536 for p in ports)
    assert len(set(ports)) > 150  # random, not one port handed out again and again
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_an_unreadable_range_is_linux_s_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker, "EPHEMERAL_PORTS", Path("/nonexistent/ip_local_port_range"))
    # Linux's own default (Documentation/networking/ip-sysctl.rst: ip_local_port_range).
    assert broker._ephemeral_range() == (32768, 60999)
