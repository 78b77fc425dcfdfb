"""One partition of a hub, received and decoded ahead of the Spark tasks that read it.

A :class:`PartitionReader` keeps a receiver open between tasks. After each task it goes
on receiving past the end of the range it served, up to ``ahead`` events (about the
partition's share of a batch), and turns what arrives into Arrow record batches as it
arrives. So when the partition's next task asks for ``[from, until)``, its events are
already here, decoded: the task only hands the batches to Spark. Reading ahead stops
when ``ahead`` events wait (the receiver's link credit then holds the hub back), and
goes on as a task takes them.

Everything runs on one event loop (the executor's reader process, see
:mod:`.reader_service`); :meth:`PartitionReader.read` is an async iterator of record
batches. A receive failure (a dropped connection, a link taken over) reopens the
receiver right where the buffered events end, so neither a gap nor a repeat follows.

Example::

    reader = PartitionReader(options, "0", position=100, ahead=5000)
    async for batch in reader.read(100, 200):
        ...
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import EventSourceError, ReceiverDisconnectedError
from ...events import EventPosition
from .hub import event_hub_source
from .offsets import DataLossError, ReadRange
from .options import SourceOptions
from .rows import events_to_record_batch, messages_to_record_batch

__all__ = ["PartitionReader", "MAX_AHEAD"]

logger = logging.getLogger(__name__)

MAX_AHEAD = 100_000
"""Events a partition's reader holds ahead of its tasks at most."""

_CHUNK = 4096  # events per receive while reading ahead
_WAIT = 1.0  # seconds one receive waits for events while reading ahead
_REOPENS = 5  # receive failures in a row (nothing received in between) before a task fails
_SEQUENCE = 3  # the sequenceNumber column of the record batches
_COALESCE_ROWS = 10_000  # rows a record batch handed to a task gathers at most (Spark's Arrow batch size)
_COALESCE_BYTES = 16 << 20  # and bytes


