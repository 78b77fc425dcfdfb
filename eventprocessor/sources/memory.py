"""An in-process partitioned log with Event Hubs' receive semantics.

For tests, demos and benchmarks: sequence numbers and offsets per partition, enqueued
times, starting positions, partition keys hashed to a stable partition, partitions
added at run time, owner-level (epoch) receivers, and retention by count
(``max_events_per_partition``), so that a long run keeps a bounded window of the log
as Event Hubs' retention does.
"""
from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigurationError, EventSourceError, ReceiverDisconnectedError
from ..events import BodyType, Event, EventPosition, MessageId, body_fields
from .base import EventSource, LastEnqueuedEventProperties, PartitionProperties, PartitionReceiver

__all__ = ["InMemoryEventSource"]

logger = logging.getLogger(__name__)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


_UNSET: Any = object()
Body = bytes | str | Sequence[bytes | str]
"""A data body: bytes or str (one data section), or a list of them (one section each)."""


def _body_fields(body: Any, sequence_body: Any, value_body: Any) -> tuple[bytes, BodyType, Any]:
    """An appended event's body fields, from the arguments as ``AmqpAnnotatedMessage`` takes them."""
    given = [name for name, value in (("body", body), ("sequence_body", sequence_body), ("value_body", value_body))
             if value is not _UNSET]
    if len(given) != 1:
        raise ConfigurationError(
            f"give exactly one of body (data), sequence_body or value_body, got {', '.join(given) or 'none'}")
    if body is not _UNSET:
        sections: list[Any]
        if isinstance(body, (bytes, bytearray, str)):
            sections = [body]
        elif isinstance(body, (list, tuple)) and body:
            sections = list(body)
        else:
            raise TypeError(f"body must be bytes, str or a non-empty list of them (one data section each), not "
                            f"{type(body).__name__}")
        for section in sections:
            if not isinstance(section, (bytes, bytearray, str)):
                raise TypeError(f"a data section must be bytes or str, not {type(section).__name__}")
        return body_fields(BodyType.DATA, [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in sections])
    if sequence_body is not _UNSET:
        # As AmqpAnnotatedMessage(sequence_body=...): a list of lists is several sections,
        # any other list is one.
        if not isinstance(sequence_body, list) or not sequence_body:
            raise TypeError("sequence_body must be a non-empty list (one sequence section) or a list of lists "
                            f"(one section each), not {type(sequence_body).__name__} {sequence_body!r}")
        sections = sequence_body if all(isinstance(s, list) for s in sequence_body) else [sequence_body]
        return body_fields(BodyType.SEQUENCE, [list(s) for s in sections])
    return body_fields(BodyType.VALUE, value_body)


