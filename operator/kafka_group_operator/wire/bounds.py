"""Every length and count of a frame checked against the bytes left, before kio reads it.

kio's native reader trusts the counts it reads: an array that declares 2^32-2 elements makes
it reserve room for them all (34 GB), and the failed allocation aborts the whole process.
Kafka's generated readers refuse such a count ("Tried to allocate a collection of size N,
but there are only M bytes remaining"); ``check`` does the same, and more strictly, before
kio sees the body:

- an array's count may not exceed the bytes left divided by its element's fewest bytes;
- a string's or bytes' length may not exceed the bytes left; a negative length other than
  -1 (null) is refused, and so is null where the schema has no null;
- a tagged field's value must take exactly the size its tag declares (kio reads the value
  and ignores the size), and an unknown tag's size must fit;
- optional ``caps`` bound named arrays of the top-level struct further (the listener caps
  the group ids of one request).

It returns the offset where the struct ends, so a caller also refuses trailing bytes.
Walking the bytes allocates nothing per declared element: fixed-width arrays are skipped in
one step, others are walked element by element, and never beyond the frame.

The check must cost little next to kio's own decode (a steady heartbeat is read thousands of
times a second), so it is not an interpreter of the layout: each struct's layout
(``layout``) is compiled once into a straight-line Python function, cached per kio type.
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kafka_group_operator.wire import layout

Checker = Callable[[bytes, int, int], int]


class BoundsError(ValueError):
    """A length or count does not fit in the frame (the message names the field)."""


def check(
    schema: type[Any], data: bytes, offset: int = 0, caps: Mapping[str, int] | None = None
) -> int:
    """The offset where the ``schema`` struct starting at ``offset`` ends in ``data``;
    ``BoundsError`` when a length or count in it does not fit the bytes left (or a cap)."""
    key = schema if not caps else (schema, tuple(sorted(caps.items())))
    checker = _CHECKERS.get(key)
    if checker is None:
        with _COMPILING:
            checker = _CHECKERS.get(key)
            if checker is None:
                checker = _CHECKERS[key] = _compile(layout.layout(schema), caps or {})
    try:
        end = checker(data, offset, len(data))
    except (IndexError, struct.error):
        end = -1  # a length or a varint runs past the end of the frame
    if not 0 <= end <= len(data):
        # (Fixed-width fields are skipped without a look: the last ones can overrun.)
        raise BoundsError(f"{schema.__name__}: the frame ends inside a field")
    return end


# --- what the generated code calls ----------------------------------------------------


def _uvarint(data: bytes, offset: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (as Kafka and kio read them) and the offset
    after it; IndexError if the frame ends inside it."""
    value, shift = 0, 0
    for used in range(1, 6):
        byte = data[offset + used - 1]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset + used
        shift += 7
    raise BoundsError("a varint of more than 5 bytes")


def _many(where: str, count: int, left: int) -> None:
    raise BoundsError(f"{where}: {count} elements declared, {left} bytes left")


def _long(where: str, length: int, left: int) -> None:
    raise BoundsError(f"{where}: {length} bytes declared, {left} bytes left")


def _negative(where: str, length: int) -> None:
    raise BoundsError(f"{where}: length {length}")


def _null(where: str) -> None:
    raise BoundsError(f"{where}: null where the schema has no null")


def _over_cap(where: str, count: int, cap: int) -> None:
    raise BoundsError(f"{where}: {count} elements, the limit is {cap}")


def _tag_size(where: str, tag: int, size: int, used: int) -> None:
    raise BoundsError(f"{where}: tagged field {tag} declares {size} bytes, its value takes {used}")


_NAMESPACE: dict[str, Any] = {
    "_uvarint": _uvarint,
    "_int32": struct.Struct(">i").unpack_from,
    "_many": _many,
    "_long": _long,
    "_negative": _negative,
    "_null": _null,
    "_over_cap": _over_cap,
    "_tag_size": _tag_size,
}
_CHECKERS: dict[Any, Checker] = {}
# Generated function of each struct (without caps), by kio type.
_STRUCTS: dict[type[Any], str] = {}
_NUMBERS = itertools.count()
# A struct's name is registered before its function is defined: one compilation at a time.
_COMPILING = threading.Lock()


