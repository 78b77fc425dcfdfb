"""Failover at equal cost: the settings each SDK can afford within the official processor's
storage requests per hour at its defaults, and how fast each fails over at them."""
from __future__ import annotations

import inspect
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eventprocessor import EventProcessor
from eventprocessor.testing import run_virtual
from harness.simulation import (
    official_requests_per_hour,
    ours_requests_per_hour,
    renewal_for,
    shared_candidates,
    shortest_within,
    simulation,
)

from .scenarios import GREEDY, OFFICIAL_DEFAULTS, TRAFFIC, WORK, orphans_of, steady, traffic_on, warm

if TYPE_CHECKING:
    from .plan import Plan

def processor_defaults() -> tuple[float, float]:
    """``EventProcessor``'s default load-balancing interval and expiration, read from its
    signature (the benchmark's "defaults" row is whatever the SDK ships)."""
    parameters = inspect.signature(EventProcessor.__init__).parameters
    return (float(parameters["load_balancing_interval"].default),
            float(parameters["partition_ownership_expiration_interval"].default))


@dataclass
class Setting:
    """One implementation at one timing: what it costs and how fast it fails over."""

    label: str
    implementation: str
    interval: float
    expiration: float
    renewal_age: float | None
    formula_per_hour: float
    measured_per_hour: float = 0.0
    resumed: list[float] = field(default_factory=list)  # crash to resumed, one per crash instant
    duplicates: list[int] = field(default_factory=list)

    @property
    def mean_resumed(self) -> float | None:
        return statistics.mean(self.resumed) if self.resumed else None


async def failover_at(setting: Setting, seed: int, partitions: int, instances: int, offset: float) -> tuple[float, int]:
    """Crash one of ``instances`` (GREEDY, jittered loops) ``offset`` seconds after the
    group settled; return (seconds from the crash to the last orphan's first batch at a
    survivor, duplicates)."""
    options = {} if setting.renewal_age is None else {"ownership_renewal_age": setting.renewal_age}
    async with simulation(setting.implementation, GREEDY, partitions, schedule="jittered", seed=seed,
                          interval=setting.interval, expiration=setting.expiration, traffic=TRAFFIC, work=WORK,
                          processor_options=options) as sim:
        await warm(sim, instances)
        await sim.run_until(sim.now + offset)
        await traffic_on(sim)
        await sim.run_to_mid_batch()
        victim = sim.alive[-1]
        orphans = orphans_of(sim, [victim.owner_id])
        crash_time = sim.now
        mark = sim.mark()
        await sim.crash(victim)
        await sim.run_until(crash_time + setting.expiration + 20 * setting.interval,
                            stop_when=lambda: sim.resumed_at(orphans, crash_time) is not None)
        resumed = sim.resumed_at(orphans, crash_time)
        if resumed is None:
            raise RuntimeError(f"{setting.label}: orphans {orphans} were never resumed")
        return resumed - crash_time, sim.result(mark).duplicates


WITHIN_BUDGET = 1.03
"""A setting's measured cost may exceed the budget by this much (noise: the official's own
defaults measure within a few tenths of a percent of their formula, candidates whose
formula cost is just under the budget measure up to 1-2 % over it)."""


def equal_cost(plan: Plan, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    """The budget is the official processor's storage requests per hour at its defaults
    (its formula; its measured cost is reported beside it). Both sides choose their
    settings from the same candidates within that budget, each by its own cost formula,
    and keep those whose measured cost is within it too (3 % of noise allowed); every
    setting kept is crashed at the same instants and each side's best (shortest mean
    crash-to-resumed) is reported, beside both defaults."""
    p, n = plan.equal_cost_size
    offsets = [(k + 0.5) * OFFICIAL_DEFAULTS[1] / plan.crash_instants for k in range(plan.crash_instants)]

    def measure_cost(setting: Setting) -> None:
        outcome = run_virtual(steady(setting.implementation, GREEDY, "jittered", seed, p, n, plan.cost_ticks,
                                     interval=setting.interval, expiration=setting.expiration,
                                     renewal_age=setting.renewal_age, label=setting.label))
        setting.measured_per_hour = outcome.extra["per_hour"]

    def measure_failover(setting: Setting) -> None:
        for offset in offsets:
            seconds, duplicates = run_virtual(failover_at(setting, seed, p, n, offset))
            setting.resumed.append(seconds)
            setting.duplicates.append(duplicates)

    started = time.perf_counter()
    official = Setting("official, defaults", "official", *OFFICIAL_DEFAULTS, None,
                       official_requests_per_hour(p, n, OFFICIAL_DEFAULTS[0]))
    default_interval, default_expiration = processor_defaults()
    defaults = Setting("this SDK, defaults", "ours", default_interval, default_expiration, None,
                       ours_requests_per_hour(p, n, default_interval, default_expiration))
    for setting in (official, defaults):
        measure_cost(setting)
    budget = official.formula_per_hour
    shared = shared_candidates(budget, p, n, plan.equal_cost_intervals, plan.renewal_rules)
    candidates = []
    for rule in plan.renewal_rules:
        def ours_cost(interval: float, expiration: float, rule: str = rule) -> float:
            return ours_requests_per_hour(p, n, interval, expiration, renewal_for(rule, expiration))

        for interval, expiration in shortest_within(ours_cost, budget, shared):
            if (interval, expiration) == (default_interval, default_expiration) and rule == "default":
                continue  # the defaults row already is this candidate
            renewal = renewal_for(rule, expiration)
            label = f"this SDK, I={interval:g} s E={expiration:g} s" + ("" if renewal is None else " R=E/2")
            candidates.append(Setting(label, "ours", interval, expiration, renewal,
                                      ours_cost(interval, expiration)))
    official_candidates = []
    for interval, expiration in shortest_within(lambda i, _e: official_requests_per_hour(p, n, i), budget, shared):
        if (interval, expiration) != OFFICIAL_DEFAULTS:
            official_candidates.append(Setting(f"official, I={interval:g} s E={expiration:g} s", "official",
                                               interval, expiration, None, official_requests_per_hour(p, n, interval)))
    for setting in candidates + official_candidates:
        measure_cost(setting)
    # Within the budget as measured, not only by the formula.
    matching = [c for c in candidates if c.measured_per_hour <= budget * WITHIN_BUDGET]
    official_matching = [c for c in official_candidates if c.measured_per_hour <= budget * WITHIN_BUDGET]
    for setting in [official, defaults] + matching + official_matching:
        measure_failover(setting)
    if defaults.measured_per_hour <= budget * WITHIN_BUDGET:
        matching.append(defaults)  # the defaults compete too when they fit the budget
    plain = [c for c in matching if c.renewal_age is None]
    chosen = min(plain, key=lambda c: c.mean_resumed or math.inf) if plain else None
    longer = [c for c in matching if c.renewal_age is not None]
    best_longer = min(longer, key=lambda c: c.mean_resumed or math.inf) if longer else None
    official_best = min([official] + official_matching, key=lambda c: c.mean_resumed or math.inf)
    say(f"  equal-cost failover ({len(offsets)} crash instants, {len(candidates)} + {len(official_candidates)} "
        f"candidates) {time.perf_counter() - started:6.1f} s")
    return {"official": official, "defaults": defaults, "candidates": candidates, "matching": matching,
            "official_candidates": official_candidates, "official_best": official_best, "shared": shared,
            "budget": budget, "chosen": chosen, "best_longer_renewal": best_longer, "size": (p, n),
            "offsets": offsets}
