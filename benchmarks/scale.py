"""Scale on real storage: many processors in separate OS processes, one Blob store on Azurite.

Run it with ``python -m benchmarks.scale`` (or ``eventprocessor bench scale``); ``--record``
writes its section of ``benchmarks/RESULTS.md``. It starts a fresh Azurite (in-memory, on
127.0.0.1) for each size ``PxN`` (P partitions, N processors; ``1024x16,2048x16,4096x32``
by default, smallest first), or uses the storage whose connection string is in
``EVENTPROCESSOR_SCALE_STORAGE`` (never on the command line: it holds a key; ``--store-pid``
names that Azurite's process, for its CPU):

1. **Measures the listing cost** on this machine: P ownership records are written to a
   scratch container and listed ``--calibration-listings`` times; the client's CPU
   (this process) and Azurite's CPU (``/proc``) per listing are the medians. Just before,
   it samples how many cores the machine leaves idle (other users' work counts as busy).
2. **Sizes the timing from it** (:func:`choose_timing`, the rule in docs/concepts/timing.md, "Sizing";
   ``--size-for`` prints what it chooses for costs you give it): with c the CPU seconds
   of one listing (client + Azurite) and C the cores the processors can count on (the
   idle ones, at least a quarter of the machine), ``I = N·c / (f·C)`` rounded up to whole
   seconds (at least ``--min-interval``), so the listings of all N processors use at most
   the fraction ``f`` (``--cpu-budget``, 0.5) of C; E at each SDK's own ratio to I (ours
   ``5·I`` as 15 s / 75 s, the official ``6·I`` as 30 s / 180 s); for ours ``R = E/2``
   and the Blob store's ``operation_timeout`` at least the store timeout derived from them.
3. **Runs each side** with that I and the same strategy (GREEDY by default), as N
   separate OS processes (``benchmarks/scale_worker.py``) started together once all have
   imported: *ours* is ``EventProcessor`` + this SDK's ``BlobCheckpointStore``; *official*
   is azure-eventhub's own ``EventProcessor`` class with
   ``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``, given a stand-in
   client (same partition ids, idle consumers instead of AMQP links; ours reads an empty
   in-memory source, so neither side spends anything on events). Each side gets its own
   container on the same Azurite; the order of the sides alternates from size to size.
   A side runs until it is balanced or until every processor has made ``--cap-ticks``
   ticks (60; a recorded run needs at least 60), within ``--budget-minutes`` (45): a side
   is started only when the cap's ticks at I fit in what is left of the budget, keeping
   what the other side of its size needs, and a side whose ticks overrun so much that the
   budget ends it before the cap is reported as stopped by the budget. Sizes and sides
   that do not fit are sized and reported, not run.

Measured per side: seconds and ticks from the common start to balanced (every partition
dispatched by exactly one processor, shares differing by at most one), or to the cap,
then held for ``R + E/10`` (every lease of ours renewed at least once); missed renewals
(must be 0), by one rule for both SDKs (``scale_worker.RenewalWatch``: a partition still
dispatched more than E after the last accepted write of its ownership record), ours'
self-fenced leases, overrun ticks and overrun WARNING lines, HTTP requests per second
counted at each worker's transport, CPU per processor (``time.process_time`` in the
worker), Azurite's CPU, the longest event-loop stall of any processor and the CPU other
processes used on the machine meanwhile (:mod:`benchmarks.machine_load`; a busy run is
flagged). At the end, one listing of the store checks that every partition's record
names exactly one live processor, is not expired, and agrees with what that processor
dispatches.

Every phase is bounded in time; every worker and Azurite are stopped on the way out,
failures and SIGTERM included. A side that does not balance by the cap is reported as
such, with what was owned, never as a success. The exit status is 1 when ours missed a
check.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
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
from typing import Any

from harness.worker_process import WorkerHandle

from . import program
from .machine_load import LoadReading, LoadWindow, busy_flag, process_cpu_seconds
from .results import machine_line
from .scale_worker import NAMESPACE, STORAGE_ENV

__all__ = ["main", "choose_timing", "Calibration", "Sizing", "SideResult"]

logger = logging.getLogger(__name__)

IMPLS = ("ours", "official")
DEFAULT_SIZES = "1024x16,2048x16,4096x32"
QUICK_SIZES = "8x2"
CONSUMER_GROUP = "$default"
EXPIRATION_RATIO = 5.0  # this SDK's defaults: 15 s interval, 75 s expiration
OFFICIAL_EXPIRATION_RATIO = 6.0  # azure-eventhub's defaults: 30 s interval, 180 s expiration
CAP_TICKS = 60  # a side that has not balanced after this many ticks of every processor is reported as such
DEFAULT_BUDGET_MINUTES = 45.0


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (Linux ``/proc``), or None."""
    return None if pid is None else process_cpu_seconds(pid)


def _cpu_times() -> tuple[float, float] | None:
    """(idle, total) jiffies of the whole machine from ``/proc/stat``, or None."""
    try:
        with open("/proc/stat") as handle:
            values = [float(v) for v in handle.readline().split()[1:]]
        return values[3] + values[4], sum(values)
    except (OSError, IndexError, ValueError):
        return None


