"""eventprocessor: consume a partitioned event stream across many processes.

Each partition has exactly one owner; ownership rebalances by itself as processes come
and go; consumers resume from fenced checkpoints.

Example::

    import asyncio
    from eventprocessor import EventProcessor, PartitionProcessor
    from eventprocessor.sources import InMemoryEventSource
    from eventprocessor.stores import InMemoryCheckpointStore

    class Printer(PartitionProcessor):
        async def process_events(self, events, context):
            for event in events:
                print(context.partition_id, event.body_as_str())
            await context.update_checkpoint()

    async def main():
        source = InMemoryEventSource(4)
        for i in range(10):
            await source.send(f"event {i}")
        async with EventProcessor(source, InMemoryCheckpointStore(), Printer,
                                  load_balancing_interval=0.2,
                                  partition_ownership_expiration_interval=2):
            await asyncio.sleep(1)

    asyncio.run(main())
"""
from ._processor import OWNERSHIP_LOG_FIELDS, OWNERSHIP_REASONS, BalanceReport, EventProcessor, ProcessorStats, Timing
from ._runtime.clock import Clock
from ._version import __version__
from .consumer_client import ConsumerPartitionContext, EventHubConsumerClient
from .errors import (
                     CheckpointStoreError,
                     ClaimOwnershipError,
                     ConfigurationError,
                     EventProcessorError,
                     EventSourceError,
                     HandlerTimeoutError,
                     InvalidCheckpointError,
                     OwnershipLostError,
                     PoisonEventsError,
                     ReceiverDisconnectedError,
                     StaleEpochError,
                     StoreDataLostError,
                     StoreTimeoutError,
)
from .events import BodyType, Event, EventPosition
from .partition import PartitionContext, PartitionProcessor
from .policies import (
                     CloseReason,
                     FailurePolicy,
                     LoadBalancingStrategy,
                     LoadPolicy,
                     PoisonPolicy,
                     RetryPolicy,
                     StatePolicy,
)
from .stores.contract import CheckpointStore
from .stores.records import Checkpoint, Member, MemberListing, Ownership, OwnershipListing, UnreadableOwnership

__all__ = [
    # running a processor
    "EventProcessor", "PartitionProcessor", "PartitionContext", "CloseReason", "EventPosition", "Event",
    "BodyType", "ProcessorStats", "Timing", "BalanceReport", "Clock",
    # the policies (eventprocessor.policies)
    "LoadBalancingStrategy", "FailurePolicy", "PoisonPolicy", "RetryPolicy", "LoadPolicy", "StatePolicy",
    # what an ownership-change log record carries
    "OWNERSHIP_LOG_FIELDS", "OWNERSHIP_REASONS",
    # the drop-in for azure-eventhub's EventHubConsumerClient (callbacks)
    "EventHubConsumerClient", "ConsumerPartitionContext",
    # errors
    "EventProcessorError", "ConfigurationError", "OwnershipLostError", "ReceiverDisconnectedError",
    "InvalidCheckpointError", "PoisonEventsError", "HandlerTimeoutError", "CheckpointStoreError",
    "ClaimOwnershipError", "StoreTimeoutError", "StoreDataLostError", "StaleEpochError", "EventSourceError",
    # the store contract, for store implementers
    "CheckpointStore", "Ownership", "Checkpoint", "OwnershipListing", "UnreadableOwnership", "Member",
    "MemberListing",
    "__version__",
]
