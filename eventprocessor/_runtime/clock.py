"""Time as the processor sees it, and every wait that follows it.

By default the event loop's time (virtual under
:class:`~eventprocessor.testing.VirtualTimeLoop`), injectable (a frozen
:class:`~eventprocessor.testing.ManualClock` makes a processor that never sees its
leases end). The processor only needs elapsed time (``monotonic``) and a way to wait
(``sleep``); absolute time for expiry always comes from the checkpoint store, never from
here. Every bounded wait of the processor is one of the functions below, on its clock (not
``asyncio.wait_for``), so a deadline follows the same time as the leases it protects:
:func:`with_deadline` (a call that must answer in time), :func:`sleep_or_wake` (a loop's
pause that an event cuts short) and :func:`wait_at_most` (waiting for tasks to end).
"""
from __future__ import annotations

import asyncio
import time
from asyncio import _get_running_loop as _running_loop
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["Clock", "SystemClock", "with_deadline", "sleep_or_wake", "wait_at_most"]

_T = TypeVar("_T")


@runtime_checkable
class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""


class SystemClock:
    """The event loop's clock: ``loop.time()`` and ``asyncio.sleep``.

    With the default loop that is ``time.monotonic``; under
    :class:`~eventprocessor.testing.VirtualTimeLoop` it is virtual time, so the processor's
    leases, ticks and timeouts all follow the loop.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def monotonic(self) -> float:
        loop = _running_loop()  # None outside a running loop (no exception raised and caught)
        if loop is None:
            # Read from synchronous code (a property, a test): the loop we last ran on.
            loop = self._loop
            if loop is None or loop.is_closed():
                return time.monotonic()
        elif loop is not self._loop:
            self._loop = loop
        return loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


async def with_deadline(clock: Clock, seconds: float, call: Awaitable[_T], on_timeout: Callable[[], Exception]) -> _T:
    """Await ``call``; if ``clock`` says ``seconds`` passed first, cancel it and raise
    ``on_timeout()``. Uses the processor's clock (not ``asyncio.wait_for``), so a deadline
    follows the same time as the leases it protects, whatever clock was injected."""
    work = asyncio.ensure_future(call)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work.cancel()
        raise
    finally:
        timer.cancel()
    if work.done():
        return work.result()
    work.cancel()
    raise on_timeout()


async def sleep_or_wake(clock: Clock, seconds: float, wake: asyncio.Event) -> None:
    """Sleep ``seconds`` on ``clock``, or less if ``wake`` is set meanwhile."""
    if seconds <= 0:
        return
    waiter = asyncio.ensure_future(wake.wait())
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        timer.cancel()


async def wait_at_most(clock: Clock, seconds: float, tasks: Iterable[asyncio.Future]) -> None:
    """Wait until every one of ``tasks`` has ended, or ``seconds`` on ``clock`` passed
    (whichever is first); the tasks are left running."""
    waiting = asyncio.ensure_future(asyncio.wait(tasks))
    timer = asyncio.ensure_future(clock.sleep(seconds))
    await asyncio.wait({waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
    timer.cancel()
    waiting.cancel()
