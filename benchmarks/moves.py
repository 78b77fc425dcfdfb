"""Planned moves and crashes with real processes over AMQP: duplicates, losses and pauses,
this SDK against azure-eventhub's processor.

Run it with ``python -m benchmarks.moves`` (or ``eventprocessor bench moves``). It starts
its own Event Hubs emulator and Azurite on loopback. Every processor is an OS process
(``benchmarks/e2e_worker.py``): *ours* is ``EventProcessor`` + ``EventHubSource`` + this
SDK's ``BlobCheckpointStore``; *official* is ``EventHubConsumerClient.receive_batch`` +
``azure-eventhub-checkpointstoreblob-aio``. Both get the same intervals, batch size,
prefetch, checkpoint cadence and handler time. The parent produces a steady stream with
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

``tests/test_handoff_processes.py`` runs the same scenarios for this SDK on the test
session's emulator and Azurite and asserts 0 duplicates and 0 lost on planned moves.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Dict, List, Optional, Set, Tuple

from . import program
from .e2e_worker import WorkerHandle, spawn_worker
from .results import machine_line

__all__ = ["Group", "Outcome", "SCENARIOS", "CLAIM_BOUND", "TAKEOVER_BOUND", "scale_2_4_2", "rolling_restart",
           "standby_takeover", "main"]

IMPLS = ("ours", "official")
INTERVAL = 0.5  # load-balancing interval, seconds
# Ownership expiration, seconds. 3 s (the e2e test's) leaves renewals 0.25 s per store call
# (store_timeout), which a busy 2-core machine running a dozen processes sometimes misses:
# a lease then self-fences and its partition replays from its last checkpoint. 6 s: 0.5 s.
EXPIRY = 6.0
CHECKPOINT_EVERY = 10  # batches
WORK = 0.03  # seconds each batch spends in the handler, so that stops and handoffs find batches in flight
PERIOD = 0.1  # the producer sends BATCH events to every partition every PERIOD seconds
BATCH = 5
WINDOW = 1.0  # seconds of deliveries that say who is delivering a partition now
STARTUP_TIMEOUT = 60.0
SETTLE_TIMEOUT = 45.0
# A crash: the dead owner's record expires at most EXPIRY after its last renewal (+1 s of
# the store's timestamp resolution); a standby claims it at its next tick (jittered up
# to 1.1 x INTERVAL), with 2 s of slack for a busy machine; then it opens a receiver
# (about a second here) and delivers, with another second of slack.
CLAIM_BOUND = EXPIRY + 1.0 + 1.1 * INTERVAL + 2.0
TAKEOVER_BOUND = CLAIM_BOUND + 1.0 + 1.0

Key = Tuple[str, int]


def fair_shares(partitions: int, processes: int) -> List[int]:
    """The balanced share of each process, smallest first."""
    floor, extra = divmod(partitions, processes)
    return [floor] * (processes - extra) + [floor + 1] * extra


@dataclass
class Outcome:
    """What one scenario measured, from the handlers' deliveries."""

    scenario: str
    impl: str
    partitions: int
    produced: int = 0
    duplicates: int = 0
    lost: int = 0
    moves: int = 0
    longest: Dict[str, float] = field(default_factory=dict)  # the longest single pause per partition
    total: Dict[str, float] = field(default_factory=dict)  # all pauses per partition, added up
    steady_gap: float = 0.0
    seconds: float = 0.0
    settle: List[float] = field(default_factory=list)  # seconds to settle after each step
    takeover: Optional[float] = None  # standby: SIGKILL to the partition's first batch elsewhere
    claimed: Optional[float] = None  # standby: SIGKILL to the claim (ours reports its claims)
    taker_was_standby: Optional[bool] = None
    shares_after: List[int] = field(default_factory=list)
    changes: Dict[str, int] = field(default_factory=dict)  # ours: ownership changes by reason, from its logs

    def summary(self) -> str:
        parts = [f"{self.scenario} ({self.impl}, {self.partitions} partitions, {self.produced} events): duplicates "
                 f"{self.duplicates}, lost {self.lost}, {self.moves} moves"]
        if self.takeover is not None:
            claim = f"claimed after {self.claimed:.2f}s, " if self.claimed is not None else ""
            parts.append(f"SIGKILL: {'a standby' if self.taker_was_standby else 'NOT a standby'} {claim}delivered "
                         f"after {self.takeover:.2f}s (bounds {CLAIM_BOUND:.1f}s and {TAKEOVER_BOUND:.1f}s); shares "
                         f"after {self.shares_after}")
        if self.changes:
            parts.append("ownership changes " + ", ".join(f"{reason} {n}" for reason, n in sorted(self.changes.items())))
        if self.settle:
            parts.append("settled after each step in " + ", ".join(f"{s:.1f}" for s in self.settle) + " s")
        parts.append(f"paused per partition (s, all moves) {_fmt(self.total)}; longest single pause "
                     f"{_fmt(self.longest)}; steady gap between batches {self.steady_gap:.2f}s; {self.seconds:.0f}s")
        return "; ".join(parts)


