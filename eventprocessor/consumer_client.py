"""A drop-in for ``azure.eventhub.aio.EventHubConsumerClient``: the same constructor, the
same ``receive_batch`` / ``receive`` callbacks, run by :class:`~eventprocessor.EventProcessor`.

Migrating is two imports; every callback stays as it is::

    # from azure.eventhub.aio import EventHubConsumerClient
    # from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore
    from eventprocessor import EventHubConsumerClient
    from stores import BlobCheckpointStore

    checkpoint_store = BlobCheckpointStore.from_connection_string(storage_conn_str, "checkpoints")
    client = EventHubConsumerClient.from_connection_string(
        conn_str, consumer_group="$default", eventhub_name="telemetry", checkpoint_store=checkpoint_store)

    async def on_event_batch(partition_context, events):
        for event in events:
            print(partition_context.partition_id, event.body_as_str())
        await partition_context.update_checkpoint()

    async with client:
        await client.receive_batch(on_event_batch, starting_position="-1")

``stores.BlobCheckpointStore`` reads and writes the official store's blobs, so the
checkpoints carry over in both directions. This module is a thin adapter: one
:class:`~eventprocessor.EventProcessor` per ``receive``/``receive_batch`` call, whose
:class:`~eventprocessor.PartitionProcessor` calls the callbacks. What stays, what changes
and what is better is in the README ("Migrating from azure-eventhub").

Callbacks get ``azure.eventhub.EventData`` events (the ``[eventhub]`` extra) and a
:class:`ConsumerPartitionContext`, which has the official context's attributes and
``update_checkpoint(event=None)``. ``on_partition_close`` gets
``azure.eventhub.CloseReason``: ``SHUTDOWN`` when the client closes, ``OWNERSHIP_LOST``
when the partition moved to another processor (a graceful handoff included) or its lease
ran out.

Arguments of the official client this adapter cannot honour raise
:class:`~eventprocessor.errors.ConfigurationError` naming them; none is ignored.
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import replace
from datetime import datetime, timezone
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Tuple,
                    Union)

from .checkpoint_store import CheckpointStore, StoreWrapper
from .errors import ConfigurationError, OwnershipLostError
from .events import Event, EventPosition
from .partition import CloseReason, PartitionContext, PartitionProcessor
from .processor import EventProcessor
from .records import Member, MemberListing, OwnershipListing
from .sources.base import EventSource, PartitionProperties, PartitionReceiver

if TYPE_CHECKING:  # pragma: no cover
    from azure.eventhub import EventData

__all__ = ["EventHubConsumerClient", "ConsumerPartitionContext", "StartingPosition"]

logger = logging.getLogger(__name__)

StartingPosition = Union[str, int, datetime]
"""An official starting position: an offset (``"-1"`` is the start, ``"@latest"`` only
new events), a sequence number (int) or an enqueued time (a naive datetime is UTC, as
azure-eventhub reads it)."""

OnEventBatch = Callable[["ConsumerPartitionContext", List["EventData"]], Awaitable[None]]
OnEvent = Callable[["ConsumerPartitionContext", Optional["EventData"]], Awaitable[None]]
OnError = Callable[[Optional["ConsumerPartitionContext"], Exception], Awaitable[None]]
OnPartitionInitialize = Callable[["ConsumerPartitionContext"], Awaitable[None]]
OnPartitionClose = Callable[["ConsumerPartitionContext", Any], Awaitable[None]]

# azure-eventhub's constructor / from_connection_string keywords that configure its AMQP
# client: they go to the client under EventHubSource unchanged.
CLIENT_OPTIONS = frozenset({
    "logging_enable", "http_proxy", "auth_timeout", "user_agent", "retry_total", "retry_backoff_factor",
    "retry_backoff_max", "retry_mode", "idle_timeout", "transport_type", "custom_endpoint_address",
    "connection_verify", "ssl_context", "socket_timeout",
})
# EventHubSource's own keywords.
SOURCE_OPTIONS = frozenset({"operation_timeout", "partition_ids_ttl"})
# EventProcessor keywords this client passes through (what azure-eventhub does not have).
PROCESSOR_OPTIONS = frozenset({
    "owner_id", "ownership_renewal_age", "store_timeout", "shutdown_timeout", "handler_timeout",
    "max_delivery_attempts", "retry_backoff", "on_poison", "dead_letter", "refuse_checkpoint_rewind",
    "handoff_timeout", "balance_factor", "ordinal", "replica_count", "override_checkpoints", "meter_provider",
    "tracer_provider", "clock", "rng",
})
_ALL_PARTITIONS = "-1"
_UTC = timezone.utc
_SINGLE_EVENT_BATCH = 300  # receive(): events fetched per pump turn, handed to on_event one by one


def _require_azure_eventhub() -> None:
    try:
        import azure.eventhub  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the extra
        raise ConfigurationError("EventHubConsumerClient (the azure-eventhub drop-in) needs the [eventhub] extra: "
                                 "pip install 'eventprocessor[eventhub]'") from error


def _check_store(checkpoint_store: Any) -> CheckpointStore:
    if checkpoint_store is None:
        raise ConfigurationError(
            "checkpoint_store is required. azure-eventhub falls back to an in-memory store without one (no "
            "balancing across processes, checkpoints gone at exit); for that, pass stores.InMemoryCheckpointStore()")
    if isinstance(checkpoint_store, CheckpointStore):
        return checkpoint_store
    module = type(checkpoint_store).__module__
    if module.startswith("azure.eventhub"):
        raise ConfigurationError(
            f"checkpoint_store is azure-eventhub's {type(checkpoint_store).__name__} ({module}); use "
            "stores.BlobCheckpointStore.from_connection_string(<same connection string>, <same container>) instead: "
            "it reads and writes the same blobs, so existing checkpoints and ownership carry over, and it fences "
            "every checkpoint write by the owner's epoch")
    raise ConfigurationError(f"checkpoint_store must be an eventprocessor CheckpointStore (stores.BlobCheckpointStore, "
                             f"stores.TableCheckpointStore, stores.InMemoryCheckpointStore), got "
                             f"{type(checkpoint_store).__name__}")


def _split_options(options: Mapping[str, Any], *, with_client: bool) -> Tuple[Dict[str, Any], Dict[str, Any],
                                                                             Dict[str, Any]]:
    """Sort keyword arguments into (client, source, processor) options; refuse the rest by name."""
    client: Dict[str, Any] = {}
    source: Dict[str, Any] = {}
    processor: Dict[str, Any] = {}
    unknown: List[str] = []
    for name, value in options.items():
        if name == "uamqp_transport":
            if value:
                raise ConfigurationError("uamqp_transport=True is not supported: the uAMQP transport is deprecated "
                                         "by azure-eventhub, and EventHubSource reads through its pure-Python "
                                         "transport; remove the argument")
        elif name in CLIENT_OPTIONS and with_client:
            client[name] = value
        elif name in SOURCE_OPTIONS and with_client:
            source[name] = value
        elif name in PROCESSOR_OPTIONS:
            processor[name] = value
        else:
            unknown.append(name)
    if unknown:
        names = ", ".join(sorted(unknown))
        if not with_client and set(unknown) & (CLIENT_OPTIONS | SOURCE_OPTIONS):
            raise ConfigurationError(
                f"EventHubConsumerClient.from_source got {names}: options of the Event Hubs client belong to the "
                "source (EventHubSource(..., retry_total=...)), which from_source takes as built")
        raise ConfigurationError(
            f"EventHubConsumerClient got unsupported keyword argument(s) {names}. It takes azure-eventhub's "
            "checkpoint_store, load_balancing_interval, partition_ownership_expiration_interval, "
            f"load_balancing_strategy and client options ({', '.join(sorted(CLIENT_OPTIONS))}), EventHubSource's "
            f"{', '.join(sorted(SOURCE_OPTIONS))}, checkpoint_on_release, and EventProcessor's "
            f"{', '.join(sorted(PROCESSOR_OPTIONS))}")
    return client, source, processor


def to_event_position(value: Any, inclusive: bool, *, what: str = "starting_position") -> EventPosition:
    """An official starting position as an :class:`EventPosition` (see :data:`StartingPosition`)."""
    if not isinstance(inclusive, bool):
        raise ConfigurationError(f"starting_position_inclusive must be True or False, got {inclusive!r}")
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be an offset string, a sequence number (int) or a datetime, "
                                 f"got {value!r}")
    if isinstance(value, datetime):
        return EventPosition.from_enqueued_time(value if value.tzinfo is not None else value.replace(tzinfo=_UTC),
                                                inclusive=inclusive)
    if isinstance(value, int):
        return EventPosition.from_sequence_number(value, inclusive=inclusive)
    if isinstance(value, str):
        if value == "-1":
            return EventPosition.earliest()
        if value == "@latest":
            return EventPosition.latest()
        try:
            return EventPosition.from_offset(value, inclusive=inclusive)
        except ConfigurationError:
            raise ConfigurationError(f"{what} {value!r} is neither an offset (a string of digits), '-1' (the "
                                     "start) nor '@latest' (only new events)") from None
    raise ConfigurationError(f"{what} must be an offset string, a sequence number (int) or a datetime, got "
                             f"{type(value).__name__} {value!r}")


def starting_positions(starting_position: Any, starting_position_inclusive: Any
                       ) -> Tuple[Union[EventPosition, Dict[str, EventPosition]], EventPosition]:
    """azure-eventhub's ``starting_position`` / ``starting_position_inclusive`` as
    EventProcessor's ``(initial_event_position, default_event_position)``.

    As in azure-eventhub: no position means only new events (``"@latest"``); in a dict, a
    partition left out starts at the beginning (``"-1"``); ``starting_position_inclusive``
    is one bool or a dict by partition (left out: exclusive)."""
    if isinstance(starting_position_inclusive, Mapping):
        inclusive_by_pid = {str(k): v for k, v in starting_position_inclusive.items()}
        default_inclusive = False
    else:
        inclusive_by_pid = {}
        default_inclusive = starting_position_inclusive
    if starting_position is None:
        to_event_position("@latest", default_inclusive)  # checks the flag
        return EventPosition.latest(), EventPosition.earliest()
    if isinstance(starting_position, Mapping):
        positions = {str(pid): to_event_position(value, inclusive_by_pid.get(str(pid), default_inclusive),
                                                 what=f"starting_position[{pid!r}]")
                     for pid, value in starting_position.items()}
        return positions, EventPosition.earliest()
    if inclusive_by_pid:
        # One position for every partition, inclusive for some of them: those in a dict,
        # the others through the default.
        return ({pid: to_event_position(starting_position, flag) for pid, flag in inclusive_by_pid.items()},
                to_event_position(starting_position, default_inclusive))
    return to_event_position(starting_position, default_inclusive), EventPosition.earliest()


def to_event_data(event: Event) -> "EventData":
    """An ``azure.eventhub.EventData`` that reads like one the official client received:
    ``body``, ``body_as_str()``, ``body_as_json()``, ``sequence_number``, ``offset``,
    ``enqueued_time``, ``partition_key`` (bytes), ``properties`` (bytes keys, as AMQP
    delivers them), ``message_id``, ``content_type``, ``correlation_id``,
    ``system_properties`` and ``raw_amqp_message.properties`` (strings as bytes there, as
    AMQP delivers them; None when the event has none of the three, as when the producer
    set none)."""
    from azure.eventhub import EventData
    from azure.eventhub.amqp import AmqpMessageProperties

    data = EventData(event.body)
    amqp = (event.message_id, event.content_type, event.correlation_id)
    if any(value is not None for value in amqp):
        message_id, content_type, correlation_id = (value.encode("utf-8") if isinstance(value, str) else value
                                                    for value in amqp)
        data.raw_amqp_message.properties = AmqpMessageProperties(
            message_id=message_id, content_type=content_type, correlation_id=correlation_id)
    else:  # a received message without the section has None here (azure types it as never None)
        data.raw_amqp_message.properties = None  # type: ignore[assignment]
    annotations: Dict[Union[str, bytes], Any] = {
        b"x-opt-sequence-number": event.sequence_number,
        b"x-opt-offset": event.offset.encode("ascii"),
        b"x-opt-enqueued-time": int(event.enqueued_time.timestamp() * 1000),
    }
    if event.partition_key is not None:
        annotations[b"x-opt-partition-key"] = event.partition_key.encode("utf-8")
    data.raw_amqp_message.annotations = annotations
    if event.properties:
        data.properties = {(key.encode("utf-8") if isinstance(key, str) else key): value
                           for key, value in event.properties.items()}
    return data


class ConsumerPartitionContext:
    """What callbacks get: azure-eventhub's ``PartitionContext``, on a fenced claim.

    ``fully_qualified_namespace``, ``eventhub_name``, ``consumer_group``, ``partition_id``,
    ``last_enqueued_event_properties`` (a dict, as the official one; needs
    ``track_last_enqueued_event_properties=True``) and ``update_checkpoint(event=None)``
    as in azure-eventhub, plus ``owner_id``, ``epoch``, ``is_owned`` and ``lag``.

    ``update_checkpoint`` checkpoints ``event`` (default: the last event handed to a
    callback). Unlike azure-eventhub's it raises
    :class:`~eventprocessor.errors.OwnershipLostError` once another processor owns the
    partition (the checkpoint is not written), and
    :class:`~eventprocessor.errors.InvalidCheckpointError` for an event not delivered in
    this claim or before the last checkpoint (``allow_rewind=True`` to go back on purpose).
    """

    def __init__(self, context: PartitionContext, events: "weakref.WeakKeyDictionary[Any, Event]") -> None:
        self._context = context
        self._events = events
        self._current: Optional[Event] = None

    def __repr__(self) -> str:
        ctx = self._context
        return (f"ConsumerPartitionContext(eventhub_name={ctx.eventhub_name!r}, consumer_group={ctx.consumer_group!r}, "
                f"partition_id={ctx.partition_id!r}, owner_id={ctx.owner_id!r}, epoch={ctx.epoch})")

    @property
    def fully_qualified_namespace(self) -> str:
        return self._context.fully_qualified_namespace

    @property
    def eventhub_name(self) -> str:
        return self._context.eventhub_name

    @property
    def consumer_group(self) -> str:
        return self._context.consumer_group

    @property
    def partition_id(self) -> str:
        return self._context.partition_id

    @property
    def owner_id(self) -> str:
        return self._context.owner_id

    @property
    def epoch(self) -> int:
        """The claim's epoch: it rises at every change of owner and fences checkpoints."""
        return self._context.epoch

    @property
    def is_owned(self) -> bool:
        return self._context.is_owned

    @property
    def lag(self) -> Optional[int]:
        """Events enqueued after the last one delivered (needs track_last_enqueued_event_properties)."""
        return self._context.lag

    @property
    def last_enqueued_event_properties(self) -> Optional[Dict[str, Any]]:
        """``sequence_number``, ``offset``, ``enqueued_time`` and ``retrieval_time`` of the
        partition's newest event, as azure-eventhub gives them; None unless the receive
        call set ``track_last_enqueued_event_properties=True``."""
        newest = self._context.last_enqueued_event_properties
        if newest is None:
            return None
        return {"sequence_number": newest.sequence_number, "offset": newest.offset,
                "enqueued_time": newest.enqueued_time, "retrieval_time": newest.retrieval_time}

    async def update_checkpoint(self, event: Optional["EventData"] = None, *, allow_rewind: bool = False) -> None:
        """Checkpoint ``event`` (default: the last event handed to a callback)."""
        if event is None:
            target = self._current
        else:
            target = self._events.get(event)
            if target is None:
                target = _from_event_data(event)
        if target is None:
            return
        await self._context.update_checkpoint(target, allow_rewind=allow_rewind)


