"""What a run of the convergence benchmark measures (:data:`FULL`, :data:`QUICK`), and
running it (:func:`run_all`)."""
from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eventprocessor.testing import run_virtual
from harness.simulation import RENEWAL_RULES

from .equal_cost import equal_cost
from .scenarios import (
    BUSY_WORK,
    IMPLEMENTATIONS,
    INTERVAL,
    SCHEDULES,
    STRATEGIES,
    Outcome,
    balance_factor,
    cold_start,
    crash,
    growth,
    rolling_restart,
    scale_in,
    scale_out,
    skewed,
    standbys,
    static_assignment,
    steady,
)


@dataclass
class Plan:
    cold_sizes: Sequence[tuple[int, int]]
    scale_out: Sequence[tuple[int, int, int]]
    scale_in: Sequence[tuple[int, int, int]]
    crashes: Sequence[tuple[int, int, int]]
    growth: Sequence[tuple[int, int, int]]
    rolling: Sequence[tuple[int, int]]
    busy_scale_out: Sequence[tuple[int, int, int]]
    standbys: Sequence[tuple[int, int]]
    static: Sequence[tuple[int, int, int]]
    balance_factors: Sequence[int]
    steady_ticks: int
    skew_ticks: int
    balance_factor_size: tuple[int, int, int] = (32, 4, 1)
    steady_size: tuple[int, int] = (32, 4)
    skew_size: tuple[int, int] = (32, 4)
    equal_cost_size: tuple[int, int] = (32, 4)
    equal_cost_intervals: Sequence[float] = (10.0, 15.0, 20.0, 25.0, 30.0)
    renewal_rules: Sequence[str] = RENEWAL_RULES
    crash_instants: int = 6
    cost_ticks: int = 300
    schedules: Sequence[str] = SCHEDULES
    traffic_limit: int = 128  # larger cold starts run without traffic


FULL = Plan(
    cold_sizes=[(32, 4), (128, 8), (100, 10), (1024, 64)],
    scale_out=[(32, 4, 1), (32, 4, 4), (128, 8, 1), (128, 8, 8)],
    busy_scale_out=[(32, 4, 4)],
    scale_in=[(32, 5, 1), (128, 8, 4)],
    crashes=[(32, 4, 1), (32, 8, 4), (128, 8, 4)],
    growth=[(20, 4, 5)],
    rolling=[(32, 4)],
    standbys=[(4, 8)],
    static=[(32, 4, 2)],
    balance_factors=[1, 2, 3],
    steady_ticks=1000,
    skew_ticks=20,
)
# Small sizes, but the steady-state cost and the equal-cost failover at the full run's
# P=32, N=4: their targets depend on the size. The steady request ratio follows
# N/I + P/R + 4N/E against (N + P)/I, above one half at P/N = 4 by the formula itself, and
# a mean crash-to-resumed time of one crash instant is one sample. At P=12, N=3 and one
# instant, a quick run missed three targets the full run meets.
QUICK = Plan(
    cold_sizes=[(12, 3)],
    scale_out=[(12, 3, 1)],
    busy_scale_out=[(12, 3, 1)],
    scale_in=[(12, 4, 1)],
    crashes=[(12, 3, 1)],
    growth=[(6, 2, 2)],
    rolling=[(6, 2)],
    standbys=[(2, 4)],
    static=[(8, 4, 2)],
    balance_factors=[1, 3],
    steady_ticks=30,
    skew_ticks=2,
    balance_factor_size=(9, 2, 1),
    steady_size=(32, 4),
    skew_size=(12, 3),
    equal_cost_size=(32, 4),
    equal_cost_intervals=(30.0,),
    renewal_rules=("default",),
    crash_instants=3,
    cost_ticks=30,
    schedules=("staggered",),
)


def run_all(plan: Plan, seed: int = 1, progress: bool = True) -> dict[str, Any]:
    """Run every scenario of ``plan``, each on a fresh virtual loop
    (:func:`eventprocessor.testing.run_virtual`); returns outcomes grouped by section."""
    sections: dict[str, Any] = {"rebalance": [], "failover": [], "rolling": [], "standbys": [], "static": [],
                                "balance_factor": [], "steady": [], "skew": []}

    def say(text: str) -> None:
        if progress:
            print(text, file=sys.stderr, flush=True)

    def done(section: str, outcome: Outcome, started: float) -> None:
        sections[section].append(outcome)
        say(f"  {outcome.scenario[:60]:<60} {outcome.schedule:<9} {outcome.strategy.value:<8} "
            f"{outcome.implementation:<8} {time.perf_counter() - started:6.1f} s")

    def each(section: str, make: Any, *, schedules: Sequence[str] | None = None) -> None:
        for schedule in schedules or plan.schedules:
            for strategy in STRATEGIES:
                for impl in IMPLEMENTATIONS:
                    started = time.perf_counter()
                    done(section, run_virtual(make(impl, strategy, schedule)), started)

    for p, n in plan.cold_sizes:
        traffic = p <= plan.traffic_limit
        each("rebalance", lambda i, s, sc, p=p, n=n, t=traffic: cold_start(i, s, sc, seed, p, n, traffic=t))
    for p, n, k in plan.scale_out:
        each("rebalance", lambda i, s, sc, p=p, n=n, k=k: scale_out(i, s, sc, seed, p, n, k))
    for p, n, k in plan.busy_scale_out:
        each("rebalance", lambda i, s, sc, p=p, n=n, k=k: scale_out(i, s, sc, seed, p, n, k, work=BUSY_WORK))
    for p, n, k in plan.scale_in:
        each("rebalance", lambda i, s, sc, p=p, n=n, k=k: scale_in(i, s, sc, seed, p, n, k))
    for p, n, k in plan.growth:
        each("rebalance", lambda i, s, sc, p=p, n=n, k=k: growth(i, s, sc, seed, p, n, k))
    for p, n, k in plan.crashes:
        each("failover", lambda i, s, sc, p=p, n=n, k=k: crash(i, s, sc, seed, p, n, k))
    for p, n in plan.rolling:
        each("rolling", lambda i, s, sc, p=p, n=n: rolling_restart(i, s, sc, seed, p, n))
    for p, n in plan.standbys:
        each("standbys", lambda i, s, sc, p=p, n=n: standbys(i, s, sc, seed, p, n))
    for p, replicas, ordinal in plan.static:
        for schedule in plan.schedules:
            started = time.perf_counter()
            done("static", run_virtual(static_assignment(schedule, seed, p, replicas, ordinal)), started)
    bp, bn, bk = plan.balance_factor_size
    for strategy in STRATEGIES:
        for factor in plan.balance_factors:
            started = time.perf_counter()
            done("balance_factor", run_virtual(balance_factor(strategy, "staggered", seed, factor, bp, bn, bk)),
                 started)
    t, (sp, sn) = plan.steady_ticks, plan.steady_size
    each("steady", lambda i, s, sc: steady(i, s, sc, seed, sp, sn, t, label=f"steady {t} ticks P={sp} N={sn}"))
    each("steady", lambda i, s, sc: steady(i, s, sc, seed, sp, sn, t, latency=INTERVAL / 2, jitter=0.2,
                                           label=f"steady {t} ticks P={sp} N={sn}, latency<=I/2, jitter 20%"),
         schedules=("staggered",))
    kp, kn = plan.skew_size
    each("skew", lambda i, s, sc: skewed(i, s, sc, seed, kp, kn, 300.0, plan.skew_ticks), schedules=("staggered",))
    sections["equal_cost"] = equal_cost(plan, seed, say)
    return sections
