"""Claimer: writes a tick's claims, fences each won claim's checkpoint and reports it.

Claims are written ``BATCH`` at a time (see :data:`~eventprocessor._runtime.bounded_store.BATCH`):
claimed in one call, then fenced together while the next batch is claimed. A lease runs
from its claim, so a claim never waits long for its fence, and each call's deadline covers
its own requests only. A won claim whose checkpoint is fenced is reported through
``on_won(lease, checkpoint)`` (the dispatcher starts its pump); one that cannot be fenced
is dropped, and the next tick adopts its record and tries again.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from .._runtime.bounded_store import BATCH, BoundedStore
from .._runtime.clock import Clock
from .._runtime.options import ProcessorOptions
from .._runtime.reporting import Reporter
from ..errors import OwnershipLostError, StaleEpochError
from ..stores.records import MAX_EPOCH, Checkpoint, Ownership
from .lease import Lease, LeaseState
from .lease_table import LeaseTable, sorted_ids
from .store_history import StoreHistory
from .writer import OwnershipWriter

__all__ = ["Claimer"]

logger = logging.getLogger(__name__)


class Claimer:
    """Claims, fences and reports won claims for the taker (see the module docstring).

    ``store_lost(what, partition_ids)`` is told when a fenced checkpoint went back (the
    store lost data)."""

    def __init__(self, *, options: ProcessorOptions, store: BoundedStore, writer: OwnershipWriter, table: LeaseTable,
                 history: StoreHistory, reporter: Reporter, clock: Clock, describe: str,
                 on_won: Callable[[Lease, Checkpoint | None], None],
                 store_lost: Callable[[str, list[str]], None]) -> None:
        self._options = options
        self._store = store
        self._writer = writer
        self._table = table
        self._history = history
        self._reporter = reporter
        self._clock = clock
        self._describe = describe
        self._on_won = on_won
        self._store_lost = store_lost

    async def take(self, claims: list[Ownership], adoptions: list[Ownership], *,
                   taken_from: Mapping[str, str] | None = None,
                   go_on: Callable[[], Awaitable[bool]] | None = None) -> tuple[list[str], list[str], Exception | None]:
        """Write ``claims`` (new owners) and ``adoptions`` (records naming us, rewritten as
        they are), fence each won partition's checkpoint and start its pump. Returns the
        partitions now dispatched, those whose claim was not won, and a store error.
        ``taken_from``: partition -> the live owner a claim takes it from (nudged).
        ``go_on()`` is asked before each batch of claims after the first: False leaves
        the rest unsent (neither won nor failed; the plan it came from is out of date)."""
        claim_ids = {r.partition_id for r in claims}
        pending = claims + adoptions
        error: Exception | None = None
        not_written: set[str] = set()
        failed: list[str] = []
        started: list[str | None] = []
        # BATCH at a time (see bounded_store.BATCH): claimed in one call, then fenced
        # together while the next batch is claimed. A lease runs from its claim, so a
        # claim never waits long for its fence, and each call's deadline covers its own
        # requests only.
        fencing: list[asyncio.Future[str | None]] = []  # the last batch's fences, in flight
        first = True
        try:
            while pending:
                if not first and go_on is not None and any(r.partition_id in claim_ids for r in pending[:BATCH]) \
                        and not await go_on():
                    pending, go_on = [r for r in pending if r.partition_id not in claim_ids], None
                    if not pending:
                        break
                first = False
                batch, pending = pending[:BATCH], pending[BATCH:]
                sent_at = self._clock.monotonic()
                leases = {r.partition_id: self._table.claiming(r) for r in batch}
                with self._store.patient():  # see Timing.balancing_timeout
                    written = await self._writer.write(batch, taken_from=taken_from)
                if written.error is not None:
                    error = written.error
                    not_written |= set(written.failed) if written.answered else \
                        {r.partition_id for r in batch + pending}
                answered_at = self._clock.monotonic()
                won_by_pid = written.by_partition()
                previous, fencing = fencing, []
                for pid, lease in leases.items():
                    record = won_by_pid.get(pid)
                    if record is None or lease.state is not LeaseState.CLAIMING:
                        failed.append(pid)
                        self._table.drop(lease)
                        continue
                    self._history.saw(pid, record.epoch)
                    self._table.confirm(lease, record, sent_at=sent_at, answered_at=answered_at)
                    fencing.append(asyncio.ensure_future(self._fence_and_start(lease)))
                started += await asyncio.gather(*previous)
                if not written.answered:  # the store did not answer: the rest waits for the next tick
                    failed += [r.partition_id for r in pending]
                    break
            previous, fencing = fencing, []
            started += await asyncio.gather(*previous)
        except BaseException:
            for fence in fencing:  # cancelled with the tick: no pump starts after it
                fence.cancel()
            raise
        if error is not None:
            logger.warning("processor %s: claiming partitions %s failed: %r", self._describe,
                           sorted_ids(not_written or (r.partition_id for r in claims + adoptions)), error)
            self._reporter.report(error, [])
        return [pid for pid in started if pid is not None], failed, error

    async def _fence_and_start(self, lease: Lease) -> str | None:
        """Fence the checkpoint of a won claim and start its pump. On a stale epoch (the
        record had lost its epoch), claim once more above the stored one."""
        pid = lease.partition_id
        for attempt in (1, 2):
            try:
                with self._store.patient():
                    checkpoint = await self._store.fence_checkpoint(lease.record)
                break
            except StaleEpochError as stale:
                if attempt == 2 or stale.stored_epoch >= MAX_EPOCH:
                    logger.error("processor %s: partition %s: %s", self._describe, pid, stale)
                    self._reporter.report(stale, [])
                    self._table.drop(lease)
                    return None
                # The documented way back from azure-eventhub's own client (it writes records
                # without this SDK's epoch): a step of the switch, not a fault.
                logger.info("processor %s: partition %s: its checkpoint carries epoch %d, at or above this claim's %d: "
                            "the ownership record was written without this SDK's epoch (as azure-eventhub's own "
                            "client writes it, after a switch from it to this SDK). Claiming at epoch %d and "
                            "resuming from that checkpoint", self._describe, pid, stale.stored_epoch, lease.epoch,
                            stale.stored_epoch + 1)
                sent_at = self._clock.monotonic()
                with self._store.patient():
                    written = await self._writer.write([replace(lease.record, epoch=stale.stored_epoch + 1)])
                if written.error is not None:
                    self._reporter.report(written.error, [])
                if not written.won or lease.state is not LeaseState.CLAIMING:
                    self._table.drop(lease)
                    return None
                self._table.confirm(lease, written.won[0], sent_at=sent_at, answered_at=self._clock.monotonic())
                self._history.saw(pid, written.won[0].epoch)
            except OwnershipLostError as error:
                logger.info("processor %s: partition %s was taken before its checkpoint was fenced: %s",
                            self._describe, pid, error)
                self._table.drop(lease)
                return None
            except Exception as error:
                # The claim is won but the checkpoint could not be fenced: do not dispatch.
                # The record names us, so the next tick adopts it and tries again.
                logger.warning("processor %s: fencing the checkpoint of partition %s failed: %r", self._describe,
                               pid, error)
                self._reporter.report(error, [])
                self._table.drop(lease)
                return None
        if lease.state is not LeaseState.CLAIMING:
            return None
        known = self._history.checkpoint_went_back(pid, checkpoint)
        if known is not None:
            found = "none" if checkpoint is None else \
                f"sequence number {checkpoint.sequence_number} (epoch {checkpoint.epoch})"
            if self._options.refuse_rewind:
                checkpoint = await self._restore_checkpoint(lease, known)
            self._on_won(lease, checkpoint)
            self._store_lost(f"the checkpoint of partition {pid} was at sequence number {known.sequence_number} "
                            f"(epoch {known.epoch}) and is now {found}", [pid])
            return pid
        self._on_won(lease, checkpoint)
        return pid

    async def _restore_checkpoint(self, lease: Lease, known: Checkpoint) -> Checkpoint:
        """refuse_checkpoint_rewind: resume from the checkpoint this processor knew and
        write it back, so that later owners do not rewind either."""
        owner_id = self._options.owner_id
        restored = replace(known, owner_id=owner_id, epoch=lease.epoch)
        try:
            await self._store.update_checkpoint(restored, owner_id=owner_id, epoch=lease.epoch)
            logger.warning("processor %s: restored the checkpoint of partition %s at sequence number %d",
                           self._describe, lease.partition_id, known.sequence_number)
        except Exception as error:
            logger.error("processor %s: could not write back the checkpoint of partition %s (%r); resuming from "
                         "it all the same", self._describe, lease.partition_id, error)
        return restored