def _fmt(values: Dict[str, float]) -> str:
    return "{" + ", ".join(f"{pid}: {seconds:.2f}" for pid, seconds in
                           sorted(values.items(), key=lambda kv: int(kv[0]))) + "}"


class Group:
    """Worker processes of one implementation on one hub and one container, and the
    producer feeding the hub."""

    def __init__(self, *, impl: str, hub: str, partitions: int, hub_connection_string: str,
                 storage_connection_string: str, log_dir: str) -> None:
        self.impl = impl
        self.hub = hub
        self.partitions = partitions
        self.hub_connection_string = hub_connection_string
        self.storage_connection_string = storage_connection_string
        self.container = f"moves-{impl}-{uuid.uuid4().hex[:10]}"
        self.log_dir = os.path.join(log_dir, self.container)
        os.makedirs(self.log_dir, exist_ok=True)
        self.workers: List[WorkerHandle] = []
        self.sent = 0
        self._stop = asyncio.Event()
        self._producer: Optional["asyncio.Task[None]"] = None
        self._container_made = False

    @property
    def rate(self) -> float:
        return BATCH * self.partitions / PERIOD

    @property
    def all_partitions(self) -> Set[str]:
        return set(map(str, range(self.partitions)))

    async def spawn(self, owner_id: str) -> WorkerHandle:
        if not self._container_made:  # the official store does not create its container
            from azure.core.exceptions import ResourceExistsError
            from azure.storage.blob.aio import BlobServiceClient

            async with BlobServiceClient.from_connection_string(self.storage_connection_string) as service:
                try:
                    await service.create_container(self.container)
                except ResourceExistsError:
                    pass
            self._container_made = True
        options = ["--impl", self.impl, "--interval", str(INTERVAL), "--expiry", str(EXPIRY), "--strategy",
                   "greedy", "--batch", "100", "--prefetch", "300", "--checkpoint-every", str(CHECKPOINT_EVERY),
                   "--work", str(WORK), "--log-level", "INFO"]
        worker = await spawn_worker(owner_id, hub=self.hub, container=self.container,
                                    hub_connection_string=self.hub_connection_string,
                                    storage_connection_string=self.storage_connection_string, log_dir=self.log_dir,
                                    extra=options)
        self.workers.append(worker)
        return worker

    # ------------------------------------------------------------------ who delivers what
    def _recent(self, workers: List[WorkerHandle]) -> Dict[str, Set[int]]:
        """Partition -> indexes (in ``workers``) of the processes that delivered it lately."""
        since = time.time() - WINDOW
        result: Dict[str, Set[int]] = {}
        for index, worker in enumerate(workers):
            for t, pid, _first, _last in reversed(worker.batches):
                if t < since:
                    break
                result.setdefault(pid, set()).add(index)
        return result

    def shares(self, workers: List[WorkerHandle]) -> Optional[List[int]]:
        """How many partitions each of ``workers`` has, if together they deliver every
        partition, each from one of them; else None. Ours says what it owns (and must be
        delivering it); the official processor is judged by its deliveries alone."""
        recent = self._recent(workers)
        if self.impl == "ours":
            owned = [set(w.owned) for w in workers]
            if sum(len(o) for o in owned) != self.partitions or set().union(*owned) != self.all_partitions:
                return None
            if any(index not in recent.get(pid, ()) for index, o in enumerate(owned) for pid in o):
                return None
            return [len(o) for o in owned]
        if set(recent) != self.all_partitions or any(len(who) != 1 for who in recent.values()):
            return None
        counts = [0] * len(workers)
        for who in recent.values():
            counts[next(iter(who))] += 1
        return counts

    def settled(self, workers: List[WorkerHandle]) -> bool:
        shares = self.shares(workers)
        return shares is not None and sorted(shares) == fair_shares(self.partitions, len(workers))

    async def until(self, condition: Callable[[], bool], what: str, timeout: float, *, fail: bool = True) -> float:
        started = time.monotonic()
        while not condition():
            if time.monotonic() - started > timeout:
                if not fail:
                    break
                raise TimeoutError(f"{self.impl}: {what} did not happen within {timeout:.0f}s\n"
                                   + "\n".join(w.diagnostics() for w in self.workers))
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    # ------------------------------------------------------------------ events
    async def start(self, workers: List[WorkerHandle]) -> float:
        """Produce, and wait until ``workers`` share every partition fairly and deliver it."""
        self._producer = asyncio.create_task(self._produce())
        return await self.until(lambda: self.settled(workers), f"{len(workers)} processes sharing the hub",
                                STARTUP_TIMEOUT)

    async def _produce(self) -> None:
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        producer = EventHubProducerClient.from_connection_string(self.hub_connection_string, eventhub_name=self.hub)
        async with producer:
            rounds, started = 0, time.monotonic()
            while not self._stop.is_set():
                await asyncio.gather(*(producer.send_batch([EventData(b"e") for _ in range(BATCH)],
                                                           partition_id=pid) for pid in sorted(self.all_partitions)))
                self.sent += BATCH * self.partitions
                rounds += 1
                # Steady, not catching up: a late round is not followed by a burst.
                started = max(started, time.monotonic() - rounds * PERIOD)
                await asyncio.sleep(max(0.0, started + rounds * PERIOD - time.monotonic()))

    def delivered(self) -> Set[Key]:
        return set().union(*(set(w.deliveries) for w in self.workers))

    async def finish(self, outcome: Outcome) -> Outcome:
        """Stop producing, wait until every produced event was delivered (and a little
        longer: a late duplicate would show then), and fill in ``outcome``."""
        from azure.eventhub.aio import EventHubProducerClient

        self._stop.set()
        if self._producer is not None:
            await self._producer
        producer = EventHubProducerClient.from_connection_string(self.hub_connection_string, eventhub_name=self.hub)
        async with producer:
            counts = {pid: (await producer.get_partition_properties(pid))["last_enqueued_sequence_number"] + 1
                      for pid in await producer.get_partition_ids()}
        expected = {(pid, seq) for pid, count in counts.items() for seq in range(count)}
        await self.until(lambda: expected <= self.delivered(), "delivery of every produced event", SETTLE_TIMEOUT,
                         fail=False)
        await asyncio.sleep(2 * INTERVAL)
        delivered = self.delivered()
        outcome.produced = len(expected)
        outcome.duplicates = sum(sum(w.deliveries.values()) for w in self.workers) - len(delivered)
        outcome.lost = len(expected - delivered)
        moves = self.moves()
        outcome.moves = sum(len(m) for m in moves.values())
        outcome.longest = {pid: max((b - a for a, b in m), default=0.0) for pid, m in moves.items()}
        outcome.total = {pid: sum(b - a for a, b in m) for pid, m in moves.items()}
        outcome.steady_gap = self.steady_gap()
        outcome.changes = dict(Counter(reason for w in self.workers for (_t, _p, reason, _e) in w.changes))
        return outcome

    def moves(self) -> Dict[str, List[Tuple[float, float]]]:
        """Each change of the process delivering each partition, in time order: (the old
        process's last batch, the new one's first batch). By process, not by name: a
        process restarted under the same name is a move too."""
        result: Dict[str, List[Tuple[float, float]]] = {}
        for pid in sorted(self.all_partitions, key=int):
            batches = sorted((t, index) for index, w in enumerate(self.workers)
                             for (t, p, _f, _l) in w.batches if p == pid)
            result[pid] = [(a_t, b_t) for (a_t, a), (b_t, b) in zip(batches, batches[1:]) if a != b]
        return result

    def steady_gap(self) -> float:
        """The median time between two consecutive batches of one partition in one process."""
        gaps = []
        for worker in self.workers:
            last: Dict[str, float] = {}
            for t, pid, _f, _l in worker.batches:
                if pid in last:
                    gaps.append(t - last[pid])
                last[pid] = t
        return statistics.median(gaps) if gaps else 0.0

    def dump(self) -> None:
        """Every batch and ownership change, for a post-mortem, into the log directory."""
        with open(os.path.join(self.log_dir, "timeline.json"), "w") as handle:
            json.dump([{"owner": w.owner_id, "pid": w.process.pid, "batches": w.batches, "ownership": w.ownership}
                       for w in self.workers], handle)

    async def close(self) -> None:
        self.dump()
        self._stop.set()
        if self._producer is not None and not self._producer.done():
            self._producer.cancel()
            await asyncio.gather(self._producer, return_exceptions=True)
        for worker in self.workers:
            await worker.stop()


