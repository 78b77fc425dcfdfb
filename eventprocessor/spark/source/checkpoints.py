"""One consumer group, two engines: a query's commits as Event Hubs checkpoints.

With ``eventhubs.checkpointStore.*`` named, the query takes part in the consumer
group's checkpoint store (Blob or Table, the official layout) as one more owner:

* **Start.** A new query (no Spark checkpoint yet) starts each partition after the
  store's checkpoint, where there is one; elsewhere at ``eventhubs.startingPosition(s)``.
  A restarted query resumes from Spark's own offset log, as any query does.
* **Commit.** When Spark commits a micro-batch, the query lists the ownership records
  and, per partition, decides with :func:`plan_claims`:

  - a record that names the query's owner id: *renew* it (same epoch, If-Match);
  - no record, a released one, or one whose owner has not renewed it for
    ``eventhubs.checkpointStore.ownershipExpiration`` seconds (store clock): *claim*
    it with the next epoch, If-Match, then *fence* the checkpoint (which refuses a
    checkpoint written by a later epoch and returns the stored position);
  - a live record of another owner (an ``EventProcessor``, azure-eventhub's processor,
    another query): *leave it*; nothing of that partition is written.

  Then, for each partition it holds, it writes the checkpoint (the last event of the
  batch: its sequence number and offset) with ``update_checkpoint`` fenced by its
  ``(owner_id, epoch)``, and only if it is past the stored one. So a query never moves
  a checkpoint backwards and never writes over a live owner; an owner that takes a
  partition from it (a higher epoch) makes its next write fail, and it stops writing
  that partition.
* **Stop.** When the query stops, it releases its records, so a processor takes the
  partitions at its next balancing tick (after a crash they expire instead).

The query's owner id is ``eventhubs.checkpointStore.ownerId``, or ``spark-`` and a
random suffix per run (a restarted run then waits for the previous run's records to
expire). A store failure never fails the query: Spark's offset log is what the query
resumes from; the store's checkpoints are for the group's other members (and for lag in
``eventprocessor status``, KEDA and the portal). Failures are logged and the next commit
tries again.

Example::

    writer = CheckpointWriter(store_options, namespace, hub, "$Default")
    positions = await writer.starting_positions()
    report = await writer.commit(end)
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ...errors import CheckpointStoreError, OwnershipLostError
from ...stores.contract import CheckpointStore
from ...stores.records import Checkpoint, Ownership, OwnershipListing, partition_sort_key
from .offsets import HubOffset, PartitionPosition
from .options import StoreOptions

__all__ = ["CheckpointWriter", "ClaimPlan", "CommitReport", "plan_claims", "open_store", "default_owner_id"]

logger = logging.getLogger(__name__)


def default_owner_id() -> str:
    """``spark-`` and 12 random hex digits: one owner per run of a query."""
    return f"spark-{uuid.uuid4().hex[:12]}"


def open_store(options: StoreOptions) -> CheckpointStore:
    """The Blob or Table store the options name (imports the ``[blob]``/``[table]`` extra)."""
    if options.container:
        from eventprocessor.stores import BlobCheckpointStore

        return BlobCheckpointStore.from_connection_string(options.connection_string, options.container)
    from eventprocessor.stores import TableCheckpointStore

    assert options.table is not None
    return TableCheckpointStore.from_connection_string(options.connection_string, options.table)


@dataclass(frozen=True)
class ClaimPlan:
    """What a commit does to the ownership records (see :func:`plan_claims`)."""

    renew: tuple[Ownership, ...] = ()
    claim: tuple[Ownership, ...] = ()
    held_by_others: Mapping[str, str] = field(default_factory=dict)
    """partition id -> the live owner that keeps it."""


def plan_claims(listing: OwnershipListing, partition_ids: Sequence[str], owner_id: str, *,
                fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                expiration: float) -> ClaimPlan:
    """Per partition: renew the query's own record, claim a free one (none, released,
    expired on the store's clock) with the next epoch, leave a live owner's alone.
    An unreadable record counts as a live owner's.

    Example::

        plan = plan_claims(listing, ["0", "1"], "spark-q1", fully_qualified_namespace="ns",
                           eventhub_name="hub", consumer_group="$Default", expiration=75)
    """
    records = {o.partition_id: o for o in listing.ownerships}
    unreadable = {u.partition_id for u in listing.unreadable}
    renew: list[Ownership] = []
    claim: list[Ownership] = []
    held: dict[str, str] = {}
    for pid in sorted(partition_ids, key=partition_sort_key):
        record = records.get(pid)
        if record is None:
            if pid in unreadable:
                held[pid] = "<unreadable record>"
                continue
            claim.append(Ownership(fully_qualified_namespace, eventhub_name, consumer_group, pid, owner_id, epoch=1))
            continue
        if record.owner_id == owner_id:
            renew.append(replace(record, requested_by=""))
            continue
        age = (float("inf") if record.last_modified_time is None
               else (listing.server_time - record.last_modified_time).total_seconds())
        if record.is_released or age > expiration:
            claim.append(replace(record, owner_id=owner_id, epoch=record.epoch + 1, requested_by=""))
        else:
            held[pid] = record.owner_id
    return ClaimPlan(tuple(renew), tuple(claim), held)


@dataclass
class CommitReport:
    """What one commit wrote to the store, for logs and tests."""

    written: dict[str, int] = field(default_factory=dict)
    """partition id -> sequence number checkpointed."""
    held_by_others: dict[str, str] = field(default_factory=dict)
    behind: dict[str, int] = field(default_factory=dict)
    """partition id -> the stored sequence number the batch did not pass."""
    lost: list[str] = field(default_factory=list)
    failed: str | None = None


class CheckpointWriter:
    """The query's part in the consumer group's checkpoint store (module docstring)."""

    def __init__(self, options: StoreOptions, fully_qualified_namespace: str, eventhub_name: str,
                 consumer_group: str, *, store: CheckpointStore | None = None) -> None:
        self.options = options
        self.owner_id = options.owner_id or default_owner_id()
        self.scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        self._store = store
        self._held: dict[str, Ownership] = {}
        self._floor: dict[str, int] = {}  # the stored sequence number no write may go below

    def __repr__(self) -> str:
        return f"CheckpointWriter(owner_id={self.owner_id!r}, {self.options.kind} {self.options.where})"

    @property
    def store(self) -> CheckpointStore:
        if self._store is None:
            self._store = open_store(self.options)
        return self._store

    async def starting_positions(self) -> dict[str, PartitionPosition]:
        """The store's checkpoints as positions: the event after each checkpoint."""
        checkpoints = await self.store.list_checkpoints(*self.scope)
        return {c.partition_id: PartitionPosition(c.sequence_number + 1, c.offset) for c in checkpoints}

    async def commit(self, end: HubOffset) -> CommitReport:
        """Renew or claim the partitions nobody else holds and checkpoint the last event
        of ``end`` where it is past the stored one. Never raises: a failure is logged
        and reported, and the next commit tries again."""
        report = CommitReport()
        try:
            await self._commit(end, report)
        except (CheckpointStoreError, OwnershipLostError, OSError) as error:
            report.failed = f"{type(error).__name__}: {error}"
            logger.warning("query %s: writing Event Hubs checkpoints to %s %s failed (%s); Spark's own checkpoint is "
                           "unaffected, the next commit tries again", self.owner_id, self.options.kind,
                           self.options.where, report.failed)
        return report

    async def _commit(self, end: HubOffset, report: CommitReport) -> None:
        store = self.store
        listing = await store.list_ownership(*self.scope)
        plan = plan_claims(listing, list(end.partitions), self.owner_id, fully_qualified_namespace=self.scope[0],
                           eventhub_name=self.scope[1], consumer_group=self.scope[2],
                           expiration=self.options.ownership_expiration)
        report.held_by_others.update(plan.held_by_others)
        for pid, owner in plan.held_by_others.items():
            if self._held.pop(pid, None) is not None:
                logger.info("query %s: partition %s is now owned by %s; its checkpoints are theirs", self.owner_id,
                            pid, owner)
        won = {o.partition_id: o for o in await store.claim_ownership([*plan.renew, *plan.claim])}
        for record in (*plan.renew, *plan.claim):
            if record.partition_id not in won:
                self._held.pop(record.partition_id, None)
                report.lost.append(record.partition_id)
        for pid, record in sorted(won.items(), key=lambda item: partition_sort_key(item[0])):
            previous = self._held.get(pid)
            self._held[pid] = record
            if previous is None or previous.epoch != record.epoch:
                # A new hold (or the first in this process): fence, and learn the stored position.
                stored = await store.fence_checkpoint(record)
                self._floor[pid] = stored.sequence_number if stored is not None else -1
                logger.info("query %s holds partition %s (epoch %s) in %s %s; stored checkpoint %s", self.owner_id,
                            pid, record.epoch, self.options.kind, self.options.where,
                            "none" if stored is None else stored.sequence_number)
            await self._checkpoint(pid, record, end.partitions[pid], report)

    async def _checkpoint(self, pid: str, record: Ownership, position: PartitionPosition,
                          report: CommitReport) -> None:
        last = position.sequence_number - 1
        floor = self._floor.get(pid, -1)
        if last <= floor:
            if last < floor:
                report.behind[pid] = floor
            return
        if position.offset is None:
            logger.debug("query %s: partition %s has no offset for sequence number %s; not checkpointed", self.owner_id,
                         pid, last)
            return
        checkpoint = Checkpoint(*self.scope, pid, last, offset=position.offset)
        try:
            await self.store.update_checkpoint(checkpoint, owner_id=self.owner_id, epoch=record.epoch)
        except OwnershipLostError as lost:
            self._held.pop(pid, None)
            report.lost.append(pid)
            logger.info("query %s: partition %s was taken over (%s); its checkpoints are the new owner's",
                        self.owner_id, pid, lost)
            return
        self._floor[pid] = last
        report.written[pid] = last

    async def release(self) -> None:
        """Release every record the query holds, all at once (when the query stops:
        Spark gives the reader's process only a moment)."""
        held, self._held = list(self._held.values()), {}
        results = await asyncio.gather(*(self.store.release_ownership(record) for record in held),
                                       return_exceptions=True)
        for record, result in zip(held, results, strict=False):
            if isinstance(result, BaseException):  # the record expires on its own
                logger.info("query %s: releasing partition %s failed (%s); it expires instead", self.owner_id,
                            record.partition_id, result)

    async def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()

    def held(self) -> list[str]:
        return sorted(self._held, key=partition_sort_key)
