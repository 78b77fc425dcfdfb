"""One member of a live consumer group, for ``tests/test_status.py`` (and the docs'
screenshot of ``eventprocessor status --watch``).

Runs an ``EventProcessor`` on a ``BlobCheckpointStore`` (connection string from
``EVENTPROCESSOR_STORE_CONNECTION_STRING``, so it never shows in a process listing) over
its own ``InMemoryEventSource``. Every worker fills its source with the same events
(partition ``p`` gets ``events + p`` of them), so the checkpoints any owner writes agree:
after processing, partition ``p``'s checkpoint is sequence number ``events + p - 1``.
The handler checkpoints after every batch. One JSON line on stdout whenever the owned
partitions change, and every second. SIGTERM stops it gracefully (releasing its
partitions); the test may SIGKILL it instead.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

STORE_ENV = "EVENTPROCESSOR_STORE_CONNECTION_STRING"


async def _amain(args: argparse.Namespace) -> int:
    from eventprocessor import EventProcessor, PartitionProcessor
    from eventprocessor.sources import InMemoryEventSource
    from eventprocessor.stores.blob import BlobCheckpointStore

    class Checkpointing(PartitionProcessor):
        async def process_events(self, events, context):
            if args.delay:
                await asyncio.sleep(args.delay)
            await context.update_checkpoint()

    source = InMemoryEventSource(args.partitions, eventhub_name=args.eventhub, fully_qualified_namespace=args.namespace)
    for partition in range(args.partitions):
        await source.send_batch([f"event {i}" for i in range(args.events + partition)], partition_id=str(partition))
    store = BlobCheckpointStore.from_connection_string(os.environ[STORE_ENV], args.container)
    processor = EventProcessor(source, store, Checkpointing, owner_id=args.owner_id, consumer_group=args.consumer_group,
                               load_balancing_strategy="greedy", load_balancing_interval=args.interval,
                               partition_ownership_expiration_interval=args.expiry, max_batch_size=args.batch)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await processor.start()
    last: list[str] | None = None
    try:
        while not stop.is_set():
            owned = sorted(processor.owned_partitions, key=int)
            if owned != last or processor.ticks % 2 == 0:
                print(json.dumps({"owner": args.owner_id, "owned": owned, "ticks": processor.ticks}), flush=True)
                last = owned
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
    finally:
        await processor.stop()
        await store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--owner-id", required=True)
    parser.add_argument("--namespace", default="status-test.local")
    parser.add_argument("--eventhub", default="telemetry")
    parser.add_argument("--consumer-group", default="$default")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--events", type=int, default=5, help="events in partition 0; partition p gets events + p")
    parser.add_argument("--batch", type=int, default=300, help="max_batch_size (small: checkpoints advance slowly)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each batch takes")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--expiry", type=float, default=30.0)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(_amain(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
