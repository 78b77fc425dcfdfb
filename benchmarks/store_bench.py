"""Checkpoint-store benchmark: our stores, the official blob store and a bare-SDK floor, on one Azurite.

Run it with ``python -m benchmarks.store_bench`` (or ``eventprocessor bench store-bench``);
``--record`` writes the tables into ``benchmarks/RESULTS.md``; ``--raw PATH`` writes every
round's measurements as JSON.
It starts its own Azurite on free loopback ports, and for each partition count (32 and
1024 by default) measures, store after store in the same round, ``--rounds`` rounds with
the store order rotated each round:

* claims/s: claiming every partition from nothing (create-if-absent, one per partition),
  then re-claiming with the etag (the renewal every tick does), over all partitions again
  and again until at least ``--phase-ops`` re-claims;
* fences/s (our stores): the fence a new owner writes right after winning a claim
  (``fence_checkpoint``: read ownership, read checkpoint, conditional write), repeated
  like the re-claims;
* checkpoints/s: ``--checkpoint-ops`` steady-state checkpoint writes by the owner (after
  one untimed write per partition, so first-write creates are not counted), and the
  client CPU per checkpoint (this process; Azurite is another);
* list-ownership latency: median and p95 of repeated listings of all N records;
* HTTP requests per operation, counted at the transport.

The stores: our ``BlobCheckpointStore`` (fenced checkpoints), the official
``azure-eventhub-checkpointstoreblob-aio`` ``BlobCheckpointStore`` (unfenced, dict API),
our ``TableCheckpointStore``, and two floors: the unavoidable work of a fenced checkpoint
written with the bare Azure SDK and nothing else, a conditional ``set_blob_metadata``
If-Match the last etag (``bare-blob``) and a conditional Table ``update_entity``
(``bare-table``), same fields, same concurrency. ``--stores memory`` runs the harness on
the in-memory store without Azurite, as a dry run.

Comparisons are per round (the stores of one round ran back to back), reported as the
median and the range of the per-round ratios: ours against the official store on the same
backend (Blob: what fencing costs), each store against its backend's floor, and our Table
store against our Blob store, labelled as a backend comparison (the official store has no
Table backend). The machine's load is measured beside every round
(:mod:`benchmarks.toolkit.machine`); a run on a busy machine is flagged as such.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import math
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventprocessor.cli.user_errors import require, require_azurite
from eventprocessor.records import Checkpoint, Ownership
from harness.counting_transport import CountingTransport

from .toolkit import program, services
from .toolkit.machine import LoadReading, LoadWindow
from .toolkit.report import busy_flag, median_range, number, package_version, table

__all__ = ["main", "measure", "StoreResult", "Summary"]

logger = logging.getLogger(__name__)

NAMESPACE = "bench.servicebus.windows.net"
EVENTHUB = "hub"
CONSUMER_GROUP = "$default"
OWNER = "bench-owner"
OFFICIAL_STORE = "azure-eventhub-checkpointstoreblob-aio"
PHASES = ("create", "reclaim", "fence", "checkpoint")

DEFAULT_PARTITIONS = (32, 1024)
DEFAULT_CONCURRENCY = 16
DEFAULT_CHECKPOINT_OPS = 4096
DEFAULT_PHASE_OPS = 1024
DEFAULT_LIST_REPEATS = 10
DEFAULT_ROUNDS = 6
ALL_STORES = ("ours-blob", "official-blob", "ours-table", "bare-blob", "bare-table")

# (store, reference, what the ratio means): per-round ratios of checkpoint throughput and client CPU.
COMPARISONS = (
    ("ours-blob", "official-blob", "fencing cost on the same backend: our Blob store vs the official Blob store"),
    ("ours-blob", "bare-blob", "our Blob store vs its floor, a bare conditional Blob write"),
    ("official-blob", "bare-blob", "the official Blob store vs the same floor"),
    ("ours-table", "bare-table", "our Table store vs its floor, a bare conditional Table update"),
    ("ours-table", "ours-blob", "backend comparison, not a peer: our Table store vs our Blob store"),
)


# --------------------------------------------------------------------------- adapters


class StoreUnderTest:
    """One store behind a uniform, per-partition interface the harness times.

    The adapter keeps the records it won so that re-claims and checkpoints use the
    etag / epoch the store handed back, the way a processor would.
    """

    name: str = "?"
    kind: str = "?"  # the --stores name
    fenced: bool = False
    checkpoint_only: bool = False  # a floor: it only writes checkpoints

    async def open(self) -> None:
        """Create what the store needs (container, table) before timing starts."""

    async def close(self) -> None:
        """Release the store's connections."""

    def request_counts(self) -> Counter | None:
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
        kind: str,
        request_counts: Callable[[], Counter | None],
        on_close: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self._store = store
        self._request_counts = request_counts
        self._on_close = on_close
        self._owned: dict[str, Ownership] = {}

    async def open(self) -> None:
        # A listing makes stores that create their container/table lazily do it now,
        # outside the timed phases.
        await self._store.list_ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP)

    async def close(self) -> None:
        await self._store.close()
        if self._on_close is not None:
            await self._on_close()

    def request_counts(self) -> Counter | None:
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
    kind = "official-blob"
    fenced = False

    def __init__(self, connection_string: str, container: str) -> None:
        from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

        self._connection_string = connection_string
        self._container = container
        self.transport = CountingTransport()
        self._store = BlobCheckpointStore.from_connection_string(
            connection_string, container, transport=self.transport
        )
        self._owned: dict[str, dict[str, Any]] = {}

    async def open(self) -> None:
        from azure.storage.blob.aio import ContainerClient

        async with ContainerClient.from_connection_string(self._connection_string, self._container) as client:
            await client.create_container()

    async def close(self) -> None:
        await self._store.close()

    def request_counts(self) -> Counter | None:
        return Counter(self.transport.requests)

    def _claim(self, partition_id: str, etag: str | None) -> dict[str, Any]:
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


