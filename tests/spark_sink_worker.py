"""A processor with a SparkSink in its own process, for the kill tests.

The event log is deterministic: partition ``p`` holds ``--events`` events with bodies
``p:i`` (a replayable log, like a real event hub's retention). The checkpoint store is
a ``BlobCheckpointStore`` on the storage account whose connection string is in
``EVENTPROCESSOR_TEST_STORAGE`` (kept out of the command line), so checkpoints and
ownership survive the process. Set
``EVENTPROCESSOR_SPARK_KILL_AT`` to make the sink SIGKILL this process at that point of
its first batch. Exits 0 once the commit log has every event of every partition.

    EVENTPROCESSOR_TEST_STORAGE=... python tests/spark_sink_worker.py --path /tmp/out --container c1
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventprocessor import EventProcessor, LoadBalancingStrategy  # noqa: E402
from eventprocessor.sources import InMemoryEventSource  # noqa: E402
from eventprocessor.spark import SparkSink, spark_session  # noqa: E402
from eventprocessor.stores import BlobCheckpointStore  # noqa: E402


def kill_point() -> Callable[[str], None] | None:
    """A step hook that SIGKILLs this process the first time the sink reaches
    ``$EVENTPROCESSOR_SPARK_KILL_AT``."""
    point = os.environ.get("EVENTPROCESSOR_SPARK_KILL_AT")
    if not point:
        return None
    import signal

    def kill_at(reached: str) -> None:
        if reached == point:
            logging.getLogger(__name__).warning("killing this process at %s", point)
            os.kill(os.getpid(), signal.SIGKILL)

    return kill_at


async def run(path: str, partitions: int, events: int, max_events: int, container: str, deadline: float) -> int:
    source = InMemoryEventSource(partitions)
    for i in range(events):
        for p in range(partitions):
            source.append(f"{p}:{i}", partition_id=str(p))
    spark = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2"})
    sink = SparkSink(path, spark=spark, max_events=max_events, max_interval=0.3, step_hook=kill_point())
    store = BlobCheckpointStore.from_connection_string(os.environ["EVENTPROCESSOR_TEST_STORAGE"], container)
    # Short leases: a killed worker's partitions expire quickly for the next one.
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=2, max_batch_size=100,
                               load_balancing_strategy=LoadBalancingStrategy.GREEDY)
    await processor.start()
    want = {str(p): events - 1 for p in range(partitions)}
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            if sink.commit_log is not None and await sink.high_water_marks() == want:
                return 0
        print("timed out", await sink.high_water_marks(), file=sys.stderr)
        return 2
    finally:
        await processor.stop()
        await sink.close()
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--max-events", type=int, default=300)
    parser.add_argument("--container", required=True, help="blob container of the checkpoint store")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return asyncio.run(run(args.path, args.partitions, args.events, args.max_events, args.container,
                           time.monotonic() + args.timeout))


if __name__ == "__main__":
    sys.exit(main())
