"""Fenced checkpoints, and the cache of the fences this store instance wrote.

Fenced checkpoints
==================
* ``fence_checkpoint(claim)`` (a new owner, right after its claim): for a partition's
  first claim (epoch 1) that this store instance created, creates the placeholder if
  no checkpoint record exists (one request; a later owner's fence orders itself after
  it by epoch). Otherwise reads the ownership
  record (it must name ``(owner_id, epoch)``, else ``OwnershipLostError``), reads the
  checkpoint record and rewrites it with ``ownerid``/``epoch`` of the claim, keeping its
  position, If-Match the etag it read (or creates a placeholder, ``sequencenumber="-1"``,
  when there is none). It caches the new etag under ``(scope, partition, owner_id,
  epoch)`` and returns the checkpoint to resume from. A stored checkpoint of a later
  epoch (or of the same epoch by another owner) raises ``StaleEpochError`` when the
  ownership record still names the claim, ``OwnershipLostError`` otherwise.
* ``update_checkpoint``: with a cached etag, ONE request: replace If-Match that etag.
  Without one (this store instance did not fence), verify first: read the ownership
  record, read the checkpoint (refusing a later epoch's), then write. On 412 the
  checkpoint is re-read: a later epoch or another owner wrote it -> ``OwnershipLostError``
  (``StaleEpochError`` if the ownership record still names this owner); this very
  ``(owner_id, epoch)`` wrote it (another call of the same owner) -> retry with its etag;
  anything else -> verify again. At most three attempts.

Why a new owner's checkpoint is never lost: the new owner N fences before it reads
where to resume. The fence changes the checkpoint record's etag, so every write of an
earlier owner O, conditional on the etag O last saw (from its own fence or write, both
before N's fence), fails with 412; O then re-reads, sees N's epoch, and stops with
``OwnershipLostError``. A write of O that lands *before* N's fence is a checkpoint of
events O really processed, and N's fence keeps it as the position N resumes from.
After the fence, the record only changes through N's conditional writes.
"""
from __future__ import annotations

import logging
from typing import Any

from ..errors import CheckpointStoreError, ConfigurationError, OwnershipLostError, StaleEpochError
from .backend import CHECKPOINT, OWNERSHIP, Fields, RecordBackend, RecordConflict, RecordMissing, Scope, StoredRecord
from .calls import ProtocolCalls
from .codec import (
    NO_CHECKPOINT,
    NO_OFFSET,
    check_epoch,
    check_int,
    check_text,
    done_fields,
    later_than,
    parse_checkpoint,
    parse_ownership,
)
from .records import FIRST_EPOCH, MAX_SEQUENCE_NUMBER, Checkpoint, Ownership

__all__ = ["CheckpointProtocol", "ATTEMPTS"]

logger = logging.getLogger(__name__)

ATTEMPTS = 3
"""How often a fence or a checkpoint is tried when the record changes under it."""

CREATED_KEPT = 65_536
"""How many first claims created and not yet fenced one store instance remembers."""


