"""What happens when ``process_events`` raises: bounded, cheap redelivery, then poison handling.

1. A batch whose handler raises goes to ``process_error`` (and is logged with its
   traceback). Events the handler already checkpointed inside the batch are done.
2. After ``retry_backoff``, the rest of the batch is delivered again **one event at a
   time**, so the events before the failing one are delivered once more, no more, and the
   failing one is found without redelivering its neighbours.
3. An event that fails on its own is delivered again after an exponential backoff
   (``retry_backoff`` doubling up to ``max_retry_backoff``) until it has been delivered
   ``max_delivery_attempts`` times in all, counting the batch.
4. Then it is *poison*: ``process_error`` receives :class:`~eventprocessor.errors.
   PoisonEventsError` carrying it, the attempts and the last exception; then
   ``on_poison`` decides:

   * :attr:`PoisonPolicy.SKIP` (default): the ``dead_letter`` hook, if given, is awaited
     with the events; then the processor checkpoints the poison event, so it is never
     delivered again, and goes on with the next one;
   * :attr:`PoisonPolicy.PARK`: the partition stops being dispatched (the processor keeps
     its claim, so no other processor trips over the same event) until the processor is
     restarted; an ERROR says so.

   A ``dead_letter`` hook that raises parks the partition: events are never skipped
   without being handed somewhere.

The stall a failing batch costs is bounded: :meth:`RetryPolicy.stall_bound` per poison
event (7.5 s at the defaults: 0.5 + 1 + 2 + 4), plus the handler's own time. Nothing is
delivered to a claim that has ended: the caller's ``handle`` checks the claim before
every delivery and raises :class:`DeliveryStopped` once it has ended, which ends the
redelivery at once. Nothing is redelivered forever and nothing is skipped silently.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._runtime.clock import Clock
from ..errors import PoisonEventsError
from ..events import Event
from ..partition import already_logged
from ..policies import DeadLetter, PoisonPolicy, RetryPolicy

__all__ = ["Poison", "Outcome", "DeliveryStopped", "redeliver", "report_poison", "dead_letter"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Poison:
    """An event that failed every attempt, and how."""

    event: Event
    error: Exception
    attempts: int


@dataclass(frozen=True)
class Outcome:
    """How a redelivery ended: every event handled or skipped (no field set), the
    partition parked on a poison event, or the claim ended meanwhile (``abandoned``: the
    next owner resumes from the last checkpoint)."""

    parked: bool = False
    abandoned: bool = False


class DeliveryStopped(Exception):
    """Raised by a ``handle`` function instead of delivering: the claim has ended."""


Handle = Callable[[list[Event]], Awaitable[None]]
Report = Callable[[Exception, list[Event], int], Awaitable[None]]
OnPoison = Callable[[Poison], Awaitable[bool]]  # True: skipped, go on; False: park


async def redeliver(handle: Handle, events: Sequence[Event], *, policy: RetryPolicy, clock: Clock, report: Report,
                    on_poison: OnPoison) -> Outcome:
    """``events`` failed their first delivery (already reported): deliver them again one
    at a time under ``policy`` (see the module docstring). ``handle`` raises
    :class:`DeliveryStopped` when the claim has ended; ``on_poison`` decides what
    happens to an event that failed every attempt."""
    batch = list(events)
    if not batch:
        return Outcome()
    attempts = policy.max_delivery_attempts
    alone = max(1, attempts - 1)  # single attempts after the batch's (one at least, to find the failing event)
    if len(batch) > 1:
        logger.info("a batch of %d events (sequence numbers %d-%d) failed; delivering its events one at a time",
                    len(batch), batch[0].sequence_number, batch[-1].sequence_number)
    try:
        await clock.sleep(policy.delay(1))
        for event in batch:
            for attempt in range(2, alone + 2):
                try:
                    await handle([event])
                    break
                except DeliveryStopped:
                    raise
                except Exception as error:
                    await report(error, [event], attempt)
                    if attempt == alone + 1:
                        if not await on_poison(Poison(event, error, attempt)):
                            return Outcome(parked=True)
                        break
                    await clock.sleep(policy.delay(attempt))
    except DeliveryStopped:
        return Outcome(abandoned=True)
    return Outcome()


async def report_poison(ctx: Any, poison: Poison, on_poison: PoisonPolicy,
                        report: Callable[[Exception], Awaitable[None]], dead_letter: DeadLetter | None = None,
                        parks: str = "the partition parks") -> PoisonEventsError:
    """Log and report (to ``process_error``) an event of ``ctx``'s partition that failed
    every attempt, saying what the poison policy does with it and how to keep such events;
    return the error. ``parks``: what stops at the event under ``on_poison="park"``."""
    if on_poison is PoisonPolicy.PARK:
        fate = f"{parks} at it (on_poison=\"park\"): the event is kept, not skipped"
    elif dead_letter is not None:
        fate = "it goes to the dead_letter hook and is skipped (on_poison=\"skip\")"
    else:
        fate = ("it is dropped: skipped and checkpointed past (on_poison=\"skip\"). To keep such events, pass "
                "FailurePolicy(dead_letter=...) to hand them somewhere, or on_poison=\"park\" to stop at them")
    poisoned = PoisonEventsError(
        f"partition {ctx.partition_id} of {ctx.eventhub_name}/{ctx.consumer_group}: the handler failed on "
        f"the event at sequence number {poison.event.sequence_number} in all {poison.attempts} attempts "
        f"({poison.error!r}); {fate}",
        events=[poison.event], attempts=poison.attempts, partition_id=ctx.partition_id)
    poisoned.__cause__ = poison.error
    logger.error("%s", poisoned)
    already_logged(poisoned)
    await report(poisoned)
    return poisoned


async def dead_letter(ctx: Any, event: Event, error: PoisonEventsError, hook: DeadLetter | None,
                      report: Callable[[Exception], Awaitable[None]]) -> bool:
    """Hand a skipped poison ``event`` to the ``dead_letter`` hook, if one is set; False
    if the hook failed (the event must then not be skipped)."""
    if hook is not None:
        try:
            await hook([event], error, ctx)
        except Exception as hook_error:
            logger.error("partition %s: the dead_letter hook failed (%r); parking instead of skipping",
                         ctx.partition_id, hook_error)
            await report(hook_error)
            return False
    return True
