"""Azure Event Hubs as an event source, over ``azure.eventhub.aio.EventHubConsumerClient``.

Needs the ``[eventhub]`` extra. The processor does the load balancing and the
checkpointing; this adapter only receives. Each partition receiver runs the client's
``receive_batch`` for exactly one partition, with the claim's epoch as the owner level,
so a newer owner's receiver disconnects an older one on the service side.

Example::

    source = EventHubSource.from_connection_string(conn_str, eventhub_name="telemetry")
    processor = EventProcessor(source, BlobCheckpointStore.from_connection_string(...), MyProcessor)
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, List, Optional, Tuple

from ..errors import ConfigurationError, ReceiverDisconnectedError
from ..events import Event, EventPosition
from .base import EventSource, PartitionReceiver

__all__ = ["EventHubSource", "to_event", "to_starting_position"]

logger = logging.getLogger(__name__)

# Markers of the AMQP errors Event Hubs returns when a receiver with a higher epoch
# took the partition (link stolen / epoch receiver conflict).
_TAKEN_OVER_MARKERS = ("link:stolen", "epoch", "receiver with a higher", "ownerlevel", "owner level")


def to_starting_position(position: EventPosition) -> Tuple[Any, bool]:
    """Map an :class:`EventPosition` to ``receive_batch``'s (starting_position, inclusive)."""
    if position.kind == "earliest":
        return "-1", False
    if position.kind == "latest":
        return "@latest", False
    if position.kind == "sequence_number":
        return int(position.value), position.inclusive  # type: ignore[arg-type]
    if position.kind == "offset":
        return str(position.value), position.inclusive
    return position.value, position.inclusive


def to_event(event_data: Any) -> Event:
    """Convert an ``azure.eventhub.EventData`` to this SDK's :class:`Event`."""
    body = event_data.body
    if not isinstance(body, (bytes, bytearray)):
        body = b"".join(bytes(part) for part in body)
    properties: Dict[str, Any] = {}
    for key, value in (event_data.properties or {}).items():
        properties[key.decode("utf-8") if isinstance(key, bytes) else str(key)] = value
    partition_key = event_data.partition_key
    if isinstance(partition_key, bytes):
        partition_key = partition_key.decode("utf-8")
    return Event(
        body=bytes(body),
        sequence_number=event_data.sequence_number,
        offset=str(event_data.offset),
        enqueued_time=event_data.enqueued_time,
        partition_key=partition_key,
        properties=properties,
    )


class _EventHubReceiver(PartitionReceiver):
    """One partition, fed by a background ``receive_batch`` through a one-slot queue
    (so the client does not run ahead of the handler by more than one batch plus its
    prefetch)."""

    def __init__(self, client: Any, partition_id: str, consumer_group: str, position: EventPosition,
                 owner_level: Optional[int], prefetch: int) -> None:
        self._client = client
        self.partition_id = partition_id
        self.consumer_group = consumer_group
        self._position = position
        self._owner_level = owner_level
        self._prefetch = prefetch
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue(maxsize=1)
        self._task: Optional[asyncio.Task] = None

    def __repr__(self) -> str:
        return (f"EventHubReceiver(partition_id={self.partition_id!r}, consumer_group={self.consumer_group!r}, "
                f"owner_level={self._owner_level})")

    def _start(self, max_batch_size: int, max_wait_time: Optional[float]) -> None:
        starting_position, inclusive = to_starting_position(self._position)

        async def on_event_batch(_context: Any, batch: List[Any]) -> None:
            await self._queue.put([to_event(e) for e in batch])

        async def on_error(_context: Any, error: Exception) -> None:
            await self._queue.put(error)

        self._task = asyncio.create_task(self._client.receive_batch(
            on_event_batch, partition_id=self.partition_id, owner_level=self._owner_level,
            starting_position=starting_position, starting_position_inclusive=inclusive,
            max_batch_size=max_batch_size, max_wait_time=max_wait_time, prefetch=self._prefetch,
            on_error=on_error,
        ), name=f"eventhub-receive-{self.partition_id}")

    async def receive(self, max_batch_size: int, max_wait_time: Optional[float]) -> List[Event]:
        if self._task is None:
            self._start(max_batch_size, max_wait_time)
        task = self._task
        assert task is not None
        getter = asyncio.ensure_future(self._queue.get())
        done, _pending = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            error = task.exception() if not task.cancelled() else None
            raise error or RuntimeError(f"receiving from partition {self.partition_id} stopped")
        item = getter.result()
        if isinstance(item, Exception):
            text = str(item).lower()
            if any(marker in text for marker in _TAKEN_OVER_MARKERS):
                raise ReceiverDisconnectedError(
                    f"receiver on partition {self.partition_id} (owner level {self._owner_level}) was taken over: "
                    f"{type(item).__name__}", partition_id=self.partition_id) from item
            raise item
        return item

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


