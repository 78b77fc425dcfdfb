"""The claim: what the code that runs for one claim of one partition holds of it.

A processor that wins a partition fences its checkpoint with the claim's epoch and hands
the claim to the partition's pump. Everything that runs for that claim (the pump, the
handler's :class:`~eventprocessor.partition.PartitionContext`, the SDK's own handlers: the
Spark sink and the drop-in for azure-eventhub's client) asks the same object, and only
it, about the claim:

* which claim it is: the partition, the owner and the epoch (the fence every checkpoint
  of this claim is written with, and the receiver's owner level);
* :meth:`Claim.may_dispatch`: may a batch be handed to the handler now (the claim is
  current and its lease has not run out)?
* :meth:`Claim.may_checkpoint`: may a checkpoint be written now (also while the handler
  closes after a stop or a handoff)?
* :meth:`Claim.fence_lost`: the store or the receiver said that another processor owns
  the partition; the processor ends the claim at once rather than at its next tick;
* :meth:`Claim.checkpointed`: a checkpoint of this claim was written;
* :attr:`Claim.home_loop`: the processor's event loop, on which a checkpoint asked for
  from a handler's worker thread is written;
* :attr:`Claim.last_enqueued`: the partition's newest event as its receiver last
  reported it.

Get the claim behind a handler's context with
:func:`~eventprocessor.partition.claim_of`.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .sources.base import LastEnqueuedEventProperties
    from .stores.records import Checkpoint

__all__ = ["Claim"]


class Claim:
    """One claim of one partition (see the module docstring).

    Example::

        claim = claim_of(context)
        if not claim.may_checkpoint():
            raise OwnershipLostError(f"partition {claim.partition_id}: the claim ended", ...)
    """

    __slots__ = ("partition_id", "owner_id", "epoch", "may_dispatch", "_may_checkpoint", "_on_fence_lost",
                 "_on_records_vanished", "_on_checkpoint", "home_loop", "last_enqueued")

    def __init__(self, *, partition_id: str, owner_id: str, epoch: int, may_dispatch: Callable[[], bool],
                 may_checkpoint: Callable[[], bool] | None = None, on_fence_lost: Callable[[], None] | None = None,
                 on_checkpoint: Callable[[Checkpoint], None] | None = None,
                 on_records_vanished: Callable[[], None] | None = None) -> None:
        self.partition_id = partition_id
        self.owner_id = owner_id
        self.epoch = epoch
        self.may_dispatch: Callable[[], bool] = may_dispatch
        """``may_dispatch()``: True while the claim is current and its lease has not run out.
        The callable itself, not a method around it: the pump asks before every batch."""
        self._may_checkpoint = may_checkpoint or may_dispatch
        self._on_fence_lost = on_fence_lost
        self._on_records_vanished = on_records_vanished
        self._on_checkpoint = on_checkpoint
        self.home_loop: asyncio.AbstractEventLoop | None = None
        """The processor's event loop, once the claim's pump runs on it."""
        self.last_enqueued: LastEnqueuedEventProperties | None = None
        """The partition's newest event as the receiver last reported it (None until it does)."""

    def __repr__(self) -> str:
        return f"Claim(partition_id={self.partition_id!r}, owner_id={self.owner_id!r}, epoch={self.epoch})"

    @property
    def fence(self) -> tuple[str, int]:
        """``(owner_id, epoch)``: what every checkpoint of this claim is written as."""
        return self.owner_id, self.epoch

    def may_checkpoint(self) -> bool:
        """True while a checkpoint of this claim may be written: while it may dispatch,
        and while its handler closes after a stop or a handoff, as long as the lease is valid."""
        return self._may_checkpoint()

    def fence_lost(self, records_vanished: bool = False) -> None:
        """Another processor owns the partition (a checkpoint was refused, the receiver
        was taken over), or, ``records_vanished``, the store lost the claim's records: the
        processor ends this claim now (and, in the second case, reports the data loss and
        claims the partition back)."""
        if self._on_fence_lost is not None:
            self._on_fence_lost()
        if records_vanished and self._on_records_vanished is not None:
            self._on_records_vanished()

    def checkpointed(self, checkpoint: Checkpoint) -> None:
        """A checkpoint of this claim was written (the processor remembers it, to notice
        a store that loses it)."""
        if self._on_checkpoint is not None:
            self._on_checkpoint(checkpoint)

    def received(self, newest: LastEnqueuedEventProperties | None) -> None:
        """The receiver reported the partition's newest event (kept unless it is None)."""
        if newest is not None:
            self.last_enqueued = newest
