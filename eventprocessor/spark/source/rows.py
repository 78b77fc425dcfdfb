"""Events as the Microsoft connector's rows, column by column in Arrow.

The columns and types are the connector's (``EventHubsSourceProvider.eventHubsSchema``),
all nullable::

    body binary, partition string, offset string, sequenceNumber long,
    enqueuedTime timestamp, publisher string, partitionKey string,
    properties map<string,string>, systemProperties map<string,string>

Like the connector, map values are JSON text (json4s' ``Serialization.write``): a
string property ``"a"`` is ``"\\"a\\""``, a number ``5`` is ``"5"``, binary that is not
UTF-8 text is a JSON array of byte values (azure-eventhub decodes AMQP strings to bytes,
so bytes that are UTF-8 text are rendered as a string). ``systemProperties`` holds what the connector puts there that an
event here carries: ``x-opt-partition-key``, ``message-id``, ``correlation-id`` and
``content-type`` (when set); never the offset, sequence number or enqueued time, which
have columns. ``publisher`` is null (it is set only by publisher policies, which Event
Hubs' AMQP receive does not report here).

Example::

    batch = events_to_record_batch("0", events)
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import pyarrow as pa
import pyarrow.compute as pc

from ...events import Event
from ...sources.eventhub.conversion import (
    ENQUEUED_TIME,
    OFFSET,
    PARTITION_KEY,
    SEQUENCE_NUMBER,
    amqp_value,
    message_body,
)

__all__ = ["COLUMNS", "SCHEMA_DDL", "ARROW_SCHEMA", "events_to_record_batch", "messages_to_record_batch", "json_value"]

COLUMNS = ("body", "partition", "offset", "sequenceNumber", "enqueuedTime", "publisher", "partitionKey",
           "properties", "systemProperties")

SCHEMA_DDL = ("body BINARY, partition STRING, offset STRING, sequenceNumber BIGINT, enqueuedTime TIMESTAMP, "
              "publisher STRING, partitionKey STRING, properties MAP<STRING, STRING>, "
              "systemProperties MAP<STRING, STRING>")
"""The schema as Spark DDL (what :meth:`EventHubsDataSource.schema` returns)."""

_MAP = pa.map_(pa.string(), pa.string())
ARROW_SCHEMA = pa.schema([
    pa.field("body", pa.binary()),
    pa.field("partition", pa.string()),
    pa.field("offset", pa.string()),
    pa.field("sequenceNumber", pa.int64()),
    pa.field("enqueuedTime", pa.timestamp("us", tz="UTC")),
    pa.field("publisher", pa.string()),
    pa.field("partitionKey", pa.string()),
    pa.field("properties", _MAP),
    pa.field("systemProperties", _MAP),
])
"""The Arrow schema Spark expects from ``read()`` (``to_arrow_schema`` of the DDL, UTC)."""


def json_value(value: Any) -> str:
    """A property value as the connector renders it: JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        # azure-eventhub's AMQP decoder hands AMQP strings over as bytes, like binary:
        # text is rendered as the JSON string the connector writes for a string.
        try:
            return json.dumps(raw.decode("utf-8"), ensure_ascii=False)
        except UnicodeDecodeError:
            # json4s writes a byte array as an array of signed bytes.
            return json.dumps([b - 256 if b > 127 else b for b in raw], separators=(",", ":"))
    if isinstance(value, datetime):
        return json.dumps(value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z")
    if isinstance(value, UUID):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{json_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value), ensure_ascii=False)


class _Rendered(dict):
    """Property values rendered as JSON text, each distinct value once per record
    batch: the values of a stream repeat (units, kinds, device ids), and rendering one
    costs several times the rest of its row. The key holds the type, so ``1``,
    ``True`` and ``1.0`` stay apart."""

    def render(self, value: Any) -> str:
        key = (value.__class__, value)
        try:
            return self[key]
        except KeyError:
            text = self[key] = json_value(value)
            return text
        except TypeError:  # unhashable (a list or map value)
            return json_value(value)


_SYSTEM = (("partition_key", "x-opt-partition-key"), ("message_id", "message-id"),
           ("correlation_id", "correlation-id"), ("content_type", "content-type"))


