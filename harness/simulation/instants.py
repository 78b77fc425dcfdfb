"""Simulation time on a :class:`~eventprocessor.testing.VirtualTimeLoop`: the instants of
a run (:class:`Instants`, which sequence a store request after everything else of its
instant) and each instance's local clock (:class:`InstanceClock`, possibly skewed)."""
from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from eventprocessor.testing import VirtualTimeLoop

__all__ = ["CONSUMER_GROUP", "EPOCH", "EPOCH_SECONDS", "EVENTHUB", "InstanceClock", "Instants", "NAMESPACE"]

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
EPOCH_SECONDS = EPOCH.timestamp()
NAMESPACE = "memory.local"
EVENTHUB = "hub"
CONSUMER_GROUP = "$default"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Instants:
    """Simulation time on the running :class:`~eventprocessor.testing.VirtualTimeLoop`:
    seconds since the simulation started (:attr:`now`), timers, and work that runs only
    once everything else of the current instant has run (the loop's idle callback).

    That last part is what sequences an instant the way a network does: a store request
    sent at ``t`` executes at ``t`` after every coroutine that had something to do at
    ``t`` got to it, so the processors of a lockstep tick all list the same snapshot
    before any of them writes. :attr:`observers` are called at the same point, after that
    work (the simulation watches its balance there).
    """

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        if not isinstance(loop, VirtualTimeLoop):
            raise RuntimeError("a Simulation runs on eventprocessor.testing.VirtualTimeLoop: start it with "
                               "eventprocessor.testing.run_virtual(...)")
        self.loop: VirtualTimeLoop = loop
        self.origin = loop.time()
        self.observers: list[Callable[[], None]] = []
        self._last: list[Callable[[], None]] = []
        self._groups: dict[float, list[Any]] = {}
        loop.add_idle_callback(self._idle)

    @property
    def now(self) -> float:
        return self.loop.time() - self.origin

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_at(self.origin + when, callback)

    async def sleep_until(self, when: float) -> None:
        future = self.loop.create_future()
        handle = self.call_at(max(when, self.now), lambda: _resolve(future))
        try:
            await future
        finally:
            handle.cancel()

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self.now + max(0.0, seconds))

    async def last(self) -> None:
        """Return once everything else of the current instant has run."""
        future = self.loop.create_future()
        self._last.append(lambda: _resolve(future))
        await future

    async def write_group(self, when: float, items: Sequence[Any], execute: Callable[[Any], Awaitable[Any]],
                          rng: random.Random) -> list[Any]:
        """Apply ``execute`` to each item at ``when`` (once the rest of that instant ran),
        interleaved at random with the items of every other batch that lands at the same
        instant; return the results in item order. Every item is applied even if the
        caller stopped waiting (a store applies what its clients abandoned)."""
        future = self.loop.create_future()
        key = max(when, self.now)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []

            async def apply() -> None:
                batches = self._groups.pop(key)
                order = [(b, i) for b, (batch_items, *_rest) in enumerate(batches) for i in range(len(batch_items))]
                rng.shuffle(order)
                failed: dict[int, BaseException] = {}
                for b, i in order:
                    batch_items, batch_execute, _future, results = batches[b]
                    try:
                        results[i] = await batch_execute(batch_items[i])  # in-memory: never suspends
                    except Exception as error:  # reported to that batch's caller
                        failed.setdefault(b, error)
                for b, (_items, _execute, batch_future, results) in enumerate(batches):
                    if not batch_future.done():
                        if b in failed:
                            batch_future.set_exception(failed[b])
                        else:
                            batch_future.set_result(results)

            def start() -> None:
                self.loop.create_task(apply())

            self.call_at(key, lambda: self._last.append(start))
        group.append((list(items), execute, future, [None] * len(items)))
        return await future

    def _idle(self) -> None:
        due, self._last = self._last, []
        for callback in due:
            callback()
        for observe in list(self.observers):
            observe()

    def close(self) -> None:
        self.loop.remove_idle_callback(self._idle)


class InstanceClock:
    """The :class:`~eventprocessor._runtime.clock.Clock` of an instance whose local clock is
    ``skew`` seconds ahead: the loop's time plus the skew (``time()`` is the wall clock
    the official balancer reads)."""

    def __init__(self, instants: Instants, skew: float = 0.0) -> None:
        self._instants = instants
        self.skew = skew

    def monotonic(self) -> float:
        return self._instants.loop.time() + self.skew

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch as this instance's local clock reads them."""
        return EPOCH_SECONDS + self._instants.now + self.skew

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return f"InstanceClock(now={self._instants.now}, skew={self.skew})"
