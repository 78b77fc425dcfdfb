"""StateKeeper: the state of one claim, from restore to the last commit.

* **restore** (before the first dispatch): the state at the checkpoint's state head; a
  chain that cannot be read, or that ends at another position than the checkpoint, is
  an error, and the partition is not dispatched on an empty state;
* **commit** (``update_checkpoint``): append the change since the last commit, then the
  checkpoint names it (:meth:`prepare`, then :meth:`committed` once the fenced write
  succeeded);
* **batches**: the pump brackets each delivery, so a batch whose handler raises is rolled
  back before it is delivered again;
* **snapshots**: every ``snapshot_every`` commits, or once the changes since the last
  snapshot outweigh the state and one store entry, a snapshot is written by a task of
  the keeper's own and older entries are deleted; :meth:`close` waits for it (or
  cancels it).
"""
from __future__ import annotations

import asyncio
import logging

from ..errors import OwnershipLostError
from ..stores.records import MAX_ENTRY_BYTES, Checkpoint, StateRef
from .log import Restored, StateLog, StateUnreadableError
from .mapping import PartitionState, encode

__all__ = ["StateKeeper", "SNAPSHOT_EVERY"]

logger = logging.getLogger(__name__)

SNAPSHOT_EVERY = 100
"""Commits between snapshots (at most; sooner when the changes outweigh the state)."""


