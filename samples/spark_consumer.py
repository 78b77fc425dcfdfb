"""Two processors stream an in-memory event hub into one Parquet table through Spark.

Run it from the repository root (needs the ``[spark]`` extra; Java for a classic
session in this process)::

    python samples/spark_consumer.py                                 # local[*], in-memory store
    python samples/spark_consumer.py --store azurite                 # BlobCheckpointStore on Azurite
    python samples/spark_consumer.py --store azurite --master spark://127.0.0.1:7077   # a standalone cluster
    python samples/spark_consumer.py --store azurite --remote sc://127.0.0.1:15002     # Spark Connect
    python samples/spark_consumer.py --output /tmp/table --events 50000 --partitions 8

``python -m eventprocessor.emulators.spark_cluster`` starts a standalone master, a worker and a Spark
Connect server on this machine and prints their URLs.

Events are produced while the processors run; halfway through, one processor stops and
the other takes its partitions over. Each micro-batch is a Spark DataFrame (the sink's
schema plus the JSON body decoded into columns) appended to the table, partitioned by
``partition_id``, exactly once. With ``--store azurite`` the sink's commit log is kept in
the Blob store too, so nothing but the table needs a shared disk. The code is the same
for every kind of session: only ``spark_session(...)`` differs. At the end the sample
reads the table back and prints the row count of each partition.

With ``--store azurite`` it uses the Azurite already listening on 127.0.0.1:10000,
or starts one (``npm ci`` installs it) and stops it at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from eventprocessor import EventProcessor
from eventprocessor.cli.running import run_program
from eventprocessor.cli.user_errors import require_or_exit
from eventprocessor.emulators.azurite import port_open
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores.contract import CheckpointStore


async def open_store(kind: str, stack: AsyncExitStack) -> CheckpointStore:
    """The store; what it starts is stopped by ``stack`` on every way out."""
    if kind == "memory":
        from eventprocessor.stores import InMemoryCheckpointStore

        return InMemoryCheckpointStore()
    from eventprocessor.emulators.azurite import Azurite, start_azurite
    from eventprocessor.stores import BlobCheckpointStore

    if port_open(10000):
        emulator = Azurite(10000, 10001, 10002)
        print("store: Azurite already running on 127.0.0.1:10000")
    else:
        emulator = start_azurite()
        stack.callback(emulator.stop)
        print(f"store: started Azurite on 127.0.0.1:{emulator.blob_port}")
    container = f"spark-sample-{uuid.uuid4().hex[:8]}"
    store = BlobCheckpointStore.from_connection_string(emulator.connection_string, container)
    stack.push_async_callback(store.close)
    return store


async def produce(source: InMemoryEventSource, count: int, rate: float) -> None:
    for i in range(count):
        body = json.dumps({"device": f"sensor-{i % 40}", "temperature": 20 + (i % 100) / 10})
        await source.send(body, partition_key=f"sensor-{i % 40}", properties={"unit": "C"})
        if i % 500 == 499:
            await asyncio.sleep(500 / rate)


async def run(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from eventprocessor.spark import spark_session

    reading = pa.schema([("device", pa.string()), ("temperature", pa.float64())])
    output = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="spark-consumer-")) / "table"
    if output.exists() and any(output.iterdir()):
        print(f"{output} is not empty; this sample's in-memory event hub starts from sequence number 0, "
              "so give it an empty directory", file=sys.stderr)
        return 2
    # The one line that differs between a local session, a cluster and Spark Connect.
    spark = await asyncio.to_thread(spark_session, args.master, remote=args.remote)
    where = f"Spark Connect {args.remote.split('/;')[0]}" if args.remote else args.master or "local[*]"
    print(f"spark: {where} (Spark {spark.version})")  # a Connect URL's parameters (a token) are not printed
    source = InMemoryEventSource(args.partitions)
    async with AsyncExitStack() as stack:
        store = await open_store(args.store, stack)
        return await consume(args, spark, source, store, output, reading)


async def consume(args: argparse.Namespace, spark: Any, source: InMemoryEventSource, store: CheckpointStore,
                  output: Path, reading: Any) -> int:
    from eventprocessor.spark import SparkSink, json_body

    # With a shared checkpoint store, keep the commit log in it: no shared directory needed.
    commit_log: CheckpointStore | None = store if args.store != "memory" else None
    sinks: list[SparkSink] = []
    processors: list[EventProcessor] = []
    for i in range(2):
        sink = SparkSink(output, spark=spark, commit_log=commit_log, partition_by="partition_id",
                         decode=json_body(reading), max_events=args.max_events, max_interval=1.0)
        sinks.append(sink)
        processors.append(EventProcessor(source, store, sink, owner_id=f"spark-consumer-{i + 1}",
                                         load_balancing_interval=0.5, partition_ownership_expiration_interval=5))
    try:
        for processor in processors:
            await processor.start()
        producer = asyncio.create_task(produce(source, args.events, args.rate))
        while len(source.events("0")) < args.events // (2 * args.partitions) and not producer.done():
            await asyncio.sleep(0.2)
        print(f"{processors[0].owner_id} stops; {processors[1].owner_id} takes its partitions over")
        await processors[0].stop()
        await producer
        want = {pid: source.last_sequence_number(pid) for pid in await source.get_partition_ids()
                if source.events(pid)}
        deadline = time.monotonic() + args.timeout
        while await sinks[1].high_water_marks() != want:
            if time.monotonic() > deadline:
                print("timed out waiting for the sink to commit every event", file=sys.stderr)
                return 1
            await asyncio.sleep(0.2)
    finally:
        for processor in processors:
            await processor.stop()
        for sink in sinks:
            await sink.close()

    def report() -> tuple[int, int]:
        table = spark.read.parquet(str(output))
        rows = table.groupBy("partition_id").count().orderBy("partition_id").collect()
        total = table.count()
        distinct = table.select("partition_id", "sequence_number").distinct().count()
        print(f"table {output}: {total} rows, {distinct} distinct events, {args.events} produced")
        for row in rows:
            print(f"  partition {row.partition_id}: {row['count']} rows")
        table.groupBy("device").avg("temperature").orderBy("device").show(5)
        return total, distinct

    total, distinct = await asyncio.to_thread(report)
    return 0 if distinct == total == args.events else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", choices=["memory", "azurite"], default="memory")
    parser.add_argument("--output", help="an empty directory for the Parquet table (default: a new temp dir)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=10_000, help="events per second produced")
    parser.add_argument("--max-events", type=int, default=5_000, help="events per micro-batch at most")
    session = parser.add_mutually_exclusive_group()
    session.add_argument("--master", default=None, help="Spark master, e.g. spark://host:7077 (default: local[*])")
    session.add_argument("--remote", default=None, help="Spark Connect URL, e.g. sc://host:15002")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # Everything it needs, checked before it starts anything: a missing piece is one line naming the
    # fix. Java runs a classic session in this process; over Spark Connect (--remote) the server has it.
    azurite = args.store == "azurite"
    require_or_exit("samples/spark_consumer.py", extras=["spark"] + (["blob"] if azurite else []),
                    java=args.remote is None, azurite=azurite and not port_open(10000))
    return run_program(run(args))  # Ctrl-C and SIGTERM stop the Azurite it started, too


if __name__ == "__main__":
    sys.exit(main())
