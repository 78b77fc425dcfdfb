"""What the demo shows: the live table of processors, its log lines above the table, the
one-line messages and the summary."""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table

from eventprocessor import EventProcessor

if TYPE_CHECKING:  # pragma: no cover
    from .model import DemoResult, Ledger

__all__ = ["Silenced", "logging_above", "processors_table", "say", "silencing", "summary_table"]

class Silenced(logging.Filter):
    """A crashed process says nothing more: the demo's crash drops the log records of
    the processors it killed (their dead store link would fail every call they try
    while they are torn down, which a killed process never reports)."""

    def __init__(self) -> None:
        super().__init__()
        self.owner_ids: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.owner_ids:
            return True
        if getattr(record, "eventprocessor.owner_id", None) in self.owner_ids:
            return False
        message = record.getMessage()
        return not any(f"processor {owner_id} " in message for owner_id in self.owner_ids)


@contextlib.contextmanager
def silencing(silenced: Silenced) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name == "eventprocessor" or name.startswith("eventprocessor.")]
    for each in loggers:
        each.addFilter(silenced)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(silenced)


@contextlib.contextmanager
def logging_above(live: Live | None) -> Iterator[None]:
    """While ``live`` shows its table, log lines go through it (printed above the
    table) instead of straight to the terminal, where they would break the redraw and
    leave pieces of the table in the scrollback."""
    if live is None or sys.stderr is sys.__stderr__:  # Live redirects stderr only on a terminal
        yield
        return
    moved = [(handler, handler.stream) for handler in logging.getLogger().handlers
             if type(handler) is logging.StreamHandler and handler.stream in (sys.__stderr__, sys.__stdout__)]
    for handler, _stream in moved:
        handler.setStream(sys.stderr)
    try:
        yield
    finally:
        for handler, stream in moved:
            handler.setStream(stream)


def say(console: Console, message: str) -> None:
    """One line, shown as written: no markup (a ``[failover]`` label stays), no wrapping."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)


def processors_table(processors: list[EventProcessor], alive: dict[str, str], ledger: Ledger, produced: int,
                     phase: str) -> Table:
    """The live view: each processor's state, the partitions it owns, the events it handled."""
    ticks = max((p.ticks for p in processors), default=0)
    table = Table(title=f"eventprocessor demo — {phase}", caption=(
        f"tick {ticks} · produced {produced} · processed {len(ledger.seen)} · deliveries {ledger.deliveries}"))
    table.add_column("processor")
    table.add_column("state")
    table.add_column("owns", justify="right")
    table.add_column("partitions")
    table.add_column("events", justify="right")
    for p in processors:
        owned = sorted(p.owned_partitions, key=int)
        table.add_row(p.owner_id, alive[p.owner_id], str(len(owned)), " ".join(owned),
                      str(ledger.per_owner[p.owner_id]))
    return table


def summary_table(result: DemoResult) -> Table:
    table = Table(title="summary", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("events produced", str(result.produced)),
        ("events processed", str(result.processed)),
        ("events lost", str(result.lost)),
        ("duplicates (redelivered after crash)", str(result.duplicates)),
        ("time to balance", f"{result.time_to_balance:.1f}s ({result.ticks_to_balance} ticks)"
         if result.time_to_balance is not None else "-"),
        ("scale-in rebalance", f"{result.scale_in_seconds:.1f}s" if result.scale_in_seconds is not None else "-"),
        ("crash failover", f"{result.failover_seconds:.1f}s" if result.failover_seconds is not None else "-"),
        ("store", result.store_location),
        ("source", result.source_location),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
