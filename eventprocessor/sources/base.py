"""The event-source interface: what the processor needs from a partitioned log.

Small on purpose. :class:`~eventprocessor.sources.MemoryEventSource` implements it
in-process; an adapter over ``azure.eventhub.aio.EventHubConsumerClient`` fits it too.
"""
from __future__ import annotations

import abc
from typing import List, Optional

from ..events import Event, EventPosition

__all__ = ["EventSource", "PartitionReceiver"]


class PartitionReceiver(abc.ABC):
    """An open receiver on one partition."""

    @abc.abstractmethod
    async def receive(self, max_batch_size: int, max_wait_time: Optional[float]) -> List[Event]:
        """Return up to ``max_batch_size`` events.

        Waits for at least one event; with ``max_wait_time`` set, returns ``[]`` after
        that many seconds without events. Raises
        :class:`~eventprocessor.errors.ReceiverDisconnectedError` once a receiver with
        a higher owner level has taken the partition.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the receiver. Safe to call twice."""


class EventSource(abc.ABC):
    """A partitioned event stream."""

    fully_qualified_namespace: str
    eventhub_name: str

    @abc.abstractmethod
    async def get_partition_ids(self) -> List[str]:
        """The current partition ids. Called every load-balancing tick."""

    @abc.abstractmethod
    async def open_receiver(
        self,
        partition_id: str,
        *,
        consumer_group: str,
        starting_position: EventPosition,
        owner_level: Optional[int],
        prefetch: int,
    ) -> PartitionReceiver:
        """Open a receiver. ``owner_level`` is the exclusive-receiver epoch."""

    async def close(self) -> None:
        """Close connections. Safe to call twice."""
