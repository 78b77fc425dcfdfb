"""Event sources: the in-memory log and the interface real sources implement."""
from .base import EventSource, PartitionReceiver
from .memory import MemoryEventSource, MemoryPartitionReceiver

__all__ = ["EventSource", "PartitionReceiver", "MemoryEventSource", "MemoryPartitionReceiver"]
