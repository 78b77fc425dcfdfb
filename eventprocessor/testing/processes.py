"""Consumer processes seen from their parent, and the planned-move scenarios they run.

:func:`spawn_worker` starts ``python -m eventprocessor.testing.worker`` (this SDK's
processor or azure-eventhub's, one OS process each) and returns a
:class:`WorkerHandle` that reads what it reports: every delivered batch, the partitions
it dispatches, its ownership changes with their reasons, CPU and memory.

:class:`Group` runs such workers of one implementation on one hub and one blob
container while it produces a steady stream with the official producer, and tells
when they share the hub fairly; :func:`scale_2_4_2`, :func:`rolling_restart` and
:func:`standby_takeover` are the scenarios of ``tests/test_handoff_processes.py`` and
``python -m benchmarks.moves``. Duplicates and losses come from what the handlers
received (each worker prints a line per batch *before* it checkpoints, so a SIGKILL
never hides a delivery). A *pause* is the time from the last batch one process
delivered of a partition to the first batch the next process delivered of it.

Needs the ``[eventhub]`` and ``[blob]`` extras, an Event Hubs endpoint (the project's
emulator) and a storage account (Azurite); nothing here is imported by ``import
eventprocessor.testing``'s other modules.

Example::

    group = Group(impl="ours", hub=hub, partitions=8, hub_connection_string=hub_conn,
                  storage_connection_string=azurite_conn, log_dir=str(tmp_path))
    try:
        outcome = await scale_2_4_2(group)
    finally:
        await group.close()
    assert outcome.duplicates == 0 and outcome.lost == 0
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple

from .worker import HUB_ENV, STORAGE_ENV

__all__ = ["WorkerHandle", "spawn_worker", "create_container", "Group", "Outcome", "SCENARIOS", "CLAIM_BOUND",
           "TAKEOVER_BOUND", "EXPIRY", "INTERVAL", "CHECKPOINT_EVERY", "WORK", "PERIOD", "BATCH", "fair_shares",
           "scale_2_4_2", "rolling_restart", "standby_takeover", "Failover", "stateful_failover", "hub_bodies",
           "stored_states", "standby_replicas", "count_mismatches"]


class WorkerHandle:
    """A worker process seen from its parent: what it delivered, owns and costs.

    ``deliveries`` maps (partition, sequence number) to how many times it was delivered
    by this worker; ``batches`` every delivered batch as (wall time, partition, first,
    last); ``ownership`` every change of the dispatched set as (wall time, partitions);
    ``changes`` every ownership change the processor logged, with its reason;
    ``published`` the utilisation it published (``--balance-by load``).
    """

    def __init__(self, owner_id: str, process: "asyncio.subprocess.Process", stderr_path: str) -> None:
        self.owner_id = owner_id
        self.process = process
        self.stderr_path = stderr_path
        self.started: Optional[Dict[str, Any]] = None
        self.owned: List[str] = []
        self.ownership: List[tuple] = []  # (wall time, partitions dispatched from then on)
        self.changes: List[tuple] = []  # ours: (wall time, partition, reason, epoch) per ownership change
        self.events = 0
        self.cpu = 0.0
        self.stats_at = 0.0
        self.stats: List[tuple] = []  # (wall time, events, CPU seconds, resident bytes or None)
        self.traced: List[Dict[str, Any]] = []  # --tracemalloc-at: what grew most, by allocation site
        self.published: List[tuple] = []  # ours, --balance-by load: (wall time, utilisation it published)
        self.slowed: Optional[Dict[str, Any]] = None  # the "slowed" line (SIGUSR1 with --slow-factor)
        self.checkpoint_timeouts = 0  # ours: checkpoints that timed out, left to the next one
        self.deliveries: Dict[tuple, int] = {}
        self.batches: List[tuple] = []  # (wall time, partition, first, last)
        self.first: Optional[Dict[str, Any]] = None
        self.done: Optional[Dict[str, Any]] = None
        self.restores: List[Dict[str, Any]] = []  # --stateful, --naive: each claim's restored state, in order
        self.checkpoints: List[tuple] = []  # --stateful, --naive: (wall time, partition, sequence number, ms)
        self.lines: List[str] = []
        self.reader: Optional["asyncio.Task[None]"] = None

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            self.lines.append(line)
            del self.lines[:-20]
            try:
                record = json.loads(line)
            except ValueError:
                continue
            kind = record.get("event")
            if kind == "batch":
                span = record["s"]
                numbers = range(span[0], span[1] + 1) if record.get("c") else span
                partition = record["p"]
                for number in numbers:
                    key = (partition, number)
                    self.deliveries[key] = self.deliveries.get(key, 0) + 1
                self.batches.append((record["t"], partition, min(numbers), max(numbers)))
            elif kind == "stats":
                self.events, self.cpu, self.stats_at = record["events"], record["cpu"], record["t"]
                self.stats.append((record["t"], record["events"], record["cpu"], record.get("rss")))
            elif kind == "tracemalloc":
                self.traced.append(record)
            elif kind == "load":
                self.published.append((record["t"], record["u"]))
            elif kind == "slowed":
                self.slowed = record
            elif kind == "checkpoint_timeout":
                self.checkpoint_timeouts += 1
            elif kind == "owned":
                self.owned = record["owned"]
                self.ownership.append((record["t"], record["owned"]))
            elif kind == "ownership":
                self.changes.append((record["t"], record["p"], record["reason"], record["epoch"]))
            elif kind == "restored":
                self.restores.append(record)
            elif kind == "checkpoint":
                self.checkpoints.append((record["t"], record["p"], record["seq"], record["ms"]))
            elif kind == "started":
                self.started = record
            elif kind == "first":
                self.first = record
            elif kind == "done":
                self.done = record

    def kill(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a graceful stop that releases ownership), then SIGKILL."""
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(self.process.wait(), timeout)
            except (ProcessLookupError, asyncio.TimeoutError):
                self.kill()
        await self.process.wait()
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self.reader.cancel()

    def diagnostics(self) -> str:
        try:
            with open(self.stderr_path, errors="replace") as handle:
                stderr = handle.read()[-2000:]
        except OSError:
            stderr = ""
        return (f"--- {self.owner_id} (returncode {self.process.returncode})\nstdout tail:\n"
                + "\n".join(self.lines[-5:]) + f"\nstderr tail:\n{stderr}")


