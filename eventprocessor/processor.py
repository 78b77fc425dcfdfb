"""EventProcessor: balances partitions with its peers and runs one pump per partition.

A small façade over parts with one job each, all started and stopped by one task scope
(:class:`~eventprocessor.tasks.TaskScope`):

* :class:`~eventprocessor.taker.Taker`: one balancing tick every
  ``load_balancing_interval`` (list, reconcile, decide, claim, fence);
* :class:`~eventprocessor.lease_table.LeaseTable`: the leases, and the only code that
  changes one;
* :class:`~eventprocessor.dispatcher.Dispatcher`: one
  :class:`~eventprocessor.pump.PartitionPump` per owned claim, where all user code runs;
* :class:`~eventprocessor.renewer.LeaseRenewer`: rewrites each owned record once it is
  ``ownership_renewal_age`` old, on its own schedule;
* :class:`~eventprocessor.releaser.Releaser`: writes ended claims' records over (release
  or handoff) and sweeps up at stop;
* :class:`~eventprocessor.membership.Membership`: the heartbeat record;
* :class:`~eventprocessor.watchdog.Watchdog`: ends leases on time, watches handlers and
  the event loop.

Every store call is bounded by ``store_timeout`` (:class:`~eventprocessor.bounded_store.
BoundedStore`). Leases are measured on the local monotonic clock from the moment the
write the store accepted was *sent*, and end ``expiration - safety margin`` later, before
any other processor could judge the record expired on the store's clock (self-fencing).
The timing model and how to size it are in the README ("Timing").
"""
from __future__ import annotations

import asyncio
import logging
import random
from types import TracebackType
from typing import Any, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Type, Union

from .balancer import LoadBalancingStrategy
from .bounded_store import BoundedStore
from .checkpoint_store import CheckpointStore
from .clock import Clock
from .delivery import PoisonPolicy
from .dispatcher import Dispatcher
from .events import EventPosition
from .lease import LeaseState
from .lease_table import OWNERSHIP_LOG_FIELDS, OWNERSHIP_REASONS, LeaseTable
from .load import CpuMeter, LoadMeter
from .load_plan import LOAD_PROPERTY, LoadPolicy, encode_load
from .membership import Membership
from .options import RENEWAL_WINDOW, ErrorHandler, PartitionProcessorFactory, ProcessorOptions, Timing
from .pump import DeadLetter, PartitionPump
from .releaser import Releaser
from .renewer import LeaseRenewer
from .reporting import Reporter
from .sources.base import EventSource
from .stats import ProcessorStats
from .store_history import StoreHistory
from .taker import BalanceReport, Taker
from .tasks import TaskScope
from .telemetry import Telemetry
from .usercode import HandlerExecutor
from .warmup import Warmup
from .watchdog import Watchdog
from .writer import OwnershipWriter

__all__ = ["EventProcessor", "BalanceReport", "Timing", "ProcessorStats", "OWNERSHIP_LOG_FIELDS", "OWNERSHIP_REASONS",
           "RENEWAL_WINDOW"]

logger = logging.getLogger(__name__)


