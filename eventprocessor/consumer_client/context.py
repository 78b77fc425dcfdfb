"""ConsumerPartitionContext: the official partition context's attributes, fenced checkpoints."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..events import Event
from ..partition import PartitionContext

if TYPE_CHECKING:  # pragma: no cover
    from azure.eventhub import EventData

from .events import _from_event_data
from .official_errors import official_error


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

    def __init__(self, context: PartitionContext, events: weakref.WeakKeyDictionary[Any, Event]) -> None:
        self._context = context
        self._events = events
        self._current: Event | None = None

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
    def lag(self) -> int | None:
        """Events enqueued after the last one delivered (needs track_last_enqueued_event_properties)."""
        return self._context.lag

    @property
    def last_enqueued_event_properties(self) -> dict[str, Any] | None:
        """``sequence_number``, ``offset``, ``enqueued_time`` and ``retrieval_time`` of the
        partition's newest event, as azure-eventhub gives them; None unless the receive
        call set ``track_last_enqueued_event_properties=True``."""
        newest = self._context.last_enqueued_event_properties
        if newest is None:
            return None
        return {"sequence_number": newest.sequence_number, "offset": newest.offset,
                "enqueued_time": newest.enqueued_time, "retrieval_time": newest.retrieval_time}

    async def update_checkpoint(self, event: EventData | None = None, *, allow_rewind: bool = False) -> None:
        """Checkpoint ``event`` (default: the last event handed to a callback)."""
        if event is None:
            target = self._current
        else:
            target = self._events.get(event)
            if target is None:
                target = _from_event_data(event)
        if target is None:
            return
        try:
            await self._context.update_checkpoint(target, allow_rewind=allow_rewind)
        except Exception as error:
            official_error(error)  # azure-eventhub's class too, in place (an OwnershipLostError, ...)
            raise
