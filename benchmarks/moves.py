"""Planned moves and crashes with real processes over AMQP: duplicates, losses and pauses,
this SDK against azure-eventhub's processor.

Run it with ``python -m benchmarks.moves`` (or ``eventprocessor bench moves``). It starts
its own Event Hubs emulator and Azurite on loopback. Every processor is an OS process
(``python -m harness.worker``): *ours* is ``EventProcessor`` +
``EventHubSource`` + this SDK's ``BlobCheckpointStore``; *official* is
``EventHubConsumerClient.receive_batch`` + ``azure-eventhub-checkpointstoreblob-aio`` as
documented, and *official, checkpoint on close* the same with a handler that also
checkpoints a partition's last delivered event in ``on_partition_close`` (as a careful
user would). All get the same intervals, batch size, checkpoint cadence and
handler time, and each its own best prefetch (``PREFETCH``). The parent produces a steady stream with
the official producer the whole time (``BATCH`` events to every partition every
``PERIOD`` seconds) and, per scenario:

* ``scale``: 2 processes on 8 partitions, then 4, then 2 again (the 2 added ones are
  stopped with SIGTERM, a graceful stop);
* ``rolling``: 4 processes on 8 partitions, each stopped (SIGTERM) and started again
  under the same name in turn, waiting for the group to settle after each step;
* ``standby``: 8 processes on 4 partitions (4 owners, 4 standbys); the owner of one
  partition is SIGKILLed and a standby takes it over.

Duplicates and losses come from what the handlers received: each worker prints a line per
delivered batch before it checkpoints. A *pause* is the time from the last batch one
process delivered of a partition to the first batch the next process delivered of it
(events arrive every ``PERIOD``, which bounds how finely a pause is seen).

The scenarios and the process group are :mod:`harness.move_scenarios` and :mod:`harness.group`;
``tests/test_handoff_processes.py`` runs them for this SDK on the test session's
emulator and Azurite and asserts 0 duplicates and 0 lost on planned moves.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter

from eventprocessor.cli.user_errors import CommandError
from harness.group import (
    BATCH,
    CHECKPOINT_EVERY,
    CLAIM_BOUND,
    EXPIRY,
    INTERVAL,
    PERIOD,
    TAKEOVER_BOUND,
    WORK,
    Group,
    Outcome,
)
from harness.move_scenarios import SCENARIOS

from .toolkit import program, services
from .toolkit.report import median, table

__all__ = ["main", "render"]

IMPLS = ("ours", "official", "official-close")
"""The sides: this SDK, the official processor as documented, and the official processor
whose handler also checkpoints in ``on_partition_close`` (as a careful user would)."""


PREFETCH = {"ours": 3000, "official": 3000}
"""Each side's prefetch: the value the e2e benchmark's sweep (100/300/1000/3000) chose for
it in its recorded run (``python -m benchmarks.e2e --record``); ``--prefetch-ours`` and
``--prefetch-official`` change them."""


def _group(impl: str, prefetch: dict[str, int], **kwargs: object) -> Group:
    side = "ours" if impl == "ours" else "official"
    options = ["--prefetch", str(prefetch[side])]  # after the group's own options: the last one counts
    if impl == "official-close":
        return Group(impl="official", checkpoint_on_close=True, worker_options=options, **kwargs)  # type: ignore[arg-type]
    return Group(impl=impl, worker_options=options, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- the benchmark

def _fmt(values: dict[str, float]) -> str:
    return "{" + ", ".join(f"{pid}: {seconds:.2f}" for pid, seconds in
                           sorted(values.items(), key=lambda kv: int(kv[0]))) + "}"


def _median_max(pauses: list[dict[str, float]]) -> str:
    """``median / max`` of the partitions' pauses (s) of every round, those that paused at all."""
    moved = [seconds for per_partition in pauses for seconds in per_partition.values() if seconds > 0]
    return f"{median(moved):.2f} / {max(moved, default=0):.2f}"


