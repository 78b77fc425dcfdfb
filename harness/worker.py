"""A consumer process for multi-process tests and benchmarks: this SDK's processor, or
azure-eventhub's, reporting every delivered batch as a JSON line.

Run it as ``python -m harness.worker``; start and read it from a parent
with :func:`harness.worker_process.spawn_worker`.

``--impl ours``: an ``EventProcessor`` with ``EventHubSource`` and this SDK's
``BlobCheckpointStore``. ``--impl official``: azure-eventhub's ``EventHubConsumerClient``
with ``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``. Both read the
same hub and checkpoint every ``--checkpoint-every`` batches (or, with
``--checkpoint-events``, once that many events of a partition were delivered since its
last checkpoint), with the same batch size and prefetch. ``--checkpoint-on-close``
(official only) also checkpoints a partition's last delivered event in
``on_partition_close``, as a careful user of the official client would (this SDK's
processor does that by itself: ``PartitionProcessor.checkpoint_on_release``).

``--stateful`` (ours only): the handler counts events per key in ``context.state``
(``EventProcessor(..., stateful=True)``; the key is the event's body as text), so the
counts move with the partition and are committed with each checkpoint;
``--standbys N`` keeps N warm replicas of every partition (``StatePolicy(num_standbys=N)``);
``--state-bytes B`` pads each partition's state to about B bytes at its first claim (keys
``~pad/NNNNNN`` of 1,000-character strings: a large state for benchmarks). ``--naive``
(ours only, not with ``--stateful``) counts the same way in a plain dict, as a user
would by hand without the feature: the dict is one JSON blob per partition in the
checkpoint container, read in ``initialize`` and written before each checkpoint and in
``close``.

``--source memory`` (ours only) reads a ``InMemoryEventSource`` in this process instead,
with ``InMemoryCheckpointStore``, fed by a producer task in this process that keeps
``--backlog`` events ahead of the handler on every partition until ``--produce``
events were sent; the source retains ``--retention`` events per partition.

``--cpu-per-event SECONDS`` makes the handler CPU-bound: it spends that much of this
process's CPU time on every event (a busy loop on the thread's CPU clock, so the cost
is the same however busy the machine is), in a thread of its own, off the event loop, as
a competent user runs CPU-bound work (both sides). ``--slow-factor F`` multiplies that cost by F
when the process gets SIGUSR1 (a processor slowed down: a heavier handler, a noisy
neighbour). ``--balance-by load`` (ours only) balances by measured load
(``EventProcessor(load_policy=LoadPolicy(...))``) with the knobs the ``--load-*`` options
give.

Connection strings come from the environment (``EVENTPROCESSOR_E2E_HUB`` for the hub,
``EVENTPROCESSOR_E2E_STORAGE`` for storage) so that they never show in a process
listing. It prints JSON lines on stdout:

- ``{"event": "started", ...}`` once, with the namespace and the hub;
- ``{"event": "batch", "p": partition, "s": [first, last], "t": unix time}`` for each
  delivered batch (``--report events``), written and flushed *before* its checkpoint,
  so a SIGKILL never hides a delivery;
- ``{"event": "owned", "owned": [...]}`` when the set of dispatched partitions changes (ours);
- ``{"event": "ownership", "p": partition, "reason": ..., "epoch": ...}`` for each ownership
  change the processor logs (ours: claimed, expired, stolen, adopted, released, handed_off, ...);
- ``{"event": "stats", "events": n, "cpu": seconds, "t": unix time, "rss": bytes}`` every
  ``--stats-interval`` seconds (four times a second by default); ``rss`` is this process's
  resident set from ``/proc/self/statm`` (null where there is no ``/proc``);
- ``{"event": "load", "u": utilisation, "partitions": n, "t": unix time}`` (ours with
  ``--balance-by load``) whenever the processor samples the load it publishes;
- ``{"event": "slowed", "cpu_per_event": seconds, "t": unix time}`` when SIGUSR1 slowed it;
- ``{"event": "restored", "p": partition, "seq": ..., "counts": {...}, "warm": ..., "entries": n,
  "bytes": n, "keys": n, "t": ...}`` (``--stateful``, ``--naive``) when a claim starts, before
  its first batch: the checkpoint's sequence number it resumes from (-1: none), the
  per-key counts it restored (padding left out), and how the state was loaded (warm
  replica or not, state entries and bytes read; ``--naive``: the blob, ``ms`` to read it);
- ``{"event": "checkpoint", "p": partition, "seq": ..., "ms": ..., "t": ...}``
  (``--stateful``, ``--naive``) after each checkpoint the handler wrote (``ms``: the
  state and the checkpoint together);
- ``{"event": "first", "cpu": ..., "t": ...}`` at the first delivery and ``{"event": "done", ...}``
  when ``--expect`` events have been delivered (process CPU seconds and wall time).

SIGTERM stops it gracefully; SIGUSR1 applies ``--slow-factor``.

Example (a parent's side: :mod:`harness.worker_process`)::

    worker = await spawn_worker("p0", hub="hub", container=None, hub_connection_string=None,
                                storage_connection_string=None, log_dir="/tmp",
                                extra=["--source", "memory", "--produce", "1000"])
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import os
import signal
import sys
import time
from typing import Any

from .worker_report import OwnershipLines, Tally, emit, resident_bytes, trace_allocations

HUB_ENV = "EVENTPROCESSOR_E2E_HUB"
STORAGE_ENV = "EVENTPROCESSOR_E2E_STORAGE"

logger = logging.getLogger(__name__)

__all__ = ["HUB_ENV", "STORAGE_ENV", "emit", "resident_bytes", "main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", choices=["ours", "official"], default="ours")
    parser.add_argument("--hub", required=True)
    parser.add_argument("--container", help="blob container of the checkpoint store (not with --source memory)")
    parser.add_argument("--source", choices=["eventhub", "memory"], default="eventhub",
                        help="memory: an in-process InMemoryEventSource fed by an in-process producer (ours only)")
    parser.add_argument("--partitions", type=int, default=8, help="--source memory: partition count")
    parser.add_argument("--produce", type=int, default=0, help="--source memory: events to send in all")
    parser.add_argument("--backlog", type=int, default=1000,
                        help="--source memory: events the producer keeps ahead of the handler per partition")
    parser.add_argument("--retention", type=int, default=0,
                        help="--source memory: events retained per partition (default: 4 x --backlog)")
    parser.add_argument("--body", type=int, default=32, help="--source memory: event size in bytes")
    parser.add_argument("--owner-id", required=True)
    parser.add_argument("--consumer-group", default="$default")
    parser.add_argument("--interval", type=float, default=0.5, help="load-balancing interval, seconds")
    parser.add_argument("--expiry", type=float, default=3.0, help="ownership expiration interval, seconds")
    parser.add_argument("--strategy", choices=["balanced", "greedy"], default="greedy")
    parser.add_argument("--batch", type=int, default=300, help="max batch size")
    parser.add_argument("--prefetch", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=1, help="checkpoint every N batches")
    parser.add_argument("--checkpoint-events", type=int, default=0,
                        help="checkpoint once N events of a partition were delivered since its last checkpoint "
                             "(replaces --checkpoint-every)")
    parser.add_argument("--checkpoint-on-close", action="store_true",
                        help="official only: also checkpoint a partition's last delivered event in on_partition_close "
                             "(as a careful user would; this SDK's processor does it on release by itself)")
    parser.add_argument("--stats-interval", type=float, default=0.25, help="seconds between stats lines")
    parser.add_argument("--tracemalloc-at", type=int, default=0,
                        help="trace allocations from this many delivered events on, baseline at twice as many; at the "
                             "stop, print the allocation sites that grew since (a leak hunt; slows the process down)")
    parser.add_argument("--tracemalloc-frames", type=int, default=1,
                        help="frames kept per allocation (1: the allocating line, a few times slower; 10: who called "
                             "it, many times slower)")
    parser.add_argument("--report", choices=["events", "counts"], default="events")
    parser.add_argument("--expect", type=int, default=0, help="say 'done' (with the CPU time) at this many events")
    parser.add_argument("--work", type=float, default=0.0, help="seconds each batch spends in the handler")
    parser.add_argument("--cpu-per-event", type=float, default=0.0,
                        help="CPU seconds the handler spends on each event (a busy loop on its thread's CPU clock)")
    parser.add_argument("--slow-factor", type=float, default=1.0,
                        help="on SIGUSR1, multiply --cpu-per-event by this (a processor slowed down)")
    parser.add_argument("--balance-by", choices=["count", "load"], default="count",
                        help="ours only: balance partition counts (the default) or measured load")
    parser.add_argument("--load-threshold", type=float, help="--balance-by load: LoadPolicy.threshold")
    parser.add_argument("--load-damping", type=float, help="--balance-by load: LoadPolicy.damping")
    parser.add_argument("--load-max-moves", type=int, help="--balance-by load: LoadPolicy.max_moves")
    parser.add_argument("--load-cooldown", type=float, help="--balance-by load: LoadPolicy.cooldown, seconds")
    parser.add_argument("--load-floor", type=float, help="--balance-by load: LoadPolicy.floor")
    parser.add_argument("--stateful", action="store_true",
                        help="count events per key (the body) in context.state (EventProcessor(stateful=True))")
    parser.add_argument("--standbys", type=int, default=0,
                        help="--stateful: warm replicas per partition (num_standbys)")
    parser.add_argument("--recovery-lag", type=int, default=None,
                        help="--stateful: acceptable_recovery_lag, events (default: the processor's)")
    parser.add_argument("--state-bytes", type=int, default=0,
                        help="--stateful, --naive: pad each partition's state to about this many bytes at its first "
                             "claim")
    parser.add_argument("--naive", action="store_true",
                        help="count per key in a dict kept in one blob per partition, read at the claim and written "
                             "with each checkpoint (the way without the feature; not with --stateful)")
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="level of this SDK's log lines on stderr (INFO shows every move); others log WARNING")
    args = parser.parse_args(argv)
    if args.source == "memory" and args.impl != "ours":
        parser.error("--source memory runs this SDK's processor only (--impl ours)")
    if args.checkpoint_on_close and args.impl != "official":
        parser.error("--checkpoint-on-close is for --impl official (this SDK checkpoints on release by itself)")
    if (args.stateful or args.naive) and args.impl != "ours":
        parser.error("--stateful and --naive run this SDK's processor (--impl ours)")
    if args.stateful and args.naive:
        parser.error("--naive is the way without --stateful: give one of them")
    if args.naive and args.source != "eventhub":
        parser.error("--naive keeps its blobs in the checkpoint container: it needs --source eventhub")
    if args.standbys and not args.stateful:
        parser.error("--standbys keeps replicas of partition state: it needs --stateful")
    if args.source == "eventhub" and not args.container:
        parser.error("--container is required with --source eventhub")
    if args.balance_by != "count" and args.impl != "ours":
        parser.error("--balance-by load is for --impl ours (the official processor balances counts only)")
    if any(v is not None for v in _policy_options(args).values()) and args.balance_by != "load":
        parser.error("the --load-* options set the policy of --balance-by load")
    if args.cpu_per_event < 0 or args.slow_factor <= 0:
        parser.error("--cpu-per-event must be >= 0 and --slow-factor > 0")
    return args


def _policy_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"threshold": args.load_threshold, "damping": args.load_damping, "max_moves": args.load_max_moves,
            "cooldown": args.load_cooldown, "floor": args.load_floor}


class _CpuCost:
    """What each event costs the handler in CPU time; SIGUSR1 multiplies it (a slowdown)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.per_event = args.cpu_per_event
        self.factor = args.slow_factor
        # Starts its thread at the first use only.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cpu-cost")

    def slow_down(self) -> None:
        self.per_event *= self.factor
        emit({"event": "slowed", "cpu_per_event": self.per_event, "t": time.time()})

    def spend(self, events: int) -> None:
        """Busy-loop until this thread has used ``events`` times the cost in CPU time."""
        if self.per_event <= 0 or events <= 0:
            return
        end = time.thread_time() + self.per_event * events
        while time.thread_time() < end:
            pass

    async def spend_off_loop(self, events: int) -> None:
        """The handler's CPU work, off the event loop, as a competent user runs CPU-bound
        work (``asyncio.to_thread``): on the loop it holds the process's lease renewals
        and receivers behind it. Recorded by benchmarks.load at 5.5 ms per event: the
        processes that ran it on the loop gave up 18 and 28 leases (self-fenced) that
        their renewals reached too late. One thread per process: the handlers of its
        partitions take turns, as they do on the loop."""
        if self.per_event <= 0 or events <= 0:
            return
        await asyncio.get_running_loop().run_in_executor(self._thread, self.spend, events)


