"""Events to Arrow, column by column: the sink never builds Spark rows in Python.

Needs only pyarrow. The columns are the sink's documented schema, :data:`EVENT_SCHEMA`.
"""
from __future__ import annotations

import io
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ..errors import ConfigurationError
from ..events import BodyType, Event

__all__ = ["EVENT_SCHEMA", "events_to_table", "json_body", "Decoder", "add_user_columns"]

logger = logging.getLogger(__name__)

EVENT_SCHEMA = pa.schema(
    [
        pa.field("partition_id", pa.string(), nullable=False),
        pa.field("sequence_number", pa.int64(), nullable=False),
        pa.field("offset", pa.string(), nullable=False),
        pa.field("enqueued_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("partition_key", pa.string()),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("properties", pa.map_(pa.string(), pa.string())),
    ]
)
"""The columns of every micro-batch, before user columns:

``partition_id`` string, ``sequence_number`` long, ``offset`` string, ``enqueued_time``
timestamp (UTC), ``partition_key`` string (null when the event had none), ``body``
binary, ``properties`` map<string,string> (values rendered with ``str``; bytes decoded
as UTF-8).

``body`` is :attr:`Event.body <eventprocessor.Event.body>`: a data body's bytes (several
data sections joined, as ``body_as_str()`` reads them), or an AMQP value that is bytes
or text (text as UTF-8; no value: empty). A sequence body or any other value has no
bytes form: :func:`events_to_table` raises ``TypeError`` naming the event rather than
writing an empty or made-up body, so the batch fails and the sink's retry and poison
policy decide (``on_poison="skip"`` with a ``dead_letter`` hook sets such batches aside).
"""

Decoder = Callable[[pa.Table], pa.Table | Mapping[str, pa.Array]]
"""A decode function: gets the event table of a batch, returns the extra columns
(a table of the same length, or a mapping of name to array)."""


def _property_value(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _properties_column(events: Sequence[Event]) -> pa.Array:
    """The ``properties`` map column from flat key and value lists and offsets: no
    per-event lists or tuples (six times faster than a list of pairs per event)."""
    keys: list[str] = []
    values: list[str] = []
    offsets = [0]
    missing = []
    count = 0
    for event in events:
        properties = event.properties
        if properties:
            for key, value in properties.items():
                keys.append(key if key.__class__ is str else str(key))
                values.append(value if value.__class__ is str else _property_value(value))
            count += len(properties)
            missing.append(False)
        else:
            missing.append(True)
        offsets.append(count)
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(values, pa.string()), mask=pa.array(missing, pa.bool_()))


_DATA = BodyType.DATA


def _check_bodies(partition_id: str, events: Sequence[Event]) -> None:
    """Raise for an event whose body has no bytes form (see :data:`EVENT_SCHEMA`)."""
    for event in events:
        if event.body_type is _DATA or event.body_type == _DATA:
            continue
        value = event.amqp_body
        if event.body_type == BodyType.VALUE and (value is None or isinstance(value, (bytes, str))):
            continue
        kind = "a sequence body" if event.body_type == BodyType.SEQUENCE else \
            f"an AMQP value body ({type(value).__name__})"
        raise TypeError(
            f"event {event.sequence_number} of partition {partition_id} has {kind}, which has no bytes form for the "
            "Spark sink's binary body column. Have the producer send data bodies (EventData(bytes) or "
            "AmqpAnnotatedMessage(data_body=...)), or read these events with a PartitionProcessor of your own "
            "(Event.amqp_body holds the body as sent); on_poison='skip' with a dead_letter hook sets the batch aside")


def events_to_table(batches: Sequence[tuple[str, Sequence[Event]]]) -> pa.Table:
    """Build the Arrow table of a micro-batch from ``(partition_id, events)`` pairs.
    Raises ``TypeError`` for an event whose body has no bytes form (a sequence body, or
    an AMQP value other than bytes or text; see :data:`EVENT_SCHEMA`).

    Example::

        table = events_to_table([("0", events_of_0), ("1", events_of_1)])
        assert table.schema == EVENT_SCHEMA
    """
    partition_ids: list[pa.Array] = []
    events: list[Event] = []
    for partition_id, partition_events in batches:
        _check_bodies(partition_id, partition_events)
        partition_ids.append(pa.repeat(pa.scalar(partition_id, pa.string()), len(partition_events)))
        events.extend(partition_events)
    pid = pa.concat_arrays(partition_ids) if partition_ids else pa.array([], pa.string())
    # One comprehension per column: several times faster than one loop filling them all.
    return pa.Table.from_arrays(
        [
            pid,
            pa.array([e.sequence_number for e in events], pa.int64()),
            pa.array([e.offset for e in events], pa.string()),
            pa.array([e.enqueued_time for e in events], pa.timestamp("us", tz="UTC")),
            pa.array([e.partition_key for e in events], pa.string()),
            pa.array([e.body for e in events], pa.binary()),
            _properties_column(events),
        ],
        schema=EVENT_SCHEMA,
    )


def add_user_columns(table: pa.Table, decode: Decoder | None, derived: Sequence[str] = ()) -> pa.Table:
    """Append the decode function's columns and the derived columns asked for.

    The one derived column is ``enqueued_date`` (the UTC date of ``enqueued_time``),
    handy for ``partition_by="enqueued_date"``.

    Example::

        table = add_user_columns(events_to_table(batches), json_body(schema), derived=["enqueued_date"])
    """
    if "enqueued_date" in derived and "enqueued_date" not in table.column_names:
        table = table.append_column("enqueued_date", pc.cast(table["enqueued_time"], pa.date32()))
    if decode is None:
        return table
    extra = decode(table)
    columns: Mapping[str, Any] = (
        {name: extra[name] for name in extra.column_names} if isinstance(extra, pa.Table) else extra
    )
    for name, column in columns.items():
        if name in table.column_names:
            raise ConfigurationError(f"decode function returned column {name!r}, which the sink already has")
        if len(column) != table.num_rows:
            raise ConfigurationError(
                f"decode function returned {len(column)} values for column {name!r}, expected {table.num_rows}"
            )
        table = table.append_column(name, column)
    return table


def json_body(schema: pa.Schema | None = None, *, column: str | None = None) -> Decoder:
    """A decode function for JSON object bodies, vectorised by pyarrow's JSON reader.

    With ``column`` the object becomes one struct column of that name; without it
    each top-level field becomes a column. ``schema`` fixes the types (fields the
    bodies lack become null); without it pyarrow infers them per batch.

    Example::

        sink = SparkSink("/data/out", decode=json_body(pa.schema([("user", pa.string()),
                                                                  ("amount", pa.float64())])))
    """
    parse_options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore") if schema else None

    def decode(table: pa.Table) -> dict[str, pa.Array]:
        if table.num_rows == 0:
            fields = schema or pa.schema([])
            parsed = pa.Table.from_batches([], schema=fields)
        else:
            # JSON allows raw newlines only as whitespace, so flattening them keeps
            # every body on one line of the newline-delimited input.
            bodies = table["body"].to_pylist()
            text = b"\n".join(b.replace(b"\r", b" ").replace(b"\n", b" ") for b in bodies)
            parsed = pa_json.read_json(io.BytesIO(text), parse_options=parse_options)
            if parsed.num_rows != table.num_rows:
                raise ValueError(f"JSON decode produced {parsed.num_rows} rows for {table.num_rows} bodies")
        if column is not None:
            return {column: pa.StructArray.from_arrays([c.combine_chunks() for c in parsed.columns],
                                                       names=parsed.column_names)
                    if parsed.num_columns else pa.nulls(table.num_rows, pa.struct([]))}
        return {name: parsed[name].combine_chunks() for name in parsed.column_names}

    return decode
