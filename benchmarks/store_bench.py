"""Checkpoint-store benchmark: our stores against the official blob store, on one Azurite.

Run it with ``python -m benchmarks.store_bench`` (or ``eventprocessor bench store-bench``);
``--record`` writes the table into ``benchmarks/RESULTS.md``.
It starts its own Azurite on free loopback ports, and for each partition count (32 and
1024 by default) measures, store after store in the same run:

* claims/s: claiming every partition from nothing (create-if-absent), then re-claiming
  every partition with its etag (the renewal every tick does);
* fences/s (our stores): the fence a new owner writes right after winning a claim
  (``fence_checkpoint``: read ownership, read checkpoint, conditional write);
* checkpoints/s: steady-state checkpoint writes by the owner (after one untimed write
  per partition, so first-write creates are not counted);
* list-ownership latency: median and p95 of repeated listings of all N records;
* HTTP requests per operation, counted at the transport.

The stores: our ``BlobCheckpointStore`` (fenced checkpoints), the official
``azure-eventhub-checkpointstoreblob-aio`` ``BlobCheckpointStore`` (unfenced, dict API),
our ``TableCheckpointStore`` when it is importable, and optionally the in-memory store
(``--stores memory`` runs the harness without Azurite, as a dry run). Every measurement
is bounded in operation count; concurrency is fixed and printed with the results. The
cost of fencing is reported as ratios of our fenced checkpoint throughput and requests
to the official store's unfenced ones.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

try:
    from azure.core.pipeline.transport import AioHttpTransport
except ImportError:  # no [blob] extra: --help and the in-memory dry run still work; main() says what to install
    AioHttpTransport = object  # type: ignore[misc,assignment]

from eventprocessor.records import Checkpoint, Ownership
from eventprocessor_cli.user_errors import require, require_azurite

from . import program
from .results import machine_line

__all__ = ["main", "measure", "CountingTransport", "StoreResult", "Summary"]

logger = logging.getLogger(__name__)

NAMESPACE = "bench.servicebus.windows.net"
EVENTHUB = "hub"
CONSUMER_GROUP = "$default"
OWNER = "bench-owner"

DEFAULT_PARTITIONS = (32, 1024)
DEFAULT_CONCURRENCY = 16
DEFAULT_CHECKPOINT_OPS = 256
DEFAULT_LIST_REPEATS = 10
DEFAULT_ROUNDS = 2
ALL_STORES = ("ours-blob", "official-blob", "ours-table")


class CountingTransport(AioHttpTransport):
    """An aiohttp transport that counts the HTTP requests it sends, by method.

    Passed as ``transport=`` to the Azure clients, so every attempt (retries included)
    is counted the same way for every store, without touching their code.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: Counter = Counter()

    async def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.requests[request.method] += 1
        return await super().send(request, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


# --------------------------------------------------------------------------- adapters


class StoreUnderTest:
    """One store behind a uniform, per-partition interface the harness times.

    The adapter keeps the records it won so that re-claims and checkpoints use the
    etag / epoch the store handed back, the way a processor would.
    """

    name: str = "?"
    fenced: bool = False

    async def open(self) -> None:
        """Create what the store needs (container, table) before timing starts."""

    async def close(self) -> None:
        """Release the store's connections."""

    def request_counts(self) -> Optional[Counter]:
        """Requests sent so far by HTTP method, or None when the store cannot be counted."""
        return None

    async def create_claim(self, partition_id: str) -> bool:
        raise NotImplementedError

    async def reclaim(self, partition_id: str) -> bool:
        raise NotImplementedError

    async def fence(self, partition_id: str) -> bool:
        """What a new owner does after its claim, before it checkpoints (fenced stores only)."""
        raise NotImplementedError

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        raise NotImplementedError

    async def list_ownership(self) -> int:
        raise NotImplementedError


class ContractStore(StoreUnderTest):
    """Any of our stores, through the ``CheckpointStore`` contract (records, epochs)."""

    fenced = True

    def __init__(
        self,
        name: str,
        store: Any,
        *,
        request_counts: Callable[[], Optional[Counter]],
        on_close: Optional[Callable[[], Any]] = None,
    ) -> None:
        self.name = name
        self._store = store
        self._request_counts = request_counts
        self._on_close = on_close
        self._owned: Dict[str, Ownership] = {}

    async def open(self) -> None:
        # A listing makes stores that create their container/table lazily do it now,
        # outside the timed phases.
        await self._store.list_ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP)

    async def close(self) -> None:
        await self._store.close()
        if self._on_close is not None:
            await self._on_close()

    def request_counts(self) -> Optional[Counter]:
        return self._request_counts()

    async def create_claim(self, partition_id: str) -> bool:
        claim = Ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP, partition_id, OWNER, epoch=1)
        won = await self._store.claim_ownership([claim])
        for record in won:
            self._owned[record.partition_id] = record
        return bool(won)

    async def reclaim(self, partition_id: str) -> bool:
        won = await self._store.claim_ownership([self._owned[partition_id]])
        for record in won:
            self._owned[record.partition_id] = record
        return bool(won)

    async def fence(self, partition_id: str) -> bool:
        await self._store.fence_checkpoint(self._owned[partition_id])
        return True

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        record = self._owned[partition_id]
        await self._store.update_checkpoint(
            Checkpoint(NAMESPACE, EVENTHUB, CONSUMER_GROUP, partition_id, sequence_number, str(sequence_number)),
            owner_id=record.owner_id,
            epoch=record.epoch,
        )

    async def list_ownership(self) -> int:
        listing = await self._store.list_ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP)
        return len(listing.ownerships)


