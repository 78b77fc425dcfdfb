"""A checkpoint store written to azure-eventhub's public ``CheckpointStore`` interface
(``azure.eventhub.aio.CheckpointStore``: ``list_ownership``, ``claim_ownership``,
``update_checkpoint``, ``list_checkpoints``), run as this SDK's
:class:`~eventprocessor.stores.contract.CheckpointStore`.

What that interface allows is kept: ownership claims conditional on the record's etag
(as far as the store implements them), expiry of silent owners, checkpoints written and
read back. What it has no room for is not:

* no epoch is stored, so every claim has epoch 0: receivers are exclusive at the
  ``owner_level`` the caller gave (0 by default), and a new owner's receiver disconnects
  the previous one because equal levels do, as with the official client;
* checkpoint writes are not conditional: an owner that has not yet noticed it lost a
  partition (at most one load-balancing interval) can still write its checkpoint, as
  with the official client. This SDK's own processor still refuses a checkpoint once it
  knows its claim ended;
* no member records: a processor that owns nothing is seen when it claims, and moves
  are steals, not graceful handoffs;
* expiry is judged on this machine's clock against the store's ``last_modified_time``;
* no named logs (the Spark sink's commit log).

The stores of :mod:`eventprocessor.stores` keep every guarantee (fenced checkpoints,
epochs, handoffs, members) on the official blob layout.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

from ..errors import OwnershipLostError
from ..stores.contract import CheckpointStore
from ..stores.records import Checkpoint, Member, MemberListing, Ownership, OwnershipListing, UnreadableOwnership

__all__ = ["OfficialInterfaceStore", "is_official_interface_store"]

logger = logging.getLogger(__name__)

_UTC = timezone.utc
_METHODS = ("list_ownership", "claim_ownership", "update_checkpoint", "list_checkpoints")


def is_official_interface_store(store: Any) -> bool:
    """Whether ``store`` has the four async methods of azure-eventhub's ``CheckpointStore``."""
    import inspect

    return all(inspect.iscoroutinefunction(getattr(store, name, None)) for name in _METHODS)


