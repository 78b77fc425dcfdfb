"""Backoff: how every loop of this SDK waits before trying again.

:class:`Backoff` is the one exponential retry delay (a receiver reopened, a commit-log
write retried, a batch published again): ``initial`` doubling up to ``cap``, back to
``initial`` after a success. :class:`TickBackoff` is the balancing loop's, below.

TickBackoff: the balancing loop slows down while the checkpoint store times out.

A store call that times out is not free for the store: the request was sent, and a
saturated store (a single-threaded emulator, a throttled account) still works through
it after the client gave up. If every processor then lists and claims again at its
usual pace, the store never drains: every call keeps timing out, leases self-fence and
nothing is owned (a metastable overload; see docs/concepts/timing.md).

So the balancing loop backs off. Each tick that saw a store call of this processor time
out (its listing, its claims, its fences, or a renewal since the last tick) raises the
backoff level by one. A tick with no time-out and a listing under a quarter of the store
timeout lowers it by one, and the next tick comes at the usual interval; a slower
listing keeps the level (a store that is slow but keeps up, a
distant one, is not backed off from; one still draining is not rushed back to full
pace). The listing timed is the tick's first: the member listing where the tick makes
one (a few small records whatever the number of partitions, so its time is the store's
queue), else the ownership listing. At level ``k`` the next
tick waits ``interval·2^k`` (at most ``cap``, the expiration), jittered down to half of
it, so that processors that timed out together do not come back together. While the
level is above zero a tick claims at most one batch. Renewals are not backed off: they
keep the leases, and they are what a saturated store must still serve.

This module is pure: randomness is injected, and it reads no clock.
"""
from __future__ import annotations

import enum
import random
from typing import Any

from ..errors import StoreTimeoutError

__all__ = ["Backoff", "TickBackoff", "Congestion", "TimeoutLedger"]


class Backoff:
    """An exponential retry delay.

    Example::

        retry = Backoff(0.1, cap=5.0)
        while True:
            try:
                return await receive()
            except EventSourceError:
                await clock.sleep(retry.next())   # 0.1, 0.2, 0.4, ... 5.0, 5.0
    """

    __slots__ = ("initial", "cap", "current")

    def __init__(self, initial: float, *, cap: float) -> None:
        if initial <= 0 or cap < initial:
            raise ValueError(f"initial must be positive and cap at least initial, got {initial!r}, {cap!r}")
        self.initial = initial
        self.cap = cap
        self.current = initial

    def next(self) -> float:
        """The delay to wait now; the next one is twice as long, up to ``cap``."""
        delay = self.current
        self.current = min(delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        """A success: the next failure waits ``initial`` again."""
        self.current = self.initial


class Congestion(enum.Enum):
    """What one tick saw of the store."""

    CLEAR = "clear"  # no time-out, the listing under a quarter of the store timeout
    SLOW = "slow"  # no time-out, a listing slower than that (or none answered)
    SATURATED = "saturated"  # a call timed out

    @staticmethod
    def of(*, timed_out: bool, listing_seconds: float | None, store_timeout: float) -> Congestion:
        if timed_out:
            return Congestion.SATURATED
        if listing_seconds is None or listing_seconds > store_timeout / 4:
            return Congestion.SLOW
        return Congestion.CLEAR


class TickBackoff:
    """The pause before the next balancing tick, given whether store calls timed out.

    Example::

        backoff = TickBackoff(interval=10.0, cap=50.0, rng=random.Random(0))
        backoff.after_tick(Congestion.SATURATED)   # level 1: the next tick in 10-20 s
        backoff.after_tick(Congestion.SATURATED)   # level 2: in 20-40 s
        backoff.after_tick(Congestion.SLOW)        # still level 2
        backoff.after_tick(Congestion.CLEAR)       # level 1 again
    """

    def __init__(self, *, interval: float, cap: float, rng: random.Random) -> None:
        if interval <= 0 or cap < interval:
            raise ValueError(f"interval must be positive and cap at least the interval, got {interval!r}, {cap!r}")
        self.interval = interval
        self.cap = cap
        self._rng = rng
        self.level = 0
        self.max_level = 0
        while interval * 2 ** self.max_level < cap:
            self.max_level += 1

    @property
    def backing_off(self) -> bool:
        return self.level > 0

    def after_tick(self, seen: Congestion) -> float | None:
        """Record what a tick saw; return the pause before the next one while backing
        off, or None for the usual interval."""
        if seen is Congestion.SATURATED:
            self.level = min(self.level + 1, self.max_level)
        elif seen is Congestion.CLEAR:
            # The store kept up: the next tick at the usual interval. The level comes
            # down one step only, so a store that falls behind again is backed off from
            # at once, from where it was.
            self.level = max(self.level - 1, 0)
            return None
        return self.pause()

    def pause(self) -> float | None:
        """The pause at the current level (None at level 0)."""
        if not self.level:
            return None
        ceiling = min(self.cap, self.interval * 2 ** self.level)
        return ceiling * self._rng.uniform(0.5, 1.0)


class TimeoutLedger:
    """The store calls that timed out since the last tick, counted only when they were sent
    after the store last answered promptly: a call sent during an outage that times out
    once the store has recovered is no sign of congestion, and backing off for it would
    keep partitions unclaimed for no reason."""

    def __init__(self, clock: Any, store_timeout: float) -> None:
        self._clock = clock
        self._prompt = store_timeout / 4
        self._sent: list[float] = []
        self._answered_promptly_at = float("-inf")

    def observe(self, seconds: float, error: BaseException | None) -> None:
        """After every store call: how long it took and how it ended."""
        if isinstance(error, StoreTimeoutError):
            self._sent.append(self._clock.monotonic() - seconds)
        elif error is None and seconds < self._prompt:
            self._answered_promptly_at = self._clock.monotonic()

    def since_last_tick(self) -> int:
        """The calls that timed out since the last call of this, sent after the last prompt answer."""
        counted = sum(1 for sent in self._sent if sent >= self._answered_promptly_at)
        self._sent.clear()
        return counted