async def create_container(storage_connection_string: str, name: str) -> None:
    """Create a blob container for a worker's checkpoint store (the official store does not)."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob.aio import BlobServiceClient

    async with BlobServiceClient.from_connection_string(storage_connection_string) as service:
        try:
            await service.create_container(name)
        except ResourceExistsError:
            pass


async def spawn_worker(owner_id: str, *, hub: str, container: Optional[str], hub_connection_string: Optional[str],
                       storage_connection_string: Optional[str], log_dir: str,
                       extra: Optional[List[str]] = None) -> WorkerHandle:
    """Start ``python -m eventprocessor.testing.worker`` with the connection strings in its
    environment (none for ``--source memory``), so that they never show in a process
    listing; ``extra`` are more of its options. Its stderr goes to a file in ``log_dir``.

    Example::

        worker = await spawn_worker("p0", hub=hub, container="checkpoints", hub_connection_string=hub_conn,
                                    storage_connection_string=azurite_conn, log_dir=str(tmp_path),
                                    extra=["--interval", "0.5", "--expiry", "3"])
        ...
        await worker.stop()   # SIGTERM: a graceful stop
    """
    # The directory that holds this package goes first on the child's path, so that it
    # runs this very code (a checkout, a worktree) rather than another installed copy.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    for name, value in ((HUB_ENV, hub_connection_string), (STORAGE_ENV, storage_connection_string)):
        if value is not None:
            env[name] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(log_dir, f"{owner_id}.stderr")
    restarts = 0
    while os.path.exists(stderr_path):  # the same name started again: keep the earlier log
        restarts += 1
        stderr_path = os.path.join(log_dir, f"{owner_id}.{restarts}.stderr")
    with open(stderr_path, "wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "eventprocessor.testing.worker", "--hub", hub,
            *(["--container", container] if container else []), "--owner-id", owner_id, *(extra or []),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env)
    handle = WorkerHandle(owner_id, process, stderr_path)
    handle.reader = asyncio.create_task(handle.read())
    return handle


# ---------------------------------------------------------------------------- planned moves

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
    failovers: List["Failover"] = field(default_factory=list)  # stateful_failover: each partition of the victim
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
        for failover in self.failovers:
            parts.append(f"partition {failover.partition}: standbys {failover.standbys}, taken by {failover.taker} "
                         f"({'warm' if failover.warm else 'NOT warm'}), claimed after {failover.claimed}s, "
                         f"restored after {failover.restored}s, delivered after {failover.takeover}s")
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
    standbys: List[str]  # the live processes that published a caught-up replica of it before the kill
    taker: Optional[str] = None  # the process that delivered it first after the kill
    claimed: Optional[float] = None  # seconds from the SIGKILL to the taker's claim
    restored: Optional[float] = None  # seconds from the SIGKILL to the taker's restored state (its initialize)
    takeover: Optional[float] = None  # seconds from the SIGKILL to the taker's first batch
    warm: Optional[bool] = None  # the taker restored it from its warm replica


def _fmt(values: Dict[str, float]) -> str:
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
                 keys: int = 0, worker_options: Optional[List[str]] = None) -> None:
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
        self.workers: List[WorkerHandle] = []
        self.sent = 0
        self._stop = asyncio.Event()
        self._producer: Optional["asyncio.Task[None]"] = None
        self._container_made = False

    @property
    def label(self) -> str:
        """The side's name in results: ``ours``, ``official`` or ``official, checkpoint on close``."""
        return self.impl + (", checkpoint on close" if self.checkpoint_on_close else "")

    @property
    def rate(self) -> float:
        return BATCH * self.partitions / PERIOD

    @property
    def all_partitions(self) -> Set[str]:
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
    def recent(self, workers: List[WorkerHandle]) -> Dict[str, Set[int]]:
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

    def settled(self, workers: List[WorkerHandle]) -> bool:
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
    async def start(self, workers: List[WorkerHandle]) -> float:
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
    outcome = Outcome("scale 2 -> 4 -> 2", group.label, group.partitions)
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
    outcome = Outcome("rolling restart of 4", group.label, group.partitions)
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
    outcome = Outcome("8 processes on 4 partitions, SIGKILL of an owner", group.label, group.partitions)
    workers = [await group.spawn(f"{group.impl}-standby-{i}") for i in range(8)]
    await group.start(workers)
    await asyncio.sleep(3.0)  # long enough for a checkpoint or two before the crash
    shares = group.shares(workers)
    if shares is None or sorted(shares) != fair_shares(group.partitions, len(workers)):
        raise RuntimeError(f"{group.label}: the processes did not stay at one partition per owner: {shares}")
    standbys = {w.owner_id for w, share in zip(workers, shares) if share == 0}
    victim = next(w for w, share in zip(workers, shares) if share)
    partition = next(iter(group.recent([victim])))
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


