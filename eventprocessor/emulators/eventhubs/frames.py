"""AMQP 1.0 frames and performatives as the emulator writes and reads them.

Every performative is written with all of its fields, trailing nulls included:
``azure-eventhub``'s decoder (``_pyamqp``) reads fields by position and fails on a
short list. Section and performative descriptors are always small ulongs
(``00 53 xx``): the client looks for the code at a fixed byte.

The hot path, one transfer per delivered event, has its own fixed-layout encoder
(:func:`transfer_frame`): one ``struct.pack`` per event.
"""
from __future__ import annotations

import struct
from typing import Any, NamedTuple

from .codec import (
    AMQPDecodeError,
    Described,
    Symbol,
    SymbolArray,
    UByte,
    UInt,
    ULong,
    UShort,
    decode,
    described_list,
    encode,
    skip,
)

__all__ = [
    "AMQP_HEADER", "SASL_HEADER", "TLS_HEADER", "Performative", "Raw", "frame", "performative", "sasl_frame",
    "read_frame_header",
    "decode_performative", "open_frame", "begin_frame", "attach_frame", "flow_frame", "disposition_frame",
    "detach_frame", "end_frame", "close_frame", "sasl_mechanisms", "sasl_outcome", "error", "transfer_frame",
    "transfer_frames", "EMPTY_FRAME", "accepted", "rejected", "source", "target", "SECTION_CODES",
    "split_sections", "MessageSections",
]

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"

OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
SASL_MECHANISMS, SASL_INIT, SASL_CHALLENGE, SASL_RESPONSE, SASL_OUTCOME = range(0x40, 0x45)
_FIELD_COUNTS = {OPEN: 10, BEGIN: 8, ATTACH: 14, FLOW: 11, TRANSFER: 11, DISPOSITION: 6, DETACH: 3, END: 1,
                 CLOSE: 1, SASL_MECHANISMS: 1, SASL_INIT: 3, SASL_CHALLENGE: 1, SASL_RESPONSE: 1, SASL_OUTCOME: 2}
_NAMES = {OPEN: "open", BEGIN: "begin", ATTACH: "attach", FLOW: "flow", TRANSFER: "transfer",
          DISPOSITION: "disposition", DETACH: "detach", END: "end", CLOSE: "close",
          SASL_MECHANISMS: "sasl-mechanisms", SASL_INIT: "sasl-init", SASL_CHALLENGE: "sasl-challenge",
          SASL_RESPONSE: "sasl-response", SASL_OUTCOME: "sasl-outcome"}
_SYMBOLIC_DESCRIPTORS = {"amqp:open:list": OPEN, "amqp:begin:list": BEGIN, "amqp:attach:list": ATTACH,
                         "amqp:flow:list": FLOW, "amqp:transfer:list": TRANSFER,
                         "amqp:disposition:list": DISPOSITION, "amqp:detach:list": DETACH, "amqp:end:list": END,
                         "amqp:close:list": CLOSE, "amqp:sasl-mechanisms:list": SASL_MECHANISMS,
                         "amqp:sasl-init:list": SASL_INIT, "amqp:sasl-response:list": SASL_RESPONSE}

_HEADER = struct.Struct(">IBBH")


class Raw(bytes):
    """Already-encoded AMQP bytes, copied into a performative as they are."""


class Performative(NamedTuple):
    """A decoded frame body: its code, its fields padded to full length, the raw bytes
    of each field (to echo a peer's source or target exactly), and the transfer payload."""

    code: int
    fields: list[Any]
    raw: list[bytes]
    payload: bytes

    @property
    def name(self) -> str:
        return _NAMES.get(self.code, f"0x{self.code:02x}")


def performative(code: int, fields: list[Any]) -> bytes:
    """A performative body (no frame header) with every field present, in order."""
    body = bytearray()
    for value in fields:
        if isinstance(value, Raw):
            body += value
        else:
            body += encode(value)
    out = bytearray(b"\x00\x53")
    out.append(code)
    if len(body) + 1 <= 255:
        out += bytes((0xC0, len(body) + 1, len(fields)))
    else:
        out += struct.pack(">BII", 0xD0, len(body) + 4, len(fields))
    out += body
    return bytes(out)


def frame(channel: int, body: bytes, frame_type: int = 0) -> bytes:
    return _HEADER.pack(8 + len(body), 2, frame_type, channel) + body


def sasl_frame(body: bytes) -> bytes:
    return frame(0, body, frame_type=1)


def read_frame_header(buf: Any, pos: int = 0) -> tuple[int, int, int, int]:
    """(size, data offset in 4-byte words, frame type, channel) of the frame at ``pos``."""
    return _HEADER.unpack_from(buf, pos)