class _Cadence:
    """When a handler checkpoints: every N batches, or once N events of the partition
    were delivered since its last checkpoint (as most users write it)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.events = max(0, args.checkpoint_events)
        self.batches = max(1, args.checkpoint_every)
        self._since: dict[str, list[int]] = {}  # partition -> [batches, events] since its last checkpoint

    def due(self, partition_id: str, delivered: int) -> bool:
        since = self._since.setdefault(partition_id, [0, 0])
        since[0] += 1
        since[1] += delivered
        if (since[1] >= self.events) if self.events else (since[0] >= self.batches):
            since[0] = since[1] = 0
            return True
        return False


PAD_PREFIX = "~pad/"
"""Keys that pad a partition's state to ``--state-bytes`` (left out of the reported counts)."""
_PAD_VALUE = "x" * 1000
_PAD_ENTRY_BYTES = len(json.dumps({f"{PAD_PREFIX}000000": _PAD_VALUE}, separators=(",", ":")))  # as a snapshot holds it


def _pad(state: Any, target_bytes: int) -> None:
    """Pad ``state`` to about ``target_bytes`` of JSON, once (a state padded already stays)."""
    if target_bytes <= 0 or f"{PAD_PREFIX}000000" in state:
        return
    for index in range(max(1, target_bytes // _PAD_ENTRY_BYTES)):
        state[f"{PAD_PREFIX}{index:06d}"] = _PAD_VALUE


def _counts(state: Any) -> dict[str, Any]:
    return {key: value for key, value in state.items() if not key.startswith(PAD_PREFIX)}


async def _ours(args: argparse.Namespace, tally: Tally, stop: asyncio.Event, cost: _CpuCost) -> None:
    from eventprocessor import (
        CloseReason,
        EventProcessor,
        LoadPolicy,
        OwnershipLostError,
        PartitionProcessor,
        StatePolicy,
    )
    from eventprocessor.errors import StoreTimeoutError

    class Handler(PartitionProcessor):
        def __init__(self) -> None:
            self.cadence = _Cadence(args)  # one per claim: a partition claimed again counts afresh

        async def process_events(self, events, context):
            tally.delivered(context.partition_id, [e.sequence_number for e in events])
            await cost.spend_off_loop(len(events))
            self.count(events, context)
            if args.work:
                await asyncio.sleep(args.work)  # a handler that takes time: a stop or a handoff finds it mid-batch
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

        def count(self, events, context) -> None:
            pass

        async def checkpoint(self, context) -> None:
            await context.update_checkpoint()

    class Counting(Handler):
        """--stateful: a per-key counter in context.state, committed with each checkpoint."""

        async def initialize(self, context):
            restored, checkpoint = context.state_restored, context.last_checkpoint
            emit({"event": "restored", "p": context.partition_id,
                  "seq": checkpoint.sequence_number if checkpoint is not None else -1,
                  "counts": _counts(context.state), "warm": restored.warm, "entries": restored.entries_read,
                  "bytes": restored.bytes_read, "keys": len(context.state), "t": time.time()})
            _pad(context.state, args.state_bytes)

        def count(self, events, context) -> None:
            state = context.state
            for event in events:
                key = event.body_as_str()
                state[key] = state.get(key, 0) + 1

        async def checkpoint(self, context) -> None:
            started = time.perf_counter()
            await context.update_checkpoint()
            emit({"event": "checkpoint", "p": context.partition_id, "seq": context.last_checkpoint.sequence_number,
                  "ms": (time.perf_counter() - started) * 1000, "t": time.time()})

    class Naive(Handler):
        """--naive: the same counter as a user keeps it without the feature: a dict in
        one blob per partition, read at the claim, written before each checkpoint."""

        async def initialize(self, context):
            from azure.core.exceptions import ResourceNotFoundError

            self.blob = naive_blobs.get_blob_client(
                f"naive-state/{context.eventhub_name}/{context.consumer_group}/{context.partition_id}".lower())
            started = time.perf_counter()
            try:
                data = await (await self.blob.download_blob()).readall()
            except ResourceNotFoundError:
                data = b""
            self.state: dict[str, Any] = json.loads(data) if data else {}
            checkpoint = context.last_checkpoint
            emit({"event": "restored", "p": context.partition_id,
                  "seq": checkpoint.sequence_number if checkpoint is not None else -1, "counts": _counts(self.state),
                  "warm": False, "entries": 1 if data else 0, "bytes": len(data), "keys": len(self.state),
                  "ms": (time.perf_counter() - started) * 1000, "t": time.time()})
            _pad(self.state, args.state_bytes)

        def count(self, events, context) -> None:
            for event in events:
                key = event.body_as_str()
                self.state[key] = self.state.get(key, 0) + 1

        async def checkpoint(self, context) -> None:
            started = time.perf_counter()
            await self.blob.upload_blob(json.dumps(self.state).encode(), overwrite=True)
            await context.update_checkpoint()
            emit({"event": "checkpoint", "p": context.partition_id, "seq": context.last_checkpoint.sequence_number,
                  "ms": (time.perf_counter() - started) * 1000, "t": time.time()})

        async def close(self, reason, context):
            # A graceful end: the SDK checkpoints the last handled event after close
            # (checkpoint_on_release), so the blob is written first.
            if reason in (CloseReason.SHUTDOWN, CloseReason.HANDOFF) and hasattr(self, "state"):
                await self.blob.upload_blob(json.dumps(self.state).encode(), overwrite=True)

    naive_blobs: Any = None
    if args.naive:
        from azure.storage.blob.aio import ContainerClient

        naive_blobs = ContainerClient.from_connection_string(os.environ[STORAGE_ENV], args.container)
    handler = Counting if args.stateful else Naive if args.naive else Handler
    stateful: bool | StatePolicy = False
    if args.stateful:
        stateful = StatePolicy(num_standbys=args.standbys, **(
            {"acceptable_recovery_lag": args.recovery_lag} if args.recovery_lag is not None else {}))
    load_policy = None
    if args.balance_by == "load":
        load_policy = LoadPolicy(**{name: value for name, value in _policy_options(args).items() if value is not None})

    producer: asyncio.Task[None] | None = None
    if args.source == "memory":
        from eventprocessor.sources import InMemoryEventSource
        from eventprocessor.stores import InMemoryCheckpointStore

        memory = InMemoryEventSource(args.partitions, eventhub_name=args.hub,
                                   max_events_per_partition=args.retention or 4 * args.backlog)
        source: Any = memory
        store: Any = InMemoryCheckpointStore()
        producer = asyncio.create_task(_produce(memory, args, tally))
    else:
        from eventprocessor.sources.eventhub import EventHubSource
        from eventprocessor.stores.blob import BlobCheckpointStore

        source = EventHubSource.from_connection_string(os.environ[HUB_ENV], eventhub_name=args.hub)
        store = BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container)
    processor = EventProcessor(source, store, handler, owner_id=args.owner_id, consumer_group=args.consumer_group,
                               load_balancing_strategy=args.strategy, load_balancing_interval=args.interval,
                               partition_ownership_expiration_interval=args.expiry, max_batch_size=args.batch,
                               prefetch=args.prefetch, load_policy=load_policy, stateful=stateful)
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "ours",
           "namespace": source.fully_qualified_namespace, "eventhub": source.eventhub_name})
    try:
        await processor.start()
        last: list[str] | None = None
        load = None
        while not stop.is_set():
            owned = sorted(processor.owned_partitions, key=lambda pid: (len(pid), pid))
            if owned != last:
                emit({"event": "owned", "owned": owned, "ticks": processor.ticks, "t": time.time()})
                last = owned
            if processor.load is not load and processor.load is not None:
                load = processor.load
                emit({"event": "load", "u": round(load.utilization, 4), "partitions": len(load.partitions),
                      "t": time.time()})
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.1)
            except asyncio.TimeoutError:
                pass
    finally:
        if producer is not None:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        await processor.stop()
        await store.close()
        await source.close()
        if naive_blobs is not None:
            await naive_blobs.close()


