"""A streaming query from the eventhubs source into Parquet, run as a process of its own
by ``tests/test_spark_source.py`` (the tests SIGKILL it, or its Spark Connect server).

With ``--master`` it is the driver (a classic session in this process); with
``--remote`` it is a Spark Connect client and the server is the driver. It prints one
line per micro-batch (``batch <id> rows <n>``) and stops the query cleanly on SIGTERM.

    python tests/spark_source_worker.py --master spark://127.0.0.1:7077 --out /tmp/t --checkpoint /tmp/c \\
        --max-events 200        # the connection string comes from EVENTHUB_CONNECTION_STRING

``--wait-for PATH`` makes the session (a JVM, or a Connect client) first and starts the
query only once PATH exists: a test starts the driver that replaces a killed one ahead.
``--available-now`` runs the query with ``Trigger.AvailableNow`` until it stops by
itself, then prints ``batches [<input rows>, ...]``. ``--batch-read`` runs the tests'
batch reads instead (:func:`batch_read`, with ``--starting-positions`` and
``--ending-positions``) and prints ``read <json>``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

START = '{"offset": "-1", "seqNo": -1, "enqueuedTime": null, "isInclusive": true}'


def batch_read(spark: Any, conn: str, starting: str, ending: str) -> dict[str, Any]:
    """Two batch reads: the whole hub from its start (the schema and every row), and the
    rows between per-partition ``starting`` and ``ending`` positions (JSON)."""
    everything = (spark.read.format("eventhubs").option("eventhubs.connectionString", conn)
                  .option("eventhubs.startingPosition", START).load())
    rows = [{"partition": r.partition, "sequenceNumber": r.sequenceNumber, "offset": r.offset,
             "body": bytes(r.body).decode(), "publisher": r.publisher, "partitionKey": r.partitionKey,
             "properties": r.properties} for r in everything.collect()]
    bounded = (spark.read.format("eventhubs").option("eventhubs.connectionString", conn)
               .option("eventhubs.startingPosition", START)
               .option("eventhubs.startingPositions", starting)
               .option("eventhubs.endingPositions", ending).load()
               .select("partition", "sequenceNumber").collect())
    return {"schema": [[f.name, f.dataType.simpleString()] for f in everything.schema.fields], "rows": rows,
            "bounded": [[r.partition, r.sequenceNumber] for r in bounded]}


def main() -> int:
    parser = argparse.ArgumentParser()
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--master")
    where.add_argument("--remote")
    parser.add_argument("--out")
    parser.add_argument("--checkpoint")
    parser.add_argument("--max-events", type=int, default=200)
    parser.add_argument("--wait-for", help="start the query only once this file exists (the session is made first)")
    parser.add_argument("--available-now", action="store_true", help="Trigger.AvailableNow: read what is there, stop")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the source (overrides --max-events)")
    parser.add_argument("--from-store", action="store_true",
                        help="no startingPosition: the query starts after the checkpoint store's checkpoints")
    parser.add_argument("--batch-read", action="store_true", help="the batch reads of batch_read(), no query")
    parser.add_argument("--starting-positions", default="{}")
    parser.add_argument("--ending-positions", default="{}")
    args = parser.parse_args()
    if not args.batch_read and not (args.out and args.checkpoint):
        parser.error("a query needs --out and --checkpoint")

    began = time.monotonic()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())

    from eventprocessor.spark import EventHubsDataSource, spark_session

    if args.remote:
        spark = spark_session(remote=args.remote)
    else:
        spark = spark_session(args.master, {"spark.cores.max": "2", "spark.executor.memory": "512m",
                                            "spark.sql.shuffle.partitions": "2"})
        spark.sparkContext.setLogLevel("WARN")
    print(f"session after {time.monotonic() - began:.1f} s", flush=True)
    spark.dataSource.register(EventHubsDataSource)
    if args.batch_read:
        read = batch_read(spark, os.environ["EVENTHUB_CONNECTION_STRING"], args.starting_positions,
                          args.ending_positions)
        print("read " + json.dumps(read), flush=True)
        return 0
    while args.wait_for and not os.path.exists(args.wait_for):
        if stopping.wait(0.05):
            return 0
    options = {"eventhubs.connectionString": os.environ["EVENTHUB_CONNECTION_STRING"],
               "maxEventsPerTrigger": str(args.max_events)}
    if not args.from_store:
        options["eventhubs.startingPosition"] = START
    options.update(option.split("=", 1) for option in args.option)
    writer = (spark.readStream.format("eventhubs").options(**options).load()
              .writeStream.format("parquet").option("path", args.out).option("checkpointLocation", args.checkpoint))
    if args.available_now:
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime="200 milliseconds").start()
    print(f"query started after {time.monotonic() - began:.1f} s", flush=True)
    seen = -1
    while not stopping.is_set() and (query.isActive or not args.available_now):
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", flush=True)
            return 1
        progress = query.lastProgress
        # Attributes, not keys: over Spark Connect progress["numInputRows"] is None.
        if progress is not None and progress.batchId != seen:
            seen = progress.batchId
            print(f"batch {seen} rows {progress.numInputRows} at {time.monotonic() - began:.1f} s, ms "
                  f"{progress.durationMs}", flush=True)
        time.sleep(0.1)
    if args.available_now and not query.isActive:
        if query.exception() is not None:
            print(f"query failed: {query.exception()}", flush=True)
            return 1
        print("batches " + json.dumps([int(p.numInputRows) for p in query.recentProgress if p.numInputRows]),
              flush=True)
        return 0
    query.stop()
    print("query stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
