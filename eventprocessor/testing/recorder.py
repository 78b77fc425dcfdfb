"""Record what handlers receive, and count duplicates, losses and overlaps from it."""
from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointStoreError, OwnershipLostError
from ..partition import PartitionProcessor

__all__ = ["Delivery", "DeliveryRecorder", "most_within", "recording_handler"]


@dataclass
class Delivery:
    """One batch in one handler: when it started and ended (virtual seconds)."""

    partition_id: str
    owner_id: str
    epoch: int
    first: int
    last: int
    started: float
    ended: float | None = None


def most_within(series: Iterable[Sequence[float]], window: float) -> int:
    """The most times of one series that fall within ``window`` seconds from one of them
    (0 for no times): e.g. the most partitions that left one processor within an interval."""
    return max((sum(1 for u in times if t <= u < t + window) for times in series for t in times), default=0)


@dataclass
class DeliveryRecorder:
    """Every batch every handler received, and every error and close it saw.

    Counts what a test asserts from deliveries, never from the SDK's own figures:
    events processed (:meth:`processed`), deliveries beyond the first
    (:meth:`duplicates`), deliveries of one event twice to the *same* claim
    (:meth:`duplicates_within_claims`), batches handed to a claim that had already
    ended (:attr:`after_end`) and batches of one partition handled by two claims at
    once (:meth:`overlaps`).

    Example::

        recorder = DeliveryRecorder()
        processor = EventProcessor(source, store, recording_handler(recorder))
        ...
        assert recorder.duplicates_within_claims() == 0 and not recorder.after_end
    """

    deliveries: list[Delivery] = field(default_factory=list)
    errors: list[tuple[str, str, Exception]] = field(default_factory=list)
    closes: list[tuple[str, str, Any]] = field(default_factory=list)
    received: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    in_claim: dict[tuple[str, str, int, int, int], int] = field(default_factory=lambda: defaultdict(int))
    """(partition, owner, epoch, claim, sequence number) -> deliveries to that claim. A
    claim is one context (one pump): a processor that takes its own record back after a
    claim ended starts a new claim with the same owner and epoch."""
    _claims: dict[int, tuple[int, Any]] = field(default_factory=dict, repr=False)

    def claim_of(self, context: Any) -> int:
        """The number of the claim ``context`` belongs to (1, 2, ... in order of first delivery)."""
        known = self._claims.get(id(context))
        if known is None or known[1] is not context:
            known = self._claims[id(context)] = (len(self._claims) + 1, context)
        return known[0]
    after_end: list[Delivery] = field(default_factory=list)
    """Batches whose delivery started when the claim could no longer dispatch."""
    closed_at: list[tuple[float, str, str, Any]] = field(default_factory=list)
    """(time, partition, owner, reason) of every close a handler saw (:meth:`record_close`)."""

    def record_close(self, context: Any, reason: Any, now: float) -> None:
        """Note that ``context``'s handler was closed at ``now`` (in :attr:`closes` too)."""
        self.closes.append((context.owner_id, context.partition_id, reason))
        self.closed_at.append((now, context.partition_id, context.owner_id, reason))

    def most_handed_over_by_one(self, window: float, since: float = float("-inf")) -> int:
        """The most partitions one processor's handlers were closed for a handoff within
        ``window`` seconds (closes from ``since`` on): the moment a partition left it."""
        out: dict[str, list[float]] = defaultdict(list)
        for t, _pid, owner, reason in self.closed_at:
            if t >= since and getattr(reason, "name", str(reason)) == "HANDOFF":
                out[owner].append(t)
        return most_within(out.values(), window)

    def record(self, context: Any, events: list[Any], now: float) -> Delivery:
        """Note one batch handed to ``context``'s claim at ``now``; returns its delivery
        (set ``ended`` when the handler is done with it)."""
        delivery = Delivery(context.partition_id, context.owner_id, context.epoch, events[0].sequence_number,
                            events[-1].sequence_number, now)
        self.deliveries.append(delivery)
        if not context.is_owned:
            self.after_end.append(delivery)
        claim = self.claim_of(context)
        for event in events:
            self.received[(context.partition_id, event.sequence_number)] += 1
            self.in_claim[(context.partition_id, context.owner_id, context.epoch, claim, event.sequence_number)] += 1
        return delivery

    def processed(self) -> set[tuple[str, int]]:
        return set(self.received)

    def duplicates(self) -> int:
        """Deliveries beyond the first of each event, over all claims."""
        return sum(count - 1 for count in self.received.values() if count > 1)

    def duplicates_within_claims(self) -> int:
        """Deliveries beyond the first of each event to one and the same claim."""
        return sum(count - 1 for count in self.in_claim.values() if count > 1)

    def missing(self, produced: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """The produced (partition, sequence number) pairs no handler received."""
        return [key for key in produced if key not in self.received]

    def overlaps(self) -> list[tuple[Delivery, Delivery, float]]:
        """Pairs of batches of one partition handled by two different claims at once,
        with how long they overlapped."""
        by_partition: dict[str, list[Delivery]] = defaultdict(list)
        for d in self.deliveries:
            by_partition[d.partition_id].append(d)
        found = []
        for batches in by_partition.values():
            batches.sort(key=lambda d: d.started)
            for i, a in enumerate(batches):
                a_end = a.ended if a.ended is not None else float("inf")
                for b in batches[i + 1:]:
                    if b.started >= a_end:
                        break
                    if (a.owner_id, a.epoch) != (b.owner_id, b.epoch):
                        b_end = b.ended if b.ended is not None else float("inf")
                        found.append((a, b, min(a_end, b_end) - b.started))
        return found


def recording_handler(ledger: DeliveryRecorder, *, work: float = 0.0, rng: random.Random | None = None,
                      checkpoint: bool = True, checkpoint_every: int = 1, catch_ownership_lost: bool = True,
                      checkpoint_on_release: bool = True) -> type:
    """A handler class that records every batch into ``ledger`` (a
    :class:`DeliveryRecorder`), spends up to ``work`` virtual seconds on it, and
    checkpoints its last event every ``checkpoint_every`` batches of a claim (never with
    ``checkpoint=False``).

    ``catch_ownership_lost=False`` lets :class:`OwnershipLostError` from
    ``update_checkpoint`` escape ``process_events``, as handler code that does not expect
    it does; ``checkpoint_on_release`` is the class attribute of the same name."""

    class Recorder(PartitionProcessor):
        def __init__(self) -> None:
            self.batches = 0

        async def process_events(self, events, context):
            loop = asyncio.get_running_loop()
            if not events:
                return
            delivery = ledger.record(context, events, loop.time())
            if work:
                await asyncio.sleep(rng.uniform(0, work) if rng is not None else work)
            delivery.ended = loop.time()
            self.batches += 1
            if checkpoint and checkpoint_every > 0 and self.batches % checkpoint_every == 0:
                try:
                    await context.update_checkpoint()
                except OwnershipLostError:
                    if not catch_ownership_lost:
                        raise
                except CheckpointStoreError:
                    pass

        async def process_error(self, error, context):
            ledger.errors.append((context.owner_id, context.partition_id, error))

        async def close(self, reason, context):
            ledger.record_close(context, reason, asyncio.get_running_loop().time())

    Recorder.checkpoint_on_release = checkpoint_on_release
    return Recorder