class BareWrites(StoreUnderTest):
    """A floor: the conditional write a fenced checkpoint cannot do without, If-Match the etag
    of the previous write, with the bare Azure SDK and nothing else (no verification, no
    write token, no record parsing). The same four fields our stores write."""

    fenced = False
    checkpoint_only = True

    def __init__(self, client: Any, transport: CountingTransport) -> None:
        self._client = client
        self.transport = transport
        self._etags: dict[str, str] = {}

    async def close(self) -> None:
        await self._client.close()

    def request_counts(self) -> Counter | None:
        return Counter(self.transport.requests)

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        etag = self._etags.get(partition_id)
        if etag is None:  # the untimed first write of each partition creates its record
            response = await self._create(partition_id, sequence_number)
        else:
            response = await self._replace(partition_id, sequence_number, etag)
        self._etags[partition_id] = response["etag"]

    async def _create(self, partition_id: str, sequence_number: int) -> Any:
        raise NotImplementedError

    async def _replace(self, partition_id: str, sequence_number: int, etag: str) -> Any:
        raise NotImplementedError


class BareBlobWrites(BareWrites):
    """The floor of a fenced Blob checkpoint: ``set_blob_metadata`` If-Match the etag of the
    previous write, with the azure-storage-blob SDK."""

    name = "floor: bare conditional Blob write"
    kind = "bare-blob"

    def __init__(self, connection_string: str, container: str) -> None:
        from azure.storage.blob.aio import ContainerClient

        transport = CountingTransport()
        super().__init__(ContainerClient.from_connection_string(connection_string, container, transport=transport),
                         transport)

    async def open(self) -> None:
        await self._client.create_container()

    def _blob(self, partition_id: str, sequence_number: int) -> tuple[Any, dict[str, str]]:
        metadata = {"sequencenumber": str(sequence_number), "offset": str(sequence_number), "ownerid": OWNER,
                    "epoch": "1"}
        return self._client.get_blob_client(f"{NAMESPACE}/{EVENTHUB}/{CONSUMER_GROUP}/checkpoint/{partition_id}"), \
            metadata

    async def _create(self, partition_id: str, sequence_number: int) -> Any:
        blob, metadata = self._blob(partition_id, sequence_number)
        return await blob.upload_blob(b"", metadata=metadata, overwrite=True)

    async def _replace(self, partition_id: str, sequence_number: int, etag: str) -> Any:
        from azure.core import MatchConditions

        blob, metadata = self._blob(partition_id, sequence_number)
        return await blob.set_blob_metadata(metadata, etag=etag, match_condition=MatchConditions.IfNotModified)


