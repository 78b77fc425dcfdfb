"""Per-event cost of turning a received AMQP message into an Event (``message_to_event``).

``EventHubSource``'s lean receive path calls :func:`~eventprocessor.sources.eventhub.message_to_event`
once per event, on messages as azure-eventhub's AMQP decoder hands them over. This
measures it on such messages (encoded and decoded by the client's own codec, so every
type is what arrives from the wire) and puts it beside:

* a floor: a loop that only reads the fields an event needs (body, sequence number,
  offset, enqueued time, partition key, application and AMQP properties) into a tuple,
  with no conversion and no object of its own;
* the peer: what azure-eventhub builds per received event, ``EventData._from_message``.

Before timing, the program checks that both conversions agree on every message it
times (``message_to_event`` gives what ``to_event`` makes of azure-eventhub's
``EventData``). The headline is the single-data-section message (the usual event, and
the hot path), as the per-round ratio of ``message_to_event`` to the peer; the other
body types (several data sections, a sequence, a value) are shown for reference. Rounds
alternate the order of the contestants; the median of the rounds is reported with their
range. Run::

    python -m benchmarks.decode --record
    python -m benchmarks.decode --events 2000 --rounds 2     # smoke, printed only
"""
from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from eventprocessor.sources import eventhub as eventhub_source

from .toolkit import program
from .toolkit.report import median, median_range, table, value_range

__all__ = ["main", "received_messages", "measure", "check_inputs"]

logger = logging.getLogger(__name__)

SHAPES = {"data": "one data section", "data3": "three data sections", "sequence": "one sequence section",
          "value": "an amqp-value (a map)"}
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


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Measure and print; with ``--record``, write the section of RESULTS.md. Example::

        python -m benchmarks.decode --rounds 5
    """
    parser = program.parser("decode", __doc__, prog)
    parser.add_argument("--events", type=program.at_least_one, default=50_000,
                        help="Messages per pass. [default: %(default)s]")
    parser.add_argument("--rounds", type=program.at_least_one, default=15,
                        help="Timed passes over the messages per conversion; the median is reported. "
                             "[default: %(default)s]")
    return program.run("decode", parser, _run, argv)


def check_inputs(count: int = 3) -> str:
    """What the contestants get is what the client decodes, and this SDK's conversion gives
    what azure-eventhub's own does: on ``count`` messages of every shape,
    ``message_to_event`` equals ``to_event`` of the client's ``EventData``, and three data
    sections arrive as three sections. Raises ``RuntimeError`` if not; says what held."""
    from azure.eventhub import EventData

    sections = [list(m.data) for m in received_messages(count, "data3")]
    if sections != [[b"x" * 10, b"x" * 10, b"x" * 12]] * count:
        raise RuntimeError(f"three-section messages decode as {sections!r}, not as sections of 10, 10 and 12 bytes")
    for shape in SHAPES:
        for message in received_messages(count, shape):
            ours = eventhub_source.message_to_event(message, "0")
            theirs = eventhub_source.to_event(EventData._from_message(message), "0")
            if ours != theirs:
                raise RuntimeError(f"{SHAPES[shape]}: message_to_event gives {ours!r}, azure-eventhub's EventData "
                                   f"gives {theirs!r}")
    return (f"decode: inputs checked: three data sections arrive as 10, 10 and 12 bytes; message_to_event gives what "
            f"azure-eventhub's EventData gives for {', '.join(SHAPES.values())}")


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING)
    print(check_inputs(), file=sys.stderr)
    current = eventhub_source.message_to_event
    data = measure({"floor": _floor, "current": current, "official": _official},
                   received_messages(args.events, "data"), args.rounds)
    ratio = [c / o for c, o in zip(data["current"], data["official"], strict=False)]
    others = {shape: measure({"current": current, "official": _official},
                             received_messages(args.events, shape), max(1, args.rounds // 3))
              for shape in ("data3", "sequence", "value")}
    lines = [
        "## Received message to Event: per-event cost (`decode`)",
        "",
        run.header("The machine is shared: the per-round ratio is the figure to trust."),
        "",
        f"{args.events:,} messages per pass, encoded and decoded by azure-eventhub's own codec (what the lean "
        f"receive path gets): {BODY_SIZE}-byte body, the service annotations and a partition key, one "
        "application property, message-id and content-type. Nanoseconds per event, median of "
        f"{args.rounds} rounds (range), the order of the contestants rotated every round, the garbage collector "
        "paused while timing. Both conversions give the same events (checked before timing).",
        "",
        table([SHAPES["data"], "ns/event"], [
            ["floor: read the fields into a tuple", median_range(data["floor"])],
            ["**`message_to_event`** (this SDK)", f"**{median_range(data['current'])}**"],
            ["azure-eventhub `EventData._from_message`", median_range(data["official"])]], align="lr"),
        "",
        f"`message_to_event` / azure-eventhub, per round: median **{median(ratio):.2f}**, range "
        f"{value_range(ratio, '.2f')}.",
        "",
        table([f"other bodies ({max(1, args.rounds // 3)} rounds)", "this SDK ns/event", "azure-eventhub ns/event"],
              [[SHAPES[shape], median_range(result["current"]), median_range(result["official"])]
               for shape, result in others.items()], align="lrr"),
    ]
    run.report("\n".join(lines))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
