"""Timing one store at one partition count (:func:`measure`), and what the rounds say
together (:class:`Summary`, :class:`Comparison`)."""
from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..toolkit.report import median_range
from .stores import StoreUnderTest

__all__ = ["COMPARISONS", "PHASES", "Comparison", "Phase", "StoreResult", "Summary", "compare", "measure",
           "summarize"]

PHASES = ("create", "reclaim", "fence", "checkpoint")

# (store, reference, what the ratio means): per-round ratios of checkpoint throughput and client CPU.
COMPARISONS = (
    ("ours-blob", "official-blob", "fencing cost on the same backend: our Blob store vs the official Blob store"),
    ("ours-blob", "bare-blob", "our Blob store vs its floor, a bare conditional Blob write"),
    ("official-blob", "bare-blob", "the official Blob store vs the same floor"),
    ("ours-table", "bare-table", "our Table store vs its floor, a bare conditional Table update"),
    ("ours-table", "ours-blob", "backend comparison, not a peer: our Table store vs our Blob store"),
)


@dataclass
class Phase:
    """One timed phase: how many operations, how long, how many requests."""

    ops: int
    seconds: float
    methods: Counter | None
    failures: int = 0
    cpu_seconds: float = 0.0  # this (client) process only; Azurite is another process

    @property
    def requests(self) -> int | None:
        return None if self.methods is None else sum(self.methods.values())

    @property
    def per_second(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else float("inf")

    @property
    def requests_per_op(self) -> float | None:
        return None if self.requests is None or not self.ops else self.requests / self.ops

    @property
    def cpu_ms_per_op(self) -> float:
        return 1000 * self.cpu_seconds / self.ops if self.ops else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"ops": self.ops, "seconds": self.seconds,
                "methods": None if self.methods is None else dict(self.methods), "failures": self.failures,
                "cpu_seconds": self.cpu_seconds, "per_second": self.per_second, "requests_per_op": self.requests_per_op}


@dataclass
class StoreResult:
    store: str
    kind: str
    fenced: bool
    partitions: int
    round: int
    create: Phase | None  # None for a floor: it only writes checkpoints
    reclaim: Phase | None
    fence: Phase | None
    checkpoint: Phase
    list_ms: list[float] = field(default_factory=list)
    list_requests: float | None = None

    def to_dict(self) -> dict[str, Any]:
        phases = {name: None if getattr(self, name) is None else getattr(self, name).to_dict()
                  for name in ("create", "reclaim", "fence", "checkpoint")}
        return {"store": self.store, "kind": self.kind, "fenced": self.fenced, "partitions": self.partitions,
                "round": self.round, **phases, "list_ms": self.list_ms, "list_requests": self.list_requests}


