"""Messages as a producer sends them and as the emulator stores them, without decoding
their bodies.

A stored event is the producer's message with the service's annotations put in:
``header``, then the producer's delivery annotations (kept as sent: the service hands
them to consumers), then message annotations (the service's sequence number, offset,
enqueued time and partition key, then the producer's own, minus any service key it
tried to set), then the other sections as sent. A receiver that asked for runtime
metrics gets the partition's newest event in the delivery annotations, merged with the
producer's (see :func:`with_delivery_annotations`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from .codec import AMQPDecodeError, decode, skip
from .frames import split_sections

__all__ = ["SplitMessage", "split_message", "split_batch", "map_section", "ANNOTATION_KEYS", "BATCH_FORMAT",
           "DELIVERY_ANNOTATIONS", "MESSAGE_ANNOTATIONS"]

ANNOTATION_KEYS = {b"x-opt-sequence-number", b"x-opt-offset", b"x-opt-enqueued-time", b"x-opt-partition-key"}
BATCH_FORMAT = 0x80013700
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72


class SplitMessage(NamedTuple):
    """One producer message, in the pieces the emulator stores it from."""

    header: bytes
    """The header section as sent, or ``b""``."""
    delivery: bytes
    """The entries (keys and values, encoded) of the delivery-annotation map as sent."""
    delivery_count: int
    """How many items (keys plus values) ``delivery`` holds."""
    annotations: bytes
    """The entries of the message-annotation map, the service's own keys left out."""
    annotation_count: int
    rest: bytes
    """The other sections (properties, application properties, body, footer) as sent."""
    partition_key: str | None
    """The producer's ``x-opt-partition-key``, or None."""


def map_section(code: int, entries: bytes, count: int) -> bytes:
    """A described map section (``code``: delivery or message annotations) of ``count``
    items already encoded as ``entries``."""
    if len(entries) + 1 <= 255 and count <= 255:
        return b"\x00\x53" + bytes((code, 0xC1, len(entries) + 1, count)) + entries
    return b"\x00\x53" + bytes((code, 0xD1)) + (len(entries) + 4).to_bytes(4, "big") + count.to_bytes(4, "big") \
        + entries


def split_message(message: Any) -> SplitMessage:
    """Split a producer's message (see :class:`SplitMessage`). The service stamps its own
    sequence number, offset and enqueued time, so a producer cannot forge them."""
    header = b""
    delivery = annotations = b""
    delivery_count = annotation_count = 0
    rest = bytearray()
    partition_key: str | None = None
    for code, start, value_start, end in split_sections(message):
        if code == 0x70:
            header = bytes(message[start:end])
        elif code == DELIVERY_ANNOTATIONS:
            entries, count, _key = _map_entries(message, value_start, end, keep_service_keys=True)
            delivery += entries
            delivery_count += count
        elif code == MESSAGE_ANNOTATIONS:
            entries, count, partition_key = _map_entries(message, value_start, end, keep_service_keys=False)
            annotations += entries
            annotation_count += count
        else:
            rest += message[start:end]
    return SplitMessage(header, delivery, delivery_count, annotations, annotation_count, bytes(rest), partition_key)


def split_batch(message: Any) -> tuple[list[SplitMessage], str | None]:
    """The messages of a batch (message format ``BATCH_FORMAT``: one data section per
    message) and the batch's partition key (the envelope's, else the first message's)."""
    envelope = split_message(message)
    key = envelope.partition_key
    inner: list[SplitMessage] = []
    for code, _start, value_start, _end in split_sections(envelope.rest):
        if code != 0x75:
            continue
        value, _ = decode(envelope.rest, value_start)
        if not isinstance(value, bytes):
            raise AMQPDecodeError("a batch data section is not binary")
        part = split_message(value)
        inner.append(part)
        if key is None:
            key = part.partition_key
    return inner, key


def _map_entries(message: Any, value_start: int, end: int, *, keep_service_keys: bool
                 ) -> tuple[bytes, int, str | None]:
    """The encoded entries of the map at ``value_start``, their item count and the
    partition key among them; the service's keys are left out unless ``keep_service_keys``."""
    constructor = message[value_start]
    if constructor == 0xC1:
        pos, count = value_start + 3, message[value_start + 2]
    elif constructor == 0xD1:
        pos, count = value_start + 9, int.from_bytes(message[value_start + 5:value_start + 9], "big")
    elif constructor == 0x40:
        return b"", 0, None
    else:
        raise AMQPDecodeError("annotations are not a map")
    kept = bytearray()
    kept_count = 0
    partition_key: str | None = None
    for _ in range(count // 2):
        key_end = skip(message, pos)
        value_end = skip(message, key_end)
        key, _ = decode(message, pos)
        name = key.encode() if isinstance(key, str) else key
        if not keep_service_keys and name == b"x-opt-partition-key":
            value, _ = decode(message, key_end)
            if value is not None:
                partition_key = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        elif keep_service_keys or name not in ANNOTATION_KEYS:
            kept += message[pos:value_end]
            kept_count += 2
        pos = value_end
    if pos > end:
        raise AMQPDecodeError("annotations run past their section")
    return bytes(kept), kept_count, partition_key