class BareTableWrites(BareWrites):
    """The floor of a fenced Table checkpoint: ``update_entity`` (replace) If-Match the etag
    of the previous write, with the azure-data-tables SDK."""

    name = "floor: bare conditional Table update"
    kind = "bare-table"

    def __init__(self, connection_string: str, table: str) -> None:
        from azure.data.tables.aio import TableClient

        transport = CountingTransport()
        super().__init__(TableClient.from_connection_string(connection_string, table, transport=transport), transport)

    async def open(self) -> None:
        await self._client.create_table()

    @staticmethod
    def _entity(partition_id: str, sequence_number: int) -> dict[str, Any]:
        from azure.data.tables import EdmType, EntityProperty

        return {"PartitionKey": f"{NAMESPACE} {EVENTHUB} {CONSUMER_GROUP} Checkpoint", "RowKey": partition_id,
                "sequencenumber": str(sequence_number), "offset": str(sequence_number), "ownerid": OWNER,
                "epoch": EntityProperty(1, EdmType.INT64)}

    async def _create(self, partition_id: str, sequence_number: int) -> Any:
        return await self._client.create_entity(self._entity(partition_id, sequence_number))

    async def _replace(self, partition_id: str, sequence_number: int, etag: str) -> Any:
        from azure.core import MatchConditions
        from azure.data.tables import UpdateMode

        return await self._client.update_entity(self._entity(partition_id, sequence_number), mode=UpdateMode.REPLACE,
                                                etag=etag, match_condition=MatchConditions.IfNotModified)


# --------------------------------------------------------------------------- measuring


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


# --------------------------------------------------------------------------- stores


_OURS = {"ours-blob": ("ours blob (fenced)", "eventprocessor.stores.blob", "BlobCheckpointStore"),
         "ours-table": ("ours table (fenced)", "eventprocessor.stores.table", "TableCheckpointStore")}


def _ours(kind: str, connection_string: str, where: str) -> StoreUnderTest | None:
    """One of our Azure stores on ``where`` (a container or a table), its requests counted."""
    label, module, name = _OURS[kind]
    try:
        store_class = getattr(importlib.import_module(module), name)
    except ImportError as error:
        logger.warning("our %s is not available: %s", name, error)
        return None
    transport = CountingTransport()
    store = store_class.from_connection_string(connection_string, where, transport=transport)
    return ContractStore(label, store, kind=kind, request_counts=lambda: Counter(transport.requests))


def _memory() -> StoreUnderTest:
    from eventprocessor.stores import InMemoryCheckpointStore

    store = InMemoryCheckpointStore()
    return ContractStore(
        "ours in-memory (fenced)", store, kind="memory", request_counts=lambda: Counter(store.request_counts)
    )


def _make(kind: str, connection_string: str | None, partitions: int) -> StoreUnderTest | None:
    suffix = f"{partitions}{uuid.uuid4().hex[:8]}"
    if kind == "memory":
        return _memory()
    assert connection_string is not None
    if kind == "ours-blob":
        return _ours(kind, connection_string, f"bench-ours-{suffix}")
    if kind == "official-blob":
        return OfficialBlobStore(connection_string, f"bench-official-{suffix}")
    if kind == "ours-table":
        return _ours(kind, connection_string, f"benchours{suffix}")
    if kind == "bare-blob":
        return BareBlobWrites(connection_string, f"bench-bare-{suffix}")
    if kind == "bare-table":
        return BareTableWrites(connection_string, f"benchbare{suffix}")
    raise ValueError(f"unknown store {kind!r}")