class OfficialBlobStore(StoreUnderTest):
    """``azure-eventhub-checkpointstoreblob-aio``: dict records, unfenced checkpoints.

    Its vendored client rejects ``UseDevelopmentStorage=true``, so it gets the explicit
    connection string; it does not create its container, so :meth:`open` does.
    """

    name = "official blob (unfenced)"
    fenced = False

    def __init__(self, connection_string: str, container: str) -> None:
        from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

        self._connection_string = connection_string
        self._container = container
        self.transport = CountingTransport()
        self._store = BlobCheckpointStore.from_connection_string(
            connection_string, container, transport=self.transport
        )
        self._owned: Dict[str, Dict[str, Any]] = {}

    async def open(self) -> None:
        from azure.storage.blob.aio import ContainerClient

        async with ContainerClient.from_connection_string(self._connection_string, self._container) as client:
            await client.create_container()

    async def close(self) -> None:
        await self._store.close()

    def request_counts(self) -> Optional[Counter]:
        return Counter(self.transport.requests)

    def _claim(self, partition_id: str, etag: Optional[str]) -> Dict[str, Any]:
        return {
            "fully_qualified_namespace": NAMESPACE,
            "eventhub_name": EVENTHUB,
            "consumer_group": CONSUMER_GROUP,
            "partition_id": partition_id,
            "owner_id": OWNER,
            "etag": etag,
        }

    async def create_claim(self, partition_id: str) -> bool:
        won = list(await self._store.claim_ownership([self._claim(partition_id, None)]))
        for record in won:
            self._owned[record["partition_id"]] = record
        return bool(won)

    async def reclaim(self, partition_id: str) -> bool:
        won = list(await self._store.claim_ownership([self._claim(partition_id, self._owned[partition_id]["etag"])]))
        for record in won:
            self._owned[record["partition_id"]] = record
        return bool(won)

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        await self._store.update_checkpoint(
            {
                "fully_qualified_namespace": NAMESPACE,
                "eventhub_name": EVENTHUB,
                "consumer_group": CONSUMER_GROUP,
                "partition_id": partition_id,
                "sequence_number": sequence_number,
                "offset": str(sequence_number),
            }
        )

    async def list_ownership(self) -> int:
        return len(list(await self._store.list_ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP)))


# --------------------------------------------------------------------------- measuring


