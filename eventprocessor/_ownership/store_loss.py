"""A store that lost data (wiped, restored, restarted empty): noticing it, saying so once,
and claiming back what this processor held before claiming anything new.

Ways a processor notices, whichever comes first:

* an ownership listing misses records it listed before, or shows epochs gone back
  (:meth:`StoreLoss.check_listing`, through :class:`~.store_history.StoreHistory`);
* a member listing misses the group's change notice once one was seen
  (:meth:`StoreLoss.check_members`; the notice is never deleted): with liveness per
  processor a tick lists ownership only on change, so this is how the first processor
  to tick after a wipe learns of it (its own member record missing would be no proof:
  a predecessor with the same owner id, still stopping, deletes it);
* a checkpoint of one of its claims finds the checkpoint and ownership records gone
  (:meth:`StoreLoss.records_vanished`);
* a fence finds a checkpoint it knew gone back (the claimer).

Then, for two intervals after it noticed, the ticks claim back what this processor held
(with ``refuse_checkpoint_rewind``, from the checkpoint it knew) and nothing new: every
processor has ticked and claimed back its own before a partition that merely looks
unowned is claimed afresh, from no checkpoint (its events processed again).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from .._runtime.options import ProcessorOptions
from .._runtime.reporting import Reporter
from .._runtime.stats import ProcessorStats
from ..stores.records import MemberListing, Ownership, OwnershipListing
from .lease import Reconciliation, Snapshot
from .lease_table import LeaseTable, sorted_ids
from .store_history import StoreHistory, data_lost

__all__ = ["StoreLoss"]

logger = logging.getLogger(__name__)


class StoreLoss:
    """Notices and reports a store that lost data; decides what a tick claims back."""

    def __init__(self, *, options: ProcessorOptions, history: StoreHistory, table: LeaseTable,
                 reporter: Reporter, stats: ProcessorStats, describe: str) -> None:
        self._options = options
        self._clock = options.clock
        self._history = history
        self._table = table
        self._reporter = reporter
        self._stats = stats
        self._describe = describe
        self._noticed = False  # the group's change notice vanished
        self._reported = False  # and it said so (once, however it noticed)
        self._generation_seen = False  # a member listing named the group's change notice
        self._own_only_until = -1.0

    @property
    def claims_own_only(self) -> bool:
        """True for two intervals after the store was found wiped: claim back, claim nothing new."""
        return self._clock.monotonic() < self._own_only_until

    def report(self, what: str, partition_ids: list[str]) -> None:
        """Report that the store lost data (records or checkpoints seen before)."""
        options = self._options
        error = data_lost(what, partition_ids, eventhub_name=options.source.eventhub_name,
                          consumer_group=options.consumer_group, refuse_rewind=options.refuse_rewind)
        logger.error("processor %s: %s", self._describe, error)
        self._stats.store_data_lost += 1
        affected = [lease for lease in (self._table.get(pid) for pid in partition_ids) if lease is not None]
        self._reporter.report(error, affected, to_every_handler=not affected)

    def check_listing(self, listing: OwnershipListing, seen_before: Mapping[str, int]) -> None:
        """An ownership listing against the records and epochs seen before it was sent."""
        found = self._history.check(listing, seen_before, held={lease.partition_id for lease in self._table},
                                    ended_at=self._table.ended_at, now=self._clock.monotonic(),
                                    expiration=self._options.timing.expiration)
        if found is not None:
            self.report(*found)

    def check_members(self, members: MemberListing) -> bool:
        """A member listing; True when it shows the store wiped."""
        # This processor's own member record missing is no proof: a predecessor with the
        # same owner id, still stopping, deletes it. The change notice is never deleted.
        notice_gone = members.generation is None and self._generation_seen
        self._generation_seen = self._generation_seen or members.generation is not None
        if not notice_gone:
            self._noticed = self._reported = False
            return False
        if not self._noticed:
            self._noticed = True
            self._own_only_until = self._clock.monotonic() + 2 * self._options.timing.interval
            held = sorted_ids(lease.partition_id for lease in self._table)
            self._history.lost_mine |= set(held)  # claimed back where their records are gone
            if not self._reported:
                self._reported = True
                self.report("the group's change notice vanished", held)
        return True

    def records_vanished(self, partition_id: str) -> None:
        """A checkpoint of this processor's claim found the partition's checkpoint and
        ownership records gone: claimed back at the next tick (the caller wakes it)."""
        self._history.lost_mine.add(partition_id)
        if not self._reported:  # one report of the wipe; the claims back say which checkpoints it lost
            self._reported = True
            self.report(f"the checkpoint and ownership records of partition {partition_id} vanished from under "
                        "its claim", [partition_id])

    def reclaims(self, reconciliation: Reconciliation, snapshot: Snapshot, taken: set[str],
                 partition_ids: Iterable[str]) -> list[Ownership]:
        """With ``refuse_checkpoint_rewind``, the partitions whose records vanished from
        under this processor's leases, claimed back by it, so that the checkpoint it knew
        is the one restored (the balance is restored later by handoffs). A lease still
        ending (in ``taken``: its pump stopping) is claimed back at a later tick."""
        if not self._options.refuse_rewind:
            return []
        existing = set(partition_ids)
        mine = self._history.take_lost_mine(reconciliation.store_lost)
        self._history.lost_mine |= mine & taken
        scope, owner_id = self._options.scope, self._options.owner_id
        return [self._history.above_seen(Ownership(*scope, pid, owner_id, epoch=1))
                for pid in sorted_ids(mine)
                if pid not in taken and pid in existing and pid not in snapshot.records
                and pid not in snapshot.unreadable and self._history.known_checkpoint(pid) is not None]