def _maps(events: Sequence[Event]) -> tuple[pa.Array, pa.Array]:
    """Both map columns from flat key/value lists and offsets (no per-row pairs)."""
    keys: list[str] = []
    values: list[str] = []
    offsets = [0]
    sys_keys: list[str] = []
    sys_values: list[str] = []
    sys_offsets = [0]
    render = _Rendered().render
    for event in events:
        properties = event.properties
        if properties:
            for key, value in properties.items():
                keys.append(key if key.__class__ is str else str(key))
                values.append(render(value))
        offsets.append(len(keys))
        if event.partition_key is not None or event.message_id is not None or event.correlation_id is not None \
                or event.content_type is not None:
            for attribute, name in _SYSTEM:
                value = getattr(event, attribute)
                if value is not None:
                    sys_keys.append(name)
                    sys_values.append(render(value))
        sys_offsets.append(len(sys_keys))
    properties_column = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                                pa.array(values, pa.string()))
    system_column = pa.MapArray.from_arrays(pa.array(sys_offsets, pa.int32()), pa.array(sys_keys, pa.string()),
                                            pa.array(sys_values, pa.string()))
    return properties_column, system_column


def events_to_record_batch(partition_id: str, events: Sequence[Event],
                           schema: pa.Schema | None = None) -> pa.RecordBatch:
    """One Arrow record batch of the connector's columns for events of one partition.

    Example::

        batch = events_to_record_batch("3", events)
        assert batch.schema == ARROW_SCHEMA
    """
    schema = schema or ARROW_SCHEMA
    count = len(events)
    properties_column, system_column = _maps(events)
    columns = [
        pa.array([e.body for e in events], pa.binary()),
        pa.repeat(pa.scalar(partition_id, pa.string()), count),
        pa.array([e.offset for e in events], pa.string()),
        pa.array([e.sequence_number for e in events], pa.int64()),
        pa.array([e.enqueued_time for e in events], pa.timestamp("us", tz="UTC")),
        pa.nulls(count, pa.string()),
        pa.array([e.partition_key for e in events], pa.string()),
        properties_column.cast(schema.field("properties").type),
        system_column.cast(schema.field("systemProperties").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)




def _text(value: Any) -> str:
    return value.decode("utf-8") if value.__class__ is bytes else str(value)


def messages_to_record_batch(partition_id: str, messages: Sequence[Any],
                             schema: pa.Schema | None = None) -> pa.RecordBatch:
    """The record batch :func:`events_to_record_batch` makes of these received AMQP
    messages (azure-eventhub's ``_pyamqp`` ``Message``, as the lean receive path gets
    them) once converted to events, column by column straight from the messages: no
    :class:`Event`, no ``datetime`` per event (the enqueued times are the service's
    milliseconds, made microseconds by Arrow).

    Example::

        batch = messages_to_record_batch("3", messages)
    """
    schema = schema or ARROW_SCHEMA
    bodies: list[bytes] = []
    sequence_numbers: list[int] = []
    offsets: list[str] = []
    enqueued: list[int] = []
    keys: list[str | None] = []
    properties: tuple[list[str], list[str], list[int]] = ([], [], [0])
    system: tuple[list[str], list[str], list[int]] = ([], [], [0])
    render = _Rendered().render
    for message in messages:
        annotations = message.message_annotations
        data = message.data
        if data and len(data) == 1:
            body = data[0]
            bodies.append(body if body.__class__ is bytes else bytes(body))
        else:
            bodies.append(message_body(message)[0])
        sequence_numbers.append(annotations[SEQUENCE_NUMBER])
        offset = annotations[OFFSET]
        offsets.append(offset.decode("ascii") if offset.__class__ is bytes else str(offset))
        enqueued.append(annotations[ENQUEUED_TIME])
        key = annotations.get(PARTITION_KEY)
        key = None if key is None else _text(key)
        keys.append(key)
        app = message.application_properties
        if app:
            for name, value in app.items():
                properties[0].append(_text(name))
                properties[1].append(render(value))
        properties[2].append(len(properties[0]))
        amqp = message.properties
        values = (key, None, None, None) if amqp is None else \
            (key, amqp_value(amqp.message_id), amqp_value(amqp.correlation_id), amqp_value(amqp.content_type))
        for (_attribute, name), value in zip(_SYSTEM, values, strict=True):
            if value is not None:
                system[0].append(name)
                system[1].append(render(value))
        system[2].append(len(system[0]))
    count = len(bodies)
    columns = [
        pa.array(bodies, pa.binary()),
        pa.repeat(pa.scalar(partition_id, pa.string()), count),
        pa.array(offsets, pa.string()),
        pa.array(sequence_numbers, pa.int64()),
        pc.multiply(pa.array(enqueued, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.nulls(count, pa.string()),
        pa.array(keys, pa.string()),
        _map(properties).cast(schema.field("properties").type),
        _map(system).cast(schema.field("systemProperties").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _map(parts: tuple[list[str], list[str], list[int]]) -> pa.Array:
    keys, values, offsets = parts
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()))