# --- code generation ------------------------------------------------------------------
#
# A generated function is ``f(d, o, e) -> o``: the frame's bytes, the offset where the
# struct starts and the end of the bytes it may use (the frame's end, or a tagged field's).
# Reading past ``len(d)`` raises IndexError (caught by ``check``); reading past ``e`` inside
# a tagged value is caught by the exact-size check after it.


def _compile(lay: layout.Layout, caps: Mapping[str, int]) -> Checker:
    name = _struct_function(lay, caps)
    checker: Checker = _NAMESPACE[name]
    return checker


def _define(name: str, lines: list[str], origin: str) -> None:
    exec(compile("\n".join(lines) + "\n", f"<bounds {origin}>", "exec"), _NAMESPACE)


def _struct_function(lay: layout.Layout, caps: Mapping[str, int] | None = None) -> str:
    if not caps and lay.schema in _STRUCTS:
        return _STRUCTS[lay.schema]
    name = f"_s{next(_NUMBERS)}"
    if not caps:
        _STRUCTS[lay.schema] = name
    code = _Code()
    code.line(0, f"def {name}(d, o, e):")
    for field in lay.fields:
        cap = caps.get(field.name) if caps else None
        code.field(1, field, lay.flexible, f"{lay.name}.{field.name}", cap)
    if lay.flexible:
        code.flush(1)
        code.varint(1, "n")
        code.line(1, f"if n: o = {_tags_function(lay)}(d, o, e, n)")
    code.flush(1)
    code.line(1, "return o")
    _define(name, code.lines, lay.name)
    return name


def _tags_function(lay: layout.Layout) -> str:
    """The walker of a struct's tagged-fields section (only called when it has fields)."""
    name = f"_t{next(_NUMBERS)}"
    where = f"{lay.name} tagged fields"
    values = {tag: _value_function(lay, tag, field) for tag, field in sorted(lay.tags.items())}
    code = _Code()
    code.line(0, f"def {name}(d, o, e, count):")
    code.line(1, f"if count * 2 > e - o: _many({where!r}, count, e - o)")
    code.line(1, "for _ in range(count):")
    code.line(2, "tag, o = _uvarint(d, o)")
    code.line(2, "size, o = _uvarint(d, o)")
    code.line(2, f"if size > e - o: _long({where!r}, size, e - o)")
    code.line(2, "end = o + size")
    keyword = "if"
    for tag, value in values.items():
        code.line(2, f"{keyword} tag == {tag}:")
        code.line(3, f"o = {value}(d, o, end)")
        code.line(3, f"if o != end: _tag_size({where!r}, tag, size, o - end + size)")
        keyword = "elif"
    # An unknown tag is skipped, as Kafka skips it (``tagged`` drops it for kio).
    code.line(2, "o = end")
    code.line(1, "return o")
    _define(name, code.lines, where)
    return name


def _value_function(lay: layout.Layout, tag: int, field: layout.Field) -> str:
    name = f"_v{next(_NUMBERS)}"
    code = _Code()
    code.line(0, f"def {name}(d, o, e):")
    code.field(1, field, lay.flexible, f"{lay.name}.{field.name}", None)
    code.flush(1)
    code.line(1, "return o")
    _define(name, code.lines, f"{lay.name} tag {tag}")
    return name