@dataclass
class Phase:
    """One timed phase: how many operations, how long, how many requests."""

    ops: int
    seconds: float
    methods: Optional[Counter]
    failures: int = 0
    cpu_seconds: float = 0.0  # this (client) process only; Azurite is another process

    @property
    def requests(self) -> Optional[int]:
        return None if self.methods is None else sum(self.methods.values())

    @property
    def per_second(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else float("inf")

    @property
    def requests_per_op(self) -> Optional[float]:
        return None if self.requests is None or not self.ops else self.requests / self.ops


@dataclass
class StoreResult:
    store: str
    fenced: bool
    partitions: int
    create: Phase
    reclaim: Phase
    fence: Optional[Phase]
    checkpoint: Phase
    list_ms: List[float] = field(default_factory=list)
    list_requests: Optional[float] = None


@dataclass
class Summary:
    """One store at one partition count over all rounds: medians of the per-round
    rates, listings pooled."""

    store: str
    fenced: bool
    partitions: int
    rounds: List[StoreResult]

    def _median(self, values: List[Optional[float]]) -> Optional[float]:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    def rate(self, phase: str) -> float:
        return statistics.median(getattr(r, phase).per_second for r in self.rounds)

    def spread(self, phase: str) -> str:
        rates = [getattr(r, phase).per_second for r in self.rounds]
        return f"{min(rates):.0f}-{max(rates):.0f}" if len(rates) > 1 else ""

    def requests(self, phase: str) -> Optional[float]:
        return self._median([getattr(r, phase).requests_per_op for r in self.rounds])

    def cpu_ms(self, phase: str) -> float:
        """Client CPU per operation (ms), median over rounds: steadier than throughput
        on a machine shared with other work."""
        return statistics.median(1000 * getattr(r, phase).cpu_seconds / getattr(r, phase).ops for r in self.rounds)

    def methods(self, phase: str) -> str:
        """Requests per operation by HTTP method, e.g. ``HEAD 1.00 + PUT 1.00``, summed over rounds."""
        phases = [getattr(r, phase) for r in self.rounds]
        if any(p.methods is None for p in phases):
            return "n/a"
        total: Counter = sum((p.methods for p in phases), Counter())
        ops = sum(p.ops for p in phases)
        return " + ".join(f"{method} {count / ops:.2f}" for method, count in sorted(total.items())) or "none"

    def failures(self, phase: str) -> int:
        return sum(getattr(r, phase).failures for r in self.rounds)

    @property
    def list_ms(self) -> List[float]:
        return [ms for r in self.rounds for ms in r.list_ms]

    @property
    def list_median(self) -> float:
        return statistics.median(self.list_ms)

    @property
    def list_p95(self) -> float:
        pooled = self.list_ms
        if len(pooled) < 2:
            return pooled[0]
        return statistics.quantiles(pooled, n=20, method="inclusive")[18]

    @property
    def list_requests(self) -> Optional[float]:
        return self._median([r.list_requests for r in self.rounds])


def summarize(results: List[StoreResult]) -> List[Summary]:
    """Group per-round results by (store, partitions), in first-seen order."""
    groups: Dict[tuple, Summary] = {}
    for r in results:
        key = (r.store, r.partitions)
        if key not in groups:
            groups[key] = Summary(r.store, r.fenced, r.partitions, [])
        groups[key].rounds.append(r)
    return sorted(groups.values(), key=lambda g: (g.partitions, results.index(g.rounds[0])))


async def _run_sharded(
    work: Sequence[Any], concurrency: int, operation: Callable[[Any], Any], shard: Callable[[Any], int]
) -> int:
    """Run ``operation`` over ``work`` on ``concurrency`` workers; return failures.

    Each item goes to worker ``shard(item) % concurrency``, so one partition is only
    ever written by one worker at a time, as with one owner per partition.
    """
    queues: List[List[Any]] = [[] for _ in range(concurrency)]
    for item in work:
        queues[shard(item) % concurrency].append(item)
    failures = 0

    async def worker(items: List[Any]) -> None:
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
    adapter: StoreUnderTest, partitions: int, *, concurrency: int, checkpoint_ops: int, list_repeats: int
) -> StoreResult:
    """All phases for one store at one partition count. The store must be fresh."""
    ids = [str(i) for i in range(partitions)]
    index = {pid: i for i, pid in enumerate(ids)}
    by_partition = lambda pid: index[pid]  # noqa: E731

    await adapter.open()
    create = await _timed(adapter, ids, concurrency, adapter.create_claim, by_partition)
    reclaim = await _timed(adapter, ids, concurrency, adapter.reclaim, by_partition)
    fence = await _timed(adapter, ids, concurrency, adapter.fence, by_partition) if adapter.fenced else None

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

    list_ms: List[float] = []
    before = adapter.request_counts()
    for _ in range(list_repeats):
        start = time.perf_counter()
        count = await adapter.list_ownership()
        list_ms.append((time.perf_counter() - start) * 1000.0)
        if count != partitions:
            raise RuntimeError(f"{adapter.name}: listed {count} ownership records, expected {partitions}")
    after = adapter.request_counts()
    list_requests = None if before is None or after is None else sum((after - before).values()) / list_repeats
    return StoreResult(
        adapter.name, adapter.fenced, partitions, create, reclaim, fence, checkpoint, list_ms, list_requests
    )


