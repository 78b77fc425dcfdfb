"""What a worker process reports: JSON lines on stdout, one per event a parent reads.

:func:`emit` writes a line; :class:`Tally` counts deliveries and writes the ``first``,
``done`` and ``batch`` lines; :class:`OwnershipLines` turns this SDK's ownership log
records into ``ownership`` lines; :func:`trace_allocations` writes ``tracemalloc``
lines; :func:`resident_bytes` is the memory a ``stats`` line reports;
:class:`RenewalWatch` counts the renewals a ``state`` line reports, by one rule for both
SDKs. The parent side is :class:`harness.worker.process.WorkerHandle`.

Example::

    emit({"event": "stats", "events": tally.events, "rss": resident_bytes()})
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["OwnershipLines", "RenewalWatch", "Tally", "emit", "resident_bytes", "trace_allocations"]


def emit(record: dict[str, Any]) -> None:
    """Write ``record`` as one JSON line on stdout, flushed (what a parent reads)."""
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int | None = None) -> int | None:
    """A process's resident set size in bytes, from ``/proc/<pid>/statm`` (Linux), or None."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return None


class Tally:
    """What this process delivered: counts for the stats line, and the batch lines."""

    def __init__(self, report_events: bool, expect: int) -> None:
        self.report_events = report_events
        self.expect = expect
        self.events = 0
        self.newest: dict[str, int] = {}  # partition -> highest sequence number delivered
        self.progress = asyncio.Event()  # set at each delivery (the in-process producer waits on it)

    def delivered(self, partition_id: str, sequence_numbers: list[int]) -> None:
        if sequence_numbers:
            self.newest[partition_id] = max(self.newest.get(partition_id, -1), sequence_numbers[-1])
            self.progress.set()
        if self.events == 0:
            emit({"event": "first", "cpu": time.process_time(), "t": time.time()})
        self.events += len(sequence_numbers)
        if self.expect and self.events >= self.expect and self.events - len(sequence_numbers) < self.expect:
            emit({"event": "done", "events": self.events, "cpu": time.process_time(), "t": time.time()})
        if self.report_events and sequence_numbers:
            first, last = sequence_numbers[0], sequence_numbers[-1]
            contiguous = last - first + 1 == len(sequence_numbers)
            emit({"event": "batch", "p": partition_id, "s": [first, last] if contiguous else sequence_numbers,
                   "c": int(contiguous), "t": time.time()})


async def trace_allocations(after_events: int, tally: Tally, frames: int, top: int = 25) -> None:
    """Trace allocations from ``after_events`` delivered events on; take the baseline at
    twice that many (by then the steady working set, which was allocated before tracing
    began and so is invisible to it, has been allocated again under tracing); when
    cancelled (at the stop), print the allocation sites whose live memory grew most
    since the baseline, as ``tracemalloc`` lines, innermost frame first. Growth that
    keeps up with the events is a leak; a warm working set shows as a few KiB."""
    import gc
    import tracemalloc

    while tally.events < after_events:
        await asyncio.sleep(0.1)
    tracemalloc.start(max(1, frames))
    while tally.events < 2 * after_events:
        await asyncio.sleep(0.1)
    gc.collect()
    baseline, events_then = tracemalloc.take_snapshot(), tally.events
    try:
        await asyncio.Event().wait()
    finally:
        gc.collect()
        grown = tracemalloc.take_snapshot().compare_to(baseline, "traceback")
        tracemalloc.stop()
        for stat in grown[:top]:
            emit({"event": "tracemalloc", "events": tally.events - events_then, "size_diff": stat.size_diff,
                   "count_diff": stat.count_diff,
                   "traceback": [f"{frame.filename}:{frame.lineno}" for frame in reversed(stat.traceback)]})


class OwnershipLines(logging.Handler):
    """Each ownership change of this SDK's processor as a JSON line, from the structured
    fields of its log record (``OWNERSHIP_LOG_FIELDS``)."""

    def emit(self, record: logging.LogRecord) -> None:
        reason = getattr(record, "eventprocessor.reason", None)
        if reason is not None:
            emit({"event": "ownership", "reason": reason, "p": getattr(record, "eventprocessor.partition_id", None),
                   "epoch": getattr(record, "eventprocessor.epoch", None), "t": record.created})


class RenewalWatch:
    """Renewals and missed renewals of one processor, by the same rule for both SDKs.

    :meth:`wrap` goes around the store's ``claim_ownership`` (the one call through which
    both write ownership records): the time a write of one of this processor's records
    was sent is kept when the store accepts it. :meth:`watch` samples what the processor
    dispatches every 0.1 s and counts a partition as one missed renewal when it is still
    dispatched more than ``expiry`` after that time: past that point another processor
    may claim it. The time is when the write was sent, so the count errs toward missed.
    For ours, a partition's time is the later of that write and the processor's last
    heartbeat that keeps every partition (:meth:`wrap_member`); ``heartbeats`` counts
    those the store accepted (``renewals`` counts rewrites of ownership records only).
    """

    def __init__(self, owner_id: str, expiry: float, owned: Callable[[], set[str]],
                 field: Callable[[Any, str], Any]) -> None:
        self.owner_id = owner_id
        self.expiry = expiry
        self.owned = owned
        self.field = field  # how to read a record's field (dicts for the official, Ownership for ours)
        self.written: dict[str, float] = {}  # partition -> monotonic send time of its last accepted write
        self.heartbeat: float | None = None  # send time of the last accepted member record that keeps them all
        self.lapsed: set[str] = set()
        self.missed = self.renewals = self.failed_renewals = self.heartbeats = 0

    def wrap(self, claim: Callable[..., Any]) -> Callable[..., Any]:
        async def counted_claim(ownerships: Any, **kwargs: Any) -> Any:
            records = list(ownerships)
            sent_at = time.monotonic()
            wanted = {self.field(r, "partition_id") for r in records if self.field(r, "owner_id") == self.owner_id}
            had = {pid for pid in wanted if pid in self.written}
            won = list(await claim(records, **kwargs))
            mine = {self.field(r, "partition_id") for r in won if self.field(r, "owner_id") == self.owner_id}
            for pid in mine:
                self.written[pid] = sent_at
            self.renewals += len(had & mine)
            self.failed_renewals += len(had - mine)
            return won

        return counted_claim

    def wrap_member(self, write_member: Callable[..., Any]) -> Callable[..., Any]:
        """Ours: a member record with ``lease=member`` the store accepted keeps every
        partition of the processor, as a write of each record would."""
        async def counted_heartbeat(member: Any) -> Any:
            sent_at = time.monotonic()
            written = await write_member(member)
            if member.properties.get("lease") == "member":
                self.heartbeat = sent_at
                self.heartbeats += 1
            return written

        return counted_heartbeat

    async def watch(self) -> None:
        while True:
            now = time.monotonic()
            for pid in self.owned():
                last = self.written.get(pid)
                if last is not None and self.heartbeat is not None:
                    last = max(last, self.heartbeat)
                if last is not None and now - last > self.expiry:
                    if pid not in self.lapsed:
                        self.lapsed.add(pid)
                        self.missed += 1
                else:
                    self.lapsed.discard(pid)
            await asyncio.sleep(0.1)

    def counters(self) -> dict[str, int]:
        return {"missed_renewals": self.missed, "renewals": self.renewals, "failed_renewals": self.failed_renewals,
                "heartbeats": self.heartbeats}