def _from_event_data(event: Any) -> Event:
    """An EventData this client did not hand out (the caller built one): its position."""
    sequence_number = getattr(event, "sequence_number", None)
    if not isinstance(sequence_number, int):
        raise ConfigurationError(f"update_checkpoint takes an event received by this client, got "
                                 f"{type(event).__name__} without a sequence number")
    enqueued = getattr(event, "enqueued_time", None) or datetime.now(_UTC)
    return Event(body=b"", sequence_number=sequence_number, offset=str(getattr(event, "offset", None) or ""),
                 enqueued_time=enqueued)


class _Callbacks:
    """One receive call's callbacks, and what they need from the client."""

    def __init__(self, *, on_event: Callable[..., Awaitable[None]], batch: bool,
                 on_error: Optional[OnError], on_partition_initialize: Optional[OnPartitionInitialize],
                 on_partition_close: Optional[OnPartitionClose], checkpoint_on_release: bool,
                 events: "weakref.WeakKeyDictionary[Any, Event]") -> None:
        for name, value in (("on_error", on_error), ("on_partition_initialize", on_partition_initialize),
                            ("on_partition_close", on_partition_close)):
            if value is not None and not callable(value):
                raise ConfigurationError(f"{name} must be an async callable, got {type(value).__name__}")
        if not callable(on_event):
            raise ConfigurationError(f"{'on_event_batch' if batch else 'on_event'} must be an async callable, got "
                                     f"{type(on_event).__name__}")
        self.on_event = on_event
        self.batch = batch
        self.on_error = on_error
        self.on_partition_initialize = on_partition_initialize
        self.on_partition_close = on_partition_close
        self.checkpoint_on_release = checkpoint_on_release
        self.events = events

    async def error(self, context: Optional[ConsumerPartitionContext], error: Exception) -> None:
        """``on_error(context, error)``; an on_error that raises is logged, as azure-eventhub does."""
        if self.on_error is None:
            if context is not None:
                logger.warning("partition %s of %s/%s: %r (no on_error callback)", context.partition_id,
                               context.eventhub_name, context.consumer_group, error)
            return
        try:
            await self.on_error(context, error)
        except Exception as again:
            logger.warning("on_error raised %r while handling %r", again, error)

    async def processor_error(self, error: Exception, context: Optional[PartitionContext]) -> None:
        """EventProcessor's ``error_handler``: errors with no partition (balancing, the
        store, the source) become ``on_error(None, error)``, as in azure-eventhub. An
        error with a partition reaches that partition's ``process_error`` as well, which
        reports it with its context, so it is not reported twice."""
        if context is None:
            await self.error(None, error)


