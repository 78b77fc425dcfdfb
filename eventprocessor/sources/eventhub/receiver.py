"""What both ways of receiving a partition share (:mod:`.lean` and :mod:`.fallback`):
the partition, consumer group, position and owner level, how a client error becomes
this SDK's error (a takeover, or a classified :class:`EventSourceError`), and the narrow
link through which a receiver reaches its source (:class:`SourceLink`).

A receiver never holds its :class:`~.source.EventHubSource`: it gets a
:class:`SourceLink` with the few things it needs of it (the hub's name, the operation
timeout, how to classify errors, the hub's throttling shared by every receiver, and a
way to say the lean path is not available), so that the source's state stays the
source's.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import EventSourceError, ReceiverDisconnectedError
from ...events import EventPosition
from ..base import LastEnqueuedEventProperties, PartitionReceiver
from .failures import ErrorContext, official_type, taken_over, with_official_type

__all__ = ["PartitionReceiverBase", "SourceLink", "Throttle"]

logger = logging.getLogger(__name__)


class Throttle:
    """The hub's answer "server busy" (``com.microsoft:server-busy``): until when every
    receiver of a source waits before opening (Event Hubs throttles a namespace, not a
    link). ``describe`` names the source in the warning, ``clock`` is monotonic seconds."""

    def __init__(self, describe: Callable[[], str], clock: Callable[[], float] = time.monotonic) -> None:
        self._describe = describe
        self.clock = clock
        self._until = float("-inf")

    def note(self, error: EventSourceError) -> EventSourceError:
        """Remember a server-busy answer's retry-after; return ``error``."""
        if error.reason == "server-busy" and error.retry_after:
            now = self.clock()
            if self._until <= now:  # once per throttling episode, not per partition
                logger.warning("%s: the hub is throttling (server busy); no receiver is opened for %.1f s",
                               self._describe(), error.retry_after)
            self._until = max(self._until, now + error.retry_after)
        return error

    def remaining(self) -> float:
        """Seconds left to wait (0 when the hub is not throttling)."""
        return max(0.0, self._until - self.clock())

    async def wait(self) -> None:
        delay = self.remaining()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass(frozen=True)
class SourceLink:
    """What a partition receiver needs of its source, and nothing more."""

    eventhub_name: str
    operation_timeout: float
    errors: ErrorContext
    throttle: Throttle
    use_public_receive: Callable[[], None]
    """Called when the installed azure-eventhub turns out not to offer what the lean
    path drives: the source opens its next receivers on the public path."""


class PartitionReceiverBase(PartitionReceiver):
    """What both receive paths share: the partition, group, position and owner level,
    and how a client error becomes this SDK's error."""

    def __init__(self, link: SourceLink, client: Any, partition_id: str, consumer_group: str,
                 position: EventPosition, owner_level: int | None, prefetch: int, track: bool = False) -> None:
        self._link = link
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
        """``error`` of the client as this SDK's error, which is also the exception
        azure-eventhub raises for it (``ConnectionLostError`` for a takeover, ...)."""
        if isinstance(error, (EventSourceError, ReceiverDisconnectedError)):
            return error
        link = self._link
        if taken_over(error):
            return with_official_type(ReceiverDisconnectedError(
                f"receiver on partition {self.partition_id} of {link.eventhub_name!r} (owner level "
                f"{self._owner_level}) was taken over by a higher owner level", partition_id=self.partition_id),
                official_type("disconnected", error))
        return link.throttle.note(link.errors.classify(error, doing, consumer_group=self.consumer_group,
                                                       partition_id=self.partition_id))
