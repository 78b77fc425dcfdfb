"""A processor writing into PostgreSQL in its own process, for the sink's multi-process
tests and its benchmark. Run as ``python -m harness.postgres_worker``.

The group runs on PostgreSQL alone: ownership and checkpoints in a
``PostgresCheckpointStore`` (table ``--records-table``), rows into ``--table`` (columns
``partition_id, sequence_number, body``, no key). The event log is deterministic, the
same in every process: partition ``p`` holds ``--events`` events with bodies ``p:i``,
appended at ``--rate`` events/s per partition from the wall-clock time ``--start`` (all
at once with ``--rate 0``), like a hub every process reads.

``--mode sink``: a ``PostgresSink`` (the exactly-once path). ``--mode naive``: the handler
a user writes without it, as a competent user would: one COPY of the batch (autocommit),
then ``update_checkpoint()``.

``--fault kill`` or ``--fault stop`` with ``--at STEP`` and ``--nth N``: the ``N``-th time
this process reaches ``STEP`` it prints ``{"event": "reached", ...}`` and SIGKILLs or
SIGSTOPs itself right there. Steps: the sink's (``before_begin``, ``after_begin``,
``after_write``, ``after_commit``, ``after_checkpoint``: see ``PostgresSink``'s
``step_hook``); the naive handler's ``before_write``, ``after_write`` (rows inserted, not
checkpointed) and ``after_checkpoint``.

The DSN comes from ``EVENTPROCESSOR_PG_DSN`` (never on the command line). It prints JSON
lines: ``started``, ``owned`` (when the dispatched partitions change, and every second),
``reached``; SIGTERM stops it gracefully (it hands its partitions over).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from typing import Any

from .worker.report import emit

DSN_ENV = "EVENTPROCESSOR_PG_DSN"
STEPS = ("before_begin", "after_begin", "after_write", "after_commit", "after_checkpoint")
"""The sink's steps, in the order a batch reaches them."""
NAIVE_STEPS = ("before_write", "after_write", "after_checkpoint")

__all__ = ["DSN_ENV", "STEPS", "NAIVE_STEPS", "main", "fill", "naive_handler"]

logger = logging.getLogger(__name__)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--owner-id", required=True)
    parser.add_argument("--mode", choices=["sink", "naive"], default="sink")
    parser.add_argument("--table", required=True, help="the rows' table (created by the parent)")
    parser.add_argument("--positions-table", default="eventprocessor_positions")
    parser.add_argument("--records-table", default="eventprocessor_records", help="the checkpoint store's table")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=1000, help="events per partition")
    parser.add_argument("--rate", type=float, default=0.0, help="events/s per partition (0: all at once)")
    parser.add_argument("--start", type=float, default=0.0, help="wall-clock time the stream starts at")
    parser.add_argument("--interval", type=float, default=0.2, help="load-balancing interval, seconds")
    parser.add_argument("--expiry", type=float, default=2.0, help="ownership expiration interval, seconds")
    parser.add_argument("--batch", type=int, default=100, help="the processor's max batch size")
    parser.add_argument("--max-events", type=int, default=100, help="the sink's events per transaction")
    parser.add_argument("--max-interval", type=float, default=0.1, help="the sink's commit cadence, seconds")
    parser.add_argument("--idle-timeout", type=float, default=10.0, help="the sink's transaction_idle_timeout")
    parser.add_argument("--checkpoint-interval", type=float, default=0.5, help="the sink's checkpoint_interval")
    parser.add_argument("--fault", choices=["kill", "stop"])
    parser.add_argument("--at", choices=sorted(set(STEPS + NAIVE_STEPS)))
    parser.add_argument("--nth", type=int, default=1)
    return parser.parse_args(argv)


def fill(source: Any, partitions: int, events: int, start: int = 0, stop: int | None = None) -> None:
    """Append events ``start`` to ``stop`` of every partition (bodies ``p:i``)."""
    for i in range(start, events if stop is None else min(stop, events)):
        for p in range(partitions):
            source.append(f"{p}:{i}", partition_id=str(p))


