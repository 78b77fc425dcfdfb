"""PartitionPump: one task per owned partition, from receiver to handler.

It receives batches with the claim's owner level, awaits ``process_events``, and stops
dispatching as soon as the claim is no longer current (lost, self-fenced, or stopped).
A failing handler goes to ``process_error`` and the partition resumes from its last
checkpoint; the pump itself never dies from user code.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from .clock import Clock
from .errors import OwnershipLostError
from .events import EventPosition
from .partition import CloseReason, PartitionContext, PartitionProcessor
from .sources.base import EventSource, PartitionReceiver

__all__ = ["PartitionPump"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 5.0


class PartitionPump:
    """Moves events of one partition claim to one :class:`PartitionProcessor`."""

    def __init__(
        self,
        *,
        context: PartitionContext,
        processor: PartitionProcessor,
        source: EventSource,
        starting_position: EventPosition,
        max_batch_size: int,
        max_wait_time: Optional[float],
        prefetch: int,
        clock: Clock,
    ) -> None:
        self.context = context
        self.processor = processor
        self._source = source
        self._claim_start = starting_position
        self._max_batch_size = max_batch_size
        self._max_wait_time = max_wait_time
        self._prefetch = prefetch
        self._clock = clock
        self._stop_reason: Optional[CloseReason] = None
        self._dispatching = False
        self._receiver: Optional[PartitionReceiver] = None
        self.batches_dispatched = 0
        self.events_dispatched = 0
        self.task: Optional[asyncio.Task] = None

    def __repr__(self) -> str:
        return f"PartitionPump(partition_id={self.context.partition_id!r}, epoch={self.context.epoch})"

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    def start(self) -> asyncio.Task:
        self.task = asyncio.create_task(self._run(), name=f"pump-{self.context.partition_id}")
        return self.task

    def stop(self, reason: CloseReason) -> None:
        """Stop dispatching now. A batch already in the handler finishes; a pending
        receive is abandoned. ``close(reason)`` is then called once."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if self.task is not None and not self._dispatching and not self.task.done():
            self.task.cancel()

    def _resume_position(self) -> EventPosition:
        checkpoint = self.context.last_checkpoint
        if checkpoint is not None:
            return EventPosition.from_sequence_number(checkpoint.sequence_number)
        return self._claim_start

    async def _report(self, error: Exception) -> None:
        try:
            await self.processor.process_error(error, self.context)
        except Exception:  # user code must not kill the pump
            logger.exception("process_error raised for partition %s of %s/%s (owner %s)",
                             self.context.partition_id, self.context.eventhub_name,
                             self.context.consumer_group, self.context.owner_id)

    async def _close_receiver(self) -> None:
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            try:
                await receiver.close()
            except Exception:
                logger.debug("closing receiver of partition %s failed", self.context.partition_id, exc_info=True)

    async def _run(self) -> None:
        ctx = self.context
        reason = CloseReason.SHUTDOWN
        backoff = 0.1
        try:
            try:
                await self.processor.initialize(ctx)
            except Exception as error:
                await self._report(error)
            position = self._claim_start
            while True:
                if self._stop_reason is not None:
                    reason = self._stop_reason
                    break
                try:
                    if self._receiver is None:
                        if not ctx.is_owned:
                            reason = CloseReason.OWNERSHIP_LOST
                            break
                        self._receiver = await self._source.open_receiver(
                            ctx.partition_id, consumer_group=ctx.consumer_group, starting_position=position,
                            owner_level=ctx.epoch, prefetch=self._prefetch)
                    events = await self._receiver.receive(self._max_batch_size, self._max_wait_time)
                except OwnershipLostError as error:
                    ctx._ownership_lost()
                    logger.info("partition %s of %s/%s: receiver taken over (%s); owner %s stops",
                                ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error, ctx.owner_id)
                    await self._report(error)
                    reason = CloseReason.OWNERSHIP_LOST
                    break
                except Exception as error:
                    logger.warning("partition %s of %s/%s: receive failed: %r", ctx.partition_id,
                                   ctx.eventhub_name, ctx.consumer_group, error)
                    await self._report(error)
                    await self._close_receiver()
                    position = self._resume_position()
                    await self._clock.sleep(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                if not events and self._max_wait_time is None:
                    if not ctx.is_owned:
                        reason = CloseReason.OWNERSHIP_LOST
                        break
                    continue
                # The claim may have ended while we waited for events: never dispatch then.
                # (One ownership check per batch: it is on the hot path.)
                if self._stop_reason is not None:
                    continue
                if not ctx.is_owned:
                    reason = CloseReason.OWNERSHIP_LOST
                    break
                if events:
                    ctx.last_event = events[-1]
                self._dispatching = True
                try:
                    await self.processor.process_events(events, ctx)
                    self.batches_dispatched += 1
                    self.events_dispatched += len(events)
                    backoff = 0.1
                except Exception as error:
                    logger.warning("partition %s of %s/%s: handler failed, resuming from the last checkpoint: %r",
                                   ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error)
                    await self._report(error)
                    await self._close_receiver()
                    position = self._resume_position()
                    await self._clock.sleep(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                finally:
                    self._dispatching = False
        except asyncio.CancelledError:
            reason = self._stop_reason or CloseReason.SHUTDOWN
            if self._stop_reason is None:
                raise
        finally:
            await self._close_receiver()
            try:
                await self.processor.close(reason, ctx)
            except Exception:
                logger.exception("close raised for partition %s of %s/%s (owner %s)", ctx.partition_id,
                                 ctx.eventhub_name, ctx.consumer_group, ctx.owner_id)