# --------------------------------------------------------------------------- stores


def _contract_blob(connection_string: str, container: str) -> Optional[StoreUnderTest]:
    try:
        from stores.blob import BlobCheckpointStore
    except ImportError as error:
        logger.warning("our BlobCheckpointStore is not available: %s", error)
        return None
    transport = CountingTransport()
    store = BlobCheckpointStore.from_connection_string(connection_string, container, transport=transport)
    return ContractStore("ours blob (fenced)", store, request_counts=lambda: Counter(transport.requests))


def _contract_table(connection_string: str, table: str) -> Optional[StoreUnderTest]:
    try:
        from stores.table import TableCheckpointStore
    except ImportError as error:
        logger.warning("our TableCheckpointStore is not available: %s", error)
        return None
    transport = CountingTransport()
    store = TableCheckpointStore.from_connection_string(connection_string, table, transport=transport)
    return ContractStore("ours table (fenced)", store, request_counts=lambda: Counter(transport.requests))


def _memory() -> StoreUnderTest:
    from stores import InMemoryCheckpointStore

    store = InMemoryCheckpointStore()
    return ContractStore(
        "ours in-memory (fenced)", store, request_counts=lambda: Counter(store.request_counts)
    )


def _make(kind: str, connection_string: Optional[str], partitions: int) -> Optional[StoreUnderTest]:
    suffix = f"{partitions}{uuid.uuid4().hex[:8]}"
    if kind == "memory":
        return _memory()
    assert connection_string is not None
    if kind == "ours-blob":
        return _contract_blob(connection_string, f"bench-ours-{suffix}")
    if kind == "official-blob":
        return OfficialBlobStore(connection_string, f"bench-official-{suffix}")
    if kind == "ours-table":
        return _contract_table(connection_string, f"benchours{suffix}")
    raise ValueError(f"unknown store {kind!r}")


# --------------------------------------------------------------------------- report


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:  # not on every platform
        return "n/a"


