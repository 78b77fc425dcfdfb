"""The contract every checkpoint store satisfies.

One conformance suite (``tests/test_store_conformance.py``) runs against every
implementation. The semantics:

* ``list_ownership`` returns every ownership record plus the store's current time.
* ``claim_ownership`` writes each record conditionally: with ``etag=None`` it is a
  real create-if-absent (fails when the record exists), otherwise If-Match on that
  etag. It returns the records won, with their new etag and last-modified time. A
  claim lost to a race (409/412) is simply absent from the result. Any other failure
  raises :class:`~eventprocessor.errors.ClaimOwnershipError`, which still carries the
  claims that were won.
* ``release_ownership`` clears the owner id, conditional on the etag.
* ``update_checkpoint`` is fenced: it succeeds only while ``(owner_id, epoch)`` is the
  current owner of the partition, and it never overwrites a checkpoint written by a
  later owner. Otherwise it raises :class:`~eventprocessor.errors.OwnershipLostError`.
* ``list_checkpoints`` returns the checkpoints; corrupted or foreign records are
  skipped with a warning that names them.
"""
from __future__ import annotations

import abc
from dataclasses import replace
from types import TracebackType
from typing import Iterable, List, Optional, Type

from .records import Checkpoint, Ownership, OwnershipListing

__all__ = ["CheckpointStore"]


class CheckpointStore(abc.ABC):
    """Abstract base of checkpoint stores. Async only."""

    @abc.abstractmethod
    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> OwnershipListing:
        """All ownership records of the consumer group, plus the store's clock."""

    @abc.abstractmethod
    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> List[Ownership]:
        """Conditionally write each record; return the ones won."""

    async def release_ownership(self, ownership: Ownership) -> bool:
        """Clear the owner of ``ownership`` if its etag is still current.

        Returns True when released. The epoch is kept, so the next owner's epoch is
        still higher than any the partition had.
        """
        won = await self.claim_ownership([replace(ownership, owner_id="")])
        return bool(won)

    @abc.abstractmethod
    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        """Write ``checkpoint`` if ``(owner_id, epoch)`` still owns the partition.

        Raises ``OwnershipLostError`` otherwise, leaving the stored checkpoint as it was.
        """

    @abc.abstractmethod
    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> List[Checkpoint]:
        """All checkpoints of the consumer group."""

    async def close(self) -> None:
        """Release network resources. Safe to call twice."""

    async def __aenter__(self) -> "CheckpointStore":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()
