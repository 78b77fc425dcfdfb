"""The sink's view of the partitions it is given: one :class:`Claim` per partition
claim, and :class:`Buffers`, which hold their events until a batch is cut.

A batch is cut at ``max_events`` events, ``max_bytes`` of bodies or ``max_interval``
seconds after its first event, whichever comes first. It takes a fair share of every
partition's buffered events (each a prefix, so order is kept), at most ``max_events``
events and ``max_bytes`` of bodies (except one larger event). Handlers wait while a
full batch is buffered (back-pressure), so memory stays bounded.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from dataclasses import dataclass

from ..events import Event
from ..partition import PartitionContext

__all__ = ["Claim", "ClaimState", "Buffers", "Limits"]

logger = logging.getLogger(__name__)


class ClaimState(enum.Enum):
    FENCING = "fencing"
    """Waiting for its fence in the commit log; events are not accepted yet."""
    ACTIVE = "active"
    """Fenced: its events are buffered and written."""
    PARKED = "parked"
    """A batch of it failed every attempt (poison policy PARK): events are dropped
    unwritten and not checkpointed until the processor restarts."""
    ENDED = "ended"
    """Closed, or fenced out by a newer claim: nothing more is accepted."""


class Claim:
    """One partition claim as the sink sees it."""

    def __init__(self, context: PartitionContext) -> None:
        self.context = context
        self.partition_id = context.partition_id
        # Tells this claim object apart in the commit log from another claim of the same
        # owner and epoch (a processor that adopts its own ownership record again).
        self.token = uuid.uuid4().hex[:16]
        self.state = ClaimState.FENCING
        self.last_sequence_number = -1  # highest sequence number accepted (committed or buffered)
        self.committed_high_water_mark: int | None = None  # from the commit log, at the fence
        self.cut_through = -1  # the last sequence number cut into a batch (at the fence: the high-water mark)
        self.events: list[Event] = []
        self.nbytes = 0

    def __repr__(self) -> str:
        return (f"Claim(partition_id={self.partition_id!r}, epoch={self.context.epoch}, "
                f"state={self.state.value})")

    @property
    def accepting(self) -> bool:
        return self.state is ClaimState.ACTIVE


@dataclass
class Limits:
    max_events: int
    max_bytes: int
    max_interval: float


class Buffers:
    """The buffered events of every claim, the batch triggers and back-pressure. Lives
    on one event loop."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.claims: dict[str, Claim] = {}
        self.events = 0
        self.bytes = 0
        self.first_at = 0.0
        self._rotation = 0
        self.added = asyncio.Event()
        self.space = asyncio.Event()

    @property
    def full(self) -> bool:
        return self.events >= self.limits.max_events or self.bytes >= self.limits.max_bytes

    def register(self, claim: Claim) -> None:
        previous = self.claims.get(claim.partition_id)
        if previous is not None and previous is not claim:
            self.drop(previous)
        self.claims[claim.partition_id] = claim

    def add(self, claim: Claim, events: list[Event]) -> None:
        if not self.events:
            self.first_at = asyncio.get_running_loop().time()
        nbytes = sum(len(e.body) for e in events)
        claim.events.extend(events)
        claim.nbytes += nbytes
        self.events += len(events)
        self.bytes += nbytes
        self.added.set()

    async def wait_for_space(self, claim: Claim) -> None:
        """Back-pressure: one batch buffered while the one before is being written."""
        while self.full and claim.accepting:
            self.space.clear()
            await self.space.wait()

    def drop(self, claim: Claim) -> int:
        """Forget a claim's buffered events (they are re-read by the partition's next
        claim: nothing was checkpointed past them). Returns how many."""
        dropped = len(claim.events)
        self.events -= dropped
        self.bytes -= claim.nbytes
        claim.events, claim.nbytes = [], 0
        if self.claims.get(claim.partition_id) is claim:
            del self.claims[claim.partition_id]
        self.space.set()
        return dropped

    def seconds_until_due(self) -> float | None:
        """0 when a batch should be cut now, else how long until ``max_interval`` cuts
        one (``None``: nothing buffered)."""
        if self.full:
            return 0.0
        if not self.events:
            return None
        left = self.first_at + self.limits.max_interval - asyncio.get_running_loop().time()
        # Due within a microsecond is due: a wait of a rounding error would end at the same
        # instant (on virtual time, for ever), not later.
        return left if left > 1e-6 else 0.0

    def cut(self) -> tuple[dict[Claim, list[Event]], dict[Claim, int], int]:
        """Take a batch off the buffers (see the module docstring): each claim's events,
        the sequence number each claim's events continue (its previous cut's last, or
        the high-water mark of its fence), and their bytes."""
        limits = self.limits
        claims = [c for c in self.claims.values() if c.events]
        if claims:
            start = self._rotation % len(claims)
            claims = claims[start:] + claims[:start]
            self._rotation += 1
        take = {c: min(len(c.events), max(1, limits.max_events // max(1, len(claims)))) for c in claims}
        room = limits.max_events - sum(take.values())
        for claim in claims:
            extra = max(0, min(len(claim.events) - take[claim], room))
            take[claim] += extra
            room -= extra
        cut: dict[Claim, list[Event]] = {}
        nbytes = 0
        if self.bytes <= limits.max_bytes:
            # Everything buffered fits the byte budget: no need to size each event.
            for claim in claims:
                n = take[claim]
                if n == len(claim.events):
                    cut[claim], claim.events = claim.events, []
                    nbytes += claim.nbytes
                    claim.nbytes = 0
                else:
                    cut[claim] = claim.events[:n]
                    del claim.events[:n]
                    size = sum(len(e.body) for e in cut[claim])
                    claim.nbytes -= size
                    nbytes += size
        else:
            for claim in claims:
                count = size = 0
                for event in claim.events[:take[claim]]:
                    length = len(event.body)
                    if nbytes + size + length > limits.max_bytes and (cut or count):
                        break
                    size += length
                    count += 1
                if count:
                    cut[claim] = claim.events[:count]
                    del claim.events[:count]
                    claim.nbytes -= size
                    nbytes += size
                if count < take[claim]:
                    break  # the byte budget is spent
        self.events -= sum(len(events) for events in cut.values())
        self.bytes -= nbytes
        if self.events:
            self.first_at = asyncio.get_running_loop().time()
        self.space.set()
        after = {}
        for claim, events in cut.items():
            after[claim], claim.cut_through = claim.cut_through, events[-1].sequence_number
        return cut, after, nbytes
