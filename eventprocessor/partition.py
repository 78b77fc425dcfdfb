"""What user code sees: PartitionProcessor and PartitionContext (CloseReason is in
:mod:`eventprocessor.policies`), and :func:`claim_of`, the claim behind a context."""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._claim import Claim
from .errors import InvalidCheckpointError, OwnershipLostError
from .events import Event
from .policies import CloseReason
from .stores.records import Checkpoint, DoneBeyond

if TYPE_CHECKING:  # pragma: no cover
    from .sources.base import LastEnqueuedEventProperties
    from .state import PartitionState, StateKeeper
    from .stores.contract import CheckpointRecords

__all__ = ["PartitionContext", "PartitionProcessor", "claim_of", "write_checkpoint"]

logger = logging.getLogger(__name__)

NONE_DONE = DoneBeyond()

_LOGGED: weakref.WeakSet[BaseException] = weakref.WeakSet()
"""Errors the SDK already logged (with their traceback): the default ``process_error``
does not log them a second time."""


def already_logged(error: BaseException) -> None:
    """Mark ``error`` as logged by the SDK (see :meth:`PartitionProcessor.process_error`)."""
    try:
        _LOGGED.add(error)
    except TypeError:  # pragma: no cover - an exception type without weak references
        pass


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
        checkpoint_store: CheckpointRecords,
        is_owned: Callable[[], bool],
        may_checkpoint: Callable[[], bool] | None = None,
        on_ownership_lost: Callable[[], None] | None = None,
        on_checkpoint: Callable[[Checkpoint], None] | None = None,
        state: StateKeeper | None = None,
        on_records_vanished: Callable[[], None] | None = None,
    ) -> None:
        self.fully_qualified_namespace = fully_qualified_namespace
        self.eventhub_name = eventhub_name
        self.consumer_group = consumer_group
        self.partition_id = partition_id
        self.owner_id = owner_id
        self.epoch = epoch
        self.last_event: Event | None = None
        self.last_checkpoint: Checkpoint | None = None
        self._store = checkpoint_store
        self._claim = Claim(partition_id=partition_id, owner_id=owner_id, epoch=epoch, may_dispatch=is_owned,
                            may_checkpoint=may_checkpoint, on_fence_lost=on_ownership_lost, on_checkpoint=on_checkpoint,
                            on_records_vanished=on_records_vanished)
        self._state = state

    def __repr__(self) -> str:
        return (
            f"PartitionContext(eventhub_name={self.eventhub_name!r}, consumer_group={self.consumer_group!r}, "
            f"partition_id={self.partition_id!r}, owner_id={self.owner_id!r}, epoch={self.epoch})"
        )

    @property
    def last_enqueued_event_properties(self) -> LastEnqueuedEventProperties | None:
        """The partition's newest event (sequence number, offset, enqueued time) and when
        the source reported it; set when the processor runs with
        ``track_last_enqueued_event_properties=True``, else None."""
        return self._claim.last_enqueued

    @property
    def lag(self) -> int | None:
        """Events enqueued after the last one delivered here (None while unknown)."""
        newest, delivered = self._claim.last_enqueued, self.last_event
        if newest is None:
            return None
        if delivered is None:
            base = self.last_checkpoint.sequence_number if self.last_checkpoint is not None else -1
            return max(0, newest.sequence_number - base)
        return max(0, newest.sequence_number - delivered.sequence_number)

    @property
    def state(self) -> PartitionState:
        """This partition's state: a mutable mapping of string keys to JSON values,
        private to this claim, restored before the first batch and committed together
        with the position by :meth:`update_checkpoint` (``EventProcessor(...,
        stateful=True)``). A batch whose handler raises is rolled back before it is
        delivered again. Assign to change a value (a list or dict read is a copy).

        Example::

            context.state[key] = context.state.get(key, 0) + 1
        """
        if self._state is None:
            from .errors import ConfigurationError

            raise ConfigurationError("context.state needs a stateful processor: EventProcessor(..., stateful=True)")
        return self._state.state

    @property
    def state_restored(self) -> Any | None:
        """How this claim's state was loaded (:class:`~eventprocessor.state.Restored`:
        the head, entries and bytes read, ``warm`` when it came from a warm replica), or
        None for a stateless processor."""
        return self._state.restored if self._state is not None else None

    @property
    def is_owned(self) -> bool:
        """True while this claim is current and its lease has not run out."""
        return self._claim.may_dispatch()

    async def update_checkpoint(self, event: Event | None = None, *, allow_rewind: bool = False) -> None:
        """Record that processing got as far as ``event`` (default: the last delivered).

        ``event`` must be an event of this partition delivered in this claim. A position
        before the last checkpoint is refused unless ``allow_rewind=True`` (to replay on
        purpose); the same position again is a no-op. Refusals raise
        :class:`InvalidCheckpointError` and write nothing.

        Raises :class:`OwnershipLostError` when this processor no longer owns the
        partition; the stored checkpoint is then left as the current owner wrote it.

        Called from a handler that runs in a worker thread (``handler_executor``), the
        write is carried out on the processor's event loop and awaited from the thread's.
        """
        claim = self._claim
        home = claim.home_loop
        if home is not None and home is not asyncio.get_running_loop():
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self.update_checkpoint(event, allow_rewind=allow_rewind), home))
        event = event if event is not None else self.last_event
        if event is None:
            return
        self._check_checkpoint_event(event, allow_rewind)
        last, keeper = self.last_checkpoint, self._state
        if last is not None and last.sequence_number == event.sequence_number and last.epoch == self.epoch \
                and (keeper is None or not keeper.state.changed):
            return
        if keeper is not None and last is not None and event.sequence_number < last.sequence_number:
            raise InvalidCheckpointError(
                f"update_checkpoint on partition {self.partition_id} would move a stateful partition's checkpoint back "
                f"from sequence number {last.sequence_number} to {event.sequence_number}: its state cannot move back "
                "with it")
        await self._commit(event.sequence_number, event.offset)

    async def _commit(self, sequence_number: int, offset: str | None, done: DoneBeyond = NONE_DONE) -> None:
        """Write the checkpoint at ``sequence_number`` (with the events ``done`` beyond it),
        fenced by this claim's epoch, with the state's change when the partition is stateful."""
        claim, keeper = self._claim, self._state
        if not claim.may_checkpoint():
            raise OwnershipLostError(
                f"partition {self.partition_id} is no longer owned by {self.owner_id}",
                partition_id=self.partition_id,
            )
        # The state's change is written first; the checkpoint names it, fenced by the
        # claim's epoch, so the position and the state are committed together or not at all.
        state_ref = await keeper.prepare(sequence_number) if keeper is not None else None
        checkpoint = Checkpoint(
            fully_qualified_namespace=self.fully_qualified_namespace,
            eventhub_name=self.eventhub_name,
            consumer_group=self.consumer_group,
            partition_id=self.partition_id,
            sequence_number=sequence_number,
            offset=offset,
            owner_id=self.owner_id,
            epoch=self.epoch,
            state=state_ref,
            done_beyond=done,
        )
        try:
            await self._store.update_checkpoint(checkpoint, owner_id=self.owner_id, epoch=self.epoch)
        except OwnershipLostError as lost:
            # The store knows better than our lease: stop dispatching this claim now
            # rather than at the next load-balancing tick.
            if keeper is not None:
                keeper.failed()
            if lost.records_vanished:
                # Nobody took the partition: the store lost the records. The handler's
                # work up to here is done, and it is where this processor resumes when
                # it claims the partition back (refuse_checkpoint_rewind).
                claim.checkpointed(checkpoint)
            claim.fence_lost(lost.records_vanished)
            raise
        except BaseException:
            if keeper is not None:
                keeper.failed()
            raise
        if keeper is not None:
            keeper.committed(state_ref)
        self.last_checkpoint = checkpoint
        claim.checkpointed(checkpoint)


    def _check_checkpoint_event(self, event: Event, allow_rewind: bool) -> None:
        if not isinstance(event, Event):
            raise InvalidCheckpointError(f"update_checkpoint takes an Event, got {type(event).__name__}")
        if event.partition_id is not None and event.partition_id != self.partition_id:
            raise InvalidCheckpointError(
                f"update_checkpoint on partition {self.partition_id} with an event of partition "
                f"{event.partition_id} (sequence number {event.sequence_number}): each partition's context "
                "checkpoints only its own events")
        delivered = self.last_event
        if delivered is None or event.sequence_number > delivered.sequence_number:
            raise InvalidCheckpointError(
                f"update_checkpoint on partition {self.partition_id} with sequence number {event.sequence_number}, "
                f"which was not delivered in this claim (last delivered: "
                f"{'none' if delivered is None else delivered.sequence_number}); checkpointing it would skip events")
        last = self.last_checkpoint
        if last is not None and event.sequence_number < last.sequence_number and not allow_rewind:
            raise InvalidCheckpointError(
                f"update_checkpoint on partition {self.partition_id} would move the checkpoint back from sequence "
                f"number {last.sequence_number} to {event.sequence_number}; pass allow_rewind=True to replay on "
                "purpose")


