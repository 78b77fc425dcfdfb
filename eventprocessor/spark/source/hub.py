"""The eventhubs source's calls to the hub: on the driver, partition properties and
positions; on the executors, the events of one sequence range.

Both go through :class:`~eventprocessor.sources.eventhub.EventHubSource` (its lean
receive path: azure-eventhub's own consumer, no ``EventData`` per event). Spark calls
the source's methods synchronously, so each side runs its coroutines on an event loop
of its own: the driver keeps one for the life of the query; an executor's Python
worker keeps one in a daemon thread, with the receivers it may reuse for the next
batch (:class:`WorkerReceivers`).

Example::

    with DriverHub(options) as hub:
        properties = hub.properties()
    for batch in read_range(options, ReadRange("0", 100, 200)):
        ...
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, TypeVar

import pyarrow as pa

from ...errors import EventSourceError, ReceiverDisconnectedError
from ...events import Event, EventPosition
from ...sources.base import PartitionProperties
from ...sources.eventhub import EventHubSource
from .offsets import PartitionPosition, ReadRange
from .options import Position, SourceOptions
from .rows import events_to_record_batch

__all__ = ["DriverHub", "ManagementLink", "read_range", "DataLossError", "RECORD_BATCH_ROWS", "WorkerReceivers", "WORKER_RECEIVERS"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

RECORD_BATCH_ROWS = 8192
"""Events per Arrow record batch handed to Spark."""

_RESOLVE_WAIT = 5.0  # as the Microsoft connector: the first event at a position arrives at once, or there is none


class DataLossError(EventSourceError):
    """Events the query was to read expired from the hub first (``failOnDataLoss=true``)."""


def _source(options: SourceOptions, operation_timeout: Optional[float] = None) -> EventHubSource:
    return EventHubSource.from_connection_string(
        options.connection_string, eventhub_name=options.eventhub_name,
        operation_timeout=min(options.operation_timeout, operation_timeout or options.operation_timeout),
        partition_ids_ttl=5.0)


def _event_position(position: Position) -> EventPosition:
    if position.kind == "start":
        return EventPosition.earliest()
    if position.kind == "end":
        return EventPosition.latest()
    if position.kind == "offset":
        return EventPosition.from_offset(position.value, inclusive=position.inclusive)
    if position.kind == "sequence_number":
        return EventPosition.from_sequence_number(position.value, inclusive=True)
    # The connector (Java SDK) reads after an enqueued time, never at it.
    return EventPosition.from_enqueued_time(position.value, inclusive=False)


class ManagementLink:
    """One ``$management`` link the driver keeps open for partition properties.

    azure-eventhub's public ``get_partition_properties`` opens a connection, runs a CBS
    handshake and attaches a link for every call: about 0.4 s each on the emulator,
    and a micro-batch asks for every partition. This link is opened once (with the
    client's own pieces: its auth, its AMQP transport's management client and request)
    and answers in milliseconds; requests go one at a time (concurrent requests on one
    link stall on the client's 0.2 s socket reads). :func:`supported` checks the
    private pieces; :class:`DriverHub` falls back to the public calls when they are
    missing or the link fails.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._client: Any = None
        self._auth: Any = None
        self._mgmt: Any = None

    @staticmethod
    def supported() -> bool:
        try:
            from azure.eventhub import _constants
            from azure.eventhub.aio import EventHubConsumerClient
            from azure.eventhub.aio._transport._pyamqp_transport_async import PyamqpTransportAsync as transport
        except ImportError:
            return False
        return (callable(getattr(EventHubConsumerClient, "_create_auth_async", None))
                and all(callable(getattr(transport, name, None)) for name in (
                    "create_mgmt_client", "build_message", "get_updated_token_async", "mgmt_client_request_async"))
                and all(hasattr(_constants, name) for name in (
                    "MGMT_OPERATION", "MGMT_PARTITION_OPERATION", "MGMT_STATUS_CODE", "MGMT_STATUS_DESC",
                    "READ_OPERATION")))

    async def _open(self) -> None:
        from azure.eventhub.aio import EventHubConsumerClient

        self._client = EventHubConsumerClient.from_connection_string(
            self._options.connection_string, consumer_group="$Default", eventhub_name=self._options.eventhub_name)
        if not callable(getattr(getattr(self._client, "_amqp_transport", None), "create_mgmt_client", None)):
            raise RuntimeError("this azure-eventhub client has no pyamqp transport")
        self._auth = await self._client._create_auth_async()
        mgmt = self._client._amqp_transport.create_mgmt_client(self._client._address, mgmt_auth=self._auth,
                                                              config=self._client._config)
        await mgmt.open_async()
        self._mgmt = mgmt
        while not await mgmt.client_ready_async():
            await asyncio.sleep(0.005)

    async def _request(self, operation: bytes, properties: Dict[str, str]) -> Dict[bytes, Any]:
        from azure.eventhub import _constants as k

        if self._mgmt is None:
            await self._open()
        transport = self._client._amqp_transport
        message = transport.build_message(application_properties=dict(properties))
        message.application_properties["security_token"] = await transport.get_updated_token_async(self._auth)
        status, description, response = await transport.mgmt_client_request_async(
            self._mgmt, message, operation=k.READ_OPERATION, operation_type=operation,
            status_code_field=k.MGMT_STATUS_CODE, description_fields=k.MGMT_STATUS_DESC)
        if int(status) >= 400:
            text = description.decode("utf-8", "replace") if isinstance(description, bytes) else str(description)
            raise EventSourceError(
                f"event hub {self._options.eventhub_name!r}: the hub answered {status} to a properties request: "
                f"{text[:300]}", fully_qualified_namespace=self._options.fully_qualified_namespace,
                eventhub_name=self._options.eventhub_name, reason="not-found" if int(status) == 404 else "refused")
        return response.value

    async def properties(self) -> Dict[str, PartitionProperties]:
        from azure.eventhub import _constants as k

        name = self._options.eventhub_name
        hub = await self._request(k.MGMT_OPERATION, {"name": name})
        result: Dict[str, PartitionProperties] = {}
        for raw in hub[b"partition_ids"]:
            pid = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            info = await self._request(k.MGMT_PARTITION_OPERATION, {"name": name, "partition": pid})
            offset = info[b"last_enqueued_offset"]
            enqueued = info.get(b"last_enqueued_time_utc")
            result[pid] = PartitionProperties(
                partition_id=pid, beginning_sequence_number=int(info[b"begin_sequence_number"]),
                last_enqueued_sequence_number=int(info[b"last_enqueued_sequence_number"]),
                last_enqueued_offset=offset.decode("utf-8") if isinstance(offset, bytes) else str(offset),
                last_enqueued_time_utc=(datetime.fromtimestamp(enqueued / 1000, timezone.utc)
                                        if isinstance(enqueued, (int, float)) else None),
                is_empty=bool(info[b"is_partition_empty"]))
        return result

    async def close(self) -> None:
        mgmt, client = self._mgmt, self._client
        self._mgmt, self._client, self._auth = None, None, None
        try:
            if mgmt is not None:
                await mgmt.close_async()
            if client is not None:
                await client.close()
        except Exception:
            logger.debug("closing the driver's management link failed", exc_info=True)


class DriverHub:
    """The driver's view of the hub, on an event loop of its own that lives as long as
    the query's reader (clients are made on first use, never pickled)."""

    def __init__(self, options: SourceOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._options = options
        self._clock = clock
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._source: Optional[EventHubSource] = None
        self._link: Optional[ManagementLink] = None

    def __enter__(self) -> "DriverHub":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop

    @property
    def source(self) -> EventHubSource:
        if self._source is None:
            self._source = _source(self._options)
        return self._source

    def run(self, make: Callable[[], Awaitable[_T]]) -> _T:
        """Run a coroutine on the driver's loop, bounded by ``eventhubs.operationTimeout``."""
        async def bounded() -> _T:
            return await asyncio.wait_for(make(), self._options.operation_timeout)

        return self.loop.run_until_complete(bounded())

    def properties(self) -> Dict[str, PartitionProperties]:
        """Every partition's properties now: over the kept management link, or with the
        public calls (concurrently) when the link is not available."""
        async def public() -> Dict[str, PartitionProperties]:
            ids = await self.source.get_partition_ids()
            found = await asyncio.gather(*(self.source.get_partition_properties(pid) for pid in ids))
            return {pid: props for pid, props in zip(ids, found)}

        async def fetch() -> Dict[str, PartitionProperties]:
            if self._link is None and ManagementLink.supported():
                self._link = ManagementLink(self._options)
            if self._link is not None:
                try:
                    return await self._link.properties()
                except EventSourceError:
                    raise
                except Exception as error:  # a dropped connection: the public calls now, a new link next time
                    logger.info("the driver's management link failed (%s: %s); reopening it on the next call",
                                type(error).__name__, self.source._errors.scrub(str(error))[:200])
                    link, self._link = self._link, None
                    await link.close()
            return await public()

        return self.run(fetch)

    def starting_positions(self, positions: Mapping[str, Position],
                           properties: Mapping[str, PartitionProperties]) -> Dict[str, PartitionPosition]:
        """Where each partition starts, as the connector translates positions: a
        sequence number as given (inclusive), the start and end of the stream from the
        partition's properties, an offset or an enqueued time by reading the first
        event there (none within 5 s: the partition's end)."""
        result: Dict[str, PartitionPosition] = {}
        to_read: Dict[str, Position] = {}
        for pid, props in properties.items():
            position = positions[pid]
            last = props.last_enqueued_sequence_number
            end_offset = props.last_enqueued_offset if last >= 0 and props.last_enqueued_offset != "-1" else None
            if position.kind == "start":
                # An empty partition (never written, or every event expired) starts after its last event.
                result[pid] = (PartitionPosition(last + 1, end_offset) if props.is_empty
                               else PartitionPosition(props.beginning_sequence_number))
            elif position.kind == "end":
                result[pid] = PartitionPosition(last + 1, end_offset)
            elif position.kind == "sequence_number":
                seq = int(position.value)
                if seq > last + 1:
                    raise EventSourceError(
                        f"eventhubs.startingPosition(s): sequence number {seq} of partition {pid} is past its end "
                        f"(the last event is {last}); use {{\"offset\": \"@latest\"}} to start at the end",
                        fully_qualified_namespace=self._options.fully_qualified_namespace,
                        eventhub_name=self._options.eventhub_name, reason="refused")
                result[pid] = PartitionPosition(seq)
            else:
                to_read[pid] = position
        if to_read:
            firsts = self.run(lambda: self._first_events(to_read, properties))
            for pid, event in firsts.items():
                position = to_read[pid]
                props = properties[pid]
                if event is None:
                    last = props.last_enqueued_sequence_number
                    result[pid] = PartitionPosition(last + 1, props.last_enqueued_offset if last >= 0 else None)
                else:
                    # Reading after an offset: the offset is the previous event's.
                    before = position.value if position.kind == "offset" and not position.inclusive else None
                    result[pid] = PartitionPosition(event.sequence_number, before)
        return result

    def ending_sequence_numbers(self, positions: Mapping[str, Position],
                                properties: Mapping[str, PartitionProperties]) -> Dict[str, int]:
        """Where a batch read stops (exclusive), translated as the connector does."""
        starts = self.starting_positions(positions, properties)
        return {pid: position.sequence_number for pid, position in starts.items()}

    async def _first_events(self, positions: Mapping[str, Position],
                            properties: Mapping[str, PartitionProperties]) -> Dict[str, Optional[Event]]:
        async def first(pid: str, position: Position) -> Optional[Event]:
            receiver = await self.source.open_receiver(
                pid, consumer_group=self._options.consumer_group, starting_position=_event_position(position),
                owner_level=None, prefetch=1)
            try:
                events = await receiver.receive(1, _RESOLVE_WAIT)
            finally:
                await receiver.close()
            return events[0] if events else None

        pids = list(positions)
        found = await asyncio.gather(*(first(pid, positions[pid]) for pid in pids))
        return dict(zip(pids, found))

    def offsets_of(self, sequence_numbers: Mapping[str, int]) -> Dict[str, str]:
        """The offset strings of the events at these sequence numbers (one short read
        each, concurrently): what an Event Hubs checkpoint of a rate-limited batch needs."""
        if not sequence_numbers:
            return {}

        async def lookup() -> Dict[str, str]:
            async def one(pid: str, seq: int) -> str:
                receiver = await self.source.open_receiver(
                    pid, consumer_group=self._options.consumer_group,
                    starting_position=EventPosition.from_sequence_number(seq, inclusive=True), owner_level=None,
                    prefetch=1)
                try:
                    events = await receiver.receive(1, self._options.receiver_timeout)
                finally:
                    await receiver.close()
                if not events or events[0].sequence_number != seq:
                    raise EventSourceError(
                        f"partition {pid}: the event at sequence number {seq} could not be read to learn its offset",
                        fully_qualified_namespace=self._options.fully_qualified_namespace,
                        eventhub_name=self._options.eventhub_name, reason="timeout")
                return events[0].offset

            pids = list(sequence_numbers)
            found = await asyncio.gather(*(one(pid, sequence_numbers[pid]) for pid in pids))
            return dict(zip(pids, found))

        return self.run(lookup)

    def close(self) -> None:
        source, self._source = self._source, None
        link, self._link = self._link, None
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        try:
            if link is not None:
                loop.run_until_complete(link.close())
            if source is not None:
                loop.run_until_complete(source.close())
        except Exception:
            logger.debug("closing the driver's Event Hubs client failed", exc_info=True)
        finally:
            loop.close()


@dataclass
class OpenReceiver:
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
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._kept: "OrderedDict[Tuple[Any, ...], OpenReceiver]" = OrderedDict()
        self._planned: List[float] = []
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
            gaps = [b - a for a, b in zip(self._planned, self._planned[1:]) if b > a]
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

    def take(self, key: Tuple[Any, ...], sequence_number: int) -> Optional[OpenReceiver]:
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

    def keep(self, key: Tuple[Any, ...], receiver: OpenReceiver) -> None:
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

    def _expire(self, key: Tuple[Any, ...], receiver: OpenReceiver) -> None:
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
               receivers: Optional[WorkerReceivers] = None) -> Iterator[pa.RecordBatch]:
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
        source = _source(options)
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
        pending: List[Event] = []
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
