"""The fallback receive path: azure-eventhub's public ``receive_batch``, used when the
installed azure-eventhub lacks the internals :mod:`.lean` drives (slower: the client
builds an ``EventData`` per event and runs a processor per call)."""
from __future__ import annotations

import asyncio
from typing import Any

from ...events import Event
from ..base import LastEnqueuedEventProperties
from .conversion import to_event, to_starting_position
from .receiver import PartitionReceiverBase

__all__ = ["_BatchReceiver"]


class _BatchReceiver(PartitionReceiverBase):
    """Fallback: one partition fed by the client's public ``receive_batch`` through a
    one-slot queue (so the client runs ahead by at most one batch plus its prefetch)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
        self._task: asyncio.Task | None = None

    def _start(self, max_batch_size: int, max_wait_time: float | None) -> None:
        starting_position, inclusive = to_starting_position(self._position)

        async def on_event_batch(context: Any, batch: list[Any]) -> None:
            if self._track:
                newest = getattr(context, "last_enqueued_event_properties", None) or {}
                if newest.get("sequence_number") is not None:
                    self._last_enqueued = LastEnqueuedEventProperties(
                        int(newest["sequence_number"]), str(newest.get("offset")), newest.get("enqueued_time"),
                        newest.get("retrieval_time"))
            await self._queue.put([to_event(e, self.partition_id) for e in batch])

        async def on_error(_context: Any, error: Exception) -> None:
            await self._queue.put(error)

        self._task = asyncio.create_task(self._client.receive_batch(
            on_event_batch, partition_id=self.partition_id, owner_level=self._owner_level,
            starting_position=starting_position, starting_position_inclusive=inclusive,
            max_batch_size=max_batch_size, max_wait_time=max_wait_time, prefetch=self._prefetch,
            on_error=on_error, track_last_enqueued_event_properties=self._track,
        ), name=f"eventhub-receive-{self.partition_id}")

    async def receive(self, max_batch_size: int, max_wait_time: float | None) -> list[Event]:
        if self._task is None:
            self._start(max_batch_size, max_wait_time)
        task = self._task
        assert task is not None
        getter = asyncio.ensure_future(self._queue.get())
        done, _pending = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            error = task.exception() if not task.cancelled() else None
            raise self._translate(error) if error else self._link.errors.error(
                "disconnected", f"receiving from partition {self.partition_id} stopped")
        item = getter.result()
        if isinstance(item, BaseException):
            raise self._translate(item)
        return item

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

