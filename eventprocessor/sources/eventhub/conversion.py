"""From what azure-eventhub receives to this SDK's :class:`~eventprocessor.Event`, and
from this SDK's positions to the client's arguments.

``message_to_event`` is the per-event step of the lean receive path: it reads a
received AMQP message (azure-eventhub's ``_pyamqp`` ``Message``) straight into an
``Event``, without the ``EventData`` in between. ``to_event`` converts an ``EventData``
(the fallback path), to the same ``Event``.

Example::

    event = message_to_event(message, partition_id="0")
    assert event == to_event(EventData._from_message(message), partition_id="0")
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from ...events import BodyType, Event, EventPosition, body_fields, received_event
from ..base import LastEnqueuedEventProperties

__all__ = ["to_starting_position", "message_body", "to_event", "last_enqueued_of", "message_to_event", "amqp_value",
           "SEQUENCE_NUMBER", "OFFSET", "ENQUEUED_TIME", "PARTITION_KEY"]

# The message annotations Event Hubs sets on every received event.
SEQUENCE_NUMBER = b"x-opt-sequence-number"
OFFSET = b"x-opt-offset"
ENQUEUED_TIME = b"x-opt-enqueued-time"
PARTITION_KEY = b"x-opt-partition-key"
_UTC = timezone.utc
_DATA = BodyType.DATA
_fromtimestamp = datetime.fromtimestamp
_last_enqueued: tuple[Any, Any] = (None, None)  # (x-opt-enqueued-time, its datetime) of the last event converted


def to_starting_position(position: EventPosition) -> tuple[Any, bool]:
    """Map an :class:`EventPosition` to azure-eventhub's (starting_position, inclusive)."""
    if position.kind == "earliest":
        return "-1", False
    if position.kind == "latest":
        return "@latest", False
    if position.kind == "sequence_number":
        return int(position.value), position.inclusive  # type: ignore[arg-type]
    if position.kind == "offset":
        return str(position.value), position.inclusive
    return position.value, position.inclusive


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def _properties(raw: dict[Any, Any] | None) -> dict[str, Any]:
    if not raw:
        return {}
    return {(key.decode("utf-8") if isinstance(key, bytes) else str(key)): value for key, value in raw.items()}


def amqp_value(value: Any) -> Any:
    """A message-id, correlation-id or content-type as ``EventData`` reads it: strings
    (which arrive as bytes) decoded, a UUID or an int kept, bytes that are not UTF-8 kept."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return value


def message_body(message: Any) -> tuple[bytes, BodyType, Any]:
    """``(body, body_type, amqp_body)`` of a received ``_pyamqp`` message, classified as
    azure-eventhub classifies it (``AmqpAnnotatedMessage``): data sections if there are
    any, else sequence sections if any, else the value (None when there is no body)."""
    if message.data:
        return body_fields(BodyType.DATA, message.data)
    if message.sequence:
        return body_fields(BodyType.SEQUENCE, message.sequence)
    return body_fields(BodyType.VALUE, message.value)


def to_event(event_data: Any, partition_id: str | None = None) -> Event:
    """Convert an ``azure.eventhub.EventData`` to this SDK's :class:`Event`, its body as
    sent (``raw_amqp_message.body`` and ``body_type``)."""
    raw = event_data.raw_amqp_message
    body, body_type, amqp_body = body_fields(BodyType(raw.body_type.value), raw.body)
    return Event(
        body=body,
        sequence_number=event_data.sequence_number,
        offset=str(event_data.offset),
        enqueued_time=event_data.enqueued_time,
        partition_key=_text(event_data.partition_key),
        properties=_properties(event_data.properties),
        partition_id=partition_id,
        message_id=amqp_value(event_data.message_id),
        content_type=amqp_value(event_data.content_type),
        correlation_id=amqp_value(event_data.correlation_id),
        body_type=body_type,
        amqp_body=amqp_body,
        amqp_message=getattr(event_data, "_message", None),  # what EventData was built from, when it has one
    )


def last_enqueued_of(message: Any) -> LastEnqueuedEventProperties | None:
    """The partition's newest event as the service reported it in ``message``'s delivery
    annotations (present when the receiver asked for runtime metrics)."""
    annotations = getattr(message, "delivery_annotations", None) or {}
    seq = annotations.get(b"last_enqueued_sequence_number", annotations.get("last_enqueued_sequence_number"))
    if seq is None:
        return None
    offset = annotations.get(b"last_enqueued_offset", annotations.get("last_enqueued_offset", b"-1"))
    enqueued = annotations.get(b"last_enqueued_time_utc", annotations.get("last_enqueued_time_utc"))
    retrieved = annotations.get(b"runtime_info_retrieval_time_utc", annotations.get("runtime_info_retrieval_time_utc"))
    return LastEnqueuedEventProperties(
        int(seq), offset.decode("ascii") if isinstance(offset, bytes) else str(offset),
        datetime.fromtimestamp(enqueued / 1000, _UTC) if isinstance(enqueued, (int, float)) else enqueued,
        datetime.fromtimestamp(retrieved / 1000, _UTC) if isinstance(retrieved, (int, float)) else retrieved)


def message_to_event(message: Any, partition_id: str | None = None) -> Event:
    """Convert a received AMQP message (azure-eventhub's ``_pyamqp`` ``Message``) to an
    :class:`Event`, without building the ``EventData`` in between. The body is kept as
    sent (see :class:`Event`: ``body_type``, ``amqp_body``)."""
    global _last_enqueued
    annotations = message.message_annotations
    data = message.data
    if data and len(data) == 1:  # the usual event: one data section
        body, body_type, amqp_body = data[0], _DATA, None
        if body.__class__ is not bytes:
            body = bytes(body)
    else:
        body, body_type, amqp_body = message_body(message)
    offset = annotations[OFFSET]
    key = annotations.get(PARTITION_KEY)
    # Events sent together share their enqueued time: one datetime (immutable) for all
    # of them, instead of one per event (a quarter of this function's time).
    enqueued = annotations[ENQUEUED_TIME]
    last = _last_enqueued
    if last[0] == enqueued:
        when = last[1]
    else:
        when = _fromtimestamp(enqueued / 1000, _UTC)
        _last_enqueued = (enqueued, when)
    amqp = message.properties  # the AMQP properties section, None when the producer set none of it
    if amqp is None:
        message_id = content_type = correlation_id = None
    else:
        message_id = amqp_value(amqp.message_id)
        content_type = amqp_value(amqp.content_type)
        correlation_id = amqp_value(amqp.correlation_id)
    app = message.application_properties
    return received_event(
        body,
        annotations[SEQUENCE_NUMBER],
        offset.decode("ascii") if offset.__class__ is bytes else str(offset),
        when,
        None if key is None else (key.decode("utf-8") if key.__class__ is bytes else str(key)),
        _properties(app) if app else {},
        partition_id,
        message_id,
        content_type,
        correlation_id,
        body_type,
        amqp_body,
        message,
    )
