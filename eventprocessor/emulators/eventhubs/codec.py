"""AMQP 1.0 type system: encode, decode and skip values.

Written for the emulator rather than borrowed from ``azure.eventhub._pyamqp``: the
emulator then needs no Azure package, it is an independent peer of the official client
(a bug shared by both sides of a wire cannot hide), and no private module can change
under it. It is small because a broker needs little: performatives are encoded with
every field present (the official client decodes fields by position and does not pad
missing trailing ones), and message bodies are never decoded, only split into
sections and copied (see :func:`skip`).

Decoding maps AMQP types to Python:

==========================  ======================================
null / boolean              ``None`` / ``bool``
integers of any width       ``int``
float, double               ``float``
timestamp                   :class:`Timestamp` (milliseconds since the epoch)
uuid                        ``uuid.UUID``
binary                      ``bytes``
string                      ``str``
symbol                      :class:`Symbol` (a ``str``)
list, array                 ``list``
map                         ``dict``
described                   :class:`Described`
==========================  ======================================

Encoding takes the same types; an ``int`` is a ``long`` unless wrapped in one of the
width markers (:class:`UInt`, :class:`ULong`, :class:`UByte`, :class:`UShort`,
:class:`Int`). Example::

    data = encode(Described(ULong(0x10), ["container", None, UInt(65536)]))
    value, end = decode(data, 0)
"""
from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NamedTuple

__all__ = [
    "AMQPDecodeError", "Symbol", "Timestamp", "UInt", "ULong", "UByte", "UShort", "Int", "Described", "SymbolArray",
    "StringArray",
    "encode", "encode_into", "decode", "skip", "described_list",
]


class AMQPDecodeError(ValueError):
    """The bytes are not a well-formed AMQP value (unknown constructor, truncated, bad size)."""


class Symbol(str):
    """An AMQP symbol (ASCII), as opposed to a UTF-8 string."""

    __slots__ = ()


