"""The contracts every checkpoint store satisfies, split by who needs them.

* :class:`OwnershipStore`: what a processor's balancing needs (ownership and member
  records);
* :class:`CheckpointRecords`: what a partition's context needs (fence, update and list
  checkpoints);
* :class:`EntryLog`: what the Spark sink's commit log needs (named immutable entries);
* :class:`CheckpointStore`: all three, which every store (memory, Blob, Table) is.

Every method is abstract: nothing quietly does less. A store that keeps no member
records says so by raising ``NotImplementedError`` from the member methods (the processor
then makes itself visible by claiming). :class:`StoreWrapper` is the one base of
wrappers (bounded calls, faults, ledgers, one-partition views): it forwards every
method through :meth:`StoreWrapper.forward`, so a wrapper can never drop a method.

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
  ``announce_change`` rewrites the group's change notice, whose etag every member
  listing returns as ``generation``: a processor that finds it unchanged (and its
  peers' heartbeats as before) skips the ownership listing.
* ``create_entry`` / ``read_entry`` / ``list_entries`` / ``delete_entry`` keep named,
  immutable entries in named logs of a consumer group (the Spark sink's commit log).
  ``create_entry`` is a real create-if-absent: of two writers of one name, exactly one
  wins. An entry holds at most :data:`~eventprocessor.stores.records.MAX_ENTRY_BYTES`.
* Epochs are 0 to ``MAX_EPOCH - 1`` and sequence numbers 0 to ``MAX_SEQUENCE_NUMBER``;
  other values are refused with :class:`~eventprocessor.errors.ConfigurationError`
  before any request.
"""
from __future__ import annotations

import abc
import contextvars
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from types import TracebackType
from typing import TypeVar

from .records import Checkpoint, Member, MemberListing, Ownership, OwnershipListing

__all__ = ["OwnershipStore", "CheckpointRecords", "EntryLog", "CheckpointStore", "StoreWrapper",
           "release_ownership", "CALLER_DEADLINE"]

_T = TypeVar("_T")

CALLER_DEADLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("eventprocessor_caller_deadline",
                                                                        default=False)
"""Set by a caller that bounds a store call itself (the processor's ``BoundedStore``):
the store then applies no deadline of its own, so each call has exactly one."""


class OwnershipStore(abc.ABC):
    """Ownership and member records: what a processor's balancing reads and writes."""

    @abc.abstractmethod
    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> OwnershipListing:
        """All ownership records of the consumer group, plus the store's clock."""

    @abc.abstractmethod
    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        """Conditionally write each record; return the ones won."""

    @abc.abstractmethod
    async def list_ownership_and_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> tuple[OwnershipListing, MemberListing | None]:
        """Ownership and member records together, in one request where the store can:
        what a balancing tick reads. ``None`` members when the store keeps none."""

    @abc.abstractmethod
    async def list_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> MemberListing:
        """The member (heartbeat) records of the consumer group, plus the store's clock.
        Raises ``NotImplementedError`` if the store keeps none."""

    @abc.abstractmethod
    async def write_member(self, member: Member) -> Member:
        """Create or overwrite ``member``'s heartbeat record; return it as stored.
        Raises ``NotImplementedError`` if the store keeps none."""

    @abc.abstractmethod
    async def delete_member(self, member: Member) -> None:
        """Delete ``member``'s heartbeat record if it exists."""

    @abc.abstractmethod
    async def announce_change(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str) -> None:
        """Tell the group that ownership records changed: the next ``list_members`` (and
        ``list_ownership_and_members``) of every member returns a different
        ``generation``. One small unconditional write. Raises ``NotImplementedError`` if
        the store keeps no member records (its processors then list ownership every tick)."""

    async def release_ownership(self, ownership: Ownership) -> bool:
        """Clear the owner of ``ownership`` if its etag is still current (a claim with
        no owner id). Returns True when released. The epoch is kept, so the next owner's
        epoch is still higher than any the partition had."""
        return await release_ownership(self, ownership)


async def release_ownership(store: OwnershipStore, ownership: Ownership) -> bool:
    """Release through ``store.claim_ownership``: the one way a release is written."""
    won = await store.claim_ownership([replace(ownership, owner_id="")])
    return bool(won)


class CheckpointRecords(abc.ABC):
    """Checkpoint records: what a claim's context reads and writes."""

    @abc.abstractmethod
    async def fence_checkpoint(self, ownership: Ownership) -> Checkpoint | None:
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
        Calling it again for the same claim is harmless."""

    @abc.abstractmethod
    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        """Write ``checkpoint`` as ``(owner_id, epoch)`` unless a later owner has fenced
        the partition (see the module docstring).

        Raises ``OwnershipLostError`` otherwise, leaving the stored checkpoint as it was.
        """

    @abc.abstractmethod
    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> list[Checkpoint]:
        """All checkpoints of the consumer group."""


class EntryLog(abc.ABC):
    """Named, immutable entries in named logs of a consumer group (the Spark sink's
    commit log). Raises ``NotImplementedError`` if the store keeps none."""

    @abc.abstractmethod
    async def create_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str, data: bytes) -> bool:
        """Create entry ``entry_name`` of log ``log_name`` holding ``data``, only if it
        does not exist. Returns False (and changes nothing) when it exists."""

    @abc.abstractmethod
    async def read_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                         log_name: str, entry_name: str) -> bytes | None:
        """The data of an entry, or ``None`` if it does not exist."""

    @abc.abstractmethod
    async def list_entries(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, prefix: str = "") -> list[str]:
        """The names of the log's entries that start with ``prefix``, sorted."""

    @abc.abstractmethod
    async def delete_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str) -> None:
        """Delete an entry if it exists (compaction)."""


