"""The skewed-load scenario with real processes: one hot partition, then a
processor slowed down, for count-based balancing, load-aware balancing and the official
processor.

Every processor is an OS process (``python -m harness.worker``) capped at
a CPU quota by a cgroup of its own (:mod:`harness.cpu_quota`): a small
VM, so that a processor given more work than its quota falls behind, as it would on a
real one, while four of them fit on two cores. Each handler spends a stated CPU time per
event (``--cpu-per-event``). The parent produces with the official producer the whole
time: ``rate`` events/s to every partition, ``hot_factor`` times that to the hot one.
The sizes (:class:`Skew`) keep the hot partition below one process's fair share, so that
a balanced assignment exists, and its owner under count balance near or above its quota.

1. The processes start together and share the partitions (by count at first, for every
   side); phase *skew* runs ``skew_seconds``.
2. One process that does not deliver the hot partition is slowed down (SIGUSR1: its
   handler's CPU per event times ``slow_factor``); phase *slowed* runs ``slow_seconds``.
3. The producer stops; the group is given ``drain_seconds`` to deliver everything.

Measured (never the SDK's own counters): each process's utilisation is its own CPU time
(its stats lines) over the wall time and its quota; the total lag is, every
``LAG_EVERY`` seconds, the hub's last enqueued sequence number of every partition (its
management call) minus the newest one any handler received; moves are the changes of
the process delivering a partition; duplicates and losses are counted from the handlers'
batch lines.

Example::

    group = LoadGroup("load", hub=hub, skew=Skew(), hub_connection_string=hub_conn,
                      storage_connection_string=azurite_conn, log_dir=str(tmp_path),
                      quotas=CpuQuotas(Skew().cores))
    try:
        outcome = await run_skewed(group)
    finally:
        await group.close()
"""
from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import signal
import statistics
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from eventprocessor import LoadPolicy
from eventprocessor.testing.recorder import most_within

from .cpu_quota import CpuQuotas
from .group import fair_shares
from .worker.process import WorkerHandle, create_container, spawn_worker

__all__ = ["LAG_EVERY", "SIDES", "LoadGroup", "LoadOutcome", "Phase", "Skew", "run_skewed"]

SIDES = ("count", "load", "official")
"""*count*: this SDK balancing partition counts (its default); *load*: this SDK with
``load_policy=LoadPolicy(...)``; *official*: azure-eventhub's ``EventHubConsumerClient``."""

LAG_EVERY = 2.0  # seconds between two readings of the hub's last enqueued sequence numbers
RECENT = 3.0  # seconds of deliveries that say who delivers a partition now
STARTUP_TIMEOUT = 90.0