async def _produce(source: Any, args: argparse.Namespace, tally: Tally) -> None:
    """Keep ``--backlog`` events ahead of the handler on every partition until
    ``--produce`` events were sent. Retention (several backlogs) never drops an event
    before it was delivered, so every event sent is delivered once."""
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


async def _official(args: argparse.Namespace, tally: Tally, stop: asyncio.Event, cost: _CpuCost) -> None:
    from azure.eventhub.aio import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    cadence = _Cadence(args)
    unsaved: dict[str, Any] = {}  # partition -> its last delivered event not checkpointed yet

    async def on_event_batch(context, events):
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

    async def on_partition_close(context, reason):
        event = unsaved.pop(context.partition_id, None)
        if event is not None:
            await context.update_checkpoint(event)

    store = BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container)
    client = EventHubConsumerClient.from_connection_string(
        os.environ[HUB_ENV], consumer_group=args.consumer_group, eventhub_name=args.hub, checkpoint_store=store,
        load_balancing_interval=args.interval, partition_ownership_expiration_interval=args.expiry,
        load_balancing_strategy=args.strategy)
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "official",
           "namespace": client._address.hostname, "eventhub": args.hub})
    # As documented, the official client is given no on_partition_close at all.
    close: dict[str, Any] = {"on_partition_close": on_partition_close} if args.checkpoint_on_close else {}
    async with client:
        task = asyncio.create_task(client.receive_batch(on_event_batch, max_batch_size=args.batch,
                                                        prefetch=args.prefetch, starting_position="-1",
                                                        **close))
        try:
            await stop.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    await store.close()


