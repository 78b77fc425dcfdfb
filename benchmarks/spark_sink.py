"""Spark sink throughput on a Spark cluster: events through the sink into Parquet, against
Spark writing the same batches directly, on a classic session and over Spark Connect.

Run it with ``python -m benchmarks.spark_sink`` (or ``eventprocessor bench spark-sink``).
By default it starts a standalone master, one worker and a Spark Connect server on this
machine (:mod:`eventprocessor.emulators.spark_cluster`) and measures both kinds of session, each in a
process of its own: a classic session on ``spark://`` and a Spark Connect session on
``sc://``. ``--master URL`` or ``--remote URL`` measure one session of your own instead
(``--master local[2]`` needs no cluster).

In one run, per session, the same batches through four paths:

* **sink**: the events in a ``InMemoryEventSource``, consumed by an ``EventProcessor``
  whose handler is a ``SparkSink`` cutting batches of ``--batch`` events, its commit log
  in the (in-memory) checkpoint store; the clock runs from the moment the first batch is
  planned until every event is committed, published and checkpointed (the processor's
  start-up before that, claiming the partitions and fencing them, is reported on its
  own). It includes reading the events, the event -> Arrow conversion, the DataFrames,
  the commit log (plan, commit), staging, listing and fsyncing the files, publishing them
  (moves and ``_spark_metadata``) and the store checkpoints. The sink pipelines: while
  one batch is written, the next is converted (events -> Arrow -> DataFrame) in another
  thread and the one before is published and checkpointed.
* **Spark pipelined** (the floor): Spark's own best path for the very batches the sink
  cut (same events, read back from its commit log), pipelined the same way: in the
  clock, each batch's events become an Arrow table and a DataFrame (``createDataFrame``)
  in a worker thread while the batch before is written, one batch ahead as in the sink;
  each batch is appended to Parquet partitioned by ``partition_id`` with the committer
  settings the sink uses (algorithm 2, no ``_SUCCESS``), one ``write`` per batch. It
  does everything the sink must do to get the events into the table, and nothing else.
* **Spark serial** (for reference): the batches converted to
  Arrow before the clock; in the clock, one after the other, ``createDataFrame`` and a
  ``write`` with Spark's defaults.
* **write only** (for reference): the same with the DataFrames made before the clock.

Each path runs a full round as a warm-up first. The paths take turns going first (the
event log is deterministic, so the batches of the previous sink run name the same events
in a fresh source). Reported per session: rows/s of each path (median and range over
rounds), the per-round ratio of the sink to the floor (median and range; target: sink
>= 0.9 x the floor) and to Spark serial, the median seconds per batch of each step of the
sink (from ``SparkSink.step_timings``), and the machine's load in each round
(:mod:`benchmarks.toolkit.machine`; a busy run is flagged). With ``--record``, results go to
``benchmarks/RESULTS.md`` (section ``spark_sink``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .toolkit import program
from .toolkit.machine import LoadReading, LoadWindow
from .toolkit.report import busy_flag, header, median_range

__all__ = ["main", "Round", "SessionResult"]

logger = logging.getLogger(__name__)

TARGET = 0.9
STEPS = ("plan", "arrow", "dataframe", "write", "list", "commit", "publish", "checkpoint")
SINK_STEPS = ("plan", "list", "commit", "publish", "checkpoint")  # what the sink adds to Spark's write


@dataclass(frozen=True)
class Round:
    pipelined_rows_per_s: float  # the floor: Spark's own path, pipelined as the sink is
    sink_rows_per_s: float
    direct_rows_per_s: float  # Spark serial, Arrow made before the clock
    write_only_rows_per_s: float = 0.0
    other_cores: float | None = None  # other processes' CPU during the round (machine_load)
    load_average: float | None = None  # 1-minute, at the round's end

    @property
    def ratio(self) -> float:
        """The sink over the floor."""
        return self.sink_rows_per_s / self.pipelined_rows_per_s

    @property
    def direct_ratio(self) -> float:
        return self.sink_rows_per_s / self.direct_rows_per_s

    @property
    def write_only_ratio(self) -> float:
        return self.sink_rows_per_s / self.write_only_rows_per_s if self.write_only_rows_per_s else 0.0


@dataclass
class SessionResult:
    """The rounds of one session, and the median seconds per batch of each sink step."""

    label: str
    rounds: list[Round] = field(default_factory=list)
    steps: dict[str, float] = field(default_factory=dict)
    batches: int = 0

    def to_json(self) -> str:
        return json.dumps({"label": self.label, "rounds": [asdict(r) for r in self.rounds], "steps": self.steps,
                           "batches": self.batches})

    @classmethod
    def from_json(cls, text: str) -> SessionResult:
        data = json.loads(text)
        return cls(data["label"], [Round(**r) for r in data["rounds"]], dict(data["steps"]), int(data["batches"]))

    def loads(self) -> list[LoadReading]:
        return [LoadReading(0.0, r.other_cores, None, None, r.load_average) for r in self.rounds]


def _fill(source: Any, events: int, body_size: int) -> None:
    partitions = source.partition_count
    pad = "x" * max(0, body_size - 60)
    for i in range(events):
        body = json.dumps({"device": f"d{i % 997}", "reading": i * 0.5, "pad": pad})
        source.append(body, partition_id=str(i % partitions), properties={"kind": "reading"})


def _batch_events(source: Any, batches: Sequence[Sequence[Any]]) -> list[list[tuple[str, Sequence[Any]]]]:
    """The events of each batch the sink cut, per partition (references, no copy)."""
    found = []
    for ranges in batches:
        parts = []
        for r in ranges:
            events = source.events(r.partition_id)
            first = next(i for i, e in enumerate(events) if e.sequence_number == r.first_sequence_number)
            parts.append((r.partition_id, events[first:first + r.count]))
        found.append(parts)
    return found


# What the sink's Parquet writer sets (eventprocessor.spark.output.ParquetWriter): a competent
# Spark user appending micro-batches sets them too.
BEST_WRITE_OPTIONS = {"mapreduce.fileoutputcommitter.algorithm.version": "2",
                      "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false"}


def _pipelined(spark: Any, source: Any, out: Path, batches: Sequence[Sequence[Any]]) -> float:
    """Rows/s of Spark's own path for the same batches, pipelined as the sink is: the next
    batch's events -> Arrow -> DataFrame in a worker thread while this one is written."""
    from concurrent.futures import ThreadPoolExecutor

    from eventprocessor.spark import events_to_table
    from eventprocessor.spark.session import create_dataframe

    parts = _batch_events(source, batches)

    def convert(batch: list[tuple[str, Sequence[Any]]]) -> tuple[int, Any]:
        table = events_to_table(batch)
        return table.num_rows, create_dataframe(spark, table)

    began = time.perf_counter()
    rows = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="convert") as pool:
        pending = pool.submit(convert, parts[0])
        for index in range(len(parts)):
            count, df = pending.result()
            if index + 1 < len(parts):
                pending = pool.submit(convert, parts[index + 1])
            df.write.mode("append").partitionBy("partition_id").options(**BEST_WRITE_OPTIONS).parquet(f"file://{out}")
            rows += count
    return rows / (time.perf_counter() - began)


