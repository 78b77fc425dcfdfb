"""A group of worker processes on one hub and one blob container, and what it measured.

:class:`Group` runs workers of one implementation while it produces a steady stream
with the official producer, and tells when they share the hub fairly; :class:`Outcome`
is what a scenario measured from the handlers' deliveries (each worker prints a line
per batch *before* it checkpoints, so a SIGKILL never hides a delivery). A *pause* is
the time from the last batch one process delivered of a partition to the first batch
the next process delivered of it. The constants are the timings the scenarios run with.

Example::

    group = Group(impl="ours", hub=hub, partitions=8, hub_connection_string=hub_conn,
                  storage_connection_string=azurite_conn, log_dir=str(tmp_path))
    try:
        workers = [await group.spawn(f"w{i}") for i in range(2)]
        await group.start(workers)
    finally:
        await group.close()
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .worker.process import WorkerHandle, create_container, spawn_worker

__all__ = ["Group", "Outcome", "Failover", "CLAIM_BOUND", "TAKEOVER_BOUND", "EXPIRY", "INTERVAL",
           "CHECKPOINT_EVERY", "WORK", "PERIOD", "BATCH", "fair_shares"]


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

Key = tuple[str, int]


def fair_shares(partitions: int, processes: int) -> list[int]:
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
    longest: dict[str, float] = field(default_factory=dict)  # the longest single pause per partition
    total: dict[str, float] = field(default_factory=dict)  # all pauses per partition, added up
    steady_gap: float = 0.0
    seconds: float = 0.0
    settle: list[float] = field(default_factory=list)  # seconds to settle after each step
    failovers: list[Failover] = field(default_factory=list)  # stateful_failover: each partition of the victim
    takeover: float | None = None  # standby: SIGKILL to the partition's first batch elsewhere
    claimed: float | None = None  # standby: SIGKILL to the claim (ours reports its claims)
    taker_was_standby: bool | None = None
    shares_after: list[int] = field(default_factory=list)
    changes: dict[str, int] = field(default_factory=dict)  # ours: ownership changes by reason, from its logs

    def summary(self) -> str:
        parts = [f"{self.scenario} ({self.impl}, {self.partitions} partitions, {self.produced} events): duplicates "
                 f"{self.duplicates}, lost {self.lost}, {self.moves} moves"]
        if self.takeover is not None:
            claim = f"claimed after {self.claimed:.2f}s, " if self.claimed is not None else ""
            parts.append(f"SIGKILL: {'a standby' if self.taker_was_standby else 'NOT a standby'} {claim}delivered "
                         f"after {self.takeover:.2f}s (bounds {CLAIM_BOUND:.1f}s and {TAKEOVER_BOUND:.1f}s); shares "
                         f"after {self.shares_after}")
        for failover in self.failovers:
            moved_on = f", then moved to {failover.owners[1:]}" if len(failover.owners) > 1 else ""
            parts.append(f"partition {failover.partition}: standbys {failover.standbys}, taken by {failover.taker} "
                         f"({'warm' if failover.warm else 'NOT warm'}), claimed after {failover.claimed}s, "
                         f"restored after {failover.restored}s, delivered after {failover.takeover}s{moved_on}")
        if self.changes:
            changes = ", ".join(f"{reason} {n}" for reason, n in sorted(self.changes.items()))
            parts.append(f"ownership changes {changes}")
        if self.settle:
            parts.append("settled after each step in " + ", ".join(f"{s:.1f}" for s in self.settle) + " s")
        parts.append(f"paused per partition (s, all moves) {_fmt(self.total)}; longest single pause "
                     f"{_fmt(self.longest)}; steady gap between batches {self.steady_gap:.2f}s; {self.seconds:.0f}s")
        return "; ".join(parts)


@dataclass
class Failover:
    """One partition of a SIGKILLed stateful owner (:func:`stateful_failover`)."""

    partition: str
    standbys: list[str]  # its standbys before the kill: planned by the SDK, each publishing a caught-up replica
    taker: str | None = None  # the process that claimed it first after the kill (the failover)
    claimed: float | None = None  # seconds from the SIGKILL to the taker's claim
    restored: float | None = None  # seconds from the SIGKILL to the taker's restored state (its initialize)
    takeover: float | None = None  # seconds from the SIGKILL to its first batch after it (the pause)
    warm: bool | None = None  # the taker restored it from its warm replica
    owners: list[str] = field(default_factory=list)  # the processes that held it after the kill, in turn


def _fmt(values: dict[str, float]) -> str:
    return "{" + ", ".join(f"{pid}: {seconds:.2f}" for pid, seconds in
                           sorted(values.items(), key=lambda kv: int(kv[0]))) + "}"


class Group:
    """Worker processes of one implementation on one hub and one container, and the
    producer feeding the hub.

    ``impl`` is ``"ours"`` or ``"official"``; ``checkpoint_on_close`` (official only)
    makes its workers also checkpoint in ``on_partition_close``, as a careful user of the
    official client would. :attr:`label` names the side in results. ``keys`` and
    ``worker_options`` make a stateful group: events with keys, workers that count them
    (``worker_options=["--stateful"]``); :func:`stored_states` and :func:`hub_bodies`
    then say what the store holds and what the hub holds."""

    def __init__(self, *, impl: str, hub: str, partitions: int, hub_connection_string: str,
                 storage_connection_string: str, log_dir: str, checkpoint_on_close: bool = False,
                 keys: int = 0, worker_options: list[str] | None = None) -> None:
        if impl not in ("ours", "official"):
            raise ValueError(f"impl must be 'ours' or 'official', not {impl!r}")
        if checkpoint_on_close and impl != "official":
            raise ValueError("checkpoint_on_close is for the official processor (this SDK checkpoints on release "
                             "by itself)")
        self.impl = impl
        self.checkpoint_on_close = checkpoint_on_close
        self.keys = keys
        """Events carry one of this many keys as their body (``k0``, ``k1``, ...; drawn at
        random); 0: every body is ``e``. Stateful workers count per key."""
        self.worker_options = list(worker_options or [])
        """More options for every worker (``--stateful``, ``--standbys 1``, ...)."""
        self.hub = hub
        self.partitions = partitions
        self.hub_connection_string = hub_connection_string
        self.storage_connection_string = storage_connection_string
        self.container = f"moves-{impl}{'-close' if checkpoint_on_close else ''}-{uuid.uuid4().hex[:10]}"
        self.log_dir = os.path.join(log_dir, self.container)
        os.makedirs(self.log_dir, exist_ok=True)
        self.workers: list[WorkerHandle] = []
        self.sent = 0
        self._stop = asyncio.Event()
        self._producer: asyncio.Task[None] | None = None
        self._container_made = False

    @property
    def label(self) -> str:
        """The side's name in results: ``ours``, ``official`` or ``official, checkpoint on close``."""
        return self.impl + (", checkpoint on close" if self.checkpoint_on_close else "")

    @property
    def rate(self) -> float:
        return BATCH * self.partitions / PERIOD

    @property
    def all_partitions(self) -> set[str]:
        return set(map(str, range(self.partitions)))

    async def spawn(self, owner_id: str) -> WorkerHandle:
        """Start one more worker process named ``owner_id``."""
        if not self._container_made:  # the official store does not create its container
            await create_container(self.storage_connection_string, self.container)
            self._container_made = True
        options = ["--impl", self.impl, "--interval", str(INTERVAL), "--expiry", str(EXPIRY), "--strategy",
                   "greedy", "--batch", "100", "--prefetch", "300", "--checkpoint-every", str(CHECKPOINT_EVERY),
                   "--work", str(WORK), "--log-level", "INFO"]
        if self.checkpoint_on_close:
            options.append("--checkpoint-on-close")
        options += self.worker_options
        worker = await spawn_worker(owner_id, hub=self.hub, container=self.container,
                                    hub_connection_string=self.hub_connection_string,
                                    storage_connection_string=self.storage_connection_string, log_dir=self.log_dir,
                                    extra=options)
        self.workers.append(worker)
        return worker

    # ------------------------------------------------------------------ who delivers what
    def recent(self, workers: list[WorkerHandle]) -> dict[str, set[int]]:
        """Partition -> indexes (in ``workers``) of the processes that delivered it lately."""
        since = time.time() - WINDOW
        result: dict[str, set[int]] = {}
        for index, worker in enumerate(workers):
            for t, pid, _first, _last in reversed(worker.batches):
                if t < since:
                    break
                result.setdefault(pid, set()).add(index)
        return result

    def shares(self, workers: list[WorkerHandle]) -> list[int] | None:
        """How many partitions each of ``workers`` has, if together they deliver every
        partition, each from one of them; else None. Ours says what it owns (and must be
        delivering it); the official processor is judged by its deliveries alone."""
        recent = self.recent(workers)
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

    def settled(self, workers: list[WorkerHandle]) -> bool:
        shares = self.shares(workers)
        return shares is not None and sorted(shares) == fair_shares(self.partitions, len(workers))

    async def until(self, condition: Callable[[], bool], what: str, timeout: float, *, fail: bool = True) -> float:
        started = time.monotonic()
        while not condition():
            if time.monotonic() - started > timeout:
                if not fail:
                    break
                raise TimeoutError(f"{self.label}: {what} did not happen within {timeout:.0f}s\n"
                                   + "\n".join(w.diagnostics() for w in self.workers))
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    # ------------------------------------------------------------------ events
    async def start(self, workers: list[WorkerHandle]) -> float:
        """Produce, and wait until ``workers`` share every partition fairly and deliver it."""
        self._producer = asyncio.create_task(self._produce())
        return await self.until(lambda: self.settled(workers), f"{len(workers)} processes sharing the hub",
                                STARTUP_TIMEOUT)

    async def _produce(self) -> None:
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        producer = EventHubProducerClient.from_connection_string(self.hub_connection_string, eventhub_name=self.hub)
        rng = random.Random(self.hub)

        def body() -> bytes:
            return f"k{rng.randrange(self.keys)}".encode() if self.keys else b"e"

        async with producer:
            rounds, started = 0, time.monotonic()
            while not self._stop.is_set():
                await asyncio.gather(*(producer.send_batch([EventData(body()) for _ in range(BATCH)],
                                                           partition_id=pid) for pid in sorted(self.all_partitions)))
                self.sent += BATCH * self.partitions
                rounds += 1
                # Steady, not catching up: a late round is not followed by a burst.
                started = max(started, time.monotonic() - rounds * PERIOD)
                await asyncio.sleep(max(0.0, started + rounds * PERIOD - time.monotonic()))

    def delivered(self) -> set[Key]:
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

    def moves(self) -> dict[str, list[tuple[float, float]]]:
        """Each change of the process delivering each partition, in time order: (the old
        process's last batch, the new one's first batch). By process, not by name: a
        process restarted under the same name is a move too."""
        result: dict[str, list[tuple[float, float]]] = {}
        for pid in sorted(self.all_partitions, key=int):
            batches = sorted((t, index) for index, w in enumerate(self.workers)
                             for (t, p, _f, _l) in w.batches if p == pid)
            result[pid] = [(a_t, b_t) for (a_t, a), (b_t, b) in zip(batches, batches[1:], strict=False) if a != b]
        return result

    def steady_gap(self) -> float:
        """The median time between two consecutive batches of one partition in one process."""
        gaps = []
        for worker in self.workers:
            last: dict[str, float] = {}
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
