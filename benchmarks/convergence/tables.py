"""The convergence benchmark's tables: this SDK beside the official processor, scenario by
scenario, and the equal-cost settings."""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from eventprocessor import Timing
from harness.simulation import PhaseResult

from ..toolkit.report import number, table
from .equal_cost import Setting
from .scenarios import Outcome


def _key(o: Outcome) -> tuple[str, str, str]:
    return (o.scenario, o.schedule, o.strategy.value)


def side_by_side(outcomes: Sequence[Outcome]) -> list[tuple[Outcome, Outcome]]:
    by: dict[tuple[str, str, str], dict[str, Outcome]] = {}
    order: list[tuple[str, str, str]] = []
    for o in outcomes:
        k = _key(o)
        if k not in by:
            by[k] = {}
            order.append(k)
        by[k][o.implementation] = o
    return [(by[k]["ours"], by[k]["official"]) for k in order if "ours" in by[k] and "official" in by[k]]


def ticks_text(p: PhaseResult) -> str:
    return "never" if p.ticks_to_balanced is None else str(p.ticks_to_balanced)


def or_never(value: float | None, fmt: str = ".1f") -> str:
    return number(value, fmt, missing="never")


def overlap_text(p: PhaseResult) -> str:
    return f"{p.overlap_seconds:.2f} ({p.max_deliverers})"


def duplicates_text(o: Outcome) -> str:
    """Duplicates, and events never delivered when there are any (a loss)."""
    lost = o.extra.get("undelivered", 0)
    return f"{o.phase.duplicates}" + (f" (**{lost} never delivered**)" if lost else "")


Column = tuple[str, Callable[[Outcome, Outcome], object]]
"""A column of a table that sets this SDK beside the official processor: its heading, and
its cell from the pair (ours, official) of one scenario."""


def _ours(name: str, value: Callable[[Outcome], object]) -> list[Column]:
    """A figure of this SDK alone: ``name: ours``."""
    return [(f"{name}: ours", lambda ours, _off: value(ours))]


def _both(name: str, value: Callable[[Outcome], object],
          reference: tuple[str, Callable[[Outcome], object]] | None = None) -> list[Column]:
    """A figure of both SDKs, ``name: ours | official``, after the reference they are measured
    against when there is one (``name: limit | ours | official``, taken from this SDK's run)."""
    if reference is None:
        return [(f"{name}: ours", lambda ours, _off: value(ours)), ("official", lambda _ours, off: value(off))]
    label, of = reference
    return [(f"{name}: {label}", lambda ours, _off: of(ours)), ("ours", lambda ours, _off: value(ours)),
            ("official", lambda _ours, off: value(off))]


def _scenario(*names: str) -> list[Column]:
    """The columns that name a scenario: ``Scenario`` and those of ``Schedule``, ``Strategy``."""
    cells = {"Schedule": lambda o: o.schedule, "Strategy": lambda o: o.strategy.value}
    return [("Scenario", lambda ours, _off: ours.scenario),
            *((name, lambda ours, _off, cell=cells[name]: cell(ours)) for name in names)]


def _compare(outcomes: Sequence[Outcome], columns: Sequence[Column]) -> str:
    """One row per scenario that ran on both SDKs."""
    return table([heading for heading, _cell in columns],
                 [[cell(ours, off) for _heading, cell in columns] for ours, off in side_by_side(outcomes)])


def rebalance_table(outcomes: Sequence[Outcome]) -> str:
    return _compare(outcomes, [
        ("Scenario", lambda ours, _off: f"{ours.scenario}{'' if ours.extra.get('traffic', True) else ' (no traffic)'}"),
        *_scenario("Schedule", "Strategy")[1:],
        *_both("Ticks", lambda o: ticks_text(o.phase), ("limit", lambda o: o.limit_ticks)),
        *_both("Moves", lambda o: o.phase.moves, ("min", lambda o: o.min_moves)),
        *_both("Steals", lambda o: o.phase.steals), *_ours("Handoffs", lambda o: o.phase.handoffs),
        *_both("412s", lambda o: o.phase.failed_claims), *_both("Requests", lambda o: o.phase.coordination_requests),
        *_both("Duplicate events", duplicates_text),
        *_both("Overlap s (max deliverers)", lambda o: overlap_text(o.phase))])