class _Partition:
    """One partition's log. ``events[head:]`` are the retained events; ``dropped`` events
    were removed from the front of the list before, so ``events[i]`` has sequence number
    ``dropped + i``. Retention moves ``head`` and compacts the list now and then, which
    keeps dropping old events O(1) amortised."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.head = 0
        self.dropped = 0
        self.next_offset = 0
        self.waiters: list[asyncio.Future] = []
        # consumer group -> receivers currently open on this partition
        self.receivers: dict[str, list[InMemoryPartitionReceiver]] = {}

    @property
    def begin(self) -> int:
        """Sequence number of the oldest retained event."""
        return self.dropped + self.head

    @property
    def end(self) -> int:
        """Sequence number the next event gets."""
        return self.dropped + len(self.events)

    def retained(self) -> list[Event]:
        return self.events[self.head:]

    def retain(self, limit: int | None) -> None:
        if limit is None:
            return
        excess = len(self.events) - self.head - limit
        if excess > 0:
            self.head += excess
        if self.head > 1024 and self.head * 2 > len(self.events):
            del self.events[:self.head]
            self.dropped += self.head
            self.head = 0

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class InMemoryPartitionReceiver(PartitionReceiver):
    """A receiver on one partition of a :class:`InMemoryEventSource`."""

    def __init__(self, source: InMemoryEventSource, partition_id: str, consumer_group: str,
                 next_sequence_number: int, owner_level: int | None, track_last_enqueued: bool = False) -> None:
        self._source = source
        self.partition_id = partition_id
        self.consumer_group = consumer_group
        self.owner_level = owner_level
        self._next = next_sequence_number
        self._disconnected_by: int | None = None
        self._dropped_by_hub = False
        self._closed = False
        self._track = track_last_enqueued
        self._last_enqueued: LastEnqueuedEventProperties | None = None

    @property
    def last_enqueued_event_properties(self) -> LastEnqueuedEventProperties | None:
        return self._last_enqueued

    def _note_last_enqueued(self, events: list[Event]) -> None:
        if self._track and events:
            newest = events[-1]
            self._last_enqueued = LastEnqueuedEventProperties(newest.sequence_number, newest.offset,
                                                              newest.enqueued_time, self._source._clock())

    def __repr__(self) -> str:
        return (f"InMemoryPartitionReceiver(partition_id={self.partition_id!r}, "
                f"consumer_group={self.consumer_group!r}, owner_level={self.owner_level})")

    def _disconnect(self, by_level: int | None) -> None:
        self._disconnected_by = by_level if by_level is not None else -1
        self._source._partitions[self.partition_id].wake()

    def _check(self) -> None:
        if self._dropped_by_hub:
            raise EventSourceError(f"receiver on partition {self.partition_id}: the link was detached (the "
                                   "partition was recreated)", reason="disconnected")
        if self._disconnected_by is not None:
            raise ReceiverDisconnectedError(
                f"receiver on partition {self.partition_id} (owner level {self.owner_level}) was disconnected: "
                f"a receiver with owner level {self._disconnected_by} took the partition for consumer group "
                f"{self.consumer_group!r}",
                partition_id=self.partition_id,
            )
        if self._closed:
            raise RuntimeError("receiver is closed")

    async def receive(self, max_batch_size: int, max_wait_time: float | None) -> list[Event]:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        partition = self._source._partitions[self.partition_id]
        loop = asyncio.get_running_loop()
        deadline = None if max_wait_time is None else loop.time() + max_wait_time
        while True:
            self._check()
            if self._next < partition.end:
                # Events dropped by retention before this receiver got to them are gone,
                # as on Event Hubs: it goes on from the oldest retained one.
                start = max(self._next, partition.begin) - partition.dropped
                batch = partition.events[start:start + max_batch_size]
                self._next = partition.dropped + start + len(batch)
                self._note_last_enqueued(partition.events)
                return batch
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                return []
            waiter = loop.create_future()
            partition.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, timeout)
            except asyncio.TimeoutError:
                return []
            finally:
                if waiter in partition.waiters:
                    partition.waiters.remove(waiter)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        group = self._source._partitions[self.partition_id].receivers.get(self.consumer_group, [])
        if self in group:
            group.remove(self)


class InMemoryEventSource(EventSource):
    """An in-process partitioned log.

    Every event is kept unless ``max_events_per_partition`` is given: then each partition
    keeps its newest ``max_events_per_partition`` events, like a hub's retention, and a
    long-running producer does not grow the process without bound.

    Example::

        source = InMemoryEventSource(4)
        await source.send(b"hello", partition_key="device-7")
        await source.send(b"round robin")
        source.add_partitions(2)

        bounded = InMemoryEventSource(4, max_events_per_partition=10_000)
    """

    def __init__(self, partition_count: int, *, eventhub_name: str = "hub",
                 fully_qualified_namespace: str = "memory.local",
                 clock: Callable[[], datetime] | None = None,
                 max_events_per_partition: int | None = None) -> None:
        if isinstance(partition_count, bool) or not isinstance(partition_count, int) or partition_count < 1:
            raise ConfigurationError(f"partition_count must be an int of at least 1, got {partition_count!r}")
        if max_events_per_partition is not None and (isinstance(max_events_per_partition, bool)
                                                     or not isinstance(max_events_per_partition, int)
                                                     or max_events_per_partition < 1):
            raise ConfigurationError(f"max_events_per_partition must be an int of at least 1 (or None to keep every "
                                     f"event), got {max_events_per_partition!r}")
        self.max_events_per_partition = max_events_per_partition
        for name, value in (("eventhub_name", eventhub_name), ("fully_qualified_namespace", fully_qualified_namespace)):
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"{name} must be a non-empty string, got {value!r}")
        self.eventhub_name = eventhub_name
        self.fully_qualified_namespace = fully_qualified_namespace
        self._clock = clock or _utcnow
        self._partitions: dict[str, _Partition] = {str(i): _Partition() for i in range(partition_count)}
        self._round_robin = itertools.count()

    def __repr__(self) -> str:
        return (f"InMemoryEventSource(partition_count={len(self._partitions)}, eventhub_name={self.eventhub_name!r}, "
                f"fully_qualified_namespace={self.fully_qualified_namespace!r})")

    @property
    def partition_count(self) -> int:
        return len(self._partitions)

    async def get_partition_ids(self) -> list[str]:
        return list(self._partitions)

    def recreate(self) -> None:
        """Drop every event of every partition and start sequence numbers and offsets at 0
        again, as a deleted and recreated hub (or an emulator restarted empty) does. Open
        receivers are detached."""
        for partition in self._partitions.values():
            for group in partition.receivers.values():
                for receiver in group:
                    receiver._dropped_by_hub = True
            partition.events, partition.head, partition.dropped, partition.next_offset = [], 0, 0, 0
            partition.wake()
        logger.info("%s: recreated: every partition is empty and starts at sequence number 0", self.eventhub_name)

    def add_partitions(self, count: int) -> list[str]:
        """Add ``count`` partitions; returns their ids. Like Event Hubs, keys may now
        hash to different partitions."""
        if count < 1:
            raise ConfigurationError(f"count must be at least 1, got {count}")
        start = len(self._partitions)
        new = [str(i) for i in range(start, start + count)]
        for pid in new:
            self._partitions[pid] = _Partition()
        logger.info("%s: added partitions %s", self.eventhub_name, ", ".join(new))
        return new

    def partition_for_key(self, partition_key: str) -> str:
        digest = hashlib.blake2b(partition_key.encode("utf-8"), digest_size=8).digest()
        return str(int.from_bytes(digest, "big") % len(self._partitions))

    async def send(self, body: Body = _UNSET, *, partition_id: str | None = None,
                   partition_key: str | None = None,
                   properties: Mapping[str, Any] | None = None, message_id: MessageId | None = None,
                   content_type: str | None = None, correlation_id: MessageId | None = None,
                   sequence_body: Any = _UNSET, value_body: Any = _UNSET) -> Event:
        """Append one event and return it (with its sequence number and offset).
        ``properties`` are the application properties; ``message_id``, ``content_type`` and
        ``correlation_id`` the AMQP ones, as a producer sets them on ``EventData``.

        The body is one of: ``body`` (bytes or str: one data section; a list of them:
        one section each), ``sequence_body`` (a list: one sequence section; a list of
        lists: one section each) or ``value_body`` (any value), as
        ``AmqpAnnotatedMessage`` takes them. Values are kept as given (over AMQP,
        azure-eventhub's decoder hands strings back as bytes).

        Example::

            await source.send(b"reading")
            await source.send([b"aa", b"bb"])                     # two data sections
            await source.send(sequence_body=[b"message", 1.5, True])
            await source.send(value_body={b"key": [-123, b"data", False]})
        """
        return self.append(body, partition_id=partition_id, partition_key=partition_key, properties=properties,
                           message_id=message_id, content_type=content_type, correlation_id=correlation_id,
                           sequence_body=sequence_body, value_body=value_body)

    async def send_batch(self, bodies: list[bytes | str], *, partition_id: str | None = None,
                         partition_key: str | None = None) -> list[Event]:
        """Append several events to one partition (or round-robin if none is named)."""
        return [self.append(b, partition_id=partition_id, partition_key=partition_key) for b in bodies]

    def append(self, body: Body = _UNSET, *, partition_id: str | None = None,
               partition_key: str | None = None,
               properties: Mapping[str, Any] | None = None, message_id: MessageId | None = None,
               content_type: str | None = None, correlation_id: MessageId | None = None,
               sequence_body: Any = _UNSET, value_body: Any = _UNSET) -> Event:
        """Synchronous :meth:`send`, for producers outside the event loop's tasks."""
        body, body_type, amqp_body = _body_fields(body, sequence_body, value_body)
        if partition_id is not None and partition_key is not None:
            raise ConfigurationError("give partition_id or partition_key, not both")
        if partition_id is not None:
            partition_id = str(partition_id)
            if partition_id not in self._partitions:
                raise ConfigurationError(
                    f"partition {partition_id!r} does not exist; ids are 0..{len(self._partitions) - 1}")
        elif partition_key is not None:
            partition_id = self.partition_for_key(partition_key)
        else:
            partition_id = str(next(self._round_robin) % len(self._partitions))
        partition = self._partitions[partition_id]
        event = Event(
            body=body,
            sequence_number=partition.end,
            offset=str(partition.next_offset),
            enqueued_time=self._clock(),
            partition_key=partition_key,
            properties=dict(properties or {}),
            partition_id=partition_id,
            message_id=message_id,
            content_type=content_type,
            correlation_id=correlation_id,
            body_type=body_type,
            amqp_body=amqp_body,
        )
        partition.events.append(event)
        partition.next_offset += max(len(body), 1)
        partition.retain(self.max_events_per_partition)
        partition.wake()
        return event

    def events(self, partition_id: str) -> list[Event]:
        """A copy of every retained event of a partition, for tests."""
        return self._partitions[partition_id].retained()

    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        if partition_id not in self._partitions:
            raise ConfigurationError(f"partition {partition_id!r} does not exist")
        partition = self._partitions[partition_id]
        newest = partition.events[-1] if partition.end > partition.begin else None
        return PartitionProperties(
            partition_id=partition_id, beginning_sequence_number=partition.begin,
            last_enqueued_sequence_number=newest.sequence_number if newest else -1,
            last_enqueued_offset=newest.offset if newest else "-1",
            last_enqueued_time_utc=newest.enqueued_time if newest else None, is_empty=newest is None)

    def last_sequence_number(self, partition_id: str) -> int:
        return self._partitions[partition_id].end - 1

    def _start(self, partition: _Partition, position: EventPosition) -> int:
        """The sequence number a receiver at ``position`` reads first (``end`` when none yet)."""
        begin, end = partition.begin, partition.end
        if position.kind == "earliest":
            return begin
        if position.kind == "latest":
            return end
        if position.kind == "sequence_number":
            seq = int(position.value)  # type: ignore[arg-type]
            first = seq if position.inclusive else seq + 1
            if first > end:  # as Event Hubs: a position past the end is refused
                raise EventSourceError(
                    f"the position {position} is past the end of the partition (the next event gets sequence "
                    f"number {end}): argument-out-of-range", reason="refused")
            return max(begin, first)
        events = partition.retained()
        if position.kind == "offset":
            offsets = [int(e.offset) for e in events]
            target = int(position.value)  # type: ignore[arg-type]
            found = bisect.bisect_left(offsets, target) if position.inclusive else bisect.bisect_right(offsets, target)
            return begin + found
        times = [e.enqueued_time for e in events]
        when = position.value
        assert isinstance(when, datetime)
        return begin + (bisect.bisect_left(times, when) if position.inclusive else bisect.bisect_right(times, when))

    async def open_receiver(self, partition_id: str, *, consumer_group: str,
                            starting_position: EventPosition, owner_level: int | None,
                            prefetch: int = 300,
                            track_last_enqueued_event_properties: bool = False) -> InMemoryPartitionReceiver:
        """Open a receiver. Event Hubs' epoch rules: an owner-level receiver disconnects
        the receivers of the consumer group with a lower or equal owner level (and all
        receivers without one); it cannot open while a higher one is open."""
        if partition_id not in self._partitions:
            raise ConfigurationError(f"partition {partition_id!r} does not exist")
        if prefetch < 0:
            raise ConfigurationError("prefetch must not be negative")
        partition = self._partitions[partition_id]
        group = partition.receivers.setdefault(consumer_group, [])
        exclusive = [r for r in group if r.owner_level is not None]
        if exclusive:
            highest = max(r.owner_level for r in exclusive if r.owner_level is not None)
            if owner_level is None or owner_level < highest:
                raise ReceiverDisconnectedError(
                    f"cannot open a receiver on partition {partition_id} with owner level {owner_level}: "
                    f"a receiver with owner level {highest} is open",
                    partition_id=partition_id,
                )
        if owner_level is not None:
            for receiver in list(group):
                receiver._disconnect(owner_level)
                group.remove(receiver)
        receiver = InMemoryPartitionReceiver(self, partition_id, consumer_group,
                                           self._start(partition, starting_position), owner_level,
                                           track_last_enqueued_event_properties)
        group.append(receiver)
        return receiver
