"""One consumer process of the end-to-end and soak runs: this SDK's processor, or the official one.

``--impl ours``: an ``EventProcessor`` with ``EventHubSource`` and this SDK's
``BlobCheckpointStore``. ``--impl official``: azure-eventhub's ``EventHubConsumerClient``
with ``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``. Both read the
same hub and checkpoint every ``--checkpoint-every`` batches (or, with
``--checkpoint-events``, once that many events of a partition were delivered since its
last checkpoint), with the same batch size and prefetch. Used by ``benchmarks/e2e.py``,
``benchmarks/soak.py``, ``benchmarks/moves.py`` and ``tests/test_eventhub_e2e.py``.

``--source memory`` (ours only) reads a ``MemoryEventSource`` in this process instead,
with ``InMemoryCheckpointStore``, fed by a producer task in this process that keeps
``--backlog`` events ahead of the handler on every partition until ``--produce``
events were sent; the source retains ``--retention`` events per partition.

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
- ``{"event": "first", "cpu": ..., "t": ...}`` at the first delivery and ``{"event": "done", ...}``
  when ``--expect`` events have been delivered (process CPU seconds and wall time).

SIGTERM stops it gracefully.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional

HUB_ENV = "EVENTPROCESSOR_E2E_HUB"
STORAGE_ENV = "EVENTPROCESSOR_E2E_STORAGE"

logger = logging.getLogger("e2e_worker")


def _emit(record: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: Optional[int] = None) -> Optional[int]:
    """A process's resident set size in bytes, from ``/proc/<pid>/statm`` (Linux), or None."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


class _Tally:
    """What this process delivered: counts for the stats line, and the batch lines."""

    def __init__(self, report_events: bool, expect: int) -> None:
        self.report_events = report_events
        self.expect = expect
        self.events = 0
        self.newest: Dict[str, int] = {}  # partition -> highest sequence number delivered
        self.progress = asyncio.Event()  # set at each delivery (the in-process producer waits on it)

    def delivered(self, partition_id: str, sequence_numbers: List[int]) -> None:
        if sequence_numbers:
            self.newest[partition_id] = max(self.newest.get(partition_id, -1), sequence_numbers[-1])
            self.progress.set()
        if self.events == 0:
            _emit({"event": "first", "cpu": time.process_time(), "t": time.time()})
        self.events += len(sequence_numbers)
        if self.expect and self.events >= self.expect and self.events - len(sequence_numbers) < self.expect:
            _emit({"event": "done", "events": self.events, "cpu": time.process_time(), "t": time.time()})
        if self.report_events and sequence_numbers:
            first, last = sequence_numbers[0], sequence_numbers[-1]
            contiguous = last - first + 1 == len(sequence_numbers)
            _emit({"event": "batch", "p": partition_id, "s": [first, last] if contiguous else sequence_numbers,
                   "c": int(contiguous), "t": time.time()})


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", choices=["ours", "official"], default="ours")
    parser.add_argument("--hub", required=True)
    parser.add_argument("--container", help="blob container of the checkpoint store (not with --source memory)")
    parser.add_argument("--source", choices=["eventhub", "memory"], default="eventhub",
                        help="memory: an in-process MemoryEventSource fed by an in-process producer (ours only)")
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
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="level of this SDK's log lines on stderr (INFO shows every move); others log WARNING")
    args = parser.parse_args(argv)
    if args.source == "memory" and args.impl != "ours":
        parser.error("--source memory runs this SDK's processor only (--impl ours)")
    if args.source == "eventhub" and not args.container:
        parser.error("--container is required with --source eventhub")
    return args


