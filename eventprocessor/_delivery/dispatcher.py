"""Dispatcher: one pump per owned claim, started from where the claim resumes.

For each claim the taker won and fenced, the dispatcher picks the starting position (the
fenced checkpoint, or the initial position when there is none or when
``override_checkpoints`` says so, once per partition), builds the claim's
:class:`~eventprocessor.partition.PartitionContext` (whose checkpoints are fenced by the
claim's epoch and allowed only while its lease is valid) and starts its
:class:`~eventprocessor._delivery.pump.PartitionPump`. It hears when a pump ends.
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING

from .._ownership.lease import Lease, LeaseState
from .._ownership.lease_table import LeaseTable
from .._runtime.clock import SystemClock, wait_at_most
from .._runtime.options import ProcessorOptions
from .._runtime.reporting import Reporter
from ..errors import ConfigurationError, OwnershipLostError
from ..events import EventPosition
from ..partition import PartitionContext
from ..state import StateKeeper, StateLog
from ..stores.contract import CheckpointStore
from ..stores.records import Checkpoint
from .concurrent import InFlightLimit
from .pump import LoopBlocked, PartitionPump

if TYPE_CHECKING:  # pragma: no cover
    from .._ownership.warmup import Warmup
from .._ownership.store_history import StoreHistory
from .._runtime.telemetry import Telemetry

__all__ = ["Dispatcher"]

logger = logging.getLogger(__name__)


class Dispatcher:
    """Starts the pumps of won claims.

    ``on_pump_ended()`` is called whenever a pump's task ends (the watchdog reconciles);
    ``on_fatal(error)`` when a pump proves that no claim can ever work (the factory does
    not make a ``PartitionProcessor``); ``on_records_vanished(partition_id)`` when a
    checkpoint found the claim's records gone from the store (data loss, not a takeover)."""

    def __init__(self, *, options: ProcessorOptions, store: CheckpointStore, table: LeaseTable,
                 history: StoreHistory, reporter: Reporter, telemetry: Telemetry, describe: str,
                 on_loop_blocked: LoopBlocked, on_pump_ended: Callable[[], None],
                 on_fatal: Callable[[Exception], None], on_started: Callable[[], None],
                 on_records_vanished: Callable[[str], None] = lambda _pid: None,
                 warmup: Warmup | None = None) -> None:
        self._options = options
        self._store = store
        self._table = table
        self.warmup = warmup
        self._history = history
        self._reporter = reporter
        self._telemetry = telemetry
        self._describe = describe
        self._on_loop_blocked = on_loop_blocked
        self._on_pump_ended = on_pump_ended
        self._on_records_vanished = on_records_vanished
        self._on_fatal = on_fatal
        self._on_started = on_started
        self._overridden: set[str] = set()
        self._pumps: weakref.WeakValueDictionary[str, PartitionPump] = weakref.WeakValueDictionary()
        concurrency = options.concurrency
        self.in_flight = InFlightLimit(concurrency.max_in_flight) if concurrency.concurrent else None
        """The processor-wide cap on calls in flight (many events in flight per partition)."""

    def starting_position(self, partition_id: str, checkpoint: Checkpoint | None) -> EventPosition:
        """The checkpoint, unless there is none or this processor was told to override
        it (once per partition in its life); then the initial position."""
        options = self._options
        initial = options.initial_position_of(partition_id)
        if options.overrides(partition_id) and partition_id not in self._overridden:
            self._overridden.add(partition_id)
            if checkpoint is not None:
                logger.warning("processor %s: partition %s starts at %s, not at its checkpoint (sequence number %d), "
                               "as override_checkpoints asks", self._describe, partition_id, initial,
                               checkpoint.sequence_number)
            return initial
        if checkpoint is not None:
            return EventPosition.from_sequence_number(checkpoint.sequence_number)
        return initial

    def start(self, lease: Lease, checkpoint: Checkpoint | None) -> None:
        """Start the pump of ``lease`` (a claim won and fenced) from ``checkpoint``."""
        options, table, clock = self._options, self._table, self._options.clock
        pid = lease.partition_id
        if checkpoint is not None:
            self._history.knew(pid, checkpoint)
        position = self.starting_position(pid, checkpoint)
        keeper: StateKeeper | None = None
        if options.stateful:
            keeper = StateKeeper(StateLog(self._store, options.scope, pid), epoch=lease.epoch)
            replica = self.warmup.take(pid) if self.warmup is not None else None
            if replica is not None:
                replica.hand_over(keeper)  # warm: the pump only catches up with the checkpoint
        context = self._context(lease, keeper)
        context.last_checkpoint = checkpoint
        pump = PartitionPump(
            context=context, factory=options.factory, source=options.source, starting_position=position,
            max_batch_size=options.max_batch_size, max_wait_time=options.max_wait_time, prefetch=options.prefetch,
            clock=clock, handler_timeout=options.timing.handler_timeout, failure_policy=options.failure_policy,
            on_user_code_error=self._reporter.user_code_failed,
            track_last_enqueued_event_properties=options.track_last_enqueued, telemetry=self._telemetry,
            handler_executor=options.handler_executor, on_loop_blocked=self._on_loop_blocked,
            state=keeper, checkpoint=checkpoint, concurrency=options.concurrency, in_flight_limit=self.in_flight,
            on_received=None if self._reporter.source_start.received else self._reporter.source_start.receiver,
        )
        table.started(lease, pump)
        self._pumps[pid] = pump
        pump.start().add_done_callback(lambda _task: self._ended(pump))
        self._on_started()
        logger.debug("processor %s starts partition %s (epoch %d) from %s", self._describe, pid, lease.epoch,
                     position)

    def _context(self, lease: Lease, keeper: StateKeeper | None) -> PartitionContext:
        """The handler's context of ``lease``, on the claim the pump holds: it may dispatch
        while the lease may, and checkpoint while the lease allows it; a fence found lost
        (by a checkpoint or the receiver) marks the lease lost, and the watchdog ends it at once."""
        options, clock = self._options, self._options.clock
        # The pump asks is_owned before every batch: with the loop's own clock, read the
        # loop's time directly (SystemClock would look the running loop up each time).
        loop = asyncio._get_running_loop()
        now = loop.time if loop is not None and type(clock) is SystemClock else clock.monotonic
        return PartitionContext(
            fully_qualified_namespace=options.source.fully_qualified_namespace,
            eventhub_name=options.source.eventhub_name, consumer_group=options.consumer_group,
            partition_id=lease.partition_id, owner_id=options.owner_id, epoch=lease.epoch,
            checkpoint_store=self._store, is_owned=lambda: lease.dispatchable(now()),
            may_checkpoint=lambda: lease.may_checkpoint(now()), on_ownership_lost=partial(self._fence_lost, lease),
            on_checkpoint=partial(self._history.knew, lease.partition_id), state=keeper,
            on_records_vanished=partial(self._records_vanished, lease),
        )

    def _fence_lost(self, lease: Lease) -> None:
        self._table.lost(lease)
        self._on_pump_ended()

    def _records_vanished(self, lease: Lease) -> None:
        self._table.lost(lease, records_vanished=True)
        self._on_records_vanished(lease.partition_id)

    def pumps(self) -> list[PartitionPump]:
        """The pumps of the claims in the lease table, in its order."""
        return [pump for pump in map(self._pump_of, self._table) if pump is not None]

    def pump(self, partition_id: str) -> PartitionPump | None:
        """The pump of the claim of ``partition_id`` in the lease table, if there is one."""
        lease = self._table.get(partition_id)
        return self._pump_of(lease) if lease is not None else None

    def _pump_of(self, lease: Lease) -> PartitionPump | None:
        pump = self._pumps.get(lease.partition_id)  # the pump this dispatcher started for the lease, if it did
        return pump if pump is not None and lease.pump is pump else None

    def _ended(self, pump: PartitionPump) -> None:
        failure = pump.failure
        if isinstance(failure, ConfigurationError):
            # The factory returned something that is not a PartitionProcessor: no claim
            # can ever work. Say so once and stop, rather than fail on every claim.
            self._on_fatal(failure)
        elif isinstance(failure, Exception) and not isinstance(failure, OwnershipLostError):
            self._reporter.user_code_failed("the partition processor factory", failure)
        self._on_pump_ended()

    async def drain(self, timeout: float) -> set[str]:
        """At stop, once every claim was ended: wait up to ``timeout`` for the pumps to
        finish; cancel those still busy (a handler that does not return) and leave their
        records to expire. Returns the partitions left to expire."""
        hung = await self.wait_for_pumps(self.pumps(), timeout)
        if not hung:
            return set()
        logger.error("processor %s: %d partition(s) %s did not finish within shutdown_timeout=%g s (a handler "
                     "that does not return); cancelling them, their records are left to expire",
                     self._describe, len(hung), sorted(p.context.partition_id for p in hung), timeout)
        for pump in hung:
            pump.cancel()
            lease = self._table.get(pump.context.partition_id)
            if lease is not None:
                self._table.leave_to_expire(lease)
        still = await self.wait_for_pumps(hung, 1.0)
        if still:
            logger.error("processor %s: partitions %s ignored cancellation; they may still run",
                         self._describe, sorted(p.context.partition_id for p in still))
        return {p.context.partition_id for p in hung}

    async def wait_for_pumps(self, pumps: Iterable[PartitionPump], timeout: float) -> list[PartitionPump]:
        """Wait up to ``timeout`` for ``pumps`` to end; return those still running."""
        live = [p for p in pumps if p.alive]
        tasks = [p.task for p in live if p.task is not None]
        if tasks:
            await wait_at_most(self._options.clock, timeout, tasks)
        return [p for p in live if p.alive]

    def lag(self) -> dict[str, int | None]:
        """Events behind per owned partition (see :meth:`EventProcessor.lag`)."""
        return {lease.partition_id: (lease.pump.context.lag if lease.pump is not None else None)
                for lease in self._table.in_state(LeaseState.OWNED)}
