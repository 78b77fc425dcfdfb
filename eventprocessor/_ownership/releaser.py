"""Releaser: writes the records of ended claims over, and sweeps up at stop.

When a claim ends and its pump is gone, its record is written over: to nobody (a
release: others can claim at once) or to the processor that asked for it (a handoff,
with the next epoch). Each write is conditional on the last etag this processor wrote,
so it cannot undo another processor's claim; one that loses its condition to this
processor's own renewal in flight is written once more on the current etag.

At the end of a graceful stop, one listing finds records that name this processor
without its holding them (a claim the store applied while the stopping tick waited for
its answer, a partition handed over meanwhile) and its handoff requests, and clears
them, so that nobody waits for an expiration because of a processor that is gone.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from .._runtime.options import ProcessorOptions
from .._runtime.stats import ProcessorStats
from .._runtime.tasks import TaskScope
from ..stores.contract import OwnershipStore
from ..stores.records import Ownership
from .lease import Lease, LeaseEnd, LeaseState
from .lease_table import LeaseTable, sorted_ids
from .store_history import StoreHistory
from .writer import OwnershipWriter

__all__ = ["Releaser"]

logger = logging.getLogger(__name__)


class Releaser:
    """Writes releases and handoffs as jobs of ``scope`` (kind ``"release"``)."""

    def __init__(self, *, options: ProcessorOptions, store: OwnershipStore, writer: OwnershipWriter,
                 table: LeaseTable, history: StoreHistory, stats: ProcessorStats, scope: TaskScope,
                 describe: str) -> None:
        self._options = options
        self._store = store
        self._writer = writer
        self._table = table
        self._history = history
        self._stats = stats
        self._scope = scope
        self._describe = describe

    def schedule(self, leases: list[Lease]) -> None:
        """Write these ended claims' records (their pumps are gone) in a job of their own."""
        self._scope.spawn("release", self.write(leases))

    async def wait(self) -> None:
        """Wait for the release writes in flight (each is bounded by the store timeout)."""
        await self._scope.wait_for("release")

    async def write(self, leases: list[Lease]) -> None:
        records = []
        handoffs = 0
        for lease in leases:
            if lease.release_to is None:
                continue
            handing_over = bool(lease.release_to)
            handoffs += handing_over and lease.end is LeaseEnd.HANDOFF
            records.append(replace(lease.record, owner_id=lease.release_to, requested_by="",
                                   epoch=lease.record.epoch + (1 if handing_over else 0)))
            lease.release_to = None  # written once
        try:
            failed = await self._write(records)
        finally:
            for _ in range(handoffs):
                self._table.handoff_written()  # the handoff pace counts from here
        for lease in leases:
            if lease.handed_over_hung and lease.partition_id in failed:
                self._table.hand_over_failed(lease)

    async def _write(self, records: list[Ownership]) -> set[str]:
        """Write the releases and handoffs; return the partitions whose write failed."""
        if not records:
            return set()
        written = await self._writer.write(records)
        if written.failed:
            logger.warning("processor %s: releasing partitions %s failed: %r; they will expire instead",
                           self._describe, sorted_ids(written.failed), written.error)
        done = list(written.won)
        lost = [r for r in records if r.partition_id in written.lost]
        if lost:
            done += await self._write_again(lost)
        for record in done:
            if record.owner_id:
                self._stats.handed_off += 1
            else:
                self._stats.released += 1
            self._history.saw(record.partition_id, record.epoch)
            logger.debug("processor %s released partition %s to %s", self._describe, record.partition_id,
                         record.owner_id or "nobody")
        return set(written.failed)

    async def _write_again(self, lost: list[Ownership]) -> list[Ownership]:
        """Release writes that lost their condition. When the stored record still names
        this processor with the claim's epoch, the write that beat them kept this claim:
        this processor's own renewal in flight (it changes the etag), or a handoff request
        mark. Write them once more on the current etag, unless this processor holds the
        partition again (but for a lease handed over under a handler that never returned).
        Otherwise another processor owns the partition now."""
        try:
            listing = await self._store.list_ownership(*self._options.scope)
        except Exception as error:
            logger.warning("processor %s: releasing partitions %s lost to another write and listing them failed: "
                           "%r; they will expire instead", self._describe, sorted_ids(r.partition_id for r in lost),
                           error)
            return []
        stored = {r.partition_id: r for r in listing.ownerships}
        again = []
        owner_id = self._options.owner_id
        for record in lost:
            current = stored.get(record.partition_id)
            claim_epoch = record.epoch - (1 if record.owner_id else 0)
            held = self._table.get(record.partition_id)
            hung = held is not None and held.handed_over_hung  # its handler still runs: hand it over all the same
            if current is None or current.owner_id != owner_id or current.epoch != claim_epoch \
                    or (held is not None and held.state is not LeaseState.RELEASED and not hung):
                logger.debug("processor %s: partition %s changed hands before its release was written",
                             self._describe, record.partition_id)
                continue
            if record.owner_id and current.requested_by != record.owner_id and not hung:
                # The requester withdrew (it stopped): release to nobody instead.
                logger.info("processor %s: %s withdrew its request for partition %s; releasing it instead",
                            self._describe, record.owner_id, record.partition_id)
                record = replace(record, owner_id="", epoch=claim_epoch)
            again.append(replace(record, etag=current.etag, last_modified_time=current.last_modified_time))
        written = await self._writer.write(again)
        if written.error is not None and not written.won:
            logger.warning("processor %s: releasing partitions %s failed: %r; they will expire instead",
                           self._describe, sorted_ids(r.partition_id for r in again), written.error)
        return list(written.won)

    async def sweep(self, left_to_expire: set[str], within: float) -> None:
        """The last step of a graceful stop: one listing, then release every record that
        names this processor but that it does not hold and withdraw its own handoff
        requests. A handoff written after this listing still expires (it needs an owner
        that saw the request before the stop and wrote later), and so do the partitions
        in ``left_to_expire`` (their handlers would not end). Done ``within`` seconds
        (what is left of stop()'s bound), or not at all."""
        if within <= 0:
            return
        try:
            await asyncio.wait_for(self._sweep(left_to_expire), within)
        except asyncio.TimeoutError:
            logger.warning("processor %s: its last listing did not finish within stop()'s bound; records that "
                           "still name it will expire", self._describe)

    async def _sweep(self, left_to_expire: set[str]) -> None:
        try:
            listing = await self._store.list_ownership(*self._options.scope)
        except Exception as error:
            logger.warning("processor %s: listing ownership as it stops failed: %r; records that still name it "
                           "will expire", self._describe, error)
            return
        owner_id = self._options.owner_id
        held = self._table.with_live_pumps() | left_to_expire
        writes = [replace(record, owner_id="", requested_by="") if record.owner_id == owner_id
                  else replace(record, requested_by="")
                  for record in listing.ownerships if record.partition_id not in held
                  and (record.owner_id == owner_id or record.requested_by == owner_id)]
        if not writes:
            return
        written = await self._writer.write(writes)
        if not written.answered:
            logger.warning("processor %s: releasing partitions %s as it stops failed: %r; they will expire",
                           self._describe, sorted_ids(r.partition_id for r in writes), written.error)
            return
        released = sorted_ids(r.partition_id for r in written.won if not r.owner_id)
        withdrawn = sorted_ids(r.partition_id for r in written.won if r.owner_id)
        self._stats.released += len(released)
        if released or withdrawn:
            logger.info("processor %s: as it stopped, released partitions %s that named it without its holding "
                        "them and withdrew its requests for %s", self._describe, released, withdrawn)
