"""The callbacks of one receive call, run as a :class:`~eventprocessor.PartitionProcessor`."""
from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Optional

from ..errors import ConfigurationError, OwnershipLostError
from ..events import Event
from ..partition import PartitionContext, PartitionProcessor, claim_of
from ..policies import CloseReason

if TYPE_CHECKING:  # pragma: no cover
    from azure.eventhub import EventData

from .context import ConsumerPartitionContext
from .events import to_event_data

logger = logging.getLogger(__name__)


OnEventBatch = Callable[["ConsumerPartitionContext", list["EventData"]], Awaitable[None]]
OnEvent = Callable[["ConsumerPartitionContext", Optional["EventData"]], Awaitable[None]]
OnError = Callable[[Optional["ConsumerPartitionContext"], Exception], Awaitable[None]]
OnPartitionInitialize = Callable[["ConsumerPartitionContext"], Awaitable[None]]
OnPartitionClose = Callable[["ConsumerPartitionContext", Any], Awaitable[None]]


class _Callbacks:
    """One receive call's callbacks, and what they need from the client."""

    def __init__(self, *, on_event: Callable[..., Awaitable[None]], batch: bool,
                 on_error: OnError | None, on_partition_initialize: OnPartitionInitialize | None,
                 on_partition_close: OnPartitionClose | None, checkpoint_on_release: bool,
                 events: weakref.WeakKeyDictionary[Any, Event]) -> None:
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

    async def error(self, context: ConsumerPartitionContext | None, error: Exception) -> None:
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

    async def processor_error(self, error: Exception, context: PartitionContext | None) -> None:
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
        self._context: ConsumerPartitionContext | None = None
        self._handled: int | None = None  # receive(): the last event on_event returned from, this claim
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

    async def process_events(self, events: list[Event], context: PartitionContext) -> None:
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
            if not claim_of(context).may_checkpoint():
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
