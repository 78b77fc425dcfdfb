"""Every checkpoint-store call the processor makes, with a deadline.

A store that accepts connections and never answers must not hold a renewal, a listing or
a checkpoint past the lease: :class:`BoundedStore` runs each call against the
processor's clock and gives up after ``timeout`` seconds with
:class:`~eventprocessor.errors.StoreTimeoutError` (the call is cancelled; whether the
request reached the store is unknown, which every caller treats as "not won"). It also
counts calls, failures, time-outs and latency per operation, for metrics and benchmarks.

A call that carries a payload (a log entry written or read: the chunks of a partition's
state) is given more time for its bytes: ``timeout + in_flight / min_bandwidth``, where
``in_flight`` is the payload of every such call this store has in flight when it starts,
its own included (they share one link). ``min_bandwidth`` is the slowest transfer the
store is assumed to sustain (:data:`MIN_BANDWIDTH`, 4 MiB/s). So the first commit of a
64 MB state, whose chunks queue behind each other on a store that serves one request at
a time (Azurite), is not cut at ``timeout``, while a store that never answers is still
detected within that bound: ``timeout`` for a call without payload; for a chunk call,
``timeout`` plus 0.23 s per 960-KB chunk in flight (a partition's state log keeps at
most 8 in flight: 1.9 s more when one partition commits or restores alone).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ..errors import ConfigurationError, StoreTimeoutError
from ..stores.contract import CALLER_DEADLINE, CheckpointStore, StoreWrapper
from ..stores.records import MAX_ENTRY_BYTES
from .clock import Clock, with_deadline

__all__ = ["BoundedStore", "BATCH", "MIN_BANDWIDTH"]

logger = logging.getLogger(__name__)

BATCH = 32
"""The most records one bounded call writes (claims, renewals), and the most checkpoint
fences a balancing tick keeps in flight (beside its next call of claims). A deadline then
covers a call's own requests and a few calls', not a queue of hundreds behind it: on a
busy client every one of those would run out, be counted as not written, and be sent
again."""

MIN_BANDWIDTH = 4 * 1024 * 1024
"""Bytes per second a store is assumed to move at least: a call carrying a payload gets
``timeout + bytes in flight / MIN_BANDWIDTH`` (see the module docstring)."""

_T = TypeVar("_T")

_PATIENT: contextvars.ContextVar[bool] = contextvars.ContextVar("eventprocessor_patient_store_call", default=False)


class BoundedStore(StoreWrapper):
    """A :class:`CheckpointStore` whose every call ends within ``timeout`` seconds: the
    one deadline of the call (the inner store applies none of its own meanwhile; see
    :data:`~eventprocessor.stores.contract.CALLER_DEADLINE`). Log entries, which carry
    up to :data:`~eventprocessor.stores.records.MAX_ENTRY_BYTES` each, get ``timeout`` plus the
    bytes in flight over ``min_bandwidth`` (module docstring).

    Example::

        store = BoundedStore(BlobCheckpointStore.from_connection_string(...), timeout=8.0,
                             clock=SystemClock())
        listing = await store.list_ownership(namespace, hub, "$default")  # <= 8 s
    """

    def __init__(self, inner: CheckpointStore, *, timeout: float, clock: Clock,
                 min_bandwidth: float = MIN_BANDWIDTH, patient_timeout: float | None = None,
                 timeouts_by_operation: dict[str, float] | None = None) -> None:
        super().__init__(inner)
        if min_bandwidth <= 0:
            raise ConfigurationError(f"min_bandwidth must be above 0 bytes/s, got {min_bandwidth!r}")
        self.timeout = timeout
        self.patient_timeout = max(timeout, patient_timeout if patient_timeout is not None else timeout)
        """The deadline of the calls made inside :meth:`patient` (a balancing tick's own)."""
        self.timeouts_by_operation = {op: max(timeout, s) for op, s in (timeouts_by_operation or {}).items()}
        """Operations whose deadline is longer than ``timeout`` (``write_member``: a heartbeat)."""
        self.min_bandwidth = min_bandwidth
        self.bytes_in_flight = 0
        """The payload of the entry calls now in flight (their deadlines grow with it)."""
        self._clock = clock
        self.calls: Counter = Counter()
        self.failures: Counter = Counter()
        self.timeouts: Counter = Counter()
        self.seconds: dict[str, float] = {}
        self.patient_seconds = 0.0
        """Seconds spent in the calls made inside :meth:`patient` (the balancing ticks'), summed."""
        self.observers: list[Callable[[str, float, BaseException | None], None]] = []
        """Called with (operation, seconds, error or None) after every call (a cancelled
        call with its ``CancelledError``: it was not answered)."""

    def __repr__(self) -> str:
        return f"BoundedStore({self.inner!r}, timeout={self.timeout})"

    @contextmanager
    def patient(self) -> Iterator[None]:
        """The calls started inside this block get ``patient_timeout`` instead of ``timeout``
        (the balancing tick's listings, claims and fences: see
        :attr:`~eventprocessor._runtime.timing.Timing.balancing_timeout`). Wrap the call
        itself, not code that starts tasks which outlive it (they would inherit it)."""
        token = _PATIENT.set(True)
        try:
            yield
        finally:
            _PATIENT.reset(token)

    def deadline(self, payload: int) -> float:
        """Seconds a call gets when ``payload`` bytes (its own and those of the calls
        already in flight) are on the way: ``timeout + payload / min_bandwidth``."""
        return self.timeout + payload / self.min_bandwidth

    async def create_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str, data: bytes) -> bool:
        return await self.forward("create_entry", lambda: self.inner.create_entry(
            fully_qualified_namespace, eventhub_name, consumer_group, log_name, entry_name, data),
            payload=len(data))

    async def read_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                         log_name: str, entry_name: str) -> bytes | None:
        # Its size is known only once read: an entry holds at most MAX_ENTRY_BYTES.
        return await self.forward("read_entry", lambda: self.inner.read_entry(
            fully_qualified_namespace, eventhub_name, consumer_group, log_name, entry_name),
            payload=MAX_ENTRY_BYTES)

    async def forward(self, operation: str, call: Callable[[], Awaitable[_T]], units: int = 1,
                      payload: int = 0) -> _T:
        """Run ``call`` within ``timeout`` seconds, more for a ``payload`` (bytes it
        carries): :meth:`deadline` of the bytes in flight once it is added."""
        started = self._clock.monotonic()
        self.calls[operation] += 1
        error: BaseException | None = None
        self.bytes_in_flight += payload
        carried = self.bytes_in_flight
        patient = _PATIENT.get()
        seconds = self.deadline(carried) if payload else self.patient_timeout if patient else \
            self.timeouts_by_operation.get(operation, self.timeout)
        token = CALLER_DEADLINE.set(True)  # copied into the task that runs the call
        try:
            return await with_deadline(self._clock, seconds, call(), lambda: StoreTimeoutError(
                f"{operation} on {type(self.inner).__name__} did not answer within {seconds:g} s"
                + (f" (store_timeout {self.timeout:g} s + {carried:,} bytes in flight at "
                   f"{self.min_bandwidth:,.0f} bytes/s)" if payload else "")))
        except StoreTimeoutError as exc:
            self.timeouts[operation] += 1
            error = exc
            raise
        except Exception as exc:
            self.failures[operation] += 1
            error = exc
            raise
        except asyncio.CancelledError as exc:  # not an answer: observers must not count it as one
            error = exc
            raise
        finally:
            self.bytes_in_flight -= payload
            CALLER_DEADLINE.reset(token)
            elapsed = self._clock.monotonic() - started
            self.seconds[operation] = self.seconds.get(operation, 0.0) + elapsed
            if patient:
                self.patient_seconds += elapsed
            for observe in self.observers:
                observe(operation, elapsed, error)
