"""The contract every checkpoint store satisfies.

One conformance suite (``tests/test_store_conformance.py``) runs against every
implementation. The semantics:

* ``list_ownership`` returns every readable ownership record plus the store's current
  time; records it cannot read (corrupted, foreign, epoch out of range) come back in
  ``unreadable`` with their etag, so that they can be claimed once expired.
* ``claim_ownership`` writes each record conditionally: with ``etag=None`` it is a
  real create-if-absent (fails when the record exists), otherwise If-Match on that
  etag. It returns the records won, with their new etag and last-modified time. A
  claim lost to a race (409/412) is simply absent from the result. Any other failure
  raises :class:`~eventprocessor.errors.ClaimOwnershipError`, which still carries the
  claims that were won. A write whose response was lost and that the transport
  retried gets 412 from its own first attempt: the store re-reads the record and,
  when the record is that very write (its write token), reports it won. A handoff
  request is a claim that keeps ``owner_id`` and ``epoch`` and sets ``requested_by``.
* ``release_ownership`` clears the owner id, conditional on the etag.
* ``fence_checkpoint`` is called by a new owner right after it won a claim: it
  rewrites the partition's checkpoint record with ``(owner_id, epoch)`` (creating a
  placeholder when there is none), so that every earlier owner's next checkpoint
  write, conditional on the etag it last saw, fails. It returns the checkpoint to
  resume from.
* ``update_checkpoint`` is fenced: it never overwrites a checkpoint written by a later
  owner, and it fails with :class:`~eventprocessor.errors.OwnershipLostError` once a
  later owner has fenced the partition. After ``fence_checkpoint`` (or its own earlier
  write) a store client trusts its etag and writes with one conditional request; a
  client without one first checks that the ownership record names ``(owner_id,
  epoch)``. So between a new owner's claim and its fence an earlier owner's write can
  still land; the fence then keeps it as the position to resume from.
* ``list_checkpoints`` returns the checkpoints; corrupted or foreign records are
  skipped with a warning that names them.
* ``list_members`` / ``write_member`` / ``delete_member`` keep one heartbeat record per
  live processor, so that processors owning nothing still count in every plan.
* ``create_entry`` / ``read_entry`` / ``list_entries`` / ``delete_entry`` keep named,
  immutable entries in named logs of a consumer group (the Spark sink's commit log).
  ``create_entry`` is a real create-if-absent: of two writers of one name, exactly one
  wins. An entry holds at most :data:`~eventprocessor.records.MAX_ENTRY_BYTES`.
* Epochs are 0 to ``MAX_EPOCH - 1`` and sequence numbers 0 to ``MAX_SEQUENCE_NUMBER``;
  other values are refused with :class:`~eventprocessor.errors.ConfigurationError`
  before any request.
"""
from __future__ import annotations

import abc
from dataclasses import replace
from types import TracebackType
from typing import Iterable, List, Optional, Tuple, Type

from .records import Checkpoint, Member, MemberListing, Ownership, OwnershipListing

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

    async def fence_checkpoint(self, ownership: Ownership) -> Optional[Checkpoint]:
        """Make ``ownership`` (a claim just won) the only writer of its partition's
        checkpoint, and return the checkpoint to resume from (``None`` if there is none).

        Rewrites the checkpoint record with ``ownership.owner_id`` and ``epoch``, keeping
        its position, conditional on the etag it read (creating a placeholder that reads
        as "no checkpoint" when there is none); an earlier owner's next write,
        conditional on the etag *it* last saw, then fails. Raises ``OwnershipLostError``
        if the ownership record does not name ``(owner_id, epoch)``, and
        :class:`~eventprocessor.errors.StaleEpochError` if the stored checkpoint was
        written with a higher epoch, or the same epoch by another owner, while it does
        (the ownership record lost its epoch: re-claim above ``error.stored_epoch``).
        Calling it again for the same claim is harmless.

        This default, for stores that cannot fence, only reads the checkpoint.
        """
        scope = (ownership.fully_qualified_namespace, ownership.eventhub_name, ownership.consumer_group)
        for checkpoint in await self.list_checkpoints(*scope):
            if checkpoint.partition_id == ownership.partition_id:
                return checkpoint
        return None

    @abc.abstractmethod
    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        """Write ``checkpoint`` as ``(owner_id, epoch)`` unless a later owner has fenced
        the partition (see the module docstring).

        Raises ``OwnershipLostError`` otherwise, leaving the stored checkpoint as it was.
        """

    @abc.abstractmethod
    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> List[Checkpoint]:
        """All checkpoints of the consumer group."""

    async def list_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> MemberListing:
        """The member (heartbeat) records of the consumer group, plus the store's clock."""
        raise NotImplementedError(f"{type(self).__name__} keeps no member records")

    async def list_ownership_and_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> Tuple[OwnershipListing, Optional[MemberListing]]:
        """Ownership and member records together: what a balancing tick reads. Stores
        that can do it in one request (Blob, Table, memory) override this; the default
        makes two calls, and gives ``None`` members when the store keeps none."""
        scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        ownership = await self.list_ownership(*scope)
        try:
            members: Optional[MemberListing] = await self.list_members(*scope)
        except NotImplementedError:
            members = None
        return ownership, members

    async def write_member(self, member: Member) -> Member:
        """Create or overwrite ``member``'s heartbeat record; return it as stored."""
        raise NotImplementedError(f"{type(self).__name__} keeps no member records")

    async def delete_member(self, member: Member) -> None:
        """Delete ``member``'s heartbeat record if it exists."""
        raise NotImplementedError(f"{type(self).__name__} keeps no member records")

    async def create_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str, data: bytes) -> bool:
        """Create entry ``entry_name`` of log ``log_name`` holding ``data``, only if it
        does not exist. Returns False (and changes nothing) when it exists."""
        raise NotImplementedError(f"{type(self).__name__} keeps no log entries")

    async def read_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                         log_name: str, entry_name: str) -> Optional[bytes]:
        """The data of an entry, or ``None`` if it does not exist."""
        raise NotImplementedError(f"{type(self).__name__} keeps no log entries")

    async def list_entries(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, prefix: str = "") -> List[str]:
        """The names of the log's entries that start with ``prefix``, sorted."""
        raise NotImplementedError(f"{type(self).__name__} keeps no log entries")

    async def delete_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str) -> None:
        """Delete an entry if it exists (compaction)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no log entries")

    async def check(self) -> None:
        """Make sure the store can be used, in one or two requests: raise
        ``CheckpointStoreError`` (its message names the cause and the fix) if not.

        A processor rides out store failures (it keeps retrying, and its leases
        self-fence), so a store that can never work (a wrong key, an emulator refusing
        the API version, no permission) would show only in its warnings. Call this
        at start-up to fail at once instead. The default does nothing.

        Example::

            store = BlobCheckpointStore.from_connection_string(conn_str, "checkpoints")
            await store.check()   # CheckpointStoreError: ... (likely cause: ...)
            async with EventProcessor(source, store, MyProcessor):
                ...
        """

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
