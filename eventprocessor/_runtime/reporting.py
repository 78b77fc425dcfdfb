"""Reporter: how a processor tells about failures without flooding and without waiting.

Errors reach the handlers' ``process_error`` (on each pump's own task) and the
processor's ``error_handler`` (a job of the processor's task scope), never on the
caller's task. A recurring failure (the store down, the source unreachable, user code
raising the same way) is logged the first time and then at most once per period, with
how many went by, and its end is said too. A store outage is told as one
(:class:`StoreOutage`): which call failed first and after how long, how long it has lasted
and how many calls failed, and when the store answers again; the parts that saw the
failures meanwhile log them at DEBUG only.
"""
from __future__ import annotations

import inspect
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from ..errors import (
    CheckpointStoreError,
    ClaimOwnershipError,
    EventProcessorError,
    EventSourceError,
    OwnershipLostError,
    StoreTimeoutError,
)
from ..partition import PartitionContext, already_logged
from .clock import Clock
from .options import ErrorHandler
from .tasks import TaskScope

__all__ = ["Throttle", "Reporter", "StoreOutage", "ErrorTarget", "Claimed", "Claims"]

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


def _is_outage(error: BaseException) -> bool:
    """A store call that failed for want of the store (an error, a timeout, a connection
    refused), not one the store answered (a conditional write lost, a bad checkpoint)."""
    if isinstance(error, CheckpointStoreError):
        return True
    return isinstance(error, Exception) and not isinstance(error, EventProcessorError)


class StoreOutage:
    """Tells a checkpoint-store outage as one: the first failed call (which, after how
    long, the error) at ERROR; then at most once per ``period`` how long it has lasted
    and how many calls failed, by call; and one line when a call succeeds again.

    It observes every store call (:attr:`BoundedStore.observers
    <eventprocessor._runtime.bounded_store.BoundedStore.observers>`). While it is
    :attr:`ongoing`, the parts that see the same failures log them at DEBUG, and the
    default ``process_error`` does not log them again."""

    def __init__(self, *, describe: str, store: str, clock: Clock, period: float) -> None:
        self._describe = describe
        self._store = store
        self._clock = clock
        self._period = period
        self.since: float | None = None
        """When the ongoing outage began (its first failed call), or None."""
        self.failed: Counter = Counter()
        """Calls failed in the ongoing outage, by operation."""
        self._said_at = -math.inf
        self._loud = False  # the ongoing outage was said at WARNING or above (its end is said too)

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def __call__(self, operation: str, seconds: float, error: BaseException | None) -> None:
        if error is None or not _is_outage(error):
            if error is None or isinstance(error, OwnershipLostError):
                self._answered()
            return
        self._mark_logged(error)
        now = self._clock.monotonic()
        self.failed[operation] += 1
        if self.since is None:
            self.since = now - seconds
            self._loud = now - self._said_at >= self._period
            if self._loud:
                self._said_at = now
                timed_out = isinstance(error, StoreTimeoutError)
                logger.error("processor %s: the checkpoint store %s is failing: %s %s %.1f s: %r. The processor "
                             "retries; it keeps its leases while renewals get through%s. Said again every %g s "
                             "while it lasts, and when the store answers again.", self._describe, self._store,
                             operation, "gave up after" if timed_out else "failed after", seconds, error,
                             "; balancing backs off so that a saturated store can drain (if this recurs under load, "
                             "raise load_balancing_interval: docs/concepts/timing.md, \"Sizing\")" if timed_out else "",
                             self._period)
            return
        if now - self._said_at >= self._period:
            self._said_at, self._loud = now, True
            calls = ", ".join(f"{name} {count}" for name, count in self.failed.most_common())
            logger.warning("processor %s: the checkpoint store %s still fails after %.0f s: %d calls failed (%s); "
                           "the last: %s after %.1f s: %r", self._describe, self._store, now - self.since,
                           sum(self.failed.values()), calls, operation, seconds, error)

    def _answered(self) -> None:
        if self.since is None:
            return
        lasted, failed = self._clock.monotonic() - self.since, sum(self.failed.values())
        self.since = None
        self.failed = Counter()
        (logger.warning if self._loud else logger.debug)(
            "processor %s: the checkpoint store %s answers again after %.0f s of failures (%d calls failed)",
            self._describe, self._store, lasted, failed)

    @staticmethod
    def _mark_logged(error: BaseException) -> None:
        already_logged(error)
        if isinstance(error, ClaimOwnershipError):
            for failure in error.failures.values():
                if isinstance(failure, BaseException):
                    already_logged(failure)


