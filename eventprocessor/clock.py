"""Time as the processor sees it, injectable so that simulations run the real code
under a virtual clock.

The processor only needs elapsed time (``monotonic``) and a way to wait (``sleep``).
Absolute time for expiry always comes from the checkpoint store, never from here.
"""
from __future__ import annotations

import asyncio
import time
from typing import Optional, Protocol, runtime_checkable

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
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def monotonic(self) -> float:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            # Read from synchronous code (a property, a test): the loop we last ran on.
            if self._loop is None or self._loop.is_closed():
                return time.monotonic()
        return self._loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"