class StateKeeper:
    """One claim's state (see the module docstring).

    Example::

        keeper = StateKeeper(StateLog(store, scope, "0"), epoch=7)
        await keeper.restore(checkpoint)          # before the first dispatch
        keeper.state["k"] = 1
        ref = await keeper.prepare(sequence_number=41)
        ... write the checkpoint naming ref ...
        keeper.committed(ref)
    """

    def __init__(self, log: StateLog, *, epoch: int, snapshot_every: int = SNAPSHOT_EVERY,
                 state: PartitionState | None = None, head: StateRef | None = None) -> None:
        self.log = log
        self.epoch = epoch
        self.snapshot_every = snapshot_every
        self.state = state if state is not None else PartitionState()
        self.head: StateRef | None = head
        self.restored: Restored | None = None
        self._next_version = (head.version + 1) if head is not None else 1
        self._adopted = False
        self._pending: tuple | None = None  # (ref, changes, sequence number) appended, not yet checkpointed
        self._head_sequence = -1  # the checkpoint position the head goes with
        self._since_snapshot = 0
        self._bytes_since_snapshot = 0
        self._snapshotting: asyncio.Task | None = None
        self.commits = 0
        self.change_bytes = 0
        """Bytes of changes written (one entry per commit that changed something)."""
        self.snapshot_bytes = 0
        """Bytes of snapshots written (in the background)."""

    # ----------------------------------------------------------------- restore
    async def restore(self, checkpoint: Checkpoint | None) -> Restored:
        """Load the state that goes with ``checkpoint`` (``None``: no checkpoint yet).

        Raises :class:`StateUnreadableError` when the chain cannot be read, or does not
        end at the checkpoint's position, or when the checkpoint names no state while
        the partition has state entries (a stateless processor checkpointed over it)."""
        if self._adopted:
            self._adopted = False
            applied = await self.catch_up(checkpoint)
            if applied >= 0:  # a warm replica's state, and the few changes since
                self.restored = Restored(self.state.texts(), self.head, self._head_sequence, applied, warm=True)
            assert self.restored is not None  # catch_up restored fully when the changes were compacted away
            return self.restored
        head = None if checkpoint is None else checkpoint.state
        if head is None and checkpoint is not None and checkpoint.sequence_number >= 0:
            if await self.log.has_entries():
                raise StateUnreadableError(
                    f"partition {self.log.partition_id}: its checkpoint (sequence number "
                    f"{checkpoint.sequence_number}) names no state, but the partition has state entries: a processor "
                    "without stateful=True (or another SDK) checkpointed it; its state cannot be matched to the "
                    "position")
        restored = await self.log.restore(head)
        if head is not None and checkpoint is not None and restored.sequence_number is not None \
                and restored.sequence_number != checkpoint.sequence_number:
            raise StateUnreadableError(
                f"partition {self.log.partition_id}: its state {head} was written with the checkpoint at sequence "
                f"number {restored.sequence_number}, but the checkpoint is at {checkpoint.sequence_number}")
        self.state = PartitionState(restored.texts)
        self.head = head
        if checkpoint is not None:
            self._head_sequence = checkpoint.sequence_number
        self._next_version = max(self._next_version, (head.version + 1) if head is not None else 1)
        self._since_snapshot = restored.changes_since_snapshot
        self.restored = restored
        return restored

    def adopt(self, state: PartitionState, head: StateRef | None, sequence_number: int | None) -> None:
        """Start from a warm replica's state at ``head``: :meth:`restore` then only
        catches up with the checkpoint."""
        self.state, self.head, self._adopted = state, head, True
        self._head_sequence = -1 if sequence_number is None else sequence_number
        self._next_version = max(self._next_version, (head.version + 1) if head is not None else 1)

    async def catch_up(self, checkpoint: Checkpoint | None) -> int:
        """From a warm replica's head to ``checkpoint``'s: apply the changes between
        (a few, at a planned move); restore fully when they were compacted away.
        Returns the changes applied (-1: restored instead)."""
        target = None if checkpoint is None else checkpoint.state
        if target == self.head:
            return 0
        if target is not None:
            changes = await self.log.changes_between(self.head, target)
            if changes is not None:
                for change in changes:
                    self.state.apply({**dict.fromkeys(change.get("del", ()), None),
                                      **{key: encode(value) for key, value in change.get("set", {}).items()}})
                self.head = target
                self._head_sequence = changes[-1].get("seq", -1) if changes else self._head_sequence
                self._next_version = max(self._next_version, target.version + 1)
                return len(changes)
        await self.restore(checkpoint)
        return -1

    # ----------------------------------------------------------------- commits
    async def prepare(self, sequence_number: int) -> StateRef | None:
        """Before a checkpoint at ``sequence_number`` is written: append what changed
        since the last commit and return the head the checkpoint must name."""
        if not self.state.changed:
            return self.head
        ref = StateRef(self._next_version, self.epoch)
        self._next_version += 1  # a version is never reused, even if this commit fails
        changes = self.state.changes()
        written = await self.log.append(prev=self.head, ref=ref, sequence_number=sequence_number, changes=changes)
        self._pending = (ref, changes, sequence_number)
        self.change_bytes += written
        self._bytes_since_snapshot += written
        return ref

    def committed(self, ref: StateRef | None) -> None:
        """The checkpoint naming ``ref`` was written."""
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != ref:
            return
        self.head, self._head_sequence = ref, pending[2]
        self.state.committed(pending[1])
        self.state.keep_batch_so_far()  # a batch that fails after this commit rolls back to here, not before
        self.commits += 1
        self._since_snapshot += 1
        self._maybe_snapshot()

    def failed(self) -> None:
        """The checkpoint write failed: the appended change is not on any chain."""
        self._pending = None

    # ----------------------------------------------------------------- snapshots
    def _maybe_snapshot(self) -> None:
        if self._snapshotting is not None and not self._snapshotting.done():
            return
        if self.head is None or self.state.changed:
            return
        # Changes that outweigh the state make restores read more than a snapshot would,
        # but up to one store entry of them costs a restore little, while a snapshot at
        # every commit of a small state tripled a commit's requests.
        state_bytes = sum(len(text) for text in self.state.texts().values())
        if self._since_snapshot < self.snapshot_every and self._bytes_since_snapshot < max(state_bytes,
                                                                                          MAX_ENTRY_BYTES):
            return
        head, texts, sequence = self.head, self.state.texts(), self._head_sequence
        self._since_snapshot, self._bytes_since_snapshot = 0, 0
        self._snapshotting = asyncio.get_running_loop().create_task(
            self._snapshot(head, sequence, texts), name=f"state-snapshot-{self.log.partition_id}")

    async def _snapshot(self, head: StateRef, sequence_number: int, texts: dict[str, str]) -> None:
        try:
            written = await self.log.snapshot(head, sequence_number, texts)
            deleted = await self.log.compact(head)
            self.snapshot_bytes += written
            logger.debug("partition %s: state snapshot at %s (%d bytes), %d older entries deleted",
                         self.log.partition_id, head, written, deleted)
        except asyncio.CancelledError:
            raise
        except OwnershipLostError:
            pass
        except Exception as error:
            logger.warning("partition %s: writing a state snapshot at %s failed (%r); the changes stay and the next "
                           "snapshot covers them", self.log.partition_id, head, error)

    async def close(self, *, wait: bool) -> None:
        """The claim ends: wait for a snapshot in flight (a graceful end) or cancel it."""
        task, self._snapshotting = self._snapshotting, None
        if task is None or task.done():
            return
        if not wait:
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