# --------------------------------------------------------------------------- report


# The headline's comparisons, in the order the sentence states them.
_HEADLINE = (
    ("ours-blob", "official-blob", "the official Blob store (azure-eventhub-checkpointstoreblob-aio {version} at "
                                   "its defaults, unfenced, on the same Azurite Blob service)"),
    ("ours-blob", "bare-blob", "its floor (a bare conditional Blob write)"),
    ("ours-table", "bare-table", "its floor (a bare conditional Table update)"),
)


def _verdict(comparisons: Sequence[Comparison], loads: Sequence[LoadReading]) -> list[str]:
    """The headline: checkpoint throughput and client CPU of our stores against the official
    store and the floors, as medians of the per-round ratios with their range, per partition
    count. Only figures the tables below show; on a busy machine it says it is not a result."""
    by_key = {(c.store.kind, c.reference.kind, c.store.partitions): c for c in comparisons}
    sentences = []
    for partitions in sorted({c.store.partitions for c in comparisons}):
        parts = []
        for kind, reference, what in _HEADLINE:
            c = by_key.get((kind, reference, partitions))
            if c is None or not c.throughput:
                continue
            store = "our fenced Blob store" if kind == "ours-blob" else "our fenced Table store"
            cpu = f" with {median_range(c.cpu, '.2f', 'x')} its client CPU per checkpoint" if c.cpu else ""
            parts.append(f"{store} at {median_range(c.throughput, '.2f', 'x')} the checkpoints/s of "
                         f"{what.format(version=package_version(OFFICIAL_STORE))}{cpu}")
        if parts:
            sentences.append(f"At {partitions} partitions: " + "; ".join(parts) + ".")
    if not sentences:
        return []
    rounds = max(len(c.throughput) for c in comparisons)
    lead = "**Headline (busy machine, not a result)**" if any(r.busy for r in loads) else "**Headline**"
    return [f"{lead}, medians of {rounds} per-round ratio(s), range in brackets. "
            + " ".join(sentences), ""]