# ---------------------------------------------------------------------------- stateful groups

def _scope(group: Group) -> Tuple[str, str, str]:
    started = next((w.started for w in group.workers if w.started), None)
    if started is None:
        raise RuntimeError(f"{group.label}: no worker said where it reads (no 'started' line)")
    return started["namespace"], started["eventhub"], "$default"


async def hub_bodies(connection_string: str, hub: str, *, consumer_group: str = "$default",
                     timeout: float = 60.0) -> Dict[str, List[str]]:
    """Every event the hub holds, read back with azure-eventhub's consumer: partition ->
    the bodies as text, indexed by sequence number. Read it once the workers stopped (a
    receiver without an owner level is refused beside theirs on one consumer group)."""
    from azure.eventhub.aio import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group=consumer_group,
                                                           eventhub_name=hub)
    async with client:
        ends = {pid: (await client.get_partition_properties(pid))["last_enqueued_sequence_number"]
                for pid in await client.get_partition_ids()}
        received: Dict[str, Dict[int, str]] = {pid: {} for pid in ends}
        complete = asyncio.Event()

        async def on_batch(context: Any, events: List[Any]) -> None:
            for event in events:
                received[context.partition_id][event.sequence_number] = event.body_as_str()
            if all(len(received[pid]) >= end + 1 for pid, end in ends.items()):
                complete.set()

        if all(end < 0 for end in ends.values()):
            complete.set()
        task = asyncio.create_task(client.receive_batch(on_batch, starting_position="-1", max_batch_size=300))
        try:
            await asyncio.wait_for(complete.wait(), timeout)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    bodies: Dict[str, List[str]] = {}
    for pid, end in ends.items():
        if sorted(received[pid]) != list(range(end + 1)):
            raise RuntimeError(f"partition {pid} of hub {hub}: read back sequence numbers other than 0..{end}")
        bodies[pid] = [received[pid][n] for n in range(end + 1)]
    return bodies


