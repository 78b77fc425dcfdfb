"""Spark source throughput: rows/s from the Event Hubs emulator into Parquet through
``spark.readStream.format("eventhubs")``, at 1, 2 and 4 executor cores, beside the
emulator's ceiling and the Spark sink path on the same events; and the end-to-end
latency of each micro-batch under a steady stream.

Run it with ``python -m benchmarks.spark_source`` (or ``eventprocessor bench
spark-source``). It starts its own Event Hubs emulator (``eventprocessor.emulators.eventhubs``, its own
process) and its own standalone Spark cluster (a master and one worker offering the
largest core count asked for; no Connect server), fills one hub with ``--events``
events (the official producer) and measures, in the same run, every round, the paths
taking turns going first:

* **ceiling**: azure-eventhub's ``EventHubConsumerClient`` alone (no checkpoints, no
  Spark) reading the hub from the start in this process: what the emulator and the
  official client give one process;
* **receive**: this SDK's ``EventHubSource`` receivers alone (the lean receive path the
  source's tasks use), one per partition in one process: the floor of work any reader
  of these events does;
* **source N cores**: a ``Trigger.AvailableNow`` query of the source into Parquet, in a
  classic session of its own (a child process: its own application) with
  ``spark.cores.max`` = N; rows/s over the batches after the first (the first includes
  the executor's start and the Python workers'), and over the whole run;
* **sink**: an ``EventProcessor`` with ``EventHubSource`` feeding this SDK's
  ``SparkSink`` (Parquet, 2 cores, the commit log in an in-memory store) the same events:
  the other way into Spark.

Each path reads its own consumer group. Then, under a steady stream (``--rate`` events/s
for ``--latency-seconds``), a running query (2 cores, default trigger) reports, for every
event, the seconds from its enqueued time to the end of the micro-batch that wrote it
(each batch's files are read back through ``_spark_metadata``), and each batch's
duration.

The machine has 2 cores: 4 executor cores are 4 task slots on 2 CPUs, which the table
says. With ``--record``, results go to ``benchmarks/RESULTS.md`` (section
``spark_source``).
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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.spark_files import batch_files

from .toolkit import program
from .toolkit.machine import load_average
from .toolkit.report import number, value_range

__all__ = ["main", "Measure"]

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
HUB, LIVE = "bench", "live"
GROUPS = ("ceiling", "receive", "sink")


@dataclass
class Measure:
    """One path in one round."""

    path: str
    rows: int
    seconds: float
    rows_per_s: float
    whole_run_rows_per_s: float = 0.0
    batches: list[tuple[int, int]] = field(default_factory=list)  # (rows, ms)


# ----------------------------------------------------------------------------- filling


async def fill(conn: str, events: int, body_size: int) -> float:
    """Send ``events`` events round the partitions with the official producer; events/s."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    pad = "x" * max(0, body_size - 60)
    producer = EventHubProducerClient.from_connection_string(conn)
    began = time.perf_counter()
    async with producer:
        ids = await producer.get_partition_ids()
        per = events // len(ids)
        for pid in ids:
            for start in range(0, per, 500):
                batch = await producer.create_batch(partition_id=pid)
                for i in range(start, min(per, start + 500)):
                    event = EventData(json.dumps({"device": f"d{i % 997}", "reading": i * 0.5, "pad": pad}))
                    event.properties = {"kind": "reading"}
                    batch.add(event)
                await producer.send_batch(batch)
    return per * len(ids) / (time.perf_counter() - began)


# ----------------------------------------------------------------------------- the paths in this process


async def ceiling(conn: str, total: int) -> Measure:
    """azure-eventhub's consumer alone, from the start, until ``total`` events."""
    from azure.eventhub.aio import EventHubConsumerClient

    seen = 0
    first: list[float] = []
    done = asyncio.Event()

    async def on_batch(_context: Any, events: list[Any]) -> None:
        nonlocal seen
        if events and not first:
            first.append(time.perf_counter())
        seen += len(events)
        if seen >= total:
            done.set()

    client = EventHubConsumerClient.from_connection_string(conn, consumer_group="ceiling")
    task = asyncio.create_task(client.receive_batch(on_batch, starting_position="-1", max_batch_size=300,
                                                    prefetch=300, max_wait_time=1))
    try:
        await asyncio.wait_for(done.wait(), 600)
        ended = time.perf_counter()
    finally:
        await client.close()
        await asyncio.gather(task, return_exceptions=True)
    return Measure("ceiling", seen, ended - first[0], seen / (ended - first[0]))


