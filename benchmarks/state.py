"""Stateful partitions: the pause of a planned move against the size of the state, with
warm-up (``EventProcessor(stateful=True)``) and the naive way, side by side.

Run it with ``python -m benchmarks.state`` (or ``eventprocessor bench state``). It starts
its own Event Hubs emulator and Azurite on loopback. Every processor is an OS process
(``python -m eventprocessor.testing.worker``) with ``EventHubSource`` and this SDK's
``BlobCheckpointStore``; its handler counts events per key (5 keys) and pads each
partition's state to the size measured (``--state-bytes``: keys of 1,000-character
strings, added at the first claim):

* *warm-up*: ``--stateful``: the counts live in ``context.state``, committed with each
  checkpoint (changes, compacted into snapshots); the new owner of a planned move loads
  the state before it asks for the partition and, at the handoff, reads only what
  changed since;
* *naive*: ``--naive``: the same counts in a dict the handler keeps in one blob per
  partition, as a user writes it without the feature: written before each checkpoint and
  in ``close``, downloaded whole in ``initialize`` by the new owner.

Per size and side, on a hub of 2 partitions: process *a* owns both, pads them and
checkpoints a few times; then process *b* starts and the balancer moves one partition to
it (a planned move). The *pause* runs from *a*'s last batch of the moved partition to
*b*'s first (events arrive every ``PERIOD`` seconds, which bounds how finely a pause is
seen). Counts are checked, not assumed: every state a claim restored must equal the
per-key count of the hub's events up to the checkpoint it resumed from (read back with
azure-eventhub's consumer), and duplicates and losses come from what handlers received.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import List, Optional

from eventprocessor.testing.processes import (CHECKPOINT_EVERY, INTERVAL, PERIOD, Group, Outcome, count_mismatches,
                                              hub_bodies)

from . import program
from .results import machine_line

__all__ = ["main", "render"]

MODES = ("warm", "naive")
"""The sides: this SDK's state with warm-up, and one blob per partition by hand."""
_OPTIONS = {"warm": "--stateful", "naive": "--naive"}
_LABELS = {"warm": "warm-up (`stateful=True`)", "naive": "naive (one blob, restored at the claim)"}
MB = 1024 * 1024
KEYS = 5
PARTITIONS = 2
COMMITTED_TIMEOUT = 300.0  # seconds for a to commit its padded state a few times (64 MB, naive: slow)
MOVE_TIMEOUT = 300.0  # seconds for b to take its partition (warm-up of a large state included)


@dataclass
class Move:
    """One planned move of one size and side."""

    mode: str
    mb: float
    pause: float = float("nan")  # a's last batch of the moved partition to b's first
    to_move: float = float("nan")  # b's start to its first batch (warm-up included)
    warm: Optional[bool] = None  # b restored from a warm replica
    bytes_read: int = 0  # what b read at the claim
    checkpoint_ms: List[float] = field(default_factory=list)  # a's checkpoints of the partition, padded state
    steady_gap: float = float("nan")  # a's median gap between batches of the partition before the move
    duplicates: int = 0
    lost: int = 0
    mismatches: List[str] = field(default_factory=list)