async def stored_states(group: Group) -> Dict[str, Tuple[int, Dict[str, Any]]]:
    """What a new owner of each partition would restore now, read from the group's
    Blob container with this SDK's own restore (``StateKeeper.restore``): partition ->
    (the checkpoint's sequence number, -1 without one; the per-key counts, padding left
    out)."""
    from stores.blob import BlobCheckpointStore

    from ..state import StateKeeper, StateLog
    from .worker import PAD_PREFIX

    scope = _scope(group)
    states: Dict[str, Tuple[int, Dict[str, Any]]] = {}
    async with BlobCheckpointStore.from_connection_string(group.storage_connection_string, group.container) as store:
        checkpoints = {c.partition_id: c for c in await store.list_checkpoints(*scope)}
        for pid in sorted(group.all_partitions, key=int):
            checkpoint = checkpoints.get(pid)
            keeper = StateKeeper(StateLog(store, scope, pid), epoch=0)
            await keeper.restore(checkpoint)
            states[pid] = (checkpoint.sequence_number if checkpoint is not None else -1,
                           {k: v for k, v in keeper.state.items() if not k.startswith(PAD_PREFIX)})
    return states


async def standby_replicas(group: Group, acceptable_recovery_lag: int = 10_000) -> Dict[str, Set[str]]:
    """Partition -> the processes whose member record publishes a replica of it within
    ``acceptable_recovery_lag`` events (what failover chooses from)."""
    from stores.blob import BlobCheckpointStore

    from ..state.replica import LAGS_PROPERTY, decode_lags

    async with BlobCheckpointStore.from_connection_string(group.storage_connection_string, group.container) as store:
        listing = await store.list_members(*_scope(group))
    replicas: Dict[str, Set[str]] = {}
    for member in listing.members:
        for pid, lag in decode_lags(member.properties.get(LAGS_PROPERTY)).items():
            if lag <= acceptable_recovery_lag:
                replicas.setdefault(pid, set()).add(member.owner_id)
    return replicas


