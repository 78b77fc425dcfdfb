"""Spark sink throughput: events through the sink into Parquet, against Spark writing the
same rows directly.

Run it with ``python -m benchmarks.spark_sink`` (or ``eventprocessor bench spark-sink``).
In one run, with one local SparkSession:

* **direct**: the very batches the sink cut (same events, read back from its commit
  log), already built as Spark DataFrames (from Arrow, before the clock starts),
  appended to Parquet partitioned by ``partition_id``, one ``write`` per batch. This
  is the cost of Spark alone.
* **sink**: the events in a ``MemoryEventSource``, consumed by an ``EventProcessor``
  whose handler is a ``SparkSink`` cutting batches of ``--batch`` events; the clock
  runs from ``start()`` until the commit log holds every event. It includes the
  processor, the event -> Arrow conversion, the commit log, staging and moving the
  files, and the store checkpoints.

Both run a full round as a warm-up first. The rounds alternate which path goes first
(the event log is deterministic, so the batches of the previous sink run name the same
events in a fresh source). The best and the median rows/s of each are reported, with
the ratio of the best runs (the least disturbed on a shared machine; target: sink >=
0.8 x direct at batches of 10k events) and the median of the per-round ratios.
With ``--record``, results go to ``benchmarks/RESULTS.md`` (section ``spark_sink``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["main", "Round"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Round:
    direct_rows_per_s: float
    sink_rows_per_s: float

    @property
    def ratio(self) -> float:
        return self.sink_rows_per_s / self.direct_rows_per_s


def _fill(source: Any, events: int, body_size: int) -> None:
    partitions = source.partition_count
    pad = "x" * max(0, body_size - 60)
    for i in range(events):
        body = json.dumps({"device": f"d{i % 997}", "reading": i * 0.5, "pad": pad})
        source.append(body, partition_id=str(i % partitions), properties={"kind": "reading"})


def _direct(spark: Any, source: Any, out: Path, batches: Sequence[Sequence[Any]]) -> float:
    """Rows/s of Spark appending the same batches (same events, same partitions),
    their DataFrames built beforehand."""
    from eventprocessor.spark import events_to_table

    frames = []
    for ranges in batches:
        parts = []
        for r in ranges:
            events = source.events(r.partition_id)
            first = next(i for i, e in enumerate(events) if e.sequence_number == r.first_sequence_number)
            parts.append((r.partition_id, events[first:first + r.count]))
        table = events_to_table(parts)
        frames.append((table.num_rows, spark.createDataFrame(table)))
    began = time.perf_counter()
    rows = 0
    for count, df in frames:
        df.write.mode("append").partitionBy("partition_id").parquet(str(out))
        rows += count
    return rows / (time.perf_counter() - began)


async def _sink(spark: Any, source: Any, out: Path, batch: int) -> Tuple[float, List[Sequence[Any]]]:
    """Rows/s through EventProcessor + SparkSink until the commit log has every event,
    and the batches it cut (their ranges)."""
    from eventprocessor import EventProcessor, LoadBalancingStrategy
    from eventprocessor.spark import SparkSink
    from stores import InMemoryCheckpointStore

    partitions = [str(p) for p in range(source.partition_count)]
    want = {p: source.last_sequence_number(p) for p in partitions}
    total = sum(len(source.events(p)) for p in partitions)
    sink = SparkSink(out, spark=spark, max_events=batch, max_bytes=1 << 40, max_interval=5.0)
    # A lone processor claims one partition in its first tick and (GREEDY) the rest in
    # the second; quick ticks keep that start-up short next to the run.
    processor = EventProcessor(source, InMemoryCheckpointStore(), sink, load_balancing_interval=0.1,
                               partition_ownership_expiration_interval=60, max_batch_size=1000, prefetch=1000,
                               load_balancing_strategy=LoadBalancingStrategy.GREEDY)
    began = time.perf_counter()
    await processor.start()
    try:
        while sink.events_committed < total:
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - began
    finally:
        await processor.stop()
        await sink.close()
    if sink.committed_high_water_marks() != want:
        raise RuntimeError("the sink did not commit every event exactly once")
    batches = [ranges for _id, outcome, ranges in await sink.commit_log.batches() if outcome == "committed"]
    return total / elapsed, batches


def _count_rows(spark: Any, path: Path) -> int:
    return spark.read.parquet(str(path)).count()


def measure(events: int, batch: int, partitions: int, rounds: int, body_size: int,
            master: str) -> List[Round]:
    from eventprocessor.sources import MemoryEventSource
    from eventprocessor.spark import spark_session

    spark = spark_session(master, {"spark.sql.shuffle.partitions": str(partitions)})
    spark.sparkContext.setLogLevel("ERROR")
    workdir = Path(tempfile.mkdtemp(prefix="spark-sink-bench-"))
    results: List[Round] = []
    try:
        def fresh_source(n: int) -> Any:
            source = MemoryEventSource(partitions)
            _fill(source, n, body_size)
            return source

        # Warm the JVM up on a full round of each, so neither path pays for the JIT.
        warm = fresh_source(events)
        _rate, batches = asyncio.run(_sink(spark, warm, workdir / "warm-sink", batch))
        _direct(spark, warm, workdir / "warm-direct", batches)
        for r in range(rounds):
            # The log is deterministic, so the ranges of one sink run name the same events
            # in every fresh source: direct can go first in every other round.
            source = fresh_source(events)
            if r % 2 == 0:
                direct = _direct(spark, source, workdir / f"direct-{r}", batches)
                sink, batches = asyncio.run(_sink(spark, source, workdir / f"sink-{r}", batch))
            else:
                sink, batches = asyncio.run(_sink(spark, source, workdir / f"sink-{r}", batch))
                direct = _direct(spark, source, workdir / f"direct-{r}", batches)
            if _count_rows(spark, workdir / f"sink-{r}") != events:
                raise RuntimeError("the sink's table does not hold every event once")
            results.append(Round(direct, sink))
            print(f"round {r + 1}: direct {direct:,.0f} rows/s, sink {sink:,.0f} rows/s, ratio {sink / direct:.2f}")
            shutil.rmtree(workdir / f"direct-{r}", ignore_errors=True)
            shutil.rmtree(workdir / f"sink-{r}", ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def _markdown(results: Sequence[Round], args: argparse.Namespace, command: str) -> str:
    from benchmarks.results import machine_line

    best_direct = max(r.direct_rows_per_s for r in results)
    best_sink = max(r.sink_rows_per_s for r in results)
    best_ratio = best_sink / best_direct
    median_ratio = statistics.median(r.ratio for r in results)
    def verdict(value: float) -> str:
        return "meets" if value >= 0.8 else "misses"

    lines = [
        "## Spark sink: rows/s into Parquet",
        "",
        f"`{command}`. {machine_line()}",
        f"{args.events:,} events per round over {args.partitions} partitions, bodies of ~{args.body_size} bytes "
        f"(JSON) plus one property, micro-batches of {args.batch:,} events, Parquet partitioned by "
        f"`partition_id`, master `{args.master}`. {len(results)} rounds, alternating which path goes "
        "first, after a full warm-up round of each.",
        "",
        "| path | best rows/s | median rows/s |",
        "|---|---:|---:|",
        f"| Spark writing the same batches from ready DataFrames (direct) | {best_direct:,.0f} | "
        f"{statistics.median(r.direct_rows_per_s for r in results):,.0f} |",
        f"| EventProcessor + SparkSink (exactly-once Parquet) | {best_sink:,.0f} | "
        f"{statistics.median(r.sink_rows_per_s for r in results):,.0f} |",
        f"| **ratio sink / direct** | **{best_ratio:.2f}** ({verdict(best_ratio)} the 0.8 target) | "
        f"**{median_ratio:.2f}** (median of per-round ratios; {verdict(median_ratio)} the 0.8 target) |",
        "",
        "The machine is shared (2 cores, other jobs running), so single runs swing by 2x; the best run of "
        "each path is the one least disturbed, as `timeit` reports the minimum. The median of the per-round "
        "ratios is the conservative figure.",
        "The sink writes each batch with the Hadoop committer's algorithm 2 and no `_SUCCESS` marker (its own "
        "staging and commit log make the committer's second rename pass redundant); direct uses Spark's "
        "defaults.",
        "Per round: " + ", ".join(f"{r.ratio:.2f}" for r in results) + ".",
        "The sink's time includes reading from the source, event -> Arrow conversion, the commit log "
        "(plan, outcome), staging and moving the files, and one fenced checkpoint per partition per batch.",
    ]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> int:
    """Measure and print both paths; with ``--record``, write the table to RESULTS.md. Example::

        python -m benchmarks.spark_sink --events 20000 --batch 5000 --rounds 2
    """
    from . import program

    parser = program.parser("spark_sink", __doc__, prog)
    parser.add_argument("--events", type=int, default=100_000, help="events per round (default 100000)")
    parser.add_argument("--batch", type=int, default=10_000, help="events per micro-batch (default 10000)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--body-size", type=int, default=120)
    parser.add_argument("--master", default="local[2]")

    def body(args: argparse.Namespace) -> int:
        if args.events < args.batch or args.batch < args.partitions:
            parser.error("need events >= batch >= partitions")
        from eventprocessor_cli.user_errors import require, require_java

        require(purpose="the spark-sink benchmark", extras=["spark"])
        require_java("the spark-sink benchmark")
        return _run(args, program.recorded_command("spark_sink", argv))

    return program.run(parser, body, argv)


def _run(args: argparse.Namespace, command: str) -> int:
    from . import program

    logging.basicConfig(level=logging.WARNING)
    results = measure(args.events, args.batch, args.partitions, args.rounds, args.body_size, args.master)
    markdown = _markdown(results, args, command)
    program.report("spark_sink", markdown, args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