class PartitionReader:
    """The receiver of one partition and the events it received ahead (see the module
    docstring). ``position`` is the sequence number of the next event a task gets."""

    def __init__(self, options: SourceOptions, partition_id: str, position: int, *, ahead: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.partition_id = partition_id
        self.position = position
        self.ahead = max(1, min(ahead, MAX_AHEAD))
        self._clock = clock
        self._source: Any = None
        self._receiver: Any = None
        self._batches: deque[pa.RecordBatch] = deque()
        self._count = 0  # events buffered
        self._end = position  # the sequence number after the last one buffered
        self._arrived = asyncio.Event()
        self._failure: BaseException | None = None
        self._failures = 0
        self._refused: BaseException | None = None  # the hub's last refusal of a receiver (its reader limit)
        self._filling: asyncio.Task[None] | None = None
        self._closed = False
        self.used_at = clock()
        self.opened = 0
        self.received = 0
        self.dropped = 0

    def __repr__(self) -> str:
        return (f"PartitionReader(partition={self.partition_id!r}, position={self.position}, "
                f"buffered={self._count}, ahead={self.ahead})")

    @property
    def buffered(self) -> int:
        return self._count

    # ------------------------------------------------------------------ reading ahead

    def read_ahead(self) -> None:
        """Receive (in the background) until ``ahead`` events wait."""
        if self._closed or (self._filling is not None and not self._filling.done()):
            return
        if self._count < self.ahead:
            self._filling = asyncio.ensure_future(self._fill())

    async def _fill(self) -> None:
        try:
            while not self._closed and self._count < self.ahead:
                if self._receiver is None:
                    await self._open()
                batch = await self._receive(min(_CHUNK, self.ahead - self._count))
                if batch is not None:
                    self._append(batch)
                    self._failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._failure = error
            self._arrived.set()

    async def _receive(self, count: int) -> pa.RecordBatch | None:
        """Up to ``count`` events as a record batch (None: none came in ``_WAIT``): made
        straight from the received messages where the receiver hands them over (the
        lean receive path), else from its events."""
        receive_messages = getattr(self._receiver, "receive_messages", None)
        if receive_messages is not None:
            messages = await receive_messages(count, _WAIT)
            return messages_to_record_batch(self.partition_id, messages) if messages else None
        events = await self._receiver.receive(count, _WAIT)
        return events_to_record_batch(self.partition_id, events) if events else None

    def _append(self, batch: pa.RecordBatch) -> None:
        self._batches.append(batch)
        self._count += batch.num_rows
        self.received += batch.num_rows
        self._end = batch.column(_SEQUENCE)[-1].as_py() + 1
        self._refused = None
        self._arrived.set()

    async def _open(self) -> None:
        """A receiver at ``_end``, the first event not buffered yet."""
        options = self.options
        source = event_hub_source(options)
        try:
            receiver = await source.open_receiver(
                self.partition_id, consumer_group=options.consumer_group,
                starting_position=EventPosition.from_sequence_number(self._end, inclusive=True),
                owner_level=0 if options.exclusive_receiver else None, prefetch=options.prefetch_count)
        except BaseException:
            await source.close()
            raise
        self._source, self._receiver = source, receiver
        self.opened += 1

    async def _drop_receiver(self) -> None:
        receiver, source = self._receiver, self._source
        self._receiver = self._source = None
        try:
            if receiver is not None:
                await receiver.close()
            if source is not None:
                await source.close()
        except Exception:
            logger.debug("closing the receiver of partition %s failed", self.partition_id, exc_info=True)

    async def _stop_filling(self) -> None:
        filling, self._filling = self._filling, None
        if filling is not None and not filling.done():
            filling.cancel()
            await asyncio.gather(filling, return_exceptions=True)

    # ------------------------------------------------------------------ serving a task

    def can_serve(self, start: int, max_skip: int) -> bool:
        """Whether a read from ``start`` may use this reader: at or after its position,
        skipping at most ``max_skip`` events (received ahead, or still to receive:
        reading and dropping a few thousand events costs far less than a new receiver)."""
        return self.position <= start <= self.position + max_skip

    async def read(self, start: int, until: int, read: ReadRange | None = None) -> AsyncIterator[pa.RecordBatch]:
        """The events ``[start, until)``, as record batches, in order. Waits up to
        ``eventhubs.receiverTimeout`` for each next event. ``read`` names the task's
        range in errors (default: ``[start, until)``)."""
        assert self.position <= start, "a reader never goes back"
        read = read or ReadRange(self.partition_id, start, until)
        self.used_at = self._clock()
        self.position = start  # what is buffered below it is dropped as it comes
        oldest = self._batches[0].column(_SEQUENCE)[0].as_py() if self._batches else self._end
        self.ahead = max(1, min(max(self.ahead, until - oldest), MAX_AHEAD))
        while self.position < until:
            batch = await self._next(until, read)
            if batch is None:
                continue
            # What is received already goes with it: one record batch (one frame to the
            # task, one Arrow batch to Spark) instead of one per receive, and no turn of
            # the event loop (where reading ahead decodes) between them.
            parts = [batch]
            rows, size = batch.num_rows, batch.nbytes
            while self.position < until and self._batches and self._failure is None \
                    and rows < _COALESCE_ROWS and size < _COALESCE_BYTES:
                more = await self._next(until, read)
                if more is not None:
                    parts.append(more)
                    rows, size = rows + more.num_rows, size + more.nbytes
            yield _concat(parts)
        # The next task of this partition likely asks for about as many: read them now.
        self.ahead = max(1, min(max(until - start, self.options.prefetch_count), MAX_AHEAD))
        self.used_at = self._clock()
        self.read_ahead()

    async def _next(self, until: int, read: ReadRange) -> pa.RecordBatch | None:
        """The next record batch from ``position`` and below ``until`` (None: nothing to
        hand over this time)."""
        batch = await self._head(read)
        first = batch.column(_SEQUENCE)[0].as_py()
        if first > self.position:
            gap(self.options, read, self.position, first)
            self.position = first
        if first >= until:
            self.position = until  # the rest of the range expired (failOnDataLoss=false)
            return None
        take = _below(batch, until)
        if take == batch.num_rows:
            self._batches.popleft()
        else:
            self._batches[0] = batch.slice(take)
            batch = batch.slice(0, take)
        self._count -= take
        self.position = batch.column(_SEQUENCE)[-1].as_py() + 1
        return batch

    async def _head(self, read: ReadRange) -> pa.RecordBatch:
        """The first buffered batch, from ``position`` on (rows below it, which a task
        elsewhere read, are dropped), waiting for events to arrive."""
        deadline = self._clock() + self.options.receiver_timeout
        while True:
            if not self._batches:
                deadline = await self._wait(deadline, read)
                continue
            batch = self._batches[0]
            skip = _below(batch, self.position)
            if not skip:
                return batch
            self.dropped += skip
            self._count -= skip
            if skip < batch.num_rows:
                batch = self._batches[0] = batch.slice(skip)
                return batch
            self._batches.popleft()

    async def _wait(self, deadline: float, read: ReadRange) -> float:
        """Wait for events to arrive (reading ahead); the deadline after progress."""
        if self._failure is not None:
            await self._recover(read)
        self._arrived.clear()
        self.read_ahead()
        left = deadline - self._clock()
        if left <= 0 and self._refused is not None:
            raise EventSourceError(
                f"partition {self.partition_id} of {self.options.eventhub_name!r}: the hub refused a receiver "
                f"for {self.options.receiver_timeout:g} s (eventhubs.receiverTimeout): consumer group "
                f"{self.options.consumer_group!r} already has the 5 readers without an owner level Event Hubs "
                "allows per partition (other queries or consumers, or receivers kept by executors); give this "
                "query a consumer group of its own",
                fully_qualified_namespace=self.options.fully_qualified_namespace,
                eventhub_name=self.options.eventhub_name, reason="refused")
        if left <= 0:
            raise EventSourceError(
                f"partition {self.partition_id} of {self.options.eventhub_name!r}: no event arrived in "
                f"{self.options.receiver_timeout:g} s (eventhubs.receiverTimeout) although the hub reported "
                f"events up to sequence number {read.until_sequence_number - 1}; waiting for {self.position}",
                fully_qualified_namespace=self.options.fully_qualified_namespace,
                eventhub_name=self.options.eventhub_name, reason="timeout")
        try:
            await asyncio.wait_for(self._arrived.wait(), left)
        except asyncio.TimeoutError:
            return deadline
        return self._clock() + self.options.receiver_timeout if self._batches else deadline

    async def _recover(self, read: ReadRange) -> None:
        """A receive failed: reopen where the buffered events end, or give up after
        ``_REOPENS`` failures in a row. The hub refusing a receiver because the
        partition has its 5 readers is waited out (up to the receiver timeout, then
        :meth:`_wait` says so)."""
        error, self._failure = self._failure, None
        assert error is not None
        await self._drop_receiver()
        self._failures += 1
        if _receiver_limit(error):
            # Other readers hold the partition's slots: wait for one (up to the receiver timeout).
            self._refused = error
            self._failures = 0
            logger.info("partition %s: the hub refused a receiver (%s); trying again", self.partition_id,
                        str(error)[:200])
            await asyncio.sleep(0.5)
            return
        if self._failures > _REOPENS or not isinstance(error, (EventSourceError, ReceiverDisconnectedError)):
            raise error
        logger.info("partition %s: receiving failed (%s); reopening at sequence number %s", self.partition_id,
                    str(error)[:200], self._end)

    async def close(self) -> None:
        self._closed = True
        await self._stop_filling()
        await self._drop_receiver()
        self._batches.clear()
        self._count = 0


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One record batch of ``batches`` (same schema), in order."""
    if len(batches) == 1:
        return batches[0]
    concat = getattr(pa, "concat_batches", None)  # pyarrow 19 and later
    if concat is not None:
        return concat(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _below(batch: pa.RecordBatch, sequence_number: int) -> int:
    """How many rows of ``batch`` (in sequence order) are below ``sequence_number``."""
    return int(pc.sum(pc.less(batch.column(_SEQUENCE), sequence_number)).as_py() or 0)


def _receiver_limit(error: BaseException) -> bool:
    """The hub refused a receiver because the partition has as many readers as it allows."""
    text = str(error).lower()
    return "resource-limit" in text or "receivers per partition" in text


def gap(options: SourceOptions, read: ReadRange, expected: int, first: int) -> None:
    """Events ``[expected, first)`` expired before they were read: fail the task
    (``failOnDataLoss``, the default) or log it and go on."""
    message = (f"partition {read.partition_id} of {options.eventhub_name!r}: the query was to read from sequence "
               f"number {expected}, but the first event the hub returned is {first}; {first - expected} events "
               "expired (retention) before they were read")
    if options.fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to go on without them",
                            fully_qualified_namespace=options.fully_qualified_namespace,
                            eventhub_name=options.eventhub_name, reason="refused")
    logger.warning("%s; going on (failOnDataLoss=false)", message)