def render(
    results: List[StoreResult], *, command: str, concurrency: int, checkpoint_ops: int, list_repeats: int,
    rounds: int, load: str = "",
) -> str:
    summaries = summarize(results)
    lines = [
        "## Checkpoint stores on Azurite (`store_bench`)",
        "",
        f"Command: `{command}`",
        "",
        machine_line() + (f" 1-minute load average at start and end: {load}." if load else ""),
        "",
        f"Azurite (in-memory persistence) on 127.0.0.1, started by the benchmark; the Python client and "
        f"Azurite share the machine. Concurrency: {concurrency} asyncio workers in one process, each owning "
        f"a disjoint set of partitions. Each store gets a fresh container/table per round; {rounds} "
        f"round(s), the store order rotated each round; rates are the median over rounds (min-max in "
        f"brackets). Claims: every partition created once (create-if-absent), then re-claimed once with "
        f"its etag. Fences (our stores; the official one has none): every partition fenced once after its "
        f"claim, as a new owner does before reading where to resume. Checkpoints: {checkpoint_ops} timed steady-state writes (after one untimed write per "
        f"target partition; targets are the first min(N, {checkpoint_ops}) partitions). Listing: "
        f"{list_repeats} sequential listings of all N records per round, pooled. Requests: HTTP requests "
        f"counted at the transport (retries included), per operation.",
        "",
        "| Store | Partitions | create claims/s | req/create | re-claims/s | req/re-claim | fences/s | req/fence | "
        "checkpoints/s | req/checkpoint | list median ms | list p95 ms | req/list |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def rate(summary: Summary, phase: str) -> str:
        if getattr(summary.rounds[0], phase) is None:
            return "n/a"
        spread = summary.spread(phase)
        return f"{summary.rate(phase):.0f}" + (f" ({spread})" if spread else "")

    for g in summaries:
        lines.append(
            f"| {g.store} | {g.partitions} | {rate(g, 'create')} | {_fmt(g.requests('create'), 2)} | "
            f"{rate(g, 'reclaim')} | {_fmt(g.requests('reclaim'), 2)} | "
            f"{rate(g, 'fence')} | {_fmt(g.requests('fence') if g.fenced else None, 2)} | "
            f"{rate(g, 'checkpoint')} | {_fmt(g.requests('checkpoint'), 2)} | "
            f"{g.list_median:.1f} | {g.list_p95:.1f} | {_fmt(g.list_requests, 1)} |"
        )
    lost = [g for g in summaries if g.failures("create") or g.failures("reclaim")]
    if lost:
        lines += ["", "Lost claims (should be 0 with a single owner): " + ", ".join(
            f"{g.store} @ {g.partitions}: {g.failures('create')} creates, {g.failures('reclaim')} re-claims"
            for g in lost
        )]

    # Fencing cost: each fenced store's checkpoints against the unfenced ones.
    ratio_rows = []
    for g in summaries:
        if not g.fenced or "memory" in g.store:
            continue
        for peer in summaries:
            if peer.fenced or peer.partitions != g.partitions:
                continue
            ratio_rows.append(
                f"| {g.store} vs {peer.store} | {g.partitions} | "
                f"{_ratio(g.rate('checkpoint'), peer.rate('checkpoint'))} | "
                f"{_ratio(g.requests('checkpoint'), peer.requests('checkpoint'))} | "
                f"{g.cpu_ms('checkpoint'):.2f} vs {peer.cpu_ms('checkpoint'):.2f} | "
                f"{g.methods('checkpoint')} vs {peer.methods('checkpoint')} | {g.methods('fence')} |"
            )
    if ratio_rows:
        lines += [
            "",
            "Cost of fencing, as ratios of steady-state checkpoint throughput and of HTTP requests per "
            "checkpoint (throughput below 1x and requests above 1x are what fencing costs). Our stores "
            "have no unfenced mode, so the unfenced reference is the official blob store (same blob "
            "layout, same Azure transport); the table row compares across backends. Our checkpoints are "
            "conditional on the etag of the owner's fence or last write; the fence itself is paid once per "
            "claim (last column).",
            "",
            "| Fenced vs unfenced | Partitions | checkpoints/s ratio | requests/checkpoint ratio | "
            "client CPU ms/checkpoint | requests per checkpoint by method | requests per fence by method |",
            "|---|---:|---:|---:|---:|---|---|",
            *ratio_rows,
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def _parser(prog: Optional[str]) -> argparse.ArgumentParser:
    parser = program.parser("store_bench", __doc__, prog)
    parser.add_argument(
        "--partitions", default=",".join(map(str, DEFAULT_PARTITIONS)),
        help="comma-separated partition counts (default: %(default)s)",
    )
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="workers (default: %(default)s)")
    parser.add_argument(
        "--checkpoint-ops", type=int, default=DEFAULT_CHECKPOINT_OPS,
        help="timed checkpoint writes per store, partition count and round (default: %(default)s)",
    )
    parser.add_argument(
        "--list-repeats", type=int, default=DEFAULT_LIST_REPEATS,
        help="listings per store, partition count and round (default: %(default)s)",
    )
    parser.add_argument(
        "--stores", default=",".join(ALL_STORES),
        help="comma-separated: ours-blob, official-blob, ours-table, memory (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS,
        help="rounds over all stores, order rotated each round; medians reported (default: %(default)s)",
    )
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    try:
        args.partitions = [int(p) for p in args.partitions.split(",") if p.strip()]
    except ValueError:
        parser.error("--partitions must be comma-separated integers")
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(args.stores) - set(ALL_STORES) - {"memory"}
    if unknown:
        parser.error(f"unknown store(s): {', '.join(sorted(unknown))}")
    for name in ("concurrency", "checkpoint_ops", "list_repeats", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if any(p < 1 for p in args.partitions):
        parser.error("--partitions must be positive")
    return args


async def _run(args: argparse.Namespace, connection_string: Optional[str]) -> List[StoreResult]:
    results: List[StoreResult] = []
    for partitions in args.partitions:
        for round_index in range(args.rounds):
            # Rotating the order spreads the drift of a shared machine over all stores.
            shift = round_index % len(args.stores)
            for kind in args.stores[shift:] + args.stores[:shift]:
                adapter = _make(kind, connection_string, partitions)
                if adapter is None:
                    print(f"skipped {kind}: not available", file=sys.stderr)
                    continue
                print(
                    f"round {round_index + 1}/{args.rounds}: {adapter.name} at {partitions} partitions ...",
                    file=sys.stderr, flush=True,
                )
                try:
                    results.append(
                        await measure(
                            adapter, partitions, concurrency=args.concurrency,
                            checkpoint_ops=args.checkpoint_ops, list_repeats=args.list_repeats,
                        )
                    )
                finally:
                    await adapter.close()
    return results


# What each store needs beyond the core install: extras, and packages no extra provides.
_NEEDS = {
    "ours-blob": (["blob"], []),
    "official-blob": (["blob"], [("azure.eventhub.extensions.checkpointstoreblobaio",
                                  "azure-eventhub-checkpointstoreblob-aio")]),
    "ours-table": (["table"], []),
    "memory": ([], []),
}


def main(argv: Optional[List[str]] = None, prog: Optional[str] = None) -> int:
    """Run the benchmark and print the table; with ``--record``, write it to
    benchmarks/RESULTS.md. Example::

        python -m benchmarks.store_bench --partitions 32,1024 --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace) -> int:
        return _run_and_report(_check(parser, args), program.recorded_command("store_bench", argv))

    return program.run(parser, body, argv)


def _run_and_report(args: argparse.Namespace, command: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    require(purpose=f"store-bench with --stores {','.join(args.stores)}",
            extras=sorted({extra for kind in args.stores for extra in _NEEDS[kind][0]}),
            packages=[package for kind in args.stores for package in _NEEDS[kind][1]])
    azurite = None
    connection_string = None
    if any(kind != "memory" for kind in args.stores):
        require_azurite("store-bench")
        from emulators.azurite import start_azurite

        azurite = start_azurite()
        connection_string = azurite.connection_string
    load_at_start = _load_average()
    try:
        results = asyncio.run(_run(args, connection_string))
    finally:
        if azurite is not None:
            azurite.stop()
    if not results:
        print("store_bench: no store could be measured", file=sys.stderr)
        return 1
    markdown = render(
        results, command=command, concurrency=args.concurrency,
        checkpoint_ops=args.checkpoint_ops, list_repeats=args.list_repeats, rounds=args.rounds,
        load=f"{load_at_start} / {_load_average()}",
    )
    program.report("store_bench", markdown, args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
