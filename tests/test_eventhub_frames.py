"""Frames already received are decoded without a task each (eventprocessor.sources.eventhub.frames):
the same frames as azure-eventhub's own receive_frame, over a real TCP connection, whether
they arrive in one piece, split, or as heartbeats."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("azure.eventhub")

from azure.eventhub._pyamqp._encode import encode_frame  # noqa: E402
from azure.eventhub._pyamqp.aio._transport_async import AsyncTransport  # noqa: E402
from azure.eventhub._pyamqp.performatives import FlowFrame, TransferFrame  # noqa: E402

from eventprocessor.sources.eventhub.frames import buffered_frame, read_buffered_frames  # noqa: E402


def _bytes(frame: Any) -> bytes:
    header, body = encode_frame(frame)  # without the channel (the connection adds it): channel 0
    return header + b"\x00\x00" + (bytes(body) if body else b"")


TRANSFERS = [_bytes(TransferFrame(handle=0, delivery_id=i, delivery_tag=i.to_bytes(4, "big"), message_format=0,
                                  payload=b"event %d " % i + b"x" * (i * 7 % 300))) for i in range(200)]
FLOW = _bytes(FlowFrame(next_incoming_id=1, incoming_window=100, next_outgoing_id=1, outgoing_window=100,
                        handle=0, delivery_count=0, link_credit=300))
HEARTBEAT = _bytes(None)


def _plain(value: Any) -> Any:
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


async def _frames(stream: bytes, split_at: int | None, count: int, *, fast: bool,
                  timeout: float = 2.0) -> tuple[list[Any], int]:
    """Serve ``stream`` (the bytes from ``split_at`` on 0.2 s later) and read ``count``
    frames through a transport; the frames and the tasks created while reading them."""
    first, rest = (stream, b"") if split_at is None else (stream[:split_at], stream[split_at:])

    async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(first)
        await writer.drain()
        if rest:
            await asyncio.sleep(0.2)
            writer.write(rest)
            await writer.drain()
        await asyncio.sleep(1.0)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = AsyncTransport("127.0.0.1", port=port, use_tls=False)
    await transport.connect()
    if fast:
        assert read_buffered_frames(transport)
        assert not read_buffered_frames(transport), "installed once"
    loop = asyncio.get_running_loop()
    created = 0

    def counting(loop_: asyncio.AbstractEventLoop, coroutine: Any, **kwargs: Any) -> asyncio.Task[Any]:
        nonlocal created
        created += 1
        return asyncio.Task(coroutine, loop=loop_, **kwargs)

    try:
        while len(transport.reader._buffer) < min(len(first), 60_000):  # the first write is here
            await asyncio.sleep(0.01)
        loop.set_task_factory(counting)
        frames = [_plain(await transport.receive_frame(timeout=timeout)) for _ in range(count)]
        loop.set_task_factory(None)
    finally:
        await transport.close()
        server.close()
        await server.wait_closed()
    return frames, created


async def test_buffered_frames_are_the_clients_frames_without_a_task_each():
    stream = b"".join(TRANSFERS[:100]) + FLOW + HEARTBEAT + b"".join(TRANSFERS[100:])
    count = len(TRANSFERS) + 2
    theirs, their_tasks = await _frames(stream, None, count, fast=False)
    ours, our_tasks = await _frames(stream, None, count, fast=True)
    assert ours == theirs
    assert [frame[1][0] for frame in ours[:3]] == [20, 20, 20], "transfers"
    assert ours[100][1][0] == 19 and ours[101] == [0, [1, b"EMPTY"]], "a flow, a heartbeat"
    assert [bytes(frame[1][1][-1]) for frame in ours[:2]] == [b"event 0 ", b"event 1 " + b"x" * 7]
    assert their_tasks >= count, "azure-eventhub's receive_frame: a task per frame"
    assert our_tasks < 5, f"frames already received: no task each ({our_tasks} for {count})"


async def test_a_frame_split_across_reads_is_waited_for_as_the_client_does():
    stream = b"".join(TRANSFERS[:10])
    split = len(b"".join(TRANSFERS[:4])) + 13  # in the 5th frame's payload
    theirs, _ = await _frames(stream, split, 10, fast=False)
    ours, _ = await _frames(stream, split, 10, fast=True)
    assert ours == theirs and len(ours) == 10


async def test_nothing_buffered_times_out_as_the_client_does():
    ours, _ = await _frames(b"".join(TRANSFERS[:2]), None, 3, fast=True, timeout=0.3)
    assert ours[2] == [None, None], "the client's timeout: no frame"


async def test_not_taken_while_another_read_holds_the_transport():
    server = await asyncio.start_server(lambda r, w: w.write(b"".join(TRANSFERS[:3])), "127.0.0.1", 0)
    transport = AsyncTransport("127.0.0.1", port=server.sockets[0].getsockname()[1], use_tls=False)
    await transport.connect()
    try:
        while len(transport.reader._buffer) < len(b"".join(TRANSFERS[:3])):
            await asyncio.sleep(0.01)
        assert buffered_frame(transport)
        async with transport.socket_lock:
            assert not buffered_frame(transport), "a read in progress: the client's own path"
        transport._read_buffer.write(b"left")
        transport._read_buffer.seek(0)
        assert not buffered_frame(transport), "bytes left over from an interrupted read: the client's own path"
    finally:
        await transport.close()
        server.close()
        await server.wait_closed()