async def idle_cores(seconds: float) -> float | None:
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
    server_cpu: float | None  # Azurite's seconds, median (None when it is not ours to read)
    wall: float  # seconds, median
    idle_cores: float | None = None  # cores idle just before (other users' work counted as busy)
    server_write_cpu: float | None = None  # Azurite's seconds per record written (claims), mean

    @property
    def cpu(self) -> float:
        return self.client_cpu + (self.server_cpu or 0.0)

    @property
    def client_ms_per_record(self) -> float:
        return 1000 * self.client_cpu / self.partitions

    @property
    def server_ms_per_record(self) -> float | None:
        return None if self.server_cpu is None else 1000 * self.server_cpu / self.partitions


@dataclass(frozen=True)
class Sizing:
    """The settings the rule chose, and what they imply (seconds)."""

    interval: float  # I, both sides
    expiration: float  # E, ours: 5·I (this SDK's ratio)
    renewal_age: float  # ours: ownership_renewal_age R
    store_timeout: float  # ours: store_timeout T, derived by the processor from E and R
    operation_timeout: float  # ours: the Blob store's own operation_timeout
    lease: float  # ours: E minus the safety margin
    herd: float  # N simultaneous listings on the machine's cores: N·c/C
    listing_load: float  # cores all processors spend listing, at one listing per interval each
    cores: float  # C: the cores the rule sized for
    store_load: float | None = None  # the share of the store's one thread that listings take: N·s/I
    burst: float | None = None  # B = N·s + 2·P·w: the store's seconds of work when every processor starts
    bound_by: str = "client CPU"  # which term of the rule chose I

    @property
    def official_expiration(self) -> float:
        """E for the official processor: its own ratio (6·I, as 30 s / 180 s)."""
        return OFFICIAL_EXPIRATION_RATIO * self.interval

    def expiration_of(self, impl: str) -> float:
        return self.official_expiration if impl == "official" else self.expiration

    @property
    def hold(self) -> float:
        """How long a side keeps running once balanced: every lease of ours is renewed once."""
        return self.renewal_age + 0.1 * self.expiration

    @property
    def stall_room(self) -> float:
        """How long ours may be unable to run (a stalled event loop) between two renewal
        attempts and still keep its leases: the lease minus the renewal age."""
        return self.lease - self.renewal_age


def ours_at_defaults(sizing: Sizing) -> Sizing:
    """Ours with ``EventProcessor``'s default timing: at rest its ticks list no ownership
    record (one heartbeat per processor keeps its partitions), so its interval is not
    sized by P x N (docs/concepts/timing.md, "Sizing"); only the official side is."""
    from eventprocessor import EventProcessor, Timing
    from eventprocessor.stores import DEFAULT_OPERATION_TIMEOUT

    defaults = inspect.signature(EventProcessor.__init__).parameters
    interval = float(defaults["load_balancing_interval"].default)
    expiration = float(defaults["partition_ownership_expiration_interval"].default)
    timing = Timing.derive(interval=interval, expiration=expiration, renewal_age=None, store_timeout=None,
                           shutdown_timeout=30.0, handler_timeout=None)
    return dataclasses.replace(sizing, interval=interval, expiration=expiration, renewal_age=timing.renewal_age,
                               store_timeout=timing.store_timeout, operation_timeout=DEFAULT_OPERATION_TIMEOUT,
                               lease=timing.lease_length, bound_by="EventProcessor's defaults")


def choose_timing(listing_cpu: float, processors: int, cores: float, *, budget: float = 0.5,
                  min_interval: float = 1.0, store_listing: float | None = None,
                  store_write: float | None = None, partitions: int = 0) -> Sizing:
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
      ``eventprocessor._runtime.backoff``); these terms keep the benchmark out of that regime.
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
    from eventprocessor import Timing
    from eventprocessor.stores import DEFAULT_OPERATION_TIMEOUT

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


async def calibrate(connection_string: str, partitions: int, listings: int, azurite_pid: int | None,
                    idle_sample: float = 5.0) -> Calibration:
    """Write ``partitions`` ownership records to a scratch container and time listing them."""
    from eventprocessor.errors import CheckpointStoreError
    from eventprocessor.stores.blob import BlobCheckpointStore
    from eventprocessor.stores.records import Ownership

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

    def __init__(self, owner_id: str, process: asyncio.subprocess.Process, stderr_path: str) -> None:
        super().__init__(owner_id, process, stderr_path)
        self.ready = False
        self.owned_set: set[str] = set()
        self.owned_since = 0.0  # the report time at which ``owned_set`` became what it is
        self.states: list[dict[str, Any]] = []
        self.stopped = False

    @property
    def last(self) -> dict[str, Any]:
        return self.states[-1] if self.states else {}

    def at(self, t: float) -> dict[str, Any]:
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
            "--expiry", f"{sizing.expiration_of(impl):g}", "--strategy", strategy, "--lifetime", f"{lifetime:.0f}",
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
    cpu: list[float] = field(default_factory=list)  # seconds, per processor
    azurite_cpu: float | None = None

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else float("nan")

    def core_share(self) -> tuple[float, float]:
        """Mean and max CPU per processor, as a fraction of one core."""
        if not self.cpu or self.seconds <= 0:
            return float("nan"), float("nan")
        shares = [c / self.seconds for c in self.cpu]
        return statistics.mean(shares), max(shares)

    @property
    def azurite_share(self) -> float | None:
        return None if self.azurite_cpu is None or self.seconds <= 0 else self.azurite_cpu / self.seconds