class EventHubSource(EventSource):
    """An Event Hub, read through ``azure-eventhub``'s async consumer client.

    One client is created per consumer group, lazily. Pass client options (retry
    settings, transport type, ...) as keyword arguments; they go to
    ``EventHubConsumerClient``. Credentials and connection strings are kept private:
    they never appear in ``repr``, logs or error messages.
    """

    def __init__(self, fully_qualified_namespace: str, eventhub_name: str, credential: Any, **client_kwargs: Any) -> None:
        if not fully_qualified_namespace:
            raise ConfigurationError("fully_qualified_namespace must not be empty")
        if not eventhub_name:
            raise ConfigurationError("eventhub_name must not be empty")
        self.fully_qualified_namespace = fully_qualified_namespace
        self.eventhub_name = eventhub_name
        self._credential = credential
        self._conn_str: Optional[str] = None
        self._client_kwargs = client_kwargs
        self._clients: Dict[str, Any] = {}

    @classmethod
    def from_connection_string(cls, conn_str: str, *, eventhub_name: Optional[str] = None,
                               **client_kwargs: Any) -> "EventHubSource":
        """Build from an Event Hubs connection string (``Endpoint=sb://...;SharedAccessKeyName=...;
        SharedAccessKey=...[;EntityPath=hub]``, or an emulator string with
        ``UseDevelopmentEmulator=true``)."""
        try:
            from azure.eventhub import parse_connection_string
        except ImportError as error:  # pragma: no cover - depends on the extra
            raise ConfigurationError("EventHubSource needs the [eventhub] extra: pip install eventprocessor[eventhub]") \
                from error
        if not isinstance(conn_str, str) or not conn_str.strip():
            raise ConfigurationError("the Event Hubs connection string is empty")
        try:
            props = parse_connection_string(conn_str)
        except Exception:
            raise ConfigurationError(
                "the Event Hubs connection string is malformed: expected 'Endpoint=sb://<namespace>/;"
                "SharedAccessKeyName=<name>;SharedAccessKey=<key>' (values not shown)") from None
        name = eventhub_name or props.eventhub_name
        if not name:
            raise ConfigurationError("no event hub name: pass eventhub_name= or put EntityPath in the connection string")
        if eventhub_name and props.eventhub_name and eventhub_name != props.eventhub_name:
            raise ConfigurationError(
                f"eventhub_name {eventhub_name!r} differs from the connection string's EntityPath "
                f"{props.eventhub_name!r}")
        source = cls(props.fully_qualified_namespace, name, None, **client_kwargs)
        source._conn_str = conn_str
        return source

    def __repr__(self) -> str:
        return (f"EventHubSource(fully_qualified_namespace={self.fully_qualified_namespace!r}, "
                f"eventhub_name={self.eventhub_name!r})")

    def _client(self, consumer_group: str) -> Any:
        client = self._clients.get(consumer_group)
        if client is None:
            from azure.eventhub.aio import EventHubConsumerClient

            if self._conn_str is not None:
                client = EventHubConsumerClient.from_connection_string(
                    self._conn_str, consumer_group=consumer_group, eventhub_name=self.eventhub_name,
                    **self._client_kwargs)
            else:
                client = EventHubConsumerClient(self.fully_qualified_namespace, self.eventhub_name, consumer_group,
                                                self._credential, **self._client_kwargs)
            self._clients[consumer_group] = client
        return client

    async def get_partition_ids(self) -> List[str]:
        return list(await self._client("$default").get_partition_ids())

    async def open_receiver(self, partition_id: str, *, consumer_group: str, starting_position: EventPosition,
                            owner_level: Optional[int], prefetch: int = 300) -> PartitionReceiver:
        return _EventHubReceiver(self._client(consumer_group), partition_id, consumer_group, starting_position,
                                 owner_level, prefetch)

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            try:
                await client.close()
            except Exception:
                logger.debug("closing an Event Hubs client failed", exc_info=True)