class PartitionProcessor:
    """Subclass and override what you need. One instance is made per partition claim.

    Example::

        class Totals(PartitionProcessor):
            async def initialize(self, context):
                self.total = 0

            async def process_events(self, events, context):
                self.total += sum(len(event.body) for event in events)
                await context.update_checkpoint()

            async def close(self, reason, context):
                print(f"partition {context.partition_id}: {self.total} bytes, closed for {reason.value}")

        EventProcessor(source, store, Totals)

    ``process_events`` is awaited for each batch, one batch at a time per partition
    (with ``max_concurrency`` > 1, many calls at once: docs/concepts/concurrency.md).
    If it raises, ``process_error`` gets the exception and the batch is delivered again
    (a bounded number of times: see the processor's ``failure_policy``,
    :class:`~eventprocessor.policies.FailurePolicy`), so no event is lost.
    """

    checkpoint_on_release: bool = True
    """When a claim ends gracefully (the processor stops, or hands the partition over to
    a processor that asked for it), checkpoint the last event of the last batch that
    ``process_events`` completed, once ``close`` has returned, unless ``close`` already
    checkpointed at or past it. That is what makes planned moves free of duplicates.
    Handlers that acknowledge events only after ``process_events`` returns (they buffer
    and write later) set this to False and checkpoint in ``close`` themselves."""

    async def initialize(self, context: PartitionContext) -> None:
        """Called once before the first batch of this claim."""

    async def process_events(self, events: list[Event], context: PartitionContext) -> None:
        """Called with each batch (never empty unless ``max_wait_time`` is set)."""

    async def process_error(self, error: Exception, context: PartitionContext) -> None:
        """Called with errors from the handler, the receiver or ownership renewals.

        By default logs a WARNING, unless the SDK already logged the error (a failure of
        ``process_events`` is logged once per attempt, with its traceback)."""
        if error in _LOGGED:
            return
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


def claim_of(context: PartitionContext) -> Claim:
    """The processor's claim behind ``context`` (see :mod:`eventprocessor._claim`): what the
    SDK's own code that runs for a claim (the pump, the Spark sink, the drop-in) asks about
    it, instead of the context's private members.

    Example::

        if not claim_of(context).may_checkpoint():
            ...  # the claim ended in the middle of a batch
    """
    return context._claim


async def write_checkpoint(context: PartitionContext, sequence_number: int, offset: str | None,
                           done: DoneBeyond = NONE_DONE) -> None:
    """Write the checkpoint of ``context``'s claim at ``sequence_number`` with the events
    ``done`` beyond it, fenced like every checkpoint of the claim: what the SDK's own
    code writes for a partition with many events in flight (the handler's
    ``update_checkpoint`` names one event instead)."""
    await context._commit(sequence_number, offset, done)