async def receive(conn: str, total: int, prefetch: int) -> Measure:
    """This SDK's receivers alone: every partition read concurrently in this process."""
    from eventprocessor.events import EventPosition
    from eventprocessor.sources.eventhub import EventHubSource

    source = EventHubSource.from_connection_string(conn)
    ids = await source.get_partition_ids()
    counts = {pid: 0 for pid in ids}
    per = total // len(ids)
    first: list[float] = []

    async def one(pid: str) -> None:
        receiver = await source.open_receiver(pid, consumer_group="receive", starting_position=EventPosition.earliest(),
                                              owner_level=None, prefetch=prefetch)
        try:
            while counts[pid] < per:
                events = await receiver.receive(1000, 30)
                if not events:
                    raise RuntimeError(f"partition {pid} stopped at {counts[pid]} of {per} events")
                if not first:
                    first.append(time.perf_counter())
                counts[pid] += len(events)
        finally:
            await receiver.close()

    try:
        await asyncio.gather(*(one(pid) for pid in ids))
        ended = time.perf_counter()
    finally:
        await source.close()
    rows = sum(counts.values())
    return Measure("receive", rows, ended - first[0], rows / (ended - first[0]))


# ----------------------------------------------------------------------------- child processes (sessions)


def _session(master: str, cores: int) -> Any:
    from eventprocessor.spark import EventHubsDataSource, spark_session

    spark = spark_session(master, {"spark.cores.max": str(cores), "spark.executor.cores": str(cores),
                                   "spark.executor.memory": "1g", "spark.sql.shuffle.partitions": str(cores),
                                   "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(EventHubsDataSource)
    return spark


def child_source(args: argparse.Namespace) -> dict[str, Any]:
    """One AvailableNow run of the source into Parquet, timed from Spark's progress."""
    spark = _session(args.master, args.cores)
    out = Path(args.out)
    began = time.perf_counter()
    query = (spark.readStream.format("eventhubs").option("eventhubs.connectionString", args.conn)
             .option("eventhubs.startingPosition", '{"offset": "-1"}')
             .option("maxEventsPerTrigger", args.batch).option("eventhubs.prefetchCount", args.prefetch)
             .load().writeStream.format("parquet").option("path", str(out / "table"))
             .option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    wall = time.perf_counter() - began
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p.numInputRows]
    batches = [(int(p.numInputRows), int(p.durationMs["triggerExecution"])) for p in progress]
    rows = sum(r for r, _ms in batches)
    written = spark.read.parquet(str(out / "table")).count()
    if written != rows:
        raise RuntimeError(f"the table holds {written} rows, the batches read {rows}")
    steady = batches[1:] or batches
    steady_seconds = sum(ms for _r, ms in steady) / 1000
    return {"rows": rows, "seconds": steady_seconds, "rows_per_s": sum(r for r, _ in steady) / steady_seconds,
            "whole_run_rows_per_s": rows / wall, "batches": batches}


def child_sink(args: argparse.Namespace) -> dict[str, Any]:
    """EventProcessor + EventHubSource + SparkSink into Parquet, until every event is committed."""
    from eventprocessor import EventProcessor, LoadBalancingStrategy
    from eventprocessor.sources.eventhub import EventHubSource
    from eventprocessor.spark import SparkSink
    from eventprocessor.stores import InMemoryCheckpointStore

    spark = _session(args.master, args.cores)
    spark.range(args.cores * 2).repartition(args.cores).count()  # the executor starts before the clock does
    total = args.events

    async def run() -> dict[str, Any]:
        source = EventHubSource.from_connection_string(args.conn)
        store = InMemoryCheckpointStore()
        first_plan: list[float] = []

        def clock(step: str) -> None:
            if step == "after_plan" and not first_plan:
                first_plan.append(time.perf_counter())

        sink = SparkSink(str(Path(args.out) / "table"), spark=spark, commit_log=store, max_events=args.batch,
                         max_bytes=1 << 40, max_interval=5.0, step_hook=clock)
        processor = EventProcessor(source, store, sink, consumer_group="sink", load_balancing_interval=0.1,
                                   partition_ownership_expiration_interval=60, max_batch_size=1000,
                                   prefetch=args.prefetch, load_balancing_strategy=LoadBalancingStrategy.GREEDY)
        await processor.start()
        try:
            while sink.events_committed < total:
                await asyncio.sleep(0.01)
            ended = time.perf_counter()
        finally:
            await processor.stop()
            await sink.close()
            await source.close()
        seconds = ended - first_plan[0]
        return {"rows": sink.events_committed, "seconds": seconds, "rows_per_s": sink.events_committed / seconds,
                "batches": [], "whole_run_rows_per_s": 0.0}

    return asyncio.run(run())


def child_latency(args: argparse.Namespace) -> dict[str, Any]:
    """A running query (default trigger) while events arrive at a steady rate: per event,
    the seconds from its enqueued time to the end of the batch that wrote it. A warm-up
    burst first starts the executor and its receivers; its batches are not counted."""
    import pyarrow.parquet as pq

    spark = _session(args.master, args.cores)
    out = Path(args.out)
    query = (spark.readStream.format("eventhubs").option("eventhubs.connectionString", args.conn)
             .option("eventhubs.startingPosition", '{"offset": "-1"}').load()
             .writeStream.format("parquet").option("path", str(out / "table"))
             .option("checkpointLocation", str(out / "checkpoint")).start())
    ends: dict[int, float] = {}
    durations: list[int] = []
    warm_up = 400
    asyncio.run(_steady(args.conn, 2000.0, warm_up / 2000.0))  # the executor and its receivers start here
    done: set = set()
    deadline = time.monotonic() + 180
    while sum(int(p.numInputRows) for p in query.recentProgress) < warm_up:
        if time.monotonic() > deadline or query.exception() is not None:
            raise RuntimeError(f"the query did not read the warm-up events: {query.exception()}")
        time.sleep(0.2)
    done.update(p.batchId for p in query.recentProgress)
    print("READY", flush=True)  # the parent sends the measured stream now
    deadline = time.monotonic() + args.latency_seconds + 120
    rows = 0
    while rows < args.events and time.monotonic() < deadline:
        for p in query.recentProgress:
            if p.numInputRows and p.batchId not in ends and p.batchId not in done:
                started = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
                ends[p.batchId] = started + p.durationMs["triggerExecution"] / 1000
                durations.append(int(p.durationMs["triggerExecution"]))
                rows += int(p.numInputRows)
        time.sleep(0.2)
    query.stop()
    latencies: list[float] = []
    for batch, paths in batch_files(out / "table" / "_spark_metadata").items():
        if batch not in ends:
            continue
        for path in paths:
            times = pq.read_table(path.replace("file://", "").replace("file:", ""), columns=["enqueuedTime"])
            latencies.extend(ends[batch] - (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
                             for t in times.column(0).to_pylist())
    latencies.sort()
    return {"events": len(latencies), "batches": len(durations),
            "p50": latencies[len(latencies) // 2] if latencies else 0.0,
            "p95": latencies[int(len(latencies) * 0.95)] if latencies else 0.0,
            "max": latencies[-1] if latencies else 0.0,
            "batch_ms_median": statistics.median(durations) if durations else 0,
            "batch_ms_max": max(durations) if durations else 0}


def _child(kind: str, args: argparse.Namespace, *, conn: str, cores: int, out: Path,
           on_ready: Any | None = None) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.spark_source", "--child", kind, "--master", args.master_url,
               "--conn", conn, "--cores", str(cores), "--out", str(out), "--batch", str(args.batch),
               "--prefetch", str(args.prefetch), "--events", str(args.latency_events if kind == "latency" else
                                                                  args.events),
               "--latency-seconds", str(args.latency_seconds)]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen(command, cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    result: dict[str, Any] | None = None
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("READY") and on_ready is not None:
            on_ready()
        elif line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    stderr = process.stderr.read() if process.stderr else ""
    if process.wait() != 0 or result is None:
        raise RuntimeError(f"the {kind} run failed (exit {process.returncode}): {stderr[-3000:]}")
    return result


# ----------------------------------------------------------------------------- the run


def _load() -> str:
    return number(load_average())


def measure_all(args: argparse.Namespace) -> tuple[list[list[Measure]], dict[str, Any], dict[str, Any]]:
    from eventprocessor.emulators.eventhubs.process import start_emulator_process
    from eventprocessor.emulators.spark_cluster import start_spark_cluster

    info: dict[str, Any] = {}
    emulator_args = ["--eventhub", HUB, "--eventhub", LIVE, "--partitions", str(args.partitions),
                     "--max-events-per-partition", str(args.events + args.latency_events + 1000)]
    for group in GROUPS:
        emulator_args += ["--consumer-group", group]
    print("starting the Event Hubs emulator and a Spark cluster on 127.0.0.1...", file=sys.stderr, flush=True)
    emulator = start_emulator_process(emulator_args)
    cluster = None
    workdir = Path(tempfile.mkdtemp(prefix="spark-source-bench-"))
    try:
        # The sink and the latency runs take 2 cores.
        cluster = start_spark_cluster(connect=False, worker_cores=max(2, *args.cores), worker_memory="3g")
        args.master_url = cluster.master_url
        conn, live = emulator.connection_string_for(HUB), emulator.connection_string_for(LIVE)
        info["producer_rows_per_s"] = asyncio.run(fill(conn, args.events, args.body_size))
        total = args.events // args.partitions * args.partitions
        paths = ["ceiling", "receive", *[f"source-{c}" for c in args.cores], "sink"]
        rounds: list[list[Measure]] = []
        for r in range(args.rounds):
            info.setdefault("round_loads", []).append(_load())  # the machine is shared: each round's load is shown
            measured: list[Measure] = []
            for path in paths[r % len(paths):] + paths[:r % len(paths)]:
                out = workdir / f"{path}-{r}"
                if path == "ceiling":
                    m = asyncio.run(ceiling(conn, total))
                elif path == "receive":
                    m = asyncio.run(receive(conn, total, args.prefetch))
                else:
                    cores = int(path.split("-")[1]) if path.startswith("source") else 2
                    kind = "source" if path.startswith("source") else "sink"
                    data = _child(kind, args, conn=conn, cores=cores, out=out)
                    m = Measure(path, **data)
                if m.rows != total:
                    raise RuntimeError(f"{path} read {m.rows} events of {total}")
                measured.append(m)
                print(f"round {r + 1} {path}: {m.rows_per_s:,.0f} rows/s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
            rounds.append(sorted(measured, key=lambda m: paths.index(m.path)))
        latency = _child("latency", args, conn=live, cores=2, out=workdir / "latency",
                         on_ready=lambda: asyncio.run(_steady(live, args.rate, args.latency_seconds)))
        return rounds, info, latency
    finally:
        if cluster is not None:
            cluster.stop()
        emulator.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def _steady(conn: str, rate: float, seconds: float) -> None:
    """Send ``rate`` events/s for ``seconds`` seconds, in batches of 50, round the partitions."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(conn)
    async with producer:
        ids = await producer.get_partition_ids()
        began = time.monotonic()
        sent = 0
        while sent < rate * seconds:
            pid = ids[(sent // 50) % len(ids)]
            await producer.send_batch([EventData(json.dumps({"i": sent + i})) for i in range(50)], partition_id=pid)
            sent += 50
            delay = began + sent / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)


# ----------------------------------------------------------------------------- report


def markdown(rounds: list[list[Measure]], info: dict[str, Any], latency: dict[str, Any], args: argparse.Namespace,
             head: str) -> str:
    by_path: dict[str, list[Measure]] = {}
    for measured in rounds:
        for m in measured:
            by_path.setdefault(m.path, []).append(m)
    ceiling_median = statistics.median(m.rows_per_s for m in by_path["ceiling"])
    labels = {"ceiling": "ceiling: azure-eventhub's consumer alone (1 process, no Spark)",
              "receive": "floor of the read: `EventHubSource` receivers alone (1 process, no Spark)",
              "sink": "sink path: `EventProcessor` + `SparkSink` into Parquet (2 executor cores)"}
    rows = []
    for path, measures in by_path.items():
        rates = [m.rows_per_s for m in measures]
        median = statistics.median(rates)
        label = labels.get(path) or f"**source, {path.split('-')[1]} executor core(s)**" + (
            " (4 task slots on 2 CPUs)" if path == "source-4" and (os.cpu_count() or 0) < 4 else "")
        whole = [m.whole_run_rows_per_s for m in measures if m.whole_run_rows_per_s]
        rows.append(f"| {label} | {median:,.0f} | {value_range(rates)} | **{median / ceiling_median:.2f}** | "
                    + (f"{statistics.median(whole):,.0f}" if whole else "") + " |")
    batch_rows = [f"{statistics.median(ms for m in by_path[p] for _r, ms in m.batches[1:]):,.0f}"
                  for p in by_path if p.startswith("source") and any(m.batches[1:] for m in by_path[p])]
    return "\n".join([
        "## Spark source: rows/s from Event Hubs into Parquet (`spark_source`)",
        "",
        head,
        "",
        f"The Event Hubs emulator (its own process) and a standalone Spark cluster (a master and one worker offering "
        f"{max(2, *args.cores)} cores), both started by the benchmark on 127.0.0.1. {args.events:,} events of ~"
        f"{args.body_size} bytes (JSON) with one property over {args.partitions} partitions, sent by the official "
        f"producer ({info['producer_rows_per_s']:,.0f} events/s). {args.rounds} rounds, the paths taking turns going "
        f"first. The source: a `Trigger.AvailableNow` query into Parquet, `maxEventsPerTrigger` {args.batch:,}, "
        f"prefetch {args.prefetch}, a classic session of its own per run; its rows/s are over the batches after the "
        "first (the first pays for the executor's start and its Python workers), the last column over the whole run "
        "from `start()`. Ratios are to the ceiling's median.",
        "",
        "| path | rows/s (median) | range over rounds | / ceiling | whole run rows/s (median) |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        "Median milliseconds per source micro-batch after the first, by core count: " + ", ".join(batch_rows) + ".",
        "",
        f"**Latency under a steady stream** ({args.rate:,.0f} events/s for {args.latency_seconds:.0f} s into a "
        f"running query, 2 executor cores, default trigger and `maxEventsPerTrigger`): {latency['events']:,} events "
        f"in {latency['batches']} micro-batches; from an event's enqueued time to the end of the micro-batch that "
        f"wrote it: p50 **{latency['p50']:.2f} s**, p95 {latency['p95']:.2f} s, max {latency['max']:.2f} s; a "
        f"micro-batch took {latency['batch_ms_median']:,.0f} ms (median), {latency['batch_ms_max']:,.0f} ms at most.",
        "",
        "The ceiling is one process of the official client, whose per-event decoding limits it (see `e2e`); the "
        "source reads with this SDK's receive path in every executor task (the floor row is that path alone, no "
        "Spark). Each source run is a new application: the first batch waits for an executor and its "
        "Python workers, which is why the whole-run figure is lower. The machine is shared: the range over rounds "
        "shows its load.",
    ])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Measure and print; with ``--record``, write the section of RESULTS.md. Example::

        python -m benchmarks.spark_source --events 50000 --rounds 2
    """
    parser = program.parser("spark_source", __doc__, prog)
    parser.add_argument("--events", type=int, default=100_000, help="events in the hub (default 100000)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch", type=int, default=25_000, help="maxEventsPerTrigger of the source")
    parser.add_argument("--prefetch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", type=lambda text: [int(c) for c in text.split(",")], default=[1, 2, 4],
                        help="executor core counts (default 1,2,4)")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s of the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--child", choices=["source", "sink", "latency"], help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--conn", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        logging.basicConfig(level=logging.WARNING)
        if args.child:
            child = {"source": child_source, "sink": child_sink, "latency": child_latency}[args.child]
            args.cores = args.cores if isinstance(args.cores, int) else args.cores[0]
            print("RESULT " + json.dumps(child(args)), flush=True)
            return 0
        from eventprocessor.cli.user_errors import require, require_java

        require(purpose="the spark-source benchmark", extras=["spark", "eventhub"])
        require_java("the spark-source benchmark")
        args.latency_events = int(args.rate * args.latency_seconds) // 50 * 50
        rounds, info, latency = measure_all(args)
        loads = ", ".join(info.get("round_loads", []))
        run.report(markdown(rounds, info, latency, args,
                            run.header(f"1-minute load average at the start of each round: {loads}.")))
        return 0

    return program.run("spark_source", parser, body, argv)


if __name__ == "__main__":
    sys.exit(main())
