"""Every checkpoint-store call the processor makes, with a deadline.

A store that accepts connections and never answers must not hold a renewal, a listing or
a checkpoint past the lease: :class:`BoundedStore` runs each call against the
processor's clock and gives up after ``timeout`` seconds with
:class:`~eventprocessor.errors.StoreTimeoutError` (the call is cancelled; whether the
request reached the store is unknown, which every caller treats as "not won"). It also
counts calls, failures, time-outs and latency per operation, for metrics and benchmarks.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Awaitable, Callable, Dict, List, Optional, TypeVar

from .checkpoint_store import CALLER_DEADLINE, CheckpointStore, StoreWrapper
from .clock import Clock
from .errors import StoreTimeoutError

__all__ = ["BoundedStore", "with_deadline", "BATCH"]

logger = logging.getLogger(__name__)

BATCH = 32
"""The most records one bounded call writes (claims, renewals), and the most checkpoint
fences a balancing tick keeps in flight. A deadline then covers a call's own requests,
not a queue of hundreds behind it: on a busy client every one of those would run out,
be counted as not written, and be sent again."""

_T = TypeVar("_T")


async def with_deadline(clock: Clock, seconds: float, call: Awaitable[_T], on_timeout: Callable[[], Exception]) -> _T:
    """Await ``call``; if ``clock`` says ``seconds`` passed first, cancel it and raise
    ``on_timeout()``. Uses the injected clock (not ``asyncio.wait_for``), so it follows
    the simulator's virtual time too."""
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


class BoundedStore(StoreWrapper):
    """A :class:`CheckpointStore` whose every call ends within ``timeout`` seconds: the
    one deadline of the call (the inner store applies none of its own meanwhile; see
    :data:`~eventprocessor.checkpoint_store.CALLER_DEADLINE`).

    Example::

        store = BoundedStore(BlobCheckpointStore.from_connection_string(...), timeout=8.0,
                             clock=SystemClock())
        listing = await store.list_ownership(namespace, hub, "$default")  # <= 8 s
    """

    def __init__(self, inner: CheckpointStore, *, timeout: float, clock: Clock) -> None:
        super().__init__(inner)
        self.timeout = timeout
        self._clock = clock
        self.calls: Counter = Counter()
        self.failures: Counter = Counter()
        self.timeouts: Counter = Counter()
        self.seconds: Dict[str, float] = {}
        self.observers: List[Callable[[str, float, Optional[BaseException]], None]] = []
        """Called with (operation, seconds, error or None) after every call."""

    def __repr__(self) -> str:
        return f"BoundedStore({self.inner!r}, timeout={self.timeout})"

    async def _forward(self, operation: str, call: Callable[[], Awaitable[_T]], units: int = 1) -> _T:
        started = self._clock.monotonic()
        self.calls[operation] += 1
        error: Optional[BaseException] = None
        token = CALLER_DEADLINE.set(True)  # copied into the task that runs the call
        try:
            return await with_deadline(self._clock, self.timeout, call(), lambda: StoreTimeoutError(
                f"{operation} on {type(self.inner).__name__} did not answer within {self.timeout:g} s"))
        except StoreTimeoutError as exc:
            self.timeouts[operation] += 1
            error = exc
            raise
        except Exception as exc:
            self.failures[operation] += 1
            error = exc
            raise
        finally:
            CALLER_DEADLINE.reset(token)
            elapsed = self._clock.monotonic() - started
            self.seconds[operation] = self.seconds.get(operation, 0.0) + elapsed
            for observe in self.observers:
                observe(operation, elapsed, error)
