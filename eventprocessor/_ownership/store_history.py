"""StoreHistory: what the store said before, to notice when it forgets.

Records seen before must not vanish, epochs must not go down, and a checkpoint known
must not vanish or come back from an earlier epoch: each means the store lost data
(restored, wiped, an emulator restarted). This part only remembers and compares (no
I/O, no clock): the taker reports what it finds. Epochs this processor has seen never go
down, so its next claims of a partition are above every epoch it had, even if the store
forgot them.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from ..errors import StoreDataLostError
from ..stores.records import Checkpoint, Ownership, OwnershipListing

__all__ = ["StoreHistory", "data_lost", "went_back"]


def data_lost(what: str, partition_ids: list[str], *, eventhub_name: str, consumer_group: str,
              refuse_rewind: bool) -> StoreDataLostError:
    """The error that reports a loss :meth:`StoreHistory.check` found: what was lost, and
    where the partitions whose checkpoints are gone restart from."""
    return StoreDataLostError(
        f"checkpoint store data loss on {eventhub_name}/{consumer_group}: {what}. The store was restored, wiped "
        "or restarted empty; partitions whose checkpoints are gone restart from "
        + ("the last checkpoint this processor knew (refuse_checkpoint_rewind=True)" if refuse_rewind
           else "initial_event_position, so their events are processed again"),
        partition_ids=tuple(partition_ids))


def went_back(known: Checkpoint, found: Checkpoint | None) -> bool:
    """Did a checkpoint this processor knew vanish, or get replaced by one of an earlier
    epoch? (A later owner may rewind on purpose; an earlier epoch cannot come back.)"""
    if found is None:
        return True
    return found.epoch is not None and known.epoch is not None and found.epoch < known.epoch


class StoreHistory:
    """Epochs, records and checkpoints this processor has seen.

    Example::

        history = StoreHistory()
        seen_before = history.epochs()
        lost = history.check(listing, seen_before, held=set(), ended_at={}, now=0.0, expiration=60)
    """

    def __init__(self) -> None:
        self._epochs: dict[str, int] = {}
        self._listed: set[str] = set()
        self._reported_backwards: dict[str, int] = {}
        self._checkpoints: dict[str, Checkpoint] = {}
        self.lost_mine: set[str] = set()
        """Partitions whose records vanished while (or just after) this processor held them."""

    def epochs(self) -> dict[str, int]:
        """A copy of the epochs seen so far (what a listing sent now is compared with)."""
        return dict(self._epochs)

    def saw(self, partition_id: str, epoch: int) -> None:
        self._epochs[partition_id] = max(epoch, self._epochs.get(partition_id, 0))

    def above_seen(self, claim: Ownership) -> Ownership:
        """``claim`` with an epoch above every epoch seen for its partition."""
        floor = self._epochs.get(claim.partition_id, 0) + 1
        return claim if claim.epoch >= floor else replace(claim, epoch=floor)

    def check(self, listing: OwnershipListing, seen_before: Mapping[str, int], *, held: set[str],
              ended_at: Mapping[str, float], now: float, expiration: float) -> tuple[str, list[str]] | None:
        """Compare ``listing`` with what was seen when it was sent (``seen_before``).
        Returns (what happened, partitions) when records vanished or epochs went down,
        each reported once; else None. ``held`` and ``ended_at`` tell which of those
        partitions were this processor's (kept in :attr:`lost_mine`)."""
        current = {r.partition_id: r.epoch for r in listing.ownerships}
        unreadable = {u.partition_id for u in listing.unreadable}
        vanished = sorted(pid for pid in self._listed if pid not in current and pid not in unreadable)
        backwards = sorted(pid for pid, epoch in current.items() if epoch < seen_before.get(pid, 0)
                           and self._reported_backwards.get(pid) != epoch)
        self._listed = set(current) | unreadable
        for pid in backwards:
            self._reported_backwards[pid] = current[pid]
        for pid, epoch in current.items():
            self.saw(pid, epoch)
        if not vanished and not backwards:
            return None
        self.lost_mine |= {pid for pid in vanished + backwards
                          if pid in held or now - ended_at.get(pid, -math.inf) < expiration}
        parts = []
        if vanished:
            parts.append(f"the ownership records of partitions {vanished} vanished")
        if backwards:
            parts.append(f"the epochs of partitions {backwards} went backwards")
        return " and ".join(parts), vanished + backwards

    def take_lost_mine(self, also: tuple[str, ...] = ()) -> set[str]:
        mine, self.lost_mine = self.lost_mine | set(also), set()
        return mine

    # ----------------------------------------------------------------- checkpoints
    def knew(self, partition_id: str, checkpoint: Checkpoint) -> None:
        self._checkpoints[partition_id] = checkpoint

    def known_checkpoint(self, partition_id: str) -> Checkpoint | None:
        return self._checkpoints.get(partition_id)

    def checkpoint_went_back(self, partition_id: str, found: Checkpoint | None) -> Checkpoint | None:
        """The checkpoint this processor knew, if ``found`` lost it; else None."""
        known = self._checkpoints.get(partition_id)
        return known if known is not None and went_back(known, found) else None
