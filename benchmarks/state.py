"""Stateful partitions: the pause of a planned move, the failover after a SIGKILL and the
cost of a checkpoint against the size of the state, with warm-up and standbys
(``EventProcessor(stateful=StatePolicy(num_standbys=1))``) and the naive way, side by side.

Run it with ``python -m benchmarks.state`` (or ``eventprocessor bench state``). It starts
its own Event Hubs emulator and Azurite on loopback. Every processor is an OS process
(``python -m harness.worker``) with ``EventHubSource`` and this SDK's
``BlobCheckpointStore``; its handler counts events per key (5 keys) and pads each
partition's state to the size measured (``--state-bytes``: keys of 1,000-character
strings, added at the first claim):

* *warm-up*: ``--stateful --standbys 1``: the counts live in ``context.state``, committed with each
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

Then, in the same group, *a* (the owner of the other partition) is SIGKILLed: *failover*
runs from the SIGKILL to *b*'s first batch of that partition. On the warm-up side the
workers keep one standby (``--standbys 1``), so *b* already follows *a*'s partition; on
the naive side *b* downloads its blob at the claim. The lease expiration is the group's
(``EXPIRY``, 6 s) and the balancing interval ``INTERVAL`` (0.5 s): a failover waits for
the dead owner's lease to expire, then for the restore.

Last, the *checkpoint cost* is measured in the benchmark's own process on the same
Azurite, without the hub: a claim of one partition commits a padded state through this
SDK's ``BlobCheckpointStore`` (``StateKeeper.prepare``, the fenced ``update_checkpoint``,
``StateKeeper.committed``: what ``context.update_checkpoint`` does), against the naive
way (upload the whole state as one blob, then the checkpoint). Requests and bytes are
counted on the wire: azure-storage's ``raw_request_hook`` sees every HTTP request the
clients send (retries included) and its ``Content-Length``. Rows: each state size with a
small change (5 counters), and a fixed state (16 MB, or the largest size given if
smaller) with changes of 1 KB, 1 MB and 16 MB (those no larger than the state).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from eventprocessor import Timing
from harness.group import CHECKPOINT_EVERY, EXPIRY, INTERVAL, PERIOD, Group, Outcome
from harness.state_scenarios import hub_bodies, restore_mismatches, standby_replicas

from .toolkit import program, services
from .toolkit.report import median, median_range, table

__all__ = ["main", "render"]

MODES = ("warm", "naive")
"""The sides: this SDK's state with warm-up, and one blob per partition by hand."""
_OPTIONS = {"warm": ["--stateful", "--standbys", "1"], "naive": ["--naive"]}
_LABELS = {"warm": "warm-up (`stateful=True`)", "naive": "naive (one blob, restored at the claim)"}
MB = 1024 * 1024
KEYS = 5
PARTITIONS = 2
COMMITTED_TIMEOUT = 300.0  # seconds for a to commit its padded state a few times (64 MB, naive: slow)
MOVE_TIMEOUT = 300.0  # seconds for b to take its partition (warm-up of a large state included)
STANDBY_TIMEOUT = 120.0  # seconds for b's replica of a's partition to be caught up (warm-up side)
FAILOVER_TIMEOUT = 120.0  # seconds from the SIGKILL for b to deliver a's partition
COMMITS = 4  # measured checkpoints per row and side of the checkpoint cost, per round
CHANGES = [1024, MB, 16 * MB]  # bytes changed per checkpoint, at the fixed state size
COST_STATE_MB = 16.0
PAD_VALUE_CHARS = 1000
STORE_TIMEOUT = Timing.derive(interval=INTERVAL, expiration=EXPIRY, renewal_age=None, store_timeout=None,
                              shutdown_timeout=30.0, handler_timeout=None).store_timeout
"""The workers' ``store_timeout`` (derived from their expiration and interval: 0.5 s)."""


