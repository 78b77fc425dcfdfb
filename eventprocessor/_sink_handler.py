"""The per-claim handler a transactional sink (:class:`~eventprocessor.spark.SparkSink`,
:class:`~eventprocessor.postgres.PostgresSink`) hands the processor for each partition."""
from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from .events import Event
from .partition import PartitionContext, PartitionProcessor
from .policies import CloseReason

__all__ = ["SinkHandler"]

C = TypeVar("C")
C_contra = TypeVar("C_contra", contravariant=True)


class ClaimSink(Protocol[C_contra]):
    """What a sink does with one claim: open it, add its events, close it."""

    async def _open(self, claim: C_contra) -> None: ...

    async def _add(self, claim: C_contra, events: list[Event]) -> None: ...

    async def _close(self, claim: C_contra, reason: CloseReason) -> None: ...


class SinkHandler(PartitionProcessor, Generic[C]):
    """The per-claim handler of a sink whose events are safe only once a batch of them is
    committed (and then checkpointed by the sink).

    ``process_events`` only buffers, so the pump must not checkpoint "the last event whose
    ``process_events`` returned" when the claim ends (``checkpoint_on_release`` is False);
    ``close`` commits what is buffered on a stop or a handoff instead, while the claim
    still holds its lease. ``make_claim`` builds the sink's claim object from the context."""

    checkpoint_on_release = False

    def __init__(self, sink: ClaimSink[C], make_claim: Callable[[PartitionContext], C]) -> None:
        self._sink = sink
        self._make_claim = make_claim
        self._claim: C | None = None

    async def initialize(self, context: PartitionContext) -> None:
        self._claim = self._make_claim(context)
        await self._sink._open(self._claim)

    async def process_events(self, events: list[Event], context: PartitionContext) -> None:
        if self._claim is None:  # initialize was cancelled before it made the claim
            self._claim = self._make_claim(context)
            await self._sink._open(self._claim)
        await self._sink._add(self._claim, events)

    async def close(self, reason: CloseReason, context: PartitionContext) -> None:
        if self._claim is not None:
            await self._sink._close(self._claim, reason)
