"""The sink's commit log: a linear, append-only log of fences and micro-batches.

It is what makes the Spark sink exactly-once, independent of the checkpoint store.
Pure Python and the local file system; no Spark involved.

Layout under the log directory::

    000000000000.json      version 0: an entry (a fence or a batch plan)
    000000000001.json      version 1 ...
    000000000001.outcome   the outcome of batch 1: "committed" or "aborted"

Two primitives, both atomic on a POSIX file system:

* *exclusive create with content*: write a temporary file, fsync it, then
  ``os.link`` it to its final name. ``link`` fails when the name exists, so exactly
  one writer wins a version (or an outcome) and a reader never sees a half-written
  entry.
* versions are dense: a writer creates version ``v`` only after it has read every
  version below ``v``. So whoever writes ``v`` decided with the whole history.

Entries:

* ``fence`` (partition, owner id, epoch): written when a processor starts working on
  a partition. It is refused when the log already holds a fence of that partition
  with a *higher* epoch (that processor is stale). Writing it aborts every batch
  plan below it that contains the partition and has no outcome yet, so the
  partition's committed high-water mark is final as of the fence.
* ``batch`` (ranges per partition, each with owner id and epoch): a plan, written
  before any data. Its version is the ``batch_id``. The plan is accepted only when,
  for every partition in it, the latest fence in the log is this very claim.
* ``outcome``: ``committed`` is created by the batch's writer after the data is in
  place; ``aborted`` by a fencer (or by the writer giving up). Only one of them can
  exist, so a stale owner racing a new owner either committed before the fence
  (and the new owner sees it in the high-water mark) or is refused.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ..errors import ConfigurationError, OwnershipLostError

__all__ = ["CommitLog", "PartitionRange", "FenceResult", "BatchRefused", "COMMITTED", "ABORTED"]

logger = logging.getLogger(__name__)

COMMITTED = "committed"
ABORTED = "aborted"
_FORMAT = 1


@dataclass(frozen=True)
class PartitionRange:
    """The events of one partition in one micro-batch.

    ``first_sequence_number`` and ``last_sequence_number`` are inclusive; ``owner_id``
    and ``epoch`` identify the claim that read them.

    Example::

        PartitionRange("0", first_sequence_number=100, last_sequence_number=199, last_offset="199",
                       count=100, owner_id="worker-1", epoch=3)
    """

    partition_id: str
    first_sequence_number: int
    last_sequence_number: int
    last_offset: str
    count: int
    owner_id: str
    epoch: int

    def to_json(self) -> dict:
        return {
            "partition_id": self.partition_id,
            "first_sequence_number": self.first_sequence_number,
            "last_sequence_number": self.last_sequence_number,
            "last_offset": self.last_offset,
            "count": self.count,
            "owner_id": self.owner_id,
            "epoch": self.epoch,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> "PartitionRange":
        return cls(
            partition_id=str(data["partition_id"]),
            first_sequence_number=int(data["first_sequence_number"]),
            last_sequence_number=int(data["last_sequence_number"]),
            last_offset=str(data["last_offset"]),
            count=int(data["count"]),
            owner_id=str(data["owner_id"]),
            epoch=int(data["epoch"]),
        )


@dataclass(frozen=True)
class FenceResult:
    """What a fence found: the partition's committed high-water mark (``None`` when
    nothing was ever committed) and the batches it aborted."""

    version: int
    high_water_mark: Optional[int]
    aborted: Tuple[int, ...]


class BatchRefused(Exception):
    """A batch plan or commit was refused because these partitions were fenced by a
    newer claim. The caller drops their events and retries with the rest."""

    def __init__(self, message: str, lost: Iterable[str]) -> None:
        super().__init__(message)
        self.lost = frozenset(lost)


@dataclass
class _Fence:
    owner_id: str
    epoch: int
    version: int


@dataclass
class _State:
    next_version: int = 0
    fences: Dict[str, _Fence] = field(default_factory=dict)
    high_water_marks: Dict[str, int] = field(default_factory=dict)
    pending: Dict[int, Tuple[PartitionRange, ...]] = field(default_factory=dict)
    outcomes: Dict[int, str] = field(default_factory=dict)
    scope: Optional[Tuple[str, str, str]] = None


class CommitLog:
    """The commit log of one output (one event hub and consumer group).

    Thread-safe within a process; safe across processes and hosts sharing a POSIX
    file system. Blocking I/O: call it from a worker thread in async code.

    Example::

        log = CommitLog("/data/out/_eventprocessor_commits",
                        fully_qualified_namespace="ns", eventhub_name="hub", consumer_group="$default")
        fence = log.fence("0", owner_id="a", epoch=3)      # skip events <= fence.high_water_mark
        batch_id = log.begin([PartitionRange("0", 10, 19, "19", 10, "a", 3)])
        ...write the data...
        log.commit(batch_id)                               # False: fenced meanwhile, discard the data
    """

    def __init__(
        self,
        location: Union[str, os.PathLike],
        *,
        fully_qualified_namespace: str,
        eventhub_name: str,
        consumer_group: str,
    ) -> None:
        self.location = Path(location)
        self.scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        self._state = _State()
        self._lock = threading.RLock()
        self.location.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"CommitLog(location={str(self.location)!r}, next_version={self._state.next_version})"

    # -- file primitives -------------------------------------------------------------

    def _entry_path(self, version: int) -> Path:
        return self.location / f"{version:012d}.json"

    def _outcome_path(self, version: int) -> Path:
        return self.location / f"{version:012d}.outcome"

    def _create_exclusive(self, path: Path, payload: dict) -> bool:
        """Create ``path`` with ``payload`` unless it exists. True when this call made it."""
        temp = self.location / f".tmp-{uuid.uuid4().hex}"
        data = json.dumps(payload, sort_keys=True).encode()
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(temp)

    def _read_outcome(self, version: int) -> str:
        """The outcome of a batch whose outcome file is known to exist."""
        data = self._read(self._outcome_path(version))
        if data is None:  # outcome files are never deleted
            raise RuntimeError(f"commit log {self.location}: outcome of batch {version} vanished")
        return str(data["outcome"])

    @staticmethod
    def _read(path: Path) -> Optional[dict]:
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            return None

    # -- reading ---------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the versions written since the last refresh and the outcomes of
        pending batches."""
        with self._lock:
            state = self._state
            while True:
                entry = self._read(self._entry_path(state.next_version))
                if entry is None:
                    break
                self._apply(state.next_version, entry)
                state.next_version += 1
            for version in sorted(state.pending):
                outcome = self._read(self._outcome_path(version))
                if outcome is not None:
                    self._resolve(version, outcome["outcome"])

    def _apply(self, version: int, entry: dict) -> None:
        state = self._state
        scope = tuple(entry.get("scope", ()))
        if scope != self.scope:
            raise ConfigurationError(
                f"commit log {self.location} belongs to namespace/hub/consumer group {scope!r}, "
                f"not {self.scope!r}; use one output per event hub and consumer group"
            )
        if entry["type"] == "fence":
            state.fences[entry["partition_id"]] = _Fence(entry["owner_id"], int(entry["epoch"]), version)
        elif entry["type"] == "batch":
            state.pending[version] = tuple(PartitionRange.from_json(r) for r in entry["ranges"])
        else:
            raise ConfigurationError(f"commit log {self.location} has an unknown entry type at version {version}")

    def _resolve(self, version: int, outcome: str) -> None:
        state = self._state
        ranges = state.pending.pop(version, None)
        state.outcomes[version] = outcome
        if outcome == COMMITTED and ranges:
            for r in ranges:
                previous = state.high_water_marks.get(r.partition_id, -1)
                state.high_water_marks[r.partition_id] = max(previous, r.last_sequence_number)

    def high_water_mark(self, partition_id: str) -> Optional[int]:
        """The highest committed sequence number of the partition, as of the last refresh."""
        with self._lock:
            return self._state.high_water_marks.get(partition_id)

    def high_water_marks(self) -> Dict[str, int]:
        """Every partition's committed high-water mark (refreshes first)."""
        self.refresh()
        with self._lock:
            return dict(self._state.high_water_marks)

    def outcome(self, version: int) -> Optional[str]:
        """``committed``, ``aborted`` or ``None`` (pending or unknown), as of the last refresh."""
        with self._lock:
            return self._state.outcomes.get(version)

    def batch_ranges(self, version: int) -> Optional[Tuple[PartitionRange, ...]]:
        """The ranges of a pending batch (``None`` once it has an outcome)."""
        with self._lock:
            return self._state.pending.get(version)

    def batches(self) -> List[Tuple[int, Optional[str], Tuple[PartitionRange, ...]]]:
        """Every batch in the log, read from disk: ``(batch_id, outcome, ranges)``,
        outcome ``None`` while pending. For tools and audits; it reads the whole log."""
        found = []
        for path in sorted(self.location.glob("*.json")):
            entry = self._read(path)
            if entry is None or entry.get("type") != "batch":
                continue
            version = int(path.stem)
            outcome = self._read(self._outcome_path(version))
            found.append((version, None if outcome is None else outcome["outcome"],
                          tuple(PartitionRange.from_json(r) for r in entry["ranges"])))
        return found

    # -- writing ---------------------------------------------------------------------

    def _append(self, payload: dict, validate) -> int:
        """Append an entry at the next free version; ``validate()`` runs against the
        complete history before each attempt and may raise to refuse."""
        payload = dict(payload, scope=list(self.scope), format=_FORMAT)
        while True:
            with self._lock:
                self.refresh()
                validate()
                version = self._state.next_version
                if self._create_exclusive(self._entry_path(version), payload):
                    self._apply(version, payload)
                    self._state.next_version = version + 1
                    return version
            # lost the race for this version: read it and decide again

    def fence(self, partition_id: str, *, owner_id: str, epoch: int) -> FenceResult:
        """Start a claim's work on ``partition_id``.

        Raises :class:`OwnershipLostError` when a newer claim (higher epoch) already
        fenced the partition. Returns the committed high-water mark, final for every
        claim older than this one.
        """

        def validate() -> None:
            current = self._state.fences.get(partition_id)
            if current is not None and current.epoch > epoch:
                raise OwnershipLostError(
                    f"partition {partition_id}: owner {owner_id} (epoch {epoch}) is stale, "
                    f"{current.owner_id} (epoch {current.epoch}) fenced it in the commit log",
                    partition_id=partition_id,
                )

        payload = {"type": "fence", "partition_id": partition_id, "owner_id": owner_id, "epoch": epoch}
        version = self._append(payload, validate)
        aborted: List[int] = []
        with self._lock:
            for batch in sorted(self._state.pending):
                if batch < version and any(r.partition_id == partition_id for r in self._state.pending[batch]):
                    if self._create_exclusive(self._outcome_path(batch), {"outcome": ABORTED, "by": owner_id}):
                        self._resolve(batch, ABORTED)
                        aborted.append(batch)
                    else:
                        self._resolve(batch, self._read_outcome(batch))
            hwm = self._state.high_water_marks.get(partition_id)
        logger.info(
            "commit log %s: owner %s fenced partition %s at epoch %s (version %s, high-water mark %s, aborted %s)",
            self.location, owner_id, partition_id, epoch, version, hwm, aborted,
        )
        return FenceResult(version=version, high_water_mark=hwm, aborted=tuple(aborted))

    def _lost(self, ranges: Iterable[PartitionRange]) -> List[str]:
        lost = []
        for r in ranges:
            current = self._state.fences.get(r.partition_id)
            if current is None or (current.owner_id, current.epoch) != (r.owner_id, r.epoch):
                lost.append(r.partition_id)
        return lost

    def begin(self, ranges: Iterable[PartitionRange]) -> int:
        """Write the plan of a batch; its version is the ``batch_id``.

        Raises :class:`BatchRefused` naming the partitions whose claim is no longer
        the latest fence, and ``ValueError`` if a range overlaps committed data.
        """
        ranges = tuple(ranges)
        if not ranges:
            raise ValueError("a batch needs at least one partition range")

        def validate() -> None:
            lost = self._lost(ranges)
            if lost:
                raise BatchRefused(f"partitions {sorted(lost)} were fenced by a newer claim", lost)
            for r in ranges:
                hwm = self._state.high_water_marks.get(r.partition_id, -1)
                if r.first_sequence_number <= hwm:
                    raise ValueError(
                        f"partition {r.partition_id}: range starting at {r.first_sequence_number} "
                        f"overlaps committed data up to {hwm}"
                    )

        return self._append({"type": "batch", "ranges": [r.to_json() for r in ranges]}, validate)

    def commit(self, batch_id: int) -> bool:
        """Mark the batch committed. False when a fencer aborted it first."""
        with self._lock:
            won = self._create_exclusive(self._outcome_path(batch_id), {"outcome": COMMITTED})
            outcome = COMMITTED if won else self._read_outcome(batch_id)
            self._resolve(batch_id, outcome)
            return outcome == COMMITTED

    def abort(self, batch_id: int) -> bool:
        """Give up a batch. False when it was already committed."""
        with self._lock:
            won = self._create_exclusive(self._outcome_path(batch_id), {"outcome": ABORTED})
            outcome = ABORTED if won else self._read_outcome(batch_id)
            self._resolve(batch_id, outcome)
            return outcome == ABORTED

    def lost_partitions(self, ranges: Iterable[PartitionRange]) -> List[str]:
        """The partitions of ``ranges`` fenced by a newer claim (refreshes first)."""
        with self._lock:
            self.refresh()
            return self._lost(ranges)