class _Code:
    """Lines of one generated function; consecutive fixed-width fields become one step."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._fixed = 0
        self._counts = 0

    def line(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def flush(self, indent: int) -> None:
        if self._fixed:
            self.line(indent, f"o += {self._fixed}")
            self._fixed = 0

    def varint(self, indent: int, var: str) -> None:
        """``var`` = the unsigned varint at ``o`` (one byte inline: the common case)."""
        self.line(indent, f"{var} = d[o]")
        self.line(indent, f"if {var} > 127: {var}, o = _uvarint(d, o)")
        self.line(indent, "else: o += 1")

    def field(
        self, indent: int, field: layout.Field, flexible: bool, where: str, cap: int | None
    ) -> None:
        kind = field.kind
        if kind is layout.Kind.FIXED:
            self._fixed += field.width
            return
        self.flush(indent)
        if kind is layout.Kind.STRING:
            self._string(indent, field, flexible, where)
        elif kind is layout.Kind.STRUCT:
            assert field.struct is not None
            function = _struct_function(field.struct)
            if field.nullable:
                # kio reads an int8 marker: -1 is null, anything else a struct.
                self.line(indent, "if d[o] == 255: o += 1")
                self.line(indent, f"else: o = {function}(d, o + 1, e)")
            else:
                self.line(indent, f"o = {function}(d, o, e)")
        else:
            self._array(indent, field, flexible, where, cap)

    def _string(self, indent: int, field: layout.Field, flexible: bool, where: str) -> None:
        null = [] if field.nullable else [f"_null({where!r})"]
        if field.compact(flexible):
            self.varint(indent, "n")
            self.line(indent, "if n > 1:")
            self.line(indent + 1, f"if n - 1 > e - o: _long({where!r}, n - 1, e - o)")
            self.line(indent + 1, "o += n - 1")
            if null:
                self.line(indent, f"elif not n: {null[0]}")
            return
        if field.width == 2:
            self.line(indent, "n = d[o] << 8 | d[o + 1]")
            self.line(indent, "o += 2")
            self.line(indent, "if n < 0x8000:")
            self.line(indent + 1, f"if n > e - o: _long({where!r}, n, e - o)")
            self.line(indent + 1, "o += n")
            self.line(indent, f"elif n != 0xFFFF: _negative({where!r}, n - 0x10000)")
        else:
            self.line(indent, "n = _int32(d, o)[0]")
            self.line(indent, "o += 4")
            self.line(indent, "if n >= 0:")
            self.line(indent + 1, f"if n > e - o: _long({where!r}, n, e - o)")
            self.line(indent + 1, "o += n")
            self.line(indent, f"elif n != -1: _negative({where!r}, n)")
        if null:
            self.line(indent, f"else: {null[0]}")

    def _array(
        self, indent: int, field: layout.Field, flexible: bool, where: str, cap: int | None
    ) -> None:
        element = field.element
        assert element is not None
        self._counts += 1
        count = f"c{self._counts}"
        # Kafka's generated readers refuse a null array where the schema has none; kio would
        # hand the handlers None for a list.
        if flexible:
            self.varint(indent, count)
            if not field.nullable:
                self.line(indent, f"if not {count}: _null({where!r})")
            self.line(indent, f"if {count} > 1:")
            self.line(indent + 1, f"{count} -= 1")
        else:
            self.line(indent, f"{count} = _int32(d, o)[0]")
            self.line(indent, "o += 4")
            self.line(indent, f"if {count} < -1: _negative({where!r}, {count})")
            if not field.nullable:
                self.line(indent, f"elif {count} == -1: _null({where!r})")
            self.line(indent, f"elif {count} > 0:")
        body = indent + 1
        if cap is not None:
            self.line(body, f"if {count} > {cap}: _over_cap({where!r}, {count}, {cap})")
        # Kafka's own rule is count <= bytes left; the element's fewest bytes is tighter.
        minimum = max(element.minimum(flexible), 1)
        scaled = count if minimum == 1 else f"{count} * {minimum}"
        self.line(body, f"if {scaled} > e - o: _many({where!r}, {count}, e - o)")
        if element.kind is layout.Kind.FIXED:
            self.line(body, f"o += {scaled}")
            return
        self.line(body, f"for _ in range({count}):")
        self.field(body + 1, element, flexible, f"{where}[]", None)
        self.flush(body + 1)