def _direct(spark: Any, source: Any, out: Path, batches: Sequence[Sequence[Any]], *,
            write_only: bool = False) -> float:
    """Rows/s of Spark appending the same batches (same events, same partitions) from
    Arrow tables built beforehand; ``write_only``: from DataFrames built beforehand."""
    from eventprocessor.spark import events_to_table
    from eventprocessor.spark.session import create_dataframe

    frames = [events_to_table(parts) for parts in _batch_events(source, batches)]
    ready = [create_dataframe(spark, table) for table in frames] if write_only else []
    began = time.perf_counter()
    rows = 0
    for index, table in enumerate(frames):
        df = ready[index] if write_only else create_dataframe(spark, table)
        df.write.mode("append").partitionBy("partition_id").parquet(f"file://{out}")
        rows += table.num_rows
    return rows / (time.perf_counter() - began)


async def _sink(spark: Any, source: Any, out: Path, batch: int
                ) -> tuple[float, float, list[Sequence[Any]], list[dict]]:
    """Rows/s through EventProcessor + SparkSink from the first batch planned until every
    event is committed, published and checkpointed; the seconds from ``start()`` to that
    first plan; the batches it cut (their ranges); the seconds of each step per batch."""
    from eventprocessor import EventProcessor, LoadBalancingStrategy
    from eventprocessor.spark import SparkSink
    from eventprocessor.stores import InMemoryCheckpointStore

    partitions = [str(p) for p in range(source.partition_count)]
    want = {p: source.last_sequence_number(p) for p in partitions}
    total = sum(len(source.events(p)) for p in partitions)
    store = InMemoryCheckpointStore()
    first_plan: list[float] = []

    def clock(step: str) -> None:
        if step == "after_plan" and not first_plan:
            first_plan.append(time.perf_counter())

    sink = SparkSink(out, spark=spark, commit_log=store, max_events=batch, max_bytes=1 << 40, max_interval=5.0,
                     step_hook=clock)
    # A lone processor claims one partition in its first tick and (GREEDY) the rest in
    # the second; quick ticks keep that start-up short next to the run.
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.1,
                               partition_ownership_expiration_interval=60, max_batch_size=1000, prefetch=1000,
                               load_balancing_strategy=LoadBalancingStrategy.GREEDY)
    began = time.perf_counter()
    await processor.start()
    try:
        while sink.events_committed < total:
            await asyncio.sleep(0.01)
        ended = time.perf_counter()
    finally:
        await processor.stop()
        await sink.close()
    if sink.committed_high_water_marks() != want:
        raise RuntimeError("the sink did not commit every event exactly once")
    assert sink.commit_log is not None
    batches: list[Sequence[Any]] = [ranges for _id, outcome, ranges in await sink.commit_log.batches()
                                    if outcome == "committed"]
    return total / (ended - first_plan[0]), first_plan[0] - began, batches, list(sink.step_timings)