class SourceStart:
    """Until the source has answered once, its failures may be a setup that can never work
    (an unknown event hub or consumer group, a wrong host or port): :meth:`watch` ends the
    processor with the source's error after ``timeout`` seconds of that. A source that
    answered once is retried for as long as the processor runs (an outage recovers)."""

    def __init__(self, *, clock: Clock, timeout: float | None) -> None:
        self._clock = clock
        self.timeout = timeout
        self.ids_read = False
        self.received = False
        self.ids_failure: Exception | None = None
        self.receiver_failure: Exception | None = None

    def ids(self, error: Exception | None) -> None:
        """Reading the partition ids answered (None) or failed."""
        if error is None:
            self.ids_read = True
        elif not self.ids_read:
            self.ids_failure = error

    def receiver(self, error: Exception | None) -> None:
        """A receiver received (None) or failed. Only a hub that says the consumer group
        (or the hub) does not exist, or refuses the credential, counts as never working."""
        if error is None:
            self.received = True
        elif getattr(error, "reason", None) in ("not-found", "unauthorized"):
            self.receiver_failure = error

    async def watch(self, halt: Callable[[Exception], None], where: str) -> None:
        """After ``timeout``: halt with the source's error if it has never worked; else
        return (and never look again). A first call still under way is waited for."""
        if self.timeout is None:
            return
        await self._clock.sleep(self.timeout)
        while not self.ids_read and self.ids_failure is None:
            await self._clock.sleep(0.5)
        failure = self.ids_failure if not self.ids_read else None if self.received else self.receiver_failure
        if failure is None:
            return
        error = EventSourceError(
            f"{failure}. The event source {where} has not worked since the processor started "
            f"{self.timeout:g} s ago; the processor stops (source_startup_timeout=None keeps retrying)",
            fully_qualified_namespace=getattr(failure, "fully_qualified_namespace", ""),
            eventhub_name=getattr(failure, "eventhub_name", ""), reason=getattr(failure, "reason", ""))
        error.__cause__ = failure
        halt(error)


class Reporter:
    """Reports errors to handlers and to ``error_handler``, throttled per kind; tells a
    store outage as one (:attr:`outage`, which observes every store call)."""

    def __init__(self, *, describe: str, clock: Clock, period: float, error_handler: ErrorHandler | None,
                 table: Claims, scope: TaskScope, store: str = "", source_startup_timeout: float | None = None) -> None:
        self._describe = describe
        self._error_handler = error_handler
        self._table = table
        self._scope = scope
        self.throttle = Throttle(clock, period)
        self.outage = StoreOutage(describe=describe, store=store, clock=clock, period=period)
        self.source_start = SourceStart(clock=clock, timeout=source_startup_timeout)

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
        if kind == "source":
            self.source_start.ids(error)
        report, suppressed = self.throttle.failed(kind)
        what = "reading partition ids from the event source" if kind == "source" else "listing ownership"
        if report and kind == "store" and self.outage.ongoing:  # said by the outage, with its call and duration
            self.report(error, self.at_risk())
        elif report:
            logger.error("processor %s: %s failed%s: %r", self._describe, what,
                         f" ({suppressed} more times since the last report)" if suppressed else "", error)
            self.report(error, [] if kind == "source" else self.at_risk())
        else:
            logger.debug("processor %s: %s failed again: %r", self._describe, what, error)

    def tick_recovered(self, kind: str) -> None:
        if kind == "source":
            self.source_start.ids(None)
        failures = self.throttle.recovered(kind)
        if failures and kind != "store":  # the store's recovery is the outage's to say
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
