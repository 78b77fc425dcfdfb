"""Event sources: the in-memory log, Azure Event Hubs, and the interface they implement.

``EventHubSource`` needs the ``[eventhub]`` extra and is imported lazily.
"""
from typing import Any

from .base import EventSource, LastEnqueuedEventProperties, PartitionProperties, PartitionReceiver
from .memory import InMemoryEventSource, InMemoryPartitionReceiver

__all__ = ["EventSource", "PartitionReceiver", "LastEnqueuedEventProperties", "PartitionProperties",
           "InMemoryEventSource", "InMemoryPartitionReceiver", "EventHubSource"]


def __getattr__(name: str) -> Any:
    if name == "EventHubSource":
        from .eventhub import EventHubSource

        return EventHubSource
    raise AttributeError(f"module 'eventprocessor.sources' has no attribute {name!r}")