def _session(master: str | None, remote: str | None, partitions: int) -> Any:
    from eventprocessor.spark import spark_session

    if remote is not None:
        return spark_session(remote=remote)
    conf = {"spark.sql.shuffle.partitions": str(partitions)}
    if master is not None and not master.startswith("local"):
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    spark = spark_session(master, conf)
    spark.sparkContext.setLogLevel("ERROR")  # classic only: quiet the driver's log
    return spark


PATHS = ("pipelined", "direct", "write-only", "sink")


def measure(events: int, batch: int, partitions: int, rounds: int, body_size: int, *, master: str | None,
            remote: str | None, label: str, load_root: int | None = None) -> SessionResult:
    from eventprocessor.sources import InMemoryEventSource

    spark = _session(master, remote, partitions)
    workdir = Path(tempfile.mkdtemp(prefix="spark-sink-bench-"))
    result = SessionResult(label)
    timings: list[dict] = []
    startups: list[float] = []
    try:
        def fresh_source(n: int) -> Any:
            source = InMemoryEventSource(partitions)
            _fill(source, n, body_size)
            return source

        # Warm the JVMs up on a full round of each, so neither path pays for the JIT.
        warm = fresh_source(events)
        _rate, _startup, batches, _timings = asyncio.run(_sink(spark, warm, workdir / "warm-sink", batch))
        _pipelined(spark, warm, workdir / "warm-pipelined", batches)
        _direct(spark, warm, workdir / "warm-direct", batches)
        _direct(spark, warm, workdir / "warm-write-only", batches, write_only=True)
        for r in range(rounds):
            # The log is deterministic, so the ranges of one sink run name the same events
            # in every fresh source: the paths take turns going first.
            source = fresh_source(events)
            measured: dict[str, float] = {}
            window = LoadWindow(root=load_root)
            shift = r % len(PATHS)
            for path in PATHS[shift:] + PATHS[:shift]:
                if path == "sink":
                    measured[path], startup, batches, steps = asyncio.run(
                        _sink(spark, source, workdir / f"sink-{r}", batch))
                elif path == "pipelined":
                    measured[path] = _pipelined(spark, source, workdir / f"{path}-{r}", batches)
                else:
                    measured[path] = _direct(spark, source, workdir / f"{path}-{r}", batches,
                                             write_only=path == "write-only")
            load = window.reading()
            floor, sink = measured["pipelined"], measured["sink"]
            timings.extend(steps)
            startups.append(startup)
            for path in ("sink", "pipelined"):
                if spark.read.parquet(f"file://{workdir / f'{path}-{r}'}").count() != events:
                    raise RuntimeError(f"the {path} path's table does not hold every event once")
            result.rounds.append(Round(floor, sink, measured["direct"], measured["write-only"], load.other_cores,
                                       load.load_end))
            print(f"{label} round {r + 1}: Spark pipelined {floor:,.0f} rows/s, sink {sink:,.0f} rows/s, "
                  f"ratio {sink / floor:.2f}; Spark serial {measured['direct']:,.0f}, write only "
                  f"{measured['write-only']:,.0f} rows/s; {load.describe()}", flush=True)
            for path in PATHS:
                shutil.rmtree(workdir / f"{path}-{r}", ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result.batches = len(timings)
    result.steps = {step: statistics.median(t.get(step, 0.0) for t in timings) for step in STEPS} if timings else {}
    result.steps["startup"] = statistics.median(startups) if startups else 0.0
    return result


def _section(result: SessionResult) -> tuple[list[str], list[str]]:
    rounds = result.rounds
    ratios = [r.ratio for r in rounds]
    median_ratio = statistics.median(ratios)
    verdict = "meets" if median_ratio >= TARGET else "misses"
    if f"{median_ratio:.2f}" == f"{TARGET:.2f}":  # rounds to the target: say which side of it
        verdict += f", {median_ratio:.3f}"
    steps = result.steps
    added = sum(steps.get(step, 0.0) for step in SINK_STEPS)
    loads = [r.other_cores for r in rounds if r.other_cores is not None]
    return [
        f"| {result.label} | {median_range([r.pipelined_rows_per_s for r in rounds])} | "
        f"{median_range([r.sink_rows_per_s for r in rounds])} | **{median_range(ratios, '.2f', 'x')}** ({verdict}) | "
        + ", ".join(f"{ratio:.2f}" for ratio in ratios)
        + f" | {median_range([r.direct_rows_per_s for r in rounds])} | "
        f"{median_range([r.direct_ratio for r in rounds], '.2f', 'x')} | "
        f"{median_range([r.write_only_rows_per_s for r in rounds])} | {median_range(loads, '.2f')} |",
    ], [
        f"| {result.label} | " + " | ".join(f"{steps.get(step, 0.0) * 1000:,.0f}" for step in STEPS)
        + f" | **{added * 1000:,.0f}** | {steps.get('startup', 0.0):.2f} |",
    ]


def _markdown(results: Sequence[SessionResult], args: argparse.Namespace, command: str, where: str) -> str:
    throughput: list[str] = []
    latency: list[str] = []
    for result in results:
        rows, steps = _section(result)
        throughput.extend(rows)
        latency.extend(steps)
    readings = [reading for result in results for reading in result.loads()]
    return "\n".join([
        "## Spark sink: rows/s into Parquet on a Spark cluster",
        "",
        header(command),
        "",
        *busy_flag(readings, "the figures of this run"),
        f"{where} {args.events:,} events per round over {args.partitions} partitions, bodies of ~{args.body_size} "
        f"bytes (JSON) plus one property, micro-batches of {args.batch:,} events, Parquet partitioned by "
        f"`partition_id`. {args.rounds} rounds per session, the four paths taking turns going first, after a full "
        "warm-up round of each. The floor is Spark's own best path for the very batches the sink cut, pipelined "
        "as the sink is: the next batch's events -> Arrow -> DataFrame (`createDataFrame`) in a worker thread while "
        "this one is written, one `write.mode(\"append\").partitionBy(\"partition_id\")` per batch with the "
        "committer settings the sink uses (algorithm 2, no `_SUCCESS`). Target: the sink at 0.9x or more of the "
        "floor, median of the per-round ratios (each round's paths ran back to back).",
        "",
        "| session | floor: Spark pipelined rows/s, median (range) | sink rows/s, median (range) | **sink / floor, "
        "median (range) of per-round ratios** | per round | Spark serial rows/s (reference) | sink / Spark serial | "
        "write only rows/s (reference) | other processes, cores per round |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|",
        *throughput,
        "",
        "Median milliseconds per batch of each step of the sink (`SparkSink.step_timings`). `write` is Spark's own "
        "write of the batch (what the floor does); `arrow` and `dataframe` are built while the batch before is "
        "written, and `publish` and `checkpoint` while the batch after it is written; **added** is the work the "
        "sink adds to Spark's write per batch: plan + list (and fsync) the staged files + commit + publish (moves, "
        "fsyncs, `_spark_metadata`) + checkpoint. Start-up: from `EventProcessor.start()` to the first batch "
        "planned (claiming and fencing the partitions, the first batch's events read), once per run, outside the "
        "rows/s clock.",
        "",
        "| session | " + " | ".join(STEPS) + " | added | start-up (s) |",
        "|---|" + "---:|" * (len(STEPS) + 2),
        *latency,
        "",
        "*Spark serial* (the baseline before this floor) converts every batch to Arrow before its clock starts, "
        "then makes each DataFrame and writes it with Spark's defaults, one batch after the other: it leaves the "
        "conversion out of its clock but overlaps nothing. *Write only* builds the DataFrames before its clock "
        "too: on a classic session that moves Spark's ingestion of the data (Arrow into the driver's JVM) out of "
        "the clock, on Spark Connect it does not (a DataFrame is a plan until written). The sink's clock "
        "runs from its first batch planned to its last checkpoint and includes reading the source, converting "
        "events to Arrow and DataFrames, its commit log (in the checkpoint store, here in memory), staging with "
        "the Hadoop committer's algorithm 2 and no `_SUCCESS`, publishing, and one fenced checkpoint per partition "
        "per batch. *Other processes*: the CPU that processes outside the benchmark (its cluster included) used "
        "during each round, from `/proc`.",
    ])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Measure and print; with ``--record``, write the table to RESULTS.md. Example::

        python -m benchmarks.spark_sink --events 20000 --batch 5000 --rounds 2
    """
    parser = program.parser("spark_sink", __doc__, prog)
    parser.add_argument("--events", type=int, default=200_000, help="Events per round. [default: %(default)s]")
    parser.add_argument("--batch", type=int, default=10_000, help="Events per micro-batch. [default: %(default)s]")
    parser.add_argument("--partitions", type=int, default=4,
                        help="Partitions the events are spread over. [default: %(default)s]")
    parser.add_argument("--rounds", type=int, default=6,
                        help="Rounds per session; the paths take turns going first. [default: %(default)s]")
    parser.add_argument("--body-size", type=int, default=120,
                        help="Bytes per event body, about. [default: %(default)s]")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--master", help="A classic session on this master (e.g. spark://host:7077, local[2]) instead "
                                        "of a local cluster.")
    where.add_argument("--remote", help="A Spark Connect session (sc://host:port) instead of a local cluster.")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one session, a JSON line

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.events < args.batch or args.batch < args.partitions:
            parser.error("need events >= batch >= partitions")
        from eventprocessor.cli.user_errors import require, require_java

        require(purpose="the spark-sink benchmark", extras=["spark"])
        if args.remote is None:
            require_java("the spark-sink benchmark")
        return _run(args, run)

    return program.run("spark_sink", parser, body, argv)


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING)
    sizes = (args.events, args.batch, args.partitions, args.rounds, args.body_size)
    if args.master is not None or args.remote is not None:
        label = f"Spark Connect `{args.remote}`" if args.remote else f"classic `{args.master}`"
        # A child of the local-cluster run: its parent's process tree holds the cluster too.
        result = measure(*sizes, master=args.master, remote=args.remote, label=label,
                         load_root=os.getppid() if args.json else None)
        if args.json:
            print("RESULT " + result.to_json(), flush=True)
            return 0
        where = f"One session: {label}."
        run.report(_markdown([result], args, run.command, where))
        return 0
    results = _on_a_local_cluster(args)
    where = ("A standalone master, one worker (3 cores, 2 GB) and a Spark Connect server started on this machine "
             "from the pip `pyspark` package (`eventprocessor.emulators.spark_cluster`); "
             "each session runs in a process of its own. "
             "Classic: the driver in the benchmark's process, 2 cores of the worker (the Connect server's "
             "application holds the third). Connect: the Connect server's application, 1 core.")
    run.report(_markdown(results, args, run.command, where))
    return 0


def _on_a_local_cluster(args: argparse.Namespace) -> list[SessionResult]:
    from eventprocessor.emulators.spark_cluster import start_spark_cluster

    print("starting a Spark cluster on 127.0.0.1 (master, worker, Spark Connect)...", file=sys.stderr, flush=True)
    cluster = start_spark_cluster()
    results = []
    try:
        sizes = ["--events", str(args.events), "--batch", str(args.batch), "--partitions", str(args.partitions),
                 "--rounds", str(args.rounds), "--body-size", str(args.body_size), "--json"]
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        root = Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        for flag, url in (("--master", cluster.master_url), ("--remote", cluster.connect_url)):
            assert url is not None
            child = subprocess.run([sys.executable, "-m", "benchmarks.spark_sink", flag, url, *sizes], env=env,
                                   cwd=str(root), capture_output=True, text=True)
            for line in child.stdout.splitlines():
                if line.startswith("RESULT "):
                    results.append(SessionResult.from_json(line[len("RESULT "):]))
                else:
                    print(line, flush=True)
            if child.returncode != 0 or len(results) == 0:
                raise RuntimeError(f"the {flag} session failed (exit {child.returncode}): {child.stderr[-3000:]}")
    finally:
        cluster.stop()
    return results


if __name__ == "__main__":
    sys.exit(main())
