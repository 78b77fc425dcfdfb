"""``--impl official``: azure-eventhub's processor in the worker, with
``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``.

On a hub (``--source eventhub``) it is ``EventHubConsumerClient.receive_batch`` as its
documentation writes it, the same handler as ours (report, CPU, cadence) and, with
``--checkpoint-on-close``, a checkpoint of the last delivered event in
``on_partition_close``. Without a hub (``--source none``) it is the official
``EventProcessor`` class itself (its ``OwnershipManager``, its load-balancing loop, its
per-partition tasks) over a :class:`~harness.standin_client.StandInClient`, instrumented
for the state lines: its ticks and their length, claims, losses, and renewals by the rule
ours is measured with.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from harness.standin_client import StandInClient

from .handlers import Cadence
from .names import HUB_ENV, STANDIN_NAMESPACE, STORAGE_ENV
from .report import RenewalWatch, emit
from .run import Worker

__all__ = ["run"]

logger = logging.getLogger(__name__)


def _store(worker: Worker) -> Any:
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    options: dict[str, Any] = {} if worker.transport is None else {"transport": worker.transport}
    return BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], worker.args.container, **options)


async def run(worker: Worker) -> None:
    """Run the official processor until ``worker.stop`` (after ``worker.go``)."""
    if worker.args.source == "none":
        await _without_hub(worker)
    else:
        await _on_hub(worker)


async def _on_hub(worker: Worker) -> None:
    from azure.eventhub.aio import EventHubConsumerClient

    args, tally, cost = worker.args, worker.tally, worker.cost
    cadence = Cadence(args)
    unsaved: dict[str, Any] = {}  # partition -> its last delivered event not checkpointed yet

    async def on_event_batch(context: Any, events: Any) -> None:
        if not events:
            return
        tally.delivered(context.partition_id, [e.sequence_number for e in events])
        await cost.spend_off_loop(len(events))
        if args.checkpoint_on_close:
            unsaved[context.partition_id] = events[-1]
        if args.work:
            await asyncio.sleep(args.work)
        if cadence.due(context.partition_id, len(events)):
            await context.update_checkpoint(events[-1])
            unsaved.pop(context.partition_id, None)

    async def on_partition_close(context: Any, reason: Any) -> None:
        event = unsaved.pop(context.partition_id, None)
        if event is not None:
            await context.update_checkpoint(event)

    store = _store(worker)
    client = EventHubConsumerClient.from_connection_string(
        os.environ[HUB_ENV], consumer_group=args.consumer_group, eventhub_name=args.hub, checkpoint_store=store,
        load_balancing_interval=args.interval, partition_ownership_expiration_interval=args.expiry,
        load_balancing_strategy=args.strategy)
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "official",
          "namespace": client._address.hostname, "eventhub": args.hub})
    # As documented, the official client is given no on_partition_close at all.
    close: dict[str, Any] = {"on_partition_close": on_partition_close} if args.checkpoint_on_close else {}
    async with client:
        if await worker.set_up():
            task = asyncio.create_task(client.receive_batch(on_event_batch, max_batch_size=args.batch,
                                                            prefetch=args.prefetch, starting_position="-1",
                                                            **close))
            try:
                await worker.stop.wait()
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    await store.close()


class _Ticks:
    """The official loop's ticks, timed: one tick is its ``claim_ownership`` call, then
    ``get_checkpoints`` when it claimed new partitions, up to the cancellation (possibly
    of nothing) that ends every tick. It logs nothing about ticks longer than the interval."""

    def __init__(self, processor: Any, interval: float) -> None:
        self.processor = processor
        self.interval = interval
        self.tally: dict[str, Any] = {"ticks": 0, "overruns": 0, "max_tick": 0.0, "claims": 0, "lost": 0}
        self._started: list[float] = []

    def held(self) -> set[str]:
        return {pid for pid, task in self.processor._tasks.items() if not task.done()}

    def instrument(self) -> None:
        processor = self.processor
        manager = processor._ownership_manager
        balance = manager.claim_ownership
        create_tasks = processor._create_tasks_for_claimed_ownership
        cancel = processor._cancel_tasks_for_partitions

        async def timed_tick() -> list[str]:
            self.tally["ticks"] += 1
            self._started[:] = [time.monotonic()]
            return await balance()

        def counted_create(claimed: Any, checkpoints: Any = None) -> None:
            self.tally["claims"] += len(set(claimed) - set(processor._tasks))
            create_tasks(claimed, checkpoints)

        async def counted_cancel(partitions: Any) -> None:
            partitions = list(partitions)
            self.tally["lost"] += len([pid for pid in partitions if pid in processor._tasks]) \
                if processor._running else 0
            self._ended()  # the loop cancels (possibly nothing) at the end of every tick
            await cancel(partitions)

        manager.claim_ownership = timed_tick
        processor._create_tasks_for_claimed_ownership = counted_create
        processor._cancel_tasks_for_partitions = counted_cancel

    def _ended(self) -> None:
        if self._started:
            duration = time.monotonic() - self._started.pop()
            self.tally["max_tick"] = round(max(self.tally["max_tick"], duration), 3)
            self.tally["overruns"] += duration > self.interval


async def _without_hub(worker: Worker) -> None:
    from azure.eventhub import LoadBalancingStrategy
    from azure.eventhub.aio._eventprocessor.event_processor import EventProcessor as OfficialEventProcessor

    args = worker.args
    store = _store(worker)
    partition_ids = [str(i) for i in range(args.partitions)]

    async def on_event(_context: Any, _event: Any) -> None:
        pass

    processor = OfficialEventProcessor(
        StandInClient(STANDIN_NAMESPACE, args.hub, lambda: partition_ids), args.consumer_group,  # type: ignore[arg-type]
        on_event, checkpoint_store=store, load_balancing_interval=args.interval,
        partition_ownership_expiration_interval=args.expiry,
        load_balancing_strategy=LoadBalancingStrategy(args.strategy))
    # As EventHubConsumerClient names it, so that the store's records name this worker.
    processor._id = processor._ownership_manager.owner_id = args.owner_id
    ticks = _Ticks(processor, args.interval)
    ticks.instrument()
    watch = RenewalWatch(args.owner_id, args.expiry, ticks.held, lambda record, name: record.get(name))
    store.claim_ownership = watch.wrap(store.claim_ownership)
    worker.probe.owned = ticks.held
    worker.probe.counters = lambda: dict(ticks.tally, overrun_warnings=0, **watch.counters())
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "official",
          "namespace": STANDIN_NAMESPACE, "eventhub": args.hub})
    if not await worker.set_up():
        await store.close()
        return
    running = asyncio.create_task(processor.start())
    watcher = asyncio.create_task(watch.watch())
    try:
        await worker.stop.wait()
    finally:
        watcher.cancel()
        try:
            await asyncio.wait_for(processor.stop(), 30)
        except asyncio.TimeoutError:
            logger.warning("the official processor did not stop within 30 s")
        running.cancel()
        await asyncio.gather(running, watcher, return_exceptions=True)
        await store.close()
