"""The sink's commit log: one linear, append-only log of fences, batch plans and
outcomes per output. It is what makes the Spark sink exactly-once, independent of the
checkpoint store's checkpoints. Pure Python; no Spark involved.

Where it lives (a :class:`LogStorage`)
--------------------------------------
* :class:`StoreLogStorage`: in the checkpoint store the processors already share
  (Blob, Table or in-memory), as entries of a named log created with the store's
  ETag-conditional create-if-absent (``CheckpointStore.create_entry``). Processors on
  different hosts need nothing mounted.
* :class:`FileLogStorage`: a directory on a POSIX file system shared by every
  processor (local disk, NFS, a mounted volume). An entry is written to a temporary
  file, fsynced, then hard-linked to its name (``link`` fails when the name exists) and
  the directory is fsynced.

Both give the one primitive the log needs: *create an entry with its content, only if
no entry has that name*, so of two writers of one name exactly one wins and a reader
never sees half an entry.

Entries
-------
Versions are dense (``000000000000``, ``000000000001``, ...). A writer appends at the
first version it finds free, after reading every version below it, so whoever writes
version ``v`` decided with the whole history below ``v``:

* ``fence`` (partition, owner id, epoch, claim token): a claim starts working on a
  partition. It is refused when the log holds a fence of that partition with a higher
  epoch (the claim is stale). It aborts every planned batch of another claim that
  contains the partition, so the partition's committed *high-water mark* is final as of
  the fence. A claim is its owner id, its epoch and a random token of the sink's claim
  object: a processor can end a claim (its lease ran out) and adopt its own ownership
  record again with the same epoch, and the batches of the first claim object must not
  commit next to the second's.
* ``plan`` (ranges per partition, each with the claim that read it): a batch before any
  data is written. Its version is the ``batch_id``. Accepted only when, for each of its
  partitions, the latest fence is the range's claim.
* ``commit`` (``batch_id``, the files of the batch): the commit point. Accepted only
  when the batch is still planned (not aborted by a fence or given up) and every
  partition's latest fence is still the batch's claim. Commits that carry files get a
  dense *publication number* (0, 1, 2, ...: the order of their commit entries), under
  which the Parquet writer publishes them in Spark's ``_spark_metadata`` log.
* ``abort`` (``batch_id``): the writer gives a planned batch up.

Compaction and retention
------------------------
Every ``compact_every`` versions, the appender writes a *snapshot* (the whole state:
fences, high-water marks, planned batches, committed batches not yet known to be
published, recent outcomes) named ``snapshot-<version>``; readers start from the newest
snapshot. Entries below a snapshot are deleted once this process has known that
snapshot for ``retention`` seconds (default 15 minutes; measured on the local monotonic
clock, so wall-clock skew does not matter), and older snapshots with them. The log so
holds about ``retention`` worth of entries plus one compaction interval.

Deleting an entry makes its name free again, so a writer that paused for longer than
``retention / 2`` between reading the end of the log and appending (or between two
reads) re-checks against the newest snapshot before it trusts what it read or wrote.
Nothing it appends in the compacted past is ever read by anyone; a commit it cannot
confirm is reported as refused, and its claim ends (the next owner sorts it out).

One log per output and per event hub and consumer group: entries carry that scope and
a log refuses entries of another.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._runtime.clock import SystemClock
from ..errors import ConfigurationError
from .log_records import (
    _DIGITS,
    ABORTED,
    COMMITTED,
    FORMAT,
    PLANNED,
    SNAPSHOT_PREFIX,
    BatchRefused,
    FenceResult,
    Manifest,
    PartitionRange,
    Publication,
    StagedFile,
    StaleFenceError,
)
from .log_state import LogState
from .log_storage import FileLogStorage, LogStorage, StoreLogStorage, fsync_directory

if TYPE_CHECKING:  # pragma: no cover
    from ..stores.contract import CheckpointStore

__all__ = ["CommitLog", "LogStorage", "FileLogStorage", "StoreLogStorage", "PartitionRange", "StagedFile",
           "FenceResult", "Publication", "BatchRefused", "StaleFenceError", "COMMITTED", "ABORTED", "PLANNED",
           "fsync_directory", "Manifest"]

logger = logging.getLogger(__name__)


class _AlreadyDone(Exception):
    """Raised by a validator: the entry is not needed (what it would record is in the
    log already); ``result`` is what the append returns."""

    def __init__(self, result: Any) -> None:
        super().__init__("already in the log")
        self.result = result


def _entry_name(version: int) -> str:
    return f"{version:0{_DIGITS}d}"


def _snapshot_name(version: int) -> str:
    return f"{SNAPSHOT_PREFIX}{version:0{_DIGITS}d}"


class CommitLog:
    """The commit log of one output (one event hub and consumer group).

    Async; one instance serves one event loop. Safe across processes and hosts that
    share its storage.

    Example::

        log = CommitLog.in_store(store, "spark-sink-events", fully_qualified_namespace="ns",
                                 eventhub_name="hub", consumer_group="$default")
        fence = await log.fence("0", owner_id="a", epoch=3)   # skip events <= fence.high_water_mark
        batch_id = await log.begin([PartitionRange("0", 10, 19, "19", 10, "a", 3)])
        ...write the data...
        await log.commit(batch_id)                            # BatchRefused: fenced meanwhile
    """

    def __init__(self, storage: LogStorage, *, fully_qualified_namespace: str, eventhub_name: str,
                 consumer_group: str, retention: float = 900.0, compact_every: int = 100,
                 clock: Callable[[], float] | None = None) -> None:
        if retention <= 0:
            raise ConfigurationError(f"retention must be positive, got {retention}")
        if compact_every < 2:
            raise ConfigurationError(f"compact_every must be at least 2, got {compact_every}")
        self.storage = storage
        self.scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        self.retention = float(retention)
        self.compact_every = int(compact_every)
        # The running event loop's clock by default: virtual under VirtualTimeLoop, like
        # every other timed part of the SDK.
        self._clock = clock or SystemClock().monotonic
        self._state = LogState()
        self._loaded = False
        self._tail_seen_at: float | None = None  # when an entry was last found missing (the end)
        self._snapshot_version = 0  # the newest snapshot known (0: none)
        self._snapshots_seen: dict[int, float] = {}
        self._lock = asyncio.Lock()
        self._cleanup: asyncio.Task[None] | None = None
        # The ranges of recently resolved batches, to name a refused batch's partitions.
        self._resolved_ranges: collections.OrderedDict[int, tuple[PartitionRange, ...]] = collections.OrderedDict()
        self.requests = 0

    @classmethod
    def at_path(cls, directory: str | os.PathLike, **kwargs: Any) -> CommitLog:
        """A log in a directory of a shared POSIX file system."""
        return cls(FileLogStorage(directory), **kwargs)

    @classmethod
    def in_store(cls, store: CheckpointStore, log_name: str, *, fully_qualified_namespace: str,
                 eventhub_name: str, consumer_group: str, **kwargs: Any) -> CommitLog:
        """A log kept in a checkpoint store, as entries of log ``log_name``."""
        storage = StoreLogStorage(store, log_name, fully_qualified_namespace=fully_qualified_namespace,
                                  eventhub_name=eventhub_name, consumer_group=consumer_group)
        return cls(storage, fully_qualified_namespace=fully_qualified_namespace, eventhub_name=eventhub_name,
                   consumer_group=consumer_group, **kwargs)

    def __repr__(self) -> str:
        return f"CommitLog({self.storage.description}, next_version={self._state.next_version})"

    # ------------------------------------------------------------------ reading

    def _decode(self, name: str, data: bytes) -> dict[str, Any]:
        try:
            entry = json.loads(data)
        except ValueError as error:
            raise ConfigurationError(f"commit log {self.storage.description}: entry {name} is not JSON") from error
        if not isinstance(entry, dict) or entry.get("format") != FORMAT:
            raise ConfigurationError(
                f"commit log {self.storage.description}: entry {name} has format "
                f"{entry.get('format') if isinstance(entry, dict) else '?'}, this version reads {FORMAT}; "
                "use a new output path (or log name) with this version")
        scope = tuple(entry.get("scope", ()))
        if scope != self.scope:
            raise ConfigurationError(
                f"commit log {self.storage.description} belongs to namespace/hub/consumer group {scope!r}, "
                f"not {self.scope!r}; use one output per event hub and consumer group")
        return entry

    async def _read(self, name: str) -> bytes | None:
        self.requests += 1
        return await self.storage.read(name)

    async def _load_newest_snapshot(self) -> None:
        """Jump to the newest snapshot when it is ahead of what this log has read."""
        self.requests += 1
        names = await self.storage.list(SNAPSHOT_PREFIX)
        now = self._clock()
        versions = []
        for name in names:
            try:
                versions.append(int(name[len(SNAPSHOT_PREFIX):]))
            except ValueError:
                continue
        for version in versions:
            self._snapshots_seen.setdefault(version, now)
        if not versions:
            return
        newest = max(versions)
        self._snapshot_version = max(self._snapshot_version, newest)
        if newest <= self._state.next_version and self._loaded:
            return
        data = await self._read(_snapshot_name(newest))
        if data is None:  # deleted by a newer compaction meanwhile: read the listing again
            return await self._load_newest_snapshot()
        entry = self._decode(_snapshot_name(newest), data)
        state = LogState.from_json(entry["state"])
        if self._loaded and state.next_version <= self._state.next_version:
            return
        if self._loaded:
            logger.warning("commit log %s: this process was behind the compacted log (at version %d, the newest "
                           "snapshot is %d); continuing from the snapshot", self.storage.description,
                           self._state.next_version, state.next_version)
        state.mark_published(self._state.published_floor)  # what this process knows to be published stays known
        self._state = state

    async def _refresh(self) -> None:
        started = self._clock()
        if not self._loaded or self._tail_seen_at is None or started - self._tail_seen_at >= self.retention / 2:
            # First read, or this view is old enough that entries it has not read may have
            # been compacted away (their names free again): start from the newest snapshot.
            await self._load_newest_snapshot()
            self._loaded = True
        while True:
            reading_at = self._clock()
            name = _entry_name(self._state.next_version)
            data = await self._read(name)
            if data is None:
                self._tail_seen_at = reading_at
                return
            self._apply(self._state.next_version, self._decode(name, data))
            self._state.next_version += 1

    async def refresh(self) -> None:
        """Read the entries written since the last read."""
        async with self._lock:
            await self._refresh()

    def _apply(self, version: int, entry: Mapping[str, Any]) -> None:
        # The ranges of recently resolved batches are kept to name a refused batch's partitions.
        for batch_id, ranges in self._state.apply(version, entry, self.storage.description).items():
            self._resolved_ranges[batch_id] = ranges
            while len(self._resolved_ranges) > 1000:
                self._resolved_ranges.popitem(last=False)

    # ------------------------------------------------------------------ what it says

    def high_water_mark(self, partition_id: str) -> int | None:
        """The highest committed sequence number of the partition, as of the last read."""
        return self._state.high_water_marks.get(partition_id)

    async def high_water_marks(self) -> dict[str, int]:
        """Every partition's committed high-water mark (reads the log first)."""
        await self.refresh()
        return dict(self._state.high_water_marks)

    def known_high_water_marks(self) -> dict[str, int]:
        """Every partition's committed high-water mark as of the last read."""
        return dict(self._state.high_water_marks)

    def outcome(self, batch_id: int) -> str | None:
        """``planned``, ``committed``, ``aborted``, or ``None`` (unknown: not read yet, or
        compacted away), as of the last read."""
        return self._state.outcome(batch_id)

    def is_resolved_and_published(self, batch_id: int) -> bool:
        """True when the batch is not planned and has no committed files waiting to be
        published: its staged files, if any are left, can go."""
        state = self._state
        if batch_id in state.planned:
            return False
        return not any(p.batch_id == batch_id for p in state.unpublished.values())

    def unpublished(self, through: int | None = None) -> list[Publication]:
        """Committed batches with files that this process does not know to be published,
        up to publication number ``through``, in order."""
        return [p for n, p in sorted(self._state.unpublished.items()) if through is None or n <= through]

    def mark_published(self, through: int) -> None:
        """Every publication up to ``through`` is in place: forget their files."""
        self._state.mark_published(through)

    @property
    def next_version(self) -> int:
        return self._state.next_version

    # ------------------------------------------------------------------ writing

    async def _append(self, entry: dict[str, Any], validate: Callable[[], Any]) -> tuple[int, Any]:
        """Append ``entry`` at the first free version. ``validate()`` runs against the
        whole history before each attempt; it may raise to refuse, and its result is
        returned with the version. Appends of this process go one at a time."""
        payload = dict(entry, scope=list(self.scope), format=FORMAT)
        data = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        async with self._lock:
            while True:
                await self._refresh()
                try:
                    result = validate()
                except _AlreadyDone as done:
                    return -1, done.result
                version = self._state.next_version
                checked_at = self._tail_seen_at
                self.requests += 1
                create_started = self._clock()
                won = await self.storage.create(_entry_name(version), data)
                if won and checked_at is not None and self._clock() - checked_at >= self.retention / 2:
                    # This append took long enough that version `version` may have been written
                    # and compacted away meanwhile: trust it only if no snapshot covers it.
                    await self._load_newest_snapshot()
                    if self._snapshot_version > version:
                        logger.warning("commit log %s: an append at version %d took longer than half the "
                                       "retention and the log was compacted past it; deciding again",
                                       self.storage.description, version)
                        self._tail_seen_at = None
                        continue
                if won:
                    self._apply(version, payload)
                    self._state.next_version = version + 1
                    # Version + 1 can only be written after this one: it was free when this create began.
                    self._tail_seen_at = create_started
                    self._maybe_compact()
                    return version, result
                # Lost the race for this version: read it and decide again.

    async def fence(self, partition_id: str, *, owner_id: str, epoch: int, claim_token: str = "") -> FenceResult:
        """Start a claim's work on ``partition_id``.

        Raises :class:`StaleFenceError` (an ``OwnershipLostError``) when a newer claim
        (higher epoch) already fenced the partition. Returns the committed high-water
        mark, final for every claim older than this one, and the batches aborted.
        """
        def validate() -> list[int]:
            current = self._state.fences.get(partition_id)
            if current is not None and (current.epoch > epoch or
                                        (current.epoch == epoch and current.owner_id != owner_id)):
                raise StaleFenceError(
                    f"partition {partition_id}: the claim of {owner_id} (epoch {epoch}) is stale: "
                    f"{current.owner_id} (epoch {current.epoch}) fenced it in the commit log "
                    f"({self.storage.description})", partition_id=partition_id, logged_owner=current.owner_id,
                    logged_epoch=current.epoch)
            return sorted(b for b, ranges in self._state.planned.items()
                          if any(r.partition_id == partition_id and r.claim != (owner_id, epoch, claim_token)
                                 for r in ranges))

        entry = {"type": "fence", "partition_id": partition_id, "owner_id": owner_id, "epoch": epoch,
                 "token": claim_token}
        version, aborted = await self._append(entry, validate)
        hwm = self._state.high_water_marks.get(partition_id)
        logger.info("commit log %s: owner %s fenced partition %s at epoch %s (version %s, high-water mark %s, "
                    "aborted %s)", self.storage.description, owner_id, partition_id, epoch, version, hwm, aborted)
        return FenceResult(version=version, high_water_mark=hwm, aborted=tuple(aborted))

    async def begin(self, ranges: Iterable[PartitionRange]) -> int:
        """Write the plan of a batch; its version is the ``batch_id``.

        Raises :class:`BatchRefused` naming the partitions whose claim is no longer the
        latest fence, and ``ValueError`` if a range overlaps committed data (a bug).
        """
        ranges = tuple(ranges)
        if not ranges:
            raise ValueError("a batch needs at least one partition range")

        def validate() -> None:
            lost = self._state.lost(ranges)
            if lost:
                raise BatchRefused(f"partitions {sorted(lost)} were fenced by a newer claim", lost)
            for r in ranges:
                hwm = self._state.high_water_marks.get(r.partition_id, -1)
                if r.first_sequence_number <= hwm:
                    raise ValueError(f"partition {r.partition_id}: range starting at {r.first_sequence_number} "
                                     f"overlaps committed data up to {hwm}")

        version, _ = await self._append({"type": "plan", "ranges": [r.to_json() for r in ranges]}, validate)
        return version

    async def commit(self, batch_id: int, files: Sequence[StagedFile] | None = None) -> int | None:
        """The commit point of a planned batch, with its files (the Parquet writer) or
        without (``foreach_batch``). Returns the publication number (``None`` without
        files). Raises :class:`BatchRefused` when the batch was aborted first (``lost``
        names the partitions fenced by a newer claim; all of the batch's when it was
        given up)."""
        async with self._lock:
            await self._refresh()
            ranges = self._state.planned.get(batch_id) or self._resolved_ranges.get(batch_id, ())

        def validate() -> None:
            outcome = self.outcome(batch_id)
            if outcome == COMMITTED:
                raise _AlreadyDone(None)
            if outcome == PLANNED:
                lost = self._state.lost(self._state.planned[batch_id])
                if lost:
                    raise BatchRefused(f"batch {batch_id}: partitions {sorted(lost)} were fenced by a newer claim",
                                       lost)
                return
            if outcome == ABORTED:
                lost = self._state.lost(ranges) or [r.partition_id for r in ranges]
                raise BatchRefused(f"batch {batch_id} was aborted (partitions {sorted(lost)} fenced by a newer "
                                   "claim)" if self._state.lost(ranges) else f"batch {batch_id} was given up", lost)
            raise BatchRefused(f"batch {batch_id} is not in the commit log {self.storage.description} (compacted "
                               "while this process paused?)", [r.partition_id for r in ranges])

        entry: dict[str, Any] = {"type": "commit", "batch_id": batch_id,
                                 "files": None if files is None else [f.to_json() for f in files]}
        await self._append(entry, validate)
        return self.publication_of(batch_id)

    def publication_of(self, batch_id: int) -> int | None:
        """The publication number of a committed batch not yet known to be published."""
        for publication in self._state.unpublished.values():
            if publication.batch_id == batch_id:
                return publication.number
        return None

    async def abort(self, batch_id: int) -> bool:
        """Give a planned batch up. False when it was committed (the commit won)."""
        def validate() -> None:
            outcome = self.outcome(batch_id)
            if outcome != PLANNED:
                raise _AlreadyDone(outcome)

        await self._append({"type": "abort", "batch_id": batch_id}, validate)
        return self.outcome(batch_id) != COMMITTED

    async def lost_partitions(self, ranges: Iterable[PartitionRange]) -> list[str]:
        """The partitions of ``ranges`` fenced by a newer claim (reads the log first)."""
        await self.refresh()
        return self._state.lost(ranges)

    # ------------------------------------------------------------------ audits

    async def entries(self) -> list[tuple[int, dict[str, Any]]]:
        """Every entry still kept (not compacted away), read from the storage: for tools
        and audits."""
        found = []
        for name in await self.storage.list():
            if not name.isdigit():
                continue
            data = await self.storage.read(name)
            if data is not None:
                found.append((int(name), self._decode(name, data)))
        return found

    async def batches(self) -> list[tuple[int, str | None, tuple[PartitionRange, ...]]]:
        """Every batch planned in the entries still kept: ``(batch_id, outcome, ranges)``,
        outcome ``planned``, ``committed`` or ``aborted``. For tools and audits."""
        entries = await self.entries()
        await self.refresh()
        return [(version, self.outcome(version), tuple(PartitionRange.from_json(r) for r in entry["ranges"]))
                for version, entry in entries if entry["type"] == "plan"]

    # ------------------------------------------------------------------ compaction

    def _maybe_compact(self) -> None:
        if self._state.next_version - self._snapshot_version < self.compact_every:
            return
        if self._cleanup is not None and not self._cleanup.done():
            return
        state = LogState.from_json(self._state.to_json())  # a copy, as of now
        self._snapshot_version = state.next_version
        self._cleanup = asyncio.get_running_loop().create_task(self._compact(state),
                                                               name="spark-commit-log-compaction")

    async def _compact(self, state: LogState) -> None:
        """Write a snapshot of ``state``, then delete what retention allows."""
        try:
            # Outcomes of batches planned before the previous snapshot are not needed any more.
            previous = max([v for v in self._snapshots_seen if v < state.next_version], default=0)
            state.outcomes = {b: o for b, o in state.outcomes.items() if b >= previous}
            snapshot = {"type": "snapshot", "state": state.to_json(), "scope": list(self.scope), "format": FORMAT}
            name = _snapshot_name(state.next_version)
            await self.storage.create(name, json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode())
            self._snapshots_seen.setdefault(state.next_version, self._clock())
            logger.debug("commit log %s: snapshot at version %d", self.storage.description, state.next_version)
            await self.delete_expired()
        except Exception as error:  # compaction is best effort: the next one tries again
            logger.warning("commit log %s: compaction failed: %r", self.storage.description, error)

    async def delete_expired(self) -> int:
        """Delete entries and snapshots below the newest snapshot this process has known
        for ``retention`` seconds. Returns how many names it deleted."""
        now = self._clock()
        old = [v for v, seen in self._snapshots_seen.items() if now - seen >= self.retention]
        if not old:
            return 0
        horizon = max(old)
        deleted = 0
        for name in await self.storage.list():
            if name.startswith(SNAPSHOT_PREFIX):
                try:
                    version = int(name[len(SNAPSHOT_PREFIX):])
                except ValueError:
                    continue
            elif name.isdigit():
                version = int(name)
            else:
                continue
            if version < horizon:
                await self.storage.delete(name)
                deleted += 1
        for version in [v for v in self._snapshots_seen if v < horizon]:
            del self._snapshots_seen[version]
        if deleted:
            logger.info("commit log %s: deleted %d entries below version %d (retention %.0f s)",
                        self.storage.description, deleted, horizon, self.retention)
        return deleted

    async def aclose(self) -> None:
        """Wait for a compaction in progress."""
        task, self._cleanup = self._cleanup, None
        if task is not None:
            try:
                await task
            except asyncio.CancelledError:
                pass
