"""One processor of the scale benchmark, in its own OS process: this SDK's or the official one.

``--impl ours``: an ``EventProcessor`` with this SDK's ``BlobCheckpointStore`` and a
``InMemoryEventSource`` of ``--partitions`` partitions (no events: only ownership is
measured). ``--impl official``: azure-eventhub's own ``EventProcessor`` class
(``azure.eventhub.aio._eventprocessor.event_processor``, the one ``EventHubConsumerClient``
runs: its ``OwnershipManager``, its load-balancing loop, its per-partition tasks) with
``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``, given a stand-in
client that reports the same partition ids and opens idle consumers instead of AMQP
links. Both write the same blob layout; every HTTP request is counted at the transport.

The storage connection string comes from the environment (``EVENTPROCESSOR_SCALE_STORAGE``),
never from argv. The worker imports everything, prints ``{"event": "ready"}``, and starts
its processor when a line arrives on stdin, so that start-up imports are not measured
and all processors start together. Then it prints a ``state`` JSON line every
``--report-every`` seconds:

``t`` (unix time), ``cpu`` (process CPU seconds since "go"), ``requests`` (HTTP requests
since "go"), ``owned`` (the partitions it dispatches; only when that set changed),
``count``, ``ticks``, ``overruns``, ``overrun_warnings`` (WARNING lines logged about
overrunning ticks), ``max_tick``, ``missed_renewals``, ``renewals``, ``failed_renewals``,
``claims``, ``lost``; for ours also ``self_fenced``.

``missed_renewals``, ``renewals`` and ``failed_renewals`` are measured the same way for
both processors, by :class:`RenewalWatch` around the store's ``claim_ownership`` (the
one call through which both write ownership records): a missed renewal is a partition
the processor still dispatched (ours: ``owned_partitions``; the official: a receive task
alive) more than the expiration after the last write of its ownership record that this
processor sent and the store accepted, sampled every 0.1 s; past that point another
processor may claim it. The time is when the write was sent, so the count errs toward
"missed". ``self_fenced`` (ours) counts leases it gave up because no renewal succeeded
in time: the safety net that keeps its missed renewals at 0. ``overruns`` for the
official side are measured here (ticks longer than the interval); it logs nothing
about them.

SIGTERM stops it gracefully (releasing ownership), then it prints ``stopped``.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from harness.worker_report import emit as _emit

STORAGE_ENV = "EVENTPROCESSOR_SCALE_STORAGE"
NAMESPACE = "scale.servicebus.windows.net"

logger = logging.getLogger("scale_worker")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", choices=["ours", "official"], required=True)
    parser.add_argument("--container", required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--owner-id", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--interval", type=float, required=True, help="load-balancing interval, seconds")
    parser.add_argument("--expiry", type=float, required=True, help="ownership expiration, seconds")
    parser.add_argument("--strategy", choices=["balanced", "greedy"], default="greedy")
    parser.add_argument("--renewal-age", type=float, default=None, help="ours: ownership_renewal_age, seconds")
    parser.add_argument("--operation-timeout", type=float, default=None,
                        help="ours: the Blob store's operation_timeout, seconds (default: the store's)")
    parser.add_argument("--report-every", type=float, default=0.5)
    parser.add_argument("--lifetime", type=float, default=0.0,
                        help="stop by itself this many seconds after starting (0: never), should the parent not")
    return parser.parse_args(argv)


class _OverrunWarnings(logging.Handler):
    """Counts the processor's WARNING lines about ticks longer than the interval."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "load-balancing tick took" in record.getMessage():
            self.count += 1


class _Side:
    """What the reporter reads from either processor."""

    owned: Callable[[], set[str]]
    counters: Callable[[], dict[str, Any]]


