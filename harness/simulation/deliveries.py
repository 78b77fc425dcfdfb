"""What the handlers of a simulation were given: a steady producer (:class:`Traffic`), every
batch (:class:`Batch`), and what the batches say (:class:`Deliveries`: duplicates, overlap,
pauses, resumption, events never delivered)."""
from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from eventprocessor.sources import InMemoryEventSource

__all__ = ["Batch", "Deliveries", "Traffic"]


@dataclass(frozen=True)
class Traffic:
    """A steady producer: every ``step`` virtual seconds, ``events_per_second * step``
    events are appended to every partition, at ``phase`` x ``step`` past each step
    boundary (half-way by default, so that production never lands on the instants where
    lockstep ticks run: whether a steal finds a batch in flight is then up to the
    handlers' load, not to an alignment of two grids)."""

    events_per_second: float = 4.0
    step: float = 1.0
    phase: float = 0.5

    @property
    def per_step(self) -> int:
        return max(1, round(self.events_per_second * self.step))


@dataclass
class Batch:
    """One batch in one handler: which claim got which events, and when (virtual s)."""

    partition_id: str
    owner_id: str
    claim: int  # this SDK: the claim's epoch; official: a serial per receive task
    first: int
    last: int
    start: float
    end: float | None = None
    duplicates: int = 0  # events of this batch some handler had been given before

    @property
    def key(self) -> tuple[str, int]:
        return (self.owner_id, self.claim)


class Deliveries:
    """Every batch every handler received, and what that says.

    * duplicates: events handed to a handler that some handler had been given before;
    * overlap: partition-seconds during which batches of two different claims of one
      partition were both in their handlers, and the most claims at once;
    * pauses: the longest gap between consecutive batches of a partition;
    * resumption: a partition's first batch after an instant, by given owners.
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.batches: list[Batch] = []
        self._starts: list[float] = []
        self._times_delivered: dict[str, list[int]] = {}
        self._by_partition: dict[str, list[Batch]] = {}

    def begin(self, partition_id: str, owner_id: str, claim: int, first: int, last: int) -> Batch:
        seen = self._times_delivered.setdefault(partition_id, [])
        if len(seen) <= last:
            seen.extend([0] * (last + 1 - len(seen)))
        duplicates = 0
        for seq in range(first, last + 1):
            if seen[seq]:
                duplicates += 1
            seen[seq] += 1
        now = self._now()
        batch = Batch(partition_id, owner_id, claim, first, last, now, duplicates=duplicates)
        self.batches.append(batch)
        self._starts.append(now)
        self._by_partition.setdefault(partition_id, []).append(batch)
        return batch

    def end(self, batch: Batch) -> None:
        if batch.end is None:
            batch.end = self._now()

    def since(self, start: float) -> list[Batch]:
        return self.batches[bisect.bisect_left(self._starts, start):]

    def duplicates(self, start: float = 0.0) -> int:
        return sum(b.duplicates for b in self.since(start))

    def events(self, start: float = 0.0) -> int:
        return sum(b.last - b.first + 1 for b in self.since(start))

    def overlap(self, start: float, until: float) -> tuple[float, int]:
        """(partition-seconds with two or more claims delivering, most claims at once)
        between ``start`` and ``until``."""
        seconds = 0.0
        most = 0
        for batches in self._by_partition.values():
            points: list[tuple[float, int, tuple[str, int]]] = []
            for b in batches:
                end = until if b.end is None else min(b.end, until)
                begin = max(b.start, start)
                if end > begin:
                    points.append((begin, 1, b.key))
                    points.append((end, 0, b.key))
                elif start <= b.start <= until:
                    most = max(most, 1)  # an instantaneous batch: one deliverer
            if not points:
                continue
            # Ends sort before starts at one instant: touching batches do not overlap.
            points.sort(key=lambda p: (p[0], p[1]))
            open_claims: Counter = Counter()
            previous = points[0][0]
            for when, is_start, key in points:
                if len(open_claims) >= 2:
                    seconds += when - previous
                previous = when
                if is_start:
                    open_claims[key] += 1
                    most = max(most, len(open_claims))
                else:
                    open_claims[key] -= 1
                    if open_claims[key] <= 0:
                        del open_claims[key]
        return seconds, most

    def first_batch(self, partition_id: str, after: float, owners: set[str] | None = None) -> Batch | None:
        for b in self._by_partition.get(partition_id, ()):
            if b.start >= after and (owners is None or b.owner_id in owners):
                return b
        return None

    def longest_pauses(self, start: float, until: float) -> dict[str, float]:
        """Per partition, the longest time between the end of one batch and the start of
        the next (any claims), for batches starting between ``start`` and ``until``."""
        result: dict[str, float] = {}
        for pid, batches in self._by_partition.items():
            inside = [b for b in batches if start <= b.start <= until]
            longest = 0.0
            reach: float | None = None
            for b in inside:
                if reach is not None:
                    longest = max(longest, b.start - reach)
                end = b.end if b.end is not None else until
                reach = end if reach is None else max(reach, end)
            result[pid] = longest
        return result

    def undelivered(self, source: InMemoryEventSource, partition_ids: Iterable[str], enqueued_before: datetime) -> int:
        """Events enqueued before ``enqueued_before`` that no handler was ever given."""
        missing = 0
        for pid in partition_ids:
            seen = self._times_delivered.get(pid, [])
            for event in source.events(pid):
                if event.enqueued_time >= enqueued_before:
                    break
                if event.sequence_number >= len(seen) or not seen[event.sequence_number]:
                    missing += 1
        return missing
