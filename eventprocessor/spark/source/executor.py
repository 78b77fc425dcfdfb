"""The executors' side of the eventhubs source: the events of one sequence range of a
partition as Arrow record batches (:func:`read_range`, one Spark task).

A task does not receive its events itself. The executor's *reader processes*
(:mod:`.reader_service`, started by the first task that needs one, one per CPU) keep a
:class:`~eventprocessor.spark.source.readahead.PartitionReader` per partition, which goes
on receiving and decoding past each range it served: when the partition's next task
starts, its events are already there as record batches, whichever of the executor's
Python workers runs it, and the task only hands them to Spark. Where no reader process
can run (no Unix sockets), a worker reads in its own process (:class:`WorkerReaders`).

:class:`ReaderPool` is what both keep: the partitions' readers, closed when unused for
2.5 batch intervals (Event Hubs lets 5 readers without an owner level read a partition
per consumer group, and kept readers count).

Example::

    for batch in read_range(options, ReadRange("0", 100, 200)):
        ...
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from .offsets import ReadRange
from .options import SourceOptions
from .readahead import PartitionReader

__all__ = ["read_range", "read_ranges", "ReaderPool", "WorkerReaders", "reader_key"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

ReaderKey = tuple[Any, ...]


def reader_key(options: SourceOptions, partition_id: str) -> ReaderKey:
    """What a kept reader must match to serve a task: the same hub and credentials,
    consumer group, partition, owner level and prefetch."""
    return (options.connection_string, options.consumer_group, partition_id, options.exclusive_receiver,
            options.prefetch_count)


class ReaderPool:
    """The partition readers one process keeps between tasks (on one event loop).

    A task's range is served by a kept reader of its partition that stands at most
    ``max_skip`` events before the range (what it read ahead, or what a task elsewhere
    read, is dropped); otherwise by a new one. A reader unused for ``IDLE_BATCHES``
    batch intervals is closed: the interval is learnt from the planning times the tasks
    carry (``idle`` seconds until one is known), which keeps about three readers per
    partition whatever the cluster's size and the batches' pace. At most ``capacity``
    are kept (least recently used closed first).

    Until two batches were seen the interval is unknown, and the first batch of a query
    is the slow one (executors, Python workers and reader processes start): its readers
    must outlive it, or the second batch receives every range again from the hub (the
    benchmark's 8 partitions took about 10 s to the second batch on 2 cores, and a 5 s
    default closed the readers of the first tasks before it came). Hence 30 s.
    """

    IDLE_BATCHES = 2.5

    def __init__(self, *, idle: float = 30.0, capacity: int = 64, max_skip: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.default_idle = idle
        self.capacity = capacity
        self.max_skip = max_skip
        self._clock = clock
        self._kept: dict[ReaderKey, list[PartitionReader]] = {}
        self._planned: list[float] = []
        self._sweeping: asyncio.Task[None] | None = None
        self.reused = 0
        self.opened = 0

    def note_batch(self, planned_at: float) -> None:
        """Learn the batch interval from the driver's planning time of a task's batch."""
        if planned_at > 0 and planned_at not in self._planned:
            self._planned = sorted([*self._planned, planned_at])[-5:]

    @property
    def idle(self) -> float:
        """Seconds a kept reader may stay unused: ``IDLE_BATCHES`` batch intervals (the
        shortest gap between the batches seen), from 2 s to 120 s."""
        gaps = [b - a for a, b in zip(self._planned, self._planned[1:], strict=False) if b > a]
        if not gaps:
            return self.default_idle
        return min(120.0, max(2.0, self.IDLE_BATCHES * min(gaps)))

    def kept(self) -> int:
        return sum(len(readers) for readers in self._kept.values())

    def take(self, key: ReaderKey, start: int) -> PartitionReader | None:
        """The kept reader of ``key`` that can serve a read from ``start`` (the one with
        the least to skip), out of the pool; None if there is none."""
        readers = self._kept.get(key, [])
        usable = [r for r in readers if r.can_serve(start, self.max_skip)]
        if not usable:
            return None
        reader = min(usable, key=lambda r: start - r.position)
        readers.remove(reader)
        self.reused += 1
        return reader

    def keep(self, key: ReaderKey, reader: PartitionReader) -> None:
        self._kept.setdefault(key, []).append(reader)
        everyone = sorted((r.used_at, id(r), k, r) for k, rs in self._kept.items() for r in rs)
        for _used, _id, old_key, old in everyone[:max(0, len(everyone) - self.capacity)]:
            self._forget(old_key, old)
        if self._sweeping is None or self._sweeping.done():
            self._sweeping = asyncio.ensure_future(self._sweep())

    def _forget(self, key: ReaderKey, reader: PartitionReader) -> None:
        readers = self._kept.get(key, [])
        if reader in readers:
            readers.remove(reader)
        if not readers:
            self._kept.pop(key, None)
        asyncio.ensure_future(reader.close())

    async def _sweep(self) -> None:
        """Close readers unused for ``idle`` seconds, until none is kept."""
        while self._kept:
            await asyncio.sleep(min(1.0, self.idle / 4))
            now, idle = self._clock(), self.idle
            for key, readers in list(self._kept.items()):
                for reader in list(readers):
                    if now - reader.used_at > idle:
                        self._forget(key, reader)

    def _reader_for(self, options: SourceOptions, read: ReadRange) -> PartitionReader:
        self.note_batch(read.planned_at)
        reader = self.take(reader_key(options, read.partition_id), read.from_sequence_number)
        if reader is None:
            reader = PartitionReader(options, read.partition_id, read.from_sequence_number,
                                     ahead=max(read.count, options.prefetch_count), clock=self._clock)
            self.opened += 1
        return reader

    def prepare(self, options: SourceOptions, read: ReadRange) -> None:
        """A task will read ``read`` after its other ranges: have its reader receive it
        meanwhile (a task reading several partitions' ranges waits for none but the
        first)."""
        reader = self._reader_for(options, read)
        reader.ahead = max(reader.ahead, read.until_sequence_number - reader.position)
        reader.read_ahead()
        self.keep(reader_key(options, read.partition_id), reader)

    async def read(self, options: SourceOptions, read: ReadRange) -> AsyncIterator[pa.RecordBatch]:
        """One task's range, from a kept reader or a new one; the reader is kept for the
        range that starts where this one ends (not when the task stopped early)."""
        key = reader_key(options, read.partition_id)
        reader = self._reader_for(options, read)
        clean = False
        try:
            async for batch in reader.read(read.from_sequence_number, read.until_sequence_number, read):
                yield batch
            clean = True
        finally:
            if clean:
                self.keep(key, reader)
            else:
                await reader.close()

    async def close(self) -> None:
        sweeping, self._sweeping = self._sweeping, None
        if sweeping is not None:
            sweeping.cancel()
        readers = [r for rs in self._kept.values() for r in rs]
        self._kept.clear()
        await asyncio.gather(*(r.close() for r in readers), return_exceptions=True)


class WorkerReaders:
    """A :class:`ReaderPool` on an event loop in a daemon thread of this process: a
    Python worker reading in its own process (where no reader process can run), and
    tests. Spark calls a reader synchronously; :meth:`read_range` is a plain iterator."""

    def __init__(self, **pool_options: Any) -> None:
        self._pool_options = pool_options
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: ReaderPool | None = None

    @property
    def pool(self) -> ReaderPool:
        self._running_loop()
        assert self._pool is not None
        return self._pool

    def run(self, coroutine: Awaitable[_T]) -> _T:
        """Run a coroutine on the readers' loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._running_loop()).result()  # type: ignore[arg-type]

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="eventhubs-readers", daemon=True).start()
                self._loop = loop
                self._pool = ReaderPool(**self._pool_options)
            return self._loop

    def prepare(self, options: SourceOptions, reads: Sequence[ReadRange]) -> None:
        async def prepare_all() -> None:
            for read in reads:
                self.pool.prepare(options, read)

        self.run(prepare_all())

    def read_range(self, options: SourceOptions, read: ReadRange) -> Iterator[pa.RecordBatch]:
        if read.count <= 0:
            return
        batches = self.pool.read(options, read)
        assert isinstance(batches, AsyncGenerator)
        try:
            while True:
                try:
                    yield self.run(batches.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self.run(batches.aclose())


WORKER_READERS = WorkerReaders()
"""This Python worker's own readers, where no reader process can run."""


def read_range(options: SourceOptions, read: ReadRange, *,
               readers: WorkerReaders | None = None) -> Iterator[pa.RecordBatch]:
    """The events ``[from, until)`` of one partition as Arrow record batches (on an
    executor), from the executor's reader process for that partition, or with
    ``readers`` (a :class:`WorkerReaders`) in this process. Fails if an event the driver
    saw in the hub does not arrive within ``eventhubs.receiverTimeout``; with
    ``failOnDataLoss`` it fails if the range starts below the oldest event the hub
    still holds, else it logs the gap and goes on."""
    if read.count <= 0:
        return iter(())
    if readers is not None:
        return readers.read_range(options, read)
    from .reader_service import service_available, service_read_range

    if not service_available():
        return WORKER_READERS.read_range(options, read)
    return service_read_range(options, read)


def read_ranges(options: SourceOptions, reads: Sequence[ReadRange], *,
                readers: WorkerReaders | None = None) -> Iterator[pa.RecordBatch]:
    """The ranges of one task, one after the other; the readers of all but the first
    receive theirs meanwhile."""
    reads = [r for r in reads if r.count > 0]
    if len(reads) > 1:
        if readers is None:
            from .reader_service import service_available, service_prepare

            if service_available():
                service_prepare(options, reads[1:])
            else:
                WORKER_READERS.prepare(options, reads[1:])
        else:
            readers.prepare(options, reads[1:])
    for read in reads:
        yield from read_range(options, read, readers=readers)
