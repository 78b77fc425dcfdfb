"""The event-source interface: what the processor needs from a partitioned log.

Small on purpose. :class:`~eventprocessor.sources.InMemoryEventSource` implements it
in-process; an adapter over ``azure.eventhub.aio.EventHubConsumerClient`` fits it too.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from datetime import datetime

from ..events import Event, EventPosition

__all__ = ["EventSource", "PartitionReceiver", "LastEnqueuedEventProperties", "PartitionProperties"]


@dataclass(frozen=True)
class PartitionProperties:
    """What the source says about one partition now (Event Hubs' partition properties)."""

    partition_id: str
    beginning_sequence_number: int
    last_enqueued_sequence_number: int
    last_enqueued_offset: str
    last_enqueued_time_utc: datetime | None
    is_empty: bool


@dataclass(frozen=True)
class LastEnqueuedEventProperties:
    """The newest event of a partition when the receiver last heard from the source
    (``track_last_enqueued_event_properties``), and when it heard it."""

    sequence_number: int
    offset: str
    enqueued_time: datetime | None
    retrieval_time: datetime | None


class PartitionReceiver(abc.ABC):
    """An open receiver on one partition."""

    @abc.abstractmethod
    async def receive(self, max_batch_size: int, max_wait_time: float | None) -> list[Event]:
        """Return up to ``max_batch_size`` events.

        Waits for at least one event; with ``max_wait_time`` set, returns ``[]`` after
        that many seconds without events. Raises
        :class:`~eventprocessor.errors.ReceiverDisconnectedError` once a receiver with
        a higher owner level has taken the partition.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the receiver. Safe to call twice."""

    @property
    def last_enqueued_event_properties(self) -> LastEnqueuedEventProperties | None:
        """The partition's newest event as of the last receive, when the receiver was
        opened with ``track_last_enqueued_event_properties=True``; else None."""
        return None


class EventSource(abc.ABC):
    """A partitioned event stream."""

    fully_qualified_namespace: str
    eventhub_name: str

    @abc.abstractmethod
    async def get_partition_ids(self) -> list[str]:
        """The current partition ids. Called every load-balancing tick."""

    @abc.abstractmethod
    async def open_receiver(
        self,
        partition_id: str,
        *,
        consumer_group: str,
        starting_position: EventPosition,
        owner_level: int | None,
        prefetch: int,
        track_last_enqueued_event_properties: bool = False,
    ) -> PartitionReceiver:
        """Open a receiver. ``owner_level`` is the exclusive-receiver epoch;
        ``track_last_enqueued_event_properties`` asks the source to report the partition's
        newest event with every receive (for lag)."""

    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        """The partition's newest event and bounds, for lag (``eventprocessor status``)."""
        raise NotImplementedError(f"{type(self).__name__} does not report partition properties")

    async def close(self) -> None:
        """Close connections. Safe to call twice."""