def _when(value: Any) -> datetime | None:
    """A ``last_modified_time`` as the official stores give it (epoch seconds, or a
    datetime, naive meaning UTC)."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=_UTC)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, _UTC)
    return None


class OfficialInterfaceStore(CheckpointStore):
    """``store`` (written to azure-eventhub's ``CheckpointStore`` interface) as this SDK's
    store, with the guarantees the interface allows (see the module docstring).
    ``clock`` gives the time expiry is judged at (UTC). ``store`` is the caller's: it is
    not closed here, as azure-eventhub does not close it."""

    def __init__(self, store: Any, *, clock: Callable[[], datetime] | None = None) -> None:
        self.store = store
        self._clock = clock or (lambda: datetime.now(_UTC))

    def __repr__(self) -> str:
        return f"OfficialInterfaceStore({type(self.store).__name__})"

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str,
                             consumer_group: str) -> OwnershipListing:
        records = await self.store.list_ownership(fully_qualified_namespace, eventhub_name, consumer_group)
        ownerships, unreadable = [], []
        for record in records or ():
            pid, etag = record.get("partition_id"), record.get("etag")
            when = _when(record.get("last_modified_time"))
            if not isinstance(pid, str) or not pid:
                continue
            owner = record.get("owner_id")
            if owner is not None and not isinstance(owner, str):
                unreadable.append(UnreadableOwnership(pid, str(etag), when, f"owner_id is {type(owner).__name__}"))
                continue
            ownerships.append(Ownership(fully_qualified_namespace, eventhub_name, consumer_group, pid, owner or "",
                                        last_modified_time=when, etag=None if etag is None else str(etag)))
        return OwnershipListing(tuple(ownerships), self._clock(), tuple(unreadable))

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        wanted = list(ownerships)
        asked = [{"fully_qualified_namespace": o.fully_qualified_namespace, "eventhub_name": o.eventhub_name,
                  "consumer_group": o.consumer_group, "partition_id": o.partition_id, "owner_id": o.owner_id,
                  "etag": o.etag, "last_modified_time": None if o.last_modified_time is None
                  else o.last_modified_time.timestamp()} for o in wanted]
        claimed = await self.store.claim_ownership(asked)
        by_pid = {o.partition_id: o for o in wanted}
        won = []
        for record in claimed or ():
            claim = by_pid.get(record.get("partition_id"))
            if claim is None or record.get("owner_id", claim.owner_id) != claim.owner_id:
                continue
            etag = record.get("etag")
            won.append(Ownership(claim.fully_qualified_namespace, claim.eventhub_name, claim.consumer_group,
                                 claim.partition_id, claim.owner_id,
                                 last_modified_time=_when(record.get("last_modified_time")) or self._clock(),
                                 etag=None if etag is None else str(etag)))
        return won

    async def list_ownership_and_members(self, fully_qualified_namespace: str, eventhub_name: str,
                                         consumer_group: str) -> tuple[OwnershipListing, MemberListing | None]:
        return await self.list_ownership(fully_qualified_namespace, eventhub_name, consumer_group), None

    async def list_members(self, fully_qualified_namespace: str, eventhub_name: str,
                           consumer_group: str) -> MemberListing:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no member records")

    async def write_member(self, member: Member) -> Member:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no member records")

    async def delete_member(self, member: Member) -> None:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no member records")

    async def announce_change(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str) -> None:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no member records")

    async def fence_checkpoint(self, ownership: Ownership) -> Checkpoint | None:
        """The interface cannot fence: check that the claim is still the record's, and
        return the checkpoint to resume from."""
        listing = await self.list_ownership(ownership.fully_qualified_namespace, ownership.eventhub_name,
                                            ownership.consumer_group)
        current = next((o for o in listing.ownerships if o.partition_id == ownership.partition_id), None)
        if current is None or current.owner_id != ownership.owner_id:
            raise OwnershipLostError(f"partition {ownership.partition_id}: the store names "
                                     f"{current.owner_id if current else 'no owner'}, not {ownership.owner_id}",
                                     partition_id=ownership.partition_id)
        checkpoints = await self.list_checkpoints(ownership.fully_qualified_namespace, ownership.eventhub_name,
                                                  ownership.consumer_group)
        return next((c for c in checkpoints if c.partition_id == ownership.partition_id), None)

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        await self.store.update_checkpoint({
            "fully_qualified_namespace": checkpoint.fully_qualified_namespace,
            "eventhub_name": checkpoint.eventhub_name, "consumer_group": checkpoint.consumer_group,
            "partition_id": checkpoint.partition_id, "offset": checkpoint.offset,
            "sequence_number": checkpoint.sequence_number})

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str,
                               consumer_group: str) -> list[Checkpoint]:
        found = []
        for record in await self.store.list_checkpoints(fully_qualified_namespace, eventhub_name,
                                                        consumer_group) or ():
            try:
                sequence_number = int(record["sequence_number"])
                pid = str(record["partition_id"])
            except (KeyError, TypeError, ValueError):
                logger.warning("%r: skipping a checkpoint without a readable partition id and sequence number: %r",
                               self, {k: v for k, v in record.items() if k in ("partition_id", "sequence_number")})
                continue
            offset = record.get("offset")
            found.append(Checkpoint(fully_qualified_namespace, eventhub_name, consumer_group, pid, sequence_number,
                                    offset=None if offset is None else str(offset)))
        return found

    async def create_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str, data: bytes) -> bool:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no named logs")

    async def read_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                         log_name: str, entry_name: str) -> bytes | None:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no named logs")

    async def list_entries(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, prefix: str = "") -> list[str]:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no named logs")

    async def delete_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str) -> None:
        raise NotImplementedError("azure-eventhub's CheckpointStore interface keeps no named logs")
