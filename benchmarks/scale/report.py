"""The scale benchmark's section of RESULTS.md: the sizing table, a table per size and
side, and what this machine held."""
from __future__ import annotations

import argparse
import math
import os
from typing import Any

from ..toolkit.report import busy_flag, number, package_version, table
from .run import SizeResult, cap_seconds
from .sides import SideResult
from .sizing import EXPIRATION_RATIO, IMPLS, OFFICIAL_EXPIRATION_RATIO, ours_at_defaults

__all__ = ["render"]


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def _waited(r: SideResult) -> str:
    if r.balanced_after is not None:
        return f"{r.balanced_after:.1f}"
    why = "cap reached" if r.ended_by == "cap" else "stopped by the time budget before the cap"
    return f"not balanced after {r.waited:.0f} ({why})"


def render(results: list[SizeResult], args: argparse.Namespace, head: str) -> str:
    """The section: ``head`` (the line under the title, :meth:`~benchmarks.toolkit.program.Run.header`),
    the sizing table, a table per size, what the machine held."""
    cores = os.cpu_count() or 1
    readings = [side.load for size in results for side in size.sides.values() if side.load is not None]
    lines = [
        "## Scale on Azurite: separate processes, ours vs the official EventProcessor (`scale`)",
        "",
        head,
        "",
        *busy_flag(readings, "the figures of the flagged sides"),
        f"One Azurite per size (in-memory, 127.0.0.1), started fresh by the benchmark. Each processor is its own OS "
        f"process (`python -m harness.worker --source none`); all of a side start together after their imports. "
        f"*ours*: "
        f"`EventProcessor` + our `BlobCheckpointStore`, reading an empty `InMemoryEventSource`. *official*: "
        f"azure-eventhub {package_version('azure-eventhub')}'s own `EventProcessor` class (its `OwnershipManager` and "
        f"load-balancing loop) + `azure-eventhub-checkpointstoreblob-aio`, with a stand-in client that gives the "
        f"same partition ids and idle consumers instead of AMQP links. Only ownership is measured: no events on "
        f"either side. Same strategy ({args.strategy.upper()}) and interval I for both, each side with its own "
        f"SDK's ratio of expiration to interval: E = {EXPIRATION_RATIO:g}·I for ours (15 s / 75 s), "
        f"{OFFICIAL_EXPIRATION_RATIO:g}·I for the official (its 30 s / 180 s). Each side its own container on the "
        f"same Azurite; sides run one after the other (order alternating per size). Each side runs until it is "
        f"balanced or until every processor has made {args.cap_ticks:g} ticks (the cap), within the time budget "
        f"(`--budget-minutes {args.budget_minutes:g}`): a side is only started when the cap's {args.cap_ticks:g} "
        f"intervals fit in what is left of it, and one whose ticks overrun so much that the budget ends it first "
        f"says so. *Missed renewals*, the same rule for both sides, measured in each worker around the store's "
        f"`claim_ownership`: a partition the processor still dispatched more than E after the last write of its "
        f"ownership record that it sent and the store accepted (from then on another processor may take it). "
        f"*Self-fenced* (ours only): leases it gave up because no renewal succeeded in time, before they could "
        f"expire. *Overrun*: a tick longer than I (ours logs a WARNING; the official logs nothing, the worker "
        f"times its ticks).",
        "",
        "### Sizing: listing cost measured here, interval and expiration derived",
        "",
        "Rule (docs/concepts/timing.md, \"Sizing\"): c = CPU seconds of one listing of P records "
        "(client + Azurite), measured "
        f"here ({args.calibration_listings} listings, median); I = ⌈N·c / (f·C)⌉ (at least {args.min_interval:g} s) "
        f"with f = {args.cpu_budget:g} and C the cores the processors can count on: those the machine left idle "
        f"over {args.idle_sample:g} s just before (other users' work counts as busy), at least a quarter of its "
        f"{cores}; so the listings of all N processors use at most f of them. Ours also gets R = E/2 "
        f"(`ownership_renewal_age`): lease − R = 0.4·E is how long a processor can be kept from renewing (a "
        f"listing's XML parsing holds its event loop, up to N·c/C when all list at once) and still keep its "
        f"leases, and the store timeout T the processor derives from it exceeds that herd; the Blob store's own "
        f"`operation_timeout` is raised to T when T is longer than its 10 s default. The store is one more bound "
        f"(Azurite is one Node.js thread): with s its CPU seconds per listing and w per record written (both "
        f"measured here), I ≥ ⌈N·s/f⌉ keeps listings to f of that thread, and I ≥ ⌈1.5·B⌉ with "
        f"B = N·s + 2·P·w (every processor lists, a greedy start writes every claim and its checkpoint fence) lets "
        f"the start-up burst fit in T ≈ 0.67·I; I is the largest of the three. Before each side the benchmark waits "
        f"for Azurite to go idle, and each side's container is deleted after it. A side is held "
        f"R + E/10 once balanced (every lease of ours renewed once).",
        "",
        table(["P x N", "client ms/record", "Azurite ms/record", "c (s)", "listing wall (s)", "idle cores", "C",
               "I (s)", "E ours / official (s)", "listing load (cores)", "herd N·c/C (s)",
               "Azurite w (ms/record written)", "store load N·s/I", "burst B (s)", "I bound by",
               "ours: R / T / store operation_timeout (s)", "ours: lease − R (s)",
               f"cap: {args.cap_ticks:g} ticks at I (min)"],
              [[f"{size.partitions} x {size.processors}", f"{cal.client_ms_per_record:.3f}",
                number(cal.server_ms_per_record, ".3f"), f"{cal.cpu:.2f}", f"{cal.wall:.2f}",
                number(cal.idle_cores), f"{s.cores:g}", f"{s.interval:g}",
                f"{s.expiration:g} / {s.official_expiration:g}", f"{s.listing_load:.2f}", f"{s.herd:.1f}",
                number(None if cal.server_write_cpu is None else 1000 * cal.server_write_cpu, ".2f"),
                number(s.store_load, ".2f"), number(s.burst), s.bound_by,
                f"{s.renewal_age:g} / {s.store_timeout:.1f} / {s.operation_timeout:g}", f"{s.stall_room:.1f}",
                f"{cap_seconds(args, s) / 60:.1f}"]
               for size in results for cal, s in [(size.calibration, size.sizing)]],
              align="lrrrrrrrrrrrrrlrrr"),
    ]
    for size in results:
        if args.ours_timing == "defaults":
            ours = ours_at_defaults(size.sizing)
            timing = (f"official: I = {size.sizing.interval:g} s, E = {size.sizing.official_expiration:g} s; ours at "
                      f"EventProcessor's defaults: I = {ours.interval:g} s, E = {ours.expiration:g} s")
        else:
            timing = (f"I = {size.sizing.interval:g} s; E = {size.sizing.expiration:g} s ours, "
                      f"{size.sizing.official_expiration:g} s official")
        lines += ["", f"### {size.partitions} partitions x {size.processors} processors ({timing})", ""]
        if size.not_run:
            lines += [f"**Not run**: {size.not_run}."]
            continue
        if size.error:
            lines += [f"**Failed**: {size.error}", ""]
        for impl, why in size.skipped.items():
            lines += [f"**{impl} not run**: {why}.", ""]
        sides = [size.sides.get(impl) for impl in IMPLS]
        rows: list[list[str]] = []

        def row(label: str, value: Any, rows: list[list[str]] = rows, sides: list[Any] = sides) -> None:
            rows.append([label, *("-" if side is None else value(side) for side in sides)])

        row("seconds to balanced (from the common start)", _waited)
        row("ticks to balanced (busiest processor)",
            lambda r: str(r.ticks_to_balanced) if r.ticks_to_balanced is not None
            else f"not balanced after {r.ticks_waited[0]}-{r.ticks_waited[1]} per processor")
        row("missed renewals (same rule both sides; must be 0)", lambda r: str(r.counters.get("missed_renewals", 0)))
        row("leases given up before they could expire (ours: self-fenced)",
            lambda r: str(r.counters.get("self_fenced", 0)) if r.impl == "ours" else "no leases")
        row("every partition owned by exactly one live processor at the end",
            lambda r: ("yes" if r.every_partition_owned_once else "**no**") + f" ({r.final_owned}/{r.partitions})")
        row("partitions per processor at the end (min-max)", lambda r: f"{r.shares[0]}-{r.shares[1]}")
        row("overrun ticks / overrun WARNING lines",
            lambda r: f"{r.counters.get('overruns', 0)} / "
                      + (str(r.counters.get("overrun_warnings", 0)) if r.impl == "ours" else "none logged"))
        row("store calls timed out (ours: store_timeout)",
            lambda r: str(r.counters.get("store_timeouts", 0)) if r.impl == "ours" else "no timeout")
        row("ticks backed off for a saturated store / highest level (ours)",
            lambda r: f"{r.counters.get('backed_off', 0)} / {r.backoff_level}" if r.impl == "ours" else "no backoff")
        row("seconds Azurite needed to go idle before the side", lambda r: f"{r.drain_wait:.0f}")
        row("longest tick (s)", lambda r: f"{r.max_tick:.2f}")
        row("longest event-loop stall in a processor (s)", lambda r: f"{r.loop_lag:.2f}")
        row("ticks, all processors", lambda r: str(r.counters.get("ticks", 0)))
        row("renewals / failed renewals (same rule both sides)",
            lambda r: f"{r.counters.get('renewals', 0)} / {r.counters.get('failed_renewals', 0)}")
        row("claims won / partitions lost", lambda r: f"{r.counters.get('claims', 0)} / {r.counters.get('lost', 0)}")
        row("claims while held (after balanced)", lambda r: str(r.moved_while_held))
        row("ownership listings / handoffs to balanced, all processors (ours)",
            lambda r: "-" if r.listings_to_balanced is None else f"{r.listings_to_balanced} / {r.handoffs_to_balanced}")
        row("requests/s to balanced (all processors)", lambda r: f"{r.converge.requests_per_second:.0f}")
        row("requests/s while held (all processors)",
            lambda r: "-" if r.balanced_after is None else f"{r.hold.requests_per_second:.1f}")
        row("storage requests per hour per processor at rest (while held)",
            lambda r, n=size.processors: "-" if r.balanced_after is None
            else f"{r.hold.requests_per_second * 3600 / n:,.0f}")
        row("CPU per processor to balanced, mean (max), % of a core",
            lambda r: f"{_pct(r.converge.core_share()[0])} ({_pct(r.converge.core_share()[1])})")
        row("CPU per processor while held, mean (max), % of a core",
            lambda r: "-" if r.balanced_after is None
            else f"{_pct(r.hold.core_share()[0])} ({_pct(r.hold.core_share()[1])})")
        row("Azurite CPU to balanced / while held, % of a core",
            lambda r: f"{_pct(r.converge.azurite_share or float('nan'))} / "
                      f"{_pct(r.hold.azurite_share or float('nan')) if r.balanced_after is not None else '-'}")
        row("held for (s)", lambda r: "-" if r.balanced_after is None else f"{r.hold.seconds:.0f}")
        row("start-up imports of all workers (s, not measured above)", lambda r: f"{r.spawn_seconds:.1f}")
        row("other processes on the machine meanwhile (cores) / 1-min load average",
            lambda r: "n/a" if r.load is None else
            f"{number(r.load.other_cores, '.2f')} / {number(r.load.load_start)}/{number(r.load.load_end)}")
        lines.append(table(["", "ours", "official"], rows, align="lrr"))
        problems = [f"{side.impl}: {p}" for side in sides if side is not None for p in side.problems]
        if problems:
            lines += ["", "Problems found: " + "; ".join(problems)]
    lines += ["", *_verdict(results, args)]
    return "\n".join(lines) + "\n"


