"""Received AMQP frames decoded without a task and a timer each.

azure-eventhub's async transport reads every frame through
``asyncio.wait_for(self.read(), timeout)``: a new task and a timer handle per frame,
and two more turns of the event loop (each an ``epoll`` call). Event Hubs sends one
transfer frame per event, so a receiver reading a backlog pays that once per event:
about a third of its CPU time (measured with the Spark source's reader processes: 47
to 31 µs of CPU per event on the Event Hubs emulator).

When the whole next frame is already in the connection's stream buffer and no other
read holds the transport, the client's own ``read`` finishes without ever suspending
(its lock is free and ``readexactly`` finds the bytes), so no timeout can apply: the
receive function :func:`read_buffered_frames` installs calls it directly, and the
client's ``receive_frame`` (with its ``wait_for``) otherwise. What is decoded, and how,
is the client's own code in both cases; only the task around it goes.

It reaches into private parts of azure-eventhub's ``_pyamqp`` (the transport's
``reader``, ``_read_buffer`` and ``socket_lock``, the decoder's functions): anything
missing and the transport is left as it is.

Example::

    read_buffered_frames(handler._connection._transport)
"""
from __future__ import annotations

import asyncio
import io
import logging
import struct
from typing import Any

__all__ = ["read_buffered_frames", "buffered_frame"]

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">I")
_HEADER = 8  # an AMQP frame header: size (4), data offset, type, channel (2)


def buffered_frame(transport: Any) -> bool:
    """Whether ``transport``'s next frame is whole in its stream buffer, with nothing
    left over from an interrupted read and no read in progress: ``transport.read()``
    then returns it without suspending."""
    reader = getattr(transport, "reader", None)
    if not isinstance(reader, asyncio.StreamReader):
        return False
    buffer = getattr(reader, "_buffer", None)
    if not isinstance(buffer, bytearray) or len(buffer) < _HEADER:
        return False
    size = _SIZE.unpack_from(buffer)[0]  # the whole frame's; b"AMQP" (a protocol header) reads as ~1 GB
    if size < _HEADER or len(buffer) < size or getattr(reader, "_exception", None) is not None:
        return False
    lock = getattr(transport, "socket_lock", None)
    if not isinstance(lock, asyncio.Lock) or lock.locked():
        return False
    leftover = getattr(transport, "_read_buffer", None)
    if not isinstance(leftover, io.BytesIO):
        return False
    with leftover.getbuffer() as view:
        return leftover.tell() >= view.nbytes


def read_buffered_frames(transport: Any) -> bool:
    """Give ``transport`` (an azure-eventhub ``AsyncTransport`` of one connection) a
    ``receive_frame`` that decodes a frame already received without wrapping the read
    in a task; False (and nothing changed) when the transport or the installed
    azure-eventhub lacks a piece it needs."""
    try:
        from azure.eventhub._pyamqp._decode import decode_empty_frame, decode_frame
    except ImportError:
        return False
    original = getattr(transport, "receive_frame", None)
    read = getattr(transport, "read", None)
    if not callable(original) or not callable(read) or getattr(original, "reads_buffered_frames", False):
        return False
    if not all(hasattr(transport, name) for name in ("reader", "_read_buffer", "socket_lock")):
        return False

    async def receive_frame(timeout: Any = None, **kwargs: Any) -> Any:
        if not buffered_frame(transport):
            return await original(timeout=timeout, **kwargs)
        header, channel, payload = await read(**kwargs)
        return channel, (decode_frame(payload) if payload else decode_empty_frame(header))

    receive_frame.reads_buffered_frames = True  # type: ignore[attr-defined]
    transport.receive_frame = receive_frame
    return True
