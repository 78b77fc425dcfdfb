"""``--impl ours``: this SDK's ``EventProcessor`` in the worker, with its handlers.

The handler reports each batch (:class:`~harness.worker.report.Tally`) before anything
else, spends ``--cpu-per-event`` off the loop and ``--work`` on it, and checkpoints at the
``--checkpoint-*`` cadence. ``--stateful`` counts per key in ``context.state``
(:class:`Counting`); ``--naive`` counts the same way in one blob per partition, as a user
would by hand without the feature (:class:`Naive`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

from eventprocessor import CloseReason, EventProcessor, LoadPolicy, OwnershipLostError, PartitionProcessor, StatePolicy
from eventprocessor.errors import StoreTimeoutError

from .handlers import Cadence, counts, pad
from .names import HUB_ENV, STANDIN_NAMESPACE, STORAGE_ENV
from .report import RenewalWatch, emit
from .run import Worker

__all__ = ["Counting", "Handler", "Naive", "run"]


class Handler(PartitionProcessor):
    """Reports every batch, spends the handler's CPU and time, checkpoints at the cadence."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.cadence = Cadence(worker.args)  # one per claim: a partition claimed again counts afresh

    async def process_events(self, events: Any, context: Any) -> None:
        worker = self.worker
        worker.tally.delivered(context.partition_id, [e.sequence_number for e in events])
        await worker.cost.spend_off_loop(len(events))
        self.count(events, context)
        if worker.args.work:
            await asyncio.sleep(worker.args.work)  # a handler that takes time: a stop or a handoff finds it mid-batch
        if self.cadence.due(context.partition_id, len(events)):
            try:
                await self.checkpoint(context)
            except OwnershipLostError:
                pass  # the next owner resumes from its own checkpoint
            except StoreTimeoutError:
                # The batch was processed: failing it would have it delivered again. The
                # next checkpoint covers this one (the official processor does not redeliver a
                # batch whose handler failed either).
                emit({"event": "checkpoint_timeout", "partition": context.partition_id, "t": time.time()})

    def count(self, events: Any, context: Any) -> None:
        pass

    async def checkpoint(self, context: Any) -> None:
        await context.update_checkpoint()


class Counting(Handler):
    """``--stateful``: a per-key counter in ``context.state``, committed with each checkpoint."""

    async def initialize(self, context: Any) -> None:
        restored, checkpoint = context.state_restored, context.last_checkpoint
        emit({"event": "restored", "p": context.partition_id,
              "seq": checkpoint.sequence_number if checkpoint is not None else -1,
              "counts": counts(context.state), "warm": restored.warm, "entries": restored.entries_read,
              "bytes": restored.bytes_read, "keys": len(context.state), "t": time.time()})
        pad(context.state, self.worker.args.state_bytes)

    def count(self, events: Any, context: Any) -> None:
        state = context.state
        for event in events:
            key = event.body_as_str()
            state[key] = state.get(key, 0) + 1

    async def checkpoint(self, context: Any) -> None:
        started = time.perf_counter()
        await context.update_checkpoint()
        emit({"event": "checkpoint", "p": context.partition_id, "seq": context.last_checkpoint.sequence_number,
              "ms": (time.perf_counter() - started) * 1000, "t": time.time()})


