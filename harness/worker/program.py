"""The worker program's main: ``python -m harness.worker`` (see :mod:`harness.worker`)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from .handlers import CpuCost
from .names import HUB_ENV, STORAGE_ENV
from .options import FLOORS, parse
from .report import OwnershipLines, Tally, emit, resident_bytes, trace_allocations
from .run import Worker

__all__ = ["main"]

logger = logging.getLogger(__name__)


def _missing_environment(args: argparse.Namespace) -> list[str]:
    needed = [HUB_ENV] if args.source == "eventhub" else []
    if args.store == "blob" and args.impl not in FLOORS:  # the floors keep no checkpoints
        needed.append(STORAGE_ENV)
    return [name for name in needed if not os.environ.get(name)]


def _stats_line(tally: Tally) -> dict[str, Any]:
    return {"event": "stats", "events": tally.events, "cpu": time.process_time(), "t": time.time(),
            "rss": resident_bytes()}


async def _every(seconds: float, line: Any) -> None:
    while True:
        emit(line())
        await asyncio.sleep(seconds)


def _read_stdin(worker: Worker, loop: asyncio.AbstractEventLoop, started: dict[str, float]) -> None:
    """``--wait-for-go``: the first line on stdin starts the run (the CPU and request
    counts of the state lines start there); stdin closing means the parent is gone: stop.
    A daemon thread, so it never holds up the exit."""
    def go() -> None:
        started["cpu"] = time.process_time()
        started["requests"] = worker.transport.total if worker.transport is not None else 0
        worker.go.set()

    def gone() -> None:
        if worker.go.is_set():
            logger.warning("stdin closed: the parent is gone; stopping")
        worker.stop.set()
        worker.go.set()

    for _line in sys.stdin:
        if not worker.go.is_set():
            loop.call_soon_threadsafe(go)
    loop.call_soon_threadsafe(gone)


async def _loop_lag(lag: list[float]) -> None:
    """How late a 0.1 s sleep wakes: the longest stall of the event loop."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(0.1)
        lag[0] = max(lag[0], time.monotonic() - before - 0.1)


def _state_line(worker: Worker, started: dict[str, float], lag: list[float], last: list[Any]) -> dict[str, Any]:
    owned = worker.probe.owned()
    record: dict[str, Any] = {"event": "state", "t": time.time(), "cpu": round(time.process_time() - started["cpu"], 3),
                              "requests": (worker.transport.total if worker.transport is not None else 0)
                              - started["requests"], "count": len(owned), "loop_lag": round(lag[0], 3),
                              **worker.probe.counters()}
    if owned != last[0]:
        record["owned"] = sorted(owned, key=int)
        last[0] = owned
    return record


async def _state_lines(worker: Worker, started: dict[str, float], side: asyncio.Task[None]) -> None:
    """``--state-every``: from 'go' to the stop, a state line that often, and one at the end."""
    lag = [0.0]
    watcher = asyncio.create_task(_loop_lag(lag))
    last: list[Any] = [None]
    try:
        await worker.go.wait()
        while not worker.stop.is_set() and not side.done():
            emit(_state_line(worker, started, lag, last))
            try:
                await asyncio.wait_for(worker.stop.wait(), worker.args.state_every)
            except asyncio.TimeoutError:
                pass
        emit(_state_line(worker, started, lag, last))
    finally:
        watcher.cancel()


async def _run(worker: Worker) -> None:
    args = worker.args
    if args.impl == "ours":
        from .ours import run
    elif args.impl == "official":
        from .official import run
    else:
        from .floor import run
    await run(worker)


async def _amain(args: argparse.Namespace) -> int:
    missing = _missing_environment(args)
    if missing:
        print(f"worker: {', '.join(missing)} is not set", file=sys.stderr)
        return 2
    transport = None
    if args.state_every and args.store == "blob":
        from harness.counting_transport import CountingTransport

        transport = CountingTransport()
    worker = Worker(args, Tally(args.report == "events", args.expect), CpuCost(args), transport)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop.set)
    loop.add_signal_handler(signal.SIGUSR1, worker.cost.slow_down)
    started: dict[str, float] = {"cpu": time.process_time(), "requests": 0}
    if args.wait_for_go:
        threading.Thread(target=_read_stdin, args=(worker, loop, started), name="stdin", daemon=True).start()
    else:
        worker.go.set()
    if args.lifetime:
        loop.call_later(args.lifetime, worker.stop.set)
    side = asyncio.create_task(_run(worker))
    states = asyncio.create_task(_state_lines(worker, started, side)) if args.state_every else None
    helpers = [asyncio.create_task(_every(args.stats_interval, lambda: _stats_line(worker.tally)))
               if args.stats_interval else None,
               asyncio.create_task(trace_allocations(args.tracemalloc_at, worker.tally, args.tracemalloc_frames))
               if args.tracemalloc_at else None]
    try:
        await side
    finally:
        worker.stop.set()  # the state lines end with a last one
        for helper in filter(None, helpers):
            helper.cancel()
        await asyncio.gather(*filter(None, [*helpers, states]), return_exceptions=True)
    if args.stats_interval:
        emit(_stats_line(worker.tally))
    emit({"event": "stopped", "owner": args.owner_id})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    level = logging.getLevelName(args.log_level)
    logging.getLogger().handlers[0].setLevel(level)
    if level < logging.WARNING:
        logging.getLogger("eventprocessor").setLevel(level)
    if args.impl == "ours" and args.ownership_lines:
        logging.getLogger("eventprocessor").setLevel(min(level, logging.INFO))
        logging.getLogger("eventprocessor").addHandler(OwnershipLines())
    return asyncio.run(_amain(args))
