"""Balancing load instead of counts with real processes: one partition at 10x
the others, then a processor slowed down; this SDK by count, this SDK by load, and
azure-eventhub's processor, side by side in one run.

Run it with ``python -m benchmarks.load`` (or ``eventprocessor bench load``); it needs
root (or another way to write the cgroup ``cpu`` controller): every processor is an OS
process (``python -m harness.worker``) capped at a quarter of a core by a
cgroup of its own, so that four processors that are each really CPU-bound fit on a
2-core machine, and a processor given more than its quota falls behind as a small VM
would. It starts its own Event Hubs emulator and Azurite on loopback; the official
producer sends the whole time.

The scenario, its sizes and what is measured are :mod:`harness.load_scenario`:
40 partitions over 4 processes, an ordinary partition at 2.5 events/s and the hot one at
25, each event costing its handler 5.5 ms of CPU; after the *skew* phase, one process
that does not deliver the hot partition gets three times the CPU per event (*slowed*).
Why those sizes: the hot partition (55 % of a process's quota) must fit below one
process's fair share (67 %), or no assignment is balanced and the benchmark only shows
that (with 24 partitions at 5 events/s the hot one alone filled its process); and the
hot partition's owner under count balance (10 partitions, 105 % of its quota before the
SDK's own work) must fall behind, or count balance would look as good.
Utilisation is each process's own CPU time over its quota; lag is the hub's last
enqueued sequence numbers against what the handlers received; duplicates and losses
come from the handlers' batch lines. The sides run one after the other (their order
alternates per round), each on its own hub and container.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from eventprocessor.cli.user_errors import CommandError
from harness.load_scenario import (
    LAG_EVERY,
    SIDES,
    LoadGroup,
    LoadOutcome,
    Skew,
    run_skewed,
)

from .toolkit import program, services
from .toolkit.machine import LoadReading, LoadWindow
from .toolkit.report import busy_flag, number, plots_dir, table, value_range

__all__ = ["main", "render"]

LABELS = {"count": "ours, by count", "load": "ours, by load", "official": "official"}


def _ints(values: Sequence[int | None]) -> str:
    return ", ".join("n/a" if v is None else str(v) for v in values)


def render(outcomes: list[LoadOutcome], rounds: int, head: str, loads: list[LoadReading], plot: str | None) -> str:
    """The section: ``head`` (the line under the title, :meth:`~benchmarks.toolkit.program.Run.header`),
    the machine's load while each side ran (``loads``, in the order of ``outcomes``), the table."""
    skew = outcomes[0].skew
    policy = skew.load_policy()
    by_side = {side: [o for o in outcomes if o.side == side] for side in SIDES}
    unit = skew.unit()
    lines = [
        "## Balancing load instead of counts with real processes (`load`)",
        "",
        head + " While each side ran: " + "; ".join(
            f"{o.side} (round {i // len(SIDES) + 1}): other processes {number(r.other_cores, '.2f')} cores, "
            f"1-minute load average {number(r.load_start)}/{number(r.load_end)} at start/end"
            for i, (o, r) in enumerate(zip(outcomes, loads, strict=False))) + ".",
        "",
        *busy_flag(loads, "the figures of the flagged sides (other work took CPU the capped processes were owed)"),
        (f"One Event Hubs emulator and one Azurite on 127.0.0.1, started by the benchmark. {skew.processes} processes "
        f"per side (`python -m harness.worker`), each in a cgroup of its own capped at "
        f"{skew.cores:g} of a core (CFS quota: a small VM), on {skew.partitions} partitions. The official producer "
        f"sends {skew.rate:g} events/s to every partition and {skew.hot_factor}x that to partition {skew.hot} "
        f"({skew.total_rate:g} events/s in all, every {skew.period:g} s). Each handler spends "
        f"{skew.cpu_per_event * 1000:g} ms of CPU per event (a busy loop on its thread's CPU clock), so an "
        f"ordinary partition needs {unit:.0%} of a process's quota and the hot one {unit * skew.hot_factor:.0%}, "
        f"below the fair share of a process ({skew.fair_share():.0%}: all the partitions' needs over the "
        f"processes), so that an assignment within the threshold exists, while under count balance the hot "
        f"partition's owner needs {skew.count_hot_owner():.0%} of its quota before the SDK's own work and falls "
        f"behind (with 24 partitions at 5 events/s the hot partition alone filled its process, and no plan could "
        f"balance the group). "
        f"Phase *skew* runs {skew.skew_seconds:g} s from the moment every partition is delivered by one process; "
        f"then one process not delivering the hot partition is slowed down ({skew.slow_factor:g}x the CPU per event) "
        f"and phase *slowed* runs {skew.slow_seconds:g} s. Then the producer stops and each side gets "
        f"{skew.drain_seconds:g} s to deliver everything."),
        "",
        f"*ours, by count*: `EventProcessor` (GREEDY, no `load_policy`: by count, its default) + `EventHubSource` "
        f"+ our `BlobCheckpointStore`. *ours, by load*: the same with `load_policy=LoadPolicy("
        f"threshold={policy.threshold:g}, damping={policy.damping:g}, max_moves={policy.max_moves}, "
        f"cooldown={policy.cooldown:g}, floor={policy.floor:g})`"
        + (" (its defaults)" if not skew.policy else
           f" (its defaults but {', '.join(f'{k}={v:g}' for k, v in skew.policy)}: the partitions are all claimed "
           f"at the start and none moves before its cool-down has passed, and the default 300 s would not fit "
           f"a run of minutes)") + ". *official*: azure-eventhub's "
        f"`EventHubConsumerClient.receive_batch` + `azure-eventhub-checkpointstoreblob-aio`, GREEDY, at its best "
        f"for this scenario: it balances partition counts only (no setting weighs load), so the same interval and "
        f"expiration as ours, which settle it fastest. All: load-balancing interval {skew.interval:g} s, ownership "
        f"expiration {skew.expiry:g} s, batch {skew.batch}, prefetch {skew.prefetch}, a checkpoint every "
        f"{skew.checkpoint_events} events of a partition.",
        "",
        (f"*Utilisation*: each process's own CPU time (its stats lines, `time.process_time()`) over wall time and its "
        f"quota, over the last {skew.window:g} s of a phase; *max/mean* across the {skew.processes} processes "
        f"(threshold {1 + policy.threshold:g}). *Lag*: every {LAG_EVERY:g} s, the hub's last enqueued sequence "
        f"number of every partition (a management call to the emulator) minus the newest one any handler received, "
        f"added up over the partitions; *growth* is its least-squares slope over the last {skew.window:g} s "
        f"(events/s). *Moves*: changes of the process delivering a partition. *Duplicates* and *lost*: from the "
        f"handlers' batch lines. Ranges over {rounds} round(s)."),
        "",
    ]
    ran = [side for side in SIDES if by_side[side]]
    rows: list[list[str]] = []

    def row(label: str, cell: Callable[..., str]) -> None:
        rows.append([label, *(cell(by_side[side]) for side in ran)])

    for index, name in enumerate(("skew", "slowed")):
        row(f"{name}: max/mean utilisation",
            lambda runs, index=index: value_range([o.phases[index].ratio for o in runs], ".2f"))
        row(f"{name}: utilisation per process (last round)",
            lambda runs, index=index: " / ".join(f"{u:.2f}" for u in runs[-1].phases[index].utilisation))
        row(f"{name}: partitions per process at the end (last round)",
            lambda runs, index=index: " / ".join(str(n) for n in runs[-1].phases[index].partitions)
            + f" (hot on {runs[-1].phases[index].hot_owner})")
        row(f"{name}: total lag at the end, events",
            lambda runs, index=index: _ints([o.phases[index].lag_end for o in runs]))
        row(f"{name}: lag growth, events/s",
            lambda runs, index=index: value_range([o.phases[index].lag_growth for o in runs], "+.1f"))
        row(f"{name}: moves", lambda runs, index=index: _ints([o.phases[index].moves for o in runs]))
    row("moves back within the cool-down (oscillation)", lambda runs: _ints([o.quick_returns for o in runs]))
    row(f"partitions moved again within the cool-down ({policy.cooldown:g} s; by load: 0 allowed)",
        lambda runs: _ints([o.moved_within_cooldown for o in runs]))
    row(f"most partitions handed over by one process within one interval ({skew.interval:g} s; as the process "
        f"logged it; by load: {policy.max_moves} allowed)",
        lambda runs: "n/a" if runs[0].burst_handed is None else _ints([o.burst_handed for o in runs]))
    row(f"most moves out of one process within one interval ({skew.interval:g} s), timed at the new owner's first "
        f"batch", lambda runs: _ints([o.burst for o in runs]))
    row("drained after the producer stopped, s",
        lambda runs: ", ".join("no" if o.drained_after is None else f"{o.drained_after:.0f}" for o in runs))
    row("duplicates", lambda runs: _ints([o.duplicates for o in runs]))
    row("lost", lambda runs: _ints([o.lost for o in runs]))
    row("checkpoints that timed out (ours: left to the next one)",
        lambda runs: "n/a" if runs[0].side == "official" else _ints([o.checkpoint_timeouts for o in runs]))
    row("events produced", lambda runs: _ints([o.produced for o in runs]))
    lines.append(table(["", *(LABELS[side] for side in ran)], rows, align="l" + "r" * len(ran)))
    lines += ["", ("How this SDK's processors moved partitions (ownership changes they logged, from the start of "
                   "phase *skew*, all rounds; the official processor does not say):"), ""]
    for side in ("count", "load"):
        totals: dict[str, int] = {}
        for o in by_side[side]:
            for reason, n in o.changes.items():
                totals[reason] = totals.get(reason, 0) + n
        if by_side[side]:
            lines.append(f"- {LABELS[side]}: " + (", ".join(f"{k} {v}" for k, v in sorted(totals.items()))
                                                  or "none"))
    if plot:
        lines += ["", f"![Total lag and max/mean utilisation over time]({plot})"]
    lines += ["", (f"What the machine could not hold: {skew.processes} processes at full CPU each (it has 2 cores), "
                   f"so each is capped at {skew.cores:g} of a core; the group needs at most "
                   f"{skew.processes * skew.cores:g} core for its handlers and clients, the emulator, Azurite and the "
                   f"producer use the rest. A busier machine (other work) takes CPU the capped processes were owed: "
                   f"their lag grows then, whichever side runs.")]
    return "\n".join(lines)


