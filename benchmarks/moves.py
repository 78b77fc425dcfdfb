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

The scenarios and the process group are :mod:`eventprocessor.testing.processes`;
``tests/test_handoff_processes.py`` runs them for this SDK on the test session's
emulator and Azurite and asserts 0 duplicates and 0 lost on planned moves.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
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

from . import program, services
from .machine_load import LoadReading, LoadWindow, busy_flag
from .results import machine_line

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


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render(outcomes: list[Outcome], rounds: int, command: str, seconds: float,
           load: list[float] | None = None, prefetch: dict[str, int] | None = None,
           reading: LoadReading | None = None) -> str:
    by = {(o.scenario, o.impl): [x for x in outcomes if (x.scenario, x.impl) == (o.scenario, o.impl)]
          for o in outcomes}
    lines = [
        "## Planned moves and crashes with real processes (`moves`)",
        "",
        f"Command: `{command}` ({seconds:.0f} s). {machine_line()}"
        + (f" Machine load (1-minute average) {load[0]:.1f} before, {load[1]:.1f} after: other work on the machine "
           "lengthens pauses and takeovers." if load else "")
        + (f" Over the whole run: {reading.describe()}." if reading is not None else ""),
        "",
        *busy_flag([reading] if reading is not None else [], "these figures"),
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
        "| scenario | | duplicates (per round) | lost | moves | longest pause of a partition, s (median / max) | "
        "pauses of a partition added up, s (median / max) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for (scenario, impl), runs in by.items():
        longest = [s for o in runs for pid, s in o.longest.items() if s > 0]
        total = [s for o in runs for pid, s in o.total.items() if s > 0]
        lines.append(
            f"| {scenario} | {impl} | {', '.join(str(o.duplicates) for o in runs)} | {sum(o.lost for o in runs)} | "
            f"{', '.join(str(o.moves) for o in runs)} | {_median(longest):.2f} / {max(longest, default=0):.2f} | "
            f"{_median(total):.2f} / {max(total, default=0):.2f} |")
    lines += ["", "Pause per partition in the first round (s, all its moves added up):", ""]
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
        lines += ["", "| SIGKILL of one of 4 owners, 4 standbys | taken over by a standby | SIGKILL to claim, s | "
                      "SIGKILL to its first batch, s | bounds, s | lost | duplicates (a crash replays from the last "
                      "checkpoint) |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for impl, runs in crashes:
            claims = [o.claimed for o in runs if o.claimed is not None]
            lines.append(
                f"| {impl} | {', '.join('yes' if o.taker_was_standby else 'no' for o in runs)} | "
                f"{', '.join(f'{c:.2f}' for c in claims) or 'not reported'} | "
                f"{', '.join(f'{o.takeover:.2f}' for o in runs if o.takeover is not None)} | {CLAIM_BOUND:.1f}, "
                f"{TAKEOVER_BOUND:.1f} | "
                f"{sum(o.lost for o in runs)} | {', '.join(str(o.duplicates) for o in runs)} |")
    lines += ["", "A crash replays what was delivered after the dead owner's last checkpoint: with a checkpoint every "
                  f"{CHECKPOINT_EVERY} batches, how many events that is depends on how large the batches each receiver "
                  "hands over are (its prefetch and how fast the handler keeps up), so crash duplicates compare the "
                  "receivers as much as the processors; checkpoint by time or by event count to compare those.",
              "", f"Bounds: the claim within expiration {EXPIRY:g} s + 1 s (the store's timestamps) + one tick "
                  f"({1.1 * INTERVAL:.2f} s at most) + 2 s of slack for a busy machine; the first batch within that + "
                  f"about 1 s to open a receiver + 1 s of slack. The official processor does not report its claims."]
    return "\n".join(lines)


def _config(path: str, rounds: int) -> str:
    entities = [{"Name": f"moves-{name}-{impl}-{r}", "PartitionCount": str(partitions)}
                for name, (partitions, _s) in SCENARIOS.items() for impl in IMPLS for r in range(rounds)]
    with open(path, "w") as handle:
        json.dump({"UserConfig": {"NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1",
                                                       "Entities": entities}]}}, handle)
    return path


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
    parser.add_argument("--rounds", type=int, default=2, help="Rounds of every scenario per side. "
                                                              "[default: %(default)s]")
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

    def body(args: argparse.Namespace) -> int:
        if args.record and (args.ours_only or args.scenarios != list(SCENARIOS) or args.impls != list(IMPLS)):
            parser.error("partial runs (--ours-only, --scenarios, --impls) are never recorded")
        return _run(args, program.recorded_command("moves", argv))

    return program.run(parser, body, argv)


def _run(args: argparse.Namespace, command: str) -> int:
    if args.prefetch_ours < 1 or args.prefetch_official < 1:
        raise CommandError("--prefetch-ours and --prefetch-official take a positive number of events")
    args.prefetch = {"ours": args.prefetch_ours, "official": args.prefetch_official}
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    window = LoadWindow()
    outcomes = services.with_azurite_and_emulator(
        "moves", args.log_dir, lambda path: _config(path, args.rounds),
        lambda hub_conn, storage_conn, log_dir: asyncio.run(_measure(args, hub_conn, storage_conn, log_dir)))
    if outcomes is None:
        return 2
    program.report("moves", render(outcomes, args.rounds, command, time.monotonic() - started,
                                   [load_before, os.getloadavg()[0]], args.prefetch, window.reading()), args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
