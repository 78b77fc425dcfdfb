"""Metrics and traces on OpenTelemetry (the ``opentelemetry-api`` package, extra ``[otel]``).

Without ``opentelemetry-api`` installed every call here is a no-op costing one attribute
check. With it installed but no SDK configured, OpenTelemetry's own no-op instruments
are used. Configure an SDK ``MeterProvider`` / ``TracerProvider`` globally, or pass them
to :class:`~eventprocessor.EventProcessor` as ``meter_provider`` / ``tracer_provider``.

Names follow OpenTelemetry's semantic conventions for messaging where one fits, and the
Java Event Hubs SDK's where it already has one with the same meaning:

=======================================  =========  ==============================================
name                                     kind       meaning (attributes)
=======================================  =========  ==============================================
messaging.client.consumed.messages       counter    events handed to handlers (partition)
messaging.process.duration               histogram  s per ``process_events`` call (partition, error.type)
messaging.eventhubs.consumer.lag         histogram  s from enqueue to receipt, per event (partition)
                                                    (the Java SDK's name and meaning)
eventprocessor.batches.processed         counter    batches handed to handlers (partition)
eventprocessor.partition.lag             gauge      events enqueued but not yet delivered (partition)
eventprocessor.partitions.owned          gauge      partitions this processor dispatches
eventprocessor.ownership.changes         counter    claims won and ends of claims (reason: claimed,
                                                    expired, stolen, adopted, handed_off, released,
                                                    lost, self_fenced, store_lost)
eventprocessor.claims.lost               counter    claims that lost the race
eventprocessor.balancing.duration        histogram  s per load-balancing tick
eventprocessor.balancing.overruns        counter    ticks longer than the interval
eventprocessor.balancing.backoffs        counter    ticks delayed because store calls timed out
eventprocessor.loop.stalls               histogram  s the event loop was held by one step of code
                                                    (longer than 1 s: a blocking handler)
eventprocessor.store.duration            histogram  s per store call (operation, error.type)
eventprocessor.store.errors              counter    failed store calls (operation, error.type)
eventprocessor.checkpoint.duration       histogram  s per checkpoint write (error.type)
=======================================  =========  ==============================================

Every instrument also carries ``messaging.system="eventhubs"``,
``messaging.destination.name`` (the event hub), ``messaging.consumer.group.name`` and
``eventprocessor.owner_id``. One span per batch (``process <hub>``, kind CONSUMER) links
to the producers' trace contexts found in the events' ``traceparent`` or
``Diagnostic-Id`` properties.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from typing import Any

from .._version import __version__
from ..events import Event

__all__ = ["Telemetry"]

logger = logging.getLogger(__name__)

try:  # pragma: no branch - depends on the optional extra
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised by the packaging test without the extra
    _metrics = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

_TRACE_KEYS = ("traceparent", "Diagnostic-Id")


def _configured(instrument: Any) -> bool:
    """False while ``instrument`` is OpenTelemetry's proxy for a MeterProvider nobody has
    set yet (every call would be dropped), so that per-event work can be skipped."""
    return getattr(instrument, "_real_instrument", instrument) is not None


class Telemetry:
    """The processor's instruments. ``enabled`` is False when OpenTelemetry is missing.

    Example::

        from opentelemetry.sdk.metrics import MeterProvider
        processor = EventProcessor(source, store, Handler, meter_provider=MeterProvider(...))
    """

    def __init__(self, *, eventhub_name: str, consumer_group: str, owner_id: str, meter_provider: Any = None,
                 tracer_provider: Any = None) -> None:
        self.enabled = _metrics is not None
        self.base: dict[str, str] = {
            "messaging.system": "eventhubs",
            "messaging.destination.name": eventhub_name,
            "messaging.consumer.group.name": consumer_group,
            "eventprocessor.owner_id": owner_id,
        }
        self._gauges: list[Any] = []
        self._active = False
        self._look_again_at = float("-inf")
        if not self.enabled:
            return

        meter = (meter_provider or _metrics.get_meter_provider()).get_meter("eventprocessor", __version__)
        tracer_source = tracer_provider or _trace.get_tracer_provider()
        self._tracer = tracer_source.get_tracer("eventprocessor", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._hub = eventhub_name
        self.events = meter.create_counter("messaging.client.consumed.messages", unit="{message}",
                                           description="Events handed to process_events")
        self.process_duration = meter.create_histogram("messaging.process.duration", unit="s",
                                                       description="Duration of process_events calls")
        self.consumer_lag = meter.create_histogram(
            "messaging.eventhubs.consumer.lag", unit="s",
            description="Difference between local time when event was received and the time it was enqueued")
        self.batches = meter.create_counter("eventprocessor.batches.processed", unit="{batch}",
                                            description="Batches handed to process_events")
        self.ownership_changes = meter.create_counter("eventprocessor.ownership.changes", unit="{change}",
                                                      description="Claims won and claims ended, by reason")
        self.claims_lost = meter.create_counter("eventprocessor.claims.lost", unit="{claim}",
                                                description="Claims that lost the conditional write")
        self.tick_duration = meter.create_histogram("eventprocessor.balancing.duration", unit="s",
                                                    description="Duration of load-balancing ticks")
        self.overruns = meter.create_counter("eventprocessor.balancing.overruns", unit="{tick}",
                                             description="Load-balancing ticks longer than the interval")
        self.backoffs = meter.create_counter("eventprocessor.balancing.backoffs", unit="{tick}",
                                             description="Load-balancing ticks delayed because store calls timed "
                                                         "out (the store is saturated or unreachable)")
        self.loop_stalls = meter.create_histogram("eventprocessor.loop.stalls", unit="s",
                                                  description="Stalls of the event loop longer than 1 s (blocking "
                                                              "code in a handler or elsewhere on the loop)")
        self.store_duration = meter.create_histogram("eventprocessor.store.duration", unit="s",
                                                     description="Duration of checkpoint-store calls")
        self.store_errors = meter.create_counter("eventprocessor.store.errors", unit="{call}",
                                                 description="Checkpoint-store calls that failed or timed out")
        self.checkpoint_duration = meter.create_histogram("eventprocessor.checkpoint.duration", unit="s",
                                                          description="Duration of checkpoint writes")
        self._meter = meter

    @property
    def active(self) -> bool:
        """True once a MeterProvider or TracerProvider is really set: until then the
        pumps skip the per-batch instrumentation altogether. Asked before every batch, so
        it answers from what it last found: once set, a provider stays (OpenTelemetry does
        not unset one); while none is, it looks again at most once a second (a global
        provider set after the processor started is picked up within a second)."""
        if self._active:
            return True
        now = time.monotonic()
        if now < self._look_again_at:
            return False
        self._look_again_at = now + 1.0
        self._active = self.enabled and (_configured(self.events) or self._tracing())
        return self._active

    def observe(self, *, owned: Callable[[], int], lag: Callable[[], Mapping[str, int | None]]) -> None:
        """Register the gauges, read when a reader collects."""
        if not self.enabled:
            return
        from opentelemetry.metrics import Observation

        base = self.base

        def owned_callback(_options: Any) -> Iterator[Any]:
            yield Observation(owned(), base)

        def lag_callback(_options: Any) -> Iterator[Any]:
            for pid, behind in lag().items():
                if behind is not None:
                    yield Observation(behind, {**base, "messaging.destination.partition.id": pid})

        self._gauges = [
            self._meter.create_observable_gauge("eventprocessor.partitions.owned", [owned_callback],
                                                unit="{partition}", description="Partitions dispatched here"),
            self._meter.create_observable_gauge("eventprocessor.partition.lag", [lag_callback], unit="{message}",
                                                description="Events enqueued but not yet delivered"),
        ]

    def _attrs(self, partition_id: str | None = None, **extra: Any) -> dict[str, Any]:
        attrs: dict[str, Any] = dict(self.base)
        if partition_id is not None:
            attrs["messaging.destination.partition.id"] = partition_id
        attrs.update({k: v for k, v in extra.items() if v is not None})
        return attrs

    # ---- batches

    @contextmanager
    def batch(self, partition_id: str, events: list[Event]) -> Iterator[None]:
        """Around one ``process_events`` call: a span linked to the producers, the
        duration, the event and batch counters, and the per-event consumer lag."""
        if not self.enabled:
            yield
            return
        received = datetime.now(timezone.utc)
        attrs = self._attrs(partition_id)
        if _configured(self.consumer_lag):  # per-event work only when a MeterProvider is really set
            for event in events:
                enqueued = event.enqueued_time
                if enqueued is not None:
                    self.consumer_lag.record(max(0.0, (received - enqueued).total_seconds()), attrs)
        started = time.perf_counter()
        error_type: str | None = None
        span_context = self._span(events, attrs) if self._tracing() else nullcontext(None)
        with span_context as span:
            try:
                yield
            except BaseException as error:
                error_type = type(error).__qualname__
                if span is not None:
                    span.set_attribute("error.type", error_type)
                raise
            finally:
                self.process_duration.record(time.perf_counter() - started, self._attrs(partition_id,
                                                                                        **{"error.type": error_type}))
                if error_type is None:
                    self.events.add(len(events), attrs)
                    self.batches.add(1, attrs)

    def _tracing(self) -> bool:
        """False while the tracer is OpenTelemetry's no-op (no TracerProvider set)."""
        inner = getattr(self._tracer, "_tracer", self._tracer)
        return not isinstance(inner, _trace.NoOpTracer)

    def _span(self, events: list[Event], attrs: dict[str, Any]) -> Any:
        span_attrs = {**attrs, "messaging.operation.type": "process", "messaging.operation.name": "process",
                      "messaging.batch.message_count": len(events)}
        return self._tracer.start_as_current_span(f"process {self._hub}", kind=_trace.SpanKind.CONSUMER,
                                                  links=self._links(events), attributes=span_attrs)

    def _links(self, events: list[Event]) -> list[Any]:
        links = []
        for event in events:
            properties = event.properties or {}
            carrier = {}
            for key in _TRACE_KEYS:
                value = properties.get(key)
                if isinstance(value, bytes):
                    value = value.decode("ascii", "replace")
                if isinstance(value, str):
                    carrier["traceparent"] = value
                    break
            if not carrier:
                continue
            context = _trace.get_current_span(self._propagator.extract(carrier)).get_span_context()
            if context.is_valid:
                links.append(_trace.Link(context))
        return links

    # ---- ownership and balancing

    def ownership_changed(self, reason: str, partition_id: str, count: int = 1) -> None:
        if self.enabled and count:
            self.ownership_changes.add(count, self._attrs(partition_id, **{"eventprocessor.reason": reason}))

    def claims_lost_race(self, count: int) -> None:
        if self.enabled and count:
            self.claims_lost.add(count, self.base)

    def tick(self, duration: float, overran: bool) -> None:
        if not self.enabled:
            return
        self.tick_duration.record(duration, self.base)
        if overran:
            self.overruns.add(1, self.base)

    def backed_off(self) -> None:
        if self.enabled:
            self.backoffs.add(1, self.base)

    def loop_blocked(self, seconds: float) -> None:
        if self.enabled:
            self.loop_stalls.record(seconds, self.base)

    # ---- store

    def store_call(self, operation: str, seconds: float, error: BaseException | None) -> None:
        if not self.enabled:
            return
        error_type = None if error is None else type(error).__qualname__
        attrs = self._attrs(None, **{"eventprocessor.store.operation": operation, "error.type": error_type})
        self.store_duration.record(seconds, attrs)
        if error is not None:
            self.store_errors.add(1, attrs)
        if operation == "update_checkpoint":
            self.checkpoint_duration.record(seconds, self._attrs(None, **{"error.type": error_type}))