def decode_performative(body: Any) -> Performative:
    """Decode a frame body (after the frame header and any extended header)."""
    if len(body) < 3 or body[0] != 0x00:
        raise AMQPDecodeError("frame body is not a described performative")
    if body[1] == 0x53:
        code, pos = body[2], 3
    else:
        descriptor, pos = decode(body, 1)
        if isinstance(descriptor, str):
            code = _SYMBOLIC_DESCRIPTORS.get(descriptor, -1)
        else:
            code = int(descriptor)
    expected = _FIELD_COUNTS.get(code)
    if expected is None:
        raise AMQPDecodeError(f"unknown performative 0x{code:02x}")
    constructor = body[pos]
    fields: list[Any] = []
    raw: list[bytes] = []
    if constructor == 0x45:
        end = pos + 1
    elif constructor in (0xC0, 0xD0):
        if constructor == 0xC0:
            if len(body) < pos + 3:
                raise AMQPDecodeError("truncated performative")
            size, count, item = body[pos + 1], body[pos + 2], pos + 3
            end = pos + 2 + size
        else:
            if len(body) < pos + 9:
                raise AMQPDecodeError("truncated performative")
            size, count = struct.unpack_from(">II", body, pos + 1)
            item, end = pos + 9, pos + 5 + size
        if end > len(body):
            raise AMQPDecodeError("performative is longer than its frame")
        for _ in range(count):
            after = skip(body, item)
            if after > end:
                raise AMQPDecodeError("performative field runs past the list")
            value, _ = decode(body, item)
            fields.append(value)
            raw.append(bytes(body[item:after]))
            item = after
        if item != end:
            raise AMQPDecodeError("performative list size does not match its fields")
    else:
        raise AMQPDecodeError(f"performative body is not a list (constructor 0x{constructor:02x})")
    if len(fields) > expected:
        fields, raw = fields[:expected], raw[:expected]
    while len(fields) < expected:
        fields.append(None)
        raw.append(b"\x40")
    payload = bytes(body[end:]) if code == TRANSFER else b""
    return Performative(code, fields, raw, payload)


# ----------------------------------------------------------------------------- performatives

def error(condition: str, description: str | None = None, info: dict[Any, Any] | None = None) -> Described:
    return Described(ULong(0x1D), [Symbol(condition), description, info])


def open_frame(container_id: str, *, hostname: str | None, max_frame_size: int, channel_max: int,
               idle_timeout_ms: int | None, properties: dict[Any, Any] | None = None) -> bytes:
    return frame(0, performative(OPEN, [
        container_id, hostname, UInt(max_frame_size), UShort(channel_max),
        UInt(idle_timeout_ms) if idle_timeout_ms else None, None, None, None, None, properties]))


def begin_frame(channel: int, *, remote_channel: int | None, next_outgoing_id: int, incoming_window: int,
                outgoing_window: int, handle_max: int) -> bytes:
    return frame(channel, performative(BEGIN, [
        UShort(remote_channel) if remote_channel is not None else None, UInt(next_outgoing_id), UInt(incoming_window),
        UInt(outgoing_window), UInt(handle_max), None, None, None]))


def source(address: str | None, filters: dict[Any, Any] | None = None) -> Described:
    return Described(ULong(0x28), [address, UInt(0), Symbol("session-end"), UInt(0), False, None, None, filters,
                                   None, None, None])


def target(address: str | None) -> Described:
    return Described(ULong(0x29), [address, UInt(0), Symbol("session-end"), UInt(0), False, None, None])


def attach_frame(channel: int, *, name: str, handle: int, role: bool, snd_settle_mode: int, rcv_settle_mode: int,
                 source: Any, target: Any, initial_delivery_count: int | None, max_message_size: int | None,
                 offered_capabilities: list[str] | None = None,
                 properties: dict[Any, Any] | None = None) -> bytes:
    return frame(channel, performative(ATTACH, [
        name, UInt(handle), role, UByte(snd_settle_mode), UByte(rcv_settle_mode), source, target, None, False,
        UInt(initial_delivery_count) if initial_delivery_count is not None else None,
        ULong(max_message_size) if max_message_size is not None else None,
        SymbolArray(offered_capabilities) if offered_capabilities else None, None, properties]))


def flow_frame(channel: int, *, next_incoming_id: int | None, incoming_window: int, next_outgoing_id: int,
               outgoing_window: int, handle: int | None = None, delivery_count: int | None = None,
               link_credit: int | None = None, available: int | None = None, drain: bool = False,
               echo: bool = False) -> bytes:
    def opt(value: int | None) -> UInt | None:
        return UInt(value & 0xFFFFFFFF) if value is not None else None

    return frame(channel, performative(FLOW, [
        opt(next_incoming_id), UInt(incoming_window), UInt(next_outgoing_id & 0xFFFFFFFF), UInt(outgoing_window),
        opt(handle), opt(delivery_count), opt(link_credit), opt(available), drain, echo, None]))


