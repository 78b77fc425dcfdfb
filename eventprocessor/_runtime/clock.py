"""Time as the processor sees it: by default the event loop's (virtual under
:class:`~eventprocessor.testing.VirtualTimeLoop`), injectable (a frozen
:class:`~eventprocessor.testing.ManualClock` makes a processor that never sees its
leases end).

The processor only needs elapsed time (``monotonic``) and a way to wait (``sleep``).
Absolute time for expiry always comes from the checkpoint store, never from here.
"""
from __future__ import annotations

import asyncio
import time
from asyncio import _get_running_loop as _running_loop
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


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