class Naive(Handler):
    """``--naive``: the same counter as a user keeps it without the feature: a dict in one
    blob per partition, read at the claim, written before each checkpoint."""

    def __init__(self, worker: Worker, blobs: Any) -> None:
        super().__init__(worker)
        self.blobs = blobs
        self.state: dict[str, Any] = {}

    async def initialize(self, context: Any) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        self.blob = self.blobs.get_blob_client(
            f"naive-state/{context.eventhub_name}/{context.consumer_group}/{context.partition_id}".lower())
        started = time.perf_counter()
        try:
            data = await (await self.blob.download_blob()).readall()
        except ResourceNotFoundError:
            data = b""
        self.state = json.loads(data) if data else {}
        checkpoint = context.last_checkpoint
        emit({"event": "restored", "p": context.partition_id,
              "seq": checkpoint.sequence_number if checkpoint is not None else -1, "counts": counts(self.state),
              "warm": False, "entries": 1 if data else 0, "bytes": len(data), "keys": len(self.state),
              "ms": (time.perf_counter() - started) * 1000, "t": time.time()})
        pad(self.state, self.worker.args.state_bytes)

    def count(self, events: Any, context: Any) -> None:
        for event in events:
            key = event.body_as_str()
            self.state[key] = self.state.get(key, 0) + 1

    async def checkpoint(self, context: Any) -> None:
        started = time.perf_counter()
        await self.blob.upload_blob(json.dumps(self.state).encode(), overwrite=True)
        await context.update_checkpoint()
        emit({"event": "checkpoint", "p": context.partition_id, "seq": context.last_checkpoint.sequence_number,
              "ms": (time.perf_counter() - started) * 1000, "t": time.time()})

    async def close(self, reason: Any, context: Any) -> None:
        # A graceful end: the SDK checkpoints the last handled event after close
        # (checkpoint_on_release), so the blob is written first.
        if reason in (CloseReason.SHUTDOWN, CloseReason.HANDOFF) and hasattr(self, "blob"):
            await self.blob.upload_blob(json.dumps(self.state).encode(), overwrite=True)