def accepted() -> Described:
    return Described(ULong(0x24), [])


def rejected(condition: str, description: str) -> Described:
    return Described(ULong(0x25), [error(condition, description)])


def disposition_frame(channel: int, *, role: bool, first: int, last: int | None, settled: bool,
                      state: Any) -> bytes:
    return frame(channel, performative(DISPOSITION, [
        role, UInt(first), UInt(last) if last is not None else None, settled, state, False]))


def detach_frame(channel: int, *, handle: int, closed: bool, err: Described | None = None) -> bytes:
    return frame(channel, performative(DETACH, [UInt(handle), closed, err]))


def end_frame(channel: int, err: Described | None = None) -> bytes:
    return frame(channel, performative(END, [err]))


def close_frame(err: Described | None = None) -> bytes:
    return frame(0, performative(CLOSE, [err]))


def sasl_mechanisms(mechanisms: list[str]) -> bytes:
    return sasl_frame(performative(SASL_MECHANISMS, [SymbolArray(mechanisms)]))


def sasl_outcome(code: int) -> bytes:
    return sasl_frame(performative(SASL_OUTCOME, [UByte(code), None]))


# ----------------------------------------------------------------------------- transfers (hot path)

# frame header | 00 53 14 | list8 size=29 count=11 | handle uint | delivery-id uint | delivery-tag
# binary8(8) | then the constant tail: message-format 0 (uint0), settled true, more false,
# rcv-settle-mode null, state null, resume false, aborted false, batchable false.
_TRANSFER = struct.Struct(">IBBHBBBBBBBIBIBBQ8s")
_TRANSFER_TAIL = b"\x43\x41\x42\x40\x40\x42\x42\x42"
_TRANSFER_OVERHEAD = _TRANSFER.size
_TRANSFER_MORE_TAIL = b"\x43\x41\x41\x40\x40\x42\x42\x42"


def transfer_frame(channel: int, handle: int, delivery_id: int, payload: bytes) -> bytes:
    """One pre-settled delivery in one frame (the payload must fit the peer's frame size)."""
    return _TRANSFER.pack(_TRANSFER_OVERHEAD + len(payload), 2, 0, channel, 0x00, 0x53, 0x14, 0xC0, 29, 11,
                          0x70, handle, 0x70, delivery_id, 0xA0, 8, delivery_id, _TRANSFER_TAIL) + payload


def transfer_frames(channel: int, handle: int, delivery_id: int, payload: bytes, max_frame_size: int) -> list[bytes]:
    """One delivery split over as many frames as the peer's ``max_frame_size`` needs."""
    room = max_frame_size - _TRANSFER_OVERHEAD
    if len(payload) <= room:
        return [transfer_frame(channel, handle, delivery_id, payload)]
    frames = []
    for start in range(0, len(payload), room):
        chunk = payload[start:start + room]
        tail = _TRANSFER_MORE_TAIL if start + room < len(payload) else _TRANSFER_TAIL
        frames.append(_TRANSFER.pack(_TRANSFER_OVERHEAD + len(chunk), 2, 0, channel, 0x00, 0x53, 0x14, 0xC0, 29,
                                     11, 0x70, handle, 0x70, delivery_id, 0xA0, 8, delivery_id, tail) + chunk)
    return frames


# ----------------------------------------------------------------------------- message sections

SECTION_CODES = {
    "amqp:header:list": 0x70, "amqp:delivery-annotations:map": 0x71, "amqp:message-annotations:map": 0x72,
    "amqp:properties:list": 0x73, "amqp:application-properties:map": 0x74, "amqp:data:binary": 0x75,
    "amqp:amqp-sequence:list": 0x76, "amqp:amqp-value:*": 0x77, "amqp:footer:map": 0x78,
}


class MessageSections(NamedTuple):
    """Where each section of an encoded message is: ``(code, start, value_start, end)``."""

    sections: list[tuple[int, int, int, int]]


def split_sections(message: Any) -> list[tuple[int, int, int, int]]:
    """Split an encoded message into its sections without decoding their values."""
    sections = []
    pos, size = 0, len(message)
    while pos < size:
        if message[pos] != 0x00:
            raise AMQPDecodeError(f"message section at byte {pos} is not described")
        if pos + 2 < size and message[pos + 1] == 0x53:
            code, value_start = message[pos + 2], pos + 3
        else:
            descriptor, value_start = decode(message, pos + 1)
            code = SECTION_CODES.get(descriptor, -1) if isinstance(descriptor, str) else int(descriptor)
        if not 0x70 <= code <= 0x78:
            raise AMQPDecodeError(f"unknown message section 0x{code:02x}" if code >= 0 else "unknown message section")
        end = skip(message, value_start)
        sections.append((code, pos, value_start, end))
        pos = end
    return sections


# Re-exported so callers can build section bytes without importing the codec too.
section = described_list