def failover_table(outcomes: Sequence[Outcome]) -> str:
    return _compare(outcomes, [
        *_scenario("Schedule", "Strategy"),
        ("Orphans / survivors", lambda ours, _off: f"{ours.extra['orphans']} / {ours.extra['survivors']}"),
        *_both("Ticks past record expiry", lambda o: or_never(o.extra["ticks_past_expiry"]),
               ("limit", lambda o: o.extra["forced_ticks"])),
        *_both("Crash to re-owned (s)", lambda o: or_never(o.extra["failover_s"], ".0f")),
        *_both("Crash to resumed (s)", lambda o: or_never(o.extra["resumed_s"])),
        *_both("Ticks to balanced", lambda o: ticks_text(o.phase), ("limit", lambda o: o.limit_ticks)),
        *_both("Moves", lambda o: o.phase.moves, ("min", lambda o: o.min_moves)),
        *_both("Steals", lambda o: o.phase.steals), *_both("Duplicate events", duplicates_text),
        *_both("Overlap s (max deliverers)", lambda o: overlap_text(o.phase))])


def rolling_table(outcomes: Sequence[Outcome]) -> str:
    return _compare(outcomes, [
        *_scenario("Schedule", "Strategy"), *_both("Duplicate events", duplicates_text),
        *_both("Longest pause of any partition (s)", lambda o: f"{o.extra['pause_max']:.1f}"),
        *_both("Median partition's longest pause (s)", lambda o: f"{o.extra['pause_median']:.1f}"),
        *_both("Steals", lambda o: o.phase.steals), *_ours("Handoffs", lambda o: o.phase.handoffs),
        *_both("Overlap s (max deliverers)", lambda o: overlap_text(o.phase))])


def standbys_table(outcomes: Sequence[Outcome]) -> str:
    return _compare(outcomes, [
        *_scenario("Schedule", "Strategy"), *_both("Standbys before the crash", lambda o: o.extra["standbys"]),
        *_both("Taken over by a standby", lambda o: "yes" if o.extra["by_standby"] else "no"),
        *_both("Orphan's record expired after the crash (s)", lambda o: f"{o.extra['expiry_s']:.1f}"),
        *_ours("Crashed member's record expired (s)", lambda o: or_never(o.extra["member_expiry_s"])),
        *_both("Crash to resumed (s)", lambda o: or_never(o.extra["resumed_s"])),
        *_both("Duplicate events", duplicates_text)])


def static_table(outcomes: Sequence[Outcome]) -> str:
    return table(["Scenario", "Schedule", "Cold start ticks", "Shares by ordinal",
                  "Orphans' records expired after the crash (s)", "Crashed member's record expired (s)",
                  "Crash to resumed (s)", "Claims of live records after the crash", "Duplicates after the crash",
                  "Return: ticks until its share is back", "Handoffs", "Steals", "Duplicate events"],
                 [[o.scenario, o.schedule, ticks_text(o.phase), "yes" if e["shares_ok"] else "no",
                   f"{e['expiry_s']:.1f}",
                   or_never(e["member_expiry_s"]), or_never(e["resumed_s"]), e["crash"].steals, e["crash"].duplicates,
                   ticks_text(e["return"]), e["return"].handoffs, e["return"].steals, e["return"].duplicates]
                  for o in outcomes for e in [o.extra]])


def balance_factor_table(outcomes: Sequence[Outcome]) -> str:
    return table(["Scenario", "Strategy", "Ticks", "Moves (minimum for a spread of 1)", "Handoffs", "Steals",
                  "Final partitions per instance", "Duplicate events"],
                 [[o.scenario, o.strategy.value, ticks_text(o.phase), f"{o.phase.moves} ({o.min_moves})",
                   o.phase.handoffs, o.phase.steals, ", ".join(map(str, o.extra["counts"])), duplicates_text(o)]
                  for o in outcomes])


def _requests_per_tick(p: PhaseResult) -> str:
    """Requests per instance-tick: lists / record rewrites / member writes."""
    return " / ".join(f"{sum(p.requests.get(kind, 0) for kind in kinds) / max(1, p.instance_ticks):.2f}"
                      for kinds in (("list_ownership", "list_members"), ("renew", "claim"), ("write_member",)))


def steady_table(outcomes: Sequence[Outcome]) -> str:
    def ratio(ours: Outcome, off: Outcome) -> str:
        return f"{ours.extra['per_hour'] / off.extra['per_hour'] if off.extra['per_hour'] else float('nan'):.2f}"

    return _compare(outcomes, [
        *_scenario("Schedule", "Strategy"), *_both("Ownership changes", lambda o: o.phase.owner_changes),
        *_both("Requests per instance-tick (lists / record rewrites / member writes)",
               lambda o: _requests_per_tick(o.phase)),
        *_both("Total requests", lambda o: o.phase.coordination_requests),
        *_both("Storage requests per hour", lambda o: f"{o.extra['per_hour']:.0f}"), ("ours / official", ratio)])