class CheckpointStore(OwnershipStore, CheckpointRecords, EntryLog):
    """Abstract base of checkpoint stores: all three contracts. Async only."""

    async def check(self) -> None:
        """Make sure the store can be used, in one or two requests: raise
        ``CheckpointStoreError`` (its message names the cause and the fix) if not.

        A processor rides out store failures (it keeps retrying, and its leases
        self-fence), so a store that can never work (a wrong key, an emulator refusing
        the API version, no permission) would show only in its warnings. Call this
        at start-up to fail at once instead. A store with nothing to reach (in memory)
        has nothing to check: the default does nothing; wrappers forward it.

        Example::

            store = BlobCheckpointStore.from_connection_string(conn_str, "checkpoints")
            await store.check()   # CheckpointStoreError: ... (likely cause: ...)
            async with EventProcessor(source, store, MyProcessor):
                ...
        """

    async def close(self) -> None:
        """Release network resources. Safe to call twice."""

    async def __aenter__(self) -> CheckpointStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class StoreWrapper(CheckpointStore):
    """A store in front of another (``inner``): every method goes through
    :meth:`forward`, the one hook a wrapper overrides (bounds, faults, counting). A
    wrapper that needs to change what a method does overrides that method and still
    calls ``forward``.

    Example::

        class Counting(StoreWrapper):
            async def forward(self, operation, call, units=1):
                self.calls[operation] += 1
                return await call()
    """

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    async def forward(self, operation: str, call: Callable[[], Awaitable[_T]], units: int = 1) -> _T:
        """Run one call of the inner store. ``operation`` names it (the tick's listing,
        ``list_ownership_and_members``, is named ``list_ownership``: one listing);
        ``units`` is how many records it writes."""
        return await call()

    async def check(self) -> None:
        await self.forward("check", self.inner.check)

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str,
                             consumer_group: str) -> OwnershipListing:
        return await self.forward("list_ownership", lambda: self.inner.list_ownership(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        claims = list(ownerships)
        return await self.forward("claim_ownership", lambda: self.inner.claim_ownership(claims), len(claims))

    async def release_ownership(self, ownership: Ownership) -> bool:
        return await self.forward("release_ownership", lambda: self.inner.release_ownership(ownership))

    async def list_ownership_and_members(self, fully_qualified_namespace: str, eventhub_name: str,
                                         consumer_group: str) -> tuple[OwnershipListing, MemberListing | None]:
        return await self.forward("list_ownership", lambda: self.inner.list_ownership_and_members(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def list_members(self, fully_qualified_namespace: str, eventhub_name: str,
                           consumer_group: str) -> MemberListing:
        return await self.forward("list_members", lambda: self.inner.list_members(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def write_member(self, member: Member) -> Member:
        return await self.forward("write_member", lambda: self.inner.write_member(member))

    async def delete_member(self, member: Member) -> None:
        await self.forward("delete_member", lambda: self.inner.delete_member(member))

    async def announce_change(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str) -> None:
        await self.forward("announce_change", lambda: self.inner.announce_change(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def fence_checkpoint(self, ownership: Ownership) -> Checkpoint | None:
        return await self.forward("fence_checkpoint", lambda: self.inner.fence_checkpoint(ownership))

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        await self.forward("update_checkpoint", lambda: self.inner.update_checkpoint(
            checkpoint, owner_id=owner_id, epoch=epoch))

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str,
                               consumer_group: str) -> list[Checkpoint]:
        return await self.forward("list_checkpoints", lambda: self.inner.list_checkpoints(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def create_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str, data: bytes) -> bool:
        return await self.forward("create_entry", lambda: self.inner.create_entry(
            fully_qualified_namespace, eventhub_name, consumer_group, log_name, entry_name, data))

    async def read_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                         log_name: str, entry_name: str) -> bytes | None:
        return await self.forward("read_entry", lambda: self.inner.read_entry(
            fully_qualified_namespace, eventhub_name, consumer_group, log_name, entry_name))

    async def list_entries(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, prefix: str = "") -> list[str]:
        return await self.forward("list_entries", lambda: self.inner.list_entries(
            fully_qualified_namespace, eventhub_name, consumer_group, log_name, prefix))

    async def delete_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str) -> None:
        await self.forward("delete_entry", lambda: self.inner.delete_entry(
            fully_qualified_namespace, eventhub_name, consumer_group, log_name, entry_name))

    async def close(self) -> None:
        await self.inner.close()
