"""The driver's side of the eventhubs source: its calls to the hub for partition
properties and starting positions (:class:`DriverHub`), over a ``$management`` link it
keeps open (:class:`ManagementLink`).

They go through :class:`~eventprocessor.sources.eventhub.EventHubSource` (its lean
receive path: azure-eventhub's own consumer, no ``EventData`` per event). Spark calls
the source's methods synchronously, so the driver runs its coroutines on an event loop
of its own, kept for the life of the query. The executors' side (the events of one
sequence range) is :mod:`.executor`.

Example::

    with DriverHub(options) as hub:
        properties = hub.properties()
        starts = hub.starting_positions({pid: Position("start") for pid in properties}, properties)
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import Any, TypeVar

from ...errors import EventSourceError
from ...events import Event, EventPosition
from ...sources.base import PartitionProperties
from ...sources.eventhub import EventHubSource
from .offsets import PartitionPosition
from .options import Position, SourceOptions

__all__ = ["DriverHub", "ManagementLink", "event_hub_source"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

_RESOLVE_WAIT = 5.0  # as the Microsoft connector: the first event at a position arrives at once, or there is none


def event_hub_source(options: SourceOptions) -> EventHubSource:
    """The :class:`~eventprocessor.sources.eventhub.EventHubSource` the options name (one
    on the driver, one per receiver an executor opens)."""
    return EventHubSource.from_connection_string(
        options.connection_string, eventhub_name=options.eventhub_name, operation_timeout=options.operation_timeout,
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

    @property
    def is_open(self) -> bool:
        """Whether the link is open now: from the first :meth:`properties` until
        :meth:`close` (a connection the hub dropped meanwhile still counts, until a
        request fails on it)."""
        return self._mgmt is not None

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

    async def _request(self, operation: bytes, properties: dict[str, str]) -> dict[bytes, Any]:
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

    async def properties(self) -> dict[str, PartitionProperties]:
        from azure.eventhub import _constants as k

        name = self._options.eventhub_name
        hub = await self._request(k.MGMT_OPERATION, {"name": name})
        result: dict[str, PartitionProperties] = {}
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._source: EventHubSource | None = None
        self._link: ManagementLink | None = None

    def __enter__(self) -> DriverHub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop

    @property
    def management_link(self) -> ManagementLink | None:
        """The ``$management`` link :meth:`properties` keeps open (read-only): ``None``
        before the first call, after a request on it failed (the next call opens a new
        one), when the installed azure-eventhub lacks what it needs, and after
        :meth:`close`.

        Example::

            hub.properties()
            assert hub.management_link is not None and hub.management_link.is_open
        """
        return self._link

    @property
    def source(self) -> EventHubSource:
        if self._source is None:
            self._source = event_hub_source(self._options)
        return self._source

    def run(self, make: Callable[[], Awaitable[_T]]) -> _T:
        """Run a coroutine on the driver's loop, bounded by ``eventhubs.operationTimeout``."""
        async def bounded() -> _T:
            return await asyncio.wait_for(make(), self._options.operation_timeout)

        return self.loop.run_until_complete(bounded())

    def properties(self) -> dict[str, PartitionProperties]:
        """Every partition's properties now: over the kept management link, or with the
        public calls (concurrently) when the link is not available."""
        async def public() -> dict[str, PartitionProperties]:
            ids = await self.source.get_partition_ids()
            found = await asyncio.gather(*(self.source.get_partition_properties(pid) for pid in ids))
            return {pid: props for pid, props in zip(ids, found, strict=False)}

        async def fetch() -> dict[str, PartitionProperties]:
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
                           properties: Mapping[str, PartitionProperties]) -> dict[str, PartitionPosition]:
        """Where each partition starts, as the connector translates positions: a
        sequence number as given (inclusive), the start and end of the stream from the
        partition's properties, an offset or an enqueued time by reading the first
        event there (none within 5 s: the partition's end)."""
        result: dict[str, PartitionPosition] = {}
        to_read: dict[str, Position] = {}
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
                                properties: Mapping[str, PartitionProperties]) -> dict[str, int]:
        """Where a batch read stops (exclusive), translated as the connector does."""
        starts = self.starting_positions(positions, properties)
        return {pid: position.sequence_number for pid, position in starts.items()}

    async def _first_events(self, positions: Mapping[str, Position],
                            properties: Mapping[str, PartitionProperties]) -> dict[str, Event | None]:
        async def first(pid: str, position: Position) -> Event | None:
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
        return dict(zip(pids, found, strict=False))

    def offsets_of(self, sequence_numbers: Mapping[str, int]) -> dict[str, str]:
        """The offset strings of the events at these sequence numbers (one short read
        each, concurrently): what an Event Hubs checkpoint of a rate-limited batch needs."""
        if not sequence_numbers:
            return {}

        async def lookup() -> dict[str, str]:
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
            return dict(zip(pids, found, strict=False))

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
