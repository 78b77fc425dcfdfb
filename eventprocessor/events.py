"""Events and positions in a partition.

:class:`Event` carries the attribute names of ``azure.eventhub.EventData`` so that
handler code moves between this SDK's sources and the real Event Hubs client.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from .errors import ConfigurationError

__all__ = ["Event", "EventPosition", "MessageId", "BodyType", "body_fields", "received_event"]

MessageId = str | UUID | int | bytes
"""What an AMQP ``message-id`` or ``correlation-id`` can be: a string, a UUID, a ulong or binary."""


class BodyType(str, enum.Enum):
    """How the producer encoded an event's body: the three AMQP body sections.

    Equal to ``azure.eventhub.amqp.AmqpMessageBodyType``'s members (both are strings:
    ``BodyType.VALUE == AmqpMessageBodyType.VALUE == "value"``).
    """

    DATA = "data"
    """One or more data sections, each opaque bytes (what ``EventData(body)`` sends)."""
    SEQUENCE = "sequence"
    """One or more amqp-sequence sections, each a list of AMQP values."""
    VALUE = "value"
    """One amqp-value section: a single AMQP value (a map, a list, a number, a string...)."""


_DATA = BodyType.DATA
_VALUE = BodyType.VALUE


@dataclass(frozen=True)
class Event:
    """One event of a partition.

    ``message_id``, ``content_type`` and ``correlation_id`` are the fields of the AMQP
    message's properties section that ``azure.eventhub.EventData`` exposes as attributes;
    the sources fill them from what the producer sent. The whole message as received
    (every section: the header, delivery and message annotations, all of the properties
    section, the footer) is ``amqp_message`` for the sources that have one.

    The body. Most events have one data section, its bytes are ``body`` (and
    ``amqp_body`` is None). AMQP also lets a producer send several data sections, a
    sequence or a value (``AmqpAnnotatedMessage(data_body=[...] / sequence_body=... /
    value_body=...)``); ``body_type`` says which, and ``amqp_body`` holds the body as
    sent:

    ===================  =====================================  ====================================
    ``body_type``        ``amqp_body``                          ``body`` / ``body_as_str()``
    ===================  =====================================  ====================================
    DATA, one section    None                                   the section's bytes / decoded
    DATA, several        tuple of the sections (bytes)          the sections joined / decoded
    SEQUENCE             tuple of the sections (each a list)    ``b""`` / TypeError
    VALUE, bytes or str  the value                              its bytes (str as UTF-8) / the text
    VALUE, None          None                                   ``b""`` / ``""``
    VALUE, other         the value (a dict, list, int...)       ``b""`` / TypeError
    ===================  =====================================  ====================================

    This mirrors ``azure.eventhub.EventData`` (its ``body_type``, its
    ``raw_amqp_message.body``, and its ``body_as_str()``, which joins data sections and
    decodes text values), except where azure-eventhub's conversion loses information:
    for a sequence or a non-text value its ``body_as_str()`` returns the Python repr
    (``"{'key': [-123, 'data', False]}"``); this one raises ``TypeError`` naming
    ``amqp_body`` instead. Values are as azure-eventhub's AMQP decoder gives them (AMQP
    strings and symbols arrive as bytes).

    Example::

        async def process_events(self, events, context):
            for event in events:
                if event.body_type is BodyType.DATA:
                    print(event.sequence_number, event.message_id, event.body_as_str())
                else:
                    print(event.sequence_number, event.body_type.value, event.amqp_body)
    """

    body: bytes
    sequence_number: int
    offset: str
    enqueued_time: datetime
    partition_key: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    partition_id: str | None = None
    """The partition the event was read from (set by the sources)."""
    message_id: MessageId | None = None
    """The AMQP ``message-id`` the producer set (``EventData.message_id``), or None.
    Usually a string; AMQP also allows a UUID, an int (ulong) or bytes, kept as sent."""
    content_type: str | None = None
    """The AMQP ``content-type`` (``EventData.content_type``), such as ``"application/json"``, or None."""
    correlation_id: MessageId | None = None
    """The AMQP ``correlation-id`` (``EventData.correlation_id``), or None; same types as ``message_id``."""
    body_type: BodyType = BodyType.DATA
    """How the body was sent (``EventData.body_type``): data sections, sequence sections or a value."""
    amqp_body: Any = None
    """The body as sent when ``body`` does not hold all of it: the data sections (a tuple
    of bytes) when there are several, the sequence sections (a tuple of lists), or the
    value; None for the usual single data section (its bytes are ``body``). What
    ``list(EventData.raw_amqp_message.body)`` gives for several data sections or a
    sequence, and ``EventData.raw_amqp_message.body`` for a value."""
    amqp_message: Any = field(default=None, compare=False, repr=False)
    """The AMQP message the event was read from, as the source received it
    (azure-eventhub's, for :class:`~eventprocessor.sources.eventhub.EventHubSource`), or
    None (the in-memory source has none). The azure-eventhub drop-in builds its
    ``EventData`` from it, so that ``raw_amqp_message`` holds every section as the
    official client gives it. Not compared, not shown."""

    def body_as_str(self, encoding: str = "UTF-8") -> str:
        """The body as text: a data body's bytes (several sections joined) or a text or
        binary value, decoded. Raises ``TypeError`` for a sequence body or a value that
        is not text (read ``amqp_body``), ``UnicodeDecodeError`` for bytes that are not
        ``encoding``.

        Example::

            event.body_as_str()           # "hello"
        """
        if self.body_type == _DATA:
            return self.body.decode(encoding)
        value = self.amqp_body
        if self.body_type == _VALUE:
            if value is None:
                return ""
            if isinstance(value, str):
                return value
            if isinstance(value, (bytes, bytearray)):
                return bytes(value).decode(encoding)
        raise TypeError(self._no_text(value))

    def body_as_json(self, encoding: str = "UTF-8") -> Any:
        """The body parsed as JSON (``json.loads(body_as_str())``), as ``EventData.body_as_json``;
        ``TypeError`` when it is not JSON text.

        Example::

            event.body_as_json()["temperature"]
        """
        text = self.body_as_str(encoding)
        try:
            return json.loads(text)
        except ValueError as error:
            raise TypeError(f"the body of event {self.sequence_number} of partition {self.partition_id} is not "
                            f"JSON: {error}") from error

    def _no_text(self, value: Any) -> str:
        kind = ("a sequence body" if self.body_type == BodyType.SEQUENCE
                else f"an AMQP value body ({type(value).__name__})")
        return (f"event {self.sequence_number} of partition {self.partition_id} has {kind}, which has no text form; "
                "read event.amqp_body for the body as sent (azure-eventhub's body_as_str() would give its Python "
                "repr), or have the producer send a data body")


_new = object.__new__


def received_event(body: bytes, sequence_number: int, offset: str, enqueued_time: datetime,
                   partition_key: str | None, properties: dict[str, Any], partition_id: str | None,
                   message_id: MessageId | None, content_type: str | None, correlation_id: MessageId | None,
                   body_type: BodyType = BodyType.DATA, amqp_body: Any = None, amqp_message: Any = None) -> Event:
    """``Event(...)`` with every field given, for a source's per-event path: the same
    event, built in about half the time of the frozen dataclass's ``__init__`` (which
    sets each field through ``object.__setattr__``; ``benchmarks/decode.py`` measures
    it). It checks nothing: for values the source decoded itself.

    Example::

        received_event(b"x", 41, "8192", when, None, {}, "0", None, None, None) == Event(b"x", 41, "8192", when,
                                                                                           partition_id="0")
    """
    event = _new(Event)
    # Filled item by item, the instance's own dict keeps the keys it shares with every
    # other Event (a third faster than handing it a new dict).
    fields = event.__dict__
    fields["body"] = body
    fields["sequence_number"] = sequence_number
    fields["offset"] = offset
    fields["enqueued_time"] = enqueued_time
    fields["partition_key"] = partition_key
    fields["properties"] = properties
    fields["partition_id"] = partition_id
    fields["message_id"] = message_id
    fields["content_type"] = content_type
    fields["correlation_id"] = correlation_id
    fields["body_type"] = body_type
    fields["amqp_body"] = amqp_body
    fields["amqp_message"] = amqp_message
    return event


def body_fields(body_type: BodyType, content: Any) -> tuple[bytes, BodyType, Any]:
    """``(body, body_type, amqp_body)`` of an :class:`Event` whose body was sent as
    ``content``: for DATA the data sections (an iterable of bytes, at least one), for
    SEQUENCE the sequence sections (an iterable of lists), for VALUE the value. For
    sources that read AMQP messages; see :class:`Event` for what each field holds.

    Example::

        body_fields(BodyType.DATA, [b"aa", b"bb"])     # (b"aabb", BodyType.DATA, (b"aa", b"bb"))
        body_fields(BodyType.VALUE, {b"key": 1})       # (b"", BodyType.VALUE, {b"key": 1})
    """
    if body_type == BodyType.DATA:
        sections = tuple(part if isinstance(part, bytes) else bytes(part) for part in content)
        if len(sections) == 1:
            return sections[0], BodyType.DATA, None
        if not sections:
            raise ValueError("a data body has at least one data section")
        return b"".join(sections), BodyType.DATA, sections
    if body_type == BodyType.SEQUENCE:
        return b"", BodyType.SEQUENCE, tuple(content)
    if isinstance(content, bytes):
        return content, BodyType.VALUE, content
    if isinstance(content, (bytearray, memoryview)):
        return bytes(content), BodyType.VALUE, bytes(content)
    if isinstance(content, str):
        return content.encode("utf-8"), BodyType.VALUE, content
    return b"", BodyType.VALUE, content


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
    value: int | str | datetime | None = None
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
    def earliest(cls) -> EventPosition:
        return cls("earliest")

    @classmethod
    def latest(cls) -> EventPosition:
        return cls("latest")

    @classmethod
    def from_sequence_number(cls, sequence_number: int, *, inclusive: bool = False) -> EventPosition:
        return cls("sequence_number", sequence_number, inclusive)

    @classmethod
    def from_offset(cls, offset: str | int, *, inclusive: bool = False) -> EventPosition:
        return cls("offset", str(offset) if isinstance(offset, int) and not isinstance(offset, bool) else offset,
                   inclusive)

    @classmethod
    def from_enqueued_time(cls, enqueued_time: datetime, *, inclusive: bool = False) -> EventPosition:
        return cls("enqueued_time", enqueued_time, inclusive)