class RenewalWatch:
    """Renewals and missed renewals of one processor, by the same rule for both SDKs.

    :meth:`wrap` goes around the store's ``claim_ownership``: the time a write of one of
    this processor's records was sent is kept when the store accepts it. :meth:`watch`
    samples what the processor dispatches every 0.1 s and counts a partition as one missed
    renewal when it is still dispatched more than ``expiry`` after that time (for ours,
    after the later of that time and its last heartbeat that keeps every partition,
    :meth:`wrap_member`)."""

    def __init__(self, owner_id: str, expiry: float, owned: Callable[[], set[str]],
                 field: Callable[[Any, str], Any]) -> None:
        self.owner_id = owner_id
        self.expiry = expiry
        self.owned = owned
        self.field = field  # how to read a record's field (dicts for the official, Ownership for ours)
        self.written: dict[str, float] = {}  # partition -> monotonic send time of its last accepted write
        self.heartbeat: float | None = None  # send time of the last accepted member record that keeps them all
        self.lapsed: set[str] = set()
        self.missed = self.renewals = self.failed_renewals = 0

    def wrap(self, claim: Callable[..., Any]) -> Callable[..., Any]:
        async def counted_claim(ownerships: Any, **kwargs: Any) -> Any:
            records = list(ownerships)
            sent_at = time.monotonic()
            wanted = {self.field(r, "partition_id") for r in records if self.field(r, "owner_id") == self.owner_id}
            had = {pid for pid in wanted if pid in self.written}
            won = list(await claim(records, **kwargs))
            mine = {self.field(r, "partition_id") for r in won if self.field(r, "owner_id") == self.owner_id}
            for pid in mine:
                self.written[pid] = sent_at
            self.renewals += len(had & mine)
            self.failed_renewals += len(had - mine)
            return won

        return counted_claim

    def wrap_member(self, write_member: Callable[..., Any]) -> Callable[..., Any]:
        """Ours: a member record with ``lease=member`` the store accepted keeps every
        partition of the processor, as a write of each record would."""
        async def counted_heartbeat(member: Any) -> Any:
            sent_at = time.monotonic()
            written = await write_member(member)
            if member.properties.get("lease") == "member":
                self.heartbeat = sent_at
            return written

        return counted_heartbeat

    async def watch(self) -> None:
        while True:
            now = time.monotonic()
            for pid in self.owned():
                last = self.written.get(pid)
                if last is not None and self.heartbeat is not None:
                    last = max(last, self.heartbeat)
                if last is not None and now - last > self.expiry:
                    if pid not in self.lapsed:
                        self.lapsed.add(pid)
                        self.missed += 1
                else:
                    self.lapsed.discard(pid)
            await asyncio.sleep(0.1)

    def counters(self) -> dict[str, int]:
        return {"missed_renewals": self.missed, "renewals": self.renewals, "failed_renewals": self.failed_renewals}


async def _ours(args: argparse.Namespace, transport: Any, go: asyncio.Event, stop: asyncio.Event,
                side: _Side) -> None:
    from eventprocessor import EventProcessor, PartitionProcessor
    from eventprocessor.sources.memory import InMemoryEventSource
    from eventprocessor.stores.blob import BlobCheckpointStore

    class Idle(PartitionProcessor):
        async def process_events(self, events, context):  # type: ignore[no-untyped-def]
            pass

    warnings = _OverrunWarnings()
    logging.getLogger("eventprocessor").addHandler(warnings)
    source = InMemoryEventSource(args.partitions, eventhub_name=args.hub, fully_qualified_namespace=NAMESPACE)
    options: dict[str, Any] = {} if args.operation_timeout is None else {"operation_timeout": args.operation_timeout}
    store = BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container, transport=transport,
                                                       **options)
    processor = EventProcessor(source, store, Idle, owner_id=args.owner_id, load_balancing_strategy=args.strategy,
                               load_balancing_interval=args.interval,
                               partition_ownership_expiration_interval=args.expiry,
                               ownership_renewal_age=args.renewal_age)

    watch = RenewalWatch(args.owner_id, args.expiry, lambda: set(processor.owned_partitions), getattr)
    store.claim_ownership = watch.wrap(store.claim_ownership)  # type: ignore[method-assign]
    store.write_member = watch.wrap_member(store.write_member)  # type: ignore[method-assign]

    def counters() -> dict[str, Any]:
        stats = processor.stats
        return {"ticks": stats.ticks, "overruns": stats.overruns, "overrun_warnings": warnings.count,
                "max_tick": round(stats.max_tick_duration, 3), **watch.counters(), "self_fenced": stats.self_fenced,
                "claims": stats.claims_won, "lost": stats.lost, "store_calls": dict(processor.store_calls.calls),
                "store_timeouts": sum(processor.store_calls.timeouts.values()),
                "backed_off": stats.backed_off_ticks, "backoff_level": stats.backoff_level,
                "skipped_listings": stats.skipped_listings}

    side.owned = lambda: set(processor.owned_partitions)
    side.counters = counters
    await go.wait()
    await processor.start()
    watcher = asyncio.create_task(watch.watch())
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        await processor.stop()
        await store.close()
        await asyncio.gather(watcher, return_exceptions=True)


class _IdleConsumer:
    """What the official processor's per-partition task awaits instead of an AMQP link."""

    async def receive(self, *_args: Any) -> None:
        await asyncio.Event().wait()  # until cancelled

    async def close(self) -> None:
        pass


class _StandInClient:
    """The parts of ``EventHubConsumerClient`` the official ``EventProcessor`` uses."""

    def __init__(self, namespace: str, eventhub_name: str, partitions: int) -> None:
        self._address = argparse.Namespace(hostname=namespace)
        self.eventhub_name = eventhub_name
        self._partition_ids = [str(i) for i in range(partitions)]

    async def get_partition_ids(self) -> list[str]:
        return list(self._partition_ids)

    def _create_consumer(self, *_args: Any, **_kwargs: Any) -> _IdleConsumer:
        return _IdleConsumer()