def count_mismatches(group: Group, bodies: Dict[str, List[str]],
                     states: Optional[Dict[str, Tuple[int, Dict[str, Any]]]] = None) -> List[str]:
    """Where a per-key count differs from the events the hub holds: every state a claim
    restored (it must equal the count of the events up to the checkpoint it resumed
    from) and, given ``states``, the state in the store at the end (its checkpoint must
    be at the last event, its counts those of the whole partition). Empty: exact."""
    problems = []
    for worker in group.workers:
        for restored in worker.restores:
            pid, seq = restored["p"], restored["seq"]
            expected = dict(Counter(bodies[pid][:seq + 1]))
            if restored["counts"] != expected:
                problems.append(f"{worker.owner_id} restored partition {pid} at sequence number {seq} with counts "
                                f"{restored['counts']}, the hub's events up to it say {expected}")
    for pid, (seq, counts) in sorted((states or {}).items()):
        if seq != len(bodies[pid]) - 1:
            problems.append(f"partition {pid}: the last checkpoint is at sequence number {seq}, the hub holds "
                            f"{len(bodies[pid])} events")
        expected = dict(Counter(bodies[pid][:seq + 1]))
        if counts != expected:
            problems.append(f"partition {pid}: the stored state counts {counts}, the hub's events up to its "
                            f"checkpoint say {expected}")
    return problems


async def stateful_failover(group: Group, processes: int = 3) -> Outcome:
    """Stateful processes with standbys (the group's ``worker_options`` say
    ``--stateful --standbys N``); once every partition has a caught-up standby, the owner
    of the most partitions is SIGKILLed and each of its partitions must go to one of
    its standbys, restored from the warm replica."""
    started = time.monotonic()
    outcome = Outcome(f"{processes} stateful processes with standbys, SIGKILL of an owner", group.label,
                      group.partitions)
    workers = [await group.spawn(f"{group.impl}-stateful-{i}") for i in range(processes)]
    await group.start(workers)
    replicas: Dict[str, Set[str]] = {}
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:  # every partition has a caught-up standby that does not own it
        shares = group.shares(workers)
        owners = {pid: w.owner_id for w in workers for pid in w.owned}
        replicas = await standby_replicas(group)
        if shares is not None and all(replicas.get(pid, set()) - {owner} for pid, owner in owners.items()) \
                and len(owners) == group.partitions:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{group.label}: no caught-up standby of every partition within {SETTLE_TIMEOUT:.0f}s: "
                               f"{replicas}\n" + "\n".join(w.diagnostics() for w in workers))
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)  # a few checkpoints more, which the standbys follow
    victim = max(workers, key=lambda w: (len(w.owned), w.owner_id))
    partitions = list(victim.owned)
    replicas = await standby_replicas(group)
    outcome.failovers = [Failover(pid, sorted(replicas.get(pid, set()) - {victim.owner_id})) for pid in partitions]
    victim.kill()
    killed_at = time.time()
    await victim.process.wait()
    survivors = [w for w in workers if w is not victim]

    def first_batch(pid: str) -> Optional[Tuple[float, WorkerHandle]]:
        return min(((t, w) for w in survivors for (t, p, _f, _l) in w.batches if p == pid and t > killed_at),
                   key=lambda tw: tw[0], default=None)

    await group.until(lambda: all(first_batch(pid) is not None for pid in partitions),
                      f"partitions {partitions} resumed after the SIGKILL", TAKEOVER_BOUND + 30)
    for failover in outcome.failovers:
        found = first_batch(failover.partition)
        assert found is not None
        at, taker = found
        failover.taker, failover.takeover = taker.owner_id, round(at - killed_at, 2)
        claims = [t for (t, owned) in taker.ownership if failover.partition in owned and t > killed_at]
        failover.claimed = round(min(claims) - killed_at, 2) if claims else None
        restores = [r for r in taker.restores if r["p"] == failover.partition and r["t"] > killed_at]
        if restores:
            failover.restored = round(restores[0]["t"] - killed_at, 2)
            failover.warm = bool(restores[0]["warm"])
    outcome.takeover = max(f.takeover for f in outcome.failovers if f.takeover is not None)
    outcome.taker_was_standby = all(f.taker in f.standbys for f in outcome.failovers)
    await group.until(lambda: group.settled(survivors), f"{len(survivors)} processes sharing the hub", SETTLE_TIMEOUT,
                      fail=False)
    outcome.shares_after = sorted(group.shares(survivors) or [])
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome
