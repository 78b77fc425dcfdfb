"""A minimal consumer: three processors share eight partitions of an in-memory stream.

Run it from the repository root:  python samples/basic_consumer.py
Swap InMemoryEventSource for a real source and InMemoryCheckpointStore for
BlobCheckpointStore/TableCheckpointStore to run the same code across hosts.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter

from eventprocessor import CloseReason, EventProcessor, PartitionContext, PartitionProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore

processed: Counter = Counter()


class CountingProcessor(PartitionProcessor):
    async def initialize(self, context: PartitionContext) -> None:
        print(f"{context.owner_id} took partition {context.partition_id}")

    async def process_events(self, events, context: PartitionContext) -> None:
        processed[context.owner_id] += len(events)
        await context.update_checkpoint()

    async def close(self, reason: CloseReason, context: PartitionContext) -> None:
        print(f"{context.owner_id} closed partition {context.partition_id}: {reason.value}")


async def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    source = InMemoryEventSource(8)
    store = InMemoryCheckpointStore()
    processors = [
        EventProcessor(source, store, CountingProcessor, owner_id=f"worker-{i}",
                       load_balancing_interval=0.2, partition_ownership_expiration_interval=2.0)
        for i in range(3)
    ]
    for processor in processors:
        await processor.start()
    for i in range(3000):
        await source.send(f"reading {i}", partition_key=f"sensor-{i % 50}")
    await asyncio.sleep(3)
    for processor in processors:
        print(processor.owner_id, "owns", sorted(processor.owned_partitions, key=int))
        await processor.stop()
    print("events processed per worker:", dict(processed), "total:", sum(processed.values()))


if __name__ == "__main__":
    asyncio.run(main())
