"""Spark source throughput: rows/s from the Event Hubs emulator into Parquet through
``spark.readStream.format("eventhubs")``, at 1, 2 and 4 executor cores, beside the
floor (Spark with a trivial Python source), the ceiling (the official consumer) and the
Spark sink path on the same events; the time of each step of a micro-batch; and the
end-to-end latency of each micro-batch under a steady stream.

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
* **floor N cores**: the same query, batches and cluster, from a trivial Python
  streaming data source whose every task yields one ready Arrow batch of the source's
  schema (as many rows as the source's task): what Spark itself costs a Python source;
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
from pathlib import Path
from typing import Any

from .spark_source_runs import STEPS, child_latency, child_sink, child_source, steady
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
    steps: dict[str, float] = field(default_factory=dict)  # median ms of each step of a micro-batch


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


def _child(kind: str, args: argparse.Namespace, *, conn: str, cores: int, out: Path,
           on_ready: Any | None = None) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.spark_source", "--child", kind, "--master", args.master_url,
               "--conn", conn, "--cores", str(cores), "--out", str(out), "--batch", str(args.batch),
               "--prefetch", str(args.prefetch), "--events", str(args.latency_events if kind == "latency" else
                                                                  args.events),
               "--latency-seconds", str(args.latency_seconds), "--partitions", str(args.partitions),
               "--body-size", str(args.body_size)]
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
        paths = ["ceiling", "receive", *[f"{kind}-{c}" for c in args.cores for kind in ("floor", "source")], "sink"]
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
                    kind, _, cores = path.partition("-")
                    data = _child(kind, args, conn=conn, cores=int(cores or 2), out=out)
                    m = Measure(path, **data)
                if m.rows != total:
                    raise RuntimeError(f"{path} read {m.rows} events of {total}")
                measured.append(m)
                print(f"round {r + 1} {path}: {m.rows_per_s:,.0f} rows/s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
            rounds.append(sorted(measured, key=lambda m: paths.index(m.path)))
        latency = _child("latency", args, conn=live, cores=2, out=workdir / "latency",
                         on_ready=lambda: asyncio.run(steady(live, args.rate, args.latency_seconds)))
        return rounds, info, latency
    finally:
        if cluster is not None:
            cluster.stop()
        emulator.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------- report


def _ratio(rounds: list[list[Measure]], path: str, to: str) -> str:
    """The median (range) over rounds of ``path``'s rows/s over ``to``'s in the same round."""
    ratios = [mine.rows_per_s / theirs.rows_per_s for measured in rounds
              for mine in measured if mine.path == path for theirs in measured if theirs.path == to]
    return f"**{statistics.median(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else ""


def _label(path: str) -> str:
    kind, _, cores = path.partition("-")
    slots = " (4 task slots on 2 CPUs)" if cores == "4" and (os.cpu_count() or 0) < 4 else ""
    return {"ceiling": "ceiling: azure-eventhub's consumer alone (1 process, no Spark)",
            "receive": "the read alone: `EventHubSource` receivers (1 process, no Spark)",
            "sink": "sink path: `EventProcessor` + `SparkSink` into Parquet (2 executor cores)",
            "floor": f"floor: a trivial Python source, {cores} executor core(s){slots}",
            "source": f"**source, {cores} executor core(s)**{slots}"}[kind]


def markdown(rounds: list[list[Measure]], info: dict[str, Any], latency: dict[str, Any], args: argparse.Namespace,
             head: str) -> str:
    by_path: dict[str, list[Measure]] = {}
    for measured in rounds:
        for m in measured:
            by_path.setdefault(m.path, []).append(m)
    rows, steps = [], []
    for path, measures in by_path.items():
        rates = [m.rows_per_s for m in measures]
        whole = [m.whole_run_rows_per_s for m in measures if m.whole_run_rows_per_s]
        floor = _ratio(rounds, path, "floor-" + path.partition("-")[2]) if path.startswith("source") else ""
        rows.append(f"| {_label(path)} | {statistics.median(rates):,.0f} | {value_range(rates)} | {floor} | "
                    f"{_ratio(rounds, path, 'ceiling')} | " + (f"{statistics.median(whole):,.0f}" if whole else "")
                    + " |")
        if measures[0].steps:
            steps.append(f"| {_label(path)} | " + " | ".join(
                f"{statistics.median(m.steps[step] for m in measures):,.0f}" for step in STEPS) + " |")
    return "\n".join([
        "## Spark source: rows/s from Event Hubs into Parquet (`spark_source`)",
        "",
        head,
        "",
        f"The Event Hubs emulator (its own process) and a standalone Spark cluster (a master and one worker offering "
        f"{max(2, *args.cores)} cores), both started by the benchmark on 127.0.0.1. {args.events:,} events of ~"
        f"{args.body_size} bytes (JSON) with one property over {args.partitions} partitions, sent by the official "
        f"producer ({info['producer_rows_per_s']:,.0f} events/s). {args.rounds} rounds, the paths taking turns going "
        f"first. The source and the floor: a `Trigger.AvailableNow` query into Parquet, {args.batch:,} rows per "
        f"micro-batch (`maxEventsPerTrigger`; prefetch {args.prefetch}), {args.partitions} tasks of "
        f"{args.batch // args.partitions:,} rows each, a classic session of its own per run; rows/s over the batches "
        "after the first (the first pays for the executor's start, its Python workers and the source's reader "
        "processes), the last column over the whole run from `start()`. The floor's tasks each yield one Arrow batch "
        "of the source's schema built from constants: Spark's own cost for a Python source. Ratios are the median "
        "(range) of the per-round ratios (each round's paths ran back to back).",
        "",
        "| path | rows/s (median) | range over rounds | / floor | / ceiling | whole run rows/s (median) |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Median milliseconds of each step of a micro-batch after the first (Spark's `durationMs`; `addBatch` is the "
        "tasks: reading the source and writing Parquet, the rest runs on the driver):",
        "",
        "| path | " + " | ".join(f"`{step}`" for step in STEPS) + " |",
        "|---|" + "---:|" * len(STEPS),
        *steps,
        "",
        f"**Latency under a steady stream** ({args.rate:,.0f} events/s for {args.latency_seconds:.0f} s into a "
        f"running query, 2 executor cores, default trigger and `maxEventsPerTrigger`): {latency['events']:,} events "
        f"in {latency['batches']} micro-batches; from an event's enqueued time to the end of the micro-batch that "
        f"wrote it: p50 **{latency['p50']:.2f} s**, p95 **{latency['p95']:.2f} s**, max {latency['max']:.2f} s; a "
        f"micro-batch took {latency['batch_ms_median']:,.0f} ms (median), {latency['batch_ms_max']:,.0f} ms at most.",
        "",
        "The ceiling is one process of the official client, whose per-event decoding limits it (see `e2e`). The "
        "source's executors take each range from the reader process that received and decoded it ahead. Each run is "
        "a new application, which is why the whole-run figure is lower. The emulator serves every event from a "
        "process on the same 2 CPUs as Spark (a real namespace is remote). The machine is shared: the range over "
        "rounds shows its load.",
    ])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Measure and print; with ``--record``, write the section of RESULTS.md. Example::

        python -m benchmarks.spark_source --events 50000 --rounds 2
    """
    parser = program.parser("spark_source", __doc__, prog)
    parser.add_argument("--events", type=int, default=100_000, help="Events in the hub. [default: %(default)s]")
    parser.add_argument("--partitions", type=int, default=8, help="Partitions of the hub. [default: %(default)s]")
    parser.add_argument("--batch", type=int, default=25_000, help="MaxEventsPerTrigger of the source. "
                                                                  "[default: %(default)s]")
    parser.add_argument("--prefetch", type=int, default=500,
                        help="Eventhubs.prefetchCount of the source, and the prefetch of the other paths. "
                             "[default: %(default)s]")
    parser.add_argument("--rounds", type=int, default=3,
                        help="Rounds; the paths take turns going first. [default: %(default)s]")
    parser.add_argument("--cores", type=lambda text: [int(c) for c in text.split(",")], default=[1, 2, 4],
                        help="Executor core counts. [default: 1,2,4]")
    parser.add_argument("--body-size", type=int, default=100,
                        help="Bytes per event body (JSON). [default: %(default)s]")
    parser.add_argument("--rate", type=float, default=1000.0, help="Events/s of the latency phase. "
                                                                   "[default: %(default)s]")
    parser.add_argument("--latency-seconds", type=float, default=20.0,
                        help="Length of the latency phase, in seconds. [default: %(default)s]")
    parser.add_argument("--child", choices=["source", "floor", "sink", "latency"], help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--conn", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        logging.basicConfig(level=logging.WARNING)
        if args.child:
            child = {"source": child_source, "floor": lambda a: child_source(a, floor=True), "sink": child_sink,
                     "latency": child_latency}[args.child]
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