@dataclass
class Move:
    """One planned move of one size and side."""

    mode: str
    mb: float
    pause: float = float("nan")  # a's last batch of the moved partition to b's first
    to_move: float = float("nan")  # b's start to its first batch (warm-up included)
    warm: bool | None = None  # b restored from a warm replica
    bytes_read: int = 0  # what b read at the claim
    checkpoint_ms: list[float] = field(default_factory=list)  # a's checkpoints of the partition, padded state
    steady_gap: float = float("nan")  # a's median gap between batches of the partition before the move
    duplicates: int = 0  # up to the SIGKILL
    lost: int = 0  # the whole run
    mismatches: list[str] = field(default_factory=list)  # restores of the planned move
    failover: float = float("nan")  # the SIGKILL to b's first batch of a's partition
    failover_restored: float = float("nan")  # the SIGKILL to b's restored state of it (its initialize)
    failover_warm: bool | None = None
    failover_bytes: int = 0  # what b read at that claim
    failover_duplicates: int = 0  # delivered again after the SIGKILL
    failover_mismatches: list[str] = field(default_factory=list)  # restores after the SIGKILL


def _duplicates(group: Group) -> int:
    return sum(sum(w.deliveries.values()) for w in group.workers) - len(group.delivered())


async def _move(mode: str, mb: float, hub: str, hub_conn: str, storage_conn: str, log_dir: str) -> Move:
    move = Move(mode, mb)
    group = Group(impl="ours", hub=hub, partitions=PARTITIONS, hub_connection_string=hub_conn,
                  storage_connection_string=storage_conn, log_dir=log_dir, keys=KEYS,
                  worker_options=[*_OPTIONS[mode], "--state-bytes", str(int(mb * MB))])
    killed_at = float("inf")
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
        move.steady_gap = round(median(gaps), 3)
        restores = [r for r in b.restores if r["p"] == moved]
        if restores:
            move.warm, move.bytes_read = bool(restores[0]["warm"]), int(restores[0]["bytes"])
        move.checkpoint_ms = [ms for _t, p, _s, ms in a.checkpoints[2:] if p == moved]

        # The failover: a, the owner of the other partition, is SIGKILLed.
        other = next(pid for pid in group.all_partitions if pid != moved)
        if mode == "warm":  # b follows a's partition (its standby) and has caught up
            deadline = time.monotonic() + STANDBY_TIMEOUT
            while b.owner_id not in (await standby_replicas(group)).get(other, set()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mb:g} MB: b published no caught-up replica of partition {other} within "
                                       f"{STANDBY_TIMEOUT:.0f}s\n" + "\n".join(w.diagnostics() for w in group.workers))
                await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # the SIGKILL falls between two of a's checkpoints, not right after a claim
        move.duplicates = _duplicates(group)
        a.kill()
        killed_at = time.time()
        await a.process.wait()

        def taken() -> list[float]:
            return [t for t, p, _f, _l in b.batches if p == other and t > killed_at]

        await group.until(lambda: bool(taken()), f"b delivering partition {other} after the SIGKILL",
                          FAILOVER_TIMEOUT)
        move.failover = round(min(taken()) - killed_at, 2)
        after = [r for r in b.restores if r["p"] == other and r["t"] > killed_at]
        if after:
            move.failover_restored = round(after[0]["t"] - killed_at, 2)
            move.failover_warm, move.failover_bytes = bool(after[0]["warm"]), int(after[0]["bytes"])
        outcome = await group.finish(Outcome(f"planned move and SIGKILL, {mb:g} MB", mode, PARTITIONS))
        move.lost = outcome.lost
        move.failover_duplicates = outcome.duplicates - move.duplicates
    finally:
        await group.close()
    bodies = await hub_bodies(hub_conn, hub)
    move.mismatches = restore_mismatches(group, bodies, until=killed_at)
    move.failover_mismatches = restore_mismatches(group, bodies, since=killed_at)
    return move


# ---------------------------------------------------------------------------- checkpoint cost

class Wire:
    """Counts the HTTP requests a storage client sends and the bytes of their bodies
    (azure-storage's ``raw_request_hook``: once per request sent, retries included)."""

    def __init__(self) -> None:
        self.requests = 0
        self.sent = 0

    def __call__(self, request: Any) -> None:
        self.requests += 1
        http = request.http_request
        length = http.headers.get("Content-Length")
        if length is not None:
            self.sent += int(length)
        elif isinstance(http.body, (bytes, bytearray)):
            self.sent += len(http.body)

    def reading(self) -> tuple[int, int]:
        return self.requests, self.sent


