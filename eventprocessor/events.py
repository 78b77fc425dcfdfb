"""Events and positions in a partition.

:class:`Event` carries the attribute names of ``azure.eventhub.EventData`` so that
handler code moves between this SDK's sources and the real Event Hubs client.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Optional, Union

__all__ = ["Event", "EventPosition"]


@dataclass(frozen=True)
class Event:
    """One event of a partition.

    Example::

        async def process_events(self, events, context):
            for event in events:
                print(event.sequence_number, event.body_as_str())
    """

    body: bytes
    sequence_number: int
    offset: str
    enqueued_time: datetime
    partition_key: Optional[str] = None
    properties: Dict[str, Any] = field(default_factory=dict)

    def body_as_str(self, encoding: str = "UTF-8") -> str:
        return self.body.decode(encoding)


_KINDS = ("earliest", "latest", "sequence_number", "offset", "enqueued_time")


@dataclass(frozen=True)
class EventPosition:
    """Where a receiver starts reading.

    Example::

        EventPosition.earliest()
        EventPosition.from_sequence_number(41)              # starts at 42
        EventPosition.from_sequence_number(42, inclusive=True)
        EventPosition.from_enqueued_time(datetime(2026, 1, 1, tzinfo=timezone.utc))
    """

    kind: str
    value: Union[int, str, datetime, None] = None
    inclusive: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown event position kind {self.kind!r}; expected one of {_KINDS}")

    @classmethod
    def earliest(cls) -> "EventPosition":
        return cls("earliest")

    @classmethod
    def latest(cls) -> "EventPosition":
        return cls("latest")

    @classmethod
    def from_sequence_number(cls, sequence_number: int, *, inclusive: bool = False) -> "EventPosition":
        return cls("sequence_number", int(sequence_number), inclusive)

    @classmethod
    def from_offset(cls, offset: str, *, inclusive: bool = False) -> "EventPosition":
        return cls("offset", str(offset), inclusive)

    @classmethod
    def from_enqueued_time(cls, enqueued_time: datetime, *, inclusive: bool = False) -> "EventPosition":
        if enqueued_time.tzinfo is None:
            raise ValueError("enqueued_time must be timezone-aware (use datetime.timezone.utc)")
        return cls("enqueued_time", enqueued_time, inclusive)
