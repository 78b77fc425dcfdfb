"""What user code sees: PartitionProcessor, PartitionContext and CloseReason."""
from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Callable, List, Optional

from .errors import OwnershipLostError
from .events import Event
from .records import Checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from .checkpoint_store import CheckpointStore

__all__ = ["CloseReason", "PartitionContext", "PartitionProcessor"]

logger = logging.getLogger(__name__)


class CloseReason(enum.Enum):
    """Why a partition stopped being processed here."""

    SHUTDOWN = "shutdown"
    """``EventProcessor.stop()`` was called; ownership is released."""
    OWNERSHIP_LOST = "ownership_lost"
    """Another processor took the partition, a renewal failed, the receiver was
    disconnected by a higher owner level, or the lease ran out (self-fencing)."""


class PartitionContext:
    """The partition a handler is working on, and the way to checkpoint it.

    One context exists per claim: once the claim ends, ``update_checkpoint`` raises
    :class:`OwnershipLostError` without touching the store.

    Example::

        async def process_events(self, events, context):
            ...
            await context.update_checkpoint()   # checkpoints the last event delivered
    """

    def __init__(
        self,
        *,
        fully_qualified_namespace: str,
        eventhub_name: str,
        consumer_group: str,
        partition_id: str,
        owner_id: str,
        epoch: int,
        checkpoint_store: "CheckpointStore",
        is_owned: Callable[[], bool],
        on_ownership_lost: Optional[Callable[[], None]] = None,
    ) -> None:
        self.fully_qualified_namespace = fully_qualified_namespace
        self.eventhub_name = eventhub_name
        self.consumer_group = consumer_group
        self.partition_id = partition_id
        self.owner_id = owner_id
        self.epoch = epoch
        self.last_event: Optional[Event] = None
        self.last_checkpoint: Optional[Checkpoint] = None
        self._store = checkpoint_store
        self._is_owned = is_owned
        self._on_ownership_lost = on_ownership_lost

    def __repr__(self) -> str:
        return (
            f"PartitionContext(eventhub_name={self.eventhub_name!r}, consumer_group={self.consumer_group!r}, "
            f"partition_id={self.partition_id!r}, owner_id={self.owner_id!r}, epoch={self.epoch})"
        )

    @property
    def is_owned(self) -> bool:
        """True while this claim is current and its lease has not run out."""
        return self._is_owned()

    def _ownership_lost(self) -> None:
        if self._on_ownership_lost is not None:
            self._on_ownership_lost()

    async def update_checkpoint(self, event: Optional[Event] = None) -> None:
        """Record that processing got as far as ``event`` (default: the last delivered).

        Raises :class:`OwnershipLostError` when this processor no longer owns the
        partition; the stored checkpoint is then left as the current owner wrote it.
        """
        event = event if event is not None else self.last_event
        if event is None:
            return
        if not self._is_owned():
            raise OwnershipLostError(
                f"partition {self.partition_id} is no longer owned by {self.owner_id}",
                partition_id=self.partition_id,
            )
        checkpoint = Checkpoint(
            fully_qualified_namespace=self.fully_qualified_namespace,
            eventhub_name=self.eventhub_name,
            consumer_group=self.consumer_group,
            partition_id=self.partition_id,
            sequence_number=event.sequence_number,
            offset=event.offset,
            owner_id=self.owner_id,
            epoch=self.epoch,
        )
        try:
            await self._store.update_checkpoint(checkpoint, owner_id=self.owner_id, epoch=self.epoch)
        except OwnershipLostError:
            # The store knows better than our lease: stop dispatching this claim now
            # rather than at the next load-balancing tick.
            self._ownership_lost()
            raise
        self.last_checkpoint = checkpoint


class PartitionProcessor:
    """Subclass and override what you need. One instance is made per partition claim.

    Example::

        class Printer(PartitionProcessor):
            async def process_events(self, events, context):
                for event in events:
                    print(context.partition_id, event.body_as_str())
                await context.update_checkpoint()

        EventProcessor(source, store, Printer)

    ``process_events`` is awaited for each batch, one batch at a time per partition.
    If it raises, ``process_error`` gets the exception and the partition resumes from
    its last checkpoint, so no event is lost (some are delivered again).
    """

    async def initialize(self, context: PartitionContext) -> None:
        """Called once before the first batch of this claim."""

    async def process_events(self, events: List[Event], context: PartitionContext) -> None:
        """Called with each batch (never empty unless ``max_wait_time`` is set)."""

    async def process_error(self, error: Exception, context: PartitionContext) -> None:
        """Called with errors from the handler, the receiver or ownership renewals."""
        logger.warning(
            "error on partition %s of %s/%s owned by %s: %r",
            context.partition_id,
            context.eventhub_name,
            context.consumer_group,
            context.owner_id,
            error,
        )

    async def close(self, reason: CloseReason, context: PartitionContext) -> None:
        """Called once when the claim ends."""


PartitionProcessorFactory = Callable[[], PartitionProcessor]
