"""One ``receive`` / ``receive_batch`` call of the drop-in: its arguments, checked, and the
:class:`~eventprocessor.EventProcessor` that runs it."""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from .._processor import EventProcessor
from ..errors import ConfigurationError
from ..sources.base import EventSource
from ..stores.contract import CheckpointStore
from .callbacks import OnError, OnPartitionClose, OnPartitionInitialize, _CallbackProcessor, _Callbacks
from .options import StartingPosition, _memory_store, starting_positions
from .views import _OnePartitionStore, _ReceiveSource

__all__ = ["ReceiveCall", "ReceiveOptions", "DEFAULT_PREFETCH"]

DEFAULT_PREFETCH = 300


class ReceiveOptions(TypedDict, total=False):
    """The keyword arguments ``receive`` and ``receive_batch`` share, as azure-eventhub's
    (defaults in brackets): ``max_wait_time`` (None), ``partition_id`` (None: every
    partition this client owns), ``owner_level`` (None), ``prefetch`` (300),
    ``track_last_enqueued_event_properties`` (False), ``starting_position`` (None:
    ``"@latest"``), ``starting_position_inclusive`` (False), ``on_error``,
    ``on_partition_initialize``, ``on_partition_close`` (None), and this SDK's
    ``max_concurrency`` and ``ordering`` (None: one callback at a time per partition).
    See :meth:`EventHubConsumerClient.receive_batch`."""

    max_wait_time: float | None
    partition_id: str | None
    owner_level: int | None
    prefetch: int
    track_last_enqueued_event_properties: bool
    starting_position: StartingPosition | Mapping[str, StartingPosition] | None
    starting_position_inclusive: bool | Mapping[str, bool]
    on_error: OnError | None
    on_partition_initialize: OnPartitionInitialize | None
    on_partition_close: OnPartitionClose | None
    max_concurrency: int | None
    ordering: str | None


@dataclass(frozen=True)
class ReceiveCall:
    """The arguments of one receive call, as azure-eventhub's ``receive_batch`` takes them
    (``batch``: ``receive_batch``, else ``receive``)."""

    callback: Callable[..., Awaitable[None]]
    batch: bool
    max_batch_size: int
    max_wait_time: float | None = None
    partition_id: str | None = None
    owner_level: int | None = None
    prefetch: int = DEFAULT_PREFETCH
    track_last_enqueued_event_properties: bool = False
    starting_position: Any = None
    starting_position_inclusive: Any = False
    on_error: OnError | None = None
    on_partition_initialize: OnPartitionInitialize | None = None
    on_partition_close: OnPartitionClose | None = None
    max_concurrency: int | None = None
    ordering: str | None = None

    @classmethod
    def of(cls, method: str, callback: Callable[..., Awaitable[None]], batch: bool, max_batch_size: int,
           options: Mapping[str, Any]) -> ReceiveCall:
        """The call ``method(callback, **options)``; ``TypeError`` for an unknown keyword
        argument, as a Python signature would say it."""
        unknown = sorted(set(options) - set(ReceiveOptions.__annotations__))
        if unknown:
            known = ", ".join(["max_batch_size"] * batch + sorted(ReceiveOptions.__annotations__))
            raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r} (it takes {known})")
        return cls(callback, batch, max_batch_size, **options)

    def check(self) -> None:
        """Raise :class:`ConfigurationError` for an argument the official client would refuse."""
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) \
                or self.max_batch_size < 1:
            raise ConfigurationError(f"max_batch_size must be an int of at least 1, got {self.max_batch_size!r}")
        if self.partition_id is not None and (not isinstance(self.partition_id, str) or not self.partition_id):
            raise ConfigurationError(f"partition_id must be a partition id string, got {self.partition_id!r}")
        level = self.owner_level
        if level is not None and (isinstance(level, bool) or not isinstance(level, int) or level < 0):
            raise ConfigurationError(f"owner_level must be a non-negative int, got {level!r}")

    def processor(self, source: EventSource, store: CheckpointStore | None, consumer_group: str, *,
                  options: dict[str, Any], checkpoint_on_release: bool, events: Any) -> EventProcessor:
        """The EventProcessor that runs this call over ``source`` (and ``store``; None: a
        fresh in-memory store, receivers exclusive only at an ``owner_level`` given, as
        azure-eventhub reads without a checkpoint store)."""
        self.check()
        max_wait_time = self.max_wait_time
        if max_wait_time is not None and not isinstance(max_wait_time, bool) and max_wait_time == 0:
            max_wait_time = None  # azure-eventhub: None or 0, no empty batches
        callbacks = _Callbacks(on_event=self.callback, batch=self.batch, on_error=self.on_error,
                               on_partition_initialize=self.on_partition_initialize,
                               on_partition_close=self.on_partition_close,
                               checkpoint_on_release=checkpoint_on_release, events=events)
        initial, default = starting_positions(self.starting_position, self.starting_position_inclusive)
        exclusive = store is not None
        used = store if store is not None else _memory_store(options.get("clock"))
        view = _ReceiveSource(source, self.partition_id, self.owner_level, exclusive=exclusive)
        if self.partition_id is not None:
            used = _OnePartitionStore(used, self.partition_id)
        return EventProcessor(
            view, used, lambda: _CallbackProcessor(callbacks), consumer_group=consumer_group,
            initial_event_position=initial, default_event_position=default, max_batch_size=self.max_batch_size,
            max_wait_time=max_wait_time, prefetch=self.prefetch,
            track_last_enqueued_event_properties=self.track_last_enqueued_event_properties,
            error_handler=callbacks.processor_error, max_concurrency=self.max_concurrency,
            ordering=self.ordering,
            # azure-eventhub's receive keeps trying a hub it cannot reach (on_error hears of it)
            **{"source_startup_timeout": None, **options})
