"""What happens when ``process_events`` raises: bounded redelivery, then poison handling.

The policy (the one Spring Kafka's DefaultErrorHandler and Azure Functions' retry
policies converge on):

1. A batch whose handler raises goes to ``process_error`` and is delivered again, the
   same events from memory, after an exponential backoff (``retry_backoff`` doubling up
   to ``max_retry_backoff``), up to ``max_delivery_attempts`` times in all.
2. If it still fails, the batch is taken apart: its events are delivered one at a time,
   each with the same number of attempts, to find the first event that fails on its own.
   Events before it are processed normally; the rest of the batch is then delivered as a
   batch again.
3. That event is *poison*: ``process_error`` receives :class:`~eventprocessor.errors.
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

Nothing is redelivered forever and nothing is skipped silently.
"""
from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, List, Optional, Sequence

from .clock import Clock
from .events import Event

__all__ = ["PoisonPolicy", "RetryPolicy", "Poison", "Outcome", "deliver"]

logger = logging.getLogger(__name__)


class PoisonPolicy(str, enum.Enum):
    """What to do with an event that fails every delivery attempt."""

    SKIP = "skip"
    """Hand it to ``dead_letter`` (if set) and ``process_error``, checkpoint past it, go on."""
    PARK = "park"
    """Stop dispatching the partition (keeping it) until the processor restarts."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast a failing batch is delivered again."""

    max_delivery_attempts: int = 5
    retry_backoff: float = 0.5
    max_retry_backoff: float = 30.0

    def delay(self, failed_attempts: int) -> float:
        """The pause after ``failed_attempts`` failures (1, 2, ...)."""
        return min(self.retry_backoff * (2 ** (failed_attempts - 1)), self.max_retry_backoff)


@dataclass(frozen=True)
class Poison:
    """An event that failed every attempt on its own, and what it left behind."""

    event: Event
    error: Exception
    attempts: int
    rest: List[Event]  # the events of the batch after it, not delivered yet


@dataclass(frozen=True)
class Outcome:
    """How a delivery ended: every event handled (neither field set), a poison event
    found, or the claim ended while retrying (``abandoned``: the next owner resumes from
    the last checkpoint)."""

    poison: Optional[Poison] = None
    abandoned: bool = False


Handle = Callable[[List[Event]], Awaitable[None]]
Report = Callable[[Exception, List[Event], int], Awaitable[None]]


async def _attempts(handle: Handle, events: List[Event], policy: RetryPolicy, clock: Clock, report: Report,
                    may_continue: Callable[[], bool], first: int = 1) -> Optional[Exception]:
    """Deliver ``events`` up to ``max_delivery_attempts`` times (counting from attempt
    ``first``); None once one succeeds, else the last exception. Stops early (returning
    the last error) when ``may_continue()`` turns false (the claim ended)."""
    last: Optional[Exception] = None
    if first > policy.max_delivery_attempts:
        return RuntimeError("no delivery attempt left")
    for attempt in range(first, policy.max_delivery_attempts + 1):
        try:
            await handle(events)
            return None
        except Exception as error:
            last = error
            await report(error, events, attempt)
            if attempt == policy.max_delivery_attempts or not may_continue():
                break
            await clock.sleep(policy.delay(attempt))
            if not may_continue():
                break
    return last


async def deliver(handle: Handle, events: Sequence[Event], *, policy: RetryPolicy, clock: Clock, report: Report,
                  may_continue: Callable[[], bool], failed_once: bool = False) -> Outcome:
    """Deliver ``events`` (at least one) under ``policy``; see the module docstring.
    ``failed_once``: the caller already made (and reported) the first attempt."""
    batch = list(events)
    error = await _attempts(handle, batch, policy, clock, report, may_continue, first=2 if failed_once else 1)
    if error is None:
        return Outcome()
    if not may_continue():
        return Outcome(abandoned=True)
    if len(batch) == 1:
        return Outcome(Poison(batch[0], error, policy.max_delivery_attempts, []))
    logger.warning("a batch of %d events (sequence numbers %d-%d) failed %d times; delivering its events one at a "
                   "time to find the one that fails", len(batch), batch[0].sequence_number,
                   batch[-1].sequence_number, policy.max_delivery_attempts)
    for index, event in enumerate(batch):
        error = await _attempts(handle, [event], policy, clock, report, may_continue)
        if not may_continue():
            return Outcome(abandoned=True)
        if error is not None:
            return Outcome(Poison(event, error, policy.max_delivery_attempts, batch[index + 1:]))
    return Outcome()  # every event passed on its own: the failure was transient