def skew_table(outcomes: Sequence[Outcome]) -> str:
    return _compare(outcomes, [
        *_scenario("Strategy"),
        *_both("Live partitions stolen by the skewed instance after cold start",
               lambda o: o.extra["steals_by_skewed"]),
        *_both("Duplicate events after cold start, before the crash", duplicates_text),
        *_both("Overlap s (max deliverers), same stretch", lambda o: overlap_text(o.phase)),
        *_both("Cold start ticks", lambda o: or_never(o.extra["cold_ticks"], "")),
        *_both("Failover ticks past expiry", lambda o: or_never(o.extra["ticks_past_expiry"])),
        *_both("Ownership changes, same stretch", lambda o: o.phase.owner_changes)])


def equal_cost_table(result: dict[str, Any]) -> str:
    official: Setting = result["official"]
    shown = [official, *result.get("official_candidates", []), result["defaults"], *result["candidates"]]
    base = official.mean_resumed
    budget = result.get("budget") or official.measured_per_hour
    rows = []
    for s in shown:
        renewal = s.renewal_age if s.renewal_age is not None else (
            Timing.default_renewal_age(s.expiration) if s.implementation == "ours" else s.interval)
        mark = " **(chosen: this SDK's best)**" if s is result["chosen"] else \
            " **(the official's best)**" if s is result.get("official_best") else \
            " (best with the renewal age at E/2)" if s is result.get("best_longer_renewal") else ""
        if not s.resumed:
            times = ["not run (over the budget)", "", "", "", ""]
        elif base:
            times = [f"{statistics.mean(s.resumed):.1f}", f"{min(s.resumed):.1f}", f"{max(s.resumed):.1f}",
                     f"{(s.mean_resumed or 0) / base:.2f}", f"{statistics.mean(s.duplicates):.1f}"]
        else:
            times = ["n/a", f"{statistics.mean(s.duplicates):.1f}"]
        rows.append([f"{s.label}{mark}", f"{s.interval:g} / {s.expiration:g} / {round(renewal, 1):g}",
                     f"{s.formula_per_hour:.0f}", f"{s.measured_per_hour:.0f}",
                     f"{s.measured_per_hour / budget:.2f}", *times])
    return table(["Implementation and settings", "Interval / expiration / renewal age (s)",
                  "Requests per hour: formula", "measured", "vs budget", "Crash to resumed (s): mean", "min", "max",
                  "mean vs official defaults", "Duplicate events per crash (mean)"], rows)


def equal_cost_summary(eq: dict[str, Any]) -> list[str]:
    """What the equal-cost measurements say, in sentences."""
    off, chosen, longer, defaults = eq["official"], eq["chosen"], eq.get("best_longer_renewal"), eq["defaults"]
    best = eq.get("official_best") or off
    if not off.mean_resumed:
        return []
    lines = []
    if chosen is not None and best.mean_resumed:
        lines.append(f"- Both sides at their best within the same budget ({eq.get('budget', 0):.0f} requests/hour): "
                     f"this SDK at interval {chosen.interval:g} s, expiration {chosen.expiration:g} s "
                     f"({chosen.label}) resumes after a crash in {chosen.mean_resumed:.1f} s on average; the "
                     f"official processor at interval {best.interval:g} s, expiration {best.expiration:g} s, "
                     f"renewing every record every tick ({best.label}), in {best.mean_resumed:.1f} s: "
                     f"{chosen.mean_resumed / best.mean_resumed:.2f}x.")
    if chosen is not None:
        lines.append(f"- Against the official processor at its defaults (interval {off.interval:g} s, expiration "
                     f"{off.expiration:g} s, {off.measured_per_hour:.0f} requests/hour measured): "
                     f"{chosen.mean_resumed:.1f} s vs {off.mean_resumed:.1f} s, "
                     f"{chosen.mean_resumed / off.mean_resumed:.2f}x "
                     f"({'meets' if chosen.mean_resumed <= off.mean_resumed / 2 else 'misses'} the target of "
                     "at most half).")
    if longer is not None and longer.mean_resumed:
        lines.append(f"- With the renewal age at E/2 within the same budget ({longer.label}), "
                     f"{longer.mean_resumed:.1f} s: {longer.mean_resumed / off.mean_resumed:.2f}x the official's "
                     "defaults.")
    if defaults.mean_resumed:
        lines.append(f"- This SDK's defaults ({defaults.interval:g} s / {defaults.expiration:g} s) cost "
                     f"{defaults.measured_per_hour / off.measured_per_hour:.2f}x the official's defaults' requests and "
                     f"resume in {defaults.mean_resumed:.1f} s ({defaults.mean_resumed / off.mean_resumed:.2f}x).")
    return lines