def render(outcomes: list[Outcome], rounds: int, head: str, prefetch: dict[str, int] | None = None) -> str:
    """The section: ``head`` (the line under the title, :meth:`~benchmarks.toolkit.program.Run.header`),
    then the tables."""
    by = {(o.scenario, o.impl): [x for x in outcomes if (x.scenario, x.impl) == (o.scenario, o.impl)]
          for o in outcomes}
    lines = [
        "## Planned moves and crashes with real processes (`moves`)",
        "",
        head,
        "",
        f"One Event Hubs emulator and one Azurite on 127.0.0.1, started by the benchmark; every processor is an OS "
        f"process (`python -m harness.worker`). *ours*: `EventProcessor` + `EventHubSource` + "
        f"our `BlobCheckpointStore`. *official*: `EventHubConsumerClient.receive_batch` + "
        f"`azure-eventhub-checkpointstoreblob-aio`, as documented (no `on_partition_close`). *official, checkpoint "
        f"on close*: the same, and its `on_partition_close` checkpoints the partition's last delivered event (what a "
        f"careful user of the official client would add; this SDK does it on release by itself). All: GREEDY, "
        f"load-balancing interval {INTERVAL:g} s, ownership "
        f"expiration {EXPIRY:g} s, batch 100, a checkpoint every {CHECKPOINT_EVERY} batches, "
        f"{WORK * 1000:.0f} ms in the handler per batch; prefetch "
        + ", ".join(f"{side} {n}" for side, n in sorted((prefetch or PREFETCH).items()))
        + f" (each side at the prefetch the e2e benchmark's sweep chose for it). The producer sends {BATCH} events "
        f"to every partition every "
        f"{PERIOD:g} s. A graceful stop is SIGTERM, a crash SIGKILL. Duplicates and losses are counted from what the "
        f"handlers received (a line per batch, printed before its checkpoint). A *pause* runs from the last batch "
        f"one process delivered of a partition to the first batch the next process delivered of it. {rounds} "
        f"round(s) per side.",
        "",
        table(["scenario", "", "duplicates (per round)", "lost", "moves",
               "longest pause of a partition, s (median / max)", "pauses of a partition added up, s (median / max)"],
              [[scenario, impl, ", ".join(str(o.duplicates) for o in runs), sum(o.lost for o in runs),
                ", ".join(str(o.moves) for o in runs), _median_max([o.longest for o in runs]),
                _median_max([o.total for o in runs])] for (scenario, impl), runs in by.items()], align="llrrrrr"),
        "", "Pause per partition in the first round (s, all its moves added up):", "",
    ]
    for (scenario, impl), runs in by.items():
        if runs[0].takeover is None:
            lines.append(f"- {scenario}, {impl}: {_fmt(runs[0].total)}")
    lines += ["", "How this SDK's processors moved the partitions (ownership changes they logged, all rounds; "
                  "the official processor does not say):", ""]
    for (scenario, impl), runs in by.items():
        if impl == "ours":
            changes: Counter = Counter()
            for o in runs:
                changes.update(o.changes)
            lines.append(f"- {scenario}: " + ", ".join(f"{reason} {n}" for reason, n in sorted(changes.items())))
    crashes = [(impl, runs) for (scenario, impl), runs in by.items() if runs[0].takeover is not None]
    if crashes:
        lines += ["", table(
            ["SIGKILL of one of 4 owners, 4 standbys", "taken over by a standby", "SIGKILL to claim, s",
             "SIGKILL to its first batch, s", "bounds, s", "lost", "duplicates (a crash replays from the last "
             "checkpoint)"],
            [[impl, ", ".join("yes" if o.taker_was_standby else "no" for o in runs),
              ", ".join(f"{o.claimed:.2f}" for o in runs if o.claimed is not None) or "not reported",
              ", ".join(f"{o.takeover:.2f}" for o in runs if o.takeover is not None),
              f"{CLAIM_BOUND:.1f}, {TAKEOVER_BOUND:.1f}", sum(o.lost for o in runs),
              ", ".join(str(o.duplicates) for o in runs)] for impl, runs in crashes], align="llrrrrr")]
    lines += ["", "A crash replays what was delivered after the dead owner's last checkpoint: with a checkpoint every "
                  f"{CHECKPOINT_EVERY} batches, how many events that is depends on how large the batches each receiver "
                  "hands over are (its prefetch and how fast the handler keeps up), so crash duplicates compare the "
                  "receivers as much as the processors; checkpoint by time or by event count to compare those.",
              "", f"Bounds: the claim within expiration {EXPIRY:g} s + 1 s (the store's timestamps) + one tick "
                  f"({1.1 * INTERVAL:.2f} s at most) + 2 s of slack for a busy machine; the first batch within that + "
                  f"about 1 s to open a receiver + 1 s of slack. The official processor does not report its claims."]
    return "\n".join(lines)


