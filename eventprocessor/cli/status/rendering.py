"""Showing a group's status: the partitions table, the members table, the notes and the
summary line (rich)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventprocessor._ownership.strategies import HANDOFF_PROPERTY, ORDINAL_PROPERTY

from .model import EXPIRED, OWNED, RELEASED, UNCLAIMED, UNREADABLE, GroupStatus

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import RenderableType


__all__ = ["render"]


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    whole = int(seconds)
    if whole < 60:
        return f"{sign}{whole}s"
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


_STATE_STYLE = {OWNED: "green", EXPIRED: "bold red", RELEASED: "yellow", UNCLAIMED: "yellow", UNREADABLE: "magenta"}


def render(status: GroupStatus, *, refreshed: str | None = None) -> RenderableType:
    """The partitions table, the members table, the notes and the summary line.

    Columns nobody could fill are left out: ``checkpointed`` when the store keeps no
    checkpoint times, ``last enqueued`` and ``lag`` when the event hub was not read (a
    note says why).

    Example::

        Console().print(render(status))
    """
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    heading = Text(f"consumer group {status.consumer_group} of {status.fully_qualified_namespace}/"
                   f"{status.eventhub_name}", style="bold")
    where = Text(f"{status.store} · store time {status.server_time:%Y-%m-%d %H:%M:%S} UTC · expiration "
                 f"{status.expiration:g} s" + (f" · {refreshed}" if refreshed else ""), style="dim")
    timed = any(row.checkpoint_age is not None for row in status.partitions)
    lagged = any(row.last_enqueued_sequence_number is not None for row in status.partitions)
    partitions = Table(box=box.SIMPLE_HEAD, show_edge=False)
    columns = [("partition", "right"), ("owner", "left"), ("state", "left"), ("epoch", "right"),
               ("lease age", "right"), ("checkpoint", "right"), ("offset", "right")]
    columns += [("checkpointed", "right")] if timed else []
    columns += [("last enqueued", "right"), ("lag", "right")] if lagged else []
    flying = any(row.in_flight is not None for row in status.partitions)
    columns += [("in flight", "right"), ("oldest", "right")] if flying else []
    for name, justify in columns:
        partitions.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in status.partitions:
        state = Text(row.state, style=_STATE_STYLE.get(row.state, ""))
        if row.requested_by:
            state.append(f", handoff to {row.requested_by}", style="cyan")
        if row.note:
            state.append(f" ({row.note})")
        cells: list[Any] = [row.partition_id, _text(row.owner_id), state, _text(row.epoch), _age(row.lease_age),
                            _text(row.checkpoint_sequence_number), _text(row.checkpoint_offset)]
        if timed:
            cells.append(_age(row.checkpoint_age) + (" ago" if row.checkpoint_age is not None else ""))
        if lagged:
            from_start = " from start" if row.lag_from == "start" and row.lag is not None else ""
            cells += [_text(row.last_enqueued_sequence_number), _text(row.lag) + from_start]
        if flying:
            cells += [_text(row.in_flight), _age(row.oldest_in_flight_age)]
        partitions.add_row(*cells)

    members = Table(box=box.SIMPLE_HEAD, show_edge=False)
    # Heartbeat and properties come from member records; without them the columns say nothing.
    heartbeats = any(member.heartbeat_age is not None for member in status.members)
    member_columns = [("member", "left"), ("state", "left"), ("owns", "right"), ("expired", "right")]
    if heartbeats:
        member_columns += [("heartbeat", "right"), ("strategy", "left"), ("handoff", "left"), ("ordinal", "right")]
    for name, justify in member_columns:
        members.add_column(name, justify=justify)  # type: ignore[arg-type]
    for member in status.members:
        member_cells: list[Any] = [member.owner_id, Text(member.state, style="green" if member.state == "live"
                                                         else "red"), str(member.owned), str(member.expired)]
        if heartbeats:
            member_cells += [_age(member.heartbeat_age), _text(member.properties.get("strategy")),
                             _text(member.properties.get(HANDOFF_PROPERTY)),
                             _text(member.properties.get(ORDINAL_PROPERTY))]
        members.add_row(*member_cells)

    parts: list[Any] = [heading, where, Text(""), partitions, Text(""), Text("members", style="bold"), members,
                        Text("")]
    for note in (status.records_note, status.members_note, status.lag_note):
        if note:
            parts.append(Text(note, style="dim"))
    parts.append(Text(status.summary.line(), style="bold"))
    return Group(*parts)


