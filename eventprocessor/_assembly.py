"""Assembly: builds the parts of one processor and wires them to each other.

The one place that knows which part calls which: the lease table hands ended claims to
the releaser and wakes the renewer; a renewal that loses its condition wakes the taker;
a started pump wakes the renewer and the watchdog; membership and the dispatcher halt
the taker when no claim can ever work. :class:`~eventprocessor._processor.EventProcessor`
starts, stops and reads the parts; it does not wire them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._delivery.dispatcher import Dispatcher
from ._delivery.watchdog import Watchdog
from ._ownership.lease_table import LeaseTable
from ._ownership.membership import Membership
from ._ownership.releaser import Releaser
from ._ownership.renewer import LeaseRenewer
from ._ownership.store_history import StoreHistory
from ._ownership.taker import Taker
from ._ownership.warmup import Warmup
from ._ownership.writer import OwnershipWriter
from ._runtime.bounded_store import BoundedStore
from ._runtime.options import ProcessorOptions
from ._runtime.reporting import Reporter
from ._runtime.stats import ProcessorStats
from ._runtime.tasks import TaskScope
from ._runtime.telemetry import Telemetry
from .stores.contract import CheckpointStore

__all__ = ["Parts", "assemble"]


@dataclass(frozen=True)
class Parts:
    """The parts of one processor, wired (see the module docstring)."""

    describe: str
    scope: TaskScope
    stats: ProcessorStats
    telemetry: Telemetry
    store: BoundedStore
    table: LeaseTable
    releaser: Releaser
    watchdog: Watchdog
    warmup: Warmup | None
    membership: Membership
    renewer: LeaseRenewer
    dispatcher: Dispatcher
    taker: Taker
    reporter: Reporter


def assemble(options: ProcessorOptions, checkpoint_store: CheckpointStore, *, meter_provider: Any = None,
             tracer_provider: Any = None) -> Parts:
    """Build and wire the parts of a processor with ``options`` over ``checkpoint_store``.

    Example::

        parts = assemble(ProcessorOptions.validate(source, store, factory, **keywords), store)
        parts.scope.start_loop("taker", parts.taker.run())
    """
    source, timing, clock = options.source, options.timing, options.clock
    describe = f"{options.owner_id} on {source.eventhub_name}/{options.consumer_group}"
    scope = TaskScope(options.owner_id)
    stats = ProcessorStats()
    telemetry = Telemetry(eventhub_name=source.eventhub_name, consumer_group=options.consumer_group,
                          owner_id=options.owner_id, meter_provider=meter_provider, tracer_provider=tracer_provider)
    store = BoundedStore(checkpoint_store, timeout=timing.store_timeout, clock=clock,
                         patient_timeout=timing.balancing_timeout,
                         timeouts_by_operation={"write_member": timing.heartbeat_timeout})
    if telemetry.enabled:
        store.observers.append(telemetry.store_call)
    # Nudges serve processors that plan by counts alone (they settle, see _ownership.liveness);
    # plans by load or with standbys read every member-record change already.
    writer = OwnershipWriter(store, owner_id=options.owner_id,
                             on_nudge=(lambda owners: membership.nudge(owners)) if options.plans_by_counts else None)
    history = StoreHistory()
    # The callbacks below name parts built after them: they run only once everything is built.
    table = LeaseTable(
        owner_id=options.owner_id, eventhub_name=source.eventhub_name, consumer_group=options.consumer_group,
        describe=describe, clock=clock, timing=timing, stats=stats, telemetry=telemetry,
        on_released=lambda leases: releaser.schedule(leases), on_refreshed=lambda: renewer.wake(),
        handoff_pace=(options.load_policy.max_moves, timing.interval) if options.load_policy is not None else None)
    reporter = Reporter(describe=describe, clock=clock, period=max(30.0, timing.expiration),
                        error_handler=options.error_handler, table=table, scope=scope, store=repr(checkpoint_store),
                        source_startup_timeout=options.source_startup_timeout)
    store.observers.append(reporter.outage)
    releaser = Releaser(options=options, store=store, writer=writer, table=table, history=history, stats=stats,
                        scope=scope, describe=describe)
    watchdog = Watchdog(table=table, pumps=lambda: dispatcher.pumps(), clock=clock, timing=timing, reporter=reporter,
                        telemetry=telemetry, describe=describe)
    warmup = Warmup(options=options, store=store, describe=describe) if options.stateful else None
    membership = Membership(options=options, store=store, reporter=reporter, describe=describe,
                            on_fatal=lambda error: taker.halt(error), table=table, warmup=warmup)
    renewer = LeaseRenewer(table=table, writer=writer, clock=clock, on_contested=lambda: taker.wake(),
                           on_error=lambda error, lease: reporter.report(error, [lease]), describe=options.owner_id)

    def pump_started() -> None:
        renewer.wake()
        watchdog.wake()

    dispatcher = Dispatcher(
        options=options, store=store, table=table, history=history, reporter=reporter, telemetry=telemetry,
        describe=describe, on_loop_blocked=watchdog.loop_blocked, on_pump_ended=watchdog.wake,
        on_fatal=lambda error: taker.halt(error), on_started=pump_started,
        on_records_vanished=lambda partition_id: taker.records_vanished(partition_id), warmup=warmup)
    taker = Taker(options=options, store=store, writer=writer, table=table, history=history, membership=membership,
                  on_won=dispatcher.start, last_stall=lambda: watchdog.last_stall, reporter=reporter, stats=stats,
                  telemetry=telemetry, describe=describe, warmup=warmup)
    table.per_record = lambda: taker.renewal.per_partition
    taker.renewal.on_changed = renewer.wake
    telemetry.observe(owned=lambda: len(table.owned()), lag=dispatcher.lag)
    return Parts(describe=describe, scope=scope, stats=stats, telemetry=telemetry, store=store, table=table,
                 releaser=releaser, watchdog=watchdog, warmup=warmup, membership=membership, renewer=renewer,
                 dispatcher=dispatcher, taker=taker, reporter=reporter)