def _close_reason(reason: CloseReason) -> Any:
    from azure.eventhub import CloseReason as OfficialCloseReason

    if reason is CloseReason.SHUTDOWN:
        return OfficialCloseReason.SHUTDOWN
    return OfficialCloseReason.OWNERSHIP_LOST  # HANDOFF too: another processor took the partition over


class _CallbackProcessor(PartitionProcessor):
    """The PartitionProcessor of one claim, calling the receive call's callbacks."""

    def __init__(self, callbacks: _Callbacks) -> None:
        self._callbacks = callbacks
        self._context: Optional[ConsumerPartitionContext] = None
        self._handled: Optional[int] = None  # receive(): the last event on_event returned from, this claim
        self.checkpoint_on_release = callbacks.checkpoint_on_release

    def _wrap(self, context: PartitionContext) -> ConsumerPartitionContext:
        if self._context is None:
            self._context = ConsumerPartitionContext(context, self._callbacks.events)
        return self._context

    async def initialize(self, context: PartitionContext) -> None:
        wrapped = self._wrap(context)
        if self._callbacks.on_partition_initialize is not None:
            try:
                await self._callbacks.on_partition_initialize(wrapped)
            except Exception as error:
                logger.warning("partition %s: on_partition_initialize raised %r", context.partition_id, error)
                await self._callbacks.error(wrapped, error)

    async def process_events(self, events: List[Event], context: PartitionContext) -> None:
        wrapped = self._wrap(context)
        callbacks = self._callbacks
        remember = callbacks.events.__setitem__
        if callbacks.batch:
            batch = []
            for event in events:
                data = to_event_data(event)
                remember(data, event)
                batch.append(data)
            if events:
                wrapped._current = events[-1]
            await callbacks.on_event(wrapped, batch)
            return
        if not events:
            await callbacks.on_event(wrapped, None)  # max_wait_time passed without an event
            return
        for event in events:
            if self._handled is not None and event.sequence_number <= self._handled:
                continue  # redelivered after a later event failed: on_event already returned from this one
            if not context._may_checkpoint():
                # The claim ended while on_event worked on an earlier event of this batch (not
                # gracefully: a graceful stop lets the batch finish): nothing more for it.
                raise OwnershipLostError(f"partition {context.partition_id}: the claim ended in the middle of a batch",
                                         partition_id=context.partition_id)
            data = to_event_data(event)
            remember(data, event)
            wrapped._current = event
            await callbacks.on_event(wrapped, data)
            self._handled = event.sequence_number

    async def process_error(self, error: Exception, context: PartitionContext) -> None:
        await self._callbacks.error(self._wrap(context), error)

    async def close(self, reason: CloseReason, context: PartitionContext) -> None:
        if self._callbacks.on_partition_close is None:
            return
        wrapped = self._wrap(context)
        try:
            await self._callbacks.on_partition_close(wrapped, _close_reason(reason))
        except Exception as error:
            logger.warning("partition %s: on_partition_close raised %r", context.partition_id, error)
            await self._callbacks.error(wrapped, error)


