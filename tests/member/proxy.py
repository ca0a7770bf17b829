"""A loopback TCP proxy that a test can cut, stall and restore: a real network partition.

Two kinds of partition, as clients meet them:

* ``cut()``: open connections are reset and new ones are accepted and closed at once, as
  when the coordinator's pod is gone and its node answers with resets;
* ``stall()``: a black hole. Connections stay open and new ones are accepted, but not a byte
  is forwarded in either direction, as when packets are dropped (a partitioned node, a
  frozen VM): a client notices only through its own timeouts.

``restore()`` ends either; bytes held during a stall are forwarded then. ``latency_s`` delays
every chunk by that much in each direction, as a link across zones does.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from kafka_group_operator.embedded import broker as embedded


class Proxy:
    def __init__(self, target_host: str, target_port: int, latency_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.latency_s = latency_s
        self.port = embedded.free_port()
        # Connections accepted so far, stalled ones included: how many attempts a client made.
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._cut = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def stall(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        self._cut.clear()
        self._flowing.set()

    def retarget(self, target_host: str, target_port: int) -> None:
        """New connections go to another server (a Service that now selects another pod)."""
        self.target = (target_host, target_port)

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._flowing.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            if self._cut.is_set():
                client.close()
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        with self._lock:
            self._sockets.add(client)
        # A stalled proxy does not even reach the server: the client waits, connected.
        self._flowing.wait()
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            if self._cut.is_set() or client not in self._sockets:  # cut meanwhile
                client.close()
                upstream.close()
                return
            self._sockets.add(upstream)
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.latency_s:
                    time.sleep(self.latency_s)
                # Held, not dropped, while stalled: TCP delivers it once the path heals.
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # Shut down before closing: the other direction's thread is blocked reading one of
            # these sockets, and a bare close() then sends no FIN. One side closing is seen by
            # the other, as through a Service's NAT.
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
