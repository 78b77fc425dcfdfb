"""Every size of a run, within the time budget: calibrate, size, then each side that fits."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .sides import Runner, SideResult
from .sizing import IMPLS, Calibration, Sizing, calibrate, choose_timing, ours_at_defaults

__all__ = ["SizeResult", "cap_seconds", "run_sizes", "side_seconds"]


@dataclass
class SizeResult:
    partitions: int
    processors: int
    calibration: Calibration
    sizing: Sizing
    sides: dict[str, SideResult] = field(default_factory=dict)
    error: str | None = None
    not_run: str | None = None  # why this size was measured and sized but not run
    skipped: dict[str, str] = field(default_factory=dict)  # impl -> why that side was not run


def cap_seconds(args: argparse.Namespace, sizing: Sizing) -> float:
    """How long the cap's ticks take when every tick keeps time (10 % slack, 30 s start-up)."""
    return args.cap_ticks * 1.1 * sizing.interval + 30.0


def side_seconds(args: argparse.Namespace, sizing: Sizing, processors: int) -> float:
    """The longest one side takes when its ticks keep time: imports, the cap, holding, stopping."""
    hold = args.hold if args.hold is not None else sizing.hold
    return _overhead(args, processors) + cap_seconds(args, sizing) + hold


def _overhead(args: argparse.Namespace, processors: int) -> float:
    """Imports of the workers, the final listing and stopping: what a side takes beside balancing."""
    return min(args.ready_timeout, 2.0 * processors) + 30.0


async def run_sizes(args: argparse.Namespace, connection_string: str, azurite_pid: int | None, *,
                    sizes: list[tuple[int, int]] | None = None, started: float | None = None,
                    first_index: int = 0) -> list[SizeResult]:
    """Run ``sizes`` (``args.sizes`` by default) on one Azurite. ``started``: when the
    budget began (now by default); ``first_index``: the position of the first size in
    the whole run (the order of the sides alternates with it)."""
    machine = os.cpu_count() or 1
    started = time.monotonic() if started is None else started
    budget_end = started + args.budget_minutes * 60
    results: list[SizeResult] = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as scratch:
        log_dir = args.log_dir or scratch
        os.makedirs(log_dir, exist_ok=True)
        runner = Runner(args, connection_string, azurite_pid, log_dir)
        for index, (partitions, processors) in enumerate(args.sizes if sizes is None else sizes,
                                                         start=first_index):
            try:
                try:
                    calibration = await calibrate(connection_string, partitions, args.calibration_listings,
                                                  azurite_pid, args.idle_sample)
                except Exception:  # once more, after the last side's workers have let go of Azurite
                    await asyncio.sleep(15)
                    calibration = await calibrate(connection_string, partitions, args.calibration_listings,
                                                  azurite_pid, args.idle_sample)
            except Exception as error:  # a store too busy to answer: say so, measure the next size
                reason = f"{partitions} x {processors}: the listing cost could not be measured ({error!r:.200})"
                print(reason, file=sys.stderr, flush=True)
                args.unmeasured.append(reason)
                continue
            # The cores the processors can count on: those the machine leaves idle (other
            # users' work included), but at least a quarter of it.
            idle = calibration.idle_cores
            cores = machine if idle is None else min(float(machine), max(idle, 0.25 * machine))
            sizing = choose_timing(calibration.cpu, processors, round(cores, 1), budget=args.cpu_budget,
                                   min_interval=args.min_interval, store_listing=calibration.server_cpu,
                                   store_write=calibration.server_write_cpu, partitions=partitions)
            print(f"{partitions}x{processors}: listing {partitions} records costs {calibration.cpu * 1000:.0f} ms CPU "
                  f"(client {calibration.client_cpu * 1000:.0f} ms); sized for {sizing.cores:g} cores: "
                  f"I={sizing.interval:g} s, E={sizing.expiration:g} s (bound by {sizing.bound_by})", file=sys.stderr,
                  flush=True)
            size = SizeResult(partitions, processors, calibration, sizing)
            results.append(size)
            order = [impl for impl in (IMPLS if index % 2 == 0 else IMPLS[::-1]) if impl in args.impls]
            # Each side is budgeted at its own timing: ours at its defaults runs its ticks at
            # ours' interval, not at the one sized for the official processor.
            sizings = {impl: ours_at_defaults(sizing) if impl == "ours" and args.ours_timing == "defaults"
                       else sizing for impl in order}
            needs = {impl: side_seconds(args, sizings[impl], processors) for impl in order}
            # A size runs whole or not at all: one side alone compares nothing (the first
            # side skipped for want of time, the second then found the time left over).
            whole_left = budget_end - time.monotonic()
            whole = sum(needs.values()) > whole_left
            for position, impl in enumerate(order):
                # The sides after this one keep what they need; this one may use the rest
                # when its ticks overrun, and is cut there ("budget"), never at the cap.
                reserved = sum(needs[later] for later in order[position + 1:])
                left = budget_end - time.monotonic() - reserved
                need, side_sizing = needs[impl], sizings[impl]
                if whole or need > left:
                    size.skipped[impl] = (
                        f"sized at I = {side_sizing.interval:g} s, each side could take {need / 60:.0f} min "
                        f"({args.cap_ticks:g} ticks to the cap, then {side_sizing.hold:.0f} s held so that every "
                        f"lease is renewed once) and {max(whole_left if whole else left, 0) / 60:.0f} min of the "
                        f"{args.budget_minutes:g}-minute budget were left for "
                        + (f"its {len(order)} sides (a size runs whole or not at all)" if whole else "it"))
                    print(f"{partitions}x{processors} {impl}: not run: {size.skipped[impl]}", file=sys.stderr,
                          flush=True)
                    continue
                hold = args.hold if args.hold is not None else side_sizing.hold
                deadline = time.monotonic() + left - _overhead(args, processors) - hold
                try:
                    size.sides[impl] = await runner.side(impl, partitions, processors, side_sizing, deadline)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # a saturated store, a worker that died: say so, go on
                    first = (str(error) or repr(error)).splitlines()[0]
                    size.error = "; ".join(filter(None, [size.error, f"{impl}: {first}"]))
                    print(f"{partitions}x{processors} {impl} failed: {error!r:.500}", file=sys.stderr, flush=True)
            if order and len(size.skipped) == len(order):
                size.not_run = size.skipped[order[0]]
    return results
