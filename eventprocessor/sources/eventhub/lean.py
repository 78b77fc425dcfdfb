"""The lean receive path: one partition read by driving azure-eventhub's own consumer
handler directly, each received AMQP message turned straight into an ``Event``.

It drives private parts of azure-eventhub (``EventHubConsumerClient._create_consumer``,
the consumer's ``_open`` and AMQP ``_handler``): :func:`lean_receive_supported` checks
them once, the receiver checks the rest on each open, and
``tests/test_eventhub_source.py`` fails loudly when the installed version no longer
offers them (the source then falls back to :mod:`.fallback`).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from ...events import Event, EventPosition
from .conversion import SEQUENCE_NUMBER, last_enqueued_of, message_to_event, to_starting_position
from .frames import read_buffered_frames
from .receiver import PartitionReceiverBase

__all__ = ["_LeanReceiver", "lean_receive_supported"]

logger = logging.getLogger(__name__)

# Frames the lean receiver asks the client to read per call at first and at most, and
# how long it keeps reading after the first event of a batch arrived (see
# _LeanReceiver._read).
_FRAMES_PER_READ = 4
_MAX_FRAMES_PER_READ = 1024
_GATHER_SECONDS = 0.05
_MIN_WINDOW = 0.005  # the least a receive waits for a read in progress


def lean_receive_supported(client: Any) -> bool:
    """Whether ``client`` (``EventHubConsumerClient`` or one of them) offers the private
    pieces the lean receive path drives: ``_create_consumer``, and on the consumer
    ``_open``, ``_create_handler`` and ``close`` (``_handler``, ``_message_buffer`` and
    the handler's ``_message_received_callback`` are checked on each opened consumer)."""
    if not callable(getattr(client, "_create_consumer", None)):
        return False
    try:
        from azure.eventhub.aio._consumer_async import EventHubConsumer
    except ImportError:
        return False
    return all(callable(getattr(EventHubConsumer, name, None)) for name in ("_open", "close", "_create_handler"))


def _outcome_retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("an abandoned receiver open failed: %r", task.exception())


class _LeanReceiver(PartitionReceiverBase):
    """One partition, read by driving the client's consumer handler directly.

    The handler's message callback appends raw AMQP messages to a buffer; ``receive``
    has the handler read frames until a batch is there (``_read``) and converts up to
    ``max_batch_size`` messages at a time. Link credit (``prefetch``) bounds how far the
    hub runs ahead of the handler.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._consumer: Any = None
        self._handler: Any = None
        self._buffer: deque[Any] = deque()
        self._closed = False
        self._last_sequence_number: int | None = None  # of the last event handed out
        self._read_size = _FRAMES_PER_READ  # frames the next read asks for (see _read)
        self._reading: asyncio.Future[Any] | None = None  # a large read in progress
        self._reading_frames = 0  # the frames it asked for

    async def _open(self) -> None:
        # Throttled (server-busy): wait out the hub's retry-after instead of asking again.
        await self._link.throttle.wait()
        # Reopened after a failure (the link dropped its buffer with the consumer): go on
        # right after the last event handed out, neither replaying nor skipping any.
        position = self._position if self._last_sequence_number is None else \
            EventPosition.from_sequence_number(self._last_sequence_number)
        starting_position, inclusive = to_starting_position(position)

        async def unused(*_args: Any) -> None:  # the lean path reads the buffer itself
            return None

        consumer = self._client._create_consumer(
            self.consumer_group, self.partition_id, starting_position, unused, owner_level=self._owner_level,
            prefetch=self._prefetch, event_position_inclusive=inclusive,
            track_last_enqueued_event_properties=self._track)
        self._consumer = consumer
        opening = asyncio.ensure_future(consumer._open())
        # A receiver closed while it opens (its claim ended) can make the client's open
        # fail after wait_for stopped waiting for it; its outcome is of no use then, and
        # unretrieved it would be logged as "Task exception was never retrieved".
        opening.add_done_callback(_outcome_retrieved)
        try:
            await asyncio.wait_for(opening, self._link.operation_timeout)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            await self._drop_consumer()
            raise self._translate(error, "opening a receiver") from None
        handler = getattr(consumer, "_handler", None)
        buffer = getattr(consumer, "_message_buffer", None)
        if not callable(getattr(handler, "do_work_async", None)) or not isinstance(buffer, deque):
            # This azure-eventhub opens consumers differently: use the public path from
            # the next receiver on (the pump reopens after this error).
            await self._drop_consumer()
            self._link.use_public_receive()
            logger.warning("the installed azure-eventhub's consumer lacks the handler or buffer EventHubSource drives; "
                           "receiving through its public receive_batch from now on (slower)")
            raise self._link.errors.error(
                "disconnected", f"the receiver of partition {self.partition_id} is reopened on the public receive path")
        self._handler = handler
        self._buffer = buffer
        # A frame already received is decoded without a task and a timer of its own (a
        # third of the CPU time of reading a backlog; see .frames).
        read_buffered_frames(getattr(getattr(handler, "_connection", None), "_transport", None))
        if callable(getattr(handler, "_message_received_callback", None)):
            # The consumer's callback takes an asyncio.Lock per message (about 2.5 µs of the
            # ~30 µs the client spends on each event here); nothing else appends to the
            # buffer, so a plain append does.
            own: deque[Any] = deque()
            append = own.append

            async def on_message(message: Any) -> None:
                append(message)

            handler._message_received_callback = on_message  # type: ignore[union-attr]
            self._buffer = own

    async def receive(self, max_batch_size: int, max_wait_time: float | None) -> list[Event]:
        messages = await self._take(max_batch_size, max_wait_time)
        if not messages:
            return []
        pid = self.partition_id
        events = [message_to_event(message, pid) for message in messages]
        self._last_sequence_number = events[-1].sequence_number
        return events

    async def receive_messages(self, max_batch_size: int, max_wait_time: float | None) -> list[Any]:
        """What :meth:`receive` returns, as the received AMQP messages (azure-eventhub's
        ``_pyamqp`` ``Message``), not converted to events: for a caller that reads their
        fields itself (the Spark source makes Arrow columns of them)."""
        messages = await self._take(max_batch_size, max_wait_time)
        if messages:
            self._last_sequence_number = messages[-1].message_annotations[SEQUENCE_NUMBER]
        return messages

    async def _take(self, max_batch_size: int, max_wait_time: float | None) -> list[Any]:
        """Up to ``max_batch_size`` received messages, reading frames for them if none
        waits (``[]`` when ``max_wait_time`` passed with nothing)."""
        if self._closed:
            raise RuntimeError("receiver is closed")
        if self._consumer is None:
            await self._open()
        buffer = self._buffer
        if not buffer and not await self._read(buffer, max_batch_size, max_wait_time):
            return []
        self._forget_delivery_tags()
        count = min(max_batch_size, len(buffer))
        popleft = buffer.popleft
        messages = [popleft() for _ in range(count)]
        if self._track:
            self._last_enqueued = last_enqueued_of(messages[-1]) or self._last_enqueued
        return messages

    async def _read(self, buffer: deque[Any], max_batch_size: int, max_wait_time: float | None) -> bool:
        """Have the client read frames until ``buffer`` holds a batch; False when
        ``max_wait_time`` passed with nothing received.

        The client reads as many frames per call as it is asked for and returns early
        only when the socket stays quiet for its socket timeout (0.2 s), so asking for
        many frames would hold a trickle of events until they all came. A read asks
        for a few frames (``_FRAMES_PER_READ``); each read that came back full asks for
        four times more the next time (up to the link credit and the room left in the
        batch): a backlog is read in few calls (each call costs about as much as
        several frames). A larger read runs as a task of its own, waited for until the
        end of the gather window at most: what it read by then is delivered, and it
        goes on reading for the next batch (it is never cancelled before the receiver
        closes: the client sends its session and link flow frames from inside a read,
        and one cancelled before it was sent would leave the hub without credit to
        send). Reading stops when the batch is full, when a read came back short, or
        ``_GATHER_SECONDS`` after the first event arrived.
        """
        loop = asyncio.get_running_loop()
        deadline = None if max_wait_time is None else loop.time() + max_wait_time
        first_at: float | None = None
        while True:
            before = len(buffer)
            reading = self._reading
            if reading is None:
                frames = self._frames_to_read(max_batch_size - before)
                if frames > _FRAMES_PER_READ:
                    reading = self._reading = asyncio.ensure_future(self._handler.do_work_async(batch=frames))
                    self._reading_frames = frames
            try:
                if reading is None:
                    alive = await self._handler.do_work_async(batch=frames)
                else:
                    frames = self._reading_frames
                    now = loop.time()
                    window = _GATHER_SECONDS if first_at is None else first_at + _GATHER_SECONDS - now
                    if deadline is not None:
                        window = min(window, deadline - now)
                    await asyncio.wait((reading,), timeout=max(window, _MIN_WINDOW))
                    if reading.done():
                        self._reading = None
                        alive = reading.result()
                    else:
                        alive, frames = True, len(buffer) - before + 1  # still reading: not a full read
            except asyncio.CancelledError:
                raise
            except Exception as error:
                await self._drop_consumer()
                raise self._translate(error, "receiving") from None
            if alive is False:
                await self._drop_consumer()
                raise self._link.errors.error(
                    "disconnected", f"the receiver of partition {self.partition_id} (consumer group "
                                    f"{self.consumer_group!r}) was closed by the client")
            count = len(buffer)
            full = count - before >= frames
            self._read_size = min(4 * self._read_size, _MAX_FRAMES_PER_READ) if full else _FRAMES_PER_READ
            if count:
                now = loop.time()
                if first_at is None:
                    first_at = now
                if count >= max_batch_size or not full or now - first_at >= _GATHER_SECONDS:
                    return True
            elif deadline is not None and loop.time() >= deadline:
                return False

    def _forget_delivery_tags(self) -> None:
        """The client's AMQP link (``_pyamqp`` ``ReceiverLink``) adds the tag of every
        delivery it receives to ``_received_delivery_tags`` and removes it only when it
        sends a disposition for it. azure-eventhub never sends one (Event Hubs deliveries
        need no settling), so the set grows by a tag per event for as long as the
        receiver stays open: about 100 bytes per event, 90 MB per million (measured by
        ``python -m benchmarks.soak``). Nothing here settles deliveries, so the tags are
        dropped after each read."""
        tags = getattr(getattr(self._handler, "_link", None), "_received_delivery_tags", None)
        if isinstance(tags, set):
            tags.clear()

    def _frames_to_read(self, room: int) -> int:
        """Frames for the next read: the current read size, never more than the batch has
        room for, nor than the link credit left (asked for more, the client would wait
        out its socket timeout at the end of every credit; at 0 it grants the prefetch
        again before reading)."""
        credit = getattr(getattr(self._handler, "_link", None), "current_link_credit", None)
        if not isinstance(credit, int) or credit <= 0:
            credit = self._prefetch
        return max(1, min(self._read_size, credit, room))

    async def _drop_consumer(self) -> None:
        consumer, self._consumer, self._handler = self._consumer, None, None
        self._buffer = deque()
        reading, self._reading = self._reading, None
        self._read_size = _FRAMES_PER_READ
        if reading is not None:  # the link goes with the consumer: its flow state no longer matters
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        if consumer is not None:
            # The client's close waits for its connection keep-alive task, which sleeps
            # in one-second steps: up to a second per closed receiver, during which a
            # partition being handed over or released waits. Stop that task first.
            handler = getattr(consumer, "_handler", None)
            keep_alive = getattr(handler, "_keep_alive_thread", None)
            if isinstance(keep_alive, asyncio.Future):
                keep_alive.cancel()
                handler._keep_alive_thread = None  # type: ignore[union-attr]
                await asyncio.gather(keep_alive, return_exceptions=True)
            try:
                await consumer.close()
            except Exception:
                logger.debug("closing the consumer of partition %s failed", self.partition_id, exc_info=True)

    async def close(self) -> None:
        self._closed = True
        await self._drop_consumer()

