"""What the commit log says: its state after every entry below a version, as a pure fold.

:meth:`LogState.apply` folds one entry (``fence``, ``plan``, ``commit``, ``abort``) into
the state; :meth:`LogState.to_json` and :meth:`LogState.from_json` are the snapshot's
content. No storage, no clock, no I/O: :class:`~eventprocessor.spark.commit_log.CommitLog`
reads and appends the entries and decides what may be appended; the rules each entry
follows are in its module docstring.

Example::

    state = LogState()
    state.apply(0, {"type": "fence", "partition_id": "0", "owner_id": "a", "epoch": 1}, "log")
    state.apply(1, {"type": "plan", "ranges": [PartitionRange("0", 0, 9, "9", 10, "a", 1).to_json()]}, "log")
    state.apply(2, {"type": "commit", "batch_id": 1, "files": None}, "log")
    assert state.high_water_marks == {"0": 9} and state.outcome(1) == COMMITTED
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError
from .log_records import ABORTED, COMMITTED, PLANNED, PartitionRange, Publication, StagedFile

__all__ = ["Fence", "LogState"]

logger = logging.getLogger(__name__)

Claim = tuple[str, int, str]  # owner id, epoch, claim token
Resolved = dict[int, tuple[PartitionRange, ...]]  # batch id -> its ranges


@dataclass
class Fence:
    """The latest fence of a partition: the claim working on it, and the fence's version."""

    owner_id: str
    epoch: int
    version: int
    token: str = ""

    @property
    def claim(self) -> Claim:
        return self.owner_id, self.epoch, self.token


@dataclass
class LogState:
    """What the log says after every entry below ``next_version``."""

    next_version: int = 0
    fences: dict[str, Fence] = field(default_factory=dict)
    high_water_marks: dict[str, int] = field(default_factory=dict)
    planned: dict[int, tuple[PartitionRange, ...]] = field(default_factory=dict)
    outcomes: dict[int, str] = field(default_factory=dict)
    next_publication: int = 0
    unpublished: dict[int, Publication] = field(default_factory=dict)
    published_floor: int = -1  # every publication at or below it is known to be published

    def to_json(self) -> dict[str, Any]:
        return {
            "next_version": self.next_version,
            "fences": {pid: [f.owner_id, f.epoch, f.version, f.token] for pid, f in self.fences.items()},
            "high_water_marks": dict(self.high_water_marks),
            "planned": {str(b): [r.to_json() for r in ranges] for b, ranges in self.planned.items()},
            "outcomes": {str(b): o for b, o in self.outcomes.items()},
            "next_publication": self.next_publication,
            "unpublished": {str(p.number): [p.batch_id, [f.to_json() for f in p.files]]
                            for p in self.unpublished.values()},
            "published_floor": self.published_floor,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogState:
        return cls(
            next_version=int(data["next_version"]),
            fences={pid: Fence(str(f[0]), int(f[1]), int(f[2]), str(f[3]) if len(f) > 3 else "")
                    for pid, f in data["fences"].items()},
            high_water_marks={pid: int(v) for pid, v in data["high_water_marks"].items()},
            planned={int(b): tuple(PartitionRange.from_json(r) for r in ranges)
                     for b, ranges in data["planned"].items()},
            outcomes={int(b): str(o) for b, o in data["outcomes"].items()},
            next_publication=int(data["next_publication"]),
            unpublished={int(n): Publication(int(n), int(v[0]), tuple(StagedFile.from_json(f) for f in v[1]))
                         for n, v in data["unpublished"].items()},
            published_floor=int(data["published_floor"]),
        )

    # ------------------------------------------------------------------ the fold

    def apply(self, version: int, entry: Mapping[str, Any], where: str) -> Resolved:
        """Fold the entry at ``version`` in (``next_version`` is the caller's to move).
        Returns the batches it resolved (committed or aborted), with their ranges.
        ``where`` names the log in messages."""
        resolved: Resolved = {}
        kind = entry.get("type")
        if kind == "fence":
            pid = str(entry["partition_id"])
            fence = Fence(str(entry["owner_id"]), int(entry["epoch"]), version, str(entry.get("token", "")))
            self.fences[pid] = fence
            for planned_id, planned in list(self.planned.items()):
                if any(r.partition_id == pid and r.claim != fence.claim for r in planned):
                    self._resolve(planned_id, ABORTED, resolved)
        elif kind == "plan":
            self.planned[version] = tuple(PartitionRange.from_json(r) for r in entry["ranges"])
        elif kind == "commit":
            batch_id = int(entry["batch_id"])
            ranges = self.planned.get(batch_id)
            if ranges is None:  # cannot happen: a commit is validated against the history below it
                logger.error("commit log %s: version %d commits batch %d, which is not planned; ignoring it",
                             where, version, batch_id)
                return resolved
            files = entry.get("files")
            self._resolve(batch_id, COMMITTED, resolved)
            for r in ranges:
                self.high_water_marks[r.partition_id] = max(self.high_water_marks.get(r.partition_id, -1),
                                                            r.last_sequence_number)
            if files is not None:
                number = self.next_publication
                self.next_publication += 1
                self.unpublished[number] = Publication(number, batch_id, tuple(StagedFile.from_json(f) for f in files))
        elif kind == "abort":
            batch_id = int(entry["batch_id"])
            if batch_id in self.planned:
                self._resolve(batch_id, ABORTED, resolved)
        else:
            raise ConfigurationError(f"commit log {where} has an unknown entry type {kind!r} at version {version}")
        return resolved

    def _resolve(self, batch_id: int, outcome: str, resolved: Resolved) -> None:
        ranges = self.planned.pop(batch_id, None)
        self.outcomes[batch_id] = outcome
        if ranges is not None:
            resolved[batch_id] = ranges

    # ------------------------------------------------------------------ what it says

    def outcome(self, batch_id: int) -> str | None:
        """``planned``, ``committed``, ``aborted``, or ``None`` (unknown)."""
        if batch_id in self.planned:
            return PLANNED
        return self.outcomes.get(batch_id)

    def lost(self, ranges: Iterable[PartitionRange]) -> list[str]:
        """The partitions of ``ranges`` whose latest fence is not the range's claim."""
        lost = []
        for r in ranges:
            current = self.fences.get(r.partition_id)
            if current is None or current.claim != r.claim:
                lost.append(r.partition_id)
        return lost

    def discontinuous(self, ranges: Iterable[PartitionRange]) -> dict[str, int]:
        """The partitions of ``ranges`` whose committed high-water mark is not the one
        the range continues (``after``), with the mark."""
        found = {}
        for r in ranges:
            hwm = self.high_water_marks.get(r.partition_id, -1)
            if r.after is not None and hwm != r.after:
                found[r.partition_id] = hwm
        return found

    def mark_published(self, through: int) -> None:
        """Every publication up to ``through`` is in place: forget their files."""
        self.published_floor = max(self.published_floor, through)
        for number in [n for n in self.unpublished if n <= self.published_floor]:
            del self.unpublished[number]
