"""PostgreSQL sink benchmark: rows/s exactly once against a bare COPY loop and the
insert-then-checkpoint handler, duplicates after SIGKILL, and the PostgreSQL store's
checkpoints/s beside the Blob store's.

Run it with ``python -m benchmarks.postgres_sink`` (or ``eventprocessor bench postgres-sink``).
It starts its own PostgreSQL (:mod:`eventprocessor.emulators.postgres`, default settings:
``fsync`` on; or uses the server whose DSN is in ``$EVENTPROCESSOR_PG_DSN``) and, for the
store comparison, its own Azurite, on this machine.

Rows/s: ``--partitions`` partitions of ``--events`` events each (bodies of ``--body-size``
bytes) become rows ``(partition_id, sequence_number, body)`` of a table without keys, in
batches of ``--batch`` rows (one ``copy_records_to_table`` each), every path in a fresh
table of the same server, the paths taking turns going first, ``--rounds`` rounds:

* **floor**: a bare asyncpg loop per partition, all partitions at once on a pool: the
  batch's rows made from the events and one COPY (autocommit: one commit per batch),
  nothing else: no source, no processor, no fencing;
* **processor, COPY only**: an ``EventProcessor`` over a ``InMemoryEventSource`` whose handler
  COPYs each delivered batch and never checkpoints (what the processor and the source
  cost, for reference);
* **insert then checkpoint**: the handler a user writes without the sink: the COPY, then
  ``update_checkpoint()`` (in-memory store): at least once;
* **exactly once**: ``PostgresSink`` (``max_events`` = the batch): per batch, BEGIN, the
  COPY, the position's conditional UPDATE, COMMIT, and the store checkpoint at its cadence.

Each processor path is clocked from its first write to its last commit (its start-up,
claiming and fencing, is left out, as the floor has none). Reported: rows/s (median and
range), and per round the ratio of exactly once to the floor (target >= 0.8).

Duplicates after SIGKILL (``--kill-rounds``): the kill chain of
:mod:`harness.postgres_processes`: worker processes one after another, each SIGKILLed at a
step (the sink: before its write, after it, after the UPDATE, after COMMIT, after the
checkpoint; the handler: between its insert and its checkpoint); counted from the table.

Checkpoints/s: ``PostgresCheckpointStore`` and a bare conditional ``UPDATE ... WHERE
version = $etag`` (its floor) on the same server, and ``BlobCheckpointStore`` and a bare
conditional ``set_blob_metadata`` (its floor) on Azurite, through
:func:`benchmarks.store_bench.measure.measure` (32 partitions, 16 at once).

The machine's load is measured over each round (:mod:`benchmarks.toolkit.machine`).
``--quick`` is a small run that refuses ``--record``.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .store_bench.measure import measure
from .store_bench.stores import OWNER, ContractStore, StoreUnderTest
from .toolkit import program
from .toolkit.machine import LoadReading, LoadWindow
from .toolkit.report import busy_flag, median_range

__all__ = ["main"]

logger = logging.getLogger(__name__)

DSN_ENV = "EVENTPROCESSOR_PG_DSN"
PATHS = ("floor", "processor, COPY only", "insert then checkpoint", "exactly once")
COLUMNS = ["partition_id", "sequence_number", "body"]
TARGET = 0.8


@dataclass
class Round:
    rows_per_second: dict[str, float] = field(default_factory=dict)
    load: LoadReading | None = None


# --------------------------------------------------------------------------- rows/s


async def _table(dsn: str) -> str:
    import asyncpg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'CREATE TABLE "{name}" (partition_id text, sequence_number bigint, body bytea)')
    finally:
        await connection.close()
    return name


async def _drop(dsn: str, *names: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        for name in names:
            await connection.execute(f'DROP TABLE IF EXISTS "{name}"')
    finally:
        await connection.close()


async def _count(dsn: str, table: str) -> Counter:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(f'SELECT partition_id, count(*), count(DISTINCT sequence_number) FROM "{table}" '
                                      "GROUP BY 1")
    finally:
        await connection.close()
    return Counter({row[0]: row[1] for row in rows if row[1] == row[2]})


def _source(partitions: int, events: int, body_size: int) -> Any:
    from eventprocessor.sources import InMemoryEventSource

    source = InMemoryEventSource(partitions)
    for i in range(events):
        for p in range(partitions):
            source.append(f"{p}:{i}".encode().ljust(body_size, b"."), partition_id=str(p))
    return source


async def _floor(dsn: str, table: str, source: Any, batch: int) -> float:
    import asyncpg

    partitions = [str(p) for p in range(source.partition_count)]
    events = {p: source.events(p) for p in partitions}
    pool = await asyncpg.create_pool(dsn, min_size=len(partitions), max_size=len(partitions))
    try:
        async def copy(pid: str) -> None:
            async with pool.acquire() as connection:
                for start in range(0, len(events[pid]), batch):
                    # The rows are made from the events in the clock, as every other path makes them.
                    records = [(e.partition_id, e.sequence_number, e.body) for e in events[pid][start:start + batch]]
                    await connection.copy_records_to_table(table, columns=COLUMNS, records=records)

        began = time.perf_counter()
        await asyncio.gather(*(copy(p) for p in partitions))
        return sum(len(e) for e in events.values()) / (time.perf_counter() - began)
    finally:
        await pool.close()


class _Clock:
    """First write to last commit, and how many rows are done."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.rows = 0

    def started(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def done(self, rows: int) -> None:
        self.rows += rows
        self.last = time.perf_counter()


def _handler(pool: Any, table: str, clock: _Clock, checkpoint: bool) -> Any:
    from eventprocessor import PartitionProcessor

    class CopyHandler(PartitionProcessor):
        async def process_events(self, events: list, context: Any) -> None:
            if not events:
                return
            clock.started()
            async with pool.acquire() as connection:
                await connection.copy_records_to_table(
                    table, columns=COLUMNS, records=[(e.partition_id, e.sequence_number, e.body) for e in events])
            if checkpoint:
                await context.update_checkpoint()
            clock.done(len(events))

    return CopyHandler


async def _through_processor(dsn: str, table: str, source: Any, batch: int, path: str) -> float:
    import asyncpg

    from eventprocessor import EventProcessor, LoadBalancingStrategy
    from eventprocessor.postgres import PostgresSink
    from eventprocessor.stores import InMemoryCheckpointStore

    total = sum(len(source.events(str(p))) for p in range(source.partition_count))
    clock = _Clock()
    pool = sink = None
    if path == "exactly once":
        def hook(step: str, context: Any) -> None:
            if step == "before_begin":
                clock.started()
            elif step == "after_commit":
                clock.last = time.perf_counter()

        sink = PostgresSink(_copy(table), dsn=dsn, positions_table=f"{table}_positions", max_events=batch,
                            max_interval=5.0, pool_size=source.partition_count, step_hook=hook)
        factory: Any = sink
    else:
        pool = await asyncpg.create_pool(dsn, min_size=source.partition_count, max_size=source.partition_count)
        factory = _handler(pool, table, clock, checkpoint=path == "insert then checkpoint")
    processor = EventProcessor(source, InMemoryCheckpointStore(), factory, load_balancing_interval=0.1,
                               partition_ownership_expiration_interval=60, max_batch_size=batch, prefetch=batch,
                               load_balancing_strategy=LoadBalancingStrategy.GREEDY)
    await processor.start()
    try:
        while (sink.stats.events_committed if sink is not None else clock.rows) < total:
            await asyncio.sleep(0.005)
        ended = clock.last
    finally:
        await processor.stop()
        if sink is not None:
            await sink.close()
            await _drop(dsn, f"{table}_positions")
        if pool is not None:
            await pool.close()
    assert clock.first is not None
    return total / (ended - clock.first)


def _copy(table: str) -> Any:
    async def write(events: list, connection: Any) -> None:
        await connection.copy_records_to_table(
            table, columns=COLUMNS, records=[(e.partition_id, e.sequence_number, e.body) for e in events])

    return write


async def _round(dsn: str, args: argparse.Namespace, order: Sequence[str]) -> Round:
    result = Round()
    window = LoadWindow()
    for path in order:
        source = _source(args.partitions, args.events, args.body_size)
        table = await _table(dsn)
        try:
            if path == "floor":
                rate = await _floor(dsn, table, source, args.batch)
            else:
                rate = await _through_processor(dsn, table, source, args.batch, path)
            counts = await _count(dsn, table)
            if path != "insert then checkpoint" and counts != Counter({str(p): args.events
                                                                       for p in range(args.partitions)}):
                raise RuntimeError(f"{path}: the table does not hold every event once: {dict(counts)}")
            result.rows_per_second[path] = rate
        finally:
            await _drop(dsn, table)
    result.load = window.reading()
    return result


# --------------------------------------------------------------------------- duplicates after SIGKILL


async def _kills(dsn: str, rounds: int, log_dir: str) -> dict[str, list[tuple[int, int]]]:
    """(duplicates, missing) per kill chain, for the sink and for the handler."""
    from harness.postgres_processes import kill_chain
    from harness.postgres_worker import STEPS

    found: dict[str, list[tuple[int, int]]] = {"exactly once": [], "insert then checkpoint": []}
    for index in range(rounds):
        for path, mode, steps in (("exactly once", "sink", list(STEPS)),
                                  ("insert then checkpoint", "naive", ["after_write"])):
            outcome = await kill_chain(dsn, log_dir, steps=steps, mode=mode, seed=index)
            found[path].append((outcome.duplicates, outcome.missing))
    return found


# --------------------------------------------------------------------------- checkpoints/s


class BarePostgresWrites(StoreUnderTest):
    """The floor of a fenced PostgreSQL checkpoint: one ``UPDATE ... WHERE version = $etag``
    on a plain asyncpg pool (no write token, no record parsing), the same fields."""

    name = "floor: bare conditional UPDATE"
    kind = "bare-postgres"
    checkpoint_only = True

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._table = f"bare_{uuid.uuid4().hex[:10]}"
        self._versions: dict[str, int] = {}
        self._pool: Any = None

    async def open(self) -> None:
        import asyncpg

        self._pool = await asyncpg.create_pool(self._dsn, min_size=1, max_size=10)
        await self._pool.execute(f'CREATE TABLE "{self._table}" (key text PRIMARY KEY, version bigint, fields jsonb)')

    async def close(self) -> None:
        await self._pool.execute(f'DROP TABLE "{self._table}"')
        await self._pool.close()

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        fields = f'{{"sequencenumber": "{sequence_number}", "offset": "{sequence_number}", "ownerid": "{OWNER}", ' \
                 '"epoch": 1}'
        version = self._versions.get(partition_id)
        if version is None:  # the untimed first write creates the row
            await self._pool.execute(f'INSERT INTO "{self._table}" VALUES ($1, 1, $2::jsonb)', partition_id, fields)
            self._versions[partition_id] = 1
            return
        done = await self._pool.fetchval(f'UPDATE "{self._table}" SET version = version + 1, fields = $3::jsonb '
                                         "WHERE key = $1 AND version = $2 RETURNING version", partition_id, version,
                                         fields)
        if done is None:
            raise RuntimeError("the bare conditional UPDATE lost its own etag")
        self._versions[partition_id] = done


def _stores(dsn: str, azurite: Any) -> list[StoreUnderTest]:
    from eventprocessor.stores import PostgresCheckpointStore

    pg = PostgresCheckpointStore(dsn=dsn, table=f"bench_records_{uuid.uuid4().hex[:8]}")
    stores: list[StoreUnderTest] = [
        ContractStore("ours postgres (fenced)", pg, kind="ours-postgres", request_counts=lambda: None),
        BarePostgresWrites(dsn)]
    if azurite is not None:
        from .store_bench.stores import make

        for kind in ("ours-blob", "bare-blob"):
            store = make(kind, azurite.connection_string, 32)
            if store is not None:
                stores.append(store)
    return stores


async def _checkpoints(dsn: str, azurite: Any, rounds: int, ops: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for index in range(rounds):
        stores = _stores(dsn, azurite)
        for adapter in stores[index % len(stores):] + stores[:index % len(stores)]:
            try:
                result = await measure(adapter, 32, concurrency=16, checkpoint_ops=ops, list_repeats=1,
                                       phase_ops=32, round_index=index)
            finally:
                await adapter.close()
            found.setdefault(adapter.name, []).append(result.checkpoint.per_second)
    return found


# --------------------------------------------------------------------------- report


def _span(values: Sequence[float], digits: int = 0) -> str:
    return median_range(values, f",.{digits}f")


def _markdown(rounds: list[Round], kills: dict[str, list[tuple[int, int]]], checkpoints: dict[str, list[float]],
              args: argparse.Namespace, head: str, where: str) -> str:
    ratios = [r.rows_per_second["exactly once"] / r.rows_per_second["floor"] for r in rounds]
    lines = ["## PostgreSQL sink and store (`postgres_sink`)", "", head, "",
             f"{args.partitions} partitions x {args.events:,} events of {args.body_size} bytes, batches of "
             f"{args.batch} rows (one COPY each), {len(rounds)} round(s), on {where}.",
             "", "| path | rows/s, median (range) | duplicates after SIGKILL |", "|---|---|---|"]
    for path in PATHS:
        found = kills.get(path)
        dup = "n/a" if not found else ", ".join(f"{d}" + (f" ({m} missing)" if m else "") for d, m in found)
        lines.append(f"| {path} | {_span([r.rows_per_second[path] for r in rounds])} | {dup} |")
    below = sum(1 for ratio in ratios if ratio < TARGET)
    verdict = f"meets the target of {TARGET} in every round" if not below else \
        f"below the target of {TARGET} in {below} of {len(ratios)} round(s)"
    lines += ["", f"Exactly once / floor, per round: {_span(ratios, 2)} ({verdict})." if ratios else "", ""]
    if checkpoints:
        lines += ["| checkpoint store (32 partitions, 16 at once) | checkpoints/s, median (range) |", "|---|---|"]
        lines += [f"| {name} | {_span(rates)} |" for name, rates in checkpoints.items()]
        lines.append("")
    lines += [f"Round {i + 1}: {r.load.describe()}" for i, r in enumerate(rounds) if r.load is not None]
    lines += [""] + busy_flag([r.load for r in rounds if r.load is not None])
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Measure and print; with ``--record``, write the tables into RESULTS.md. Example::

        python -m benchmarks.postgres_sink --quick
    """
    parser = program.parser("postgres_sink", __doc__, prog)
    parser.add_argument("--partitions", type=int, default=4,
                        help="Partitions of the rows/s paths. [default: %(default)s]")
    parser.add_argument("--events", type=int, help="Events per partition. [default: 50000; 5000 with --quick]")
    parser.add_argument("--batch", type=int, default=1000,
                        help="Rows per COPY and per transaction. [default: %(default)s]")
    parser.add_argument("--body-size", type=int, default=100, help="Bytes per event body. [default: %(default)s]")
    parser.add_argument("--rounds", type=int, help="Rounds of the rows/s and store paths. [default: 5; 1 with --quick]")
    parser.add_argument("--kill-rounds", type=int, help="Kill chains per path. [default: 3; 1 with --quick]")
    parser.add_argument("--checkpoint-ops", type=int,
                        help="Checkpoints per store and round. [default: 4096; 512 with --quick]")
    parser.add_argument("--no-blob", action="store_true", help="Leave the Blob store out (no Azurite).")
    parser.add_argument("--quick", action="store_true", help="A small run to try it (refuses --record).")

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.quick and args.record:
            parser.error("--quick is a partial run: it cannot --record")
        defaults = (5000, 1, 1, 512) if args.quick else (50_000, 5, 3, 4096)
        for name, default in zip(("events", "rounds", "kill_rounds", "checkpoint_ops"), defaults, strict=True):
            if getattr(args, name) is None:
                setattr(args, name, default)
        if args.batch < 1 or args.partitions < 1 or args.events % args.batch:
            parser.error("--events must be a multiple of --batch")
        from eventprocessor.cli.user_errors import require, require_azurite

        require(purpose="the postgres-sink benchmark", extras=["postgres"] + ([] if args.no_blob else ["blob"]))
        if not args.no_blob:
            require_azurite("the postgres-sink benchmark")
        return _run(args, run)

    return program.run("postgres_sink", parser, body, argv)


def _run(args: argparse.Namespace, run: program.Run) -> int:
    import contextlib

    from eventprocessor.emulators.postgres import start_postgres

    logging.basicConfig(level=logging.WARNING)
    azurite = None
    given = os.environ.get(DSN_ENV)
    with contextlib.ExitStack() as stack:
        dsn = given or stack.enter_context(start_postgres()).dsn
        logs = stack.enter_context(tempfile.TemporaryDirectory(prefix="postgres-bench-"))
        if not args.no_blob:
            from eventprocessor.emulators.azurite import start_azurite

            azurite = start_azurite()
            stack.callback(azurite.stop)
        rounds = [asyncio.run(_round(dsn, args, PATHS[i % len(PATHS):] + PATHS[:i % len(PATHS)]))
                  for i in range(args.rounds)]
        kills = asyncio.run(_kills(dsn, args.kill_rounds, logs)) if args.kill_rounds else {}
        checkpoints = asyncio.run(_checkpoints(dsn, azurite, args.rounds, args.checkpoint_ops))
    where = "the server of $EVENTPROCESSOR_PG_DSN" if given else "a PostgreSQL started on this machine (fsync on)"
    run.report(_markdown(rounds, kills, checkpoints, args, run.header(), where))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