class _OverrunWarnings(logging.Handler):
    """Counts the processor's WARNING lines about ticks longer than the interval."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "load-balancing tick took" in record.getMessage():
            self.count += 1


def _source(worker: Worker) -> Any:
    args = worker.args
    if args.source == "eventhub":
        from eventprocessor.sources.eventhub import EventHubSource

        return EventHubSource.from_connection_string(os.environ[HUB_ENV], eventhub_name=args.hub)
    from eventprocessor.sources import InMemoryEventSource

    if args.source == "none":
        return InMemoryEventSource(args.partitions, eventhub_name=args.hub, fully_qualified_namespace=STANDIN_NAMESPACE)
    return InMemoryEventSource(args.partitions, eventhub_name=args.hub,
                             max_events_per_partition=args.retention or 4 * args.backlog)


def _store(worker: Worker) -> Any:
    args = worker.args
    if args.store == "memory":
        from eventprocessor.stores import InMemoryCheckpointStore

        return InMemoryCheckpointStore()
    from eventprocessor.stores.blob import BlobCheckpointStore

    options: dict[str, Any] = {} if worker.transport is None else {"transport": worker.transport}
    if args.operation_timeout is not None:
        options["operation_timeout"] = args.operation_timeout
    return BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container, **options)


def _processor(worker: Worker, source: Any, store: Any, naive_blobs: Any) -> EventProcessor:
    args = worker.args
    handler: Any = (lambda: Counting(worker)) if args.stateful else (lambda: Naive(worker, naive_blobs)) \
        if args.naive else (lambda: Handler(worker))
    options: dict[str, Any] = {}
    if args.stateful:
        options["stateful"] = StatePolicy(num_standbys=args.standbys, **(
            {"acceptable_recovery_lag": args.recovery_lag} if args.recovery_lag is not None else {}))
    if args.balance_by == "load":
        options["load_policy"] = LoadPolicy(**{name: value for name, value in worker.policy.items()
                                               if value is not None})
    if args.renewal_age is not None:
        options["ownership_renewal_age"] = args.renewal_age
    if args.group_join_delay is not None:
        options["group_join_delay"] = args.group_join_delay or None
    return EventProcessor(source, store, handler, owner_id=args.owner_id, consumer_group=args.consumer_group,
                          load_balancing_strategy=args.strategy, load_balancing_interval=args.interval,
                          partition_ownership_expiration_interval=args.expiry, max_batch_size=args.batch,
                          prefetch=args.prefetch, **options)


def _probe(worker: Worker, processor: EventProcessor, store: Any) -> RenewalWatch:
    """What the state lines report: ownership, the processor's counters, renewals by the
    rule both SDKs are measured with (:class:`~harness.worker.report.RenewalWatch`)."""
    warnings = _OverrunWarnings()
    logging.getLogger("eventprocessor").addHandler(warnings)
    watch = RenewalWatch(worker.args.owner_id, worker.args.expiry, lambda: set(processor.owned_partitions), getattr)
    store.claim_ownership = watch.wrap(store.claim_ownership)
    store.write_member = watch.wrap_member(store.write_member)

    def counters() -> dict[str, Any]:
        stats = processor.stats
        return {"ticks": stats.ticks, "overruns": stats.overruns, "overrun_warnings": warnings.count,
                "max_tick": round(stats.max_tick_duration, 3), **watch.counters(), "self_fenced": stats.self_fenced,
                "claims": stats.claims_won, "lost": stats.lost, "store_calls": dict(processor.store_calls.calls),
                "store_timeouts": sum(processor.store_calls.timeouts.values()),
                "backed_off": stats.backed_off_ticks, "backoff_level": stats.backoff_level,
                "skipped_listings": stats.skipped_listings, "handed_off": stats.handed_off}

    worker.probe.owned = lambda: set(processor.owned_partitions)
    worker.probe.counters = counters
    return watch


async def _report_ownership(worker: Worker, processor: EventProcessor) -> None:
    """``owned`` lines (on a change, or every ``--owned-every`` seconds) and ``load`` lines."""
    last: list[str] | None = None
    last_at = 0.0
    load = None
    while not worker.stop.is_set():
        owned = sorted(processor.owned_partitions, key=lambda pid: (len(pid), pid))
        now = time.monotonic()
        if owned != last or (worker.args.owned_every and now - last_at >= worker.args.owned_every):
            emit({"event": "owned", "owned": owned, "ticks": processor.ticks, "t": time.time()})
            last, last_at = owned, now
        if processor.load is not load and processor.load is not None:
            load = processor.load
            emit({"event": "load", "u": round(load.utilization, 4), "partitions": len(load.partitions),
                  "t": time.time()})
        try:
            await asyncio.wait_for(worker.stop.wait(), timeout=0.1)
        except asyncio.TimeoutError:
            pass


async def run(worker: Worker) -> None:
    """Run this SDK's processor until ``worker.stop`` (after ``worker.go``)."""
    args = worker.args
    naive_blobs: Any = None
    if args.naive:
        from azure.storage.blob.aio import ContainerClient

        naive_blobs = ContainerClient.from_connection_string(os.environ[STORAGE_ENV], args.container)
    source, store = _source(worker), _store(worker)
    processor = _processor(worker, source, store, naive_blobs)
    watch = _probe(worker, processor, store) if args.state_every else None
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "ours",
          "namespace": source.fully_qualified_namespace, "eventhub": source.eventhub_name})
    producer: asyncio.Task[None] | None = None
    watcher: asyncio.Task[None] | None = None
    started = False
    try:
        if not await worker.set_up():
            return
        if args.source == "memory":
            producer = asyncio.create_task(_produce(source, worker))
        started = True
        await processor.start()
        if watch is not None:
            watcher = asyncio.create_task(watch.watch())
        await _report_ownership(worker, processor)
    finally:
        for task in (producer, watcher):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if started:
            await processor.stop()
        await store.close()
        await source.close()
        if naive_blobs is not None:
            await naive_blobs.close()


async def _produce(source: Any, worker: Worker) -> None:
    """Keep ``--backlog`` events ahead of the handler on every partition until
    ``--produce`` events were sent. Retention (several backlogs) never drops an event
    before it was delivered, so every event sent is delivered once."""
    args, tally = worker.args, worker.tally
    body = b"x" * args.body
    partitions = [str(p) for p in range(args.partitions)]
    sent = 0
    while sent < args.produce:
        tally.progress.clear()
        for pid in partitions:
            ahead = source.last_sequence_number(pid) - tally.newest.get(pid, -1)
            for _ in range(min(args.backlog - ahead, args.produce - sent)):
                source.append(body, partition_id=pid)
                sent += 1
        try:
            await asyncio.wait_for(tally.progress.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
    emit({"event": "produced", "events": sent, "t": time.time()})
