"""How one claim receives: the receiving side of a :class:`~eventprocessor._delivery.pump.PartitionPump`.

The receiver is opened with the claim's epoch as its owner level, so a newer claim's
receiver disconnects it. A receiver that fails is reopened after a backoff right after
the last event received in this claim (or, before the first, where the claim started,
with ``latest`` resolved to a sequence number when the claim began), so a reconnect
neither loses nor replays events. A hub that refuses the position because it lost the
events (recreated, an emulator restarted empty) is said so once, and the claim resumes
from the beginning of what the hub holds. A claim whose checkpoint is past the
partition's newest event (an earlier run's checkpoints over a new hub or a fresh
in-memory source) is said so once, with the ways out, and its refusals are DEBUG.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from .._claim import Claim
from .._runtime.backoff import Backoff
from .._runtime.clock import Clock
from ..errors import EventSourceError, OwnershipLostError
from ..events import Event, EventPosition
from ..partition import PartitionContext, already_logged
from ..sources.base import EventSource, PartitionReceiver

__all__ = ["ClaimReceiver", "RECONNECT_BACKOFF"]

logger = logging.getLogger(__name__)

RECONNECT_BACKOFF = (0.1, 5.0)
"""A failed receiver is reopened after 0.1 s, doubling up to 5 s (reset by the next event)."""


class ClaimReceiver:
    """Receives the batches of one claim (see the module docstring).

    ``report(error)`` hands a receive failure to the handler's ``process_error``;
    ``on_received`` is told of each failure until a receive first answers, and of that.
    """

    def __init__(self, *, context: PartitionContext, claim: Claim, source: EventSource,
                 starting_position: EventPosition, max_batch_size: int, max_wait_time: float | None, prefetch: int,
                 track_last_enqueued: bool, clock: Clock, report: Callable[[Exception], Awaitable[None]],
                 on_received: Callable[[Exception | None], None] | None = None) -> None:
        self._context = context
        self._claim = claim
        self._source = source
        self._claim_start = starting_position
        self._max_batch_size = max_batch_size
        self._max_wait_time = max_wait_time
        self._prefetch = prefetch
        self._track_last_enqueued = track_last_enqueued
        self._clock = clock
        self._report = report
        self._on_received = on_received  # told of failures, and of the first receive that answers
        self._receiver: PartitionReceiver | None = None
        self._resolved = False
        self._ahead = False  # the claim starts past the partition's newest event (said once)
        self._failures = 0  # receive failures since the last events
        self._said_at = float("-inf")  # when a failure was last logged at WARNING
        self._retry = Backoff(RECONNECT_BACKOFF[0], cap=RECONNECT_BACKOFF[1])
        self.last_received: Event | None = None
        """The newest event received in this claim: a reopened receiver starts after it."""

    @property
    def open(self) -> bool:
        return self._receiver is not None

    async def next_batch(self, most: int | None = None) -> list[Event] | None:
        """The next batch to deliver (empty only with ``max_wait_time``), or None: nothing
        to deliver this turn (a failure, reported, and the receiver reopened after a
        pause). Raises ``OwnershipLostError`` when a newer claim took the receiver over.
        ``most``: receive at most this many (fewer than ``max_batch_size``)."""
        try:
            if self._receiver is None:
                if not self._resolved:
                    await self._resolve_latest()
                    self._resolved = True
                self._receiver = await self._source.open_receiver(
                    self._context.partition_id, consumer_group=self._context.consumer_group,
                    starting_position=self.resume_position(), owner_level=self._context.epoch,
                    prefetch=self._prefetch, **self._receiver_options())
            size = self._max_batch_size if most is None else max(1, min(most, self._max_batch_size))
            events = await self._receiver.receive(size, self._max_wait_time)
            told = self._on_received
            if told is not None:
                self._on_received = None
                told(None)
            if self._track_last_enqueued:
                self._claim.received(self._receiver.last_enqueued_event_properties)
        except OwnershipLostError:
            raise
        except Exception as error:
            await self._failed(error)
            return None
        if events:
            self.last_received = events[-1]
            self._retry.reset()
            self._failures = 0
        elif self._max_wait_time is None:
            return None
        return events

    async def _failed(self, error: Exception) -> None:
        ctx = self._context
        if self._on_received is not None:
            self._on_received(error)
        delay = self._retry.next()
        retry_after = getattr(error, "retry_after", None)
        if isinstance(retry_after, (int, float)) and retry_after > delay:
            delay = float(retry_after)  # the hub asked to be left alone this long (server busy)
        if getattr(error, "reason", None) == "refused":  # asked only then: no call on the happy path
            await (self._check_position(error) if self.last_received is not None else self._check_start())
        # One line per streak of failures, then one a minute with the count (the handler's
        # process_error still hears of each); a start past the newest event was said once
        # (_check_start): the hub refuses it until the partition gets there.
        self._failures += 1
        now = self._clock.monotonic()
        loud = now - self._said_at >= 60.0 and not (self._ahead and getattr(error, "reason", None) == "refused")
        if loud:
            self._said_at = now
        already_logged(error)
        (logger.warning if loud else logger.debug)(
            "partition %s of %s/%s: receive failed%s: %r; reopening after %g s at %s", ctx.partition_id,
            ctx.eventhub_name, ctx.consumer_group,
            f" ({self._failures} times in a row)" if self._failures > 1 else "", error, delay,
            self.resume_position())
        await self._report(error)
        await self.close()
        await self._clock.sleep(delay)

    def _receiver_options(self) -> dict:
        # Asked only when wanted, so that sources written before the option still work.
        return {"track_last_enqueued_event_properties": True} if self._track_last_enqueued else {}

    def resume_position(self) -> EventPosition:
        """Where a receiver reopened within this claim starts: right after the last event
        received, else where the claim started (never behind what was delivered)."""
        last = self.last_received
        if last is not None:
            return EventPosition.from_sequence_number(last.sequence_number)
        return self._claim_start

    async def _resolve_latest(self) -> None:
        """``latest`` means "events enqueued from now on": pin it to a sequence number
        when the claim begins, so that a receiver reopened before the first event (a
        detached link) starts at the same place instead of skipping what arrived
        meanwhile. A source that cannot say keeps ``latest`` (and says so once)."""
        if self._claim_start.kind != "latest":
            return
        try:
            properties = await self._source.get_partition_properties(self._context.partition_id)
        except NotImplementedError:
            logger.debug("partition %s: %r cannot report partition properties; starting at latest unpinned: events "
                         "that arrive while the receiver reconnects before its first event are not delivered",
                         self._context.partition_id, self._source)
            return
        self._claim_start = EventPosition.from_sequence_number(properties.last_enqueued_sequence_number)

    async def _check_start(self) -> None:
        """The hub refused where the claim starts: if that is after the partition's newest
        event (the checkpoint is from an earlier life of the hub, or from a run over another
        source), nothing is received until the partition gets there: say so once, with the
        ways out."""
        start, ctx = self._claim_start, self._context
        if self._ahead or start.kind != "sequence_number" or not isinstance(start.value, int):
            return
        try:
            newest = (await self._source.get_partition_properties(ctx.partition_id)).last_enqueued_sequence_number
        except Exception:  # a source that cannot say (or not now): nothing to compare with
            return
        if start.value - (1 if start.inclusive else 0) <= newest:
            return
        self._ahead = True
        logger.warning(
            "partition %s of %s/%s starts after sequence number %s (its checkpoint, or the position it was "
            "given), but the partition's newest "
            "event is %s: the checkpoints are from another hub or an earlier life of this one (a recreated hub, "
            "or a fresh in-memory source over a store that kept an earlier run's checkpoints), and nothing is "
            "delivered until the partition passes %s. To start over, use a new consumer group or checkpoint "
            "container, or pass override_checkpoints=True", ctx.partition_id, ctx.eventhub_name,
            ctx.consumer_group, start.value, "none yet" if newest < 0 else newest, start.value)

    async def close(self) -> None:
        """Close the receiver, if one is open (it is opened again by :meth:`next_batch`)."""
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            try:
                await receiver.close()
            except Exception:
                logger.debug("closing receiver of partition %s failed", self._context.partition_id, exc_info=True)

    async def _check_position(self, refusal: Exception) -> None:
        """The hub refused the position to resume from: if the partition now ends before
        the events this claim already received, the hub lost them (it was recreated, or
        an emulator restarted empty) and will never reach that position again. Say so and
        resume from the beginning of what it holds, rather than waiting forever for
        sequence numbers it already gave out."""
        last, ctx = self.last_received, self._context
        if last is None:
            return
        try:
            properties = await self._source.get_partition_properties(ctx.partition_id)
        except Exception:
            return
        if properties.last_enqueued_sequence_number >= last.sequence_number:
            return
        lost = EventSourceError(
            f"partition {ctx.partition_id} of {ctx.eventhub_name}: the hub's newest event is sequence number "
            f"{properties.last_enqueued_sequence_number}, below the {last.sequence_number} this claim already "
            f"received ({refusal}): the hub lost its events (recreated, or an emulator restarted empty). Resuming "
            "from the beginning of what it holds; events it lost cannot be delivered",
            fully_qualified_namespace=ctx.fully_qualified_namespace, eventhub_name=ctx.eventhub_name,
            reason="refused")
        logger.error("%s", lost)
        already_logged(lost)
        await self._report(lost)
        self.last_received = None
        self._claim_start = EventPosition.earliest()

