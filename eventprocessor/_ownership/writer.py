"""OwnershipWriter: the one place ownership records are written.

Claims, adoptions, renewals, handoff requests, releases and the sweep at stop are all
conditional writes of ownership records (``claim_ownership``). Each write has three
possible outcomes per record, and every caller needs them told apart the same way:

* **won**: the store accepted it (the record as stored, with its new etag);
* **lost**: the condition failed (409/412): someone else wrote the record first;
* **failed**: the store did not say (an error, a time-out): whether the write landed
  is unknown, which every caller treats as "not won".

A won write that concerns another processor (it asks that processor for a partition,
takes one from it, or hands one to it) also *nudges* it (``on_nudge``, see
:mod:`.liveness`): a settled processor that skips listings on change notices lists at
its next tick when a member record names it.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ..errors import ClaimOwnershipError
from ..stores.contract import OwnershipStore
from ..stores.records import Ownership

__all__ = ["OwnershipWriter", "Written"]

logger = logging.getLogger(__name__)


@dataclass
class Written:
    """The outcome of one write of several ownership records."""

    won: list[Ownership] = field(default_factory=list)
    lost: set[str] = field(default_factory=set)
    failed: dict[str, Exception] = field(default_factory=dict)
    error: Exception | None = None
    """The call's error, when the store raised (``failed`` then names the records)."""
    answered: bool = True
    """False when the store did not answer at all (nothing is known of any record)."""

    @property
    def won_ids(self) -> set[str]:
        return {record.partition_id for record in self.won}

    def by_partition(self) -> dict[str, Ownership]:
        return {record.partition_id: record for record in self.won}


class OwnershipWriter:
    """Writes ownership records through ``store`` and sorts the outcome.

    Example::

        written = await OwnershipWriter(store).write([claim])
        if claim.partition_id in written.won_ids: ...
    """

    def __init__(self, store: OwnershipStore, *, owner_id: str = "",
                 on_nudge: Callable[[set[str]], Awaitable[None]] | None = None) -> None:
        self._store = store
        self._owner_id = owner_id
        self._on_nudge = on_nudge
        self.announcing: bool | None = None
        """Whether the store takes change notices (None: not known yet)."""
        self.announcements = 0
        self._failing = False

    async def write(self, records: Iterable[Ownership], *, announce: bool = True,
                    taken_from: Mapping[str, str] | None = None) -> Written:
        """Write ``records``; when any write won and ``announce`` (every write but a
        renewal changes who owns what, or asks for it), announce the change to the group
        and nudge the other processors the won records concern: the owners they name
        and, for claims on live records, the owners they were taken from (``taken_from``:
        partition -> previous owner)."""
        written = await self._write(list(records))
        if announce and written.won:
            await self._announce(written.won[0])
            concerned = {r.owner_id for r in written.won} | {(taken_from or {}).get(r.partition_id, "")
                                                              for r in written.won}
            concerned -= {"", self._owner_id}
            if concerned and self._on_nudge is not None:
                await self._on_nudge(concerned)
        return written

    async def _write(self, batch: list[Ownership]) -> Written:
        if not batch:
            return Written()
        try:
            won = await self._store.claim_ownership(batch)
        except ClaimOwnershipError as error:
            won_ids = {record.partition_id for record in error.claimed}
            failed = {pid: failure for pid, failure in error.failures.items()}
            lost = {r.partition_id for r in batch if r.partition_id not in won_ids and r.partition_id not in failed}
            return Written(list(error.claimed), lost, failed, error)
        except Exception as error:
            return Written([], set(), {record.partition_id: error for record in batch}, error, answered=False)
        won_ids = {record.partition_id for record in won}
        return Written(list(won), {r.partition_id for r in batch if r.partition_id not in won_ids})

    async def _announce(self, record: Ownership) -> None:
        """Rewrite the group's change notice. A failure only delays the others: they see
        the change at the next notice or at their safety-net listing."""
        if self.announcing is False:
            return
        try:
            await self._store.announce_change(record.fully_qualified_namespace, record.eventhub_name,
                                              record.consumer_group)
        except NotImplementedError:
            self.announcing = False
            return
        except Exception as error:
            logger.log(logging.DEBUG if self._failing else logging.WARNING,
                       "announcing an ownership change of partition %s failed: %r; the other processors see it at "
                       "their next listing", record.partition_id, error)
            self._failing = True
            return
        self.announcing, self._failing = True, False
        self.announcements += 1