def _verdict(results: list[SizeResult], args: argparse.Namespace) -> list[str]:
    cores = os.cpu_count() or 1
    held, not_held, official = [], [], []
    for size in results:
        ours = size.sides.get("ours")
        label = f"{size.partitions} x {size.processors}"
        theirs = size.sides.get("official")
        if theirs is not None:
            official.append(f"{label}: " + (
                f"balanced after {theirs.balanced_after:.1f} s and {theirs.ticks_to_balanced} ticks"
                if theirs.balanced_after is not None else
                f"not balanced after {theirs.waited:.0f} s and {theirs.ticks_waited[0]}-{theirs.ticks_waited[1]} "
                f"ticks per processor ({'the cap' if theirs.ended_by == 'cap' else 'the time budget'} ended it)")
                + f", {theirs.counters.get('missed_renewals', 0)} missed renewals")
        elif "official" in size.skipped:
            official.append(f"{label}: not run ({size.skipped['official']})")
        if ours is not None and ours.balanced_after is not None and ours.every_partition_owned_once \
                and ours.counters.get("missed_renewals", 0) == 0:
            held.append(label)
            continue
        if size.not_run or "ours" in size.skipped:
            not_held.append(f"{label}: not run; {size.not_run or size.skipped['ours']}")
            continue
        if ours is None:
            not_held.append(f"{label}: ours did not run ({size.error})")
            continue
        idle = size.calibration.idle_cores
        balance = (f"balanced after {ours.balanced_after:.0f} s" if ours.balanced_after is not None
                   else f"not balanced within the limit ({ours.final_owned}/{ours.partitions} partitions owned once at "
                        f"the end)")
        not_held.append(
            f"{label}: ours {balance}; {ours.counters.get('missed_renewals', 0)} missed renewals; the longest "
            f"event-loop stall of a processor was {ours.loop_lag:.0f} s against {size.sizing.stall_room:.0f} s of "
            f"lease − R; {ours.counters.get('store_timeouts', 0)} store calls timed out; each processor got "
            f"{_pct(ours.converge.core_share()[0])} of a core on average ({size.processors} processes on {cores} "
            f"cores, with {'n/a' if idle is None else f'{idle:.1f}'} cores idle before the run)")
    not_held += getattr(args, "unmeasured", [])
    lines = ["**What this machine held** (ours balanced, 0 missed renewals, every partition owned once at the end): "
             + (", ".join(held) or "none") + "."]
    if not_held:
        lines += ["", "**Not held**, as measured above:", ""] + [f"- {line}." for line in not_held]
    if official:
        lines += ["", "**The official processor**, same interval, its own expiration ratio:", ""] + \
                 [f"- {line}." for line in official]
    return lines
