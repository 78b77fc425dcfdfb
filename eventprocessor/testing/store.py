"""FaultyStore: switchable faults in front of any checkpoint store."""
from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import CheckpointStoreError
from ..stores.contract import CheckpointStore, StoreWrapper

__all__ = ["FaultyStore"]

_T = TypeVar("_T")

_WRITES = {"claim_ownership", "update_checkpoint", "fence_checkpoint", "write_member", "release_ownership",
           "announce_change"}


class FaultyStore(StoreWrapper):
    """A store with switchable faults. Every switch can be flipped while processors run.

    * ``latency``: seconds added before every call (uniform in [0, latency] with
      ``jitter``, else exactly ``latency``);
    * ``hang``: calls never answer (a black-holed endpoint);
    * ``down``: calls fail at once with ``CheckpointStoreError`` (an outage);
    * ``error_rate``: probability that a call fails before reaching the store;
    * ``lost_answer_rate``: probability that a write reaches the store and is applied,
      but its answer is lost (the caller gets an error);
    * ``answer_delay``: seconds a write's answer takes once the store applied it (a
      caller that gives up or is cancelled meanwhile has written all the same);
    * ``service``: seconds of the store's one worker per record, by operation (a
      listing costs its records, a claim its claims, anything else one unit). Calls
      queue for that worker, first come first served, and a caller that gives up
      leaves its work in the queue: the write is applied when its turn comes, as a
      single-threaded emulator (Azurite) does with requests their clients abandoned.
      ``busy_seconds`` counts the worker's time, ``backlog()`` what is queued;
    * ``only``: if set, faults apply only to these operations.
    """

    def __init__(self, inner: CheckpointStore, *, rng: random.Random | None = None) -> None:
        super().__init__(inner)
        self.rng = rng or random.Random(0)
        self.latency = 0.0
        self.jitter = False
        self.hang = False
        self.down = False
        self.error_rate = 0.0
        self.lost_answer_rate = 0.0
        self.answer_delay = 0.0
        self.service: dict[str, float] = {}
        self.only: set | None = None
        self.calls: Counter = Counter()
        self.injected: Counter = Counter()
        self.busy_seconds = 0.0
        self._free_at = -math.inf
        self._records_listed = 1

    def clear(self) -> None:
        self.latency, self.hang, self.down, self.error_rate, self.lost_answer_rate = 0.0, False, False, 0.0, 0.0
        self.answer_delay = 0.0
        self.service = {}
        self.only = None

    def backlog(self) -> float:
        """Seconds of work queued for the store's one worker (``service``)."""
        return max(0.0, self._free_at - asyncio.get_running_loop().time())

    async def _queued(self, operation: str, units: int, call: Callable[[], Awaitable[_T]]) -> _T:
        """Wait for the worker, then run ``call``; a cancelled caller's work still runs."""
        loop = asyncio.get_running_loop()
        cost = self.service.get(operation, 0.0) * max(units, 1)
        self._free_at = max(self._free_at, loop.time()) + cost
        self.busy_seconds += cost
        done_at = self._free_at

        async def serve() -> _T:
            await asyncio.sleep(done_at - loop.time())
            return await call()

        work = asyncio.ensure_future(serve())
        # Read the outcome even when nobody waits for it any more (no "never retrieved" noise).
        work.add_done_callback(lambda task: task.cancelled() or task.exception())
        return await asyncio.shield(work)

    def __getattr__(self, name: str) -> Any:  # request_counts, now(), ... of the inner store
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def forward(self, operation: str, call: Callable[[], Awaitable[_T]], units: int = 1) -> _T:
        listing = operation == "list_ownership"
        if listing:
            units = self._records_listed  # a listing costs the records it returns: the last one's count
        self.calls[operation] += 1
        applies = self.only is None or operation in self.only
        if applies and self.latency:
            await asyncio.sleep(self.rng.uniform(0, self.latency) if self.jitter else self.latency)
        if applies and self.hang:
            self.injected["hang"] += 1
            await asyncio.Event().wait()
        if applies and (self.down or (self.error_rate and self.rng.random() < self.error_rate)):
            self.injected["error"] += 1
            raise CheckpointStoreError(f"{operation}: injected store failure")
        if applies and self.service.get(operation):
            result = await self._queued(operation, units, call)
        else:
            result = await call()
        if applies and operation in _WRITES and self.answer_delay:
            await asyncio.sleep(self.answer_delay)
        if applies and operation in _WRITES and self.lost_answer_rate and self.rng.random() < self.lost_answer_rate:
            self.injected["lost_answer"] += 1
            raise CheckpointStoreError(f"{operation}: injected lost answer (the write was applied)")
        if listing:
            ownership = result[0] if isinstance(result, tuple) else result
            self._records_listed = len(ownership.ownerships)  # type: ignore[union-attr]
        return result