async def _measure(args: argparse.Namespace, hub_conn: str, storage_conn: str, log_dir: str) -> list[Outcome]:
    outcomes = []
    impls = ("ours",) if args.ours_only else tuple(args.impls)
    for r in range(args.rounds):
        for name in args.scenarios:
            partitions, scenario = SCENARIOS[name]
            for impl in (impls if r % 2 == 0 else impls[::-1]):
                group = _group(impl, args.prefetch, hub=f"moves-{name}-{impl}-{r}", partitions=partitions,
                               hub_connection_string=hub_conn, storage_connection_string=storage_conn,
                               log_dir=log_dir)
                try:
                    outcome = await scenario(group)
                finally:
                    await group.close()
                print(outcome.summary(), file=sys.stderr)
                outcomes.append(outcome)
    return outcomes


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the scenarios for every side and print the tables; ``--record`` writes them.

    Example::

        python -m benchmarks.moves --rounds 2 --record
    """
    parser = program.parser("moves", __doc__, prog)
    parser.add_argument("--rounds", type=program.at_least_one, default=2,
                        help="Rounds of every scenario per side. [default: %(default)s]")
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS),
                        help="The scenarios to run (a subset is never recorded). [default: scale rolling standby]")
    parser.add_argument("--ours-only", action="store_true", help="Skip the official processor (never recorded).")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS),
                        help="The sides to run (a subset is never recorded). [default: ours official official-close]")
    parser.add_argument("--prefetch-ours", type=int, default=PREFETCH["ours"],
                        help="This SDK's prefetch: what the e2e sweep chose for it. [default: %(default)s]")
    parser.add_argument("--prefetch-official", type=int, default=PREFETCH["official"],
                        help="The official client's prefetch: what the e2e sweep chose for it. [default: %(default)s]")
    parser.add_argument("--log-dir", help="Keep every worker's log and each scenario's timeline of batches here. "
                                          "[default: a temporary directory, removed]")

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.record and (args.ours_only or args.scenarios != list(SCENARIOS) or args.impls != list(IMPLS)):
            parser.error("partial runs (--ours-only, --scenarios, --impls) are never recorded")
        return _run(args, run)

    return program.run("moves", parser, body, argv)


def _run(args: argparse.Namespace, run: program.Run) -> int:
    if args.prefetch_ours < 1 or args.prefetch_official < 1:
        raise CommandError("--prefetch-ours and --prefetch-official take a positive number of events")
    args.prefetch = {"ours": args.prefetch_ours, "official": args.prefetch_official}
    hubs = {f"moves-{name}-{impl}-{r}": partitions for name, (partitions, _s) in SCENARIOS.items() for impl in IMPLS
            for r in range(args.rounds)}
    with services.logs("moves", args.log_dir) as log_dir, \
            services.azurite_and_emulator(hubs=hubs) as (emulator, azurite):
        outcomes = asyncio.run(_measure(args, emulator.connection_string, azurite.connection_string, log_dir))
    run.report(render(outcomes, args.rounds, run.header("Other work on the machine lengthens pauses and takeovers."),
                      args.prefetch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
