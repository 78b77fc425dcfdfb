"""The values of the Spark sink's commit log: partition ranges, staged files, fences,
and the errors a batch can end with."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import OwnershipLostError

PLANNED = "planned"
COMMITTED = "committed"
ABORTED = "aborted"
FORMAT = 2
SNAPSHOT_PREFIX = "snapshot-"
_DIGITS = 12

@dataclass(frozen=True)
class PartitionRange:
    """The events of one partition in one micro-batch.

    ``first_sequence_number`` and ``last_sequence_number`` are inclusive; ``owner_id``,
    ``epoch`` and ``claim_token`` identify the claim that read them. ``after`` is the
    partition's committed high-water mark the range continues (-1: nothing committed):
    for a claim's first batch, the mark its fence found; then the last sequence number of
    the claim's batch before. The range commits only while the mark is exactly that, so
    no batch commits past one of its claim that did not (``None``: not checked).

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
    claim_token: str = ""
    after: int | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"partition_id": self.partition_id, "first_sequence_number": self.first_sequence_number,
                "last_sequence_number": self.last_sequence_number, "last_offset": self.last_offset,
                "count": self.count, "owner_id": self.owner_id, "epoch": self.epoch, "token": self.claim_token}
        if self.after is not None:
            data["after"] = self.after
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionRange:
        return cls(partition_id=str(data["partition_id"]),
                   first_sequence_number=int(data["first_sequence_number"]),
                   last_sequence_number=int(data["last_sequence_number"]), last_offset=str(data["last_offset"]),
                   count=int(data["count"]), owner_id=str(data["owner_id"]), epoch=int(data["epoch"]),
                   claim_token=str(data.get("token", "")),
                   after=None if data.get("after") is None else int(data["after"]))

    @property
    def claim(self) -> tuple[str, int, str]:
        return self.owner_id, self.epoch, self.claim_token


@dataclass(frozen=True)
class StagedFile:
    """One data file of a batch: its path relative to the batch's staging directory
    (``/``-separated, e.g. ``partition_id=0/part-00000-....parquet``), its size in bytes
    and its modification time in epoch milliseconds, as listed before the commit."""

    path: str
    size: int
    modification_time: int

    def to_json(self) -> list[Any]:
        return [self.path, self.size, self.modification_time]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> StagedFile:
        return cls(str(data[0]), int(data[1]), int(data[2]))


Manifest = tuple[StagedFile, ...]


@dataclass(frozen=True)
class Publication:
    """A committed batch with files, and its publication number (its place in Spark's
    ``_spark_metadata`` log)."""

    number: int
    batch_id: int
    files: Manifest


@dataclass(frozen=True)
class FenceResult:
    """What a fence found: the partition's committed high-water mark (``None`` when
    nothing was ever committed) and the planned batches it aborted."""

    version: int
    high_water_mark: int | None
    aborted: tuple[int, ...]


class BatchRefused(Exception):
    """A plan or a commit was refused: these partitions were fenced by a newer claim (or
    the batch was given up). The caller drops their events and goes on with the rest."""

    def __init__(self, message: str, lost: Iterable[str]) -> None:
        super().__init__(message)
        self.lost = frozenset(lost)


class StaleFenceError(OwnershipLostError):
    """A claim's fence was refused: the log holds a fence of the partition with a higher
    epoch (``logged_epoch``, by ``logged_owner``)."""

    def __init__(self, message: str, *, partition_id: str, logged_owner: str, logged_epoch: int) -> None:
        super().__init__(message, partition_id=partition_id)
        self.logged_owner = logged_owner
        self.logged_epoch = logged_epoch