# ---------------------------------------------------------------------------- scenarios

async def scale_2_4_2(group: Group) -> Outcome:
    """2 processes, then 4, then 2 again (the added ones stopped gracefully)."""
    started = time.monotonic()
    outcome = Outcome("scale 2 -> 4 -> 2", group.impl, group.partitions)
    first = [await group.spawn(f"{group.impl}-scale-{i}") for i in range(2)]
    await group.start(first)
    more = [await group.spawn(f"{group.impl}-scale-{i}") for i in (2, 3)]
    outcome.settle.append(await group.until(lambda: group.settled(first + more), "4 processes sharing the hub",
                                            SETTLE_TIMEOUT))
    await asyncio.sleep(2.0)
    for worker in more:
        await worker.stop()  # SIGTERM: a graceful stop
    outcome.settle.append(await group.until(lambda: group.settled(first), "2 processes sharing the hub again",
                                            SETTLE_TIMEOUT))
    await asyncio.sleep(2.0)
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


async def rolling_restart(group: Group) -> Outcome:
    """4 processes, each stopped gracefully and started again under its name in turn."""
    started = time.monotonic()
    outcome = Outcome("rolling restart of 4", group.impl, group.partitions)
    running = [await group.spawn(f"{group.impl}-roll-{i}") for i in range(4)]
    await group.start(running)
    for index in range(4):
        stopped = running[index]
        step = time.monotonic()
        await stopped.stop()  # SIGTERM: a graceful stop
        survivors = [w for w in running if w is not stopped]
        await group.until(lambda: group.settled(survivors), f"3 processes sharing the hub after {stopped.owner_id} "
                          "stopped", SETTLE_TIMEOUT)
        running[index] = await group.spawn(stopped.owner_id)  # the same name, as a StatefulSet restarts a pod
        await group.until(lambda: group.settled(running), f"4 processes sharing the hub after {stopped.owner_id} "
                          "restarted", STARTUP_TIMEOUT)
        outcome.settle.append(time.monotonic() - step)
        await asyncio.sleep(1.0)
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