async def _official(args: argparse.Namespace, transport: Any, go: asyncio.Event, stop: asyncio.Event,
                    side: _Side) -> None:
    from azure.eventhub import LoadBalancingStrategy
    from azure.eventhub.aio._eventprocessor.event_processor import EventProcessor as OfficialEventProcessor
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    store = BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container, transport=transport)

    async def on_event(_context: Any, _event: Any) -> None:
        pass

    processor = OfficialEventProcessor(
        _StandInClient(NAMESPACE, args.hub, args.partitions), "$default", on_event,  # type: ignore[arg-type]
        checkpoint_store=store,
        load_balancing_interval=args.interval, partition_ownership_expiration_interval=args.expiry,
        load_balancing_strategy=LoadBalancingStrategy(args.strategy))
    manager = processor._ownership_manager
    processor._id = manager.owner_id = args.owner_id  # as EventHubConsumerClient names it, for the final check
    tally: dict[str, Any] = {"ticks": 0, "overruns": 0, "max_tick": 0.0, "claims": 0, "lost": 0}
    tick_started: list[float] = []

    def held() -> set[str]:
        return {pid for pid, task in processor._tasks.items() if not task.done()}

    watch = RenewalWatch(args.owner_id, args.expiry, held, lambda record, name: record.get(name))
    store.claim_ownership = watch.wrap(store.claim_ownership)  # type: ignore[method-assign]

    balance = manager.claim_ownership

    async def timed_tick() -> list[str]:
        # One tick of the official loop: this call, and get_checkpoints when it claimed new ones.
        tally["ticks"] += 1
        tick_started[:] = [time.monotonic()]
        return await balance()

    manager.claim_ownership = timed_tick  # type: ignore[method-assign,assignment]

    def tick_ended() -> None:
        if tick_started:
            duration = time.monotonic() - tick_started.pop()
            tally["max_tick"] = round(max(tally["max_tick"], duration), 3)
            tally["overruns"] += duration > args.interval

    create_tasks = processor._create_tasks_for_claimed_ownership
    cancel = processor._cancel_tasks_for_partitions

    def counted_create(claimed: Any, checkpoints: Any = None) -> None:
        tally["claims"] += len(set(claimed) - set(processor._tasks))
        create_tasks(claimed, checkpoints)

    async def counted_cancel(partitions: Any) -> None:
        partitions = list(partitions)
        tally["lost"] += len([pid for pid in partitions if pid in processor._tasks]) if processor._running else 0
        tick_ended()  # the loop cancels (possibly nothing) at the end of every tick
        await cancel(partitions)

    processor._create_tasks_for_claimed_ownership = counted_create  # type: ignore[method-assign,assignment]
    processor._cancel_tasks_for_partitions = counted_cancel  # type: ignore[method-assign,assignment]

    side.owned = held
    side.counters = lambda: dict(tally, overrun_warnings=0, **watch.counters())
    await go.wait()
    running = asyncio.create_task(processor.start())
    watcher = asyncio.create_task(watch.watch())
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        try:
            await asyncio.wait_for(processor.stop(), 30)
        except asyncio.TimeoutError:
            logger.warning("the official processor did not stop within 30 s")
        running.cancel()
        await asyncio.gather(running, watcher, return_exceptions=True)
        await store.close()


async def _amain(args: argparse.Namespace) -> int:
    if not os.environ.get(STORAGE_ENV):
        print(f"scale_worker: {STORAGE_ENV} is not set", file=sys.stderr)
        return 2
    from .store_bench import CountingTransport

    loop = asyncio.get_running_loop()
    go, stop = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    transport = CountingTransport()
    side = _Side()
    side.owned, side.counters = set, dict
    run = asyncio.create_task((_ours if args.impl == "ours" else _official)(args, transport, go, stop, side))
    await asyncio.sleep(0)
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:  # a daemon thread: it never holds up the exit
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, "")

    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()
    _emit({"event": "ready", "owner": args.owner_id, "pid": os.getpid()})
    if not await lines.get():  # the parent went away before "go"
        stop.set()
        go.set()
        await run
        return 1

    async def parent_gone() -> None:
        while await lines.get():
            pass
        logger.warning("stdin closed: the parent is gone; stopping")
        stop.set()

    lag = [0.0]

    async def watch_loop() -> None:  # how late a 0.1 s sleep wakes: the longest stall of the event loop
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.1)
            lag[0] = max(lag[0], time.monotonic() - before - 0.1)

    watchers = [asyncio.create_task(parent_gone()), asyncio.create_task(watch_loop())]
    if args.lifetime:
        loop.call_later(args.lifetime, stop.set)
    cpu0, requests0 = time.process_time(), transport.total
    go.set()
    last_owned: set[str] | None = None

    def state() -> dict[str, Any]:
        nonlocal last_owned
        owned = side.owned()
        record: dict[str, Any] = {"event": "state", "t": time.time(), "cpu": round(time.process_time() - cpu0, 3),
                                  "requests": transport.total - requests0, "count": len(owned),
                                  "loop_lag": round(lag[0], 3),
                                  **side.counters()}
        if owned != last_owned:
            record["owned"] = sorted(owned, key=int)
            last_owned = owned
        return record

    try:
        while not stop.is_set() and not run.done():
            _emit(state())
            try:
                await asyncio.wait_for(stop.wait(), args.report_every)
            except asyncio.TimeoutError:
                pass
        _emit(state())
    finally:
        stop.set()
        await run
        for watcher in watchers:
            watcher.cancel()
    _emit({"event": "stopped", "owner": args.owner_id})
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_amain(_parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
