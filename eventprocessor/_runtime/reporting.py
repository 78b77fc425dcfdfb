"""Reporter: how a processor tells about failures without flooding and without waiting.

Errors reach the handlers' ``process_error`` (on each pump's own task) and the
processor's ``error_handler`` (a job of the processor's task scope), never on the
caller's task. A recurring failure (the store down, the source unreachable, user code
raising the same way) is logged the first time and then at most once per period, with
how many went by, and its end is said too.
"""
from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from ..partition import PartitionContext
from .clock import Clock
from .options import ErrorHandler
from .tasks import TaskScope

__all__ = ["Throttle", "Reporter", "ErrorTarget", "Claimed", "Claims"]

logger = logging.getLogger(__name__)


class ErrorTarget(Protocol):
    """Where a claim's errors go: its pump, which hands them to the handler's
    ``process_error`` on a task of its own."""

    @property
    def context(self) -> PartitionContext: ...

    def report_error(self, error: Exception) -> None: ...


class Claimed(Protocol):
    """A claim as the reporter sees it (a lease of the lease table)."""

    @property
    def pump(self) -> ErrorTarget | None: ...


class Claims(Protocol):
    """The claims whose handlers hear of failures (the lease table)."""

    def __iter__(self) -> Iterator[Claimed]: ...

    def owned_leases(self) -> Sequence[Claimed]: ...


class Throttle:
    """Reports a recurring failure loudly the first time and then at most once per
    ``period`` seconds, and says when it has recovered."""

    def __init__(self, clock: Clock, period: float) -> None:
        self._clock = clock
        self._period = period
        self._state: dict[str, tuple[float, int]] = {}  # kind -> (last report, failures since)

    def failed(self, kind: str) -> tuple[bool, int]:
        """Should this failure be reported? Returns (report, failures suppressed so far)."""
        now = self._clock.monotonic()
        last, count = self._state.get(kind, (-math.inf, 0))
        if now - last >= self._period:
            self._state[kind] = (now, 0)
            return True, count
        self._state[kind] = (last, count + 1)
        return False, count + 1

    def recovered(self, kind: str) -> int | None:
        """The failure stopped: returns how many went by, or None if none was pending."""
        state = self._state.pop(kind, None)
        return None if state is None else state[1] + 1


class Reporter:
    """Reports errors to handlers and to ``error_handler``, throttled per kind."""

    def __init__(self, *, describe: str, clock: Clock, period: float, error_handler: ErrorHandler | None,
                 table: Claims, scope: TaskScope) -> None:
        self._describe = describe
        self._error_handler = error_handler
        self._table = table
        self._scope = scope
        self.throttle = Throttle(clock, period)

    def report(self, error: Exception, leases: Iterable[Claimed], *, to_every_handler: bool = False) -> None:
        """Tell the handlers of ``leases`` (``process_error``) and ``error_handler``,
        each on a task of its own: the caller never waits for user code."""
        targets = list(self._table) if to_every_handler else list(leases)
        context: PartitionContext | None = None
        for lease in targets:
            if lease.pump is not None:
                lease.pump.report_error(error)
                context = lease.pump.context if len(targets) == 1 else None
        if self._error_handler is not None:
            self._scope.spawn("error-handler", self._call_error_handler(error, context))

    def at_risk(self) -> Sequence[Claimed]:
        return self._table.owned_leases()

    def user_code_failed(self, where: str, failure: Exception) -> None:
        """User code outside ``process_events`` raised: report it to ``error_handler``
        once per kind (then at a bounded rate), never as a traceback per call."""
        report, suppressed = self.throttle.failed(f"user:{where}:{type(failure).__name__}")
        if report:
            logger.warning("processor %s: %s raised %r%s", self._describe, where, failure,
                           f" ({suppressed} more times since the last report)" if suppressed else "")
            self.report(failure, [])
        else:
            logger.debug("processor %s: %s raised again: %r", self._describe, where, failure)

    def tick_failed(self, kind: str, error: Exception) -> None:
        """Reading the partition ids (``source``) or listing ownership (``store``) failed."""
        report, suppressed = self.throttle.failed(kind)
        what = "reading partition ids from the event source" if kind == "source" else "listing ownership"
        if report:
            logger.error("processor %s: %s failed%s: %r", self._describe, what,
                         f" ({suppressed} more times since the last report)" if suppressed else "", error)
            self.report(error, [] if kind == "source" else self.at_risk())
        else:
            logger.debug("processor %s: %s failed again: %r", self._describe, what, error)

    def tick_recovered(self, kind: str) -> None:
        failures = self.throttle.recovered(kind)
        if failures:
            logger.warning("processor %s: %s works again after %d failed attempts", self._describe,
                           "the event source" if kind == "source" else "the checkpoint store", failures)

    async def _call_error_handler(self, error: Exception, context: PartitionContext | None) -> None:
        assert self._error_handler is not None
        try:
            result = self._error_handler(error, context)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("processor %s: error_handler raised", self._describe)
