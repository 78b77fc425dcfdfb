"""Rebalance convergence benchmark: this SDK's EventProcessor beside azure-eventhub's own
processor, under one virtual clock, with events flowing.

Every scenario runs four ways (this SDK and the official processor, each in BALANCED and
GREEDY mode) with the same seed, the same store semantics, the same request accounting
and the same traffic (:mod:`harness.simulation`). Duplicates, overlaps, pauses and
failover times are measured from the batches the handlers were actually given. Results
go to stdout and, with ``--record``, to this benchmark's section of
``benchmarks/RESULTS.md`` and, as PNG plots, to ``benchmarks/results/``.

Run::

    python -m benchmarks.convergence --record   # full run (a few minutes), written to RESULTS.md
    python -m benchmarks.convergence --quick    # small sizes only, seconds; printed, never recorded

(or ``eventprocessor bench convergence ...`` from any directory). The simulator's own
checks are ``tests/test_convergence_sim.py``.
"""
from __future__ import annotations

import argparse
import logging
import sys

from eventprocessor.cli.user_errors import require

from ..toolkit import program
from .plan import FULL, QUICK, Plan, run_all
from .report import check_targets, plot, render
from .scenarios import Outcome

__all__ = ["FULL", "QUICK", "Outcome", "Plan", "main", "run_all"]


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark and print the tables; with ``--record``, also write RESULTS.md and
    the plots. Example::

        python -m benchmarks.convergence --quick
    """
    parser = program.parser("convergence", __doc__, prog)
    parser.add_argument("--quick", action="store_true",
                        help="Small sizes only (seconds, for smoke tests; never recorded).")
    parser.add_argument("--seed", type=int, default=1,
                        help="Seed of the simulations' random choices (tick jitter, schedules). "
                             "[default: %(default)s]")

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.record and args.quick:
            parser.error("--record needs a full run: --quick results are partial and never recorded")
        require(purpose="the convergence benchmark (it runs azure-eventhub's own load balancer beside this SDK's)",
                extras=["eventhub"])
        return _run(args, run)

    return program.run("convergence", parser, body, argv)


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.ERROR)
    plan = QUICK if args.quick else FULL
    sections = run_all(plan, seed=args.seed)
    plots: list[str] = []
    if args.record:
        big_cold = f"cold start P={plan.cold_sizes[-1][0]} N={plan.cold_sizes[-1][1]}"
        cold = next((f"cold start P={p} N={n}" for p, n in plan.cold_sizes if (p, n) == (128, 8)), big_cold)
        doubling = next((s for s in (f"scale out P={p} N={n}->{n + k}" for p, n, k in plan.scale_out if k == n)), None)
        half = next((f"crash P={p} N={n}, {k} crash" for p, n, k in plan.crashes if 2 * k == n), None)
        for scenario, name in ((cold, "convergence_cold_start.png"), (doubling, "convergence_scale_out.png"),
                               (half, "convergence_crash.png")):
            if scenario is None:
                continue
            made = plot(sections["failover"] + sections["rebalance"], scenario, name)
            if made:
                plots.append(made)
    # Virtual time: the figures do not depend on how busy the machine was.
    run.report(render(sections, run.header(flag_busy=False), plots))
    missed = [name for name, ok, _e in check_targets(sections) if not ok]
    if missed:
        print(f"\n{len(missed)} target(s) missed (see the table)", file=sys.stderr)
        if args.quick:
            print("This was a --quick run: smaller sizes, fewer ticks, crash instants and candidate settings than the "
                  "full run that RESULTS.md and the docs report (`eventprocessor bench convergence`, about a "
                  "minute). A target missed here and met there depends on the size; one missed there too is a "
                  "regression.", file=sys.stderr)
    return 0