@dataclass
class Summary:
    """One store at one partition count over all rounds: medians and ranges of the
    per-round figures, listings pooled."""

    store: str
    kind: str
    fenced: bool
    partitions: int
    rounds: list[StoreResult]

    def _median(self, values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    def _phases(self, phase: str) -> list[Phase]:
        return [getattr(r, phase) for r in self.rounds if getattr(r, phase) is not None]

    def has(self, phase: str) -> bool:
        return bool(self._phases(phase))

    def rate(self, phase: str) -> float:
        return statistics.median(p.per_second for p in self._phases(phase))

    def rates(self, phase: str) -> str:
        """Median (min-max) operations/s over rounds."""
        return median_range(p.per_second for p in self._phases(phase))

    def ops(self, phase: str) -> str:
        counts = sorted({p.ops for p in self._phases(phase)})
        return "-" if not counts else "/".join(str(c) for c in counts)

    def requests(self, phase: str) -> float | None:
        return self._median([p.requests_per_op for p in self._phases(phase)])

    def cpu_ms(self, phase: str) -> str:
        """Client CPU per operation (ms), median (min-max) over rounds."""
        return median_range((p.cpu_ms_per_op for p in self._phases(phase)), ",.3f")

    def methods(self, phase: str) -> str:
        """Requests per operation by HTTP method, e.g. ``HEAD 1.00 + PUT 1.00``, summed over rounds."""
        phases = self._phases(phase)
        if not phases or any(p.methods is None for p in phases):
            return "n/a"
        total: Counter = sum((p.methods for p in phases if p.methods is not None), Counter())
        ops = sum(p.ops for p in phases)
        return " + ".join(f"{method} {count / ops:.2f}" for method, count in sorted(total.items())) or "none"

    def failures(self, phase: str) -> int:
        return sum(p.failures for p in self._phases(phase))

    @property
    def list_ms(self) -> list[float]:
        return [ms for r in self.rounds for ms in r.list_ms]

    @property
    def list_median(self) -> float | None:
        return statistics.median(self.list_ms) if self.list_ms else None

    @property
    def list_p95(self) -> float | None:
        pooled = self.list_ms
        if len(pooled) < 2:
            return pooled[0] if pooled else None
        return statistics.quantiles(pooled, n=20, method="inclusive")[18]

    @property
    def list_requests(self) -> float | None:
        return self._median([r.list_requests for r in self.rounds])


def summarize(results: list[StoreResult]) -> list[Summary]:
    """Group per-round results by (store, partitions), in first-seen order."""
    groups: dict[tuple, Summary] = {}
    for r in results:
        key = (r.store, r.partitions)
        if key not in groups:
            groups[key] = Summary(r.store, r.kind, r.fenced, r.partitions, [])
        groups[key].rounds.append(r)
    return sorted(groups.values(), key=lambda g: (g.partitions, results.index(g.rounds[0])))


@dataclass(frozen=True)
class Comparison:
    """Per-round ratios of one store's checkpoints to a reference's, at one partition count."""

    store: Summary
    reference: Summary
    meaning: str
    throughput: list[float]  # store checkpoints/s over the reference's, one per round both ran
    cpu: list[float]  # store client CPU per checkpoint over the reference's


def compare(summaries: list[Summary]) -> list[Comparison]:
    found = []
    for partitions in sorted({g.partitions for g in summaries}):
        by_kind = {g.kind: g for g in summaries if g.partitions == partitions}
        for kind, reference, meaning in COMPARISONS:
            if kind not in by_kind or reference not in by_kind:
                continue
            a, b = by_kind[kind], by_kind[reference]
            rounds_b = {r.round: r for r in b.rounds}
            pairs = [(r, rounds_b[r.round]) for r in a.rounds if r.round in rounds_b]
            found.append(Comparison(
                a, b, meaning,
                [x.checkpoint.per_second / y.checkpoint.per_second for x, y in pairs],
                [x.checkpoint.cpu_ms_per_op / y.checkpoint.cpu_ms_per_op for x, y in pairs
                 if y.checkpoint.cpu_seconds > 0]))
    return found


async def _run_sharded(
    work: Sequence[Any], concurrency: int, operation: Callable[[Any], Any], shard: Callable[[Any], int]
) -> int:
    """Run ``operation`` over ``work`` on ``concurrency`` workers; return failures.

    Each item goes to worker ``shard(item) % concurrency``, so one partition is only
    ever written by one worker at a time, as with one owner per partition.
    """
    queues: list[list[Any]] = [[] for _ in range(concurrency)]
    for item in work:
        queues[shard(item) % concurrency].append(item)
    failures = 0

    async def worker(items: list[Any]) -> None:
        nonlocal failures
        for item in items:
            if not await operation(item):
                failures += 1

    await asyncio.gather(*(worker(items) for items in queues if items))
    return failures


async def _timed(
    adapter: StoreUnderTest,
    work: Sequence[Any],
    concurrency: int,
    operation: Callable[[Any], Any],
    shard: Callable[[Any], int],
) -> Phase:
    before = adapter.request_counts()
    start, cpu_start = time.perf_counter(), time.process_time()
    failures = await _run_sharded(work, concurrency, operation, shard)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    after = adapter.request_counts()
    methods = None if before is None or after is None else after - before
    return Phase(ops=len(work), seconds=seconds, methods=methods, failures=failures, cpu_seconds=cpu_seconds)


async def measure(
    adapter: StoreUnderTest, partitions: int, *, concurrency: int, checkpoint_ops: int, list_repeats: int,
    phase_ops: int = 1, round_index: int = 0,
) -> StoreResult:
    """All phases for one store at one partition count. The store must be fresh.

    Re-claims and fences go over all partitions as many times as it takes to reach
    ``phase_ops`` operations (a create can only happen once per partition)."""
    ids = [str(i) for i in range(partitions)]
    index = {pid: i for i, pid in enumerate(ids)}
    by_partition = lambda pid: index[pid]  # noqa: E731
    repeated = ids * math.ceil(phase_ops / partitions)

    await adapter.open()
    create = reclaim = fence = None
    if not adapter.checkpoint_only:
        create = await _timed(adapter, ids, concurrency, adapter.create_claim, by_partition)
        reclaim = await _timed(adapter, repeated, concurrency, adapter.reclaim, by_partition)
        if adapter.fenced:
            fence = await _timed(adapter, repeated, concurrency, adapter.fence, by_partition)

    # Checkpoints go to the first min(N, ops) partitions, round-robin; one untimed
    # write each first, so the timed phase is the steady state (no first-write creates).
    targets = ids[: min(partitions, checkpoint_ops)]

    async def write(item: Any) -> bool:
        partition_id, sequence_number = item
        await adapter.checkpoint(partition_id, sequence_number)
        return True

    await _run_sharded([(pid, 0) for pid in targets], concurrency, write, lambda item: index[item[0]])
    work = [(targets[k % len(targets)], k + 1) for k in range(checkpoint_ops)]
    checkpoint = await _timed(adapter, work, concurrency, write, lambda item: index[item[0]])

    list_ms: list[float] = []
    list_requests = None
    if not adapter.checkpoint_only:
        before = adapter.request_counts()
        for _ in range(list_repeats):
            start = time.perf_counter()
            count = await adapter.list_ownership()
            list_ms.append((time.perf_counter() - start) * 1000.0)
            if count != partitions:
                raise RuntimeError(f"{adapter.name}: listed {count} ownership records, expected {partitions}")
        after = adapter.request_counts()
        list_requests = None if before is None or after is None else sum((after - before).values()) / list_repeats
    return StoreResult(adapter.name, adapter.kind, adapter.fenced, partitions, round_index, create, reclaim, fence,
                       checkpoint, list_ms, list_requests)
