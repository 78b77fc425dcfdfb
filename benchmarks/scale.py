"""Scale on real storage: many processors in separate OS processes, one Blob store on Azurite.

Run it with ``python -m benchmarks.scale`` (or ``eventprocessor bench scale``); ``--record``
writes its section of ``benchmarks/RESULTS.md``. It starts a fresh Azurite (in-memory, on
127.0.0.1) for each size ``PxN`` (P partitions, N processors; ``1024x16,2048x16,4096x32``
by default, smallest first):

1. **Measures the listing cost** on this machine: P ownership records are written to a
   scratch container and listed ``--calibration-listings`` times; the client's CPU
   (this process) and Azurite's CPU (``/proc``) per listing are the medians. Just before,
   it samples how many cores the machine leaves idle (other users' work counts as busy).
2. **Sizes the timing from it** (:func:`choose_timing`, the rule in docs/concepts/timing.md, "Sizing"):
   with c the CPU seconds of one listing (client + Azurite) and C the cores the
   processors can count on (the idle ones, at least a quarter of the machine),
   ``I = N·c / (f·C)`` rounded up to whole seconds (at least ``--min-interval``), so the
   listings of all N processors use at most the fraction ``f`` (``--cpu-budget``, 0.5)
   of C; ``E = 5·I`` (the ratio of this SDK's defaults); for ours ``R = E/2`` and the
   Blob store's ``operation_timeout`` at least the store timeout derived from them. A
   size whose two sides could outlast what is left of ``--budget-minutes`` (15) is
   sized and reported, not run.
3. **Runs each side** with that I and E and the same strategy (GREEDY by default), as N
   separate OS processes (``benchmarks/scale_worker.py``) started together once all have
   imported: *ours* is ``EventProcessor`` + this SDK's ``BlobCheckpointStore``; *official*
   is azure-eventhub's own ``EventProcessor`` class with
   ``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``, given a stand-in
   client (same partition ids, idle consumers instead of AMQP links; ours reads an empty
   in-memory source, so neither side spends anything on events). Each side gets its own
   container on the same Azurite; the order of the sides alternates from size to size.

Measured per side: seconds and ticks from the common start to balanced (every partition
dispatched by exactly one processor, shares differing by at most one), then held for
``R + E/10`` (every lease of ours renewed at least once); missed renewals (must be 0),
overrun ticks and overrun WARNING lines, HTTP requests per second counted at each
worker's transport, CPU per processor (``time.process_time`` in the worker), Azurite's
CPU and the longest event-loop stall of any processor, per phase. At the end, one
listing of the store checks that every partition's record names exactly one live
processor, is not expired, and agrees with what that processor dispatches.

Every phase is bounded in time; every worker and Azurite are stopped on the way out,
failures and SIGTERM included. A size that does not balance in time is reported as such,
with what was owned, never as a success. The exit status is 1 when ours missed a check.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from . import program
from .e2e import _cpu_seconds as process_cpu_seconds
from .e2e_worker import WorkerHandle
from .results import machine_line
from .scale_worker import NAMESPACE, STORAGE_ENV

__all__ = ["main", "choose_timing", "Calibration", "Sizing", "SideResult"]

logger = logging.getLogger(__name__)

IMPLS = ("ours", "official")
DEFAULT_SIZES = "1024x16,2048x16,4096x32"
QUICK_SIZES = "8x2"
CONSUMER_GROUP = "$default"
EXPIRATION_RATIO = 5.0  # this SDK's defaults: 15 s interval, 75 s expiration


def _cpu_seconds(pid: Optional[int]) -> Optional[float]:
    """User + system CPU seconds of a process (Linux ``/proc``), or None."""
    return None if pid is None else process_cpu_seconds(pid)


def _cpu_times() -> Optional[Tuple[float, float]]:
    """(idle, total) jiffies of the whole machine from ``/proc/stat``, or None."""
    try:
        with open("/proc/stat") as handle:
            values = [float(v) for v in handle.readline().split()[1:]]
        return values[3] + values[4], sum(values)
    except (OSError, IndexError, ValueError):
        return None


async def idle_cores(seconds: float) -> Optional[float]:
    """How many cores the machine left idle over ``seconds`` (from ``/proc/stat``), or None."""
    before = _cpu_times()
    await asyncio.sleep(seconds)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (os.cpu_count() or 1) * (after[0] - before[0]) / (after[1] - before[1])


def _load_average() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# --------------------------------------------------------------------------- sizing


@dataclass(frozen=True)
class Calibration:
    """The measured cost of listing ``partitions`` ownership records once."""

    partitions: int
    listings: int
    client_cpu: float  # seconds, median
    server_cpu: Optional[float]  # Azurite's seconds, median (None when it is not ours to read)
    wall: float  # seconds, median
    idle_cores: Optional[float] = None  # cores idle just before (other users' work counted as busy)
    server_write_cpu: Optional[float] = None  # Azurite's seconds per record written (claims), mean

    @property
    def cpu(self) -> float:
        return self.client_cpu + (self.server_cpu or 0.0)

    @property
    def client_ms_per_record(self) -> float:
        return 1000 * self.client_cpu / self.partitions

    @property
    def server_ms_per_record(self) -> Optional[float]:
        return None if self.server_cpu is None else 1000 * self.server_cpu / self.partitions


@dataclass(frozen=True)
class Sizing:
    """The settings the rule chose, and what they imply (seconds)."""

    interval: float  # I, both sides
    expiration: float  # E, both sides
    renewal_age: float  # ours: ownership_renewal_age R
    store_timeout: float  # ours: store_timeout T, derived by the processor from E and R
    operation_timeout: float  # ours: the Blob store's own operation_timeout
    lease: float  # ours: E minus the safety margin
    herd: float  # N simultaneous listings on the machine's cores: N·c/C
    listing_load: float  # cores all processors spend listing, at one listing per interval each
    cores: float  # C: the cores the rule sized for
    store_load: Optional[float] = None  # the share of the store's one thread that listings take: N·s/I
    burst: Optional[float] = None  # B = N·s + 2·P·w: the store's seconds of work when every processor starts
    bound_by: str = "client CPU"  # which term of the rule chose I

    @property
    def hold(self) -> float:
        """How long a side keeps running once balanced: every lease of ours is renewed once."""
        return self.renewal_age + 0.1 * self.expiration

    @property
    def stall_room(self) -> float:
        """How long ours may be unable to run (a stalled event loop) between two renewal
        attempts and still keep its leases: the lease minus the renewal age."""
        return self.lease - self.renewal_age


def choose_timing(listing_cpu: float, processors: int, cores: float, *, budget: float = 0.5,
                  min_interval: float = 1.0, store_listing: Optional[float] = None,
                  store_write: Optional[float] = None, partitions: int = 0) -> Sizing:
    """The sizing rule (docs/concepts/timing.md, "Sizing"), from the measured CPU of one listing.

    * ``I = ⌈N·c / (f·C)⌉`` (at least ``min_interval``): the listings of all N
      processors, one per interval each, use at most ``f`` (``budget``) of the C cores.
    * the store, when its own cost is known (Azurite is one Node.js thread: one core at
      most, whatever the machine has): with ``s`` its seconds per listing
      (``store_listing``), ``I ≥ ⌈N·s / f⌉``, so listings take at most ``f`` of its
      thread; and with ``w`` its seconds per record written (``store_write``), the
      start-up burst ``B = N·s + 2·P·w`` (every processor lists, a greedy start writes
      every claim and its checkpoint fence) fits in the store timeout,
      ``T ≈ 0.67·I ≥ B``, that is ``I ≥ ⌈1.5·B⌉``. A store that gets more than it can
      do queues the rest, every call times out, and the processors back off (see
      ``eventprocessor.backoff``); these terms keep the benchmark out of that regime.
    * ``E = 5·I``: the ratio of this SDK's defaults (15 s / 75 s); the official
      processor, which rewrites its records at every tick, has four ticks to spare.
    * ``R = E/2`` (ours): the lease minus R, ``0.4·E = 2·I``, is how long a processor may
      be unable to renew (its event loop held by a listing's XML parsing while N
      processes share C cores: up to ``N·c/C = f·I``) and still keep its leases, and the
      store timeout the processor derives from it, ``(0.9·E − R)/3 ≈ 0.67·I``, exceeds
      the start-up herd ``N·c/C`` (every processor listing at once).
    * the store's own ``operation_timeout`` is raised to that store timeout when it is
      longer than the default 10 s, so the store does not cut a listing first.

    Example::

        >>> s = choose_timing(0.45, 16, 2)
        >>> (s.interval, s.expiration, s.renewal_age, round(s.store_timeout, 2))
        (8.0, 40.0, 20.0, 5.33)
    """
    from eventprocessor.processor import Timing
    from stores._account import DEFAULT_OPERATION_TIMEOUT

    if listing_cpu <= 0 or processors < 1 or cores <= 0 or not 0 < budget <= 1:
        raise ValueError("listing_cpu, processors, cores and budget must be positive (budget at most 1)")
    terms = {"client CPU": float(math.ceil(processors * listing_cpu / (budget * cores)))}
    burst = None
    if store_listing:
        terms["the store's thread"] = float(math.ceil(processors * store_listing / budget))
        burst = processors * store_listing + 2 * partitions * (store_write or 0.0)
        terms["the start-up burst"] = float(math.ceil(1.5 * burst))
    bound_by = max(terms, key=lambda k: terms[k])
    interval = max(float(min_interval), terms[bound_by])
    store_load_at = processors * store_listing / interval if store_listing else None
    expiration = EXPIRATION_RATIO * interval
    timing = Timing.derive(interval=interval, expiration=expiration, renewal_age=expiration / 2, store_timeout=None,
                           shutdown_timeout=30.0, handler_timeout=None)
    return Sizing(interval=interval, expiration=expiration, renewal_age=timing.renewal_age,
                  store_timeout=timing.store_timeout,
                  operation_timeout=max(DEFAULT_OPERATION_TIMEOUT, math.ceil(timing.store_timeout)),
                  lease=timing.lease_length, herd=processors * listing_cpu / cores,
                  listing_load=processors * listing_cpu / interval, cores=cores, store_load=store_load_at,
                  burst=burst, bound_by=bound_by if interval > min_interval else "the minimum interval")


async def calibrate(connection_string: str, partitions: int, listings: int, azurite_pid: Optional[int],
                    idle_sample: float = 5.0) -> Calibration:
    """Write ``partitions`` ownership records to a scratch container and time listing them."""
    from eventprocessor.errors import CheckpointStoreError
    from eventprocessor.records import Ownership
    from stores.blob import BlobCheckpointStore

    container = f"scale-calibration-{partitions}-{uuid.uuid4().hex[:6]}"
    hub = "calibration"
    idle = await idle_cores(idle_sample)
    async with BlobCheckpointStore.from_connection_string(connection_string, container, operation_timeout=60) as store:
        await store.list_ownership(NAMESPACE, hub, CONSUMER_GROUP)  # creates the container
        gate = asyncio.Semaphore(32)

        async def claim(index: int) -> None:
            record = Ownership(NAMESPACE, hub, CONSUMER_GROUP, str(index), f"calibration-{index % 16}", epoch=1)
            for attempt in range(5):  # a busy machine may time a write out; a lost answer reads as lost race
                async with gate:
                    try:
                        won = await store.claim_ownership([record])
                    except CheckpointStoreError:
                        if attempt == 4:
                            raise
                        continue
                if won:
                    return
                current = {r.partition_id: r for r in (await store.list_ownership(NAMESPACE, hub,
                                                                                  CONSUMER_GROUP)).ownerships}
                if str(index) in current:
                    return

        written0 = _cpu_seconds(azurite_pid)
        await asyncio.gather(*(claim(i) for i in range(partitions)))
        written1 = _cpu_seconds(azurite_pid)
        write_cpu = None if written0 is None or written1 is None else (written1 - written0) / partitions
        client, server, wall = [], [], []
        for _ in range(listings):
            cpu0, azurite0, wall0 = time.process_time(), _cpu_seconds(azurite_pid), time.perf_counter()
            listing = await store.list_ownership(NAMESPACE, hub, CONSUMER_GROUP)
            wall.append(time.perf_counter() - wall0)
            client.append(time.process_time() - cpu0)
            azurite1 = _cpu_seconds(azurite_pid)
            if azurite0 is not None and azurite1 is not None:
                server.append(azurite1 - azurite0)
            if len(listing.ownerships) != partitions:
                raise RuntimeError(f"calibration listed {len(listing.ownerships)} records, expected {partitions}")
    await Runner.delete_container(connection_string, container)
    return Calibration(partitions, listings, statistics.median(client),
                       statistics.median(server) if server else None, statistics.median(wall), idle, write_cpu)


# --------------------------------------------------------------------------- workers


class Worker(WorkerHandle):
    """One worker process seen from the parent (stopping, killing and diagnostics are
    :class:`~benchmarks.e2e_worker.WorkerHandle`'s): its reports, in order."""

    def __init__(self, owner_id: str, process: "asyncio.subprocess.Process", stderr_path: str) -> None:
        super().__init__(owner_id, process, stderr_path)
        self.ready = False
        self.owned_set: Set[str] = set()
        self.owned_since = 0.0  # the report time at which ``owned_set`` became what it is
        self.states: List[Dict[str, Any]] = []
        self.stopped = False

    @property
    def last(self) -> Dict[str, Any]:
        return self.states[-1] if self.states else {}

    def at(self, t: float) -> Dict[str, Any]:
        """The last report made at or before ``t`` (or the first one)."""
        found = self.states[0] if self.states else {}
        for state in self.states:
            if state["t"] > t:
                break
            found = state
        return found

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            try:
                record = json.loads(raw)
            except ValueError:
                self.lines = (self.lines + [raw.decode(errors="replace").strip()])[-20:]
                continue
            kind = record.get("event")
            if kind == "state":
                if "owned" in record:
                    self.owned_set = set(record.pop("owned"))
                    self.owned_since = record["t"]
                self.states.append(record)
            elif kind == "ready":
                self.ready = True
            elif kind == "stopped":
                self.stopped = True

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")


async def spawn(impl: str, owner_id: str, *, container: str, hub: str, partitions: int, sizing: Sizing,
                strategy: str, connection_string: str, log_dir: str, lifetime: float, report_every: float) -> Worker:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env[STORAGE_ENV] = connection_string
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(log_dir, f"{owner_id}.stderr")
    with open(stderr_path, "wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.scale_worker", "--impl", impl, "--container", container, "--hub", hub,
            "--owner-id", owner_id, "--partitions", str(partitions), "--interval", f"{sizing.interval:g}",
            "--expiry", f"{sizing.expiration:g}", "--strategy", strategy, "--lifetime", f"{lifetime:.0f}",
            "--report-every", f"{report_every:g}",
            *(["--renewal-age", f"{sizing.renewal_age:g}", "--operation-timeout", f"{sizing.operation_timeout:g}"]
              if impl == "ours" else []),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr, cwd=root, env=env,
            limit=1 << 20)
    worker = Worker(owner_id, process, stderr_path)
    worker.reader = asyncio.create_task(worker.read())
    return worker


# --------------------------------------------------------------------------- one side


@dataclass
class Phase:
    """Totals over one phase of one side: wall seconds, requests, CPU per processor, Azurite CPU."""

    seconds: float = 0.0
    requests: int = 0
    cpu: List[float] = field(default_factory=list)  # seconds, per processor
    azurite_cpu: Optional[float] = None

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else float("nan")

    def core_share(self) -> Tuple[float, float]:
        """Mean and max CPU per processor, as a fraction of one core."""
        if not self.cpu or self.seconds <= 0:
            return float("nan"), float("nan")
        shares = [c / self.seconds for c in self.cpu]
        return statistics.mean(shares), max(shares)

    @property
    def azurite_share(self) -> Optional[float]:
        return None if self.azurite_cpu is None or self.seconds <= 0 else self.azurite_cpu / self.seconds


@dataclass
class SideResult:
    impl: str
    partitions: int
    processors: int
    balanced_after: Optional[float] = None  # seconds from the common start
    ticks_to_balanced: Optional[int] = None  # the busiest processor's ticks by then
    converge: Phase = field(default_factory=Phase)
    hold: Phase = field(default_factory=Phase)
    counters: Dict[str, int] = field(default_factory=dict)  # summed over processors, at the end
    max_tick: float = 0.0
    loop_lag: float = 0.0  # the longest event-loop stall in any processor (s)
    moved_while_held: int = 0
    final_owned: int = 0  # partitions whose record names exactly one live, dispatching processor
    problems: List[str] = field(default_factory=list)
    shares: Tuple[int, int] = (0, 0)  # min and max partitions per processor at the end
    spawn_seconds: float = 0.0
    drain_wait: float = 0.0  # seconds Azurite needed to go idle before this side started
    backoff_level: int = 0  # the highest backoff level any processor of ours reported

    @property
    def every_partition_owned_once(self) -> bool:
        return self.final_owned == self.partitions and not self.problems


def _balanced(workers: List[Worker], partitions: int) -> bool:
    counts = [len(w.owned_set) for w in workers]
    if not all(w.alive for w in workers) or sum(counts) != partitions:
        return False
    union: Set[str] = set().union(*(w.owned_set for w in workers))
    return len(union) == partitions and max(counts) - min(counts) <= 1


async def store_owners(connection_string: str, container: str, hub: str) -> Dict[str, Tuple[str, datetime]]:
    """Partition -> (owner id, last modified) from one listing of the ownership blobs."""
    from azure.storage.blob.aio import ContainerClient

    prefix = f"{NAMESPACE}/{hub}/{CONSUMER_GROUP}/ownership/".lower()
    owners: Dict[str, Tuple[str, datetime]] = {}
    async with ContainerClient.from_connection_string(connection_string, container) as client:
        async for blob in client.list_blobs(name_starts_with=prefix, include=["metadata"]):
            owner = (blob.metadata or {}).get("ownerid") or ""
            owners[blob.name[len(prefix):]] = (owner, blob.last_modified)
    return owners


def check_final(owners: Dict[str, Tuple[str, datetime]], workers: List[Worker], partitions: int,
                expiration: float) -> Tuple[int, List[str]]:
    """Count partitions whose record names one live processor that dispatches it, within the
    expiration; list every problem found."""
    now = datetime.now(timezone.utc)
    live = {w.owner_id: w for w in workers if w.alive}
    dispatchers: Dict[str, List[str]] = {}
    for worker in workers:
        for pid in worker.owned_set:
            dispatchers.setdefault(pid, []).append(worker.owner_id)
    problems: List[str] = []
    good = 0
    for pid in (str(i) for i in range(partitions)):
        record = owners.get(pid)
        by = dispatchers.get(pid, [])
        if record is None or not record[0]:
            problems.append(f"partition {pid}: no owner in the store")
        elif record[0] not in live:
            problems.append(f"partition {pid}: the store names {record[0]}, not a live processor")
        elif (now - record[1]).total_seconds() > expiration + 1:
            problems.append(f"partition {pid}: its record is {(now - record[1]).total_seconds():.0f} s old (expired)")
        elif by != [record[0]]:
            problems.append(f"partition {pid}: the store names {record[0]}, dispatched by {by or 'nobody'}")
        else:
            good += 1
    return good, problems


class StoreSaturated(RuntimeError):
    """Azurite could not serve the benchmark's own set-up calls."""


class Runner:
    def __init__(self, args: argparse.Namespace, connection_string: str, azurite_pid: Optional[int],
                 log_dir: str) -> None:
        self.args = args
        self.connection_string = connection_string
        self.azurite_pid = azurite_pid
        self.log_dir = log_dir

    async def _create_container(self, name: str) -> None:
        from azure.storage.blob.aio import ContainerClient

        async with ContainerClient.from_connection_string(self.connection_string, name) as client:
            await client.create_container()

    @staticmethod
    async def delete_container(connection_string: str, name: str) -> None:
        """Leave Azurite as the next side found it (best effort, bounded)."""
        from azure.storage.blob.aio import ContainerClient

        try:
            async with ContainerClient.from_connection_string(connection_string, name) as client:
                await asyncio.wait_for(client.delete_container(), 60)
        except Exception as error:  # a side's leftovers only cost the next one some memory
            print(f"could not delete container {name}: {error!r:.200}", file=sys.stderr, flush=True)

    async def drained(self) -> float:
        """Wait until Azurite is idle (under 10 % of a core over a second): a store still
        working through requests a previous side gave up on would slow the next one.
        Returns the seconds waited; raises when it is still busy after ``--drain-timeout``."""
        started = time.monotonic()
        if self.azurite_pid is None:
            return 0.0
        while True:
            before = _cpu_seconds(self.azurite_pid)
            await asyncio.sleep(1.0)
            after = _cpu_seconds(self.azurite_pid)
            waited = time.monotonic() - started
            if before is None or after is None or after - before < 0.1:
                return waited
            if waited > self.args.drain_timeout:
                raise StoreSaturated(
                    f"Azurite was still at {100 * (after - before):.0f}% of a core {waited:.0f} s after the previous "
                    f"side stopped: saturated with requests its clients had given up on")

    async def side(self, impl: str, partitions: int, processors: int, sizing: Sizing) -> SideResult:
        result = SideResult(impl, partitions, processors)
        tag = uuid.uuid4().hex[:6]
        container, hub = f"scale-{impl}-{partitions}x{processors}-{tag}", f"hub-{partitions}"
        result.drain_wait = await self.drained()
        try:
            await asyncio.wait_for(self._create_container(container), 120)
        except Exception as error:
            raise StoreSaturated(f"creating the side's container failed: {error!r:.200}") from error
        try:
            return await self._run_side(result, impl, partitions, processors, sizing, container, hub)
        finally:
            await self.delete_container(self.connection_string, container)

    async def _run_side(self, result: "SideResult", impl: str, partitions: int, processors: int, sizing: Sizing,
                        container: str, hub: str) -> "SideResult":
        args = self.args
        # Long enough for every lease of ours to be renewed once after the last claim.
        hold = args.hold if args.hold is not None else sizing.hold
        balance_limit = balance_limit_for(args, sizing)
        lifetime = args.ready_timeout + balance_limit + hold + 120.0
        workers: List[Worker] = []
        try:
            spawned = time.monotonic()
            workers = list(await asyncio.gather(*(
                spawn(impl, f"{impl}-{partitions}x{processors}-{i}", container=container, hub=hub,
                      partitions=partitions, sizing=sizing, strategy=args.strategy,
                      connection_string=self.connection_string, log_dir=self.log_dir, lifetime=lifetime,
                      report_every=args.report_every)
                for i in range(processors))))
            await self._until(lambda: all(w.ready for w in workers), args.ready_timeout, workers,
                              f"{impl}: {processors} workers ready")
            result.spawn_seconds = time.monotonic() - spawned
            azurite0 = _cpu_seconds(self.azurite_pid)
            for worker in workers:
                worker.go()
            go_at = time.time()
            print(f"{impl} {partitions}x{processors}: started (I={sizing.interval:g} s, E={sizing.expiration:g} s)",
                  file=sys.stderr, flush=True)
            balanced = await self._wait_balanced(workers, partitions, balance_limit, impl)
            converge_end = time.time()
            azurite1 = _cpu_seconds(self.azurite_pid)
            if balanced:
                balanced_at = max(w.owned_since for w in workers)
                result.balanced_after = balanced_at - go_at
                result.ticks_to_balanced = max(w.at(balanced_at).get("ticks", 0) for w in workers)
                print(f"{impl} {partitions}x{processors}: balanced after {result.balanced_after:.1f} s, "
                      f"{result.ticks_to_balanced} ticks; holding {hold:.0f} s", file=sys.stderr, flush=True)
                await self._hold(workers, hold)
            else:
                owned = len(set().union(*(w.owned_set for w in workers)))
                result.problems.append(f"not balanced within {balance_limit:.0f} s: {owned} of {partitions} "
                                       f"partitions dispatched, shares {sorted(len(w.owned_set) for w in workers)}")
                print(f"{impl} {partitions}x{processors}: {result.problems[-1]}", file=sys.stderr, flush=True)
            end = time.time()
            azurite2 = _cpu_seconds(self.azurite_pid)
            await asyncio.sleep(args.report_every * 1.5)  # the reports of the last moment
            try:
                owners = await asyncio.wait_for(store_owners(self.connection_string, container, hub),
                                                args.final_listing_timeout)
            except asyncio.TimeoutError:
                owners = {}
                result.problems.append(f"the final listing did not answer within {args.final_listing_timeout:.0f} s")
            good, problems = check_final(owners, workers, partitions, sizing.expiration)
            result.final_owned = good
            result.problems += problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
            counts = [len(w.owned_set) for w in workers]
            result.shares = (min(counts), max(counts))
            self._phases(result, workers, go_at, converge_end, end, (azurite0, azurite1, azurite2))
        finally:
            await asyncio.gather(*(w.stop(args.stop_timeout) for w in workers), return_exceptions=True)
        return result

    def _phases(self, result: SideResult, workers: List[Worker], go_at: float, converge_end: float, end: float,
                azurite: Tuple[Optional[float], ...]) -> None:
        def phase(start: float, stop: float, cpu0: Optional[float], cpu1: Optional[float]) -> Phase:
            first = [w.at(start) if start > go_at else {"cpu": 0.0, "requests": 0, "t": go_at} for w in workers]
            last = [w.at(stop) for w in workers]
            seconds = statistics.mean(b.get("t", stop) - a.get("t", start) for a, b in zip(first, last))
            return Phase(seconds=seconds,
                         requests=sum(b.get("requests", 0) - a.get("requests", 0) for a, b in zip(first, last)),
                         cpu=[b.get("cpu", 0.0) - a.get("cpu", 0.0) for a, b in zip(first, last)],
                         azurite_cpu=None if cpu0 is None or cpu1 is None else cpu1 - cpu0)

        result.converge = phase(go_at, converge_end, azurite[0], azurite[1])
        if result.balanced_after is not None:
            result.hold = phase(converge_end, end, azurite[1], azurite[2])
        totals: Dict[str, int] = {}
        for worker in workers:
            for key in ("ticks", "overruns", "overrun_warnings", "missed_renewals", "renewals", "failed_renewals",
                        "claims", "lost", "store_timeouts", "backed_off"):
                totals[key] = totals.get(key, 0) + int(worker.last.get(key, 0))
            result.max_tick = max(result.max_tick, float(worker.last.get("max_tick", 0.0)))
            result.loop_lag = max(result.loop_lag, float(worker.last.get("loop_lag", 0.0)))
            result.backoff_level = max([result.backoff_level] + [int(st.get("backoff_level", 0))
                                                                 for st in worker.states])
        result.counters = totals
        if result.balanced_after is not None:
            result.moved_while_held = sum(int(w.at(end).get("claims", 0)) - int(w.at(converge_end).get("claims", 0))
                                          for w in workers)

    async def _until(self, condition: Any, timeout: float, workers: List[Worker], what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            dead = [w for w in workers if not w.alive]
            if dead:
                raise RuntimeError(f"{what}: {len(dead)} worker(s) exited\n" + dead[0].diagnostics())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not happen within {timeout:.0f} s\n" + workers[0].diagnostics())
            await asyncio.sleep(0.1)

    async def _wait_balanced(self, workers: List[Worker], partitions: int, limit: float, impl: str) -> bool:
        deadline = time.monotonic() + limit
        reported = time.monotonic()
        while time.monotonic() < deadline:
            dead = [w for w in workers if not w.alive]
            if dead:
                raise RuntimeError(f"{impl}: {len(dead)} worker(s) exited\n" + dead[0].diagnostics())
            if _balanced(workers, partitions):
                return True
            if time.monotonic() - reported > 30:
                reported = time.monotonic()
                owned = len(set().union(*(w.owned_set for w in workers)))
                print(f"  ... {owned}/{partitions} dispatched, shares {sorted(len(w.owned_set) for w in workers)}",
                      file=sys.stderr, flush=True)
            await asyncio.sleep(0.1)
        return False

    async def _hold(self, workers: List[Worker], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            dead = [w for w in workers if not w.alive]
            if dead:
                raise RuntimeError(f"{len(dead)} worker(s) exited while holding\n" + dead[0].diagnostics())
            await asyncio.sleep(0.25)


# --------------------------------------------------------------------------- the run


@dataclass
class SizeResult:
    partitions: int
    processors: int
    calibration: Calibration
    sizing: Sizing
    sides: Dict[str, SideResult] = field(default_factory=dict)
    error: Optional[str] = None
    not_run: Optional[str] = None  # why this size was measured and sized but not run


def balance_limit_for(args: argparse.Namespace, sizing: Sizing) -> float:
    """How long a side may take to balance before it is reported as not balanced."""
    return args.balance_ticks * 1.1 * sizing.interval + 30.0


def projected_seconds(args: argparse.Namespace, sizing: Sizing, processors: int) -> float:
    """The longest both sides of one size can take: imports, balancing, holding, stopping."""
    hold = args.hold if args.hold is not None else sizing.hold
    return 2 * (min(args.ready_timeout, 2.0 * processors) + balance_limit_for(args, sizing) + hold + 15.0)


async def run_sizes(args: argparse.Namespace, connection_string: str, azurite_pid: Optional[int], *,
                    sizes: Optional[List[Tuple[int, int]]] = None, started: Optional[float] = None,
                    first_index: int = 0) -> List[SizeResult]:
    """Run ``sizes`` (``args.sizes`` by default) on one Azurite. ``started``: when the
    budget began (now by default); ``first_index``: the position of the first size in
    the whole run (the order of the sides alternates with it)."""
    machine = os.cpu_count() or 1
    started = time.monotonic() if started is None else started
    results: List[SizeResult] = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as scratch:
        log_dir = args.log_dir or scratch
        os.makedirs(log_dir, exist_ok=True)
        runner = Runner(args, connection_string, azurite_pid, log_dir)
        for index, (partitions, processors) in enumerate(args.sizes if sizes is None else sizes,
                                                         start=first_index):
            try:
                try:
                    calibration = await calibrate(connection_string, partitions, args.calibration_listings,
                                                  azurite_pid, args.idle_sample)
                except Exception:  # once more, after the last side's workers have let go of Azurite
                    await asyncio.sleep(15)
                    calibration = await calibrate(connection_string, partitions, args.calibration_listings,
                                                  azurite_pid, args.idle_sample)
            except Exception as error:  # a store too busy to answer: say so, measure the next size
                reason = f"{partitions} x {processors}: the listing cost could not be measured ({error!r:.200})"
                print(reason, file=sys.stderr, flush=True)
                args.unmeasured.append(reason)
                continue
            # The cores the processors can count on: those the machine leaves idle (other
            # users' work included), but at least a quarter of it.
            idle = calibration.idle_cores
            cores = machine if idle is None else min(float(machine), max(idle, 0.25 * machine))
            sizing = choose_timing(calibration.cpu, processors, round(cores, 1), budget=args.cpu_budget,
                                   min_interval=args.min_interval, store_listing=calibration.server_cpu,
                                   store_write=calibration.server_write_cpu, partitions=partitions)
            print(f"{partitions}x{processors}: listing {partitions} records costs {calibration.cpu * 1000:.0f} ms CPU "
                  f"(client {calibration.client_cpu * 1000:.0f} ms); sized for {sizing.cores:g} cores: "
                  f"I={sizing.interval:g} s, E={sizing.expiration:g} s (bound by {sizing.bound_by})", file=sys.stderr,
                  flush=True)
            size = SizeResult(partitions, processors, calibration, sizing)
            results.append(size)
            left = args.budget_minutes * 60 - (time.monotonic() - started)
            projected = projected_seconds(args, sizing, processors)
            if projected > left:
                size.not_run = (f"sized at I = {sizing.interval:g} s and E = {sizing.expiration:g} s, both sides could "
                                f"take up to {projected / 60:.0f} min (balancing within {args.balance_ticks:g} "
                                f"intervals, then {sizing.hold:.0f} s held so that every lease is renewed once), and "
                                f"{max(left, 0) / 60:.0f} min of the {args.budget_minutes:g}-minute budget were left")
                print(f"{partitions}x{processors}: not run: {size.not_run}", file=sys.stderr, flush=True)
                continue
            order = IMPLS if index % 2 == 0 else IMPLS[::-1]
            for impl in order:
                if impl not in args.impls:
                    continue
                try:
                    size.sides[impl] = await runner.side(impl, partitions, processors, sizing)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # a saturated store, a worker that died: say so, go on
                    first = (str(error) or repr(error)).splitlines()[0]
                    size.error = "; ".join(filter(None, [size.error, f"{impl}: {first}"]))
                    print(f"{partitions}x{processors} {impl} failed: {error!r:.500}", file=sys.stderr, flush=True)
    return results


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def render(results: List[SizeResult], args: argparse.Namespace, command: str, seconds: float, load: str) -> str:
    cores = os.cpu_count() or 1
    lines = [
        "## Scale on Azurite: separate processes, ours vs the official EventProcessor (`scale`)",
        "",
        f"Command: `{command}` ({seconds:.0f} s). {machine_line()} Load average (1/5/15 min) at start and end: "
        f"{load}.",
        "",
        f"One Azurite per size (in-memory, 127.0.0.1), started fresh by the benchmark. Each processor is its own OS process "
        f"(`benchmarks/scale_worker.py`); all of a side start together after their imports. *ours*: "
        f"`EventProcessor` + our `BlobCheckpointStore`, reading an empty `MemoryEventSource`. *official*: "
        f"azure-eventhub {_official_version()}'s own `EventProcessor` class (its `OwnershipManager` and "
        f"load-balancing loop) + `azure-eventhub-checkpointstoreblob-aio`, with a stand-in client that gives the "
        f"same partition ids and idle consumers instead of AMQP links. Only ownership is measured: no events on "
        f"either side. Same strategy ({args.strategy.upper()}), interval I and expiration E for both; each side "
        f"its own container on the same Azurite; sides run one after the other (order alternating per size). "
        f"*Missed renewals*: for ours, leases that ran out before a renewal succeeded (`stats.self_fenced`); the "
        f"official processor has no lease of its own and rewrites its records at each tick, so for it, partitions "
        f"it still ran more than E after the last successful write of their record (from then on another "
        f"processor may take them). *Overrun*: a tick longer than I (ours logs a WARNING; the official logs "
        f"nothing, the worker times its ticks).",
        "",
        "### Sizing: listing cost measured here, interval and expiration derived",
        "",
        f"Rule (docs/concepts/timing.md, \"Sizing\"): c = CPU seconds of one listing of P records (client + Azurite), measured "
        f"here ({args.calibration_listings} listings, median); I = ⌈N·c / (f·C)⌉ (at least {args.min_interval:g} s) "
        f"with f = {args.cpu_budget:g} and C the cores the processors can count on: those the machine left idle "
        f"over {args.idle_sample:g} s just before (other users' work counts as busy), at least a quarter of its "
        f"{cores}; so the listings of all N processors use at most f of them. E = {EXPIRATION_RATIO:g}·I for both "
        f"sides. Ours also gets R = E/2 "
        f"(`ownership_renewal_age`): lease − R = 0.4·E is how long a processor can be kept from renewing (a "
        f"listing's XML parsing holds its event loop, up to N·c/C when all list at once) and still keep its "
        f"leases, and the store timeout T the processor derives from it exceeds that herd; the Blob store's own "
        f"`operation_timeout` is raised to T when T is longer than its 10 s default. The store is one more bound "
        f"(Azurite is one Node.js thread): with s its CPU seconds per listing and w per record written (both "
        f"measured here), I ≥ ⌈N·s/f⌉ keeps listings to f of that thread, and I ≥ ⌈1.5·B⌉ with "
        f"B = N·s + 2·P·w (every processor lists, a greedy start writes every claim and its checkpoint fence) lets "
        f"the start-up burst fit in T ≈ 0.67·I; I is the largest of the three. Before each side the benchmark waits "
        f"for Azurite to go idle, and each side's container is deleted after it. A side is held "
        f"R + E/10 once balanced (every lease of ours renewed once), and gives up on balance after "
        f"{args.balance_ticks:g}·1.1·I + 30 s.",
        "",
        "| P x N | client ms/record | Azurite ms/record | c (s) | listing wall (s) | idle cores | C | I (s) | E (s) | "
        "listing load (cores) | herd N·c/C (s) | Azurite w (ms/record written) | store load N·s/I | burst B (s) | "
        "I bound by | ours: R / T / store operation_timeout (s) | ours: lease − R (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for size in results:
        cal, s = size.calibration, size.sizing
        server = "n/a" if cal.server_ms_per_record is None else f"{cal.server_ms_per_record:.3f}"
        idle = "n/a" if cal.idle_cores is None else f"{cal.idle_cores:.1f}"
        lines.append(f"| {size.partitions} x {size.processors} | {cal.client_ms_per_record:.3f} | {server} | "
                     f"{cal.cpu:.2f} | {cal.wall:.2f} | {idle} | {s.cores:g} | {s.interval:g} | {s.expiration:g} | "
                     f"{s.listing_load:.2f} | {s.herd:.1f} | "
                     f"{'n/a' if cal.server_write_cpu is None else f'{1000 * cal.server_write_cpu:.2f}'} | "
                     f"{'n/a' if s.store_load is None else f'{s.store_load:.2f}'} | "
                     f"{'n/a' if s.burst is None else f'{s.burst:.1f}'} | {s.bound_by} | "
                     f"{s.renewal_age:g} / {s.store_timeout:.1f} / "
                     f"{s.operation_timeout:g} | {s.stall_room:.1f} |")
    for size in results:
        lines += ["", f"### {size.partitions} partitions x {size.processors} processors "
                      f"(I = {size.sizing.interval:g} s, E = {size.sizing.expiration:g} s)", ""]
        if size.not_run:
            lines += [f"**Not run**: {size.not_run}."]
            continue
        if size.error:
            lines += [f"**Failed**: {size.error}", ""]
        sides = [size.sides.get(impl) for impl in IMPLS]
        lines += ["| | ours | official |", "|---|---:|---:|"]

        def row(label: str, value: Any) -> None:
            lines.append(f"| {label} | " + " | ".join("-" if side is None else value(side) for side in sides) + " |")

        row("seconds to balanced (from the common start)",
            lambda r: "not balanced" if r.balanced_after is None else f"{r.balanced_after:.1f}")
        row("ticks to balanced (busiest processor)",
            lambda r: "-" if r.ticks_to_balanced is None else str(r.ticks_to_balanced))
        row("missed renewals (must be 0)", lambda r: str(r.counters.get("missed_renewals", 0)))
        row("every partition owned by exactly one live processor at the end",
            lambda r: ("yes" if r.every_partition_owned_once else "**no**") + f" ({r.final_owned}/{r.partitions})")
        row("partitions per processor at the end (min-max)", lambda r: f"{r.shares[0]}-{r.shares[1]}")
        row("overrun ticks / overrun WARNING lines",
            lambda r: f"{r.counters.get('overruns', 0)} / "
                      + (str(r.counters.get("overrun_warnings", 0)) if r.impl == "ours" else "none logged"))
        row("store calls timed out (ours: store_timeout)",
            lambda r: str(r.counters.get("store_timeouts", 0)) if r.impl == "ours" else "no timeout")
        row("ticks backed off for a saturated store / highest level (ours)",
            lambda r: f"{r.counters.get('backed_off', 0)} / {r.backoff_level}" if r.impl == "ours" else "no backoff")
        row("seconds Azurite needed to go idle before the side", lambda r: f"{r.drain_wait:.0f}")
        row("longest tick (s)", lambda r: f"{r.max_tick:.2f}")
        row("longest event-loop stall in a processor (s)", lambda r: f"{r.loop_lag:.2f}")
        row("ticks, all processors", lambda r: str(r.counters.get("ticks", 0)))
        row("renewals / failed renewals", lambda r: f"{r.counters.get('renewals', 0)} / "
                                                   f"{r.counters.get('failed_renewals', 0)}")
        row("claims won / partitions lost", lambda r: f"{r.counters.get('claims', 0)} / {r.counters.get('lost', 0)}")
        row("claims while held (after balanced)", lambda r: str(r.moved_while_held))
        row("requests/s to balanced (all processors)", lambda r: f"{r.converge.requests_per_second:.0f}")
        row("requests/s while held (all processors)",
            lambda r: "-" if r.balanced_after is None else f"{r.hold.requests_per_second:.1f}")
        row("CPU per processor to balanced, mean (max), % of a core",
            lambda r: f"{_pct(r.converge.core_share()[0])} ({_pct(r.converge.core_share()[1])})")
        row("CPU per processor while held, mean (max), % of a core",
            lambda r: "-" if r.balanced_after is None
            else f"{_pct(r.hold.core_share()[0])} ({_pct(r.hold.core_share()[1])})")
        row("Azurite CPU to balanced / while held, % of a core",
            lambda r: f"{_pct(r.converge.azurite_share or float('nan'))} / "
                      f"{_pct(r.hold.azurite_share or float('nan')) if r.balanced_after is not None else '-'}")
        row("held for (s)", lambda r: "-" if r.balanced_after is None else f"{r.hold.seconds:.0f}")
        row("start-up imports of all workers (s, not measured above)", lambda r: f"{r.spawn_seconds:.1f}")
        problems = [f"{side.impl}: {p}" for side in sides if side is not None for p in side.problems]
        if problems:
            lines += ["", "Problems found: " + "; ".join(problems)]
    lines += ["", *_verdict(results, args)]
    return "\n".join(lines) + "\n"


def _official_version() -> str:
    try:
        from importlib.metadata import version

        return version("azure-eventhub")
    except Exception:  # pragma: no cover - not installed
        return "?"


def _verdict(results: List[SizeResult], args: argparse.Namespace) -> List[str]:
    cores = os.cpu_count() or 1
    held, not_held = [], []
    for size in results:
        ours = size.sides.get("ours")
        label = f"{size.partitions} x {size.processors}"
        if ours is not None and ours.balanced_after is not None and ours.every_partition_owned_once \
                and ours.counters.get("missed_renewals", 0) == 0:
            held.append(label)
            continue
        if size.not_run:
            not_held.append(f"{label}: not run; {size.not_run}")
            continue
        if ours is None:
            not_held.append(f"{label}: ours did not run ({size.error})")
            continue
        idle = size.calibration.idle_cores
        balance = (f"balanced after {ours.balanced_after:.0f} s" if ours.balanced_after is not None
                   else f"not balanced within the limit ({ours.final_owned}/{ours.partitions} partitions owned once at "
                        f"the end)")
        not_held.append(
            f"{label}: ours {balance}; {ours.counters.get('missed_renewals', 0)} missed renewals; the longest "
            f"event-loop stall of a processor was {ours.loop_lag:.0f} s against {size.sizing.stall_room:.0f} s of "
            f"lease − R; {ours.counters.get('store_timeouts', 0)} store calls timed out; each processor got "
            f"{_pct(ours.converge.core_share()[0])} of a core on average ({size.processors} processes on {cores} "
            f"cores, with {'n/a' if idle is None else f'{idle:.1f}'} cores idle before the run)")
    not_held += getattr(args, "unmeasured", [])
    lines = ["**What this machine held** (ours balanced, 0 missed renewals, every partition owned once at the end): "
             + (", ".join(held) or "none") + "."]
    if not_held:
        lines += ["", "**Not held**, as measured above:", ""] + [f"- {line}." for line in not_held]
    return lines


# --------------------------------------------------------------------------- main


def _sizes(text: str) -> List[Tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        partitions, _, processors = part.strip().lower().partition("x")
        sizes.append((int(partitions), int(processors)))
    return sizes


def _parser(prog: Optional[str]) -> argparse.ArgumentParser:
    parser = program.parser("scale", __doc__, prog)
    parser.add_argument("--sizes", default=None,
                        help=f"comma-separated PARTITIONSxPROCESSORS (default {DEFAULT_SIZES}; --quick: {QUICK_SIZES})")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (never recorded)")
    parser.add_argument("--strategy", choices=["greedy", "balanced"], default="greedy")
    parser.add_argument("--cpu-budget", type=float, default=0.5,
                        help="fraction f of the cores that the listings of all processors may use (default 0.5)")
    parser.add_argument("--min-interval", type=float, default=1.0, help="the shortest interval the rule picks (s)")
    parser.add_argument("--hold", type=float, default=None,
                        help="seconds to keep running once balanced (default: the renewal age + E/10, so that "
                             "every lease of ours is renewed at least once)")
    parser.add_argument("--balance-ticks", type=float, default=6.0,
                        help="give up on balance after this many intervals (+30 s)")
    parser.add_argument("--budget-minutes", type=float, default=15.0,
                        help="a size whose two sides could take longer than what is left of this budget is sized "
                             "and reported, not run (default 15)")
    parser.add_argument("--calibration-listings", type=int, default=5)
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds for all workers to import")
    parser.add_argument("--stop-timeout", type=float, default=40.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="seconds to wait for Azurite to go idle before a side starts (default 300)")
    parser.add_argument("--final-listing-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    parser.add_argument("--report-every", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--idle-sample", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--impls", default="ours,official", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", default=None, help="keep each worker's stderr in this directory")
    return parser


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None, *, azurite: Any = None) -> int:
    """Run the benchmark and print its tables; ``--record`` writes them to RESULTS.md.
    ``azurite``: an already running ``emulators.azurite.Azurite`` to use (the tests').

    Example::

        python -m benchmarks.scale --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace) -> int:
        if args.quick and args.record:
            parser.error("--quick runs are partial: they are never recorded")
        if args.quick:  # a smoke run: shorter samples, quicker reports
            args.idle_sample, args.report_every, args.calibration_listings = 0.5, 0.25, 3
        try:
            args.sizes = _sizes(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES))
        except ValueError:
            parser.error("--sizes must look like 1024x16,4096x32")
        if any(p < 1 or n < 1 for p, n in args.sizes):
            parser.error("--sizes: partitions and processors must be positive")
        if not 0 < args.cpu_budget <= 1:
            parser.error("--cpu-budget must be in (0, 1]")
        args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
        args.unmeasured = []
        return _run(args, program.recorded_command("scale", argv), azurite)

    return program.run(parser, body, argv)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _run(args: argparse.Namespace, command: str, azurite: Any) -> int:
    from eventprocessor_cli.user_errors import require, require_azurite

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    require(purpose="the scale benchmark", extras=["blob", "eventhub"],
            packages=[("azure.eventhub.extensions.checkpointstoreblobaio", "azure-eventhub-checkpointstoreblob-aio")])
    started = time.monotonic()
    load_start = _load_average()
    own = azurite is None
    if own:
        require_azurite("the scale benchmark")
        from emulators.azurite import start_azurite

        azurite = start_azurite()
    previous = None
    if threading.current_thread() is threading.main_thread():
        # SIGTERM unwinds like Ctrl-C, so that every worker and Azurite are stopped.
        previous = signal.signal(signal.SIGTERM, _interrupt)
    results: List[SizeResult] = []
    try:
        if own:
            # One Azurite per size, started fresh: a size does not inherit the records,
            # memory and queued requests of the one before (Azurite keeps everything in
            # one in-memory database served by one thread).
            for index, size in enumerate(args.sizes):
                if index:
                    azurite.stop()
                    azurite = start_azurite()
                pid = azurite.process.pid if azurite.process is not None else None
                results += asyncio.run(run_sizes(args, azurite.connection_string, pid, sizes=[size],
                                                 started=started, first_index=index))
        else:
            pid = azurite.process.pid if azurite.process is not None else None
            results = asyncio.run(run_sizes(args, azurite.connection_string, pid))
    except KeyboardInterrupt:
        print(f"{program.command_name('scale')}: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if own:
            azurite.stop()
    markdown = render(results, args, command, time.monotonic() - started, f"{load_start} / {_load_average()}")
    program.report("scale", markdown, args.record)
    # 1 when ours missed a check in a size that ran (the official side's results are findings)
    failed = any(size.error or (ours is not None and (not ours.every_partition_owned_once
                                                      or ours.counters.get("missed_renewals", 0)))
                 for size in results for ours in [size.sides.get("ours")] if not size.not_run)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