class _ReceiveSource(EventSource):
    """The client's source as one receive call sees it: only ``partition_id`` when one is
    given, and receivers opened at ``owner_level`` + the claim's epoch."""

    def __init__(self, inner: EventSource, partition_id: Optional[str], owner_level: int) -> None:
        self.inner = inner
        self.fully_qualified_namespace = inner.fully_qualified_namespace
        self.eventhub_name = inner.eventhub_name
        self._partition_id = partition_id
        self._owner_level = owner_level

    async def get_partition_ids(self) -> List[str]:
        ids = await self.inner.get_partition_ids()
        if self._partition_id is None:
            return ids
        if self._partition_id not in ids:
            raise ConfigurationError(f"partition_id {self._partition_id!r} does not exist; the event hub "
                                     f"{self.eventhub_name!r} has partitions {ids}")
        return [self._partition_id]

    async def open_receiver(self, partition_id: str, *, consumer_group: str, starting_position: EventPosition,
                            owner_level: Optional[int], prefetch: int,
                            track_last_enqueued_event_properties: bool = False) -> PartitionReceiver:
        level = None if owner_level is None else owner_level + self._owner_level
        options = {"track_last_enqueued_event_properties": True} if track_last_enqueued_event_properties else {}
        return await self.inner.open_receiver(partition_id, consumer_group=consumer_group,
                                              starting_position=starting_position, owner_level=level,
                                              prefetch=prefetch, **options)

    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        return await self.inner.get_partition_properties(partition_id)


