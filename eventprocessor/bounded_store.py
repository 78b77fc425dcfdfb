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
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from .checkpoint_store import CheckpointStore
from .clock import Clock
from .errors import StoreTimeoutError
from .records import Checkpoint, Member, MemberListing, Ownership, OwnershipListing

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


class BoundedStore(CheckpointStore):
    """A :class:`CheckpointStore` whose every call ends within ``timeout`` seconds.

    Example::

        store = BoundedStore(BlobCheckpointStore.from_connection_string(...), timeout=8.0,
                             clock=SystemClock())
        listing = await store.list_ownership(namespace, hub, "$default")  # <= 8 s
    """

    def __init__(self, inner: CheckpointStore, *, timeout: float, clock: Clock) -> None:
        self.inner = inner
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

    async def _call(self, operation: str, call: Awaitable[_T]) -> _T:
        started = self._clock.monotonic()
        self.calls[operation] += 1
        error: Optional[BaseException] = None
        try:
            return await with_deadline(self._clock, self.timeout, call, lambda: StoreTimeoutError(
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
            elapsed = self._clock.monotonic() - started
            self.seconds[operation] = self.seconds.get(operation, 0.0) + elapsed
            for observe in self.observers:
                observe(operation, elapsed, error)

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str,
                             consumer_group: str) -> OwnershipListing:
        return await self._call("list_ownership", self.inner.list_ownership(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> List[Ownership]:
        return await self._call("claim_ownership", self.inner.claim_ownership(list(ownerships)))

    async def release_ownership(self, ownership: Ownership) -> bool:
        return await self._call("release_ownership", self.inner.release_ownership(ownership))

    async def fence_checkpoint(self, ownership: Ownership) -> Optional[Checkpoint]:
        return await self._call("fence_checkpoint", self.inner.fence_checkpoint(ownership))

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        await self._call("update_checkpoint", self.inner.update_checkpoint(checkpoint, owner_id=owner_id,
                                                                           epoch=epoch))

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str,
                               consumer_group: str) -> List[Checkpoint]:
        return await self._call("list_checkpoints", self.inner.list_checkpoints(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def list_members(self, fully_qualified_namespace: str, eventhub_name: str,
                           consumer_group: str) -> MemberListing:
        return await self._call("list_members", self.inner.list_members(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def list_ownership_and_members(self, fully_qualified_namespace: str, eventhub_name: str,
                                         consumer_group: str) -> Tuple[OwnershipListing, Optional[MemberListing]]:
        return await self._call("list_ownership", self.inner.list_ownership_and_members(
            fully_qualified_namespace, eventhub_name, consumer_group))

    async def write_member(self, member: Member) -> Member:
        return await self._call("write_member", self.inner.write_member(member))

    async def delete_member(self, member: Member) -> None:
        await self._call("delete_member", self.inner.delete_member(member))

    async def create_entry(self, *args: Any) -> bool:
        return await self._call("create_entry", self.inner.create_entry(*args))

    async def read_entry(self, *args: Any) -> Optional[bytes]:
        return await self._call("read_entry", self.inner.read_entry(*args))

    async def list_entries(self, *args: Any) -> List[str]:
        return await self._call("list_entries", self.inner.list_entries(*args))

    async def delete_entry(self, *args: Any) -> None:
        await self._call("delete_entry", self.inner.delete_entry(*args))

    async def close(self) -> None:
        await self.inner.close()
