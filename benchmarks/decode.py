"""Per-event cost of turning a received AMQP message into an Event (``message_to_event``).

``EventHubSource``'s lean receive path calls :func:`~eventprocessor.sources.eventhub.message_to_event`
once per event, on messages as azure-eventhub's AMQP decoder hands them over. This
measures it on such messages (encoded and decoded by the client's own codec, so every
type is what arrives from the wire) and puts it beside:

* a floor: a loop that only reads the fields an event needs (body, sequence number,
  offset, enqueued time, partition key, application and AMQP properties) into a tuple,
  with no conversion and no object of its own;
* the previous ``message_to_event`` (before events carried their AMQP body type; kept
  below, verbatim but for its name, so both run on the same machine in the same rounds);
* the peer: what azure-eventhub builds per received event, ``EventData._from_message``.

The headline is the single-data-section message (the usual event, and the hot path);
the other body types (several data sections, a sequence, a value) are shown for
reference against the peer. Rounds alternate the order of the contestants; the median
of the rounds is reported with their range. Run::

    python -m benchmarks.decode --record
    python -m benchmarks.decode --events 2000 --rounds 2     # smoke, printed only
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from eventprocessor.events import Event
from eventprocessor.sources import eventhub as eventhub_source

from . import program
from .results import machine_line

__all__ = ["main", "received_messages", "measure", "previous_message_to_event", "check_inputs"]

logger = logging.getLogger(__name__)

BODY_SIZE = 32


def received_messages(count: int, shape: str = "data") -> list[Any]:
    """``count`` messages as azure-eventhub's decoder returns them: encoded with the
    client's codec and decoded again. ``shape`` is the body: ``data`` (one section of
    32 bytes), ``data3`` (three sections), ``sequence`` or ``value``."""
    from azure.eventhub._pyamqp._decode import decode_payload
    from azure.eventhub._pyamqp._encode import encode_payload
    from azure.eventhub._pyamqp.message import Message, Properties
    from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes

    body = b"x" * BODY_SIZE
    bodies: dict[str, dict[str, Any]] = {
        "data": {"data": [body]},
        "data3": {"data": [body[:10], body[10:20], body[20:]]},
        "sequence": {"sequence": [[b"reading", 21.5, True]]},
        "value": {"value": {b"device": b"d-7", b"readings": [-123, 21.5, False]}},
    }
    if shape not in bodies:
        raise ValueError(f"unknown shape {shape!r}; expected one of {sorted(bodies)}")
    enqueued = {TYPE: AMQPTypes.timestamp, VALUE: int(time.time() * 1000)}
    out = []
    for index in range(count):
        message = Message(
            message_annotations={b"x-opt-sequence-number": index, b"x-opt-offset": str(index * 200).encode(),
                                 b"x-opt-enqueued-time": enqueued, b"x-opt-partition-key": b"device-7"},
            application_properties={b"index": index},
            properties=Properties(message_id=f"m-{index}".encode(), content_type=b"application/json"),
            **bodies[shape])
        out.append(decode_payload(memoryview(encode_payload(bytearray(), message))))
    return out


# The previous message_to_event's helpers, as they were (module constants and functions
# of eventprocessor/sources/eventhub.py then; copied so that the benchmark uses only the
# SDK's public names and the previous contestant stays what it was).
_SEQ = b"x-opt-sequence-number"
_OFFSET = b"x-opt-offset"
_ENQUEUED = b"x-opt-enqueued-time"
_PARTITION_KEY = b"x-opt-partition-key"
_UTC = timezone.utc


def _properties(raw: dict[Any, Any] | None) -> dict[str, Any]:
    if not raw:
        return {}
    return {(key.decode("utf-8") if isinstance(key, bytes) else str(key)): value for key, value in raw.items()}


def _amqp_value(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return value


# Event as it was before it carried the body type: the same frozen dataclass without
# the two fields, so that building one costs what it cost then.
PreviousEvent = dataclasses.make_dataclass(
    "PreviousEvent",
    [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
     for f in dataclasses.fields(Event) if f.name not in ("body_type", "amqp_body")],
    frozen=True)


def previous_message_to_event(message: Any, partition_id: str | None = None) -> Any:
    """``message_to_event`` as it was before events carried their AMQP body type
    (it joined data sections, dropped sequences and printed values), building the
    Event of then."""
    annotations = message.message_annotations
    data = message.data
    if data:
        body = data[0] if len(data) == 1 else b"".join(data)
    elif message.value is not None:
        value = message.value
        body = value if isinstance(value, bytes) else str(value).encode("utf-8")
    else:
        body = b""
    offset = annotations[_OFFSET]
    key = annotations.get(_PARTITION_KEY)
    amqp = message.properties
    return PreviousEvent(
        body if isinstance(body, bytes) else bytes(body),
        annotations[_SEQ],
        offset.decode("ascii") if isinstance(offset, bytes) else str(offset),
        datetime.fromtimestamp(annotations[_ENQUEUED] / 1000, _UTC),
        key.decode("utf-8") if isinstance(key, bytes) else (None if key is None else str(key)),
        _properties(message.application_properties),
        partition_id,
        None if amqp is None else _amqp_value(amqp.message_id),
        None if amqp is None else _amqp_value(amqp.content_type),
        None if amqp is None else _amqp_value(amqp.correlation_id),
    )


def _floor(message: Any, partition_id: str | None = None) -> Any:
    annotations = message.message_annotations
    amqp = message.properties
    return (message.data, annotations[b"x-opt-sequence-number"], annotations[b"x-opt-offset"],
            annotations[b"x-opt-enqueued-time"], annotations.get(b"x-opt-partition-key"),
            message.application_properties, partition_id, amqp.message_id, amqp.content_type, amqp.correlation_id)


def _official(message: Any, partition_id: str | None = None) -> Any:
    from azure.eventhub import EventData

    return EventData._from_message(message)


def _time_ns(convert: Callable[..., Any], messages: list[Any]) -> float:
    """Nanoseconds per message of one pass, the garbage collector paused."""
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter_ns()
        for message in messages:
            convert(message, "0")
        return (time.perf_counter_ns() - started) / len(messages)
    finally:
        gc.enable()


def measure(contestants: dict[str, Callable[..., Any]], messages: list[Any], rounds: int) -> dict[str, list[float]]:
    """ns/event of each contestant per round, the order rotated every round."""
    names = list(contestants)
    results: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up
        _time_ns(contestants[name], messages[:1000])
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            results[name].append(_time_ns(contestants[name], messages))
    return results


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Measure and print; with ``--record``, write the section of RESULTS.md. Example::

        python -m benchmarks.decode --rounds 5
    """
    parser = program.parser("decode", __doc__, prog)
    parser.add_argument("--events", type=int, default=50_000, help="Messages per pass. [default: %(default)s]")
    parser.add_argument("--rounds", type=int, default=15,
                        help="Timed passes over the messages per conversion; the median is reported. "
                             "[default: %(default)s]")

    def body(args: argparse.Namespace) -> int:
        if args.events < 1 or args.rounds < 1:
            parser.error("--events and --rounds must be at least 1")
        return _run(args, program.recorded_command("decode", argv))

    return program.run(parser, body, argv)