class _OnePartitionStore(StoreWrapper):
    """The store as a single-partition receive sees it: that partition's records only,
    and no member records, so the processor claims its one partition by itself without
    counting the processors that read other partitions."""

    def __init__(self, inner: CheckpointStore, partition_id: str) -> None:
        super().__init__(inner)
        self._partition_id = partition_id

    def _only_mine(self, listing: OwnershipListing) -> OwnershipListing:
        pid = self._partition_id
        return replace(listing, ownerships=tuple(r for r in listing.ownerships if r.partition_id == pid),
                       unreadable=tuple(u for u in listing.unreadable if u.partition_id == pid))

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str,
                             consumer_group: str) -> OwnershipListing:
        return self._only_mine(await super().list_ownership(fully_qualified_namespace, eventhub_name, consumer_group))

    async def list_ownership_and_members(self, fully_qualified_namespace: str, eventhub_name: str,
                                         consumer_group: str) -> Tuple[OwnershipListing, Optional[MemberListing]]:
        return await self.list_ownership(fully_qualified_namespace, eventhub_name, consumer_group), None

    async def list_members(self, *scope: str) -> MemberListing:
        raise NotImplementedError("a single-partition receive keeps no member records")

    async def write_member(self, member: Member) -> Member:
        raise NotImplementedError("a single-partition receive keeps no member records")

    async def delete_member(self, member: Member) -> None:
        raise NotImplementedError("a single-partition receive keeps no member records")