def render(
    results: list[StoreResult], *, header: str, concurrency: int, checkpoint_ops: int, phase_ops: int,
    list_repeats: int, rounds: int, loads: Sequence[LoadReading],
) -> str:
    """The section: a busy-machine flag when there is one, the stores, the comparisons."""
    summaries = summarize(results)
    lines = [
        "## Checkpoint stores on Azurite (`store_bench`)",
        "",
        header,
        "",
        *busy_flag(loads, "these figures"),
        *_verdict(compare(summaries), loads),
        f"Azurite (in-memory persistence) on 127.0.0.1, started by the benchmark; the Python client and "
        f"Azurite share the machine. Concurrency: {concurrency} asyncio workers in one process, each owning "
        f"a disjoint set of partitions. Each store gets a fresh container/table per round; {rounds} "
        f"round(s), the stores of a round run back to back, their order rotated each round; figures are the "
        f"median over rounds (min-max in brackets). Claims: every partition created once (create-if-absent), "
        f"then re-claimed with its etag, over all partitions until at least {phase_ops} re-claims. Fences (our "
        f"stores; the official one has none): the fence a new owner writes after its claim, repeated like the "
        f"re-claims. Checkpoints: {checkpoint_ops} timed steady-state writes per round (after one untimed write "
        f"per target partition; targets are the first min(N, {checkpoint_ops}) partitions). Client CPU: this "
        f"process's CPU time over the phase per operation (Azurite's is not in it). Listing: {list_repeats} "
        f"sequential listings of all N records per round, pooled. Requests: HTTP requests counted at the "
        f"transport (retries included), per operation. *official*: azure-eventhub-checkpointstoreblob-aio "
        f"{package_version(OFFICIAL_STORE)} with its defaults (one unconditional `set_blob_metadata` per checkpoint). "
        f"*floor*: the request a fenced checkpoint cannot do without, sent with the bare Azure SDK and nothing "
        f"else: a conditional write If-Match the etag of the previous one, the same four fields.",
        "",
        table(["Store", "Partitions", "timed ops per round: create / re-claim / fence / checkpoint",
               "create claims/s", "req/create", "re-claims/s", "req/re-claim", "fences/s", "req/fence",
               "checkpoints/s", "req/checkpoint", "client CPU ms/checkpoint", "list median ms", "list p95 ms",
               "req/list"],
              [[g.store, g.partitions, " / ".join(g.ops(phase) for phase in PHASES),
                g.rates("create"), number(g.requests("create"), ".2f"), g.rates("reclaim"),
                number(g.requests("reclaim"), ".2f"), g.rates("fence"), number(g.requests("fence"), ".2f"),
                g.rates("checkpoint"), number(g.requests("checkpoint"), ".2f"), g.cpu_ms("checkpoint"),
                number(g.list_median), number(g.list_p95), number(g.list_requests, ".1f")] for g in summaries],
              align="lrrrrrrrrrrrrrr"),
    ]
    lost = [g for g in summaries if g.failures("create") or g.failures("reclaim")]
    if lost:
        lines += ["", "Lost claims (should be 0 with a single owner): " + ", ".join(
            f"{g.store} @ {g.partitions}: {g.failures('create')} creates, {g.failures('reclaim')} re-claims"
            for g in lost
        )]

    comparisons = compare(summaries)
    if comparisons:
        lines += [
            "",
            "Checkpoints compared round by round (the stores of a round ran back to back): the median and the range "
            "of the per-round ratios of checkpoint throughput (below 1x: slower) and of client CPU per checkpoint "
            "(above 1x: more CPU). Ours against the official store compares like with like (one Azurite Blob "
            "service, the same blob layout, the same Azure transport): it is what fencing costs. Each store against "
            "its floor shows what is left above the request itself. The official store has no Table backend, so "
            "our Table store is compared with its own floor and, as a comparison of backends and not of "
            "implementations, with our Blob store.",
            "",
            table(["Comparison", "Partitions", "rounds", "checkpoints/s ratio, median (range)",
                   "client CPU per checkpoint ratio, median (range)", "client CPU ms/checkpoint, store vs reference",
                   "requests per checkpoint by method, store vs reference"],
                  [[c.meaning, c.store.partitions, len(c.throughput), median_range(c.throughput, ".2f", "x"),
                    median_range(c.cpu, ".2f", "x"),
                    f"{c.store.cpu_ms('checkpoint')} vs {c.reference.cpu_ms('checkpoint')}",
                    f"{c.store.methods('checkpoint')} vs {c.reference.methods('checkpoint')}"] for c in comparisons],
                  align="lrrrr"),
        ]
    fenced = [g for g in summaries if g.fenced and g.has("fence")]
    if fenced:
        lines += ["", "A fence is paid once per won claim: " + "; ".join(
            f"{g.store} @ {g.partitions}: {g.methods('fence')}" for g in fenced) + "."]
    if loads:
        lines += ["", "Load per round (all partition counts): " + "; ".join(
            f"round {i + 1}: other processes {number(r.other_cores, '.2f')} cores, 1-minute load average "
            f"{number(r.load_start)}/{number(r.load_end)} at start/end" for i, r in enumerate(loads)) + "."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = program.parser("store_bench", __doc__, prog)
    parser.add_argument(
        "--partitions", default=",".join(map(str, DEFAULT_PARTITIONS)),
        help="comma-separated partition counts (default: %(default)s)",
    )
    parser.add_argument("--concurrency", type=program.at_least_one, default=DEFAULT_CONCURRENCY,
                        help="workers (default: %(default)s)")
    parser.add_argument(
        "--checkpoint-ops", type=program.at_least_one, default=DEFAULT_CHECKPOINT_OPS,
        help="timed checkpoint writes per store, partition count and round (default: %(default)s)",
    )
    parser.add_argument(
        "--phase-ops", type=program.at_least_one, default=DEFAULT_PHASE_OPS,
        help="at least this many timed re-claims and fences per store, partition count and round "
             "(default: %(default)s)",
    )
    parser.add_argument(
        "--list-repeats", type=program.at_least_one, default=DEFAULT_LIST_REPEATS,
        help="listings per store, partition count and round (default: %(default)s)",
    )
    parser.add_argument(
        "--stores", default=",".join(ALL_STORES),
        help="comma-separated: ours-blob, official-blob, ours-table, bare-blob, bare-table, memory "
             "(default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=program.at_least_one, default=DEFAULT_ROUNDS,
        help="rounds over all stores, order rotated each round; medians and ranges reported (default: %(default)s)",
    )
    parser.add_argument("--raw", metavar="PATH", default=None,
                        help="also write every round's measurements to PATH as JSON")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    try:
        args.partitions = [int(p) for p in args.partitions.split(",") if p.strip()]
    except ValueError:
        parser.error("--partitions must be comma-separated integers")
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(args.stores) - set(ALL_STORES) - {"memory"}
    if unknown:
        parser.error(f"unknown store(s): {', '.join(sorted(unknown))} (known: {', '.join(ALL_STORES)}, memory)")
    if any(p < 1 for p in args.partitions):
        parser.error("--partitions must be positive")
    return args


async def _run(args: argparse.Namespace, connection_string: str | None
               ) -> tuple[list[StoreResult], list[LoadReading]]:
    results: list[StoreResult] = []
    loads: list[LoadReading] = []
    for round_index in range(args.rounds):
        window = LoadWindow()
        for partitions in args.partitions:
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
                            phase_ops=args.phase_ops, round_index=round_index,
                        )
                    )
                finally:
                    await adapter.close()
        loads.append(window.reading())
        print(f"round {round_index + 1}: {loads[-1].describe()}", file=sys.stderr, flush=True)
    return results, loads


