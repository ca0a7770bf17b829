"""A bounds-checked reader of Kafka's classic (non-flexible) encodings, for bytes that kio's
native reader must not see.

kio's reader trusts the counts it reads: an array that declares two billion elements makes
it reserve tens of gigabytes, and a failed allocation aborts the process. The bytes read
here come from clients and no frame check covers them: a ``ConsumerProtocolSubscription``
travels inside JoinGroup's ``metadata`` bytes, and the versions Kafka 4 removed (KIP-896)
have no kio type to validate a frame against. Every length and count read here is checked
against the bytes left before anything is allocated.
"""

from __future__ import annotations

import struct

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


class Truncated(ValueError):
    """The bytes end inside a value (or a count promises more than is left)."""


class Malformed(ValueError):
    """A value that its type does not allow (a null where none is allowed)."""


class Cursor:
    """Reads ``data`` from ``position`` on; every read checks the bytes left."""

    __slots__ = ("data", "position")

    def __init__(self, data: bytes, position: int = 0) -> None:
        self.data = data
        self.position = position

    @property
    def remaining(self) -> int:
        return len(self.data) - self.position

    def take(self, size: int) -> bytes:
        if size < 0 or size > self.remaining:
            raise Truncated(f"{size} bytes wanted at offset {self.position}, {self.remaining} left")
        chunk = self.data[self.position : self.position + size]
        self.position += size
        return chunk

    def int16(self) -> int:
        value: int = _INT16.unpack(self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self.take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _INT64.unpack(self.take(8))[0]
        return value

    def nullable_string(self) -> str | None:
        """An int16-length string; null for a negative length. Invalid UTF-8 is replaced, as
        Java's ``new String(bytes, UTF_8)`` in Kafka's readers replaces it."""
        size = self.int16()
        if size < 0:
            return None
        return self.take(size).decode("utf-8", errors="replace")

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise Malformed(f"null string at offset {self.position - 2}")
        return value

    def nullable_bytes(self) -> bytes | None:
        size = self.int32()
        return None if size < 0 else self.take(size)

    def count(self, element_size: int) -> int:
        """An int32 array count (-1 for null), refused when ``count`` elements of at least
        ``element_size`` bytes cannot fit in what is left."""
        count = self.int32()
        if count > 0 and count * element_size > self.remaining:
            raise Truncated(
                f"{count} elements of at least {element_size} bytes declared at offset "
                f"{self.position - 4}, {self.remaining} bytes left"
            )
        return count
