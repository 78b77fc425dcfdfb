"""``eventprocessor send``: a small producer for the local emulator and any event hub.

It sends ``--count`` events whose bodies come from a template (``--body``), or one
event per line of a file (``--lines``), at a rate or as fast as the hub takes them,
with a partition key from a template or to one partition, through azure-eventhub's own
producer. Events with the same key go out in order, batched while they are due
together. It prints one line at the end: how many events went to which hub.

Templates are Python format strings over the fields of each event: ``{i}`` (its
number in this run, from 0), ``{time}`` (UTC, ISO 8601, when it is sent) and, with
``--lines``, ``{line}`` and the top-level fields of a line that is a JSON object
(``--partition-key '{device}'``).
"""
from __future__ import annotations

import asyncio
import json
import string
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from .user_errors import CommandError, require

__all__ = ["SendOptions", "planned_events", "run_send"]

BUILT_IN_FIELDS = ("i", "time")


@dataclass(frozen=True)
class SendOptions:
    """The options of ``eventprocessor send`` (see its ``--help``)."""

    connection_string: str | None = None
    eventhub: str | None = None
    count: int = 10
    rate: float = 0.0
    partition_key: str | None = None
    partition_id: str | None = None
    body: str = "event {i}"
    lines: TextIO | None = None

    def __repr__(self) -> str:  # the dataclass default would show the connection string
        return f"SendOptions(eventhub={self.eventhub!r}, count={self.count}, rate={self.rate})"


@dataclass(frozen=True)
class PlannedEvent:
    """One event to send: its body, its partition key (or None) and when it is due,
    in seconds from the start."""

    body: str
    partition_key: str | None
    due: float


def _fields_of(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]


def _check_template(option: str, template: str, fields: Sequence[str]) -> None:
    """A template may name only the fields an event has: said before anything is sent."""
    try:
        names = _fields_of(template)
    except ValueError as error:
        raise CommandError(f"{option} {template!r} is not a template: {error} (write {{{{ and }}}} for braces)") \
            from None
    unknown = [name for name in names if name.split(".")[0].split("[")[0] not in fields]
    if unknown:
        known = ", ".join(f"{{{name}}}" for name in fields)
        raise CommandError(f"{option} {template!r} names {{{unknown[0]}}}, which an event does not have; "
                           f"the fields are {known}")


def _line_fields(line: str) -> dict[str, Any]:
    try:
        document = json.loads(line)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def planned_events(options: SendOptions, now: Any = None) -> Iterator[PlannedEvent]:
    """The events ``options`` ask for, in order. Pure but for ``now()``, the time
    ``{time}`` takes (UTC)."""
    clock = now or (lambda: datetime.now(timezone.utc))
    rate = options.rate
    if options.lines is not None:
        numbered: Iterator[tuple[int, str | None]] = enumerate(
            line.rstrip("\r\n") for line in options.lines if line.strip())
    else:
        numbered = ((i, None) for i in range(options.count))
    for i, line in numbered:
        fields: dict[str, Any] = {**(_line_fields(line) if line is not None else {}), "i": i,
                                  "time": clock().isoformat(timespec="milliseconds")}
        if line is not None:
            fields["line"] = line
        body = line if line is not None else options.body.format_map(fields)
        key = options.partition_key.format_map(fields) if options.partition_key is not None else None
        yield PlannedEvent(body, key, i / rate if rate > 0 else 0.0)


def _hub(options: SendOptions) -> tuple[str, str]:
    """The connection string and the hub to send to."""
    from azure.eventhub import parse_connection_string

    from eventprocessor.emulators.eventhubs import DEFAULT_EVENTHUB, connection_string

    conn = options.connection_string or connection_string("127.0.0.1", 5672)
    try:
        named = parse_connection_string(conn).eventhub_name
    except Exception:
        raise CommandError("the Event Hubs connection string is malformed (value not shown): expected "
                           "'Endpoint=sb://<namespace>/;SharedAccessKeyName=<name>;SharedAccessKey=<key>"
                           "[;EntityPath=<hub>]'") from None
    hub = options.eventhub or named or (None if options.connection_string else DEFAULT_EVENTHUB)
    if hub is None:
        raise CommandError("which event hub? pass --eventhub (the connection string has no EntityPath)")
    if named and hub != named:
        raise CommandError(f"the connection string's EntityPath is {named!r} and --eventhub is {hub!r}: "
                           "drop one of them")
    return conn, hub


async def _send(conn: str, hub: str, events: Iterator[PlannedEvent], partition_id: str | None) -> int:
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    sent = 0
    started = time.monotonic()
    pending = next(events, None)
    # One retry: a refused connection or an unknown hub is said within seconds, not after
    # the client's default three retries with backoff (about 15 s).
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub, retry_total=1)
    async with producer:
        while pending is not None:
            await asyncio.sleep(max(0.0, pending.due - (time.monotonic() - started)))
            due: list[PlannedEvent] = []
            while pending is not None and pending.due <= time.monotonic() - started:
                due.append(pending)
                pending = next(events, None)
            by_key: dict[str | None, list[PlannedEvent]] = {}
            for event in due:  # one batch per key; within a key, in order
                by_key.setdefault(event.partition_key, []).append(event)
            for key, group in by_key.items():
                batch = await producer.create_batch(partition_key=key, partition_id=partition_id)
                for event in group:
                    try:
                        batch.add(EventData(event.body))
                    except ValueError:  # the batch is full: send it, start the next
                        await producer.send_batch(batch)
                        batch = await producer.create_batch(partition_key=key, partition_id=partition_id)
                        batch.add(EventData(event.body))
                await producer.send_batch(batch)
                sent += len(group)
    return sent


def _where(conn: str, hub: str) -> str:
    endpoint = conn.split(";", 1)[0].split("=", 1)[-1].removeprefix("sb://").rstrip("/")
    return f"{hub} on {endpoint}"


def run_send(options: SendOptions, out: TextIO = sys.stdout) -> int:
    """Run ``eventprocessor send``; return how many events were sent. User errors
    raise ``CommandError``."""
    fields = list(BUILT_IN_FIELDS) + (["line"] if options.lines is not None else [])
    if options.lines is None:
        _check_template("--body", options.body, fields)
    if options.partition_key is not None:
        # With --lines, a JSON line's own fields may be named too: checked line by line.
        if options.lines is None:
            _check_template("--partition-key", options.partition_key, fields)
    if options.partition_key is not None and options.partition_id is not None:
        raise CommandError("--partition-key and --partition-id cannot go together: a key picks the partition")
    require(purpose="`eventprocessor send`", extras=["eventhub"])
    conn, hub = _hub(options)
    try:
        sent = asyncio.run(_send(conn, hub, planned_events(options), options.partition_id))
    except KeyError as error:
        raise CommandError(f"--partition-key names {{{error.args[0]}}}, which a line does not have") from None
    except Exception as error:
        from azure.eventhub.exceptions import EventHubError

        if not isinstance(error, EventHubError):
            raise
        # azure-eventhub repeats its description after "Error condition:"; the first part says it.
        said = " ".join(str(error).split("Error condition:")[0].split())
        raise CommandError(f"cannot send to {_where(conn, hub)}: {type(error).__name__}: {said}") from None
    print(f"sent {sent} events to {_where(conn, hub)}", file=out)
    return sent
