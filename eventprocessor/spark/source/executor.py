"""The executors' side of the eventhubs source: the events of one sequence range of a
partition as Arrow record batches (:func:`read_range`, one Spark task), over the
receivers an executor's Python worker keeps open between tasks
(:class:`WorkerReceivers`).

Spark calls a reader synchronously; the receivers live on an event loop in a daemon
thread of the worker, so their connections are serviced between tasks too. The
driver's side (partition properties, starting positions) is :mod:`.hub`.

Example::

    for batch in read_range(options, ReadRange("0", 100, 200)):
        ...
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from ...errors import EventSourceError, ReceiverDisconnectedError
from ...events import Event, EventPosition
from ...sources.eventhub import EventHubSource
from .hub import event_hub_source
from .offsets import DataLossError, ReadRange
from .options import SourceOptions
from .rows import events_to_record_batch

__all__ = ["read_range", "RECORD_BATCH_ROWS", "OpenReceiver", "WorkerReceivers", "WORKER_RECEIVERS"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

RECORD_BATCH_ROWS = 8192
"""Events per Arrow record batch handed to Spark."""


@dataclass
class OpenReceiver:
    """A receiver a worker keeps, with the source that opened it and the sequence number
    it stands before."""

    source: EventHubSource
    receiver: Any
    next_sequence_number: int
    used_at: float = 0.0


class WorkerReceivers:
    """The receivers one executor Python worker keeps open between tasks.

    Spark reuses a Python worker for task after task, and a streaming query reads each
    partition from where its previous batch ended. Opening a receiver costs a
    connection, a CBS handshake and an attach (about half a second with azure-eventhub),
    so a worker keeps the receiver of each range it read, positioned at the range's end,
    and the next task of that partition on this worker takes it over (its prefetched
    events included), skipping up to ``max_skip`` events when another worker read the
    ranges in between (reading and dropping a few thousand events costs far less than
    a new receiver).
    The receivers live on an event loop in a daemon thread of the worker, so their
    connections keep being serviced between tasks; one unused for ``idle`` seconds is
    closed, and at most ``capacity`` are kept (least recently used closed first). A
    reused receiver whose connection dropped meanwhile is replaced by a new one.

    Event Hubs lets 5 receivers without an owner level read one partition of a consumer
    group, and kept receivers count. A batch has one task per partition, so a partition
    gains at most one new receiver per batch: a kept receiver is closed once it has been
    unused for ``IDLE_BATCHES`` batch intervals (the interval is learnt from the planning
    times the tasks carry; ``idle`` seconds until one is known), which keeps about three
    per partition whatever the cluster's size and the batches' pace. When the hub
    refuses a receiver all the same (other readers of the group), the task waits for a
    slot, up to ``eventhubs.receiverTimeout``.
    """

    IDLE_BATCHES = 2.5

    def __init__(self, *, idle: float = 5.0, capacity: int = 16, max_skip: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.default_idle = idle
        self.capacity = capacity
        self.max_skip = max_skip
        self._clock = clock
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kept: OrderedDict[tuple[Any, ...], OpenReceiver] = OrderedDict()
        self._planned: list[float] = []
        self.reused = 0
        self.opened = 0

    def note_batch(self, planned_at: float) -> None:
        """Learn the batch interval from the driver's planning time of a task's batch."""
        if planned_at <= 0:
            return
        with self._lock:
            if planned_at not in self._planned:
                self._planned = sorted([*self._planned, planned_at])[-5:]

    @property
    def idle(self) -> float:
        """Seconds a kept receiver may stay unused: ``IDLE_BATCHES`` batch intervals (the
        shortest gap between the batches this worker saw), from 2 s to 120 s."""
        with self._lock:
            gaps = [b - a for a, b in zip(self._planned, self._planned[1:], strict=False) if b > a]
        if not gaps:
            return self.default_idle
        return min(120.0, max(2.0, self.IDLE_BATCHES * min(gaps)))

    def run(self, coroutine: Awaitable[_T]) -> _T:
        """Run a coroutine on the worker's receiver loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._running_loop()).result()  # type: ignore[arg-type]

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="eventhubs-receivers", daemon=True).start()
                self._loop = loop
            return self._loop

    def take(self, key: tuple[Any, ...], sequence_number: int) -> OpenReceiver | None:
        """The kept receiver of ``key`` if it stands at most ``max_skip`` events before
        ``sequence_number`` and was used within ``idle`` seconds."""
        with self._lock:
            kept = self._kept.pop(key, None)
        if kept is None:
            return None
        ahead = sequence_number - kept.next_sequence_number
        if 0 <= ahead <= self.max_skip and self._clock() - kept.used_at <= self.idle:
            self.reused += 1
            return kept
        self.discard(kept)
        return None

    def keep(self, key: tuple[Any, ...], receiver: OpenReceiver) -> None:
        receiver.used_at = self._clock()
        with self._lock:
            self._kept[key] = receiver
            self._kept.move_to_end(key)
            evicted = []
            while len(self._kept) > self.capacity:
                evicted.append(self._kept.popitem(last=False)[1])
        for old in evicted:
            self.discard(old)
        loop = self._running_loop()
        loop.call_soon_threadsafe(loop.call_later, self.idle + 0.5, self._expire, key, receiver)

    def _expire(self, key: tuple[Any, ...], receiver: OpenReceiver) -> None:
        idle = self.idle
        with self._lock:
            if self._kept.get(key) is not receiver:
                return
            left = idle - (self._clock() - receiver.used_at)
            if left > 0:  # the interval grew meanwhile: look again then
                asyncio.get_running_loop().call_later(left + 0.5, self._expire, key, receiver)
                return
            del self._kept[key]
        asyncio.ensure_future(_close(receiver))

    def discard(self, receiver: OpenReceiver) -> None:
        """Close a receiver that will not be used again (in the background)."""
        asyncio.run_coroutine_threadsafe(_close(receiver), self._running_loop())

    def kept(self) -> int:
        with self._lock:
            return len(self._kept)


