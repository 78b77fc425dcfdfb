"""Where a receiver starts: its selector filter, parsed."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import BrokerError

__all__ = ["StartPosition", "parse_selector"]


@dataclass(frozen=True)
class StartPosition:
    """A receiver's starting point, parsed from its selector filter."""

    kind: str  # "offset", "sequence_number", "enqueued_time", "start", "latest"
    value: int = 0
    inclusive: bool = False


def parse_selector(expression: str | None) -> StartPosition:
    """Parse ``amqp.annotation.x-opt-offset > '123'`` and its siblings; ``None`` (a receiver
    attached without a filter) is the start of the partition.

    Raises :class:`BrokerError` (``amqp:invalid-field``) for anything else.
    """
    if expression is None:
        # No filter: the service starts at the beginning of the partition (azure-eventhub's
        # live test test_send_with_long_interval_async relies on it against the service).
        return StartPosition("start")
    text = expression.strip()
    for name, kind in (("amqp.annotation.x-opt-offset", "offset"),  # noqa: B007 (kind is read after the loop)
                       ("amqp.annotation.x-opt-sequence-number", "sequence_number"),
                       ("amqp.annotation.x-opt-enqueued-time", "enqueued_time")):
        if text.lower().startswith(name):
            rest = text[len(name):].strip()
            break
    else:
        raise BrokerError("amqp:invalid-field", f"unsupported selector filter {expression!r}")
    if rest.startswith(">="):
        inclusive, rest = True, rest[2:].strip()
    elif rest.startswith(">"):
        inclusive, rest = False, rest[1:].strip()
    else:
        raise BrokerError("amqp:invalid-field", f"unsupported comparison in selector filter {expression!r}")
    if len(rest) < 2 or rest[0] != "'" or rest[-1] != "'":
        raise BrokerError("amqp:invalid-field", f"the value in selector filter {expression!r} must be quoted")
    value = rest[1:-1]
    if kind == "offset" and value == "@latest":
        return StartPosition("latest")
    if kind == "offset" and value == "-1":
        return StartPosition("start")
    try:
        number = int(value)
    except ValueError:
        raise BrokerError("amqp:invalid-field", f"the value in selector filter {expression!r} is not a number") \
            from None
    return StartPosition(kind, number, inclusive)