@dataclass
class SideResult:
    impl: str
    partitions: int
    processors: int
    balanced_after: float | None = None  # seconds from the common start
    ticks_to_balanced: int | None = None  # the busiest processor's ticks by then
    ended_by: str = "balanced"  # or "cap" (every processor made the cap's ticks) or "budget" (time ran out first)
    waited: float = 0.0  # seconds from the common start until balanced or given up
    ticks_waited: tuple[int, int] = (0, 0)  # the fewest and the most ticks of a processor by then
    expiration: float = 0.0  # E this side ran with
    load: LoadReading | None = None  # the machine's load while the side ran
    converge: Phase = field(default_factory=Phase)
    hold: Phase = field(default_factory=Phase)
    counters: dict[str, int] = field(default_factory=dict)  # summed over processors, at the end
    max_tick: float = 0.0
    loop_lag: float = 0.0  # the longest event-loop stall in any processor (s)
    moved_while_held: int = 0
    final_owned: int = 0  # partitions whose record names exactly one live, dispatching processor
    problems: list[str] = field(default_factory=list)
    shares: tuple[int, int] = (0, 0)  # min and max partitions per processor at the end
    spawn_seconds: float = 0.0
    drain_wait: float = 0.0  # seconds Azurite needed to go idle before this side started
    backoff_level: int = 0  # the highest backoff level any processor of ours reported

    @property
    def every_partition_owned_once(self) -> bool:
        return self.final_owned == self.partitions and not self.problems


def _balanced(workers: list[Worker], partitions: int) -> bool:
    counts = [len(w.owned_set) for w in workers]
    if not all(w.alive for w in workers) or sum(counts) != partitions:
        return False
    union: set[str] = set().union(*(w.owned_set for w in workers))
    return len(union) == partitions and max(counts) - min(counts) <= 1


async def store_owners(connection_string: str, container: str, hub: str) -> dict[str, tuple[str, datetime]]:
    """Partition -> (owner id, last proof of life) from one listing of the ownership and
    member blobs: a record's last-modified time, or its owner's heartbeat when that member
    record keeps its partitions (``lease=member``, ours), whichever is later."""
    from azure.storage.blob.aio import ContainerClient

    from eventprocessor.stores.codec import decode_name

    base = f"{NAMESPACE}/{hub}/{CONSUMER_GROUP}/".lower()
    owners: dict[str, tuple[str, datetime]] = {}
    beats: dict[str, datetime] = {}
    async with ContainerClient.from_connection_string(connection_string, container) as client:
        async for blob in client.list_blobs(name_starts_with=base + "ownership", include=["metadata"]):
            rest, metadata = blob.name[len(base):], blob.metadata or {}
            if rest.startswith("ownership/"):
                owners[rest[len("ownership/"):]] = (metadata.get("ownerid") or "", blob.last_modified)
            elif rest.startswith("ownership-member/") and metadata.get("lease") == "member":
                try:
                    beats[decode_name(rest[len("ownership-member/"):])] = blob.last_modified
                except ValueError:
                    continue  # the change notice, or a name no member has
    return {pid: (owner, max(modified, beats.get(owner, modified))) for pid, (owner, modified) in owners.items()}