class EventHubConsumerClient:
    """azure-eventhub's async ``EventHubConsumerClient``, run by :class:`EventProcessor`.

    Build it as the official one (:meth:`from_connection_string`, or the namespace, the
    hub, the consumer group and a credential), or over any
    :class:`~eventprocessor.sources.EventSource` with :meth:`from_source`. Then call
    :meth:`receive_batch` or :meth:`receive` with the official callbacks; each runs until
    :meth:`close` (or until its task is cancelled), then stops gracefully: batches in
    flight finish, ``on_partition_close(context, SHUTDOWN)`` runs, ownership is released.

    Keyword arguments, as in azure-eventhub: ``checkpoint_store`` (required: an
    eventprocessor store such as ``stores.BlobCheckpointStore``),
    ``load_balancing_interval`` (30 s), ``partition_ownership_expiration_interval``
    (6 x the interval), ``load_balancing_strategy`` (``"greedy"``) and the AMQP client
    options (``transport_type``, ``retry_total``, ``http_proxy``, ...: see
    :data:`CLIENT_OPTIONS`). Also EventProcessor's own options (:data:`PROCESSOR_OPTIONS`,
    for example ``owner_id``, ``handoff_timeout``, ``max_delivery_attempts``,
    ``meter_provider``) and ``checkpoint_on_release`` (False, as azure-eventhub: only the
    callbacks checkpoint; True checkpoints the last event of the last batch a callback
    returned from when a partition is released or handed over). Anything else raises
    :class:`ConfigurationError` naming it; values are checked when ``receive`` or
    ``receive_batch`` is called.
    """

    def __init__(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, credential: Any,
                 **kwargs: Any) -> None:
        _require_azure_eventhub()
        from .sources.eventhub import EventHubSource

        client_options, source_options, processor_options, settings = self._settings(kwargs, with_client=True)
        source = EventHubSource(fully_qualified_namespace, eventhub_name, credential, **source_options,
                                **client_options)
        self._setup(source, consumer_group, owns_source=True, processor_options=processor_options, **settings)

    @classmethod
    def from_connection_string(cls, conn_str: str, consumer_group: str, *, eventhub_name: Optional[str] = None,
                               **kwargs: Any) -> "EventHubConsumerClient":
        """As azure-eventhub's: an Event Hubs connection string (``EntityPath`` or
        ``eventhub_name`` names the hub; ``UseDevelopmentEmulator=true`` strings work)."""
        _require_azure_eventhub()
        from .sources.eventhub import EventHubSource

        client_options, source_options, processor_options, settings = cls._settings(kwargs, with_client=True)
        source = EventHubSource.from_connection_string(conn_str, eventhub_name=eventhub_name, **source_options,
                                                       **client_options)
        client = cls.__new__(cls)
        client._setup(source, consumer_group, owns_source=True, processor_options=processor_options, **settings)
        return client

    @classmethod
    def from_source(cls, source: EventSource, consumer_group: str = "$default", **kwargs: Any
                    ) -> "EventHubConsumerClient":
        """Over any event source (``MemoryEventSource`` in tests, an ``EventHubSource``
        you configured yourself). The source is not closed by :meth:`close`."""
        _require_azure_eventhub()
        if not isinstance(source, EventSource):
            raise ConfigurationError(f"source must be an EventSource, got {type(source).__name__}")
        _client, _source, processor_options, settings = cls._settings(kwargs, with_client=False)
        client = cls.__new__(cls)
        client._setup(source, consumer_group, owns_source=False, processor_options=processor_options, **settings)
        return client

    @staticmethod
    def _settings(kwargs: Dict[str, Any], *, with_client: bool
                  ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        kwargs = dict(kwargs)
        settings = {
            "checkpoint_store": _check_store(kwargs.pop("checkpoint_store", None)),
            "load_balancing_interval": kwargs.pop("load_balancing_interval", None),
            "partition_ownership_expiration_interval": kwargs.pop("partition_ownership_expiration_interval", None),
            "load_balancing_strategy": kwargs.pop("load_balancing_strategy", None),
            "checkpoint_on_release": kwargs.pop("checkpoint_on_release", False),
        }
        client, source, processor = _split_options(kwargs, with_client=with_client)
        return client, source, processor, settings

    def _setup(self, source: EventSource, consumer_group: str, *, owns_source: bool,
               processor_options: Dict[str, Any], checkpoint_store: CheckpointStore,
               load_balancing_interval: Optional[float], partition_ownership_expiration_interval: Optional[float],
               load_balancing_strategy: Any, checkpoint_on_release: Any) -> None:
        if not isinstance(consumer_group, str) or not consumer_group:
            raise ConfigurationError(f"consumer_group must be a non-empty string, got {consumer_group!r}")
        if not isinstance(checkpoint_on_release, bool):
            raise ConfigurationError(f"checkpoint_on_release must be True or False, got {checkpoint_on_release!r}")
        interval = 30.0 if load_balancing_interval is None else load_balancing_interval
        self._source = source
        self._owns_source = owns_source
        self._consumer_group = consumer_group
        self._store = checkpoint_store
        self._options: Dict[str, Any] = {
            **processor_options,
            "load_balancing_interval": interval,
            "partition_ownership_expiration_interval": (
                6 * interval if partition_ownership_expiration_interval is None and isinstance(interval, (int, float))
                else partition_ownership_expiration_interval),
            "load_balancing_strategy": getattr(load_balancing_strategy, "value", load_balancing_strategy) or "greedy",
        }
        self._checkpoint_on_release = checkpoint_on_release
        self._runs: Dict[str, "asyncio.Future[None]"] = {}
        self._processors: Dict[str, EventProcessor] = {}
        self._events: "weakref.WeakKeyDictionary[Any, Event]" = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return (f"EventHubConsumerClient(fully_qualified_namespace={self._source.fully_qualified_namespace!r}, "
                f"eventhub_name={self._source.eventhub_name!r}, consumer_group={self._consumer_group!r})")

    @property
    def eventhub_name(self) -> str:
        return self._source.eventhub_name

    @property
    def fully_qualified_namespace(self) -> str:
        return self._source.fully_qualified_namespace

    @property
    def processors(self) -> Mapping[str, EventProcessor]:
        """The EventProcessor of each running receive call, by partition id (``"-1"``:
        all partitions): for ``owned_partitions``, ``lag()``, ``stats``."""
        return dict(self._processors)

    async def __aenter__(self) -> "EventHubConsumerClient":
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self.close()

    async def receive_batch(
        self,
        on_event_batch: OnEventBatch,
        *,
        max_batch_size: int = 300,
        max_wait_time: Optional[float] = None,
        partition_id: Optional[str] = None,
        owner_level: Optional[int] = None,
        prefetch: int = 300,
        track_last_enqueued_event_properties: bool = False,
        starting_position: Optional[Union[StartingPosition, Mapping[str, StartingPosition]]] = None,
        starting_position_inclusive: Union[bool, Mapping[str, bool]] = False,
        on_error: Optional[OnError] = None,
        on_partition_initialize: Optional[OnPartitionInitialize] = None,
        on_partition_close: Optional[OnPartitionClose] = None,
    ) -> None:
        """Receive batches from every partition this processor owns (or from
        ``partition_id`` only) until :meth:`close`, as azure-eventhub's ``receive_batch``.

        ``on_event_batch(context, events)`` gets up to ``max_batch_size`` events, as soon
        as any are there; with ``max_wait_time`` (seconds) an empty list when none came in
        that time. ``starting_position`` applies where there is no checkpoint (default
        ``"@latest"``: only new events; see :func:`starting_positions`). ``owner_level``:
        receivers are always exclusive; they open at ``owner_level`` (default 0) plus the
        claim's epoch, so each new owner disconnects the previous one. A callback that
        raises goes to ``on_error`` and its batch is delivered again (``max_delivery_attempts``,
        then the ``on_poison`` policy). Raises :class:`ConfigurationError` for an invalid
        argument, before anything runs.
        """
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigurationError(f"max_batch_size must be an int of at least 1, got {max_batch_size!r}")
        await self._receive(on_event_batch, batch=True, max_batch_size=max_batch_size, max_wait_time=max_wait_time,
                            partition_id=partition_id, owner_level=owner_level, prefetch=prefetch,
                            track_last_enqueued_event_properties=track_last_enqueued_event_properties,
                            starting_position=starting_position,
                            starting_position_inclusive=starting_position_inclusive, on_error=on_error,
                            on_partition_initialize=on_partition_initialize, on_partition_close=on_partition_close)

    async def receive(
        self,
        on_event: OnEvent,
        *,
        max_wait_time: Optional[float] = None,
        partition_id: Optional[str] = None,
        owner_level: Optional[int] = None,
        prefetch: int = 300,
        track_last_enqueued_event_properties: bool = False,
        starting_position: Optional[Union[StartingPosition, Mapping[str, StartingPosition]]] = None,
        starting_position_inclusive: Union[bool, Mapping[str, bool]] = False,
        on_error: Optional[OnError] = None,
        on_partition_initialize: Optional[OnPartitionInitialize] = None,
        on_partition_close: Optional[OnPartitionClose] = None,
    ) -> None:
        """As :meth:`receive_batch`, one event per ``on_event(context, event)`` call (``None``
        after ``max_wait_time`` without events). Events are fetched up to 300 at a time and
        handed over one by one; when ``on_event`` raises, the events it already returned
        from are not delivered again."""
        batch = max(1, min(_SINGLE_EVENT_BATCH, prefetch)) if isinstance(prefetch, int) else _SINGLE_EVENT_BATCH
        await self._receive(on_event, batch=False, max_batch_size=batch, max_wait_time=max_wait_time,
                            partition_id=partition_id, owner_level=owner_level, prefetch=prefetch,
                            track_last_enqueued_event_properties=track_last_enqueued_event_properties,
                            starting_position=starting_position,
                            starting_position_inclusive=starting_position_inclusive, on_error=on_error,
                            on_partition_initialize=on_partition_initialize, on_partition_close=on_partition_close)

    def _processor(self, callback: Callable[..., Awaitable[None]], *, batch: bool, max_batch_size: int,
                   max_wait_time: Optional[float], partition_id: Optional[str], owner_level: Optional[int],
                   prefetch: int, track_last_enqueued_event_properties: bool, starting_position: Any,
                   starting_position_inclusive: Any, on_error: Optional[OnError],
                   on_partition_initialize: Optional[OnPartitionInitialize],
                   on_partition_close: Optional[OnPartitionClose]) -> EventProcessor:
        """The EventProcessor for one receive call (every argument checked)."""
        if partition_id is not None and (not isinstance(partition_id, str) or not partition_id):
            raise ConfigurationError(f"partition_id must be a partition id string, got {partition_id!r}")
        if owner_level is not None and (isinstance(owner_level, bool) or not isinstance(owner_level, int)
                                        or owner_level < 0):
            raise ConfigurationError(f"owner_level must be a non-negative int, got {owner_level!r}")
        if max_wait_time is not None and not isinstance(max_wait_time, bool) and max_wait_time == 0:
            max_wait_time = None  # azure-eventhub: None or 0, no empty batches
        callbacks = _Callbacks(on_event=callback, batch=batch, on_error=on_error,
                               on_partition_initialize=on_partition_initialize,
                               on_partition_close=on_partition_close,
                               checkpoint_on_release=self._checkpoint_on_release, events=self._events)
        initial, default = starting_positions(starting_position, starting_position_inclusive)
        source = _ReceiveSource(self._source, partition_id, owner_level or 0)
        store = self._store if partition_id is None else _OnePartitionStore(self._store, partition_id)
        return EventProcessor(
            source, store, lambda: _CallbackProcessor(callbacks), consumer_group=self._consumer_group,
            initial_event_position=initial, default_event_position=default, max_batch_size=max_batch_size,
            max_wait_time=max_wait_time, prefetch=prefetch,
            track_last_enqueued_event_properties=track_last_enqueued_event_properties,
            error_handler=callbacks.processor_error, **self._options)

    async def _receive(self, callback: Callable[..., Awaitable[None]], **arguments: Any) -> None:
        partition_id = arguments["partition_id"]
        key = _ALL_PARTITIONS if partition_id is None else partition_id
        busy = None
        if _ALL_PARTITIONS in self._runs:
            busy = f"from all partitions for consumer group {self._consumer_group}"
        elif partition_id is None and self._runs:
            busy = f"for consumer group {self._consumer_group}"
        elif key in self._runs:
            busy = f"from partition {partition_id} for consumer group {self._consumer_group}"
        if busy:
            raise ConfigurationError(f"this consumer client is already receiving events {busy}")
        processor = self._processor(callback, **arguments)
        runner: "asyncio.Future[None]" = asyncio.ensure_future(processor.run())
        self._runs[key] = runner
        self._processors[key] = processor
        try:
            await asyncio.wait({runner})
        except asyncio.CancelledError:
            runner.cancel()  # this call was cancelled: stop gracefully, then let the cancellation through
            await asyncio.wait({runner})
            raise
        finally:
            if self._runs.get(key) is runner:
                del self._runs[key]
                self._processors.pop(key, None)
        if not runner.cancelled() and runner.exception() is not None:
            raise runner.exception()  # type: ignore[misc]

    async def get_partition_ids(self) -> List[str]:
        """The event hub's partition ids."""
        return await self._source.get_partition_ids()

    async def get_partition_properties(self, partition_id: str) -> Dict[str, Any]:
        """As azure-eventhub's: ``eventhub_name``, ``id``, ``beginning_sequence_number``,
        ``last_enqueued_sequence_number``, ``last_enqueued_offset``,
        ``last_enqueued_time_utc`` and ``is_empty``."""
        properties = await self._source.get_partition_properties(partition_id)
        return {"eventhub_name": self._source.eventhub_name, "id": properties.partition_id,
                "beginning_sequence_number": properties.beginning_sequence_number,
                "last_enqueued_sequence_number": properties.last_enqueued_sequence_number,
                "last_enqueued_offset": properties.last_enqueued_offset,
                "last_enqueued_time_utc": properties.last_enqueued_time_utc, "is_empty": properties.is_empty}

    async def close(self) -> None:
        """Stop every receive call gracefully (each returns), then close the connections
        this client opened. The checkpoint store is left open, as azure-eventhub does."""
        runs = list(self._runs.values())
        for runner in runs:
            runner.cancel()
        if runs:
            await asyncio.wait(runs)
        if self._owns_source:
            await self._source.close()
