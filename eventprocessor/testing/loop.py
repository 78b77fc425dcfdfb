"""Run asyncio code on virtual time: for tests of anything about timing.

:class:`VirtualTimeLoop` is an ordinary selector event loop whose clock only moves when
nothing is ready to run: then it jumps straight to the next timer. ``asyncio.sleep``,
``asyncio.wait_for``, ``loop.call_later`` and the processor's default clock all follow
it, so a test of a 60-second lease runs in milliseconds, and the same code path runs as
in production (no clock is patched, nothing is mocked).

Real I/O still works (the loop polls its selector before jumping), but time does not
wait for it: keep sockets, subprocesses and threads out of virtual-time tests.

Example::

    from eventprocessor.testing import run_virtual

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - start

    assert run_virtual(main()) == 3600.0      # returns at once
"""
from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "run_virtual", "virtual_utc_clock", "VIRTUAL_EPOCH", "ManualClock"]

_T = TypeVar("_T")

VIRTUAL_EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
"""The wall-clock time that virtual time 0 stands for (see :func:`virtual_utc_clock`)."""


class _VirtualSelector:
    """Wraps the loop's selector: polls for real I/O without blocking, and when there is
    none, moves the loop's virtual clock forward by the time the loop meant to wait.

    The loop asks with ``timeout`` 0 (or within its clock resolution) while something is
    due now; a longer wait means everything of the current instant has run: the loop's
    idle callbacks run then, before the clock moves on."""

    def __init__(self, inner: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._inner = inner
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self._loop
        events = self._inner.select(0)
        if events or (timeout is not None and timeout <= loop._clock_resolution):
            loop._ran = True
            if not events and timeout:
                loop.advance(timeout)
            return events
        if loop._run_idle_callbacks():
            return []  # what they made runnable runs at this same instant
        if timeout is None:
            # Nothing scheduled and nothing ready: only another thread could wake the
            # loop (call_soon_threadsafe writes to the self-pipe). Wait for it for real.
            return self._inner.select(0.05)
        loop._jump(timeout)
        loop._ran = True  # the timers now due run next
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time. ``time()`` starts at ``start`` and moves only
    when the loop would otherwise sleep, jumping to the next scheduled callback.

    Example::

        loop = VirtualTimeLoop()
        loop.run_until_complete(asyncio.sleep(60))
        assert loop.time() == 60.0
        loop.close()
    """

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self._virtual_now = float(start)
        self._selector = _VirtualSelector(self._selector, self)  # type: ignore
        # Timers due within this much of "now" run now. Virtual time is exact: keep it tiny
        # so that a timer never runs before its time by more than float rounding.
        self._clock_resolution = 1e-9
        self._idle_callbacks: list[Callable[[], None]] = []
        self._ran = True  # something ran since the idle callbacks last did

    def time(self) -> float:
        return self._virtual_now

    def _jump(self, timeout: float) -> None:
        """Move to the next timer's own time (``now + timeout`` can miss it by a rounding
        error, and two timers meant for one instant would then run apart)."""
        target = self._virtual_now + timeout
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]  # BaseEventLoop's timer heap
        if scheduled:  # the loop dropped cancelled timers from the head before asking
            when = scheduled[0].when()
            if self._virtual_now < when <= target + self._clock_resolution:
                target = when
        self._virtual_now = target

    def add_idle_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time the loop has run everything due at the current
        virtual instant, just before its clock moves on: every coroutine is then waiting.
        It runs again at the same instant only if something ran since (what a callback
        makes runnable, such as a future it resolves, runs at the same instant).

        A simulation observes its state there, or runs work that must come after
        everything else of the instant (every processor of a lockstep tick lists before
        any of them writes). Example::

            seen = []
            loop.add_idle_callback(lambda: seen.append(loop.time()))
            loop.run_until_complete(asyncio.sleep(5))
            assert seen == [0.0]     # the instant at 0; at 5 the loop stopped first
        """
        self._idle_callbacks.append(callback)

    def remove_idle_callback(self, callback: Callable[[], None]) -> None:
        """Stop calling ``callback`` (added by :meth:`add_idle_callback`)."""
        self._idle_callbacks.remove(callback)

    def _run_idle_callbacks(self) -> bool:
        """Run the idle callbacks if anything ran since they last did; say whether they ran."""
        if not self._ran or not self._idle_callbacks:
            return False
        self._ran = False
        for callback in list(self._idle_callbacks):
            callback()
        return True

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the loop does this by itself when idle)."""
        if seconds < 0:
            raise ValueError("virtual time cannot go backwards")
        self._virtual_now += seconds


def run_virtual(main: Awaitable[_T], *, start: float = 0.0, debug: bool = False) -> _T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`, then close it.

    Tasks still pending at the end are cancelled and awaited, as ``asyncio.run`` does.
    """
    loop = VirtualTimeLoop(start)
    loop.set_debug(debug)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def virtual_utc_clock(epoch: datetime = VIRTUAL_EPOCH) -> Callable[[], datetime]:
    """A wall clock for stores and sources that follows the running loop's time:
    ``epoch`` plus ``loop.time()`` seconds. Pass it as ``InMemoryCheckpointStore(clock=...)``
    so that the store's notion of "now" moves with virtual time."""

    def now() -> datetime:
        return epoch + timedelta(seconds=asyncio.get_running_loop().time())

    return now


class ManualClock:
    """A clock that moves only when told to: a processor on it never sees its leases run
    out (a zombie that believes it still owns its partitions), for fencing tests.

    ``sleep`` yields to the event loop once and returns; callers advance time with
    :meth:`advance`. Example::

        clock = ManualClock()
        processor = EventProcessor(..., clock=clock)
        await processor.balance_once()
        clock.advance(10)
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now})"