class _Cadence:
    """When a handler checkpoints: every N batches, or once N events of the partition
    were delivered since its last checkpoint (as most users write it)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.events = max(0, args.checkpoint_events)
        self.batches = max(1, args.checkpoint_every)
        self._since: Dict[str, List[int]] = {}  # partition -> [batches, events] since its last checkpoint

    def due(self, partition_id: str, delivered: int) -> bool:
        since = self._since.setdefault(partition_id, [0, 0])
        since[0] += 1
        since[1] += delivered
        if (since[1] >= self.events) if self.events else (since[0] >= self.batches):
            since[0] = since[1] = 0
            return True
        return False


async def _ours(args: argparse.Namespace, tally: _Tally, stop: asyncio.Event) -> None:
    from eventprocessor import EventProcessor, OwnershipLostError, PartitionProcessor
    class Handler(PartitionProcessor):
        def __init__(self) -> None:
            self.cadence = _Cadence(args)  # one per claim: a partition claimed again counts afresh

        async def process_events(self, events, context):
            tally.delivered(context.partition_id, [e.sequence_number for e in events])
            if args.work:
                await asyncio.sleep(args.work)  # a handler that takes time: a stop or a handoff finds it mid-batch
            if self.cadence.due(context.partition_id, len(events)):
                try:
                    await context.update_checkpoint()
                except OwnershipLostError:
                    pass  # the next owner resumes from its own checkpoint

    producer: Optional["asyncio.Task[None]"] = None
    if args.source == "memory":
        from eventprocessor.sources import MemoryEventSource
        from stores import InMemoryCheckpointStore

        memory = MemoryEventSource(args.partitions, eventhub_name=args.hub,
                                   max_events_per_partition=args.retention or 4 * args.backlog)
        source: Any = memory
        store: Any = InMemoryCheckpointStore()
        producer = asyncio.create_task(_produce(memory, args, tally))
    else:
        from eventprocessor.sources.eventhub import EventHubSource
        from stores.blob import BlobCheckpointStore

        source = EventHubSource.from_connection_string(os.environ[HUB_ENV], eventhub_name=args.hub)
        store = BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container)
    processor = EventProcessor(source, store, Handler, owner_id=args.owner_id, consumer_group=args.consumer_group,
                               load_balancing_strategy=args.strategy, load_balancing_interval=args.interval,
                               partition_ownership_expiration_interval=args.expiry, max_batch_size=args.batch,
                               prefetch=args.prefetch)
    _emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "ours",
           "namespace": source.fully_qualified_namespace, "eventhub": source.eventhub_name})
    try:
        await processor.start()
        last: Optional[List[str]] = None
        while not stop.is_set():
            owned = sorted(processor.owned_partitions, key=lambda pid: (len(pid), pid))
            if owned != last:
                _emit({"event": "owned", "owned": owned, "ticks": processor.ticks, "t": time.time()})
                last = owned
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


async def _produce(source: Any, args: argparse.Namespace, tally: _Tally) -> None:
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
    _emit({"event": "produced", "events": sent, "t": time.time()})


async def _official(args: argparse.Namespace, tally: _Tally, stop: asyncio.Event) -> None:
    from azure.eventhub.aio import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    cadence = _Cadence(args)

    async def on_event_batch(context, events):
        if not events:
            return
        tally.delivered(context.partition_id, [e.sequence_number for e in events])
        if args.work:
            await asyncio.sleep(args.work)
        if cadence.due(context.partition_id, len(events)):
            await context.update_checkpoint(events[-1])

    store = BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container)
    client = EventHubConsumerClient.from_connection_string(
        os.environ[HUB_ENV], consumer_group=args.consumer_group, eventhub_name=args.hub, checkpoint_store=store,
        load_balancing_interval=args.interval, partition_ownership_expiration_interval=args.expiry,
        load_balancing_strategy=args.strategy)
    _emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "official",
           "namespace": client._address.hostname, "eventhub": args.hub})
    async with client:
        task = asyncio.create_task(client.receive_batch(on_event_batch, max_batch_size=args.batch,
                                                        prefetch=args.prefetch, starting_position="-1"))
        try:
            await stop.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    await store.close()


async def _amain(args: argparse.Namespace) -> int:
    for name in (HUB_ENV, STORAGE_ENV) if args.source == "eventhub" else ():
        if not os.environ.get(name):
            print(f"e2e_worker: {name} is not set", file=sys.stderr)
            return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    tally = _Tally(args.report == "events", args.expect)

    def stats_line() -> Dict[str, Any]:
        return {"event": "stats", "events": tally.events, "cpu": time.process_time(), "t": time.time(),
                "rss": resident_bytes()}

    async def stats() -> None:
        while True:
            _emit(stats_line())
            await asyncio.sleep(args.stats_interval)

    reporter = asyncio.create_task(stats())
    tracer = asyncio.create_task(_trace_allocations(args.tracemalloc_at, tally, args.tracemalloc_frames)) \
        if args.tracemalloc_at else None
    try:
        await (_ours if args.impl == "ours" else _official)(args, tally, stop)
    finally:
        reporter.cancel()
        if tracer is not None:
            tracer.cancel()
            await asyncio.gather(tracer, return_exceptions=True)
    _emit(stats_line())
    _emit({"event": "stopped", "owner": args.owner_id})
    return 0


async def _trace_allocations(after_events: int, tally: _Tally, frames: int, top: int = 25) -> None:
    """Trace allocations from ``after_events`` delivered events on; take the baseline at
    twice that many (by then the steady working set, which was allocated before tracing
    began and so is invisible to it, has been allocated again under tracing); when
    cancelled (at the stop), print the allocation sites whose live memory grew most
    since the baseline, as ``tracemalloc`` lines, innermost frame first. Growth that
    keeps up with the events is a leak; a warm working set shows as a few KiB."""
    import gc
    import tracemalloc

    while tally.events < after_events:
        await asyncio.sleep(0.1)
    tracemalloc.start(max(1, frames))
    while tally.events < 2 * after_events:
        await asyncio.sleep(0.1)
    gc.collect()
    baseline, events_then = tracemalloc.take_snapshot(), tally.events
    try:
        await asyncio.Event().wait()
    finally:
        gc.collect()
        grown = tracemalloc.take_snapshot().compare_to(baseline, "traceback")
        tracemalloc.stop()
        for stat in grown[:top]:
            _emit({"event": "tracemalloc", "events": tally.events - events_then, "size_diff": stat.size_diff,
                   "count_diff": stat.count_diff,
                   "traceback": [f"{frame.filename}:{frame.lineno}" for frame in reversed(stat.traceback)]})


class _OwnershipLines(logging.Handler):
    """Each ownership change of this SDK's processor as a JSON line, from the structured
    fields of its log record (``OWNERSHIP_LOG_FIELDS``)."""

    def emit(self, record: logging.LogRecord) -> None:
        reason = getattr(record, "eventprocessor.reason", None)
        if reason is not None:
            _emit({"event": "ownership", "reason": reason, "p": getattr(record, "eventprocessor.partition_id", None),
                   "epoch": getattr(record, "eventprocessor.epoch", None), "t": record.created})


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    level = logging.getLevelName(args.log_level)
    logging.getLogger().handlers[0].setLevel(level)
    logging.getLogger("eventprocessor").setLevel(min(level, logging.INFO))
    if args.impl == "ours":
        logging.getLogger("eventprocessor").addHandler(_OwnershipLines())
    return asyncio.run(_amain(args))



# ----------------------------------------------------------------------------- the parent's side

class WorkerHandle:
    """A worker process seen from its parent: what it delivered, owns and costs.

    ``deliveries`` maps (partition, sequence number) to how many times it was delivered
    by this worker; ``batches`` every delivered batch as (wall time, partition, first,
    last); ``ownership`` every change of the dispatched set as (wall time, partitions);
    ``changes`` every ownership change the processor logged, with its reason.
    """

    def __init__(self, owner_id: str, process: "asyncio.subprocess.Process", stderr_path: str) -> None:
        self.owner_id = owner_id
        self.process = process
        self.stderr_path = stderr_path
        self.started: Optional[Dict[str, Any]] = None
        self.owned: List[str] = []
        self.ownership: List[tuple] = []  # (wall time, partitions dispatched from then on)
        self.changes: List[tuple] = []  # ours: (wall time, partition, reason, epoch) per ownership change
        self.events = 0
        self.cpu = 0.0
        self.stats_at = 0.0
        self.stats: List[tuple] = []  # (wall time, events, CPU seconds, resident bytes or None)
        self.traced: List[Dict[str, Any]] = []  # --tracemalloc-at: what grew most, by allocation site
        self.deliveries: Dict[tuple, int] = {}
        self.batches: List[tuple] = []  # (wall time, partition, first, last)
        self.first: Optional[Dict[str, Any]] = None
        self.done: Optional[Dict[str, Any]] = None
        self.lines: List[str] = []
        self.reader: Optional["asyncio.Task[None]"] = None

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            self.lines.append(line)
            del self.lines[:-20]
            try:
                record = json.loads(line)
            except ValueError:
                continue
            kind = record.get("event")
            if kind == "batch":
                span = record["s"]
                numbers = range(span[0], span[1] + 1) if record.get("c") else span
                partition = record["p"]
                for number in numbers:
                    key = (partition, number)
                    self.deliveries[key] = self.deliveries.get(key, 0) + 1
                self.batches.append((record["t"], partition, min(numbers), max(numbers)))
            elif kind == "stats":
                self.events, self.cpu, self.stats_at = record["events"], record["cpu"], record["t"]
                self.stats.append((record["t"], record["events"], record["cpu"], record.get("rss")))
            elif kind == "tracemalloc":
                self.traced.append(record)
            elif kind == "owned":
                self.owned = record["owned"]
                self.ownership.append((record["t"], record["owned"]))
            elif kind == "ownership":
                self.changes.append((record["t"], record["p"], record["reason"], record["epoch"]))
            elif kind == "started":
                self.started = record
            elif kind == "first":
                self.first = record
            elif kind == "done":
                self.done = record

    def kill(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a graceful stop that releases ownership), then SIGKILL."""
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(self.process.wait(), timeout)
            except (ProcessLookupError, asyncio.TimeoutError):
                self.kill()
        await self.process.wait()
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self.reader.cancel()

    def diagnostics(self) -> str:
        try:
            with open(self.stderr_path, errors="replace") as handle:
                stderr = handle.read()[-2000:]
        except OSError:
            stderr = ""
        return (f"--- {self.owner_id} (returncode {self.process.returncode})\nstdout tail:\n"
                + "\n".join(self.lines[-5:]) + f"\nstderr tail:\n{stderr}")