async def _amain(args: argparse.Namespace) -> int:
    for name in (HUB_ENV, STORAGE_ENV) if args.source == "eventhub" else ():
        if not os.environ.get(name):
            print(f"worker: {name} is not set", file=sys.stderr)
            return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    cost = _CpuCost(args)
    loop.add_signal_handler(signal.SIGUSR1, cost.slow_down)
    tally = Tally(args.report == "events", args.expect)

    def stats_line() -> dict[str, Any]:
        return {"event": "stats", "events": tally.events, "cpu": time.process_time(), "t": time.time(),
                "rss": resident_bytes()}

    async def stats() -> None:
        while True:
            emit(stats_line())
            await asyncio.sleep(args.stats_interval)

    reporter = asyncio.create_task(stats())
    tracer = asyncio.create_task(trace_allocations(args.tracemalloc_at, tally, args.tracemalloc_frames)) \
        if args.tracemalloc_at else None
    try:
        await (_ours if args.impl == "ours" else _official)(args, tally, stop, cost)
    finally:
        reporter.cancel()
        if tracer is not None:
            tracer.cancel()
            await asyncio.gather(tracer, return_exceptions=True)
    emit(stats_line())
    emit({"event": "stopped", "owner": args.owner_id})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    level = logging.getLevelName(args.log_level)
    logging.getLogger().handlers[0].setLevel(level)
    logging.getLogger("eventprocessor").setLevel(min(level, logging.INFO))
    if args.impl == "ours":
        logging.getLogger("eventprocessor").addHandler(OwnershipLines())
    return asyncio.run(_amain(args))


if __name__ == "__main__":
    sys.exit(main())