async def _produce(source: Any, args: argparse.Namespace) -> None:
    """Append each event when its time comes: event ``i`` at ``start + i / rate``."""
    sent = 0
    while sent < args.events:
        due = int((time.time() - args.start) * args.rate) + 1
        if due > sent:
            fill(source, args.partitions, args.events, sent, due)
            sent = min(due, args.events)
        await asyncio.sleep(0.05)


def _fault(args: argparse.Namespace) -> Any:
    """The step hook (or the naive handler's) that kills or stops this process at ``--at``."""
    seen = [0]

    def reached(step: str, context: Any) -> None:
        if args.fault is None or step != args.at:
            return
        seen[0] += 1
        if seen[0] == args.nth:
            emit({"event": "reached", "step": step, "p": context.partition_id, "pid": os.getpid(), "t": time.time()})
            os.kill(os.getpid(), signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)

    return reached


def naive_handler(table: str, pool: Any, hook: Any) -> Any:
    """What a user writes without the sink: insert the batch, then checkpoint it."""
    from eventprocessor import PartitionProcessor

    class InsertThenCheckpoint(PartitionProcessor):
        async def process_events(self, events: list, context: Any) -> None:
            if not events:
                return
            hook("before_write", context)
            async with pool.acquire() as connection:
                await connection.copy_records_to_table(
                    table, columns=["partition_id", "sequence_number", "body"],
                    records=[(e.partition_id, e.sequence_number, e.body) for e in events])
            hook("after_write", context)
            await context.update_checkpoint()
            hook("after_checkpoint", context)

    return InsertThenCheckpoint


async def _report_ownership(processor: Any, owner_id: str, stop: asyncio.Event) -> None:
    last: list[str] | None = None
    last_emit = 0.0
    while not stop.is_set():
        owned = sorted(processor.owned_partitions, key=lambda pid: (len(pid), pid))
        now = time.monotonic()
        if owned != last or now - last_emit >= 1.0:
            emit({"event": "owned", "owner": owner_id, "owned": owned, "ticks": processor.ticks, "t": time.time()})
            last, last_emit = owned, now
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


async def _amain(args: argparse.Namespace) -> int:
    import asyncpg

    from eventprocessor import EventProcessor
    from eventprocessor.postgres import PostgresSink
    from eventprocessor.sources import InMemoryEventSource
    from eventprocessor.stores import PostgresCheckpointStore

    dsn = os.environ.get(DSN_ENV)
    if not dsn:
        print(f"postgres_worker: {DSN_ENV} is not set", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    source = InMemoryEventSource(args.partitions)
    producer = None
    if args.rate > 0:
        producer = asyncio.create_task(_produce(source, args))
    else:
        fill(source, args.partitions, args.events)
    store = PostgresCheckpointStore(dsn=dsn, table=args.records_table)
    hook = _fault(args)
    pool = sink = None
    if args.mode == "sink":
        sink = PostgresSink(_copy_into(args.table), dsn=dsn, positions_table=args.positions_table,
                            max_events=args.max_events, max_interval=args.max_interval, step_hook=hook,
                            transaction_idle_timeout=args.idle_timeout,
                            checkpoint_interval=args.checkpoint_interval)
        factory: Any = sink
    else:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=10)
        factory = naive_handler(args.table, pool, hook)
    processor = EventProcessor(source, store, factory, owner_id=args.owner_id, load_balancing_interval=args.interval,
                               partition_ownership_expiration_interval=args.expiry, max_batch_size=args.batch)
    reporter = asyncio.create_task(_report_ownership(processor, args.owner_id, stop))
    try:
        await processor.start()
        emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "t": time.time(),
              "namespace": source.fully_qualified_namespace, "eventhub": source.eventhub_name})
        await stop.wait()
    finally:
        await processor.stop()
        stop.set()
        await reporter
        if producer is not None:
            producer.cancel()
        if sink is not None:
            await sink.close()
        if pool is not None:
            await pool.close()
        await store.close()
    emit({"event": "stopped", "owner": args.owner_id})
    return 0


def _copy_into(table: str) -> Any:
    async def write(events: list, connection: Any) -> None:
        await connection.copy_records_to_table(
            table, columns=["partition_id", "sequence_number", "body"],
            records=[(e.partition_id, e.sequence_number, e.body) for e in events])

    return write


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(_amain(_parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
