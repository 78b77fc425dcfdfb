"""The sink's view of one partition claim: its token, its state, the position the database
says it has written, and the events buffered for its next transaction."""
from __future__ import annotations

import asyncio
import enum
import uuid
from collections import deque
from dataclasses import dataclass, field

from ..events import Event
from ..partition import PartitionContext
from .positions import AdvanceStatement, Key

__all__ = ["Claim", "ClaimState", "SinkStats"]


class ClaimState(enum.Enum):
    FENCING = "fencing"
    """Waiting for its fence in the positions table; events are not accepted yet."""
    ACTIVE = "active"
    """Fenced: its events are buffered and written."""
    PARKED = "parked"
    """Nothing more is written until the processor restarts (a write that failed every
    attempt, or a position the database cannot account for)."""
    ENDED = "ended"
    """Closed, or fenced out by a newer claim: nothing more is accepted."""


class Claim:
    """One partition claim as the sink sees it."""

    def __init__(self, context: PartitionContext) -> None:
        self.context = context
        self.partition_id = context.partition_id
        self.key: Key = (context.fully_qualified_namespace, context.eventhub_name, context.consumer_group,
                         context.partition_id)
        # Tells this claim apart from any other, even one of the same owner and epoch (a
        # processor whose lease ran out can adopt its own ownership record again).
        self.token = uuid.uuid4().hex
        self.state = ClaimState.FENCING
        self.position = -1
        """The last sequence number committed to the database (by any claim, as of the fence)."""
        self.accepted = -1
        """The highest sequence number accepted: committed or buffered."""
        self.store_position = context.last_checkpoint.sequence_number if context.last_checkpoint else -1
        """The checkpoint store's position, as far as this claim knows."""
        self.events: list[Event] = []
        self.first_at = 0.0
        self.pending = asyncio.Event()
        """Set while events are buffered."""
        self.full = asyncio.Event()
        """Set when a full transaction's worth is buffered: the flusher goes at once."""
        self.space = asyncio.Event()
        """Set when the flusher took a batch off (or the claim ended): the handler may add."""
        self.lock = asyncio.Lock()
        self.flusher: asyncio.Task | None = None
        self.last_committed: Event | None = None
        self.checkpointed_at = 0.0
        self.advance: AdvanceStatement | None = None
        """The claim's ``UPDATE ...; COMMIT`` (made at its fence)."""

    def __repr__(self) -> str:
        return f"Claim(partition_id={self.partition_id!r}, epoch={self.context.epoch}, state={self.state.value})"

    @property
    def active(self) -> bool:
        return self.state is ClaimState.ACTIVE

    def accept(self, events: list[Event], now: float) -> list[Event]:
        """Buffer the events after ``accepted`` (a redelivery or a receiver that started
        behind the database's position brings some again); returns the skipped ones."""
        if events and events[0].sequence_number > self.accepted:
            fresh, skipped = events, []
        else:
            fresh = [e for e in events if e.sequence_number > self.accepted]
            skipped = [e for e in events if e.sequence_number <= self.accepted]
        if fresh:
            if not self.events:
                self.first_at = now
                self.pending.set()
            self.events.extend(fresh)
            self.accepted = fresh[-1].sequence_number
        return skipped

    def committed(self, count: int, now: float) -> None:
        """The first ``count`` buffered events are committed."""
        self.last_committed = self.events[count - 1]
        self.position = self.last_committed.sequence_number
        del self.events[:count]
        if self.events:
            self.first_at = now
        else:
            self.pending.clear()

    def drop(self) -> int:
        """Forget the buffered events (the partition's next claim reads them again)."""
        dropped = len(self.events)
        self.events = []
        self.accepted = self.position
        self.pending.clear()
        self.space.set()
        return dropped


@dataclass
class SinkStats:
    """What a sink did, over every claim it served."""

    transactions_committed: int = 0
    events_committed: int = 0
    stale_rollbacks: int = 0
    """Transactions rolled back because a newer claim had fenced the partition."""
    serialization_retries: int = 0
    unknown_commits: int = 0
    """Commits whose answer was lost, resolved by asking the server."""
    last_error: BaseException | None = None
    parked: dict[str, BaseException] = field(default_factory=dict)
    commit_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))
