"""A raw Kafka-protocol client for the listener tests: kio requests over one connection."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from kafka_group_operator.wire import framing


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._correlation = 0

    @classmethod
    async def open(
        cls, port: int, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> Connection:
        reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        return cls(reader, writer)

    async def call(self, body: Any, client_id: str | None = "tests") -> Any:
        """Send ``body`` and return the response of the same API version."""
        self._correlation += 1
        self.writer.write(framing.encode_request(body, self._correlation, client_id))
        await self.writer.drain()
        payload = await asyncio.wait_for(framing.read_frame(self.reader, 1 << 30), 30)
        assert payload is not None, "the listener closed the connection"
        correlation, response = framing.read_response(
            payload, framing.response_type(body.__api_key__, body.__version__)
        )
        assert correlation == self._correlation
        return response

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_raw(self) -> bytes | None:
        return await asyncio.wait_for(framing.read_frame(self.reader, 1 << 30), 30)

    async def closed_by_peer(self) -> bool:
        """True once the listener has closed this connection (EOF within 10 s)."""
        try:
            data = await asyncio.wait_for(self.reader.read(1), 10)
        except ConnectionError:
            return True
        return data == b""

    async def close(self) -> None:
        """Close, waiting at most 5 s for the peer: a transport still holding unsent bytes
        that the peer never reads would otherwise wait for good."""
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 5)
        except TimeoutError:
            self.writer.transport.abort()
        except (ConnectionError, ssl.SSLError):
            pass
