"""Many events in flight per partition, the pure half: which events are done, what the
exact checkpoint is, and which call runs next.

:class:`Progress` holds the events a partition received beyond its checkpoint, in order,
and which of them are done (an event is done when the call that got it returned, or
when the handler checkpointed it in that call). The checkpoint is the last event before
the first one not done; the events done after it are its
:class:`~eventprocessor.stores.records.DoneBeyond` record, so that a new owner skips
them. A claim that resumes from such a record marks those events done as they arrive,
without dispatching them.

:class:`CallQueue` picks the next call: under ``ordering="key"`` the waiting events of
one partition key, in order, never while a call of that key runs; of the keys that may
run, the one whose oldest waiting event is the oldest goes first. The oldest event not
done holds the checkpoint and everything ``max_pending`` counts beyond it: a key that
waited behind its own running call does not queue up again behind every key that came
after it, so the checkpoint moves on as soon as it can and the partition is not held at
``max_pending`` meanwhile. A hot key still gets one call at a time like any other, so it
cannot starve the rest. Under ``ordering="none"`` the next events in partition order,
spread over the free slots.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from heapq import heapify, heappop, heappush

from ..events import Event
from ..policies import Ordering
from ..stores.records import Checkpoint, DoneBeyond

__all__ = ["Progress", "CallQueue", "Position"]

Position = tuple[int, "str | None", DoneBeyond]
"""What a checkpoint says: (sequence number, offset, the events done beyond it)."""


class Progress:
    """The events held beyond the checkpoint and which are done (see the module docstring)."""

    def __init__(self, resumed: Checkpoint | None) -> None:
        self._base: tuple[int, str | None] | None = (
            (resumed.sequence_number, resumed.offset) if resumed is not None else None)
        self._resumed = resumed.done_beyond if resumed is not None else DoneBeyond()
        self._held: deque[Event] = deque()
        self._done: set[int] = set()
        self.skipped = 0
        """Events received that the resumed record said were done: never dispatched."""
        self.last_before: Event | None = None
        """The last event before the first one not done (received in this claim)."""
        self.version = 0
        """Grows with every :meth:`finish`: a checkpoint written at a version covers every
        event finished before it."""

    @property
    def held(self) -> int:
        """Events held beyond the checkpoint: in flight, waiting, or done after a slower one."""
        return len(self._held)

    @property
    def first_not_done(self) -> Event | None:
        """The oldest event not done (the checkpoint is the one before it)."""
        return self._held[0] if self._held else None

    def is_done(self, event: Event) -> bool:
        seq = event.sequence_number
        base = self._base
        return (base is not None and seq <= base[0]) or seq in self._done

    def receive(self, events: Iterable[Event]) -> list[Event]:
        """Hold ``events`` (received in order); return those to dispatch: all but the ones
        the resumed checkpoint recorded as done."""
        fresh: list[Event] = []
        resumed = self._resumed
        for event in events:
            if self.is_done(event):
                continue  # at or before the checkpoint: a receiver never returns these
            self._held.append(event)
            if resumed.ranges and event.sequence_number in resumed:
                self._done.add(event.sequence_number)
                self.skipped += 1
            else:
                fresh.append(event)
        self._advance()
        return fresh

    def finish(self, events: Iterable[Event]) -> int:
        """``events`` are done; returns the version that covers them."""
        self.version += 1
        base = self._base
        for event in events:
            if base is None or event.sequence_number > base[0]:
                self._done.add(event.sequence_number)
        self._advance()
        return self.version

    def _advance(self) -> None:
        held, done = self._held, self._done
        while held and held[0].sequence_number in done:
            event = held.popleft()
            done.discard(event.sequence_number)
            self._base = (event.sequence_number, event.offset)
            self.last_before = event
        if self._resumed.ranges and self._base is not None:
            self._resumed = self._resumed.after(self._base[0])

    def position(self) -> Position | None:
        """The exact checkpoint now, or None when nothing before the first event not done
        is known (a partition that has no checkpoint yet)."""
        base = self._base
        if base is None:
            return None
        ranges: list[tuple[int, int]] = []
        last = None
        for event in self._held:
            seq = event.sequence_number
            if seq in self._done:
                if ranges and last == seq - 1 and ranges[-1][1] == last:
                    ranges[-1] = (ranges[-1][0], seq)
                else:
                    ranges.append((seq, seq))
            last = seq
        if self._resumed.ranges:  # recorded by the previous claim, not received again yet
            received = self._held[-1].sequence_number if self._held else base[0]
            ranges.extend(self._resumed.after(received).ranges)
        return base[0], base[1], DoneBeyond(tuple(ranges))


class CallQueue:
    """The events waiting for a call, and which call runs next (see the module docstring)."""

    def __init__(self, ordering: Ordering, max_batch_size: int) -> None:
        self._by_key = ordering is Ordering.KEY
        self._max = max_batch_size
        self._waiting: dict[Hashable, deque[Event]] = {}
        # Keys with waiting events and no call running, by the sequence number of their
        # oldest waiting event (unique within the partition, so keys are never compared).
        self._turns: list[tuple[int, Hashable]] = []
        self._running: set[Hashable] = set()
        self.parked: dict[Hashable, int] = {}
        """Keys whose event failed every attempt under ``on_poison="park"``: their events
        wait, never dispatched, until the processor restarts (the count held)."""
        self.waiting = 0
        self._calls = 0

    def add(self, events: Iterable[Event]) -> None:
        for event in events:
            key: Hashable = event.partition_key if self._by_key else None
            queue = self._waiting.get(key)
            if queue is None:
                queue = self._waiting[key] = deque()
                if key not in self._running and key not in self.parked:
                    heappush(self._turns, (event.sequence_number, key))
            if key in self.parked:
                self.parked[key] += 1
            queue.append(event)
            self.waiting += 1

    def take(self, free: int) -> tuple[Hashable, list[Event]] | None:
        """The next call's key and events, or None when no key may run now."""
        if not self._turns:
            return None
        if not self._by_key:
            queue = self._waiting[None]
            size = max(1, min(self._max, -(-len(queue) // max(free, 1))))
            events = [queue.popleft() for _ in range(min(size, len(queue)))]
            self.waiting -= len(events)
            if not queue:
                del self._waiting[None]
                self._turns.clear()
            self._calls += 1
            return ("call", self._calls), events
        key = heappop(self._turns)[1]
        queue = self._waiting[key]
        events = [queue.popleft() for _ in range(min(self._max, len(queue)))]
        self.waiting -= len(events)
        if not queue:
            del self._waiting[key]
        self._running.add(key)
        return key, events

    def finished(self, key: Hashable) -> None:
        """The call of ``key`` ended: the key's next events may run."""
        if not self._by_key:
            return
        self._running.discard(key)
        queue = self._waiting.get(key)
        if queue is not None and key not in self.parked:
            heappush(self._turns, (queue[0].sequence_number, key))

    def park(self, key: Hashable) -> None:
        """``key`` failed past the poison policy: hold its events, run none of them."""
        self._running.discard(key)
        self.parked[key] = len(self._waiting.get(key, ()))
        turns = [turn for turn in self._turns if turn[1] != key]
        if len(turns) < len(self._turns):
            heapify(turns)
            self._turns = turns

    @property
    def keys_waiting(self) -> int:
        return len(self._turns)