class EventProcessor:
    """Consumes the partitions this process owns, balancing ownership with its peers.

    Example::

        class Printer(PartitionProcessor):
            async def process_events(self, events, context):
                for event in events:
                    print(context.partition_id, event.sequence_number, event.body_as_str())
                await context.update_checkpoint()

        source = MemoryEventSource(8)
        async with EventProcessor(source, InMemoryCheckpointStore(), Printer):
            await asyncio.sleep(30)

    The timing arguments and how to size them are described in the README ("Timing") and
    in :class:`Timing`, which :attr:`timing` returns.
    """

    def __init__(
        self,
        source: EventSource,
        checkpoint_store: CheckpointStore,
        partition_processor: PartitionProcessorFactory,
        *,
        consumer_group: str = "$default",
        owner_id: Optional[str] = None,
        load_balancing_strategy: Union[LoadBalancingStrategy, str] = LoadBalancingStrategy.GREEDY,
        load_balancing_interval: float = 15.0,
        partition_ownership_expiration_interval: float = 75.0,
        ownership_renewal_age: Optional[float] = None,
        store_timeout: Optional[float] = None,
        shutdown_timeout: float = 30.0,
        handler_timeout: Optional[float] = 60.0,
        handler_executor: HandlerExecutor = None,
        initial_event_position: Union[EventPosition, Mapping[str, EventPosition]] = EventPosition.earliest(),
        max_batch_size: int = 300,
        max_wait_time: Optional[float] = None,
        prefetch: int = 300,
        track_last_enqueued_event_properties: bool = False,
        default_event_position: EventPosition = EventPosition.earliest(),
        override_checkpoints: Union[bool, Iterable[str]] = False,
        max_delivery_attempts: int = 5,
        retry_backoff: float = 0.5,
        on_poison: Union[PoisonPolicy, str] = PoisonPolicy.SKIP,
        dead_letter: Optional[DeadLetter] = None,
        refuse_checkpoint_rewind: bool = False,
        handoff_timeout: Optional[float] = 30.0,
        balance_factor: int = 1,
        ordinal: Optional[int] = None,
        replica_count: Optional[int] = None,
        clock: Optional[Clock] = None,
        rng: Optional[random.Random] = None,
        error_handler: Optional[ErrorHandler] = None,
        stateful: bool = False,
        num_standbys: int = 0,
        acceptable_recovery_lag: int = 10_000,
        balance_by: str = "count",
        load_policy: Optional[LoadPolicy] = None,
        load_meter: Optional[Callable[[], float]] = None,
        meter_provider: Any = None,
        tracer_provider: Any = None,
    ) -> None:
        # Every keyword argument but the telemetry providers is validated in one place.
        arguments = {name: value for name, value in locals().items()
                     if name not in ("self", "source", "checkpoint_store", "partition_processor", "meter_provider",
                                     "tracer_provider")}
        options = self._options = ProcessorOptions.validate(source, checkpoint_store, partition_processor,
                                                            **arguments)
        describe = self._describe = f"{options.owner_id} on {source.eventhub_name}/{options.consumer_group}"
        timing, clock_ = options.timing, options.clock
        self._fatal: Optional[Exception] = None
        self._scope = TaskScope(options.owner_id)
        self._stats = ProcessorStats()
        self._telemetry = Telemetry(eventhub_name=source.eventhub_name, consumer_group=options.consumer_group,
                                    owner_id=options.owner_id, meter_provider=meter_provider,
                                    tracer_provider=tracer_provider)
        self._store = BoundedStore(checkpoint_store, timeout=timing.store_timeout, clock=clock_)
        if self._telemetry.enabled:
            self._store.observers.append(self._telemetry.store_call)
        writer = OwnershipWriter(self._store)
        history = StoreHistory()
        self._table = LeaseTable(
            owner_id=options.owner_id, eventhub_name=source.eventhub_name, consumer_group=options.consumer_group,
            describe=describe, clock=clock_, timing=timing, stats=self._stats, telemetry=self._telemetry,
            on_released=lambda leases: self._releaser.schedule(leases), on_refreshed=lambda: self._renewer.wake())
        reporter = self._reporter = Reporter(describe=describe, clock=clock_, period=max(30.0, timing.expiration),
                            error_handler=options.error_handler, table=self._table, scope=self._scope)
        self._releaser = Releaser(options=options, store=self._store, writer=writer, table=self._table,
                                  history=history, stats=self._stats, scope=self._scope, describe=describe)
        self._watchdog = Watchdog(table=self._table, clock=clock_, timing=timing, reporter=reporter,
                                  telemetry=self._telemetry, describe=describe)
        self._membership = Membership(options=options, store=self._store, reporter=reporter, describe=describe,
                                      on_fatal=self._halt)
        self._renewer = LeaseRenewer(table=self._table, writer=writer, clock=clock_,
                                     on_contested=lambda: self._taker.wake(),
                                     on_error=lambda error, lease: reporter.report(error, [lease]),
                                     describe=options.owner_id)
        self._dispatcher = Dispatcher(
            options=options, store=self._store, table=self._table, history=history, reporter=reporter,
            telemetry=self._telemetry, describe=describe, on_loop_blocked=self._watchdog.loop_blocked,
            on_pump_ended=self._watchdog.wake, on_fatal=self._halt,
            on_started=self._pump_started)
        self._warmup = Warmup(options=options, store=self._store, describe=describe) if options.stateful else None
        if self._warmup is not None:
            self._dispatcher.warmup = self._warmup
        self._load = LoadMeter(table=self._table, clock_now=clock_.monotonic,
                               utilization=options.load_meter or CpuMeter()) if options.balance_by == "load" else None
        self._membership.extra_properties = self._member_properties
        self._taker = Taker(options=options, store=self._store, writer=writer, table=self._table, history=history,
                            membership=self._membership, dispatcher=self._dispatcher, watchdog=self._watchdog,
                            reporter=reporter, stats=self._stats, telemetry=self._telemetry, describe=describe,
                            halted=lambda: self._fatal is not None, warmup=self._warmup)
        self._telemetry.observe(owned=lambda: len(self.owned_partitions), lag=self.lag)

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
    def owned_partitions(self) -> FrozenSet[str]:
        """The partitions this processor may dispatch right now (claim owned, lease valid)."""
        return self._table.owned()

    @property
    def leases(self) -> Mapping[str, LeaseState]:
        """The state of every lease this processor holds, by partition."""
        return self._table.states()

    @property
    def ticks(self) -> int:
        return self._stats.ticks

    @property
    def overruns(self) -> int:
        return self._stats.overruns

    @property
    def stats(self) -> ProcessorStats:
        """Counters: ticks and overruns, claims, renewals, self-fenced leases, ..."""
        self._stats.renewals = self._renewer.renewals
        self._stats.failed_renewals = self._renewer.failed_renewals
        return self._stats

    @property
    def is_running(self) -> bool:
        return self._scope.running("taker")

    @property
    def store_calls(self) -> BoundedStore:
        """The bounded store wrapper: call counts, failures, time-outs and latency."""
        return self._store

    @property
    def membership(self) -> Optional[bool]:
        """Whether the store keeps this processor's member record (None: not known yet)."""
        return self._membership.state

    def pump(self, partition_id: str) -> Optional[PartitionPump]:
        lease = self._table.get(partition_id)
        return lease.pump if lease is not None else None

    def lag(self) -> Dict[str, Optional[int]]:
        """Events behind per owned partition: the newest enqueued sequence number minus
        the last delivered one (None until known; needs
        ``track_last_enqueued_event_properties=True``)."""
        return self._dispatcher.lag()

    # ----------------------------------------------------------------- life cycle
    async def start(self, *, balancing: bool = True) -> None:
        """Start balancing, renewing and processing in the background. Idempotent.

        ``balancing=False`` starts everything but the balancing loop, for a driver that
        ticks :meth:`balance_once` itself (a simulator); call :meth:`join` first."""
        if self.is_running or self._scope.running("renewer"):
            return
        scope = self._scope
        if balancing:
            scope.start_loop("taker", self._taker.run())
        scope.start_loop("renewer", self._renewer.run())
        scope.start_loop("leases", self._watchdog.run_leases())
        scope.start_loop("stall-probe", self._watchdog.run_stall_probe())
        scope.start_loop("heartbeat", self._membership.run())
        if self._warmup is not None:
            scope.start_loop("warmup", self._warmup.run())
        logger.info("processor %s started on %s/%s/%s", self.owner_id, *self._options.scope)

    async def join(self) -> None:
        """Write this processor's member record now (a driver of :meth:`balance_once`
        does it before the first tick, as the balancing loop does)."""
        await self._membership.join()

    async def balance_once(self) -> BalanceReport:
        """Run one load-balancing tick (see :class:`~eventprocessor.taker.Taker`)."""
        return await self._taker.tick()

    def _member_properties(self) -> Dict[str, str]:
        """What the member record says besides the basics: replica lags, measured load."""
        properties = self._warmup.member_properties() if self._warmup is not None else {}
        if self._load is not None:
            properties[LOAD_PROPERTY] = encode_load(self._load.sample())
        return properties

    def _pump_started(self) -> None:
        self._renewer.wake()
        self._watchdog.wake()

    def _halt(self, error: Exception) -> None:
        """No claim can ever work (the factory does not make a ``PartitionProcessor``, the
        static strategy without member records): say so once and stop balancing; ``run()``
        raises the error, ``stop()`` (or leaving ``async with``) stops the rest."""
        if self._fatal is not None:
            return
        self._fatal = error
        logger.error("processor %s: %s; stopping", self._describe, error)
        self._reporter.report(error, [])
        self._taker.wake()

    async def stop(self, *, release: bool = True) -> None:
        """Stop within ``shutdown_timeout`` plus one ``store_timeout``.

        Balancing stops at once; every pump finishes the batch it is in and calls
        ``close(SHUTDOWN)`` while the renewer keeps the leases fresh. A pump still busy
        after ``shutdown_timeout`` is cancelled and logged. Then each partition whose pump
        is gone is released (cleared, conditional on the etag) so others can claim it at
        once; one whose pump would not end is left to expire. ``release=False`` leaves
        every record to expire, as a crash would.
        """
        timing, clock, scope = self._options.timing, self._options.clock, self._scope
        await scope.stop_loop("taker")
        started = clock.monotonic()
        self._table.end_all(release=release)
        hung = await self._dispatcher.wait_for_pumps(self._table.pumps(), timing.shutdown_timeout)
        if hung:
            logger.error("processor %s: %d partition(s) %s did not finish within shutdown_timeout=%g s (a handler "
                         "that does not return); cancelling them, their records are left to expire",
                         self._describe, len(hung), sorted(p.context.partition_id for p in hung),
                         timing.shutdown_timeout)
            for pump in hung:
                pump.cancel()
                lease = self._table.get(pump.context.partition_id)
                if lease is not None:
                    self._table.leave_to_expire(lease)
            still = await self._dispatcher.wait_for_pumps(hung, 1.0)
            if still:
                logger.error("processor %s: partitions %s ignored cancellation; they may still run",
                             self._describe, sorted(p.context.partition_id for p in still))
        for name in ("renewer", "leases", "heartbeat", "stall-probe", "warmup"):
            await scope.stop_loop(name)
        self._table.reconcile()
        await self._releaser.wait()  # release writes, each bounded by store_timeout
        self._table.forget_released()
        remaining = started + timing.shutdown_timeout + timing.store_timeout - clock.monotonic()
        if release and remaining > 0:
            try:  # within the documented bound, or not at all
                await asyncio.wait_for(self._releaser.sweep({p.context.partition_id for p in hung}), remaining)
            except asyncio.TimeoutError:
                logger.warning("processor %s: its last listing did not finish within stop()'s bound; records that "
                               "still name it will expire", self._describe)
        if release:
            await self._membership.leave()
        await scope.close()
        logger.info("processor %s stopped in %.2f s (released=%s)", self._describe, clock.monotonic() - started,
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
            if self._fatal is None:
                raise
        finally:
            await self.stop()
        if self._fatal is not None:
            raise self._fatal

    async def __aenter__(self) -> "EventProcessor":
        await self.start()
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.stop()