async def _move(mode: str, mb: float, hub: str, hub_conn: str, storage_conn: str, log_dir: str) -> Move:
    move = Move(mode, mb)
    group = Group(impl="ours", hub=hub, partitions=PARTITIONS, hub_connection_string=hub_conn,
                  storage_connection_string=storage_conn, log_dir=log_dir, keys=KEYS,
                  worker_options=[_OPTIONS[mode], "--state-bytes", str(int(mb * MB))])
    try:
        a = await group.spawn("a")
        await group.start([a])
        # a has committed its padded state a few times (the first checkpoint writes it all).
        await group.until(lambda: all(sum(1 for c in a.checkpoints if c[1] == pid) >= 3
                                      for pid in group.all_partitions),
                          "3 checkpoints of every partition by a", COMMITTED_TIMEOUT)
        b = await group.spawn("b")
        spawned = time.time()
        await group.until(lambda: len(b.owned) == 1 and any(p in b.owned for _t, p, _f, _l in b.batches),
                          "b delivering one partition", MOVE_TIMEOUT)
        moved = next(iter(b.owned))
        first = min(t for t, p, _f, _l in b.batches if p == moved)
        before = [t for t, p, _f, _l in a.batches if p == moved and t < first]
        move.pause = round(first - max(before), 3)
        move.to_move = round(first - spawned, 2)
        gaps = [y - x for x, y in pairwise(before) if y > spawned - 10]
        move.steady_gap = round(statistics.median(gaps), 3) if gaps else float("nan")
        restores = [r for r in b.restores if r["p"] == moved]
        if restores:
            move.warm, move.bytes_read = bool(restores[0]["warm"]), int(restores[0]["bytes"])
        move.checkpoint_ms = [ms for _t, p, _s, ms in a.checkpoints[2:] if p == moved]
        outcome = await group.finish(Outcome(f"planned move, {mb:g} MB", mode, PARTITIONS))
        move.duplicates, move.lost = outcome.duplicates, outcome.lost
    finally:
        await group.close()
    move.mismatches = count_mismatches(group, await hub_bodies(hub_conn, hub))
    return move


