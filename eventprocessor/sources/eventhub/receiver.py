"""What both ways of receiving a partition share (:mod:`.lean` and :mod:`.fallback`):
the partition, consumer group, position and owner level, and how a client error
becomes this SDK's error (a takeover, or a classified :class:`EventSourceError`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import EventSourceError, ReceiverDisconnectedError
from ...events import EventPosition
from ..base import LastEnqueuedEventProperties, PartitionReceiver
from .failures import taken_over

if TYPE_CHECKING:
    from .source import EventHubSource

__all__ = ["PartitionReceiverBase"]


class PartitionReceiverBase(PartitionReceiver):
    """What both receive paths share: the partition, group, position and owner level,
    and how a client error becomes this SDK's error."""

    def __init__(self, source: EventHubSource, client: Any, partition_id: str, consumer_group: str,
                 position: EventPosition, owner_level: int | None, prefetch: int, track: bool = False) -> None:
        self._source = source
        self._client = client
        self.partition_id = partition_id
        self.consumer_group = consumer_group
        self._position = position
        self._owner_level = owner_level
        self._prefetch = max(1, prefetch)
        self._track = track
        self._last_enqueued: LastEnqueuedEventProperties | None = None

    @property
    def last_enqueued_event_properties(self) -> LastEnqueuedEventProperties | None:
        return self._last_enqueued

    def __repr__(self) -> str:
        return (f"EventHubReceiver(partition_id={self.partition_id!r}, consumer_group={self.consumer_group!r}, "
                f"owner_level={self._owner_level})")

    def _translate(self, error: BaseException, doing: str = "receiving") -> Exception:
        if isinstance(error, (EventSourceError, ReceiverDisconnectedError)):
            return error
        if taken_over(error):
            return ReceiverDisconnectedError(
                f"receiver on partition {self.partition_id} of {self._source.eventhub_name!r} (owner level "
                f"{self._owner_level}) was taken over by a higher owner level", partition_id=self.partition_id)
        return self._source._note(self._source._errors.classify(error, doing, consumer_group=self.consumer_group,
                                                                partition_id=self.partition_id))
