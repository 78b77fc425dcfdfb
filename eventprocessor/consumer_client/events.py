"""Events as azure-eventhub's callbacks see them: ``EventData`` built from this SDK's
:class:`~eventprocessor.Event`, with the body as sent."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..events import BodyType, Event
from ..sources.eventhub.conversion import ENQUEUED_TIME, OFFSET, PARTITION_KEY, SEQUENCE_NUMBER

if TYPE_CHECKING:  # pragma: no cover
    from azure.eventhub import EventData

_UTC = timezone.utc



def to_event_data(event: Event) -> EventData:
    """An ``azure.eventhub.EventData`` as the official client gives it. From a source that
    keeps the AMQP message (``Event.amqp_message``: ``EventHubSource``) it is built from
    that message, as the official client builds it: ``raw_amqp_message`` has the header,
    delivery and message annotations, every properties field and the footer. Otherwise
    it reads like one the official client received:
    ``body``, ``body_type``, ``body_as_str()``, ``body_as_json()``, ``sequence_number``,
    ``offset``, ``enqueued_time``, ``partition_key`` (bytes), ``properties`` (bytes keys,
    as AMQP delivers them), ``message_id``, ``content_type``, ``correlation_id``,
    ``system_properties`` and ``raw_amqp_message`` with its ``body``, ``body_type`` and
    ``properties`` (strings as bytes there, as AMQP delivers them; None when the event
    has none of the three, as when the producer set none). The body is the one sent:
    several data sections stay several, a sequence or a value stays one."""
    from azure.eventhub import EventData
    from azure.eventhub.amqp import AmqpMessageProperties

    if event.amqp_message is not None:
        # The message the official client would build its EventData from: the same object
        # it hands its callbacks, every section included.
        return EventData._from_message(event.amqp_message)
    if event.body_type == BodyType.DATA:
        data = EventData(event.body if event.amqp_body is None else list(event.amqp_body))
    else:
        from azure.eventhub.amqp import AmqpAnnotatedMessage

        # EventData takes only data bodies; azure-eventhub wraps an AmqpAnnotatedMessage
        # of another body type with _from_message (its producer does, for sending one).
        body = ({"sequence_body": [list(section) for section in event.amqp_body]}
                if event.body_type == BodyType.SEQUENCE else {"value_body": event.amqp_body})
        raw = AmqpAnnotatedMessage(**body, header={}, annotations={}, application_properties={})  # type: ignore[arg-type]
        data = EventData._from_message(None, raw)  # type: ignore[arg-type]
    amqp = (event.message_id, event.content_type, event.correlation_id)
    if any(value is not None for value in amqp):
        message_id, content_type, correlation_id = (value.encode("utf-8") if isinstance(value, str) else value
                                                    for value in amqp)
        data.raw_amqp_message.properties = AmqpMessageProperties(
            message_id=message_id, content_type=content_type, correlation_id=correlation_id)
    else:  # a received message without the section has None here (azure types it as never None)
        data.raw_amqp_message.properties = None  # type: ignore[assignment]
    annotations: dict[str | bytes, Any] = {
        SEQUENCE_NUMBER: event.sequence_number,
        OFFSET: event.offset.encode("ascii"),
        ENQUEUED_TIME: int(event.enqueued_time.timestamp() * 1000),
    }
    if event.partition_key is not None:
        annotations[PARTITION_KEY] = event.partition_key.encode("utf-8")
    data.raw_amqp_message.annotations = annotations
    if event.properties:
        data.properties = {(key.encode("utf-8") if isinstance(key, str) else key): value
                           for key, value in event.properties.items()}
    return data


def _from_event_data(event: Any) -> Event:
    """An EventData this client did not hand out (the caller built one): its position."""
    sequence_number = getattr(event, "sequence_number", None)
    if not isinstance(sequence_number, int):
        raise ConfigurationError(f"update_checkpoint takes an event received by this client, got "
                                 f"{type(event).__name__} without a sequence number")
    enqueued = getattr(event, "enqueued_time", None) or datetime.now(_UTC)
    return Event(body=b"", sequence_number=sequence_number, offset=str(getattr(event, "offset", None) or ""),
                 enqueued_time=enqueued)