def check_final(owners: dict[str, tuple[str, datetime]], workers: list[Worker], partitions: int,
                expiration: float) -> tuple[int, list[str]]:
    """Count partitions whose record names one live processor that dispatches it, within the
    expiration; list every problem found."""
    now = datetime.now(timezone.utc)
    live = {w.owner_id: w for w in workers if w.alive}
    dispatchers: dict[str, list[str]] = {}
    for worker in workers:
        for pid in worker.owned_set:
            dispatchers.setdefault(pid, []).append(worker.owner_id)
    problems: list[str] = []
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
    def __init__(self, args: argparse.Namespace, connection_string: str, azurite_pid: int | None,
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

    async def side(self, impl: str, partitions: int, processors: int, sizing: Sizing, deadline: float) -> SideResult:
        """Run one side; it waits for balance until the cap or ``deadline`` (monotonic), whichever first."""
        result = SideResult(impl, partitions, processors, expiration=sizing.expiration_of(impl))
        tag = uuid.uuid4().hex[:6]
        container, hub = f"scale-{impl}-{partitions}x{processors}-{tag}", f"hub-{partitions}"
        result.drain_wait = await self.drained()
        try:
            await asyncio.wait_for(self._create_container(container), 120)
        except Exception as error:
            raise StoreSaturated(f"creating the side's container failed: {error!r:.200}") from error
        try:
            window = LoadWindow()
            try:
                return await self._run_side(result, impl, partitions, processors, sizing, container, hub, deadline)
            finally:
                result.load = window.reading()
        finally:
            await self.delete_container(self.connection_string, container)

    async def _run_side(self, result: SideResult, impl: str, partitions: int, processors: int, sizing: Sizing,
                        container: str, hub: str, deadline: float) -> SideResult:
        args = self.args
        # Long enough for every lease of ours to be renewed once after the last claim.
        hold = args.hold if args.hold is not None else sizing.hold
        lifetime = args.ready_timeout + max(0.0, deadline - time.monotonic()) + hold + 120.0
        workers: list[Worker] = []
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
            print(f"{impl} {partitions}x{processors}: started (I={sizing.interval:g} s, "
                  f"E={sizing.expiration_of(impl):g} s)", file=sys.stderr, flush=True)
            result.ended_by = await self._wait_balanced(workers, partitions, deadline, impl)
            balanced = result.ended_by == "balanced"
            converge_end = time.time()
            azurite1 = _cpu_seconds(self.azurite_pid)
            result.waited = converge_end - go_at
            ticks = [int(w.last.get("ticks", 0)) for w in workers]
            result.ticks_waited = (min(ticks), max(ticks))
            if balanced:
                balanced_at = max(w.owned_since for w in workers)
                result.balanced_after = balanced_at - go_at
                result.ticks_to_balanced = max(w.at(balanced_at).get("ticks", 0) for w in workers)
                print(f"{impl} {partitions}x{processors}: balanced after {result.balanced_after:.1f} s, "
                      f"{result.ticks_to_balanced} ticks; holding {hold:.0f} s", file=sys.stderr, flush=True)
                await self._hold(workers, hold)
            else:
                owned = len(set().union(*(w.owned_set for w in workers)))
                why = (f"every processor had made at least {args.cap_ticks:g} ticks" if result.ended_by == "cap"
                       else "the time budget ran out first")
                result.problems.append(f"not balanced after {result.waited:.0f} s and {result.ticks_waited[0]}-"
                                       f"{result.ticks_waited[1]} ticks per processor ({why}): {owned} of "
                                       f"{partitions} partitions dispatched, shares "
                                       f"{sorted(len(w.owned_set) for w in workers)}")
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
            good, problems = check_final(owners, workers, partitions, sizing.expiration_of(impl))
            result.final_owned = good
            result.problems += problems[:5] + ([f"... and {len(problems) - 5} more"] if len(problems) > 5 else [])
            counts = [len(w.owned_set) for w in workers]
            result.shares = (min(counts), max(counts))
            self._phases(result, workers, go_at, converge_end, end, (azurite0, azurite1, azurite2))
        finally:
            await asyncio.gather(*(w.stop(args.stop_timeout) for w in workers), return_exceptions=True)
        return result

    def _phases(self, result: SideResult, workers: list[Worker], go_at: float, converge_end: float, end: float,
                azurite: tuple[float | None, ...]) -> None:
        def phase(start: float, stop: float, cpu0: float | None, cpu1: float | None) -> Phase:
            first = [w.at(start) if start > go_at else {"cpu": 0.0, "requests": 0, "t": go_at} for w in workers]
            last = [w.at(stop) for w in workers]
            seconds = statistics.mean(b.get("t", stop) - a.get("t", start) for a, b in zip(first, last, strict=False))
            pairs = list(zip(first, last, strict=False))
            return Phase(seconds=seconds,
                         requests=sum(b.get("requests", 0) - a.get("requests", 0) for a, b in pairs),
                         cpu=[b.get("cpu", 0.0) - a.get("cpu", 0.0) for a, b in zip(first, last, strict=False)],
                         azurite_cpu=None if cpu0 is None or cpu1 is None else cpu1 - cpu0)

        result.converge = phase(go_at, converge_end, azurite[0], azurite[1])
        if result.balanced_after is not None:
            result.hold = phase(converge_end, end, azurite[1], azurite[2])
        totals: dict[str, int] = {}
        for worker in workers:
            for key in ("ticks", "overruns", "overrun_warnings", "missed_renewals", "renewals", "failed_renewals",
                        "self_fenced", "claims", "lost", "store_timeouts", "backed_off"):
                totals[key] = totals.get(key, 0) + int(worker.last.get(key, 0))
            result.max_tick = max(result.max_tick, float(worker.last.get("max_tick", 0.0)))
            result.loop_lag = max(result.loop_lag, float(worker.last.get("loop_lag", 0.0)))
            result.backoff_level = max([result.backoff_level] + [int(st.get("backoff_level", 0))
                                                                 for st in worker.states])
        result.counters = totals
        if result.balanced_after is not None:
            result.moved_while_held = sum(int(w.at(end).get("claims", 0)) - int(w.at(converge_end).get("claims", 0))
                                          for w in workers)

    async def _until(self, condition: Any, timeout: float, workers: list[Worker], what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            dead = [w for w in workers if not w.alive]
            if dead:
                raise RuntimeError(f"{what}: {len(dead)} worker(s) exited\n" + dead[0].diagnostics())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not happen within {timeout:.0f} s\n" + workers[0].diagnostics())
            await asyncio.sleep(0.1)

    async def _wait_balanced(self, workers: list[Worker], partitions: int, deadline: float, impl: str) -> str:
        """Wait until balanced (``"balanced"``), until every processor has made the cap's
        ticks (``"cap"``) or until ``deadline`` (``"budget"``)."""
        reported = time.monotonic()
        while time.monotonic() < deadline:
            dead = [w for w in workers if not w.alive]
            if dead:
                raise RuntimeError(f"{impl}: {len(dead)} worker(s) exited\n" + dead[0].diagnostics())
            if _balanced(workers, partitions):
                return "balanced"
            if min(int(w.last.get("ticks", 0)) for w in workers) >= self.args.cap_ticks:
                return "cap"
            if time.monotonic() - reported > 30:
                reported = time.monotonic()
                owned = len(set().union(*(w.owned_set for w in workers)))
                ticks = [int(w.last.get("ticks", 0)) for w in workers]
                print(f"  ... {owned}/{partitions} dispatched, shares {sorted(len(w.owned_set) for w in workers)}, "
                      f"ticks {min(ticks)}-{max(ticks)}", file=sys.stderr, flush=True)
            await asyncio.sleep(0.1)
        return "budget"

    async def _hold(self, workers: list[Worker], seconds: float) -> None:
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
    sides: dict[str, SideResult] = field(default_factory=dict)
    error: str | None = None
    not_run: str | None = None  # why this size was measured and sized but not run
    skipped: dict[str, str] = field(default_factory=dict)  # impl -> why that side was not run


def cap_seconds(args: argparse.Namespace, sizing: Sizing) -> float:
    """How long the cap's ticks take when every tick keeps time (10 % slack, 30 s start-up)."""
    return args.cap_ticks * 1.1 * sizing.interval + 30.0


def side_seconds(args: argparse.Namespace, sizing: Sizing, processors: int) -> float:
    """The longest one side takes when its ticks keep time: imports, the cap, holding, stopping."""
    hold = args.hold if args.hold is not None else sizing.hold
    return _overhead(args, processors) + cap_seconds(args, sizing) + hold


def _overhead(args: argparse.Namespace, processors: int) -> float:
    """Imports of the workers, the final listing and stopping: what a side takes beside balancing."""
    return min(args.ready_timeout, 2.0 * processors) + 30.0


async def run_sizes(args: argparse.Namespace, connection_string: str, azurite_pid: int | None, *,
                    sizes: list[tuple[int, int]] | None = None, started: float | None = None,
                    first_index: int = 0) -> list[SizeResult]:
    """Run ``sizes`` (``args.sizes`` by default) on one Azurite. ``started``: when the
    budget began (now by default); ``first_index``: the position of the first size in
    the whole run (the order of the sides alternates with it)."""
    machine = os.cpu_count() or 1
    started = time.monotonic() if started is None else started
    budget_end = started + args.budget_minutes * 60
    results: list[SizeResult] = []
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
            order = [impl for impl in (IMPLS if index % 2 == 0 else IMPLS[::-1]) if impl in args.impls]
            need = side_seconds(args, sizing, processors)
            # A size runs whole or not at all: one side alone compares nothing (the first
            # side skipped for want of time, the second then found the time left over).
            whole_left = budget_end - time.monotonic()
            whole = need * len(order) > whole_left
            for position, impl in enumerate(order):
                # The sides after this one keep what they need; this one may use the rest
                # when its ticks overrun, and is cut there ("budget"), never at the cap.
                reserved = need * (len(order) - position - 1)
                left = budget_end - time.monotonic() - reserved
                if whole or need > left:
                    size.skipped[impl] = (
                        f"sized at I = {sizing.interval:g} s, each side could take {need / 60:.0f} min "
                        f"({args.cap_ticks:g} ticks to the cap, then {sizing.hold:.0f} s held so that every lease is "
                        f"renewed once) and {max(whole_left if whole else left, 0) / 60:.0f} min of the "
                        f"{args.budget_minutes:g}-minute budget were left for "
                        + (f"its {len(order)} sides (a size runs whole or not at all)" if whole else "it"))
                    print(f"{partitions}x{processors} {impl}: not run: {size.skipped[impl]}", file=sys.stderr,
                          flush=True)
                    continue
                side_sizing = ours_at_defaults(sizing) if impl == "ours" and args.ours_timing == "defaults" else sizing
                hold = args.hold if args.hold is not None else side_sizing.hold
                deadline = time.monotonic() + left - _overhead(args, processors) - hold
                try:
                    size.sides[impl] = await runner.side(impl, partitions, processors, side_sizing, deadline)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # a saturated store, a worker that died: say so, go on
                    first = (str(error) or repr(error)).splitlines()[0]
                    size.error = "; ".join(filter(None, [size.error, f"{impl}: {first}"]))
                    print(f"{partitions}x{processors} {impl} failed: {error!r:.500}", file=sys.stderr, flush=True)
            if order and len(size.skipped) == len(order):
                size.not_run = size.skipped[order[0]]
    return results


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def _waited(r: SideResult) -> str:
    if r.balanced_after is not None:
        return f"{r.balanced_after:.1f}"
    why = "cap reached" if r.ended_by == "cap" else "stopped by the time budget before the cap"
    return f"not balanced after {r.waited:.0f} ({why})"


def render(results: list[SizeResult], args: argparse.Namespace, command: str, seconds: float, load: str,
           whole: LoadReading | None = None) -> str:
    cores = os.cpu_count() or 1
    readings = [side.load for size in results for side in size.sides.values() if side.load is not None]
    lines = [
        "## Scale on Azurite: separate processes, ours vs the official EventProcessor (`scale`)",
        "",
        f"Command: `{command}` ({seconds:.0f} s). {machine_line()} Load average (1/5/15 min) at start and end: "
        f"{load}." + (f" Whole run: {whole.describe()}." if whole is not None else ""),
        "",
        *busy_flag(readings, "the figures of the flagged sides"),
        f"One Azurite per size (in-memory, 127.0.0.1), started fresh by the benchmark. Each processor is its own OS "
        f"process (`benchmarks/scale_worker.py`); all of a side start together after their imports. *ours*: "
        f"`EventProcessor` + our `BlobCheckpointStore`, reading an empty `InMemoryEventSource`. *official*: "
        f"azure-eventhub {_official_version()}'s own `EventProcessor` class (its `OwnershipManager` and "
        f"load-balancing loop) + `azure-eventhub-checkpointstoreblob-aio`, with a stand-in client that gives the "
        f"same partition ids and idle consumers instead of AMQP links. Only ownership is measured: no events on "
        f"either side. Same strategy ({args.strategy.upper()}) and interval I for both, each side with its own "
        f"SDK's ratio of expiration to interval: E = {EXPIRATION_RATIO:g}·I for ours (15 s / 75 s), "
        f"{OFFICIAL_EXPIRATION_RATIO:g}·I for the official (its 30 s / 180 s). Each side its own container on the "
        f"same Azurite; sides run one after the other (order alternating per size). Each side runs until it is "
        f"balanced or until every processor has made {args.cap_ticks:g} ticks (the cap), within the time budget "
        f"(`--budget-minutes {args.budget_minutes:g}`): a side is only started when the cap's {args.cap_ticks:g} "
        f"intervals fit in what is left of it, and one whose ticks overrun so much that the budget ends it first "
        f"says so. *Missed renewals*, the same rule for both sides, measured in each worker around the store's "
        f"`claim_ownership`: a partition the processor still dispatched more than E after the last write of its "
        f"ownership record that it sent and the store accepted (from then on another processor may take it). "
        f"*Self-fenced* (ours only): leases it gave up because no renewal succeeded in time, before they could "
        f"expire. *Overrun*: a tick longer than I (ours logs a WARNING; the official logs nothing, the worker "
        f"times its ticks).",
        "",
        "### Sizing: listing cost measured here, interval and expiration derived",
        "",
        "Rule (docs/concepts/timing.md, \"Sizing\"): c = CPU seconds of one listing of P records "
        "(client + Azurite), measured "
        f"here ({args.calibration_listings} listings, median); I = ⌈N·c / (f·C)⌉ (at least {args.min_interval:g} s) "
        f"with f = {args.cpu_budget:g} and C the cores the processors can count on: those the machine left idle "
        f"over {args.idle_sample:g} s just before (other users' work counts as busy), at least a quarter of its "
        f"{cores}; so the listings of all N processors use at most f of them. Ours also gets R = E/2 "
        f"(`ownership_renewal_age`): lease − R = 0.4·E is how long a processor can be kept from renewing (a "
        f"listing's XML parsing holds its event loop, up to N·c/C when all list at once) and still keep its "
        f"leases, and the store timeout T the processor derives from it exceeds that herd; the Blob store's own "
        f"`operation_timeout` is raised to T when T is longer than its 10 s default. The store is one more bound "
        f"(Azurite is one Node.js thread): with s its CPU seconds per listing and w per record written (both "
        f"measured here), I ≥ ⌈N·s/f⌉ keeps listings to f of that thread, and I ≥ ⌈1.5·B⌉ with "
        f"B = N·s + 2·P·w (every processor lists, a greedy start writes every claim and its checkpoint fence) lets "
        f"the start-up burst fit in T ≈ 0.67·I; I is the largest of the three. Before each side the benchmark waits "
        f"for Azurite to go idle, and each side's container is deleted after it. A side is held "
        f"R + E/10 once balanced (every lease of ours renewed once).",
        "",
        "| P x N | client ms/record | Azurite ms/record | c (s) | listing wall (s) | idle cores | C | I (s) | "
        "E ours / official (s) | listing load (cores) | herd N·c/C (s) | Azurite w (ms/record written) | "
        "store load N·s/I | burst B (s) | I bound by | ours: R / T / store operation_timeout (s) | "
        "ours: lease − R (s) | cap: 60 ticks at I (min) |".replace("60", f"{args.cap_ticks:g}"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for size in results:
        cal, s = size.calibration, size.sizing
        server = "n/a" if cal.server_ms_per_record is None else f"{cal.server_ms_per_record:.3f}"
        idle = "n/a" if cal.idle_cores is None else f"{cal.idle_cores:.1f}"
        lines.append(f"| {size.partitions} x {size.processors} | {cal.client_ms_per_record:.3f} | {server} | "
                     f"{cal.cpu:.2f} | {cal.wall:.2f} | {idle} | {s.cores:g} | {s.interval:g} | "
                     f"{s.expiration:g} / {s.official_expiration:g} | {s.listing_load:.2f} | {s.herd:.1f} | "
                     f"{'n/a' if cal.server_write_cpu is None else f'{1000 * cal.server_write_cpu:.2f}'} | "
                     f"{'n/a' if s.store_load is None else f'{s.store_load:.2f}'} | "
                     f"{'n/a' if s.burst is None else f'{s.burst:.1f}'} | {s.bound_by} | "
                     f"{s.renewal_age:g} / {s.store_timeout:.1f} / "
                     f"{s.operation_timeout:g} | {s.stall_room:.1f} | {cap_seconds(args, s) / 60:.1f} |")
    for size in results:
        if args.ours_timing == "defaults":
            ours = ours_at_defaults(size.sizing)
            timing = (f"official: I = {size.sizing.interval:g} s, E = {size.sizing.official_expiration:g} s; ours at "
                      f"EventProcessor's defaults: I = {ours.interval:g} s, E = {ours.expiration:g} s")
        else:
            timing = (f"I = {size.sizing.interval:g} s; E = {size.sizing.expiration:g} s ours, "
                      f"{size.sizing.official_expiration:g} s official")
        lines += ["", f"### {size.partitions} partitions x {size.processors} processors ({timing})", ""]
        if size.not_run:
            lines += [f"**Not run**: {size.not_run}."]
            continue
        if size.error:
            lines += [f"**Failed**: {size.error}", ""]
        for impl, why in size.skipped.items():
            lines += [f"**{impl} not run**: {why}.", ""]
        sides = [size.sides.get(impl) for impl in IMPLS]
        lines += ["| | ours | official |", "|---|---:|---:|"]

        def row(label: str, value: Any, lines: list[str] = lines, sides: list[Any] = sides) -> None:
            lines.append(f"| {label} | " + " | ".join("-" if side is None else value(side) for side in sides) + " |")

        row("seconds to balanced (from the common start)", _waited)
        row("ticks to balanced (busiest processor)",
            lambda r: str(r.ticks_to_balanced) if r.ticks_to_balanced is not None
            else f"not balanced after {r.ticks_waited[0]}-{r.ticks_waited[1]} per processor")
        row("missed renewals (same rule both sides; must be 0)", lambda r: str(r.counters.get("missed_renewals", 0)))
        row("leases given up before they could expire (ours: self-fenced)",
            lambda r: str(r.counters.get("self_fenced", 0)) if r.impl == "ours" else "no leases")
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
        row("renewals / failed renewals (same rule both sides)",
            lambda r: f"{r.counters.get('renewals', 0)} / {r.counters.get('failed_renewals', 0)}")
        row("claims won / partitions lost", lambda r: f"{r.counters.get('claims', 0)} / {r.counters.get('lost', 0)}")
        row("claims while held (after balanced)", lambda r: str(r.moved_while_held))
        row("requests/s to balanced (all processors)", lambda r: f"{r.converge.requests_per_second:.0f}")
        row("requests/s while held (all processors)",
            lambda r: "-" if r.balanced_after is None else f"{r.hold.requests_per_second:.1f}")
        row("storage requests per hour per processor at rest (while held)",
            lambda r, n=size.processors: "-" if r.balanced_after is None
            else f"{r.hold.requests_per_second * 3600 / n:,.0f}")
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
        row("other processes on the machine meanwhile (cores) / 1-min load average",
            lambda r: "n/a" if r.load is None else
            f"{'n/a' if r.load.other_cores is None else f'{r.load.other_cores:.2f}'} / "
            f"{'n/a' if r.load.load_start is None else f'{r.load.load_start:.1f}'}-"
            f"{'n/a' if r.load.load_end is None else f'{r.load.load_end:.1f}'}")
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


def _verdict(results: list[SizeResult], args: argparse.Namespace) -> list[str]:
    cores = os.cpu_count() or 1
    held, not_held, official = [], [], []
    for size in results:
        ours = size.sides.get("ours")
        label = f"{size.partitions} x {size.processors}"
        theirs = size.sides.get("official")
        if theirs is not None:
            official.append(f"{label}: " + (
                f"balanced after {theirs.balanced_after:.1f} s and {theirs.ticks_to_balanced} ticks"
                if theirs.balanced_after is not None else
                f"not balanced after {theirs.waited:.0f} s and {theirs.ticks_waited[0]}-{theirs.ticks_waited[1]} "
                f"ticks per processor ({'the cap' if theirs.ended_by == 'cap' else 'the time budget'} ended it)")
                + f", {theirs.counters.get('missed_renewals', 0)} missed renewals")
        elif "official" in size.skipped:
            official.append(f"{label}: not run ({size.skipped['official']})")
        if ours is not None and ours.balanced_after is not None and ours.every_partition_owned_once \
                and ours.counters.get("missed_renewals", 0) == 0:
            held.append(label)
            continue
        if size.not_run or "ours" in size.skipped:
            not_held.append(f"{label}: not run; {size.not_run or size.skipped['ours']}")
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
    if official:
        lines += ["", "**The official processor**, same interval, its own expiration ratio:", ""] + \
                 [f"- {line}." for line in official]
    return lines


# --------------------------------------------------------------------------- main


def _sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        partitions, _, processors = part.strip().lower().partition("x")
        sizes.append((int(partitions), int(processors)))
    return sizes


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = program.parser("scale", __doc__, prog)
    parser.add_argument("--sizes", default=None,
                        help=f"comma-separated PARTITIONSxPROCESSORS (default {DEFAULT_SIZES}; --quick: {QUICK_SIZES})")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (never recorded)")
    parser.add_argument("--strategy", choices=["greedy", "balanced"], default="greedy")
    parser.add_argument("--cpu-budget", type=float, default=0.5,
                        help="fraction f of the cores that the listings of all processors may use (default 0.5)")
    parser.add_argument("--min-interval", type=float, default=1.0, help="the shortest interval the rule picks (s)")
    parser.add_argument("--ours-timing", choices=("defaults", "sized"), default="defaults",
                        help="ours at EventProcessor's default timing (its ticks list no ownership record at rest), "
                             "or at the interval sized for the official side (default: defaults)")
    parser.add_argument("--hold", type=float, default=None,
                        help="seconds to keep running once balanced (default: the renewal age + E/10, so that "
                             "every lease of ours is renewed at least once)")
    parser.add_argument("--cap-ticks", type=float, default=float(CAP_TICKS),
                        help=f"a side that is not balanced once every processor has made this many ticks is reported "
                             f"as not balanced (default {CAP_TICKS}, at least 60 for a recorded run)")
    parser.add_argument("--budget-minutes", type=float, default=DEFAULT_BUDGET_MINUTES,
                        help="the whole run's time budget: a side is only started when the cap's ticks fit in what is "
                             "left of it (keeping what the other side of the size needs); the sizes and sides that "
                             f"did not fit are sized and reported, not run (default {DEFAULT_BUDGET_MINUTES:g})")
    parser.add_argument("--calibration-listings", type=int, default=5)
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds for all workers to import")
    parser.add_argument("--stop-timeout", type=float, default=40.0)
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="seconds to wait for Azurite to go idle before a side starts (default 300)")
    parser.add_argument("--store-pid", type=int, default=None,
                        help=f"with {STORAGE_ENV} set (a storage of your own instead of the Azurite the benchmark "
                             "starts): the process id of that Azurite, to measure its CPU and wait for it to go idle")
    parser.add_argument("--size-for", metavar="JSON", default=None,
                        help="print what the sizing rule chooses for these measured costs and exit, e.g. "
                             '\'{"listing_cpu": 0.55, "processors": 16, "cores": 2}\' (optional: store_listing, '
                             "store_write, partitions, budget, min_interval)")
    parser.add_argument("--final-listing-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    parser.add_argument("--report-every", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--idle-sample", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--impls", default="ours,official", help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", default=None, help="keep each worker's stderr in this directory")
    return parser


def _size_for(parser: argparse.ArgumentParser, text: str) -> int:
    """``--size-for``: the sizing rule alone, as JSON on stdout."""
    try:
        given = json.loads(text)
        sizing = choose_timing(float(given.pop("listing_cpu")), int(given.pop("processors")),
                               float(given.pop("cores")), **given)
    except (ValueError, KeyError, TypeError) as error:
        parser.error(f"--size-for needs a JSON object with listing_cpu, processors and cores, and optionally "
                     f"store_listing, store_write, partitions, budget and min_interval: {error}")
    print(json.dumps({**vars(sizing), "hold": sizing.hold, "stall_room": sizing.stall_room,
                      "official_expiration": sizing.official_expiration}))
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark and print its tables; ``--record`` writes them to RESULTS.md.

    Example::

        python -m benchmarks.scale --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace) -> int:
        if args.size_for is not None:
            return _size_for(parser, args.size_for)
        if args.quick and args.record:
            parser.error("--quick runs are partial: they are never recorded")
        if args.record and args.cap_ticks < CAP_TICKS:
            parser.error(f"--record needs --cap-ticks of at least {CAP_TICKS}: a shorter cap is a give-up window, "
                         f"not a measurement")
        if args.quick:  # a smoke run: shorter samples, quicker reports, a short hold
            args.idle_sample, args.report_every, args.calibration_listings = 0.5, 0.25, 3
            args.hold = 5.0 if args.hold is None else args.hold
        try:
            args.sizes = _sizes(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES))
        except ValueError:
            parser.error("--sizes must look like 1024x16,4096x32")
        if any(p < 1 or n < 1 for p, n in args.sizes):
            parser.error("--sizes: partitions and processors must be positive")
        if not 0 < args.cpu_budget <= 1:
            parser.error("--cpu-budget must be in (0, 1]")
        if args.cap_ticks < 1:
            parser.error("--cap-ticks must be at least 1")
        args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
        args.unmeasured = []
        return _run(args, program.recorded_command("scale", argv))

    return program.run(parser, body, argv)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _run(args: argparse.Namespace, command: str) -> int:
    from eventprocessor.cli.user_errors import require, require_azurite

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    require(purpose="the scale benchmark", extras=["blob", "eventhub"],
            packages=[("azure.eventhub.extensions.checkpointstoreblobaio", "azure-eventhub-checkpointstoreblob-aio")])
    started = time.monotonic()
    whole = LoadWindow()
    load_start = _load_average()
    # A storage of the user's own (never on the command line: a connection string holds a key).
    given = os.environ.get(STORAGE_ENV)
    azurite = None
    if not given:
        require_azurite("the scale benchmark")
        from eventprocessor.emulators.azurite import start_azurite

        azurite = start_azurite()
    previous = None
    if threading.current_thread() is threading.main_thread():
        # SIGTERM unwinds like Ctrl-C, so that every worker and Azurite are stopped.
        previous = signal.signal(signal.SIGTERM, _interrupt)
    results: list[SizeResult] = []
    try:
        if azurite is not None:
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
            results = asyncio.run(run_sizes(args, given or "", args.store_pid, started=started))
    except KeyboardInterrupt:
        print(f"{program.command_name('scale')}: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if azurite is not None:
            azurite.stop()
    markdown = render(results, args, command, time.monotonic() - started, f"{load_start} / {_load_average()}",
                      whole.reading())
    program.report("scale", markdown, args.record)
    # 1 when ours missed a check in a size that ran (the official side's results are findings)
    failed = any(size.error or (ours is not None and (not ours.every_partition_owned_once
                                                      or ours.counters.get("missed_renewals", 0)))
                 for size in results for ours in [size.sides.get("ours")] if not size.not_run)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