async def create_container(storage_connection_string: str, name: str) -> None:
    """Create a blob container for a worker's checkpoint store (the official store does not)."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob.aio import BlobServiceClient

    async with BlobServiceClient.from_connection_string(storage_connection_string) as service:
        try:
            await service.create_container(name)
        except ResourceExistsError:
            pass


async def spawn_worker(owner_id: str, *, hub: str, container: Optional[str], hub_connection_string: Optional[str],
                       storage_connection_string: Optional[str], log_dir: str,
                       extra: Optional[List[str]] = None) -> WorkerHandle:
    """Start ``python -m benchmarks.e2e_worker`` with the connection strings in its environment
    (none for ``--source memory``)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    for name, value in ((HUB_ENV, hub_connection_string), (STORAGE_ENV, storage_connection_string)):
        if value is not None:
            env[name] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(log_dir, f"{owner_id}.stderr")
    restarts = 0
    while os.path.exists(stderr_path):  # the same name started again: keep the earlier log
        restarts += 1
        stderr_path = os.path.join(log_dir, f"{owner_id}.{restarts}.stderr")
    with open(stderr_path, "wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.e2e_worker", "--hub", hub,
            *(["--container", container] if container else []), "--owner-id", owner_id, *(extra or []),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr, cwd=root, env=env)
    handle = WorkerHandle(owner_id, process, stderr_path)
    handle.reader = asyncio.create_task(handle.read())
    return handle


if __name__ == "__main__":
    sys.exit(main())
