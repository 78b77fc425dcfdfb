"""How a pump runs user code: on the event loop, timed step by step, or off it in threads.

On the loop (the default), every synchronous step of a handler method (the code between
two ``await``\\ s) is timed on the processor's clock. A step longer than the threshold
held the whole event loop: no lease was renewed, no other partition was dispatched, no
tick ran. The pump reports it (which partition, which method, how long) so the processor
can say which leases it put at risk. This costs two clock reads per step.

In threads (``handler_executor="thread"`` or an executor of the user's), the handler's
methods run on worker threads, each with an event loop of its own, so blocking or
CPU-heavy handler code cannot hold the processor's loop. ``update_checkpoint`` called on
a worker's loop is carried out on the processor's loop (see
:meth:`~eventprocessor.partition.PartitionContext.update_checkpoint`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from ..policies import HandlerExecutor

__all__ = ["UserCode", "BLOCK_THRESHOLD"]

BLOCK_THRESHOLD = 1.0
"""Seconds a single step of user code may hold the event loop before it is reported."""

OnBlock = Callable[[str, float, float], None]  # (what, started, ended), on the processor's clock

_COROUTINE = types.CoroutineType
_NOTHING = object()


@types.coroutine
def _timed_steps(steps: Any, monotonic: Callable[[], float], threshold: float, on_block: OnBlock,
                 what: str, first: Any = _NOTHING) -> Generator[Any, Any, Any]:
    """Drives a coroutine (or an awaitable's ``__await__`` iterator) and times each of its
    synchronous steps; a step longer than ``threshold`` is reported to ``on_block``. A
    generator-based coroutine rather than an object with ``__await__``. ``first``: what
    the coroutine's first step (already run and timed by the caller) yielded."""
    value: Any = None
    error: BaseException | None = None
    if first is not _NOTHING:
        try:
            value = yield first
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as thrown:  # noqa: BLE001 - cancellation and the like: pass it in
            error = thrown
    while True:
        started = monotonic()
        try:
            yielded = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as stop:
            ended = monotonic()
            if ended - started > threshold:
                on_block(what, started, ended)
            return stop.value
        except BaseException:
            ended = monotonic()
            if ended - started > threshold:
                on_block(what, started, ended)
            raise
        ended = monotonic()
        if ended - started > threshold:
            on_block(what, started, ended)
        value = error = None
        try:
            value = yield yielded
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as thrown:  # cancellation and the like: pass it in
            error = thrown


_thread_state = threading.local()


def _run_in_this_thread(function: Callable[..., Any], args: tuple) -> Any:
    """Call ``function`` on a worker thread; an awaitable result runs to completion on
    the thread's own event loop (made once per thread and kept, so clients a handler
    keeps stay usable between calls)."""
    result = function(*args)
    if not inspect.isawaitable(result):
        return result
    loop = getattr(_thread_state, "loop", None)
    if loop is None or loop.is_closed():
        loop = _thread_state.loop = asyncio.new_event_loop()
    return loop.run_until_complete(_as_coroutine(result))


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _close_thread_loop() -> None:
    loop = getattr(_thread_state, "loop", None)
    if loop is not None and not loop.is_closed():
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    _thread_state.loop = None


class UserCode:
    """Runs the methods of one claim's handler, the way the processor was told to.

    ``executor``: None (on the event loop, timed), ``"thread"`` (a worker thread of this
    claim's own, ended with it) or an executor whose threads run the calls.
    """

    def __init__(self, *, monotonic: Callable[[], float], on_block: OnBlock, executor: HandlerExecutor = None,
                 threshold: float = BLOCK_THRESHOLD, name: str = "handler") -> None:
        self._monotonic = monotonic
        self._on_block = on_block
        self._threshold = threshold
        self._own_thread = executor == "thread"
        self._executor: concurrent.futures.Executor | None = None
        if self._own_thread:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        elif isinstance(executor, concurrent.futures.Executor):
            self._executor = executor

    @property
    def in_threads(self) -> bool:
        return self._executor is not None

    def use_clock(self, monotonic: Callable[[], float]) -> None:
        """Time steps with ``monotonic`` from now on (the pump passes the running loop's
        own ``time`` when its clock is the loop's: the cheapest read on the hot path)."""
        self._monotonic = monotonic

    async def call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        """Run ``function(*args)`` (sync or async) and return its result."""
        executor = self._executor
        if executor is not None:
            return await asyncio.get_running_loop().run_in_executor(executor, _run_in_this_thread, function, args)
        monotonic = self._monotonic
        started = monotonic()
        result = function(*args)
        if type(result) is _COROUTINE:  # the usual case, tested first: the hot path
            # Its first step runs here: a handler that finishes without suspending (most
            # batches of most handlers) costs two clock reads and no wrapper.
            try:
                yielded = result.send(None)
            except StopIteration as stop:
                ended = monotonic()
                if ended - started > self._threshold:
                    self._on_block(what, started, ended)
                return stop.value
            except BaseException:
                ended = monotonic()
                if ended - started > self._threshold:
                    self._on_block(what, started, ended)
                raise
            ended = monotonic()
            if ended - started > self._threshold:
                self._on_block(what, started, ended)
            return await _timed_steps(result, monotonic, self._threshold, self._on_block, what, yielded)
        if not inspect.isawaitable(result):
            ended = self._monotonic()
            if ended - started > self._threshold:
                self._on_block(what, started, ended)
            return result
        return await _timed_steps(result.__await__(), self._monotonic, self._threshold, self._on_block, what)

    def close(self) -> None:
        """End this claim's own worker thread (once its current call, if any, returns)."""
        if self._own_thread and self._executor is not None:
            executor, self._executor = self._executor, None
            executor.submit(_close_thread_loop)
            executor.shutdown(wait=False)
