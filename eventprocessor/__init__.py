"""eventprocessor: consume a partitioned event stream across many processes.

Each partition has exactly one owner; ownership rebalances by itself as processes come
and go; consumers resume from fenced checkpoints.

Example::

    import asyncio
    from eventprocessor import EventProcessor, PartitionProcessor
    from eventprocessor.sources import MemoryEventSource
    from stores import InMemoryCheckpointStore

    class Printer(PartitionProcessor):
        async def process_events(self, events, context):
            for event in events:
                print(context.partition_id, event.body_as_str())
            await context.update_checkpoint()

    async def main():
        source = MemoryEventSource(4)
        for i in range(10):
            await source.send(f"event {i}")
        async with EventProcessor(source, InMemoryCheckpointStore(), Printer,
                                  load_balancing_interval=0.2,
                                  partition_ownership_expiration_interval=2):
            await asyncio.sleep(1)

    asyncio.run(main())
"""
from .balancer import LoadBalancingStrategy
from .checkpoint_store import CheckpointStore
from .errors import (CheckpointStoreError, ClaimOwnershipError, ConfigurationError, EventProcessorError,
                     OwnershipLostError, ReceiverDisconnectedError)
from .events import Event, EventPosition
from .partition import CloseReason, PartitionContext, PartitionProcessor
from .processor import BalanceReport, EventProcessor
from .records import Checkpoint, Ownership, OwnershipListing

__version__ = "0.1.0"

__all__ = [
    "EventProcessor", "PartitionProcessor", "PartitionContext", "CloseReason", "LoadBalancingStrategy",
    "EventPosition", "Event", "OwnershipLostError", "ReceiverDisconnectedError", "CheckpointStoreError",
    "ClaimOwnershipError", "ConfigurationError", "EventProcessorError", "CheckpointStore", "Ownership",
    "Checkpoint", "OwnershipListing", "BalanceReport", "__version__",
]
