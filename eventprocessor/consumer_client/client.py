"""EventHubConsumerClient: azure-eventhub's async client, run by :class:`~eventprocessor.EventProcessor`."""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .._processor import EventProcessor
from ..errors import ConfigurationError
from ..events import Event
from ..sources.base import EventSource
from ..stores.contract import CheckpointStore
from .callbacks import OnEvent, OnEventBatch
from .official_errors import official_error
from .options import (
    _ALL_PARTITIONS,
    _SINGLE_EVENT_BATCH,
    _require_azure_eventhub,
    _resolve_store,
    _split_options,
)
from .receive_call import DEFAULT_PREFETCH, ReceiveCall, ReceiveOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)


class EventHubConsumerClient:
    """azure-eventhub's async ``EventHubConsumerClient``, run by :class:`EventProcessor`.

    Build it as the official one (:meth:`from_connection_string`, or the namespace, the
    hub, the consumer group and a credential), or over any
    :class:`~eventprocessor.sources.EventSource` with :meth:`from_source`. Then call
    :meth:`receive_batch` or :meth:`receive` with the official callbacks; each runs until
    :meth:`close` (or until its task is cancelled), then stops gracefully: batches in
    flight finish, ``on_partition_close(context, SHUTDOWN)`` runs, ownership is released.

    Keyword arguments, as in azure-eventhub: ``checkpoint_store`` (an eventprocessor
    store such as ``stores.BlobCheckpointStore``, or azure-eventhub's
    ``BlobCheckpointStore``, which is run as ``stores.BlobCheckpointStore`` on the same
    container; without one, each receive call reads every partition by itself, with
    checkpoints in memory and receivers not exclusive unless ``owner_level`` is given,
    as azure-eventhub does), ``load_balancing_interval`` (30 s), ``partition_ownership_expiration_interval``
    (6 x the interval), ``load_balancing_strategy`` (``"greedy"``) and the AMQP client
    options (``transport_type``, ``retry_total``, ``http_proxy``, ...: see
    :data:`CLIENT_OPTIONS`). Also EventProcessor's own options (:data:`PROCESSOR_OPTIONS`,
    for example ``owner_id``, ``handoff_timeout``, ``failure_policy``,
    ``meter_provider``) and ``checkpoint_on_release`` (False, as azure-eventhub: only the
    callbacks checkpoint; True checkpoints the last event of the last batch a callback
    returned from when a partition is released or handed over). Anything else raises
    :class:`ConfigurationError` naming it; values are checked when ``receive`` or
    ``receive_batch`` is called.
    """

    def __init__(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, credential: Any,
                 **kwargs: Any) -> None:
        _require_azure_eventhub()
        from ..sources.eventhub import EventHubSource

        client_options, source_options, processor_options, settings = self._settings(kwargs, with_client=True)
        source = EventHubSource(fully_qualified_namespace, eventhub_name, credential, **source_options,
                                **client_options)
        self._setup(source, consumer_group, owns_source=True, processor_options=processor_options, **settings)

    @classmethod
    def from_connection_string(cls, conn_str: str, consumer_group: str, *, eventhub_name: str | None = None,
                               **kwargs: Any) -> EventHubConsumerClient:
        """As azure-eventhub's: an Event Hubs connection string (``EntityPath`` or
        ``eventhub_name`` names the hub; ``UseDevelopmentEmulator=true`` strings work)."""
        _require_azure_eventhub()
        from ..sources.eventhub import EventHubSource

        client_options, source_options, processor_options, settings = cls._settings(kwargs, with_client=True)
        source = EventHubSource.from_connection_string(conn_str, eventhub_name=eventhub_name, **source_options,
                                                       **client_options)
        client = cls.__new__(cls)
        client._setup(source, consumer_group, owns_source=True, processor_options=processor_options, **settings)
        return client

    @classmethod
    def from_source(cls, source: EventSource, consumer_group: str = "$default", **kwargs: Any
                    ) -> EventHubConsumerClient:
        """Over any event source (``InMemoryEventSource`` in tests, an ``EventHubSource``
        you configured yourself). The source is not closed by :meth:`close`."""
        _require_azure_eventhub()
        if not isinstance(source, EventSource):
            raise ConfigurationError(f"source must be an EventSource, got {type(source).__name__}")
        _client, _source, processor_options, settings = cls._settings(kwargs, with_client=False)
        client = cls.__new__(cls)
        client._setup(source, consumer_group, owns_source=False, processor_options=processor_options, **settings)
        return client

    @staticmethod
    def _settings(kwargs: dict[str, Any], *, with_client: bool
                  ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        kwargs = dict(kwargs)
        checkpoint_store = kwargs.pop("checkpoint_store", None)
        settings = {
            "load_balancing_interval": kwargs.pop("load_balancing_interval", None),
            "partition_ownership_expiration_interval": kwargs.pop("partition_ownership_expiration_interval", None),
            "load_balancing_strategy": kwargs.pop("load_balancing_strategy", None),
            "checkpoint_on_release": kwargs.pop("checkpoint_on_release", False),
        }
        client, source, processor = _split_options(kwargs, with_client=with_client)
        settings["checkpoint_store"], settings["build_store"] = _resolve_store(checkpoint_store)
        return client, source, processor, settings

    def _setup(self, source: EventSource, consumer_group: str, *, owns_source: bool,
               processor_options: dict[str, Any], checkpoint_store: CheckpointStore | None,
               build_store: Callable[[], CheckpointStore] | None,
               load_balancing_interval: float | None, partition_ownership_expiration_interval: float | None,
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
        self._build_store = build_store
        self._options: dict[str, Any] = {
            **processor_options,
            "load_balancing_interval": interval,
            "partition_ownership_expiration_interval": (
                6 * interval if partition_ownership_expiration_interval is None and isinstance(interval, (int, float))
                else partition_ownership_expiration_interval),
            "load_balancing_strategy": getattr(load_balancing_strategy, "value", load_balancing_strategy) or "greedy",
            # It shares azure-eventhub's blob layout, so official processors may join the
            # group: they judge each record by its own age.
            "ownership_renewal": processor_options.get("ownership_renewal", "partition"),
        }
        self._checkpoint_on_release = checkpoint_on_release
        self._runs: dict[str, asyncio.Future[None]] = {}
        self._processors: dict[str, EventProcessor] = {}
        self._events: weakref.WeakKeyDictionary[Any, Event] = weakref.WeakKeyDictionary()
        if checkpoint_store is None:
            logger.info("EventHubConsumerClient for %s/%s, consumer group %s: no checkpoint_store, so, as in "
                        "azure-eventhub, each receive call reads every partition itself (no balancing with other "
                        "processes) and keeps its checkpoints in memory until it returns; pass a checkpoint store "
                        "(stores.BlobCheckpointStore, ...) to share the partitions and keep the checkpoints",
                        source.fully_qualified_namespace, source.eventhub_name, consumer_group)

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
    def source(self) -> EventSource:
        """The event source the receive calls read (an ``EventHubSource`` built from the
        connection string or credential, or the one given to :meth:`from_source`)."""
        return self._source

    @property
    def checkpoint_store(self) -> CheckpointStore | None:
        """The checkpoint store the receive calls share (``None``: each call keeps its
        checkpoints in memory). An azure-eventhub ``BlobCheckpointStore`` given to the
        constructor shows here as this SDK's store over the same container. Example::

            client = EventHubConsumerClient.from_source(source, checkpoint_store=official_store)
            print(client.checkpoint_store)   # BlobCheckpointStore(account=..., container='checkpoints')
        """
        return self._store

    @property
    def processor_options(self) -> Mapping[str, Any]:
        """The :class:`~eventprocessor.EventProcessor` options each receive call starts its
        processor with (the azure-eventhub defaults applied: an expiration of six
        intervals, GREEDY), read-only."""
        return MappingProxyType(self._options)

    @property
    def processors(self) -> Mapping[str, EventProcessor]:
        """The EventProcessor of each running receive call, by partition id (``"-1"``:
        all partitions): for ``owned_partitions``, ``lag()``, ``stats``."""
        return dict(self._processors)

    async def __aenter__(self) -> EventHubConsumerClient:
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self.close()

    async def receive_batch(self, on_event_batch: OnEventBatch, *, max_batch_size: int = 300,
                            **options: Unpack[ReceiveOptions]) -> None:
        """Receive batches from every partition this processor owns (or from
        ``partition_id`` only) until :meth:`close`, as azure-eventhub's ``receive_batch``.

        ``on_event_batch(context, events)`` gets up to ``max_batch_size`` events, as soon
        as any are there; with ``max_wait_time`` (seconds) an empty list when none came in
        that time. ``starting_position`` applies where there is no checkpoint (default
        ``"@latest"``: only new events; see :func:`starting_positions`). ``owner_level``:
        with a checkpoint store, receivers are always exclusive; they open at
        ``owner_level`` (default 0) plus the claim's epoch, so each new owner disconnects
        the previous one. Without one, as in azure-eventhub, they open at ``owner_level``
        (default None: not exclusive). A callback that
        raises goes to ``on_error`` and its batch is delivered again (as ``failure_policy``
        says: ``max_delivery_attempts``, then ``on_poison``). ``max_concurrency`` and
        ``ordering`` (``"key"`` or ``"none"``): up to that many callbacks in flight per
        partition, each with events of one partition key under ``"key"``, each with a
        context whose ``update_checkpoint()`` checkpoints its own events (see
        docs/concepts/concurrency.md). Raises :class:`ConfigurationError` for an invalid
        argument, before anything runs. The keyword arguments besides ``max_batch_size``
        are :class:`ReceiveOptions`, shared with :meth:`receive`; an unknown one raises
        ``TypeError`` naming it.
        """
        await self._receive(ReceiveCall.of("receive_batch", on_event_batch, True, max_batch_size, options))

    async def receive(self, on_event: OnEvent, **options: Unpack[ReceiveOptions]) -> None:
        """As :meth:`receive_batch`, one event per ``on_event(context, event)`` call (``None``
        after ``max_wait_time`` without events). Events are fetched up to 300 at a time and
        handed over one by one; when ``on_event`` raises, the events it already returned
        from are not delivered again."""
        prefetch = options.get("prefetch", DEFAULT_PREFETCH)
        batch = max(1, min(_SINGLE_EVENT_BATCH, prefetch)) if isinstance(prefetch, int) else _SINGLE_EVENT_BATCH
        await self._receive(ReceiveCall.of("receive", on_event, False, batch, options))

    async def _receive(self, call: ReceiveCall) -> None:
        key = _ALL_PARTITIONS if call.partition_id is None else call.partition_id
        busy = None
        if _ALL_PARTITIONS in self._runs:
            busy = f"from all partitions for consumer group {self._consumer_group}"
        elif call.partition_id is None and self._runs:
            busy = f"for consumer group {self._consumer_group}"
        elif key in self._runs:
            busy = f"from partition {call.partition_id} for consumer group {self._consumer_group}"
        if busy:
            raise ConfigurationError(f"this consumer client is already receiving events {busy}")
        processor = call.processor(self._source, self._store, self._consumer_group, options=self._options,
                                   checkpoint_on_release=self._checkpoint_on_release, events=self._events)
        runner: asyncio.Future[None] = asyncio.ensure_future(processor.run())
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
        failure = None if runner.cancelled() else runner.exception()
        if failure is not None:
            raise official_error(failure)

    async def get_eventhub_properties(self) -> dict[str, Any]:
        """As azure-eventhub's: ``eventhub_name``, ``created_at`` (a UTC datetime; None
        from a source that does not know it) and ``partition_ids``, asked of the hub now.
        Raises azure-eventhub's exceptions (``ConnectError``, ``AuthenticationError``, ...)."""
        try:
            properties = await self._source.get_eventhub_properties()
        except Exception as error:
            raise official_error(error) from None
        return {"eventhub_name": properties.eventhub_name, "created_at": properties.created_at,
                "partition_ids": list(properties.partition_ids)}

    async def get_partition_ids(self) -> list[str]:
        """The event hub's partition ids, asked of the hub now (as azure-eventhub's)."""
        return (await self.get_eventhub_properties())["partition_ids"]

    async def get_partition_properties(self, partition_id: str) -> dict[str, Any]:
        """As azure-eventhub's: ``eventhub_name``, ``id``, ``beginning_sequence_number``,
        ``last_enqueued_sequence_number``, ``last_enqueued_offset``,
        ``last_enqueued_time_utc`` and ``is_empty``."""
        try:
            properties = await self._source.get_partition_properties(partition_id)
        except Exception as error:
            raise official_error(error) from None
        return {"eventhub_name": self._source.eventhub_name, "id": properties.partition_id,
                "beginning_sequence_number": properties.beginning_sequence_number,
                "last_enqueued_sequence_number": properties.last_enqueued_sequence_number,
                "last_enqueued_offset": properties.last_enqueued_offset,
                "last_enqueued_time_utc": properties.last_enqueued_time_utc, "is_empty": properties.is_empty}

    async def close(self) -> None:
        """Stop every receive call gracefully (each returns), then close the connections
        this client opened. A checkpoint store passed in is left open, as azure-eventhub
        does; the one built here from azure-eventhub's ``BlobCheckpointStore`` is closed
        (the official store itself is left as it is)."""
        runs = list(self._runs.values())
        for runner in runs:
            runner.cancel()
        if runs:
            await asyncio.wait(runs)
        if self._owns_source:
            await self._source.close()
        if self._build_store is not None and self._store is not None:
            # Built here from azure-eventhub's store, so nobody else can close it. The client
            # may receive again after close(), as azure-eventhub's can: a new one then.
            await self._store.close()
            self._store = self._build_store()