async def _close(opened: OpenReceiver) -> None:
    try:
        await opened.receiver.close()
        await opened.source.close()
    except Exception:
        logger.debug("closing a kept receiver failed", exc_info=True)


WORKER_RECEIVERS = WorkerReceivers()
"""The receivers of this Python process (an executor's Python worker)."""


def read_range(options: SourceOptions, read: ReadRange, *, rows_per_batch: int = RECORD_BATCH_ROWS,
               receivers: WorkerReceivers | None = None) -> Iterator[pa.RecordBatch]:
    """The events ``[from, until)`` of one partition as Arrow record batches (on an
    executor). Fails if an event the driver saw in the hub does not arrive within
    ``eventhubs.receiverTimeout``; with ``failOnDataLoss`` it fails if the range starts
    below the oldest event the hub still holds, else it logs the gap and goes on. The
    receiver is kept for the range that starts where this one ends
    (:class:`WorkerReceivers`)."""
    if read.count <= 0:
        return
    pool = receivers or WORKER_RECEIVERS
    pool.note_batch(read.planned_at)
    owner_level = 0 if options.exclusive_receiver else None
    key = (options.connection_string, options.consumer_group, read.partition_id, owner_level, options.prefetch_count)
    opened = pool.take(key, read.from_sequence_number)
    reused = opened is not None

    async def open_new() -> OpenReceiver:
        source = event_hub_source(options)
        receiver = await source.open_receiver(
            read.partition_id, consumer_group=options.consumer_group,
            starting_position=EventPosition.from_sequence_number(read.from_sequence_number, inclusive=True),
            owner_level=owner_level, prefetch=options.prefetch_count)
        pool.opened += 1
        return OpenReceiver(source, receiver, read.from_sequence_number)

    if opened is None:
        opened = pool.run(open_new())
    deadline = time.monotonic() + options.receiver_timeout
    clean = False
    try:
        expected = read.from_sequence_number
        pending: list[Event] = []
        while expected < read.until_sequence_number:
            want = min(read.until_sequence_number - expected, rows_per_batch * 2)
            try:
                events = pool.run(opened.receiver.receive(want, options.receiver_timeout))
            except (EventSourceError, ReceiverDisconnectedError) as error:
                if expected != read.from_sequence_number:
                    raise
                if not reused and not (_receiver_limit(error) and time.monotonic() < deadline):
                    if _receiver_limit(error):
                        raise EventSourceError(
                            f"partition {read.partition_id} of {options.eventhub_name!r}: the hub refused a receiver "
                            f"for {options.receiver_timeout:g} s (eventhubs.receiverTimeout): consumer group "
                            f"{options.consumer_group!r} already has the 5 readers without an owner level Event Hubs "
                            "allows per partition (other queries or consumers, or receivers kept by executor "
                            "workers); give this query a consumer group of its own",
                            fully_qualified_namespace=options.fully_qualified_namespace,
                            eventhub_name=options.eventhub_name, reason="refused") from None
                    raise
                if reused:
                    # A kept receiver whose connection dropped (or was taken over) while it waited.
                    logger.debug("partition %s: the kept receiver failed (%s); opening a new one", read.partition_id,
                                 error)
                else:
                    # Event Hubs lets 5 receivers without an owner level read a partition per consumer
                    # group; the others may be receivers other workers keep (closed when idle): wait.
                    logger.info("partition %s: the hub refused a receiver (%s); trying again", read.partition_id,
                                str(error)[:200])
                    time.sleep(0.5)
                pool.discard(opened)
                reused = False
                opened = pool.run(open_new())
                continue
            reused = False
            if not events:
                raise EventSourceError(
                    f"partition {read.partition_id} of {options.eventhub_name!r}: no event arrived in "
                    f"{options.receiver_timeout:g} s (eventhubs.receiverTimeout) although the hub reported events up "
                    f"to sequence number {read.until_sequence_number - 1}; waiting for {expected}",
                    fully_qualified_namespace=options.fully_qualified_namespace, eventhub_name=options.eventhub_name,
                    reason="timeout")
            first = events[0].sequence_number
            if first > expected:
                _gap(options, read, expected, first)
            for event in events:
                seq = event.sequence_number
                if seq < expected:
                    continue
                if seq >= read.until_sequence_number:
                    raise _Overshot()
                pending.append(event)
                expected = seq + 1
            if len(pending) >= rows_per_batch or expected >= read.until_sequence_number:
                yield events_to_record_batch(read.partition_id, pending)
                pending = []
        if pending:
            yield events_to_record_batch(read.partition_id, pending)
        clean = True
    except _Overshot:
        # Only after a gap (expired events): the receiver went past this range, so it
        # cannot serve the next one; what it read of this range is complete.
        if pending:
            yield events_to_record_batch(read.partition_id, pending)
    finally:
        if clean:
            opened.next_sequence_number = read.until_sequence_number
            pool.keep(key, opened)
        else:
            pool.discard(opened)


class _Overshot(Exception):
    pass


def _receiver_limit(error: BaseException) -> bool:
    """The hub refused a receiver because the partition has as many readers as it allows."""
    text = str(error).lower()
    return "resource-limit" in text or "receivers per partition" in text


def _gap(options: SourceOptions, read: ReadRange, expected: int, first: int) -> None:
    message = (f"partition {read.partition_id} of {options.eventhub_name!r}: the query was to read from sequence "
               f"number {expected}, but the first event the hub returned is {first}; {first - expected} events "
               "expired (retention) before they were read")
    if options.fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to go on without them",
                            fully_qualified_namespace=options.fully_qualified_namespace,
                            eventhub_name=options.eventhub_name, reason="refused")
    logger.warning("%s; going on (failOnDataLoss=false)", message)