class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch."""

    __slots__ = ()

    @classmethod
    def from_datetime(cls, when: datetime) -> Timestamp:
        return cls(int(when.timestamp() * 1000))

    def to_datetime(self) -> datetime:
        return datetime.fromtimestamp(self / 1000, tz=timezone.utc)


class UInt(int):
    __slots__ = ()


class ULong(int):
    __slots__ = ()


class UByte(int):
    __slots__ = ()


class UShort(int):
    __slots__ = ()


class Int(int):
    __slots__ = ()


class Described(NamedTuple):
    descriptor: Any
    value: Any


class SymbolArray(list):
    """A list encoded as an AMQP array of symbols (capabilities, SASL mechanisms)."""


class StringArray(list):
    """A list encoded as an AMQP array of strings (the partition ids of a hub)."""


_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_B_U8 = struct.Struct(">BB")
_B_U32 = struct.Struct(">BI")
_B_I64 = struct.Struct(">Bq")
_B_U64 = struct.Struct(">BQ")


# ----------------------------------------------------------------------------- encode

def _enc_null(out: bytearray, _value: Any) -> None:
    out.append(0x40)


def _enc_bool(out: bytearray, value: bool) -> None:
    out.append(0x41 if value else 0x42)


def _enc_long(out: bytearray, value: int) -> None:
    if -128 <= value <= 127:
        out += bytes((0x55, value & 0xFF))
    else:
        out += _B_I64.pack(0x81, value)


def _enc_int(out: bytearray, value: int) -> None:
    if -128 <= value <= 127:
        out += bytes((0x54, value & 0xFF))
    else:
        out += b"\x71" + _I32.pack(value)


def _enc_uint(out: bytearray, value: int) -> None:
    if value == 0:
        out.append(0x43)
    elif value <= 255:
        out += bytes((0x52, value))
    else:
        out += _B_U32.pack(0x70, value)


def _enc_ulong(out: bytearray, value: int) -> None:
    if value == 0:
        out.append(0x44)
    elif value <= 255:
        out += bytes((0x53, value))
    else:
        out += _B_U64.pack(0x80, value)


def _enc_ubyte(out: bytearray, value: int) -> None:
    out += bytes((0x50, value))


def _enc_ushort(out: bytearray, value: int) -> None:
    out += b"\x60" + _U16.pack(value)


def _enc_float(out: bytearray, value: float) -> None:
    out += b"\x82" + _F64.pack(value)


def _enc_timestamp(out: bytearray, value: int) -> None:
    out += _B_I64.pack(0x83, value)


def _enc_datetime(out: bytearray, value: datetime) -> None:
    _enc_timestamp(out, Timestamp.from_datetime(value))


def _enc_uuid(out: bytearray, value: uuid.UUID) -> None:
    out += b"\x98" + value.bytes


def _enc_variable(out: bytearray, small: int, large: int, data: bytes) -> None:
    if len(data) <= 255:
        out += bytes((small, len(data)))
    else:
        out += _B_U32.pack(large, len(data))
    out += data


def _enc_binary(out: bytearray, value: bytes) -> None:
    _enc_variable(out, 0xA0, 0xB0, bytes(value))


def _enc_string(out: bytearray, value: str) -> None:
    _enc_variable(out, 0xA1, 0xB1, value.encode("utf-8"))


def _enc_symbol(out: bytearray, value: str) -> None:
    _enc_variable(out, 0xA3, 0xB3, value.encode("ascii"))


def _enc_compound(out: bytearray, small: int, large: int, count: int, body: bytearray) -> None:
    if len(body) + 1 <= 255 and count <= 255:
        out += bytes((small, len(body) + 1, count))
    else:
        out += struct.pack(">BII", large, len(body) + 4, count)
    out += body


def _enc_list(out: bytearray, value: list[Any]) -> None:
    # Never the empty-list constructor 0x45: the official client's frame decoder only
    # understands list8/list32 at the top of a performative, so always use those.
    body = bytearray()
    for item in value:
        encode_into(body, item)
    _enc_compound(out, 0xC0, 0xD0, len(value), body)


def _enc_map(out: bytearray, value: dict[Any, Any]) -> None:
    body = bytearray()
    for key, item in value.items():
        encode_into(body, key)
        encode_into(body, item)
    _enc_compound(out, 0xC1, 0xD1, 2 * len(value), body)


def _enc_text_array(out: bytearray, items: list[bytes], small: int, large: int) -> None:
    if all(len(item) <= 255 for item in items):
        body = bytearray((small,))
        for item in items:
            body += bytes((len(item),)) + item
    else:
        body = bytearray((large,))
        for item in items:
            body += _U32.pack(len(item)) + item
    _enc_compound(out, 0xE0, 0xF0, len(items), body)


def _enc_symbol_array(out: bytearray, value: list[str]) -> None:
    _enc_text_array(out, [item.encode("ascii") for item in value], 0xA3, 0xB3)


def _enc_string_array(out: bytearray, value: list[str]) -> None:
    _enc_text_array(out, [item.encode("utf-8") for item in value], 0xA1, 0xB1)


def _enc_described(out: bytearray, value: Described) -> None:
    out.append(0x00)
    encode_into(out, value.descriptor)
    encode_into(out, value.value)


_ENCODERS: dict[type, Callable[[bytearray, Any], None]] = {
    type(None): _enc_null,
    bool: _enc_bool,
    int: _enc_long,
    Int: _enc_int,
    UInt: _enc_uint,
    ULong: _enc_ulong,
    UByte: _enc_ubyte,
    UShort: _enc_ushort,
    float: _enc_float,
    Timestamp: _enc_timestamp,
    datetime: _enc_datetime,
    uuid.UUID: _enc_uuid,
    bytes: _enc_binary,
    bytearray: _enc_binary,
    memoryview: _enc_binary,
    str: _enc_string,
    Symbol: _enc_symbol,
    list: _enc_list,
    tuple: _enc_list,
    SymbolArray: _enc_symbol_array,
    StringArray: _enc_string_array,
    dict: _enc_map,
    Described: _enc_described,
}


def encode_into(out: bytearray, value: Any) -> None:
    """Append the encoding of ``value`` to ``out``."""
    try:
        encoder = _ENCODERS[type(value)]
    except KeyError:
        raise TypeError(f"no AMQP encoding for {type(value).__name__}") from None
    encoder(out, value)


def encode(value: Any) -> bytes:
    out = bytearray()
    encode_into(out, value)
    return bytes(out)


def described_list(code: int, fields: list[Any]) -> bytes:
    """A performative or section: a described list with a small-ulong descriptor."""
    out = bytearray(b"\x00\x53")
    out.append(code)
    _enc_list(out, fields)
    return bytes(out)


# ----------------------------------------------------------------------------- decode

_FIXED_WIDTH = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}


def _need(buf: Any, end: int) -> None:
    if end > len(buf):
        raise AMQPDecodeError(f"truncated value: needs {end} bytes, has {len(buf)}")


def skip(buf: Any, pos: int) -> int:
    """The position just after the value that starts at ``pos``, without decoding it."""
    _need(buf, pos + 1)
    code = buf[pos]
    if code == 0x00:
        return skip(buf, skip(buf, pos + 1))
    width = _FIXED_WIDTH.get(code)
    if width is not None:
        end = pos + 1 + width
    elif code in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0):
        _need(buf, pos + 2)
        end = pos + 2 + buf[pos + 1]
    elif code in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0):
        _need(buf, pos + 5)
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
    else:
        raise AMQPDecodeError(f"unknown AMQP constructor 0x{code:02x} at byte {pos}")
    _need(buf, end)
    return end


def _dec_items(buf: Any, pos: int, count: int, end: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    for _ in range(count):
        if pos >= end:
            raise AMQPDecodeError("compound value has fewer items than its count")
        item, pos = decode(buf, pos)
        items.append(item)
    if pos != end:
        raise AMQPDecodeError("compound value size does not match its items")
    return items, pos


def _dec_array_items(buf: Any, pos: int, count: int, end: int) -> tuple[list[Any], int]:
    if count == 0:
        return [], end
    # Element constructor once, then the bare values; a described array repeats its descriptor once.
    _need(buf, pos + 1)
    constructor_start = pos
    descriptor = None
    if buf[pos] == 0x00:
        descriptor, pos = decode(buf, pos + 1)
    code = buf[pos]
    items: list[Any] = []
    pos += 1
    for _ in range(count):
        value, pos = _decode_with_constructor(buf, code, pos)
        items.append(Described(descriptor, value) if descriptor is not None else value)
    if pos != end:
        raise AMQPDecodeError(f"array size does not match its items (constructor at {constructor_start})")
    return items, pos


def _decode_with_constructor(buf: Any, code: int, pos: int) -> tuple[Any, int]:
    """Decode the value whose constructor ``code`` was already read; ``pos`` is just after it."""
    if code == 0x40:
        return None, pos
    if code == 0x41:
        return True, pos
    if code == 0x42:
        return False, pos
    if code in (0x43, 0x44):
        return 0, pos
    if code == 0x45:
        return [], pos
    if code == 0x56:
        _need(buf, pos + 1)
        return buf[pos] != 0, pos + 1
    if code in (0x50, 0x52, 0x53):
        _need(buf, pos + 1)
        return buf[pos], pos + 1
    if code in (0x51, 0x54, 0x55):
        _need(buf, pos + 1)
        return _I8.unpack_from(buf, pos)[0], pos + 1
    if code == 0x60:
        _need(buf, pos + 2)
        return _U16.unpack_from(buf, pos)[0], pos + 2
    if code == 0x61:
        _need(buf, pos + 2)
        return _I16.unpack_from(buf, pos)[0], pos + 2
    if code == 0x70:
        _need(buf, pos + 4)
        return _U32.unpack_from(buf, pos)[0], pos + 4
    if code == 0x71:
        _need(buf, pos + 4)
        return _I32.unpack_from(buf, pos)[0], pos + 4
    if code == 0x72:
        _need(buf, pos + 4)
        return _F32.unpack_from(buf, pos)[0], pos + 4
    if code == 0x73:  # char: UTF-32BE code point
        _need(buf, pos + 4)
        return chr(_U32.unpack_from(buf, pos)[0]), pos + 4
    if code == 0x74:  # decimal32: kept as raw bytes
        _need(buf, pos + 4)
        return bytes(buf[pos:pos + 4]), pos + 4
    if code == 0x80:
        _need(buf, pos + 8)
        return _U64.unpack_from(buf, pos)[0], pos + 8
    if code == 0x81:
        _need(buf, pos + 8)
        return _I64.unpack_from(buf, pos)[0], pos + 8
    if code == 0x82:
        _need(buf, pos + 8)
        return _F64.unpack_from(buf, pos)[0], pos + 8
    if code == 0x83:
        _need(buf, pos + 8)
        return Timestamp(_I64.unpack_from(buf, pos)[0]), pos + 8
    if code == 0x84:  # decimal64
        _need(buf, pos + 8)
        return bytes(buf[pos:pos + 8]), pos + 8
    if code == 0x94:  # decimal128
        _need(buf, pos + 16)
        return bytes(buf[pos:pos + 16]), pos + 16
    if code == 0x98:
        _need(buf, pos + 16)
        return uuid.UUID(bytes=bytes(buf[pos:pos + 16])), pos + 16
    if code in (0xA0, 0xA1, 0xA3):
        _need(buf, pos + 1)
        start, end = pos + 1, pos + 1 + buf[pos]
    elif code in (0xB0, 0xB1, 0xB3):
        _need(buf, pos + 4)
        start = pos + 4
        end = start + _U32.unpack_from(buf, pos)[0]
    elif code in (0xC0, 0xC1, 0xE0):
        _need(buf, pos + 2)
        size, count = buf[pos], buf[pos + 1]
        end = pos + 1 + size
        _need(buf, end)
        if code == 0xE0:
            return _dec_array_items(buf, pos + 2, count, end)
        items, after = _dec_items(buf, pos + 2, count, end)
        return (items if code == 0xC0 else _pairs(items)), after
    elif code in (0xD0, 0xD1, 0xF0):
        _need(buf, pos + 8)
        size, count = struct.unpack_from(">II", buf, pos)
        end = pos + 4 + size
        _need(buf, end)
        if code == 0xF0:
            return _dec_array_items(buf, pos + 8, count, end)
        items, after = _dec_items(buf, pos + 8, count, end)
        return (items if code == 0xD0 else _pairs(items)), after
    elif code == 0x00:
        descriptor, pos = decode(buf, pos)
        value, pos = decode(buf, pos)
        return Described(descriptor, value), pos
    else:
        raise AMQPDecodeError(f"unknown AMQP constructor 0x{code:02x} at byte {pos - 1}")
    _need(buf, end)
    raw = bytes(buf[start:end])
    if code in (0xA0, 0xB0):
        return raw, end
    try:
        text = raw.decode("utf-8") if code in (0xA1, 0xB1) else raw.decode("ascii")
    except UnicodeDecodeError as error:
        raise AMQPDecodeError(f"invalid text at byte {start}: {error.reason}") from None
    return (text if code in (0xA1, 0xB1) else Symbol(text)), end


def _pairs(items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise AMQPDecodeError("map has an odd number of items")
    result: dict[Any, Any] = {}
    for index in range(0, len(items), 2):
        key = items[index]
        try:
            result[key] = items[index + 1]
        except TypeError:  # an unhashable key (a list or map): keep it as text
            result[repr(key)] = items[index + 1]
    return result


def decode(buf: Any, pos: int = 0) -> tuple[Any, int]:
    """Decode the value at ``pos``; return it and the position after it."""
    _need(buf, pos + 1)
    return _decode_with_constructor(buf, buf[pos], pos + 1)