async def standby_takeover(group: Group) -> Outcome:
    """8 processes on 4 partitions; the owner of one partition is SIGKILLed."""
    started = time.monotonic()
    outcome = Outcome("8 processes on 4 partitions, SIGKILL of an owner", group.impl, group.partitions)
    workers = [await group.spawn(f"{group.impl}-standby-{i}") for i in range(8)]
    await group.start(workers)
    await asyncio.sleep(3.0)  # long enough for a checkpoint or two before the crash
    shares = group.shares(workers)
    if shares is None or sorted(shares) != fair_shares(group.partitions, len(workers)):
        raise RuntimeError(f"{group.impl}: the processes did not stay at one partition per owner: {shares}")
    standbys = {w.owner_id for w, share in zip(workers, shares) if share == 0}
    victim = next(w for w, share in zip(workers, shares) if share)
    partition = next(iter(group._recent([victim])))
    victim.kill()
    killed_at = time.time()
    await victim.process.wait()
    survivors = [w for w in workers if w is not victim]

    def resumed() -> List[Tuple[float, str]]:
        return sorted((t, w.owner_id) for w in survivors for (t, p, _f, _l) in w.batches
                      if p == partition and t > killed_at)

    await group.until(lambda: bool(resumed()), f"partition {partition} resumed after the SIGKILL",
                      TAKEOVER_BOUND + 30)
    first_batch_at, taker = resumed()[0]
    outcome.takeover = first_batch_at - killed_at
    outcome.taker_was_standby = taker in standbys
    claims = [t for w in survivors for (t, owned) in w.ownership if partition in owned and t > killed_at]
    outcome.claimed = min(claims) - killed_at if claims else None
    await group.until(lambda: group.settled(survivors), "7 processes sharing the hub", SETTLE_TIMEOUT, fail=False)
    outcome.shares_after = sorted(group.shares(survivors) or [])
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


Scenario = Callable[[Group], Awaitable[Outcome]]
SCENARIOS: Dict[str, Tuple[int, Scenario]] = {
    "scale": (8, scale_2_4_2),
    "rolling": (8, rolling_restart),
    "standby": (4, standby_takeover),
}
"""Scenario name -> (partitions of its hub, the scenario)."""