@dataclass(frozen=True)
class Skew:
    """The scenario's sizes. ``cores``: each process's CPU quota; ``cpu_per_event``: the
    handler's CPU per event; ``policy``: ``LoadPolicy`` fields for the load side (empty:
    its defaults).

    Why these sizes: an ordinary partition needs 5.5 % of a process's quota (2.5 events/s
    at 5.5 ms), the hot one 55 %, and the fair share of a process (the whole load over
    the processes) is 67 %: the hot partition fits below it, so an assignment within the
    threshold exists (the hot partition and a couple of others on one process, the rest
    spread). Under count balance the hot partition's owner holds 10 partitions, 105 % of
    its quota before the SDK's own work (about 7 % more at these rates), so it falls
    behind (at 5 ms, 95 %, a quick run showed it only just keeping up); with one process
    slowed 3x, load balance still fits (about 81 % each before the SDK's work) where count
    balance does not. With 24
    partitions at 5 events/s the hot one alone filled its process (70 % of the quota for
    its handler, its client's work on top) and no plan could balance the group. 40
    partitions is above a Standard hub's 32 (a Premium hub has up to 100; the emulator
    takes it); fewer partitions cannot keep 10x below the fair share of 4 processes."""

    partitions: int = 40
    hot: str = "0"
    hot_factor: int = 10
    rate: float = 2.5
    period: float = 0.8
    processes: int = 4
    cores: float = 0.25
    cpu_per_event: float = 0.0055
    slow_factor: float = 3.0
    interval: float = 3.0
    expiry: float = 24.0
    batch: int = 20
    prefetch: int = 100
    checkpoint_events: int = 50
    skew_seconds: float = 75.0
    slow_seconds: float = 75.0
    window: float = 30.0
    drain_seconds: float = 60.0
    # The cool-down shortened from its 300 s default so that the run fits in minutes: the
    # partitions are claimed at the start, and none may move before it has passed.
    policy: tuple[tuple[str, float], ...] = (("cooldown", 30.0),)

    def __post_init__(self) -> None:
        per_period = self.rate * self.period
        if abs(per_period - round(per_period)) > 1e-9 or per_period < 1:
            raise ValueError(f"rate x period must be a whole number of events (rate {self.rate:g}/s, period "
                             f"{self.period:g} s give {per_period:g}); change one of them")
        if self.window > min(self.skew_seconds, self.slow_seconds):
            raise ValueError("window must fit in each phase (skew_seconds, slow_seconds)")

    @property
    def events_per_period(self) -> int:
        return round(self.rate * self.period)

    @property
    def total_rate(self) -> float:
        """Events/s into the hub."""
        return self.rate * (self.partitions - 1 + self.hot_factor)

    def load_policy(self) -> LoadPolicy:
        """The load side's policy: ``LoadPolicy``'s defaults with ``policy`` over them."""
        given, default = dict(self.policy), LoadPolicy()
        return LoadPolicy(threshold=given.get("threshold", default.threshold),
                          damping=given.get("damping", default.damping),
                          max_moves=int(given.get("max_moves", default.max_moves)),
                          cooldown=given.get("cooldown", default.cooldown), floor=given.get("floor", default.floor))

    def unit(self) -> float:
        """What an ordinary partition costs its process: a share of its quota."""
        return self.rate * self.cpu_per_event / self.cores

    def fair_share(self) -> float:
        """The whole load over the processes, as a share of one process's quota (the
        handlers' CPU only)."""
        return self.unit() * (self.partitions - 1 + self.hot_factor) / self.processes

    def count_hot_owner(self) -> float:
        """What the hot partition's owner needs under count balance (a fair count of
        partitions, the hot one among them), as a share of its quota."""
        most = -(-self.partitions // self.processes)
        return self.unit() * (most - 1 + self.hot_factor)


@dataclass
class Phase:
    """One phase, measured over its last ``window`` seconds."""

    name: str
    utilisation: list[float]  # per process (its CPU over its quota), in process order
    lag_start: int  # total lag at the start of the window
    lag_end: int  # total lag at its end
    lag_growth: float  # events/s, the slope of the total lag over the window (least squares)
    moves: int  # moves during the whole phase
    partitions: list[int]  # partitions each process delivered at the end of the phase
    hot_owner: int | None  # the process delivering the hot partition at the end

    @property
    def ratio(self) -> float:
        """Max over mean utilisation."""
        mean = statistics.fmean(self.utilisation) if self.utilisation else 0.0
        return max(self.utilisation) / mean if mean > 0 else float("nan")


@dataclass
class LoadOutcome:
    """What one side's run measured."""

    side: str
    skew: Skew
    phases: list[Phase] = field(default_factory=list)
    produced: int = 0
    duplicates: int = 0
    lost: int = 0  # events never delivered, counted once the group drained (or at the deadline)
    drained_after: float | None = None  # seconds from the producer's stop to every event delivered
    moves: int = 0
    quick_returns: int = 0  # moves of a partition back to a process it left within the cool-down
    moved_within_cooldown: int = 0  # moves of a partition that had moved less than the cool-down before
    burst: int = 0  # most moves out of one process within one load-balancing interval, at the new owner's first batch
    burst_handed: int | None = None  # ours: most handoffs one process logged within one interval (None: official)
    checkpoint_timeouts: int = 0  # ours: checkpoints that timed out (left to the next one, not redelivered)
    changes: dict[str, int] = field(default_factory=dict)  # ours: ownership changes by reason
    slowed: str = ""
    lag_series: list[tuple[float, int]] = field(default_factory=list)  # (seconds since the start, total lag)
    ratio_series: list[tuple[float, float]] = field(default_factory=list)  # (seconds, max/mean utilisation)
    throttled: dict[str, float] = field(default_factory=dict)  # seconds each process was held by its quota
    phase_starts: list[float] = field(default_factory=list)  # seconds since the start

    def summary(self) -> str:
        parts = [f"{self.side}: {self.produced} events, duplicates {self.duplicates}, lost {self.lost}, "
                 f"moves {self.moves} (back within the cool-down {self.quick_returns}, again within it "
                 f"{self.moved_within_cooldown}, most out of one process in one interval {self.burst}), "
                 f"drained after the producer stopped: "
                 + (f"{self.drained_after:.0f} s" if self.drained_after is not None else "no")]
        for phase in self.phases:
            parts.append(f"{phase.name}: utilisation {[round(u, 2) for u in phase.utilisation]} (max/mean "
                         f"{phase.ratio:.2f}), lag {phase.lag_start} -> {phase.lag_end} ({phase.lag_growth:+.1f}/s), "
                         f"partitions {phase.partitions}, hot on {phase.hot_owner}, {phase.moves} moves")
        if self.changes:
            parts.append("ownership changes " + ", ".join(f"{k} {v}" for k, v in sorted(self.changes.items())))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["phases"] = [dict(asdict(p), ratio=p.ratio) for p in self.phases]
        return data


def _slope(points: list[tuple[float, int]]) -> float:
    if len(points) < 2:
        return 0.0
    xs = [t for t, _ in points]
    ys = [float(v) for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / den if den else 0.0


class LoadGroup:
    """The processes of one side on one hub and one blob container, the producer, and the
    lag poller."""

    def __init__(self, side: str, *, hub: str, skew: Skew, hub_connection_string: str,
                 storage_connection_string: str, log_dir: str, quotas: CpuQuotas | None) -> None:
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, not {side!r}")
        self.side = side
        self.hub = hub
        self.skew = skew
        self.hub_connection_string = hub_connection_string
        self.storage_connection_string = storage_connection_string
        self.quotas = quotas
        self.container = f"load-{side}-{uuid.uuid4().hex[:10]}"
        self.log_dir = os.path.join(log_dir, self.container)
        os.makedirs(self.log_dir, exist_ok=True)
        self.workers: list[WorkerHandle] = []
        self.started_at = time.time()
        self.sent = 0
        self.lags: list[tuple[float, dict[str, int]]] = []  # (wall time, lag per partition)
        self.failures: list[str] = []
        self._newest: dict[str, int] = {}
        self._read: list[int] = []  # per worker: batches already folded into _newest
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._container_made = False

    @property
    def partition_ids(self) -> list[str]:
        return [str(p) for p in range(self.skew.partitions)]

    def options(self) -> list[str]:
        skew = self.skew
        options = ["--impl", "official" if self.side == "official" else "ours", "--interval", f"{skew.interval:g}",
                   "--expiry", f"{skew.expiry:g}", "--strategy", "greedy", "--batch", str(skew.batch),
                   "--prefetch", str(skew.prefetch), "--checkpoint-events", str(skew.checkpoint_events),
                   "--cpu-per-event", f"{skew.cpu_per_event:g}", "--slow-factor", f"{skew.slow_factor:g}",
                   "--stats-interval", "1", "--log-level", "INFO"]
        if self.side == "load":
            options += ["--balance-by", "load"]
            for name, value in skew.policy:
                options += [f"--load-{name.replace('_', '-')}", f"{value:g}"]
        return options

    async def spawn(self, owner_id: str) -> WorkerHandle:
        if not self._container_made:  # the official store does not create its container
            await create_container(self.storage_connection_string, self.container)
            self._container_made = True
        worker = await spawn_worker(owner_id, hub=self.hub, container=self.container,
                                    hub_connection_string=self.hub_connection_string,
                                    storage_connection_string=self.storage_connection_string, log_dir=self.log_dir,
                                    extra=self.options())
        if self.quotas is not None:
            # Before its imports are done: the processor reads its quota when it starts.
            self.quotas.cap(worker.process.pid, f"{self.container}-{owner_id}")
        self.workers.append(worker)
        self._read.append(0)
        return worker

    def start(self) -> None:
        """Start producing and reading the hub's lag."""
        self._tasks = [asyncio.create_task(self._produce()), asyncio.create_task(self._poll_lag())]

    # ------------------------------------------------------------------ the hub
    async def _produce(self) -> None:
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        skew = self.skew
        counts = {pid: skew.events_per_period * (skew.hot_factor if pid == skew.hot else 1)
                  for pid in self.partition_ids}
        producer = EventHubProducerClient.from_connection_string(self.hub_connection_string, eventhub_name=self.hub)
        async with producer:
            rounds, started = 0, time.monotonic()
            while not self._stop.is_set():
                await asyncio.gather(*(producer.send_batch([EventData(b"x" * 64) for _ in range(n)], partition_id=pid)
                                       for pid, n in counts.items()))
                self.sent += sum(counts.values())
                rounds += 1
                if started + rounds * skew.period < time.monotonic() - 5 * skew.period:
                    self.failures.append(f"the producer fell behind at {time.monotonic() - started:.0f} s")
                    started = time.monotonic() - rounds * skew.period  # steady, not catching up in a burst
                await asyncio.sleep(max(0.0, started + rounds * skew.period - time.monotonic()))

    async def last_enqueued(self, client: Any) -> dict[str, int]:
        # Eight at a time: one by one, a management call each, 40 partitions took 15 s
        # under load, and a phase's 30-s window held two lag readings instead of fifteen.
        gate = asyncio.Semaphore(8)

        async def one(pid: str) -> int:
            async with gate:
                properties = await client.get_partition_properties(pid)
            return int(properties["last_enqueued_sequence_number"])

        sequences = await asyncio.gather(*(one(pid) for pid in self.partition_ids))
        return dict(zip(self.partition_ids, sequences, strict=False))

    def newest_delivered(self) -> dict[str, int]:
        for index, worker in enumerate(self.workers):
            batches = worker.batches
            for _t, pid, _first, last in batches[self._read[index]:]:
                if last > self._newest.get(pid, -1):
                    self._newest[pid] = last
            self._read[index] = len(batches)
        return dict(self._newest)

    async def _poll_lag(self) -> None:
        from azure.eventhub.aio import EventHubProducerClient

        client = EventHubProducerClient.from_connection_string(self.hub_connection_string, eventhub_name=self.hub)
        async with client:
            while True:
                at = time.time()
                enqueued = await self.last_enqueued(client)
                delivered = self.newest_delivered()
                self.lags.append((at, {pid: max(0, seq - delivered.get(pid, -1)) for pid, seq in enqueued.items()}))
                await asyncio.sleep(max(0.0, at + LAG_EVERY - time.time()))

    def total_lag(self, since: float, until: float) -> list[tuple[float, int]]:
        return [(t, sum(lag.values())) for t, lag in self.lags if since <= t <= until]

    # ------------------------------------------------------------------ the processes
    def recent(self, at: float | None = None) -> dict[str, set[int]]:
        """Partition -> the processes that delivered it in the ``RECENT`` seconds before ``at``."""
        until = time.time() if at is None else at
        result: dict[str, set[int]] = {}
        for index, worker in enumerate(self.workers):
            for t, pid, _f, _l in reversed(worker.batches):
                if t > until:
                    continue
                if t < until - RECENT:
                    break
                result.setdefault(pid, set()).add(index)
        return result

    def shares(self, at: float | None = None) -> list[int] | None:
        """Partitions each process delivers, if each partition is delivered by one; else None.
        A partition with no event lately counts where it last was (ordinary partitions see
        an event every 1/rate s, well within ``RECENT``)."""
        recent = self.recent(at)
        if any(len(who) != 1 for who in recent.values()):
            return None
        where = {pid: next(iter(who)) for pid, who in recent.items()}
        # A capped process that serves ten partitions leaves one of them up to ~3 s without a
        # batch even on a quiet machine, longer on a busy one: it still owns it.
        where.update((pid, index) for pid, index in self._last_delivered(at).items() if pid not in where)
        if set(where) != set(self.partition_ids):
            return None
        counts = [0] * len(self.workers)
        for index in where.values():
            counts[index] += 1
        return counts

    def _last_delivered(self, at: float | None = None) -> dict[str, int]:
        """Partition -> the process that delivered its latest batch before ``at``."""
        until = time.time() if at is None else at
        latest: dict[str, tuple[float, int]] = {}
        for index, worker in enumerate(self.workers):
            for t, pid, _f, _l in worker.batches:
                if t <= until and t > latest.get(pid, (float("-inf"), -1))[0]:
                    latest[pid] = (t, index)
        return {pid: index for pid, (_t, index) in latest.items()}

    def settled(self) -> bool:
        shares = self.shares()
        if shares is None or 0 in shares:
            return False
        return self.side == "load" or sorted(shares) == fair_shares(self.skew.partitions, len(self.workers))

    def utilisation(self, worker: WorkerHandle, since: float, until: float) -> float:
        """The process's CPU time over the wall time and its quota, from its own stats lines."""
        inside = [(t, cpu) for t, _events, cpu, _rss in worker.stats if since <= t <= until]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return float("nan")
        (t0, cpu0), (t1, cpu1) = inside[0], inside[-1]
        return (cpu1 - cpu0) / (t1 - t0) / self.skew.cores

    def moves(self, since: float = 0.0, until: float = float("inf")) -> list[tuple[float, str, int, int]]:
        """(time, partition, from process, to process) for every change of the process
        delivering a partition whose first batch at the new process falls in the span."""
        result = []
        for pid in self.partition_ids:
            batches = sorted((t, index) for index, w in enumerate(self.workers) for (t, p, _f, _l) in w.batches
                             if p == pid)
            for (_a_t, a), (b_t, b) in itertools.pairwise(batches):
                if a != b and since <= b_t <= until:
                    result.append((b_t, pid, a, b))
        return sorted(result)

    async def phase(self, name: str, started: float) -> Phase:
        """The phase that began at ``started`` and ends now, measured over its last window."""
        end = time.time()
        since = end - self.skew.window
        await asyncio.sleep(LAG_EVERY + 0.5)  # the lag reading at the end of the window
        lags = self.total_lag(since, end + LAG_EVERY)
        shares = self.shares(end) or [len([p for p, who in self.recent(end).items() if index in who])
                                      for index in range(len(self.workers))]
        hot = self.recent(end).get(self.skew.hot, set())
        return Phase(name=name, utilisation=[self.utilisation(w, since, end) for w in self.workers],
                     lag_start=lags[0][1] if lags else -1, lag_end=lags[-1][1] if lags else -1,
                     lag_growth=_slope(lags), moves=len(self.moves(started, end)), partitions=shares,
                     hot_owner=next(iter(hot)) if len(hot) == 1 else None)

    def delivered(self) -> set[tuple[str, int]]:
        return set().union(*(set(w.deliveries) for w in self.workers))

    async def finish(self, outcome: LoadOutcome) -> None:
        """Stop producing, give the group ``drain_seconds`` to deliver every event, count."""
        from azure.eventhub.aio import EventHubProducerClient

        self._stop.set()
        await self._tasks[0]
        stopped = time.monotonic()
        client = EventHubProducerClient.from_connection_string(self.hub_connection_string, eventhub_name=self.hub)
        async with client:
            counts = {pid: seq + 1 for pid, seq in (await self.last_enqueued(client)).items()}
        expected = {(pid, seq) for pid, count in counts.items() for seq in range(count)}
        while time.monotonic() - stopped < self.skew.drain_seconds:
            if expected <= self.delivered():
                outcome.drained_after = time.monotonic() - stopped
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(2 * self.skew.interval)  # a late duplicate would show by then
        delivered = self.delivered()
        outcome.produced = len(expected)
        outcome.duplicates = sum(sum(w.deliveries.values()) for w in self.workers) - len(delivered)
        outcome.lost = len(expected - delivered)

    def dump(self) -> None:
        with open(os.path.join(self.log_dir, "timeline.json"), "w") as handle:
            json.dump({"workers": [{"owner": w.owner_id, "pid": w.process.pid, "batches": w.batches,
                                    "ownership": w.ownership, "stats": w.stats, "published": w.published,
                                    "changes": w.changes} for w in self.workers],
                       "lags": self.lags}, handle)

    async def close(self) -> None:
        self._stop.set()
        for task in self._tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for worker in self.workers:
            await worker.stop()
        self.dump()


async def run_skewed(group: LoadGroup) -> LoadOutcome:
    """Run the scenario (module docstring) on ``group`` and measure it."""
    skew = group.skew
    outcome = LoadOutcome(group.side, skew)
    for index in range(skew.processes):
        await group.spawn(f"{group.side}-{index}")
    group.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not group.settled():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{group.side}: the {skew.processes} processes did not share the hub within "
                               f"{STARTUP_TIMEOUT:.0f} s (shares {group.shares()})\n"
                               + "\n".join(w.diagnostics() for w in group.workers))
        await asyncio.sleep(0.5)
    origin = time.time()
    outcome.phase_starts.append(0.0)
    sampler = asyncio.create_task(_sample_ratio(group, outcome, origin))
    try:
        await asyncio.sleep(skew.skew_seconds)
        outcome.phases.append(await group.phase("skew", origin))
        hot = group.recent().get(skew.hot, set())
        victim = next(w for index, w in enumerate(group.workers) if index not in hot)
        victim.process.send_signal(signal.SIGUSR1)
        slowed_at = time.time()
        outcome.slowed = victim.owner_id
        outcome.phase_starts.append(slowed_at - origin)
        await asyncio.sleep(max(0.0, skew.slow_seconds - (time.time() - slowed_at)))
        outcome.phases.append(await group.phase("slowed", slowed_at))
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    await group.finish(outcome)
    outcome.lag_series = [(t - origin, sum(lag.values())) for t, lag in group.lags]
    moves = group.moves(origin)
    outcome.moves = len(moves)
    cooldown = skew.load_policy().cooldown
    for t, pid, giver, taker in moves:
        earlier = [(t0, a, b) for t0, p, a, b in moves if p == pid and t - cooldown < t0 < t]
        if earlier:
            outcome.moved_within_cooldown += 1
        if any(a == taker and b == giver for _t0, a, b in earlier):
            outcome.quick_returns += 1  # back where it came from: an oscillation
    givers = {a for _t, _p, a, _b in moves}
    outcome.burst = most_within(([t for t, _p, a, _b in moves if a == giver] for giver in givers), skew.interval)
    if group.side != "official":
        # When a partition left its owner, as the owner logged it (its handoff's pump
        # finished): a new owner's first batch also waits for its next listing.
        outcome.burst_handed = most_within(
            ([t for (t, _p, reason, _e) in w.changes if reason == "handed_off" and t >= origin] for w in group.workers),
            skew.interval)
    outcome.changes = {}
    for worker in group.workers:
        for (t, _p, reason, _e) in worker.changes:
            if t >= origin:
                outcome.changes[reason] = outcome.changes.get(reason, 0) + 1
    outcome.checkpoint_timeouts = sum(w.checkpoint_timeouts for w in group.workers)
    if group.quotas is not None:
        outcome.throttled = {w.owner_id: group.quotas.throttled(f"{group.container}-{w.owner_id}")
                             for w in group.workers}
    return outcome


async def _sample_ratio(group: LoadGroup, outcome: LoadOutcome, origin: float, every: float = 5.0,
                        span: float = 15.0) -> None:
    """Max over mean utilisation over the last ``span`` seconds, every ``every`` seconds."""
    while True:
        await asyncio.sleep(every)
        now = time.time()
        values = [group.utilisation(w, now - span, now) for w in group.workers]
        if not any(math.isnan(v) for v in values) and sum(values) > 0:
            outcome.ratio_series.append((now - origin, max(values) / statistics.fmean(values)))
