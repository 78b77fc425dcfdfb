"""One side of one size: its processors as worker processes (:func:`spawn`), started
together, watched until balanced or capped, held, checked against the store
(:class:`Runner`), and what they measured (:class:`SideResult`)."""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from harness.worker import WorkerHandle, spawn_worker

from ..toolkit.machine import LoadReading, LoadWindow, process_cpu_seconds
from .sizing import CONSUMER_GROUP, NAMESPACE, Sizing, delete_container

__all__ = ["Phase", "Runner", "SideResult", "StoreSaturated", "check_final", "spawn", "store_owners"]


async def spawn(impl: str, owner_id: str, *, container: str, hub: str, partitions: int, sizing: Sizing,
                strategy: str, connection_string: str, log_dir: str, lifetime: float,
                report_every: float, log_level: str = "WARNING", group_join_delay: float | None = None
                ) -> WorkerHandle:
    """One processor of a side: the worker program on partitions without events
    (``--source none``), reporting state lines, started by :meth:`WorkerHandle.go`."""
    ours = ["--renewal-age", f"{sizing.renewal_age:g}", "--operation-timeout", f"{sizing.operation_timeout:g}"]
    if group_join_delay is not None:
        ours += ["--group-join-delay", f"{group_join_delay:g}"]
    options = ["--impl", impl, "--source", "none", "--partitions", str(partitions), "--interval",
               f"{sizing.interval:g}", "--expiry", f"{sizing.expiration_of(impl):g}", "--strategy", strategy,
               "--lifetime", f"{lifetime:.0f}", "--state-every", f"{report_every:g}", "--stats-interval", "0",
               "--no-ownership-lines", "--log-level", log_level, *(ours if impl == "ours" else [])]
    return await spawn_worker(owner_id, hub=hub, container=container, hub_connection_string=None,
                              storage_connection_string=connection_string, log_dir=log_dir, extra=options,
                              wait_for_go=True)


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
    listings_to_balanced: int | None = None  # ours: ownership listings of all processors until balanced
    handoffs_to_balanced: int | None = None  # ours: partitions handed over until balanced

    @property
    def every_partition_owned_once(self) -> bool:
        return self.final_owned == self.partitions and not self.problems


def _balanced(workers: list[WorkerHandle], partitions: int) -> bool:
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


def check_final(owners: dict[str, tuple[str, datetime]], workers: list[WorkerHandle], partitions: int,
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


    async def drained(self) -> float:
        """Wait until Azurite is idle (under 10 % of a core over a second): a store still
        working through requests a previous side gave up on would slow the next one.
        Returns the seconds waited; raises when it is still busy after ``--drain-timeout``."""
        started = time.monotonic()
        if self.azurite_pid is None:
            return 0.0
        while True:
            before = process_cpu_seconds(self.azurite_pid)
            await asyncio.sleep(1.0)
            after = process_cpu_seconds(self.azurite_pid)
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
            await delete_container(self.connection_string, container)

    async def _run_side(self, result: SideResult, impl: str, partitions: int, processors: int, sizing: Sizing,
                        container: str, hub: str, deadline: float) -> SideResult:
        args = self.args
        # Long enough for every lease of ours to be renewed once after the last claim.
        hold = args.hold if args.hold is not None else sizing.hold
        lifetime = args.ready_timeout + max(0.0, deadline - time.monotonic()) + hold + 120.0
        workers: list[WorkerHandle] = []
        try:
            spawned = time.monotonic()
            workers = list(await asyncio.gather(*(
                spawn(impl, f"{impl}-{partitions}x{processors}-{i}", container=container, hub=hub,
                      partitions=partitions, sizing=sizing, strategy=args.strategy,
                      connection_string=self.connection_string, log_dir=self.log_dir, lifetime=lifetime,
                      report_every=args.report_every, log_level=args.worker_log_level,
                      group_join_delay=args.group_join_delay)
                for i in range(processors))))
            await self._until(lambda: all(w.ready for w in workers), args.ready_timeout, workers,
                              f"{impl}: {processors} workers ready")
            result.spawn_seconds = time.monotonic() - spawned
            azurite0 = process_cpu_seconds(self.azurite_pid)
            for worker in workers:
                worker.go()
            go_at = time.time()
            print(f"{impl} {partitions}x{processors}: started (I={sizing.interval:g} s, "
                  f"E={sizing.expiration_of(impl):g} s)", file=sys.stderr, flush=True)
            result.ended_by = await self._wait_balanced(workers, partitions, deadline, impl)
            balanced = result.ended_by == "balanced"
            converge_end = time.time()
            azurite1 = process_cpu_seconds(self.azurite_pid)
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
            azurite2 = process_cpu_seconds(self.azurite_pid)
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

    def _phases(self, result: SideResult, workers: list[WorkerHandle], go_at: float, converge_end: float, end: float,
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
        if result.impl == "ours":
            states = [w.at(converge_end) for w in workers]
            result.listings_to_balanced = sum(n for st in states for op, n in st.get("store_calls", {}).items()
                                              if op.startswith("list_ownership"))
            result.handoffs_to_balanced = sum(int(st.get("handed_off", 0)) for st in states)
        if result.balanced_after is not None:
            result.moved_while_held = sum(int(w.at(end).get("claims", 0)) - int(w.at(converge_end).get("claims", 0))
                                          for w in workers)

    async def _until(self, condition: Any, timeout: float, workers: list[WorkerHandle], what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            dead = [w for w in workers if not w.alive]
            if dead:
                raise RuntimeError(f"{what}: {len(dead)} worker(s) exited\n" + dead[0].diagnostics())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not happen within {timeout:.0f} s\n" + workers[0].diagnostics())
            await asyncio.sleep(0.1)

    async def _wait_balanced(self, workers: list[WorkerHandle], partitions: int, deadline: float, impl: str) -> str:
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

    async def _hold(self, workers: list[WorkerHandle], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            dead = [w for w in workers if not w.alive]
            if dead:
                raise RuntimeError(f"{len(dead)} worker(s) exited while holding\n" + dead[0].diagnostics())
            await asyncio.sleep(0.25)