# What each store needs beyond the core install: extras, and packages no extra provides.
_NEEDS = {
    "ours-blob": (["blob"], []),
    "official-blob": (["blob"], [("azure.eventhub.extensions.checkpointstoreblobaio",
                                  "azure-eventhub-checkpointstoreblob-aio")]),
    "ours-table": (["table"], []),
    "bare-blob": (["blob"], []),
    "bare-table": (["table"], []),
    "memory": ([], []),
}


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark and print the tables; with ``--record``, write them to
    benchmarks/RESULTS.md. Example::

        python -m benchmarks.store_bench --partitions 32,1024 --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        return _run_and_report(_check(parser, args), run)

    return program.run("store_bench", parser, body, argv, unrecorded=("--raw",))


def _run_and_report(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    require(purpose=f"store-bench with --stores {','.join(args.stores)}",
            extras=sorted({extra for kind in args.stores for extra in _NEEDS[kind][0]}),
            packages=[package for kind in args.stores for package in _NEEDS[kind][1]])
    with contextlib.ExitStack() as stack:
        connection_string = None
        if any(kind != "memory" for kind in args.stores):
            require_azurite("store-bench")
            connection_string = stack.enter_context(services.azurite()).connection_string
        results, loads = asyncio.run(_run(args, connection_string))
    if not results:
        print("store_bench: no store could be measured", file=sys.stderr)
        return 1
    if args.raw:
        with open(args.raw, "w") as handle:
            json.dump({"command": run.command, "rounds": [r.to_dict() for r in results],
                       "load": [vars(r) for r in loads]}, handle, indent=1)
    run.report(render(results, header=run.header(flag_busy=False), concurrency=args.concurrency,
                      checkpoint_ops=args.checkpoint_ops, phase_ops=args.phase_ops, list_repeats=args.list_repeats,
                      rounds=args.rounds, loads=loads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
