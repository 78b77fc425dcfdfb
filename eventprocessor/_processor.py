"""EventProcessor: balances partitions with its peers and runs one pump per partition.

A small façade over parts with one job each, built and wired by
:func:`~eventprocessor._assembly.assemble`, all started and stopped by one task scope
(:class:`~eventprocessor._runtime.tasks.TaskScope`):

* :class:`~eventprocessor._ownership.taker.Taker`: one balancing tick every
  ``load_balancing_interval`` (list, reconcile, decide, claim, fence);
* :class:`~eventprocessor._ownership.lease_table.LeaseTable`: the leases, and the only code that
  changes one;
* :class:`~eventprocessor._delivery.dispatcher.Dispatcher`: one
  :class:`~eventprocessor._delivery.pump.PartitionPump` per owned claim, where all user code runs;
* :class:`~eventprocessor._ownership.renewer.LeaseRenewer`: in the per-partition mode, rewrites
  each owned record once it is ``ownership_renewal_age`` old, on its own schedule;
* :class:`~eventprocessor._ownership.releaser.Releaser`: writes ended claims' records over (release
  or handoff) and sweeps up at stop;
* :class:`~eventprocessor._ownership.membership.Membership`: the heartbeat record, which keeps
  every partition of the processor (:mod:`~eventprocessor._ownership.liveness`);
* :class:`~eventprocessor._delivery.watchdog.Watchdog`: ends leases on time, watches handlers and
  the event loop.

Every store call is bounded by ``store_timeout`` (:class:`~eventprocessor._runtime.bounded_store.
BoundedStore`). Leases are measured on the local monotonic clock from the moment the
write the store accepted was *sent*, and end ``expiration - safety margin`` later, before
any other processor could judge the record expired on the store's clock (self-fencing).
The timing model and how to size it are in docs/concepts/timing.md.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from ._assembly import assemble
from ._delivery.pump import PartitionPump
from ._ownership.balancer import BalanceReport
from ._ownership.lease import LeaseState
from ._ownership.lease_table import OWNERSHIP_LOG_FIELDS, OWNERSHIP_REASONS
from ._ownership.load_plan import MemberLoad
from ._runtime.bounded_store import BoundedStore
from ._runtime.clock import Clock
from ._runtime.options import ErrorHandler, PartitionProcessorFactory, ProcessorOptions
from ._runtime.stats import ProcessorStats
from ._runtime.timing import Timing
from .events import EventPosition
from .policies import (
    ConcurrencyPolicy,
    FailurePolicy,
    HandlerExecutor,
    LoadBalancingStrategy,
    LoadPolicy,
    Ordering,
    StatePolicy,
)
from .sources.base import EventSource
from .stores.contract import CheckpointStore

__all__ = ["EventProcessor", "BalanceReport", "Timing", "ProcessorStats", "OWNERSHIP_LOG_FIELDS", "OWNERSHIP_REASONS"]

logger = logging.getLogger(__name__)


class EventProcessor:
    """Consumes the partitions this process owns, balancing ownership with its peers.

    Example::

        class Printer(PartitionProcessor):
            async def process_events(self, events, context):
                for event in events:
                    print(context.partition_id, event.sequence_number, event.body_as_str())
                await context.update_checkpoint()

        source = InMemoryEventSource(8)
        async with EventProcessor(source, InMemoryCheckpointStore(), Printer):
            await asyncio.sleep(30)

    The timing arguments and how to size them are described in docs/concepts/timing.md and
    in :class:`Timing`, which :attr:`timing` returns.

    :param source: Where the events come from: an ``EventHubSource`` (Azure Event Hubs
        or the local emulator), an ``InMemoryEventSource``, or any ``EventSource``.
    :param checkpoint_store: Where ownership and checkpoints are kept, shared by every
        processor of the consumer group (Blob, Table, in-memory, or any ``CheckpointStore``).
    :param partition_processor: A ``PartitionProcessor`` subclass, or a callable that
        returns a new ``PartitionProcessor``: one is made per partition claimed.
    :param consumer_group: The event hub's consumer group to read as. Default ``"$default"``.
    :param owner_id: This processor's name in ownership records and logs. Default: a new UUID.
    :param load_balancing_strategy: ``"greedy"`` (take the fair share in one tick, the
        default), ``"balanced"`` (one partition per tick) or ``"static"`` (the partitions
        of ``ordinal``).
    :param load_balancing_interval: Seconds between balancing ticks. Default 1 (a tick
        that finds nothing changed reads only the member records: docs/concepts/timing.md).
    :param partition_ownership_expiration_interval: Seconds after its last write that an
        ownership record expires and another processor may claim it. Default 75.
    :param ownership_renewal_age: Age in seconds at which an owned record is rewritten
        (the per-partition mode). Default: when 15 s of the lease remain, at least half
        the expiration.
    :param ownership_renewal: How the processor keeps its partitions: ``"auto"`` (the
        default: one member heartbeat keeps them all, and per-partition renewals come back
        while an owner that judges records by their own age, such as azure-eventhub's
        processor, is seen in the group), ``"member"`` (never switches; a group of this
        SDK's processors only) or ``"partition"`` (each record rewritten every renewal
        age). See docs/concepts/leases.md.
    :param store_timeout: The longest any store call may take, in seconds. Default: a third
        of the time between a renewal and the end of the lease (5 s at the defaults).
    :param shutdown_timeout: Seconds :meth:`stop` waits for handlers to finish their batch
        before cancelling them. Default 30.
    :param handler_timeout: Seconds a handler call may run before it is reported as hung
        (``HandlerTimeoutError``); None not to watch. Default 60.
    :param initial_event_position: Where a partition without a checkpoint starts: an
        ``EventPosition`` or a mapping of partition id to one. Default: the earliest event.
    :param default_event_position: Where a partition missing from an
        ``initial_event_position`` mapping starts. Default: the earliest event.
    :param override_checkpoints: True (or a set of partition ids) to start once from
        ``initial_event_position`` even where a checkpoint exists. Default False.
    :param refuse_checkpoint_rewind: True to resume from the last checkpoint this
        processor knew when the store lost its checkpoints, rather than from
        ``initial_event_position``. Default False.
    :param max_batch_size: The most events handed to ``process_events`` at once. Default 300.
    :param max_wait_time: Seconds to wait for events before calling ``process_events``
        with an empty batch; None for no empty batches (the default).
    :param prefetch: Events each receiver fetches ahead. Default 300.
    :param track_last_enqueued_event_properties: True to keep each partition's newest
        event properties (for :meth:`lag`). Default False.
    :param handler_executor: Where handlers run: None on the event loop (the default),
        ``"thread"`` a worker thread per owned partition, or a thread-based
        ``concurrent.futures.Executor``.
    :param failure_policy: Retries and poison events: a :class:`FailurePolicy`
        (``max_delivery_attempts``, ``retry_backoff``, ``on_poison``, ``dead_letter``).
    :param handoff_timeout: Seconds an owner asked to hand a partition over has before
        the requester takes it; None to take it at once. Default 30.
    :param balance_factor: Partitions a processor may own above the fair share before
        others take from it. Default 1.
    :param ordinal: This processor's ordinal with ``load_balancing_strategy="static"``.
    :param replica_count: How many processors share the partitions with
        ``load_balancing_strategy="static"``.
    :param load_policy: A :class:`LoadPolicy` to balance by measured load; None balances
        by partition counts (the default).
    :param stateful: True, or a :class:`StatePolicy`, to keep per-partition state that
        moves with ownership. Default False.
    :param error_handler: Called with every error the processor reports and the
        partition's context (or None): a function or a coroutine function.
    :param clock: The clock every wait and lease is measured on. Default: the event loop's.
    :param rng: The randomness of jitter and tie-breaks. Default: a new ``random.Random``.
    :param meter_provider: An OpenTelemetry ``MeterProvider`` for the metrics. Default:
        the global one, when OpenTelemetry is installed.
    :param tracer_provider: An OpenTelemetry ``TracerProvider`` for the spans. Default:
        the global one, when OpenTelemetry is installed.
    :param source_startup_timeout: Seconds after the start within which the source must
        have worked once: a source that never did (an unknown event hub or consumer
        group, a wrong host or port) ends the processor with its error (:meth:`run`
        raises it, and so does the ``async with`` block). None keeps retrying. A source
        that worked once is retried for as long as the processor runs. Default 5.
    :param group_join_delay: Seconds a processor that starts in a forming group (every
        live member just starting too: a cold start, a whole group restarted) waits for
        the member set to stay unchanged before its first claims, so that processors
        started together claim their final shares at once instead of moving partitions to
        each late joiner (Kafka's ``group.initial.rebalance.delay``). At most three times
        that while members keep joining; none when it joins a running group. Default None:
        claim at once (see docs/concepts/timing.md, "A group forming", for what it saves
        and what it costs).
    :param max_concurrency: The most ``process_events`` calls in flight per partition
        (see docs/concepts/concurrency.md). Default 1: one batch at a time.
    :param ordering: With ``max_concurrency`` above 1: ``"key"`` (each call gets events of
        one partition key, in order; one call per key at a time) or ``"none"`` (any events
        at once). ``"partition"``, the default, is one call at a time.
    :param concurrency: A :class:`ConcurrencyPolicy` with the rest of the concurrency
        settings (events held per partition, calls in flight per processor, checkpoint
        cadence). Default: none; give it or the two above, not both.
    """

    def __init__(
        self,
        source: EventSource,
        checkpoint_store: CheckpointStore,
        partition_processor: PartitionProcessorFactory,
        *,
        consumer_group: str = "$default",
        owner_id: str | None = None,
        load_balancing_strategy: LoadBalancingStrategy | str = LoadBalancingStrategy.GREEDY,
        load_balancing_interval: float = 1.0,
        partition_ownership_expiration_interval: float = 75.0,
        ownership_renewal_age: float | None = None,
        ownership_renewal: str = "auto",
        store_timeout: float | None = None,
        shutdown_timeout: float = 30.0,
        handler_timeout: float | None = 60.0,
        initial_event_position: EventPosition | Mapping[str, EventPosition] = EventPosition.earliest(),
        default_event_position: EventPosition = EventPosition.earliest(),
        override_checkpoints: bool | Iterable[str] = False,
        refuse_checkpoint_rewind: bool = False,
        max_batch_size: int = 300,
        max_wait_time: float | None = None,
        prefetch: int = 300,
        track_last_enqueued_event_properties: bool = False,
        handler_executor: HandlerExecutor = None,
        failure_policy: FailurePolicy = FailurePolicy(),
        handoff_timeout: float | None = 30.0,
        balance_factor: int = 1,
        ordinal: int | None = None,
        replica_count: int | None = None,
        load_policy: LoadPolicy | None = None,
        stateful: bool | StatePolicy = False,
        max_concurrency: int | None = None,
        ordering: Ordering | str | None = None,
        concurrency: ConcurrencyPolicy | None = None,
        error_handler: ErrorHandler | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        meter_provider: Any = None,
        tracer_provider: Any = None,
        source_startup_timeout: float | None = 5.0,
        group_join_delay: float | None = None,
    ) -> None:
        """The common options are flat; three groups are policy objects
        (:mod:`eventprocessor.policies`): ``failure_policy`` (retries and poison events),
        ``load_policy`` (balance by measured load; None: by partition counts) and
        ``stateful`` (True, or a :class:`StatePolicy` with warm standbys). Many events in
        flight per partition: ``max_concurrency`` and ``ordering`` (the common two), or
        ``concurrency`` (a :class:`ConcurrencyPolicy` with the rest)."""
        options = self._options = ProcessorOptions.validate(
            source, checkpoint_store, partition_processor, consumer_group=consumer_group, owner_id=owner_id,
            load_balancing_strategy=load_balancing_strategy, load_balancing_interval=load_balancing_interval,
            partition_ownership_expiration_interval=partition_ownership_expiration_interval,
            ownership_renewal_age=ownership_renewal_age, store_timeout=store_timeout,
            shutdown_timeout=shutdown_timeout, handler_timeout=handler_timeout,
            initial_event_position=initial_event_position, default_event_position=default_event_position,
            override_checkpoints=override_checkpoints, refuse_checkpoint_rewind=refuse_checkpoint_rewind,
            max_batch_size=max_batch_size, max_wait_time=max_wait_time, prefetch=prefetch,
            track_last_enqueued_event_properties=track_last_enqueued_event_properties,
            handler_executor=handler_executor, failure_policy=failure_policy, handoff_timeout=handoff_timeout,
            balance_factor=balance_factor, ordinal=ordinal, replica_count=replica_count, load_policy=load_policy,
            stateful=stateful, error_handler=error_handler, clock=clock, rng=rng, max_concurrency=max_concurrency,
            ordering=ordering, concurrency=concurrency,
            source_startup_timeout=source_startup_timeout, ownership_renewal=ownership_renewal,
            group_join_delay=group_join_delay)
        self._parts = parts = assemble(options, checkpoint_store, meter_provider=meter_provider,
                                       tracer_provider=tracer_provider)
        self._scope, self._table = parts.scope, parts.table  # the two the façade reads most
        self._host: asyncio.Task | None = None  # the task in ``async with``, cancelled if the processor halts
        self._host_cancelled = False

    def __repr__(self) -> str:
        return (f"EventProcessor(owner_id={self.owner_id!r}, eventhub_name={self._options.source.eventhub_name!r}, "
                f"consumer_group={self._options.consumer_group!r}, strategy={self._options.strategy.value})")

    # ----------------------------------------------------------------- reading
    @property
    def owner_id(self) -> str:
        return self._options.owner_id

    @property
    def timing(self) -> Timing:
        """The timing model in effect (see :class:`Timing`)."""
        return self._options.timing

    @property
    def owned_partitions(self) -> frozenset[str]:
        """The partitions this processor may dispatch right now (claim owned, lease valid)."""
        return self._table.owned()

    @property
    def leases(self) -> Mapping[str, LeaseState]:
        """The state of every lease this processor holds, by partition."""
        return self._table.states()

    @property
    def ticks(self) -> int:
        return self._parts.stats.ticks

    @property
    def overruns(self) -> int:
        return self._parts.stats.overruns

    @property
    def stats(self) -> ProcessorStats:
        """Counters: ticks and overruns, claims, renewals, self-fenced leases, ..."""
        stats, renewer = self._parts.stats, self._parts.renewer
        stats.renewals, stats.failed_renewals = renewer.renewals, renewer.failed_renewals
        stats.announcements = self._parts.taker.announcements
        return stats

    @property
    def is_running(self) -> bool:
        return self._scope.running("taker")

    @property
    def store_calls(self) -> BoundedStore:
        """The bounded store wrapper: call counts, failures, time-outs and latency."""
        return self._parts.store

    @property
    def membership(self) -> bool | None:
        """Whether the store keeps this processor's member record (None: not known yet)."""
        return self._parts.membership.state

    @property
    def load(self) -> MemberLoad | None:
        """The load this processor last measured and published in its member record
        (with a ``load_policy``; None before the first sample, or when balancing by count).

        Example::

            processor.load   # MemberLoad(utilization=0.42, partitions={"3": PartitionLoad(120.5, ...)})
        """
        return self._parts.membership.load

    def pump(self, partition_id: str) -> PartitionPump | None:
        return self._parts.dispatcher.pump(partition_id)

    def lag(self) -> dict[str, int | None]:
        """Events behind per owned partition: the newest enqueued sequence number minus
        the last delivered one (None until known; needs
        ``track_last_enqueued_event_properties=True``)."""
        return self._parts.dispatcher.lag()

    def in_flight(self) -> dict[str, tuple[int, int, float | None]]:
        """With ``max_concurrency`` > 1, per owned partition: the calls in flight, the
        events held beyond its checkpoint, and the enqueued time (Unix seconds) of its
        oldest event not done (None when none is held). Empty otherwise."""
        return self._parts.membership.in_flight()

    # ----------------------------------------------------------------- life cycle
    async def start(self, *, balancing: bool = True) -> None:
        """Start balancing, renewing and processing in the background. Idempotent.

        ``balancing=False`` starts everything but the balancing loop, for a driver that
        ticks :meth:`balance_once` itself (a test or a simulation that counts ticks);
        call :meth:`join` first."""
        if self.is_running or self._scope.running("renewer"):
            return
        parts, scope = self._parts, self._scope
        if not balancing:
            parts.membership.joining = False  # the driver of balance_once() decides when to claim: no wait
        if balancing:
            scope.start_loop("taker", parts.taker.run())
            source = self._options.source
            scope.start_loop("source-watch", parts.reporter.source_start.watch(
                parts.taker.halt, f"{source.fully_qualified_namespace}/{source.eventhub_name}"))
        scope.start_loop("renewer", parts.renewer.run())
        scope.start_loop("leases", parts.watchdog.run_leases())
        scope.start_loop("stall-probe", parts.watchdog.run_stall_probe())
        scope.start_loop("heartbeat", parts.membership.run())
        if parts.warmup is not None:
            scope.start_loop("warmup", parts.warmup.run())
        logger.info("processor %s started on %s/%s/%s", self.owner_id, *self._options.scope)

    async def join(self) -> None:
        """Write this processor's member record now (a driver of :meth:`balance_once`
        does it before the first tick, as the balancing loop does)."""
        await self._parts.membership.join()

    async def balance_once(self) -> BalanceReport:
        """Run one load-balancing tick (see :class:`~eventprocessor._ownership.taker.Taker`)."""
        return await self._parts.taker.tick()

    async def stop(self, *, release: bool = True) -> None:
        """Stop within ``shutdown_timeout`` plus one ``store_timeout``.

        Balancing stops at once; every pump finishes the batch it is in and calls
        ``close(SHUTDOWN)`` while the renewer keeps the leases fresh. A pump still busy
        after ``shutdown_timeout`` is cancelled and logged. Then each partition whose pump
        is gone is released (cleared, conditional on the etag) so others can claim it at
        once; one whose pump would not end is left to expire. ``release=False`` leaves
        every record to expire, as a crash would.
        """
        parts, table, scope = self._parts, self._table, self._scope
        timing, clock = self._options.timing, self._options.clock
        await scope.stop_loop("taker")
        started = clock.monotonic()
        table.end_all(release=release)
        left_to_expire = await parts.dispatcher.drain(timing.shutdown_timeout)  # cancels pumps that hang
        for name in ("source-watch", "renewer", "leases", "heartbeat", "stall-probe", "warmup"):
            await scope.stop_loop(name)
        table.reconcile()
        await parts.releaser.wait()  # release writes, each bounded by store_timeout
        table.forget_released()
        if release:  # the sweep within the documented bound, or not at all
            remaining = started + timing.shutdown_timeout + timing.store_timeout - clock.monotonic()
            await parts.releaser.sweep(left_to_expire, within=remaining)
            await parts.membership.leave()
        await scope.close()
        logger.info("processor %s stopped in %.2f s (released=%s)", parts.describe, clock.monotonic() - started,
                    release)

    async def run(self) -> None:
        """Run until cancelled, then stop gracefully (releasing ownership).

        Raises the configuration error that stopped the processor by itself, if one did
        (a factory that does not return a ``PartitionProcessor``)."""
        await self.start()
        taker = self._scope.loop("taker")
        try:
            if taker is not None:
                await asyncio.shield(taker)
        except asyncio.CancelledError:
            if self._parts.taker.fatal is None:
                raise
        finally:
            await self.stop()
        if self._parts.taker.fatal is not None:
            raise self._parts.taker.fatal

    async def __aenter__(self) -> EventProcessor:
        """Start; a processor that stops by itself on an error (a source that never
        worked, a factory that makes no ``PartitionProcessor``) ends the ``async with``
        block with that error, as a failing task ends an ``asyncio.TaskGroup``."""
        await self.start()
        taker = self._scope.loop("taker")
        self._host = asyncio.current_task()
        if taker is not None and self._host is not None:
            taker.add_done_callback(self._end_host_if_halted)
        return self

    def _end_host_if_halted(self, _taker: asyncio.Task) -> None:
        if self._parts.taker.fatal is not None and self._host is not None and not self._host.done():
            self._host_cancelled = True
            self._host.cancel()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        host, self._host = self._host, None
        ours, self._host_cancelled = self._host_cancelled, False
        await self.stop()
        fatal = self._parts.taker.fatal
        if fatal is not None and (exc_type is None or (exc_type is asyncio.CancelledError and ours)):
            if ours and host is not None and hasattr(host, "uncancel"):
                host.uncancel()  # the cancellation was this processor's, to end the block (Python 3.11+)
            raise fatal