def _median(values: List[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def render(moves: List[Move], sizes: List[float], rounds: int, command: str, seconds: float,
           load: Optional[List[float]] = None) -> str:
    by = {(m.mb, m.mode): [x for x in moves if (x.mb, x.mode) == (m.mb, m.mode)] for m in moves}
    lines = [
        "## Stateful partitions: the pause of a planned move against the size of the state (`state`)",
        "",
        f"Command: `{command}` ({seconds:.0f} s). {machine_line()}"
        + (f" Machine load (1-minute average) {load[0]:.1f} before, {load[1]:.1f} after: other work on the machine "
           "lengthens pauses." if load else ""),
        "",
        (f"One Event Hubs emulator and one Azurite on 127.0.0.1, started by the benchmark; every processor is an OS "
        f"process (`python -m eventprocessor.testing.worker`, `EventHubSource` + `BlobCheckpointStore`) whose handler "
        f"counts events per key ({KEYS} keys) in a state padded to the size given (keys of 1,000-character strings). "
        f"*warm-up*: `--stateful`, the counts in `context.state` (`EventProcessor(stateful=True)`): the new owner "
        f"loads the state before it asks for the partition. *naive*: `--naive`, the same counts in a dict kept in "
        f"one blob per partition, as written by hand without the feature: uploaded before each checkpoint and in "
        f"`close`, downloaded whole in `initialize` by the new owner. Hub of {PARTITIONS} partitions, {PERIOD:g} s "
        f"between events; load-balancing interval {INTERVAL:g} s, a checkpoint every {CHECKPOINT_EVERY} batches. "
        f"Process a owns both partitions and commits its padded state 3 times; process b starts and the balancer "
        f"moves one partition to it. *Pause*: a's last batch of the moved partition to b's first. {rounds} round(s) "
        f"per size and side; the two sides take turns going first."),
        "",
        ("| state | side | pause, s (per round) | pause, s (median) | b started to its first batch, s | "
         "b restored warm | bytes b read at the claim | a's checkpoint, ms (median, padded state) | "
         "a's median gap between batches, s | duplicates | lost | counts exact |"),
        "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for (mb, mode), runs in by.items():
        lines.append(
            f"| {mb:g} MB | {_LABELS[mode]} | {', '.join(f'{m.pause:.2f}' for m in runs)} | "
            f"{_median([m.pause for m in runs]):.2f} | {', '.join(f'{m.to_move:.1f}' for m in runs)} | "
            f"{', '.join('yes' if m.warm else 'no' for m in runs)} | "
            f"{', '.join(f'{m.bytes_read:,}' for m in runs)} | "
            f"{_median([ms for m in runs for ms in m.checkpoint_ms]):.0f} | "
            f"{_median([m.steady_gap for m in runs]):.2f} | {', '.join(str(m.duplicates) for m in runs)} | "
            f"{sum(m.lost for m in runs)} | {'yes' if not any(m.mismatches for m in runs) else 'NO'} |")
    warm = {mb: _median([m.pause for m in by.get((mb, "warm"), [])]) for mb in sizes}
    if len(sizes) > 1 and not any(math.isnan(v) for v in warm.values()):
        small, large = min(sizes), max(sizes)
        ratio = warm[large] / warm[small] if warm[small] > 0 else float("inf")
        lines += ["", (f"With warm-up, the median pause at {large:g} MB is {ratio:.2f}x the median pause at "
                       f"{small:g} MB (target: within 2x): {'met' if ratio <= 2 else 'NOT met'}.")]
    problems = [p for m in moves for p in m.mismatches]
    if problems:
        lines += ["", "Counts that differ from the hub's events:", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines)


def _hub(mode: str, mb: float, r: int) -> str:
    return f"state-{mode}-{str(mb).replace('.', 'p')}-{r}"


def _config(path: str, sizes: List[float], rounds: int) -> str:
    entities = [{"Name": _hub(mode, mb, r), "PartitionCount": str(PARTITIONS)}
                for mb in sizes for mode in MODES for r in range(rounds)]
    with open(path, "w") as handle:
        json.dump({"UserConfig": {"NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1",
                                                       "Entities": entities}]}}, handle)
    return path


async def _measure(args: argparse.Namespace, hub_conn: str, storage_conn: str, log_dir: str) -> List[Move]:
    moves = []
    for r in range(args.rounds):
        for mb in args.sizes:
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                move = await _move(mode, mb, _hub(mode, mb, r), hub_conn, storage_conn, log_dir)
                print(f"{mb:g} MB, {mode}: pause {move.pause:.2f}s, b's first batch after {move.to_move:.1f}s, "
                      f"warm {move.warm}, read {move.bytes_read:,} bytes, duplicates {move.duplicates}, lost "
                      f"{move.lost}, mismatches {move.mismatches}", file=sys.stderr)
                moves.append(move)
    return moves


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> int:
    """Run the planned moves at every size for both sides and print the table;
    ``--record`` writes it.

    Example::

        python -m benchmarks.state --sizes 1 16 64 --rounds 2 --record
    """
    parser = program.parser("state", __doc__, prog)
    parser.add_argument("--sizes", nargs="+", type=float, default=[1.0, 16.0, 64.0],
                        help="state per partition, MB (default: 1 16 64)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every size per side")
    parser.add_argument("--log-dir", help="keep every worker's log here (default: a temporary directory, removed)")

    def body(args: argparse.Namespace) -> int:
        if args.rounds < 1 or any(mb <= 0 for mb in args.sizes):
            parser.error("--rounds must be at least 1 and every --sizes value above 0 MB")
        return _run(args, program.recorded_command("state", argv))

    return program.run(parser, body, argv)


def _run(args: argparse.Namespace, command: str) -> int:
    from emulators.azurite import AzuriteUnavailable, start_azurite
    from emulators.eventhubs.process import EmulatorUnavailable, start_emulator_process

    started = time.monotonic()
    load_before = os.getloadavg()[0]
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="state-bench-") as scratch:
        log_dir = args.log_dir or scratch
        try:
            azurite = start_azurite()
        except AzuriteUnavailable as error:
            print(f"state: Azurite could not start: {error}", file=sys.stderr)
            return 2
        try:
            emulator = start_emulator_process(["--config", _config(os.path.join(scratch, "Config.json"),
                                                                   args.sizes, args.rounds)])
        except EmulatorUnavailable as error:
            azurite.stop()
            print(f"state: {error}", file=sys.stderr)
            return 2
        try:
            moves = asyncio.run(_measure(args, emulator.connection_string, azurite.connection_string, log_dir))
        finally:
            emulator.stop()
            azurite.stop()
    program.report("state", render(moves, args.sizes, args.rounds, command, time.monotonic() - started,
                                   [load_before, os.getloadavg()[0]]), args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