@dataclass
class Cost:
    """Checkpoints of one state size and change size, one side."""

    mode: str
    state_mb: float
    change: int  # bytes changed per checkpoint (0: the 5 counters only)
    requests: list[int] = field(default_factory=list)  # per checkpoint, on the wire
    written: list[int] = field(default_factory=list)  # bytes of request bodies per checkpoint
    ms: list[float] = field(default_factory=list)
    background_requests: int = 0  # snapshots and compaction after those checkpoints, in all
    background_written: int = 0
    commits: int = 0


def _pad_keys(mb: float) -> list[str]:
    entry = len(json.dumps({"~pad/000000": "x" * PAD_VALUE_CHARS}, separators=(",", ":")))
    return [f"~pad/{i:06d}" for i in range(max(1, int(mb * MB) // entry))]


def _change(state: Any, keys: list[str], change: int, seq: int) -> None:
    """The handler's work between two checkpoints: 5 counters, and ``change`` bytes of
    padding rewritten (whole values of ``PAD_VALUE_CHARS`` characters)."""
    for k in range(KEYS):
        state[f"k{k}"] = state.get(f"k{k}", 0) + 1
    value = "abcdefghij"[seq % 10] * PAD_VALUE_CHARS  # another value at every checkpoint
    entry = len(json.dumps({keys[0]: value}, separators=(",", ":")))
    for key in keys[:max(1, round(change / entry))] if change else ():
        state[key] = value


async def _cost(mode: str, state_mb: float, change: int, storage_conn: str, name: str) -> Cost:
    from azure.storage.blob.aio import ContainerClient

    from eventprocessor._runtime.bounded_store import BoundedStore
    from eventprocessor._runtime.clock import SystemClock
    from eventprocessor.state import StateKeeper, StateLog
    from eventprocessor.stores.blob import BlobCheckpointStore
    from eventprocessor.stores.records import Checkpoint, Ownership

    cost = Cost(mode, state_mb, change)
    wire = Wire()
    container = f"state-cost-{name}"
    scope = ("bench.local", name, "$default")
    owner = "cost"
    blob_store = BlobCheckpointStore.from_connection_string(storage_conn, container, raw_request_hook=wire)
    # Every call bounded as the workers' processor bounds it (their store_timeout).
    store = BoundedStore(blob_store, timeout=STORE_TIMEOUT, clock=SystemClock())
    blobs = ContainerClient.from_connection_string(storage_conn, container, raw_request_hook=wire)
    async with blob_store, blobs:
        [claim] = await store.claim_ownership([Ownership(*scope, "0", owner_id=owner, epoch=1)])
        await store.fence_checkpoint(claim)
        keeper = StateKeeper(StateLog(store, scope, "0"), epoch=claim.epoch)
        naive: dict[str, Any] = {}
        state: Any = keeper.state if mode == "warm" else naive
        keys = _pad_keys(state_mb)
        for key in keys:
            state[key] = "x" * PAD_VALUE_CHARS
        blob = blobs.get_blob_client("naive-state/0")

        async def checkpoint(seq: int) -> None:
            if mode == "warm":  # what context.update_checkpoint does
                ref = await keeper.prepare(seq)
                await store.update_checkpoint(Checkpoint(*scope, "0", sequence_number=seq, offset=str(seq), state=ref),
                                              owner_id=owner, epoch=claim.epoch)
                keeper.committed(ref)
            else:  # the naive handler: the whole state as one blob, then the checkpoint
                await blob.upload_blob(json.dumps(naive).encode(), overwrite=True)
                await store.update_checkpoint(Checkpoint(*scope, "0", sequence_number=seq, offset=str(seq)),
                                              owner_id=owner, epoch=claim.epoch)

        await checkpoint(0)  # the first checkpoint writes the whole state on both sides: not a row
        await keeper.close(wait=True)  # its snapshot
        for seq in range(1, COMMITS + 1):
            _change(state, keys, change, seq)
            requests, sent = wire.reading()
            started = time.perf_counter()
            await checkpoint(seq)
            cost.ms.append((time.perf_counter() - started) * 1000)
            cost.requests.append(wire.requests - requests)
            cost.written.append(wire.sent - sent)
            requests, sent = wire.reading()
            await keeper.close(wait=True)  # a snapshot this checkpoint started, measured apart
            cost.background_requests += wire.requests - requests
            cost.background_written += wire.sent - sent
            cost.commits += 1
    return cost


def _cost_rows(sizes: list[float]) -> list[tuple[float, int]]:
    """(state MB, bytes changed): every size with the counters only, then the fixed
    state with each change no larger than it."""
    fixed = min(COST_STATE_MB, max(sizes))
    return [(mb, 0) for mb in sizes] + [(fixed, change) for change in CHANGES if change <= fixed * MB]


def _bytes(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB else f"{n / 1024:.0f} KB" if n >= 1024 else f"{n} bytes"


def render(moves: list[Move], costs: list[Cost], sizes: list[float], rounds: int, head: str) -> str:
    """The section: ``head`` (the line under the title, :meth:`~benchmarks.toolkit.program.Run.header`),
    then the tables."""
    by = {(m.mb, m.mode): [x for x in moves if (x.mb, x.mode) == (m.mb, m.mode)] for m in moves}
    lines = [
        "## Stateful partitions: moves, failovers and checkpoints against the size of the state (`state`)",
        "",
        head,
        "",
        (f"One Event Hubs emulator and one Azurite on 127.0.0.1, started by the benchmark; every processor is an OS "
         f"process (`python -m harness.worker`, `EventHubSource` + `BlobCheckpointStore`) whose "
         f"handler counts events per key ({KEYS} keys) in a state padded to the size given (keys of 1,000-character "
         f"strings). *warm-up*: `--stateful --standbys 1`, the counts in `context.state` "
         f"(`EventProcessor(stateful=StatePolicy(num_standbys=1))`): the new owner loads the state before it asks for "
         f"the partition, and a standby follows each partition. *naive*: `--naive`, the same counts in a dict kept in "
         f"one blob per partition, as written by hand without the feature: uploaded before each checkpoint and in "
         f"`close`, downloaded whole in `initialize` by the new owner. Hub of {PARTITIONS} partitions, {PERIOD:g} s "
         f"between events; load-balancing interval {INTERVAL:g} s, ownership expiration {EXPIRY:g} s, a checkpoint "
         f"every {CHECKPOINT_EVERY} batches. Process a owns both partitions and commits its padded state 3 times; "
         f"process b starts and the balancer moves one partition to it; then a is SIGKILLed and b takes the other. "
         f"{rounds} round(s) per size and side; the two sides take turns going first. Counts are checked against "
         f"the hub's events (read back with azure-eventhub's consumer) for every state a claim restored; "
         f"duplicates and losses come from what the handlers received."),
        "",
        "### Planned move",
        "",
        "*Pause*: a's last batch of the moved partition to b's first.",
        "",
        table(["state", "side", "pause, s (per round)", "pause, s (median)", "b started to its first batch, s",
               "b restored warm", "bytes b read at the claim", "a's checkpoint, ms (median, padded state)",
               "a's median gap between batches, s", "duplicates (before the SIGKILL)", "lost (whole run)",
               "counts exact"],
              [[f"{mb:g} MB", _LABELS[mode], ", ".join(f"{m.pause:.2f}" for m in runs),
                f"{median([m.pause for m in runs]):.2f}", ", ".join(f"{m.to_move:.1f}" for m in runs),
                ", ".join("yes" if m.warm else "no" for m in runs), ", ".join(f"{m.bytes_read:,}" for m in runs),
                f"{median([ms for m in runs for ms in m.checkpoint_ms]):.0f}",
                f"{median([m.steady_gap for m in runs]):.2f}", ", ".join(str(m.duplicates) for m in runs),
                sum(m.lost for m in runs), "yes" if not any(m.mismatches for m in runs) else "NO"]
               for (mb, mode), runs in by.items()], align="rlrrrlrrrrrl"),
    ]
    warm = {mb: median([m.pause for m in by.get((mb, "warm"), [])]) for mb in sizes}
    if len(sizes) > 1 and not any(math.isnan(v) for v in warm.values()):
        small, large = min(sizes), max(sizes)
        ratio = warm[large] / warm[small] if warm[small] > 0 else float("inf")
        lines += ["", (f"With warm-up, the median pause at {large:g} MB is {ratio:.2f}x the median pause at "
                       f"{small:g} MB (target: within 2x): {'met' if ratio <= 2 else 'NOT met'}.")]
    lines += [
        "", "### Failover after SIGKILL", "",
        (f"*Failover*: from the SIGKILL of a (the owner of the partition b did not take) to b's first batch of that "
         f"partition; it includes waiting for a's lease to expire ({EXPIRY:g} s) and b's next balancing tick. "
         f"*Restored*: the SIGKILL to b's handler `initialize` (the state loaded). Duplicates: events delivered "
         f"again after the SIGKILL (a's batches since its last checkpoint)."),
        "",
        table(["state", "side", "failover, s (per round)", "failover, s (median)", "SIGKILL to b's state restored, s",
               "b restored warm", "bytes b read at the claim", "duplicates (after the SIGKILL)", "lost (whole run)",
               "counts exact"],
              [[f"{mb:g} MB", _LABELS[mode], ", ".join(f"{m.failover:.2f}" for m in runs),
                f"{median([m.failover for m in runs]):.2f}", ", ".join(f"{m.failover_restored:.2f}" for m in runs),
                ", ".join("yes" if m.failover_warm else "no" for m in runs),
                ", ".join(f"{m.failover_bytes:,}" for m in runs), ", ".join(str(m.failover_duplicates) for m in runs),
                sum(m.lost for m in runs), "yes" if not any(m.failover_mismatches for m in runs) else "NO"]
               for (mb, mode), runs in by.items()], align="rlrrrlrrrl"),
    ]
    lines += [
        "", "### Checkpoint cost", "",
        (f"One claim of one partition in the benchmark's process, on the same Azurite: {COMMITS} checkpoints per "
         f"round after a first one that writes the whole state (not counted), each after the handler changed the "
         f"{KEYS} counters and, in the change rows, rewrote that many bytes of padding. *Ours*: "
         f"`StateKeeper.prepare` (the change, in chunks of at most 960 KB), the fenced `update_checkpoint`, "
         f"`StateKeeper.committed`, as `context.update_checkpoint` runs them, every store call bounded as the "
         f"workers' are (`BoundedStore`, store_timeout {STORE_TIMEOUT:g} s). *Naive*: the whole state uploaded as "
         f"one blob, then the checkpoint. Requests and bytes are counted on the wire (every HTTP request the storage "
         f"clients sent, and its body's `Content-Length`), per checkpoint; ms is the wall time of the checkpoint; "
         f"each the median over rounds and checkpoints, the range in parentheses. *Background*: "
         f"the snapshot and compaction a checkpoint started (written after it returns; a snapshot is taken every "
         f"100 commits, or once the changes since the last one outweigh the state), per checkpoint."),
        "",
    ]
    rows = []
    for mb, change in sorted({(c.state_mb, c.change) for c in costs}, key=lambda row: (row[1] > 0, row)):
        side = {mode: [c for c in costs if (c.state_mb, c.change, c.mode) == (mb, change, mode)] for mode in MODES}
        cells = []
        for mode in MODES:
            runs = side[mode]
            requests = [float(n) for c in runs for n in c.requests]
            written = [float(n) for c in runs for n in c.written]
            ms = [x for c in runs for x in c.ms]
            cells += [median_range(requests), median_range(written), median_range(ms)]
            if mode == "warm":
                commits = sum(c.commits for c in runs) or 1
                cells.append(f"{sum(c.background_requests for c in runs) / commits:.1f} / "
                             f"{sum(c.background_written for c in runs) / commits:,.0f}")
        rows.append([f"{mb:g} MB", f"{_bytes(change)} + counters" if change else f"{KEYS} counters", *cells])
    lines.append(table(["state", "change per checkpoint", "ours: requests", "ours: bytes written", "ours: ms",
                        "ours: background requests / bytes", "naive: requests", "naive: bytes written", "naive: ms"],
                       rows, align="rrrrrrrrr"))
    problems = [p for m in moves for p in m.mismatches + m.failover_mismatches]
    if problems:
        lines += ["", "Counts that differ from the hub's events:", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines)


def _hub(mode: str, mb: float, r: int) -> str:
    return f"state-{mode}-{str(mb).replace('.', 'p')}-{r}"


async def _measure(args: argparse.Namespace, hub_conn: str, storage_conn: str,
                   log_dir: str) -> tuple[list[Move], list[Cost]]:
    moves: list[Move] = []
    costs: list[Cost] = []
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mb in args.sizes:
            for mode in order:
                move = await _move(mode, mb, _hub(mode, mb, r), hub_conn, storage_conn, log_dir)
                print(f"{mb:g} MB, {mode}: pause {move.pause:.2f}s, b's first batch after {move.to_move:.1f}s, "
                      f"warm {move.warm}, read {move.bytes_read:,} bytes, duplicates {move.duplicates}, lost "
                      f"{move.lost}, mismatches {move.mismatches}; failover {move.failover:.2f}s (restored after "
                      f"{move.failover_restored:.2f}s, warm {move.failover_warm}, read {move.failover_bytes:,} "
                      f"bytes), duplicates {move.failover_duplicates}, mismatches {move.failover_mismatches}",
                      file=sys.stderr)
                moves.append(move)
        for index, (mb, change) in enumerate(_cost_rows(args.sizes)):
            for mode in order:
                cost = await _cost(mode, mb, change, storage_conn, f"{mode}-{index}-{r}")
                print(f"checkpoint cost, {mb:g} MB, change {change:,} bytes, {mode}: requests {cost.requests}, "
                      f"written {cost.written}, ms {[round(ms) for ms in cost.ms]}, background "
                      f"{cost.background_requests} requests / {cost.background_written:,} bytes", file=sys.stderr)
                costs.append(cost)
    return moves, costs


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the planned moves, failovers and checkpoints at every size for both sides and
    print the tables; ``--record`` writes them.

    Example::

        python -m benchmarks.state --sizes 1 16 64 --rounds 2 --record
    """
    parser = program.parser("state", __doc__, prog)
    parser.add_argument("--sizes", nargs="+", type=float, default=[1.0, 16.0, 64.0],
                        help="State per partition, MB. [default: 1 16 64]")
    parser.add_argument("--rounds", type=program.at_least_one, default=2,
                        help="Rounds of every size per side. [default: %(default)s]")
    parser.add_argument("--log-dir", help="Keep every worker's log here. [default: a temporary directory, removed]")
    parser.add_argument("--quick", action="store_true",
                        help="A smoke run: --sizes 0.05 --rounds 1 (never recorded).")

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if any(mb <= 0 for mb in args.sizes):
            parser.error("every --sizes value above 0 MB, please: a state of nothing measures nothing")
        if args.quick:
            if args.record:
                parser.error("partial runs (--quick) are never recorded")
            args.sizes, args.rounds = [0.05], 1
        return _run(args, run)

    return program.run("state", parser, body, argv)


def _run(args: argparse.Namespace, run: program.Run) -> int:
    hubs = {_hub(mode, mb, r): PARTITIONS for mb in args.sizes for mode in MODES for r in range(args.rounds)}
    with services.logs("state", args.log_dir) as log_dir, \
            services.azurite_and_emulator(hubs=hubs) as (emulator, azurite):
        moves, costs = asyncio.run(_measure(args, emulator.connection_string, azurite.connection_string, log_dir))
    run.report(render(moves, costs, args.sizes, args.rounds, run.header("Other work on the machine lengthens pauses.")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
