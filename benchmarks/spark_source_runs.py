"""The child processes of ``benchmarks.spark_source``: each run of the source, of the
floor (a trivial Python data source with the source's schema) and of the sink path is
a Spark application of its own, started as ``python -m benchmarks.spark_source --child
KIND``; and the latency run (a running query under a steady stream).

Each function prints nothing and returns what the parent reports (rows, seconds,
rows/s, each micro-batch, the median time of each step of a micro-batch).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["STEPS", "child_source", "child_sink", "child_latency", "steady"]


def _session(master: str, cores: int) -> Any:
    from eventprocessor.spark import EventHubsDataSource, spark_session

    spark = spark_session(master, {"spark.cores.max": str(cores), "spark.executor.cores": str(cores),
                                   "spark.executor.memory": "1g", "spark.sql.shuffle.partitions": str(cores),
                                   "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(EventHubsDataSource)
    return spark


STEPS = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")
"""The steps of a micro-batch Spark times (``durationMs`` of its progress)."""


def _floor_source() -> type:
    """The floor: a Python streaming data source with the eventhubs source's schema whose
    every task yields one Arrow batch, built from constants (~1 ms). Defined in a
    function so that it is pickled by value (executors need nothing but pyspark)."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from eventprocessor.spark.source.datasource import SCHEMA
    from eventprocessor.spark.source.rows import ARROW_SCHEMA

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options: Mapping[str, str]) -> None:  # Spark's case-insensitive options
            self.total, self.batch = int(options["events"]), int(options["batch"])
            self.tasks, self.body = int(options["partitions"]), int(options["bodySize"])

        def initialOffset(self) -> dict:  # noqa: N802 - pyspark's names
            return {"n": 0}

        def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
            pass

        def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
            return {"n": min(self.total, start["n"] + self.batch)}

        def partitions(self, start: dict, end: dict) -> list:
            rows = (end["n"] - start["n"]) // self.tasks
            return [InputPartition((str(p), start["n"] // self.tasks, rows)) for p in range(self.tasks)]

        def read(self, partition: Any) -> Any:
            pid, first, n = partition.value
            body = b'{"device": "d1", "reading": 0.5, "pad": "' + b"x" * max(0, self.body - 45) + b'"}'
            yield pa.RecordBatch.from_arrays([
                pa.array([body] * n, pa.binary()), pa.array([pid] * n, pa.string()),
                pa.array([str(i * 100) for i in range(first, first + n)], pa.string()),
                pa.array(range(first, first + n), pa.int64()),
                pa.array([int(time.time() * 1e6)] * n, pa.int64()).cast(pa.timestamp("us", "UTC")),
                pa.nulls(n, pa.string()), pa.nulls(n, pa.string()),
                pa.MapArray.from_arrays(pa.array(range(n + 1), pa.int32()), pa.array(["kind"] * n),
                                        pa.array(['"reading"'] * n)),
                pa.MapArray.from_arrays(pa.array([0] * (n + 1), pa.int32()), pa.array([], pa.string()),
                                        pa.array([], pa.string()))], schema=ARROW_SCHEMA)

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "floor"

        def schema(self) -> Any:
            return SCHEMA

        def streamReader(self, schema: Any) -> Reader:  # noqa: N802
            return Reader(self.options)

    return Floor


def child_source(args: argparse.Namespace, floor: bool = False) -> dict[str, Any]:
    """One AvailableNow run of the source (or the floor) into Parquet, timed from Spark's
    progress: rows/s after the first batch, over the whole run, and each step's median."""
    spark = _session(args.master, args.cores)
    out = Path(args.out)
    if floor:
        spark.dataSource.register(_floor_source())
        reader = (spark.readStream.format("floor").option("events", args.events).option("batch", args.batch)
                  .option("partitions", args.partitions).option("bodySize", args.body_size))
    else:
        reader = (spark.readStream.format("eventhubs").option("eventhubs.connectionString", args.conn)
                  .option("eventhubs.startingPosition", '{"offset": "-1"}').option("maxEventsPerTrigger", args.batch)
                  .option("eventhubs.prefetchCount", args.prefetch))
    began = time.perf_counter()
    query = (reader.load().writeStream.format("parquet").option("path", str(out / "table"))
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
    steady = progress[1:] or progress
    steady_seconds = sum(int(p.durationMs["triggerExecution"]) for p in steady) / 1000
    steps = {step: statistics.median(int(p.durationMs.get(step, 0)) for p in steady) for step in STEPS}
    return {"rows": rows, "seconds": steady_seconds, "rows_per_s": sum(int(p.numInputRows) for p in steady)
            / steady_seconds, "whole_run_rows_per_s": rows / wall, "batches": batches, "steps": steps}


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
        return {"rows": sink.events_committed, "seconds": seconds, "rows_per_s": sink.events_committed / seconds}

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
    asyncio.run(steady(args.conn, 2000.0, warm_up / 2000.0))  # the executor and its receivers start here
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
    from harness.spark_files import batch_files  # needs pyarrow: only where the Spark runs are

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


async def steady(conn: str, rate: float, seconds: float) -> None:
    """Send ``rate`` events/s for ``seconds`` seconds, in batches of 50, round the partitions.
    A send that took longer than its share (the first to each partition opens its link)
    delays the rest instead of being made up for in a burst: the stream stays steady."""
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
            else:
                began -= delay
