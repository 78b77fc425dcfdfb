"""One processor process of the cluster tests: an ``EventProcessor`` reading an event
hub (the session's Event Hubs emulator) with ``EventHubSource``, ownership and
checkpoints in a ``BlobCheckpointStore`` on Azurite, and a ``SparkSink`` writing Parquet
through a Spark cluster, its commit log in that same Blob store.

Nothing is shared with the other processes but the hub, the storage account and the
output path: no commit-log directory, no Spark driver (``--mode classic``: this process
runs its own driver on ``spark://...``; ``--mode connect``: it is a client of the Spark
Connect server ``sc://...``).

Connection strings come from the environment (``EVENTPROCESSOR_TEST_HUB``,
``EVENTPROCESSOR_TEST_STORAGE``), never from the command line. With
``EVENTPROCESSOR_SPARK_KILL_AT=step:n`` the process SIGKILLs itself the ``n``-th time its
sink reaches ``step`` (see ``SparkSink(step_hook=...)``). SIGTERM stops it gracefully.
Its log goes to stderr.

    python tests/spark_cluster_worker.py --hub pool4-3 --container c --path /tmp/out \\
        --mode connect --spark sc://127.0.0.1:15002 --owner a
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventprocessor import EventProcessor, LoadBalancingStrategy  # noqa: E402
from eventprocessor.sources.eventhub import EventHubSource  # noqa: E402
from eventprocessor.spark import SparkSink, spark_session  # noqa: E402
from eventprocessor.stores import BlobCheckpointStore  # noqa: E402

logger = logging.getLogger("spark_cluster_worker")

CLASSIC_CONF: dict[str, str] = {
    # The cluster's worker is shared: one core and 512 MB of it for this application.
    "spark.cores.max": "1",
    "spark.executor.memory": "512m",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
}


def kill_hook() -> Callable[[str], None] | None:
    spec = os.environ.get("EVENTPROCESSOR_SPARK_KILL_AT")
    if not spec:
        return None
    point, _, nth = spec.partition(":")
    remaining = {"count": int(nth or 1)}

    def hook(step: str) -> None:
        if step == point:
            remaining["count"] -= 1
            if remaining["count"] <= 0:
                logger.warning("killing this process at %s", spec)
                logging.shutdown()
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


async def run(args: argparse.Namespace) -> int:
    if args.mode == "connect":
        spark = spark_session(remote=args.spark)
    else:
        spark = spark_session(args.spark, CLASSIC_CONF, app_name=f"processor-{args.owner}")
    source = EventHubSource.from_connection_string(os.environ["EVENTPROCESSOR_TEST_HUB"], eventhub_name=args.hub)
    store = BlobCheckpointStore.from_connection_string(os.environ["EVENTPROCESSOR_TEST_STORAGE"], args.container)
    sink = SparkSink(args.path, commit_log=store, spark=spark, max_events=args.max_events, max_interval=0.5,
                     step_hook=kill_hook())
    processor = EventProcessor(source, store, sink, owner_id=args.owner, load_balancing_interval=0.5,
                               partition_ownership_expiration_interval=args.expiry, max_batch_size=200,
                               prefetch=200, load_balancing_strategy=LoadBalancingStrategy.BALANCED)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await processor.start()
    logger.info("worker %s running (%s mode)", args.owner, args.mode)
    try:
        await stop.wait()
    finally:
        await processor.stop()
        await sink.close()
        await store.close()
        await source.close()
    logger.info("worker %s stopped: %d batches, %d events committed", args.owner, sink.batches_committed,
                sink.events_committed)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hub", required=True)
    parser.add_argument("--container", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--mode", choices=["classic", "connect"], required=True)
    parser.add_argument("--spark", required=True, help="spark://... (classic) or sc://... (connect)")
    parser.add_argument("--owner", required=True)
    parser.add_argument("--max-events", type=int, default=400)
    parser.add_argument("--expiry", type=float, default=6.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "azure", "uamqp", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
