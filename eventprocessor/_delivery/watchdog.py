"""Watchdog: ends leases on time, watches handlers, and notices a blocked event loop.

* **Leases**: wakes at the next lease deadline (or when a pump ends) and reconciles the
  lease table with the clock, so a lease that could not be renewed stops dispatching
  exactly when it ends (self-fencing).
* **Handlers**: every quarter of ``handler_timeout``, a ``process_events`` call running
  longer than that is reported (a WARNING and ``HandlerTimeoutError`` to
  ``process_error``); the handler is not interrupted.
* **The event loop**: renewals, ticks and pumps share one loop. A handler step that held
  it (reported by the pump, which times every step of user code) or any other stall
  (a once-a-second lag probe) is reported once, naming the leases that ran out meanwhile
  and the renewals it delayed.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from .._ownership.lease import LeaseState
from .._ownership.lease_table import LeaseTable, sorted_ids
from .._runtime.clock import Clock, sleep_or_wake
from .._runtime.reporting import Reporter
from .._runtime.telemetry import Telemetry
from .._runtime.timing import Timing
from .pump import PartitionPump
from .usercode import BLOCK_THRESHOLD

__all__ = ["Watchdog", "STALL_PROBE_PERIOD"]

logger = logging.getLogger(__name__)

STALL_PROBE_PERIOD = 1.0
"""How often the processor measures its event loop's lag (seconds)."""


class Watchdog:
    """The processor's clock-driven checks (see the module docstring). ``pumps()`` lists
    the pumps of the claims in ``table`` (the dispatcher's)."""

    def __init__(self, *, table: LeaseTable, pumps: Callable[[], Iterable[PartitionPump]], clock: Clock,
                 timing: Timing, reporter: Reporter, telemetry: Telemetry, describe: str) -> None:
        self._table = table
        self._pumps = pumps
        self._clock = clock
        self._timing = timing
        self._reporter = reporter
        self._telemetry = telemetry
        self._describe = describe
        self._wake = asyncio.Event()
        self.last_stall: tuple[float, float] | None = None
        """The last stall of the event loop a handler caused (start, end), if any."""

    def wake(self) -> None:
        """A pump ended or a lease changed: reconcile now."""
        self._wake.set()

    async def run_leases(self) -> None:
        """Ends leases on time (wakes at the next deadline or when a pump ends) and
        watches handlers (every quarter of ``handler_timeout``)."""
        watch = self._timing.handler_timeout
        while True:
            self._wake.clear()
            self._table.reconcile()
            now = self._clock.monotonic()
            self._watch_handlers(now)
            deadlines = self._table.deadlines()
            if watch is not None and len(self._table):
                deadlines.append(now + watch / 4)
            pause = min(deadlines, default=now + self._timing.lease_length) - now
            await sleep_or_wake(self._clock, max(pause, 0.001), self._wake)

    def _watch_handlers(self, now: float) -> None:
        for pump in self._pumps():
            overdue = pump.overdue(now)
            if overdue is not None:
                logger.warning("processor %s: %s", self._describe, overdue)
                pump.report_error(overdue)

    async def run_stall_probe(self) -> None:
        """Measures the event loop's lag once a second: a stall not caused by one of this
        processor's handlers (other code on the loop) is reported the same way."""
        period = STALL_PROBE_PERIOD
        while True:
            before = self._clock.monotonic()
            await self._clock.sleep(period)
            after = self._clock.monotonic()
            lag = after - before - period
            if lag <= BLOCK_THRESHOLD:
                continue
            last = self.last_stall
            if last is not None and last[1] > before:
                continue  # a handler's stall, already reported
            self._stalled(f"the event loop was blocked for {lag:.1f} s by code that is not one of its handlers' "
                          "steps (another task on this loop, or synchronous work elsewhere)", after - lag, after,
                          "stall:loop")

    def loop_blocked(self, pump: PartitionPump, what: str, started: float, ended: float) -> None:
        """A pump's user code held the event loop (one step without an ``await``)."""
        self.last_stall = (started, ended)
        ctx = pump.context
        self._stalled(f"partition {ctx.partition_id}'s handler {what} blocked the event loop for "
                      f"{ended - started:.1f} s without awaiting", started, ended, f"stall:{ctx.partition_id}:{what}")

    def leases_hit(self, started: float, ended: float) -> tuple[list[str], list[str]]:
        """The leases a stall from ``started`` to ``ended`` hurt: those that ran out
        meanwhile (self-fenced: their partitions move, their batches are not retried),
        and those whose renewal came due meanwhile and was delayed."""
        live = self._table.in_state(LeaseState.OWNED, LeaseState.HANDING_OFF)
        ran_out = sorted_ids(lease.partition_id for lease in live if started < lease.deadline <= ended)
        delayed = sorted_ids(lease.partition_id for lease in live if lease.deadline > ended and lease.renew_at < ended)
        return ran_out, delayed

    def _stalled(self, what: str, started: float, ended: float, kind: str) -> None:
        ran_out, delayed = self.leases_hit(started, ended)
        self._telemetry.loop_blocked(ended - started)
        report, suppressed = self._reporter.throttle.failed(kind)
        if not report:
            logger.debug("processor %s: %s (again)", self._describe, what)
            return
        harm = []
        if ran_out:
            harm.append(f"the leases of partitions {ran_out} ran out meanwhile (self-fenced: their partitions move "
                        "to other processors and their handlers' checkpoints fail)")
        if delayed:
            harm.append(f"the renewals of partitions {delayed} were delayed (at risk if it happens again)")
        logger.warning(
            "processor %s: %s%s. Meanwhile no lease was renewed, no balancing tick ran and no other partition was "
            "dispatched: %s. Run blocking or CPU-heavy handlers off the event loop with EventProcessor(..., "
            "handler_executor=\"thread\") (docs/concepts/timing.md, \"A blocked event loop\").", self._describe, what,
            f" ({suppressed} more times since the last report)" if suppressed else "",
            "; ".join(harm) if harm else "no lease was at risk yet")