def plot_series(outcomes: list[LoadOutcome], path: str) -> str | None:
    """Total lag and max/mean utilisation over time, one line per side (last round)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the benchmark deps
        return None
    last = {o.side: o for o in outcomes}
    fig, (lag_ax, ratio_ax) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for side, o in last.items():
        lag_ax.plot([t for t, _ in o.lag_series], [v for _, v in o.lag_series], label=LABELS[side], linewidth=1)
        ratio_ax.plot([t for t, _ in o.ratio_series], [v for _, v in o.ratio_series], label=LABELS[side],
                      linewidth=1)
    some = next(iter(last.values()))
    for ax in (lag_ax, ratio_ax):
        for start in some.phase_starts[1:]:
            ax.axvline(start, color="grey", linestyle="--", linewidth=1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    policy = some.skew.load_policy()
    ratio_ax.axhline(1 + policy.threshold, color="black", linestyle=":", linewidth=1)
    lag_ax.set_ylabel("total lag (events)")
    ratio_ax.set_ylabel("max / mean utilisation")
    ratio_ax.set_xlabel("seconds since every partition was delivered (dashed: one process slowed down)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


async def _measure(args: argparse.Namespace, skew: Skew, hub_conn: str, storage_conn: str, log_dir: str,
                   loads: list[LoadReading]) -> list[LoadOutcome]:
    from harness.cpu_quota import CpuQuotas

    outcomes = []
    quotas = CpuQuotas(skew.cores)
    try:
        for r in range(args.rounds):
            for side in (args.sides if r % 2 == 0 else args.sides[::-1]):
                window = LoadWindow()
                group = LoadGroup(side, hub=f"load-{side}-{r}", skew=skew, hub_connection_string=hub_conn,
                                  storage_connection_string=storage_conn, log_dir=log_dir, quotas=quotas)
                try:
                    outcome = await run_skewed(group)
                finally:
                    await group.close()
                loads.append(window.reading())
                print(outcome.summary(), file=sys.stderr)
                Path(group.log_dir, "outcome.json").write_text(json.dumps(outcome.to_json()))
                outcomes.append(outcome)
    finally:
        kept = quotas.remove()
        if kept:
            print(f"load: cgroups still in use, not removed: {kept} under {quotas.parent}", file=sys.stderr)
    return outcomes


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the scenario for every side and print the table; ``--record`` writes it.

    Example::

        python -m benchmarks.load --record
    """
    parser = program.parser("load", __doc__, prog)
    parser.add_argument("--rounds", type=program.at_least_one, default=1,
                        help="Rounds of the scenario per side. [default: %(default)s]")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                        help="The sides to run (a subset is never recorded). [default: count load official]")
    parser.add_argument("--skew-seconds", type=float, help="Length of the skew phase (a shorter run is never "
                                                           "recorded).")
    parser.add_argument("--slow-seconds", type=float, help="Length of the slowed phase (never recorded).")
    parser.add_argument("--quick", action="store_true",
                        help="A smoke run: phases of 20 s, 60 s to drain (never recorded).")
    parser.add_argument("--log-dir", help="Keep every worker's log and each side's timeline here. "
                                          "[default: a temporary directory, removed]")

    def body(args: argparse.Namespace, run: program.Run) -> int:
        partial = args.sides != list(SIDES) or args.skew_seconds is not None or args.slow_seconds is not None \
            or args.quick
        if args.record and partial:
            parser.error("partial runs (--quick, --sides, --skew-seconds, --slow-seconds) are never recorded")
        from harness.cpu_quota import unavailable

        why = unavailable()
        if why is not None:
            raise CommandError(f"this benchmark caps each process at a CPU quota and cannot here: {why}")
        skew = Skew()
        if args.quick:
            skew = replace(skew, skew_seconds=20.0, slow_seconds=20.0, window=15.0, drain_seconds=60.0)
        if args.skew_seconds is not None or args.slow_seconds is not None:
            skew = replace(skew, skew_seconds=args.skew_seconds or skew.skew_seconds,
                           slow_seconds=args.slow_seconds or skew.slow_seconds,
                           window=min(skew.window, args.skew_seconds or skew.window,
                                      args.slow_seconds or skew.window))
        return _run(args, skew, run)

    return program.run("load", parser, body, argv)


def _run(args: argparse.Namespace, skew: Skew, run: program.Run) -> int:
    loads: list[LoadReading] = []
    hubs = {f"load-{side}-{r}": skew.partitions for side in SIDES for r in range(args.rounds)}
    with services.logs("load", args.log_dir) as log_dir, \
            services.azurite_and_emulator(hubs=hubs) as (emulator, azurite):
        outcomes = asyncio.run(_measure(args, skew, emulator.connection_string, azurite.connection_string, log_dir,
                                        loads))
    plot = None
    if args.record:
        plots_dir().mkdir(parents=True, exist_ok=True)
        if plot_series(outcomes, str(plots_dir() / "load.png")):
            plot = "results/load.png"
    run.report(render(outcomes, args.rounds, run.header(flag_busy=False), loads, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