# ---------------------------------------------------------------------------- the benchmark

def _median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render(outcomes: List[Outcome], rounds: int, command: str, seconds: float) -> str:
    by = {(o.scenario, o.impl): [x for x in outcomes if (x.scenario, x.impl) == (o.scenario, o.impl)]
          for o in outcomes}
    lines = [
        "## Planned moves and crashes with real processes (`moves`)",
        "",
        f"Command: `{command}` ({seconds:.0f} s). {machine_line()}",
        "",
        f"One Event Hubs emulator and one Azurite on 127.0.0.1, started by the benchmark; every processor is an OS "
        f"process (`benchmarks/e2e_worker.py`). *ours*: `EventProcessor` + `EventHubSource` + our "
        f"`BlobCheckpointStore`. *official*: `EventHubConsumerClient.receive_batch` + "
        f"`azure-eventhub-checkpointstoreblob-aio`. Both: GREEDY, load-balancing interval {INTERVAL:g} s, ownership "
        f"expiration {EXPIRY:g} s, batch 100, prefetch 300, a checkpoint every {CHECKPOINT_EVERY} batches, "
        f"{WORK * 1000:.0f} ms in the handler per batch. The producer sends {BATCH} events to every partition every "
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
    lines += ["", "A crash replays what was delivered after the dead owner's last checkpoint. This SDK's receiver hands "
                  "over what has arrived in fewer, larger batches here (one about every 0.2 s per partition, the "
                  "official one about every 0.08 s), so a checkpoint every 10 batches covers more events and a crash "
                  "replays more of them; checkpoint by time or by event count to compare those.",
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


async def _measure(args: argparse.Namespace, hub_conn: str, storage_conn: str, log_dir: str) -> List[Outcome]:
    outcomes = []
    impls = ("ours",) if args.ours_only else IMPLS
    for r in range(args.rounds):
        for name in args.scenarios:
            partitions, scenario = SCENARIOS[name]
            for impl in (impls if r % 2 == 0 else impls[::-1]):
                group = Group(impl=impl, hub=f"moves-{name}-{impl}-{r}", partitions=partitions,
                              hub_connection_string=hub_conn, storage_connection_string=storage_conn, log_dir=log_dir)
                try:
                    outcome = await scenario(group)
                finally:
                    await group.close()
                print(outcome.summary(), file=sys.stderr)
                outcomes.append(outcome)
    return outcomes


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> int:
    """Run the scenarios for both sides and print the tables; ``--record`` writes them.

    Example::

        python -m benchmarks.moves --rounds 2 --record
    """
    parser = program.parser("moves", __doc__, prog)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every scenario per side")
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--ours-only", action="store_true", help="skip the official processor (never recorded)")
    parser.add_argument("--log-dir", help="keep every worker's log and each scenario's timeline of batches here "
                                          "(default: a temporary directory, removed)")

    def body(args: argparse.Namespace) -> int:
        if args.record and (args.ours_only or args.scenarios != list(SCENARIOS)):
            parser.error("partial runs (--ours-only, --scenarios) are never recorded")
        given = list(sys.argv[1:] if argv is None else argv)
        shown = [a for i, a in enumerate(given) if a != "--log-dir" and not a.startswith("--log-dir=")
                 and (i == 0 or given[i - 1] != "--log-dir")]  # where the logs went is no part of the result
        return _run(args, program.recorded_command("moves", shown))

    return program.run(parser, body, argv)


def _run(args: argparse.Namespace, command: str) -> int:
    from emulators.azurite import AzuriteUnavailable, start_azurite
    from emulators.eventhubs.process import EmulatorUnavailable, start_emulator_process

    started = time.monotonic()
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="moves-bench-") as scratch:
        log_dir = args.log_dir or scratch
        try:
            azurite = start_azurite()
        except AzuriteUnavailable as error:
            print(f"moves: Azurite could not start: {error}", file=sys.stderr)
            return 2
        try:
            emulator = start_emulator_process(["--config", _config(os.path.join(scratch, "Config.json"),
                                                                   args.rounds)])
        except EmulatorUnavailable as error:
            azurite.stop()
            print(f"moves: {error}", file=sys.stderr)
            return 2
        try:
            outcomes = asyncio.run(_measure(args, emulator.connection_string, azurite.connection_string, log_dir))
        finally:
            emulator.stop()
            azurite.stop()
    program.report("moves", render(outcomes, args.rounds, command, time.monotonic() - started), args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