def check_inputs() -> str:
    """What the contestants get is what the client decodes, and the previous contestant
    still does what it did: a three-section message arrives as three sections, which the
    previous ``message_to_event`` joins. Raises ``RuntimeError`` if not; says what held."""
    messages = received_messages(3, "data3")
    sections = [list(m.data) for m in messages]
    if sections != [[b"x" * 10, b"x" * 10, b"x" * 12]] * 3:
        raise RuntimeError(f"three-section messages decode as {sections!r}, not as sections of 10, 10 and 12 bytes")
    joined = previous_message_to_event(messages[0]).body
    if joined != b"x" * BODY_SIZE:
        raise RuntimeError(f"the previous message_to_event gives {joined!r}, not the joined {BODY_SIZE}-byte body")
    return (f"decode: inputs checked: three data sections arrive as 10, 10 and 12 bytes; the previous "
            f"message_to_event joins them into {BODY_SIZE} bytes")


def _run(args: argparse.Namespace, command: str) -> int:
    logging.basicConfig(level=logging.WARNING)
    print(check_inputs(), file=sys.stderr)
    load_before = os.getloadavg()[0]
    current = eventhub_source.message_to_event
    data = measure({"floor": _floor, "previous": previous_message_to_event, "current": current,
                    "official": _official}, received_messages(args.events, "data"), args.rounds)
    ratio = sorted(c / p for c, p in zip(data["current"], data["previous"], strict=False))
    others = {shape: measure({"current": current, "official": _official},
                             received_messages(args.events, shape), max(1, args.rounds // 3))
              for shape in ("data3", "sequence", "value")}
    lines = [
        "## Received message to Event: per-event cost (`decode`)",
        "",
        f"Command: `{command}`. {machine_line()}",
        "",
        f"{args.events:,} messages per pass, encoded and decoded by azure-eventhub's own codec (what the lean "
        f"receive path gets): {BODY_SIZE}-byte body, the service annotations and a partition key, one "
        "application property, message-id and content-type. Nanoseconds per event, median of "
        f"{args.rounds} rounds (range), the order of the contestants rotated every round, the garbage collector "
        f"paused while timing. Machine load (1-minute average) {load_before:.1f} before, {os.getloadavg()[0]:.1f} "
        "after: the machine is shared, so the per-round ratio is the figure to trust.",
        "",
        "| one data section | ns/event |",
        "|---|---:|",
        f"| floor: read the fields into a tuple | {_cell(data['floor'])} |",
        f"| previous `message_to_event` (joined sections, dropped sequences) | {_cell(data['previous'])} |",
        f"| **current `message_to_event`** | **{_cell(data['current'])}** |",
        f"| azure-eventhub `EventData._from_message` | {_cell(data['official'])} |",
        "",
        f"Current / previous, per round: median **{statistics.median(ratio):.2f}**, range "
        f"{ratio[0]:.2f}-{ratio[-1]:.2f}.",
        "",
        f"| other bodies ({max(1, args.rounds // 3)} rounds) | current ns/event | azure-eventhub ns/event |",
        "|---|---:|---:|",
    ]
    names = {"data3": "three data sections", "sequence": "one sequence section", "value": "an amqp-value (a map)"}
    for shape, result in others.items():
        lines.append(f"| {names[shape]} | {_cell(result['current'])} | {_cell(result['official'])} |")
    program.report("decode", "\n".join(lines), args.record)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