class CheckpointProtocol(ProtocolCalls):
    """Fences and checkpoints (see the module docstring)."""

    def __init__(self, backend: RecordBackend, *, operation_timeout: float | None) -> None:
        super().__init__(backend, operation_timeout=operation_timeout)
        # (namespace, hub, group, partition) -> {(owner_id, epoch): checkpoint etag}
        self._fences: dict[tuple[str, str, str, str], dict[tuple[str, int], str]] = {}
        # (namespace, hub, group, partition) -> the owner whose first claim (epoch 1)
        # this instance created and has not fenced yet (at most CREATED_KEPT, oldest dropped)
        self._created: dict[tuple[str, str, str, str], str] = {}

    # ------------------------------------------------------------------ fence cache

    def _fence_etag(self, scope: Scope, partition_id: str, owner_id: str, epoch: int) -> str | None:
        return self._fences.get((*scope, partition_id), {}).get((owner_id, epoch))

    def _remember_fence(self, scope: Scope, partition_id: str, owner_id: str, epoch: int, etag: str) -> None:
        self._fences.setdefault((*scope, partition_id), {})[(owner_id, epoch)] = etag

    def _created_claim(self, scope: Scope, partition_id: str, owner_id: str) -> None:
        """Remember that this instance just created ``partition_id``'s ownership record
        for ``owner_id`` at :data:`FIRST_EPOCH` (see :meth:`_fence`)."""
        self._created.pop((*scope, partition_id), None)
        self._created[(*scope, partition_id)] = owner_id
        while len(self._created) > CREATED_KEPT:
            del self._created[next(iter(self._created))]

    def _forget_fence(self, scope: Scope, partition_id: str, owner_id: str, epoch: int) -> None:
        self._fences.get((*scope, partition_id), {}).pop((owner_id, epoch), None)

    def _keep_only_fence(self, scope: Scope, partition_id: str, owner_id: str, epoch: int) -> None:
        """A won claim says who owns the partition now: every other etag cached for it
        belongs to an owner that no longer holds it."""
        cached = self._fences.get((*scope, partition_id))
        if cached:
            for other in [k for k in cached if k != (owner_id, epoch)]:
                del cached[other]

    # ------------------------------------------------------------------ checkpoints

    def _check_writer(self, owner_id: Any, epoch: Any, partition_id: Any) -> None:
        check_text(owner_id, "owner_id", allow_empty=False)
        check_epoch(epoch, partition_id)

    async def _require_owner(self, scope: Scope, partition_id: str, owner_id: str, epoch: int, doing: str, *,
                             vanished: bool = False) -> None:
        """Read the ownership record; raise ``OwnershipLostError`` unless it names ``(owner_id, epoch)``.
        ``vanished``: the checkpoint this claim had written is gone, so an absent ownership
        record means the store lost both (``records_vanished``), not a takeover."""
        record = await self._backend.read(OWNERSHIP, scope, partition_id)
        if record is None and vanished:
            raise OwnershipLostError(f"{doing} of partition {partition_id} refused: its checkpoint and ownership "
                                     f"records, which {owner_id} (epoch {epoch}) had written, are gone (the store was "
                                     "wiped or restored)", partition_id=partition_id, records_vanished=True)
        if record is None:
            holder = "there is no ownership record"
        else:
            parsed = parse_ownership(record, scope)
            if isinstance(parsed, str):
                holder = f"its ownership record is unreadable ({parsed})"
            elif (parsed.owner_id, parsed.epoch) == (owner_id, epoch):
                return
            else:
                holder = f"{parsed.owner_id or 'nobody'} does (epoch {parsed.epoch})"
        raise OwnershipLostError(f"{doing} of partition {partition_id} refused: {owner_id} (epoch {epoch}) does "
                                 f"not own it, {holder}", partition_id=partition_id)

    async def _refuse_later(self, scope: Scope, partition_id: str, owner_id: str, epoch: int, stored: Checkpoint,
                            doing: str) -> None:
        """The checkpoint was written by a later owner. If the ownership record still
        names this owner, the record lost its epoch (``StaleEpochError``); if not, the
        partition was taken (``OwnershipLostError``)."""
        await self._require_owner(scope, partition_id, owner_id, epoch, doing)
        raise StaleEpochError(
            f"{doing} of partition {partition_id} refused: its checkpoint was written by "
            f"{stored.owner_id or 'another processor'} with epoch {stored.epoch}, not below {owner_id}'s epoch "
            f"{epoch}, although the ownership record names {owner_id}: claim it again above epoch {stored.epoch}",
            partition_id=partition_id, stored_epoch=stored.epoch or 0)

    def _checkpoint_or_warn(self, record: StoredRecord, scope: Scope) -> Checkpoint | None:
        parsed = parse_checkpoint(record, scope)
        if isinstance(parsed, Checkpoint):
            return parsed
        self._warn((record.name, record.etag), "skipping checkpoint record %s in %s: %s", record.name,
                   self._backend.where, parsed)
        return None

    async def fence_checkpoint(self, ownership: Ownership) -> Checkpoint | None:
        """Make ``ownership`` (a claim just won) the only writer of its partition's
        checkpoint; return the checkpoint to resume from (``None`` if there is none).

        Costs three requests (read ownership, read checkpoint, conditional write), or
        one for a partition's first claim (epoch 1) when it has no checkpoint yet
        (create the placeholder if absent).
        Raises ``OwnershipLostError`` if the ownership record does not name
        ``(owner_id, epoch)``, ``StaleEpochError`` if the stored checkpoint was written
        by a later epoch (or the same epoch by another owner) while it does.

        Example::

            [won] = await store.claim_ownership([claim])
            resume_from = await store.fence_checkpoint(won)
        """
        if not isinstance(ownership, Ownership):
            raise ConfigurationError(f"expected an Ownership record, got {type(ownership).__name__}")
        scope = self._scope(ownership.fully_qualified_namespace, ownership.eventhub_name, ownership.consumer_group)
        self._partition(ownership.partition_id)
        self._check_writer(ownership.owner_id, ownership.epoch, ownership.partition_id)
        return await self._bounded(f"fence of partition {ownership.partition_id}", self._fence(scope, ownership))

    async def _fence(self, scope: Scope, ownership: Ownership) -> Checkpoint | None:
        pid, owner, epoch = ownership.partition_id, ownership.owner_id, ownership.epoch
        # A partition's first claim (epoch 1), whose ownership record this instance
        # created for this owner, most likely finds no checkpoint either: its first
        # attempt only creates the placeholder if absent, one request instead of three
        # (a cold start of P partitions saves 2·P). A checkpoint record there (left by an
        # earlier deployment, by azure-eventhub's processor, or by a later owner that
        # fenced first) fails the create, and the next attempt reads and judges it. The
        # answer to the create that won the claim stands in for reading the ownership
        # record back (a read could not rule out a steal after it either), and the
        # checkpoint record orders owners by epoch on its own: a later owner that fenced
        # first makes this create fail, one that fences after overwrites the placeholder
        # and changes its etag, so every later write of this claim fails with 412.
        first = epoch == FIRST_EPOCH and self._created.pop((*scope, pid), None) == owner
        for attempt in range(1, ATTEMPTS + 1 + first):
            current = stored = None
            if not first:
                await self._require_owner(scope, pid, owner, epoch, "fence")
                current = await self._backend.read(CHECKPOINT, scope, pid)
                stored = None if current is None else self._checkpoint_or_warn(current, scope)
                if stored is not None and later_than(stored, owner, epoch):
                    await self._refuse_later(scope, pid, owner, epoch, stored, "fence")
            fields: Fields = {
                "sequencenumber": str(NO_CHECKPOINT if stored is None else stored.sequence_number),
                "offset": NO_OFFSET if stored is None or stored.offset is None else stored.offset,
                "ownerid": owner,
                "epoch": epoch,
            }
            if stored is not None and stored.state is not None:
                fields["state"] = str(stored.state)  # the state goes with the position it keeps
            if stored is not None:
                fields.update(done_fields(stored))  # and so do the events done beyond it
            try:
                record = await self._write(CHECKPOINT, scope, pid, fields, None if current is None else current.etag)
            except RecordConflict as conflict:
                if not first:
                    logger.info("processor %s: checkpoint of partition %s (hub %s, consumer group %s) changed while "
                                "fencing it (%s, attempt %d)", owner, pid, scope[1], scope[2],
                                type(conflict).__name__, attempt)
                first = False
                continue
            self._keep_only_fence(scope, pid, owner, epoch)
            self._remember_fence(scope, pid, owner, epoch, record.etag)
            logger.debug("processor %s fenced the checkpoint of partition %s (hub %s, consumer group %s, epoch %s)",
                         owner, pid, scope[1], scope[2], epoch)
            return None if stored is None or stored.sequence_number == NO_CHECKPOINT else stored
        raise CheckpointStoreError(f"fence of partition {pid} by {owner} (epoch {epoch}): the checkpoint record "
                                   f"changed under it {ATTEMPTS} times; not fenced")

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        """Write ``checkpoint`` as ``(owner_id, epoch)``: one conditional request after
        :meth:`fence_checkpoint`, verify-then-write otherwise (module docstring).

        Raises ``OwnershipLostError`` (checkpoint not written) once a later owner has
        fenced the partition, or, without a fence, when the ownership record does not
        name ``(owner_id, epoch)``.

        Example::

            await store.update_checkpoint(
                Checkpoint("ns", "hub", "$default", "0", sequence_number=41, offset="8192"),
                owner_id=me, epoch=3)
        """
        if not isinstance(checkpoint, Checkpoint):
            raise ConfigurationError(f"expected a Checkpoint, got {type(checkpoint).__name__}")
        scope = self._scope(checkpoint.fully_qualified_namespace, checkpoint.eventhub_name, checkpoint.consumer_group)
        pid = self._partition(checkpoint.partition_id)
        check_int(checkpoint.sequence_number, "sequence_number", 0, MAX_SEQUENCE_NUMBER, pid)
        if checkpoint.offset is not None:
            check_text(checkpoint.offset, f"offset of partition {pid!r}", allow_empty=False)
        self._check_writer(owner_id, epoch, pid)
        fields: Fields = {
            "sequencenumber": str(checkpoint.sequence_number),
            "offset": NO_OFFSET if checkpoint.offset is None else checkpoint.offset,
            "ownerid": owner_id,
            "epoch": epoch,
        }
        if checkpoint.state is not None:
            fields["state"] = str(checkpoint.state)
        fields.update(done_fields(checkpoint))
        await self._bounded(f"checkpoint of partition {pid}", self._update(scope, pid, fields, owner_id, epoch))
        logger.debug("processor %s checkpointed partition %s (hub %s, consumer group %s) at sequence number %s",
                     owner_id, pid, scope[1], scope[2], checkpoint.sequence_number)

    async def _update(self, scope: Scope, pid: str, fields: Fields, owner_id: str, epoch: int) -> None:
        etag = self._fence_etag(scope, pid, owner_id, epoch)
        trusted = etag is not None
        vanished = False  # the checkpoint this claim wrote is gone
        for attempt in range(1, ATTEMPTS + 1):
            if not trusted:
                etag = await self._verified_checkpoint_etag(scope, pid, owner_id, epoch, vanished=vanished)
            try:
                record = await self._write(CHECKPOINT, scope, pid, fields, etag)
            except RecordConflict as conflict:
                vanished = vanished or (etag is not None and isinstance(conflict, RecordMissing))
                self._forget_fence(scope, pid, owner_id, epoch)
                logger.info("processor %s: checkpoint of partition %s (hub %s, consumer group %s) changed under it "
                            "(%s, attempt %d)", owner_id, pid, scope[1], scope[2], type(conflict).__name__, attempt)
                trusted, etag = await self._after_conflict(scope, pid, owner_id, epoch)
                continue
            self._remember_fence(scope, pid, owner_id, epoch, record.etag)
            return
        raise CheckpointStoreError(f"checkpoint of partition {pid} by {owner_id} (epoch {epoch}) was changed by "
                                   f"another writer {ATTEMPTS} times while it owned the partition; not written")

    async def _verified_checkpoint_etag(self, scope: Scope, pid: str, owner_id: str, epoch: int, *,
                                        vanished: bool = False) -> str | None:
        """Without a fence: check ownership, then the etag to write over (``None``: create)."""
        await self._require_owner(scope, pid, owner_id, epoch, "checkpoint", vanished=vanished)
        current = await self._backend.read(CHECKPOINT, scope, pid)
        if current is None:
            return None
        stored = self._checkpoint_or_warn(current, scope)
        if stored is not None and later_than(stored, owner_id, epoch):
            await self._refuse_later(scope, pid, owner_id, epoch, stored, "checkpoint")
        return current.etag

    async def _after_conflict(self, scope: Scope, pid: str, owner_id: str, epoch: int) -> tuple[bool, str | None]:
        """Who changed the checkpoint under us: a later owner (raise), this very owner
        (trust its etag), anybody else (verify ownership again)."""
        current = await self._backend.read(CHECKPOINT, scope, pid)
        stored = None if current is None else parse_checkpoint(current, scope)
        if current is None or not isinstance(stored, Checkpoint):
            return False, None
        if later_than(stored, owner_id, epoch):
            await self._refuse_later(scope, pid, owner_id, epoch, stored, "checkpoint")
        if (stored.owner_id, stored.epoch) == (owner_id, epoch):
            return True, current.etag
        return False, None

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> list[Checkpoint]:
        """Every checkpoint of the consumer group. Placeholders (fenced partitions
        without a checkpoint) are left out; bad records are skipped with a warning.

        Example::

            positions = {c.partition_id: c.sequence_number
                         for c in await store.list_checkpoints("ns", "hub", "$default")}
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        listing = await self._bounded("listing checkpoints", self._backend.list(CHECKPOINT, scope))
        self._warn_foreign(listing, "checkpoint")
        checkpoints = (self._checkpoint_or_warn(record, scope) for record in listing.records)
        return [c for c in checkpoints if c is not None and c.sequence_number != NO_CHECKPOINT]
