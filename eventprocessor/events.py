"""Events and positions in a partition.

:class:`Event` carries the attribute names of ``azure.eventhub.EventData`` so that
handler code moves between this SDK's sources and the real Event Hubs client.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Optional, Union
from uuid import UUID

from .errors import ConfigurationError

__all__ = ["Event", "EventPosition", "MessageId"]

MessageId = Union[str, UUID, int, bytes]
"""What an AMQP ``message-id`` or ``correlation-id`` can be: a string, a UUID, a ulong or binary."""


@dataclass(frozen=True)
class Event:
    """One event of a partition.

    ``message_id``, ``content_type`` and ``correlation_id`` are the fields of the AMQP
    message's properties section that ``azure.eventhub.EventData`` exposes as attributes;
    the sources fill them from what the producer sent. The section's other fields
    (``subject``, ``reply_to``, ``to``, ``user_id``, ``content_encoding``, ``group_id``...)
    are not carried.

    Example::

        async def process_events(self, events, context):
            for event in events:
                print(event.sequence_number, event.message_id, event.body_as_str())
    """

    body: bytes
    sequence_number: int
    offset: str
    enqueued_time: datetime
    partition_key: Optional[str] = None
    properties: Dict[str, Any] = field(default_factory=dict)
    partition_id: Optional[str] = None
    """The partition the event was read from (set by the sources)."""
    message_id: Optional[MessageId] = None
    """The AMQP ``message-id`` the producer set (``EventData.message_id``), or None.
    Usually a string; AMQP also allows a UUID, an int (ulong) or bytes, kept as sent."""
    content_type: Optional[str] = None
    """The AMQP ``content-type`` (``EventData.content_type``), such as ``"application/json"``, or None."""
    correlation_id: Optional[MessageId] = None
    """The AMQP ``correlation-id`` (``EventData.correlation_id``), or None; same types as ``message_id``."""

    def body_as_str(self, encoding: str = "UTF-8") -> str:
        return self.body.decode(encoding)


_KINDS = ("earliest", "latest", "sequence_number", "offset", "enqueued_time")
_MAX_LONG = 2**63 - 1


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
            raise ConfigurationError(f"unknown event position kind {self.kind!r}; expected one of {_KINDS}")
        if not isinstance(self.inclusive, bool):
            raise ConfigurationError(f"inclusive must be True or False, got {self.inclusive!r}")
        value = self.value
        if self.kind == "sequence_number":
            if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= _MAX_LONG:
                raise ConfigurationError(
                    f"sequence_number must be an int from -1 to 2**63-1, got {type(value).__name__} {value!r}")
        elif self.kind == "offset":
            if not isinstance(value, str) or not value.lstrip("-").isdigit():
                raise ConfigurationError(f"offset must be a string of digits (as Event Hubs gives it), got {value!r}")
        elif self.kind == "enqueued_time":
            if not isinstance(value, datetime) or value.tzinfo is None:
                raise ConfigurationError(
                    f"enqueued_time must be a timezone-aware datetime (use datetime.timezone.utc), got {value!r}")

    @classmethod
    def earliest(cls) -> "EventPosition":
        return cls("earliest")

    @classmethod
    def latest(cls) -> "EventPosition":
        return cls("latest")

    @classmethod
    def from_sequence_number(cls, sequence_number: int, *, inclusive: bool = False) -> "EventPosition":
        return cls("sequence_number", sequence_number, inclusive)

    @classmethod
    def from_offset(cls, offset: Union[str, int], *, inclusive: bool = False) -> "EventPosition":
        return cls("offset", str(offset) if isinstance(offset, int) and not isinstance(offset, bool) else offset,
                   inclusive)

    @classmethod
    def from_enqueued_time(cls, enqueued_time: datetime, *, inclusive: bool = False) -> "EventPosition":
        return cls("enqueued_time", enqueued_time, inclusive)
