"""TaskScope: every task a processor starts is awaited or cancelled by it.

Structured concurrency in the manner of trio's nurseries and anyio's task groups, sized
for a long-running component: *loops* are named tasks that run until the scope stops
them (the taker, the renewer, the watchdog, the heartbeat); *jobs* are short tasks
spawned under a kind (``"release"``, ``"error-handler"``) that a caller can wait for by
kind. :meth:`close` cancels and awaits whatever is left. A loop that dies of an
exception is logged; nothing is left running behind the scope's back.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["TaskScope"]

logger = logging.getLogger(__name__)


class TaskScope:
    """Owns the tasks of one component.

    Example::

        scope = TaskScope("processor p1")
        scope.start_loop("renewer", renewer.run())
        scope.spawn("release", releaser.write(leases))
        await scope.wait_for("release")      # the release writes in flight
        await scope.close()                  # cancels and awaits everything else
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loops: dict[str, asyncio.Task] = {}
        self._jobs: dict[str, set[asyncio.Task]] = {}

    def __repr__(self) -> str:
        return f"TaskScope({self.name!r}, loops={sorted(self._loops)})"

    def start_loop(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Start the loop ``name`` (one per name)."""
        if name in self._loops and not self._loops[name].done():
            coro.close()
            raise RuntimeError(f"{self.name}: loop {name!r} is already running")
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.name}")
        task.add_done_callback(self._loop_ended)
        self._loops[name] = task
        return task

    def loop(self, name: str) -> asyncio.Task | None:
        return self._loops.get(name)

    def running(self, name: str) -> bool:
        task = self._loops.get(name)
        return task is not None and not task.done()

    def spawn(self, kind: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Start a short job of ``kind``; the scope keeps it until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=f"{kind}-{self.name}")
        jobs = self._jobs.setdefault(kind, set())
        jobs.add(task)
        task.add_done_callback(jobs.discard)
        return task

    async def wait_for(self, kind: str) -> None:
        """Wait for every job of ``kind`` in flight (their errors are theirs to log)."""
        jobs = [task for task in self._jobs.get(kind, ()) if not task.done() and task is not asyncio.current_task()]
        if jobs:
            await asyncio.gather(*jobs, return_exceptions=True)

    async def stop_loop(self, name: str) -> None:
        """Cancel the loop ``name`` and wait until it has ended."""
        task = self._loops.pop(name, None)
        if task is not None:
            await _cancel([task])

    async def close(self) -> None:
        """Cancel and await every loop and job still running (not the calling task)."""
        current = asyncio.current_task()
        tasks = [task for task in self._loops.values() if task is not current]
        tasks += [task for jobs in self._jobs.values() for task in jobs if task is not current]
        self._loops = {name: task for name, task in self._loops.items() if task is current}
        await _cancel(tasks)

    def _loop_ended(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.error("%s: %s ended with an error", self.name, task.get_name(), exc_info=error)


async def _cancel(tasks: list[asyncio.Task]) -> None:
    live = [task for task in tasks if not task.done()]
    for task in live:
        task.cancel()
    if tasks:
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for task, result in zip(tasks, results, strict=False):
            if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError) \
                    and task not in live:
                logger.debug("task %s had ended with %r", task.get_name(), result)
