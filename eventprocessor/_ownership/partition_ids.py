"""PartitionIds: the partition ids a tick balances over, read from the source.

While a throttled hub asked to be left alone (server busy, with a retry-after), the ids
it last gave stand in for a new read; a failed read is reported to the tick (the
reporter says it once, then at a bounded rate) and returned as the error it raised.
"""
from __future__ import annotations

from .._runtime.clock import Clock
from .._runtime.reporting import Reporter
from ..errors import EventSourceError
from ..sources.base import EventSource

__all__ = ["PartitionIds"]


class PartitionIds:
    """Reads ``source``'s partition ids for each tick (see the module docstring)."""

    def __init__(self, source: EventSource, *, clock: Clock, reporter: Reporter) -> None:
        self._source = source
        self._clock = clock
        self._reporter = reporter
        self._last: list[str] | None = None  # the source's last answer
        self._busy_until = float("-inf")  # a throttled hub's retry-after, on the local clock

    async def read(self) -> list[str] | EventSourceError:
        """The source's partition ids (while a throttled hub asked to be left alone, the
        ones it last gave), or the error that reading them raised, reported."""
        source = self._source
        if self._clock.monotonic() < self._busy_until and self._last is not None:
            return self._last
        try:
            partition_ids = await source.get_partition_ids()
        except Exception as error:
            failure = error if isinstance(error, EventSourceError) else EventSourceError(
                f"reading the partition ids of {source.fully_qualified_namespace}/{source.eventhub_name} "
                f"failed: {error!r}", fully_qualified_namespace=source.fully_qualified_namespace,
                eventhub_name=source.eventhub_name)
            if failure.retry_after:
                self._busy_until = self._clock.monotonic() + failure.retry_after
            self._reporter.tick_failed("source", failure)
            return failure
        self._last = list(partition_ids)
        self._reporter.tick_recovered("source")
        return partition_ids
