"""A discrete-event simulator that runs real load-balancing code under virtual time.

Two kinds of instance run side by side over stores with the same semantics and the same
request accounting:

* :class:`OursInstance` wraps this SDK's :class:`~eventprocessor.EventProcessor`; every
  tick is one ``await processor.balance_once()``, with an injected virtual clock and RNG.
* :class:`OfficialInstance` wraps azure-eventhub's async ``OwnershipManager`` (the load
  balancer inside ``azure.eventhub.aio.EventProcessor``) and mimics that processor's loop
  body: claim, fetch checkpoints for new partitions, dispatch what the claim returned.
  The official code reads ``time.time()`` and ``random`` at module level, so while a
  simulation runs both names are replaced by per-instance shims (see
  :func:`official_module_patched`).

Time only moves when every coroutine of the simulation is blocked on virtual time, so a
thousand ticks take seconds and a run is a deterministic function of its seed. Store
requests go through the scheduler (even with zero latency), executing at the midpoint
of their round trip; that is what makes a *lockstep* tick real: every instance lists
the same snapshot before any of them writes.

Example::

    sim = Simulation("ours", LoadBalancingStrategy.BALANCED, partitions=32, seed=1)
    for _ in range(4):
        sim.add_instance()
    result = await sim.run_until_balanced(max_ticks=50)
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import logging
import math
import random
import time as _real_time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

from eventprocessor.checkpoint_store import CheckpointStore
from eventprocessor.records import Checkpoint, Ownership, OwnershipListing

__all__ = [
    "EPOCH",
    "VirtualScheduler",
    "VirtualClock",
    "Ledger",
    "SimulatedStore",
    "OfficialSimStore",
    "OursInstance",
    "OfficialInstance",
    "Simulation",
    "official_module_patched",
    "minimal_moves",
]

logger = logging.getLogger(__name__)

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
EPOCH_SECONDS = EPOCH.timestamp()
NAMESPACE = "memory.local"
EVENTHUB = "hub"
CONSUMER_GROUP = "$default"


# --------------------------------------------------------------------------- scheduler


class SimulationStalled(RuntimeError):
    """A coroutine of the simulation kept running without ever waiting on virtual time."""


class VirtualScheduler:
    """Virtual time: a heap of (time, sequence) wake-ups, run in order.

    Events at the same virtual time run in the order they were scheduled, which is
    what sequences a lockstep tick (all lists before any write).
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: List[Tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._groups: Dict[float, List[Any]] = {}

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), callback))

    async def sleep_until(self, when: float) -> None:
        future = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self.call_at(when, wake)
        await future

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self.now + max(0.0, seconds))

    async def write_group(self, when: float, items: Sequence[Any], execute: Callable[[Any], Any],
                          rng: random.Random) -> List[Any]:
        """Apply ``execute`` to each item at ``when``, interleaved at random with the
        items of every other batch that lands at the same instant; return the results
        in item order."""
        future = asyncio.get_running_loop().create_future()
        key = max(when, self.now)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []

            def apply() -> None:
                batches = self._groups.pop(key)
                order = [(b, i) for b, (batch_items, _ex, _fut, _res) in enumerate(batches)
                         for i in range(len(batch_items))]
                rng.shuffle(order)
                for b, i in order:
                    batch_items, batch_execute, _fut, results = batches[b]
                    results[i] = _run_now(batch_execute(batch_items[i]))
                for _items, _ex, batch_future, results in batches:
                    if not batch_future.done():
                        batch_future.set_result(results)

            self.call_at(key, apply)
        group.append((list(items), execute, future, [None] * len(items)))
        return await future

    def next_time(self) -> Optional[float]:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> Callable[[], None]:
        when, _seq, callback = heapq.heappop(self._heap)
        self.now = when
        return callback

    @staticmethod
    async def drain(limit: int = 100_000) -> None:
        """Run the event loop until nothing is runnable.

        Relies on asyncio's ready queue: when it is empty while this coroutine runs,
        every other task is waiting (on virtual time or on an event that has not
        happened), so virtual time may advance.
        """
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", None)
        for _ in range(limit):
            await asyncio.sleep(0)
            if ready is None or not ready:
                if ready is None:
                    # Without access to the ready queue, give pending callbacks a fair chance.
                    for _ in range(50):
                        await asyncio.sleep(0)
                return
        raise SimulationStalled(f"the event loop was still busy after {limit} steps")


class VirtualClock:
    """The :class:`~eventprocessor.clock.Clock` an instance sees: virtual time plus a skew."""

    def __init__(self, scheduler: VirtualScheduler, skew: float = 0.0) -> None:
        self._scheduler = scheduler
        self.skew = skew

    def monotonic(self) -> float:
        return self._scheduler.now + self.skew

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch as this instance's local clock reads them."""
        return EPOCH_SECONDS + self._scheduler.now + self.skew

    async def sleep(self, seconds: float) -> None:
        await self._scheduler.sleep(seconds)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._scheduler.now}, skew={self.skew})"


# --------------------------------------------------------------------------- ledger


@dataclass
class _Record:
    owner: str
    modified: float  # virtual seconds


@dataclass
class Ledger:
    """What the store saw, in the same terms for both implementations.

    Every executed request is reported here with the virtual time it executed at. A
    *move* is a write that gives a partition to an owner other than its last non-empty
    owner; a *steal* is a move taken from a record that had not expired.
    """

    expiration: float
    records: Dict[str, _Record] = field(default_factory=dict)
    last_owner: Dict[str, str] = field(default_factory=dict)
    requests: Counter = field(default_factory=Counter)
    moves: int = 0
    steals: int = 0
    failed_claims: int = 0
    owner_changes: int = 0
    steals_by: Counter = field(default_factory=Counter)
    version: int = 0
    touched: set = field(default_factory=set)  # owners whose records were overwritten since last looked

    def listed(self) -> None:
        self.requests["list_ownership"] += 1

    def checkpoints_listed(self) -> None:
        self.requests["list_checkpoints"] += 1

    def checkpoint_written(self) -> None:
        self.requests["update_checkpoint"] += 1

    def write(self, partition_id: str, owner: str, won: bool, now: float) -> None:
        self.version += 1
        previous = self.records.get(partition_id)
        if won and previous is not None and previous.owner:
            self.touched.add(previous.owner)
        if not owner:
            kind = "release"
        elif previous is not None and previous.owner == owner:
            kind = "renew"
        else:
            kind = "claim"
        self.requests[kind] += 1
        if not won:
            self.failed_claims += 1
            return
        if previous is None or previous.owner != owner:
            self.owner_changes += 1
        if owner:
            before = self.last_owner.get(partition_id)
            if before is not None and before != owner:
                self.moves += 1
                if previous is not None and previous.owner == before and now - previous.modified <= self.expiration:
                    self.steals += 1
                    self.steals_by[owner] += 1
            self.last_owner[partition_id] = owner
        self.records[partition_id] = _Record(owner, now)

    def live_owner(self, partition_id: str, now: float) -> Optional[str]:
        record = self.records.get(partition_id)
        if record is None or not record.owner or now - record.modified > self.expiration:
            return None
        return record.owner

    def counts(self, partition_ids: Iterable[str], owners: Iterable[str], now: float) -> Dict[str, int]:
        result = {owner: 0 for owner in owners}
        for pid in partition_ids:
            owner = self.live_owner(pid, now)
            if owner in result:
                result[owner] += 1
        return result

    def snapshot(self) -> Dict[str, Any]:
        return {
            "requests": Counter(self.requests),
            "moves": self.moves,
            "steals": self.steals,
            "failed_claims": self.failed_claims,
            "owner_changes": self.owner_changes,
        }


# --------------------------------------------------------------------------- stores


class _Latency:
    def __init__(self, scheduler: VirtualScheduler, latency: float, rng: random.Random) -> None:
        self.scheduler = scheduler
        self.latency = latency
        self._rng = rng

    def draw(self) -> float:
        # Uniform in [0, latency]: a tick sometimes takes a large share of the interval.
        return self._rng.uniform(0.0, self.latency) if self.latency > 0 else 0.0

    async def round_trip(self, execute: Callable[[], Any]) -> Any:
        delay = self.draw()
        await self.scheduler.sleep(delay / 2)
        result = execute()
        if asyncio.iscoroutine(result):
            result = await result
        await self.scheduler.sleep(delay / 2)
        return result

    async def writes(self, items: Sequence[Any], execute: Callable[[Any], Any]) -> List[Any]:
        """One round trip for a batch of writes sent concurrently.

        Batches of different instances that reach the store at the same instant are
        applied record by record in a random interleaving, as concurrent requests are
        over a network (one scheduler event per instant, not per record, so large runs
        stay fast). Lists keep their issue order, so a lockstep tick lists first.
        """
        delay = self.draw()
        results = await self.scheduler.write_group(self.scheduler.now + delay / 2, items, execute, self._rng)
        await self.scheduler.sleep(delay / 2)
        return results


def _run_now(result: Any) -> Any:
    """Finish a store coroutine that never suspends (the in-memory stores) synchronously."""
    if not asyncio.iscoroutine(result):
        return result
    try:
        result.send(None)
    except StopIteration as done:
        return done.value
    result.close()
    raise SimulationStalled("a store write suspended; simulated stores must complete at once")


class SimulatedStore(CheckpointStore):
    """This SDK's :class:`~stores.InMemoryCheckpointStore` behind virtual latency.

    Each request executes at the midpoint of its round trip; a batch claim is one
    round trip (a real store issues the writes concurrently) but is billed one request
    per record, like the inner store's ``request_counts``.
    """

    def __init__(self, inner: CheckpointStore, scheduler: VirtualScheduler, ledger: Ledger,
                 latency: float = 0.0, rng: Optional[random.Random] = None) -> None:
        self._inner = inner
        self._ledger = ledger
        self._latency = _Latency(scheduler, latency, rng or random.Random(0))
        self._scheduler = scheduler

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str,
                             consumer_group: str) -> OwnershipListing:
        async def execute() -> OwnershipListing:
            self._ledger.listed()
            return await self._inner.list_ownership(fully_qualified_namespace, eventhub_name, consumer_group)

        return await self._latency.round_trip(execute)

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> List[Ownership]:
        claims = list(ownerships)

        def execute(claim: Ownership) -> Optional[Ownership]:
            won = _run_now(self._inner.claim_ownership([claim]))
            self._ledger.write(claim.partition_id, claim.owner_id, bool(won), self._scheduler.now)
            return won[0] if won else None

        results = await self._latency.writes(claims, execute)
        return [record for record in results if record is not None]

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        async def execute() -> None:
            self._ledger.checkpoint_written()
            await self._inner.update_checkpoint(checkpoint, owner_id=owner_id, epoch=epoch)

        await self._latency.round_trip(execute)

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str,
                               consumer_group: str) -> List[Checkpoint]:
        async def execute() -> List[Checkpoint]:
            self._ledger.checkpoints_listed()
            return await self._inner.list_checkpoints(fully_qualified_namespace, eventhub_name, consumer_group)

        return await self._latency.round_trip(execute)


class OfficialSimStore:
    """The official ``CheckpointStore`` interface (dict records) with real store semantics.

    Like the Blob store the official SDK ships: ``last_modified_time`` is the *store's*
    time (float seconds), the etag changes on every write, a record without an etag is
    create-if-absent and a stale etag fails. Records are copied in and out, because the
    official balancer mutates the dicts it is given (the official in-memory store hands
    out its live dicts, which would let one instance's plan rewrite another's view).
    """

    def __init__(self, scheduler: VirtualScheduler, ledger: Ledger, latency: float = 0.0,
                 rng: Optional[random.Random] = None) -> None:
        self._records: Dict[str, Dict[str, Any]] = {}
        self._checkpoints: Dict[str, Dict[str, Any]] = {}
        self._ledger = ledger
        self._scheduler = scheduler
        self._latency = _Latency(scheduler, latency, rng or random.Random(0))

    def server_time(self) -> float:
        return EPOCH_SECONDS + self._scheduler.now

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                             **kwargs: Any) -> List[Dict[str, Any]]:
        def execute() -> List[Dict[str, Any]]:
            self._ledger.listed()
            return [dict(record) for record in self._records.values()]

        return await self._latency.round_trip(execute)

    async def claim_ownership(self, ownership_list: Iterable[Dict[str, Any]], **kwargs: Any) -> List[Dict[str, Any]]:
        claims = [dict(claim) for claim in ownership_list]

        def execute(claim: Dict[str, Any]) -> Optional[Dict[str, Any]]:
            pid = claim["partition_id"]
            current = self._records.get(pid)
            etag = claim.get("etag")
            ok = (current is None and etag is None) or (current is not None and etag is not None
                                                          and etag == current["etag"])
            self._ledger.write(pid, claim.get("owner_id") or "", ok, self._scheduler.now)
            if not ok:
                return None
            record = dict(claim, etag=str(uuid.uuid4()), last_modified_time=self.server_time())
            self._records[pid] = record
            return dict(record)

        results = await self._latency.writes(claims, execute)
        return [record for record in results if record is not None]

    async def update_checkpoint(self, checkpoint: Dict[str, Any], **kwargs: Any) -> None:
        def execute() -> None:
            self._ledger.checkpoint_written()
            self._checkpoints[checkpoint["partition_id"]] = dict(checkpoint)

        await self._latency.round_trip(execute)

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                               **kwargs: Any) -> List[Dict[str, Any]]:
        def execute() -> List[Dict[str, Any]]:
            self._ledger.checkpoints_listed()
            return [dict(c) for c in self._checkpoints.values()]

        return await self._latency.round_trip(execute)


# --------------------------------------------------------------------------- official module patch


@dataclass
class _OfficialContext:
    clock: VirtualClock
    rng: random.Random


_CURRENT_OFFICIAL: contextvars.ContextVar[_OfficialContext] = contextvars.ContextVar("official_instance")


class _TimeShim:
    """Stands in for the ``time`` module inside the official balancer: the calling
    instance's local (possibly skewed) virtual wall clock."""

    def time(self) -> float:
        return _CURRENT_OFFICIAL.get().clock.time()

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)


class _RandomShim:
    """Stands in for the ``random`` module inside the official balancer: the calling
    instance's seeded RNG."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_CURRENT_OFFICIAL.get().rng, name)


@contextlib.contextmanager
def official_module_patched() -> Iterator[Any]:
    """Point the official balancer's module-level ``time`` and ``random`` at shims that
    read the calling instance's virtual clock and RNG; restore them afterwards."""
    from azure.eventhub.aio._eventprocessor import _ownership_manager as module

    saved = (module.time, module.random)
    module.time, module.random = _TimeShim(), _RandomShim()
    try:
        yield module
    finally:
        module.time, module.random = saved


# --------------------------------------------------------------------------- instances


class _Instance:
    owner_id: str
    clock: VirtualClock

    @property
    def owned(self) -> FrozenSet[str]:
        """What the instance believes it owns."""
        raise NotImplementedError

    @property
    def dispatching(self) -> FrozenSet[str]:
        """What the instance could still deliver events of right now."""
        return self.owned

    async def tick(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """Graceful shutdown: release what it owns."""
        raise NotImplementedError

    async def crash(self) -> None:
        """Die without releasing anything."""
        raise NotImplementedError


class _QuietPartitionProcessor:
    """Built lazily (the core may not be importable when this module loads): a handler
    that counts errors instead of logging each one (stolen partitions' receivers are
    disconnected by design, thousands of times in a large run)."""

    errors = 0
    cls: Any = None

    @classmethod
    def get(cls) -> Any:
        if cls.cls is None:
            from eventprocessor import PartitionProcessor

            class Quiet(PartitionProcessor):
                async def process_error(self, error: Exception, context: Any) -> None:
                    _QuietPartitionProcessor.errors += 1

            cls.cls = Quiet
        return cls.cls


class OursInstance(_Instance):
    """This SDK's real EventProcessor, ticked through ``balance_once``."""

    def __init__(self, processor: Any, clock: VirtualClock) -> None:
        self.processor = processor
        self.owner_id = processor.owner_id
        self.clock = clock
        self.reports: List[Any] = []
        self._dead = False

    @property
    def owned(self) -> FrozenSet[str]:
        if self._dead:
            return frozenset()
        return frozenset(self.processor.owned_partitions)

    @property
    def dispatching(self) -> FrozenSet[str]:
        """Owned partitions whose pump is still live (not stopped by a takeover of its
        receiver): the ones whose events could still reach the handler."""
        if self._dead:
            return frozenset()
        live = set()
        for pid in self.processor.owned_partitions:
            pump = self.processor.pump(pid)
            if pump is not None and pump.task is not None and not pump.task.done() and not pump.stopping:
                live.add(pid)
        return frozenset(live)

    async def tick(self) -> None:
        report = await self.processor.balance_once()
        self.reports.append(report)

    async def stop(self) -> None:
        await self.processor.stop()
        self._dead = True

    async def crash(self) -> None:
        self._dead = True
        await self.processor.stop(release=False)


class _StandInClient:
    """All the official OwnershipManager needs from an EventHubConsumerClient."""

    def __init__(self, partition_ids: Callable[[], List[str]]) -> None:
        self._address = SimpleNamespace(hostname=NAMESPACE)
        self.eventhub_name = EVENTHUB
        self._partition_ids = partition_ids

    async def get_partition_ids(self) -> List[str]:
        return list(self._partition_ids())


class OfficialInstance(_Instance):
    """azure-eventhub's OwnershipManager, driven like its EventProcessor.start loop."""

    def __init__(self, owner_id: str, store: OfficialSimStore, partition_ids: Callable[[], List[str]],
                 strategy: Any, expiration: float, clock: VirtualClock, rng: random.Random) -> None:
        from azure.eventhub.aio._eventprocessor._ownership_manager import OwnershipManager

        self.owner_id = owner_id
        self.clock = clock
        self._context = _OfficialContext(clock=clock, rng=rng)
        self._manager = OwnershipManager(_StandInClient(partition_ids), CONSUMER_GROUP, owner_id, store,
                                         expiration, strategy, None)
        self._owned: FrozenSet[str] = frozenset()

    @property
    def owned(self) -> FrozenSet[str]:
        return self._owned

    async def tick(self) -> None:
        token = _CURRENT_OFFICIAL.set(self._context)
        try:
            claimed = set(await self._manager.claim_ownership())
            if claimed - self._owned:
                await self._manager.get_checkpoints()
            # The official loop cancels the tasks of partitions missing from the claim
            # result and starts tasks for new ones: what it dispatches is what it claimed.
            self._owned = frozenset(claimed)
        finally:
            _CURRENT_OFFICIAL.reset(token)

    async def stop(self) -> None:
        token = _CURRENT_OFFICIAL.set(self._context)
        try:
            owned, self._owned = sorted(self._owned), frozenset()
            for pid in owned:  # EventProcessor.stop closes each partition, releasing it
                await self._manager.release_ownership(pid)
        finally:
            _CURRENT_OFFICIAL.reset(token)

    async def crash(self) -> None:
        self._owned = frozenset()


# --------------------------------------------------------------------------- minimal moves


def minimal_moves(before: Dict[str, Optional[str]], live: Sequence[str], partition_ids: Sequence[str]) -> int:
    """The fewest ownership moves from ``before`` (partition -> owner or None) to any
    balanced assignment of ``partition_ids`` over ``live`` owners.

    Partitions of owners that are not live must move; partitions nobody owned are
    assigned without counting as moves. The optimum keeps as many partitions where they
    are as the floor/ceiling targets allow, giving the ceiling slots to the owners that
    hold the most.
    """
    if not live:
        return 0
    counts = Counter(owner for pid, owner in before.items() if pid in set(partition_ids) and owner in set(live))
    floor, extra = divmod(len(partition_ids), len(live))
    ordered = sorted((counts.get(owner, 0) for owner in live), reverse=True)
    kept = sum(min(count, floor + (1 if i < extra else 0)) for i, count in enumerate(ordered))
    had_owner = sum(1 for pid in partition_ids if before.get(pid) is not None)
    return had_owner - kept


# --------------------------------------------------------------------------- simulation


@dataclass
class Sample:
    """Partitions per live instance (by the store's live records) at one tick boundary."""

    tick: float
    counts: Dict[str, int]


@dataclass
class PhaseResult:
    """Metrics of one phase of a scenario (from ``mark`` to the end of a run call)."""

    ticks_to_balanced: Optional[float]
    balanced_at: Optional[float]
    moves: int
    steals: int
    failed_claims: int
    owner_changes: int
    requests: Counter
    instance_ticks: int
    duration: float
    max_believers: int
    max_dispatchers: int
    overlap_seconds: float  # partition-seconds during which two or more instances dispatched it
    reowned_at: Optional[float] = None


class Simulation:
    """N instances of one implementation over one store, under one virtual clock.

    ``implementation`` is ``"ours"`` or ``"official"``; ``strategy`` is this SDK's
    ``LoadBalancingStrategy`` (mapped to the official enum for the official one).
    ``schedule`` is ``"staggered"`` (each instance at its own random phase, plus
    ``tick_jitter`` x interval of random extra wait per tick) or ``"lockstep"`` (all
    instances tick at the same instants and list the same snapshot before anyone
    writes). ``latency`` is the maximum store round trip in seconds (uniform draw).
    """

    def __init__(self, implementation: str, strategy: Any, partitions: int, *, interval: float = 10.0,
                 expiration: float = 60.0, schedule: str = "staggered", latency: float = 0.0,
                 tick_jitter: float = 0.0, seed: int = 0) -> None:
        if implementation not in ("ours", "official"):
            raise ValueError(f"unknown implementation {implementation!r}; expected 'ours' or 'official'")
        if schedule not in ("staggered", "lockstep"):
            raise ValueError(f"unknown schedule {schedule!r}; expected 'staggered' or 'lockstep'")
        if partitions < 1 or interval <= 0 or expiration <= 0:
            raise ValueError("partitions, interval and expiration must be positive")
        self.implementation = implementation
        self.strategy = strategy
        self.interval = interval
        self.expiration = expiration
        self.schedule = schedule
        self.tick_jitter = tick_jitter
        self.seed = seed
        self._rng = random.Random(seed)
        self.scheduler = VirtualScheduler()
        self.ledger = Ledger(expiration=expiration)
        self.partition_ids: List[str] = [str(i) for i in range(partitions)]
        self.instances: List[_Instance] = []
        self.alive: List[_Instance] = []
        self._drivers: Dict[str, asyncio.Task] = {}
        self._instance_ticks = 0
        self._origin = 0.0
        self.samples: List[Sample] = []
        self._max_believers = 0
        self._max_dispatchers = 0
        self._overlap_seconds = 0.0
        self._last_event_time = 0.0
        self._current_overlaps = 0
        self._balanced_since: Optional[float] = None
        self._dirty = True
        self._seen_version = -1
        self._stale: set = set()
        self._suspects: Dict[str, float] = {}
        self._views: Dict[str, Tuple[FrozenSet[str], FrozenSet[str]]] = {}
        self._believers: Counter = Counter()
        self._dispatchers: Counter = Counter()
        self._by_owner: Dict[str, _Instance] = {}
        self._watched: Optional[str] = None
        self._watched_stale = 0
        self.watched_stale_seconds = 0.0
        if implementation == "ours":
            from eventprocessor.sources import MemoryEventSource
            from stores import InMemoryCheckpointStore

            self.source = MemoryEventSource(partitions, eventhub_name=EVENTHUB, fully_qualified_namespace=NAMESPACE)
            inner = InMemoryCheckpointStore(clock=lambda: EPOCH + timedelta(seconds=self.scheduler.now))
            self.store: Any = SimulatedStore(inner, self.scheduler, self.ledger, latency,
                                             random.Random(self._rng.random()))
        else:
            self.source = None
            self.store = OfficialSimStore(self.scheduler, self.ledger, latency, random.Random(self._rng.random()))

    # ---- membership and topology

    def _new_owner_id(self) -> str:
        return f"{self.implementation}-{len(self.instances):03d}"

    def add_instance(self, *, skew: float = 0.0) -> _Instance:
        """Create an instance; it starts ticking when the simulation runs.

        ``skew`` is how far its local clock is ahead of the store's, in seconds.
        """
        owner_id = self._new_owner_id()
        clock = VirtualClock(self.scheduler, skew)
        rng = random.Random(self._rng.random())
        if self.implementation == "ours":
            from eventprocessor import EventProcessor

            processor = EventProcessor(
                self.source, self.store, _QuietPartitionProcessor.get(), consumer_group=CONSUMER_GROUP, owner_id=owner_id,
                load_balancing_strategy=self.strategy, load_balancing_interval=self.interval,
                partition_ownership_expiration_interval=self.expiration, clock=clock, rng=rng,
            )
            instance: _Instance = OursInstance(processor, clock)
        else:
            from azure.eventhub import LoadBalancingStrategy as OfficialStrategy

            official = OfficialStrategy(self.strategy.value) if hasattr(self.strategy, "value") else self.strategy
            instance = OfficialInstance(owner_id, self.store, lambda: list(self.partition_ids), official,
                                        self.expiration, clock, rng)
        return self.join(instance)

    def join(self, instance: _Instance) -> _Instance:
        """Schedule ``instance`` (any object with ``owner_id``, ``owned``, ``tick``,
        ``stop`` and ``crash``) to tick in this simulation from now on."""
        self.instances.append(instance)
        self.alive.append(instance)
        self._by_owner[instance.owner_id] = instance
        if self.schedule == "lockstep":
            k = math.floor((self.scheduler.now - self._origin) / self.interval + 1e-9)
            first = self._origin + k * self.interval
            if first < self.scheduler.now - 1e-9:
                first += self.interval
        else:
            first = self.scheduler.now + self._rng.uniform(0.0, self.interval)
        self._drivers[instance.owner_id] = asyncio.get_running_loop().create_task(self._drive(instance, first))
        return instance

    async def _drive(self, instance: _Instance, first: float) -> None:
        await self.scheduler.sleep_until(first)
        while True:
            started = self.scheduler.now
            await instance.tick()
            self._instance_ticks += 1
            self._dirty = True
            self._stale.add(instance.owner_id)
            if self.schedule == "lockstep":
                await self.scheduler.sleep_until(started + self.interval)
            else:
                # Both processors' run loops sleep a full interval after a tick completes.
                await self.scheduler.sleep(self.interval + self._rng.uniform(0.0, self.tick_jitter * self.interval))

    async def _halt(self, instance: _Instance) -> None:
        task = self._drivers.pop(instance.owner_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.alive.remove(instance)

    async def crash(self, instance: _Instance) -> None:
        """Kill ``instance`` now: no release, its records expire on their own."""
        await self._halt(instance)
        await instance.crash()
        await self.scheduler.drain()
        self._stale.add(instance.owner_id)
        self._observe()

    async def stop(self, instance: _Instance) -> None:
        """Stop ``instance`` gracefully now (it releases what it owns)."""
        await self._halt(instance)
        # Stopping releases ownership through the store, whose requests complete only
        # as virtual time runs: run the simulation until the stop is done.
        stopping = asyncio.get_running_loop().create_task(instance.stop())
        await self._run_while_pending(stopping)
        await stopping
        self._stale.add(instance.owner_id)
        self._observe()

    async def _run_while_pending(self, task: "asyncio.Task[Any]") -> None:
        await self.scheduler.drain()
        while not task.done():
            if self.scheduler.next_time() is None:
                raise SimulationStalled("a stop is waiting on something that virtual time cannot bring")
            self.scheduler.pop()()
            await self.scheduler.drain()
            if self._dirty or self._seen_version != self.ledger.version:
                self._observe()

    async def stop_run(self) -> None:
        for instance in list(self.alive):
            await self._halt(instance)
            await instance.crash()
        if self.source is not None:
            await self.source.close()

    def add_partitions(self, count: int) -> None:
        start = len(self.partition_ids)
        self.partition_ids.extend(str(i) for i in range(start, start + count))
        if self.source is not None:
            self.source.add_partitions(count)

    # ---- observation

    def owner_map(self) -> Dict[str, Optional[str]]:
        """Partition -> live owner, by the store's records right now."""
        now = self.scheduler.now
        return {pid: self.ledger.live_owner(pid, now) for pid in self.partition_ids}

    def counts(self) -> Dict[str, int]:
        return self.ledger.counts(self.partition_ids, [i.owner_id for i in self.alive], self.scheduler.now)

    def is_balanced(self) -> bool:
        if not self.alive:
            return False
        alive = {i.owner_id for i in self.alive}
        now = self.scheduler.now
        counts = {owner: 0 for owner in alive}
        for pid in self.partition_ids:
            owner = self.ledger.live_owner(pid, now)
            if owner not in alive:
                return False
            counts[owner] += 1
        return max(counts.values()) - min(counts.values()) <= 1

    def watch(self, owner_id: str) -> None:
        """Account the partition-seconds during which ``owner_id`` dispatches a partition
        whose live record belongs to someone else (or to nobody)."""
        self._watched = owner_id

    def _observe(self, *, everyone: bool = False) -> None:
        """Update beliefs, overlaps and balance after an event.

        Only instances that may have changed are re-read: the ones whose tick ended,
        and the previous owners of records that were overwritten (their pumps see the
        takeover). ``everyone`` re-reads all (leases also run out with time alone).
        """
        self._dirty = False
        self._seen_version = self.ledger.version
        now = self.scheduler.now
        self._overlap_seconds += self._current_overlaps * (now - self._last_event_time)
        self.watched_stale_seconds += self._watched_stale * (now - self._last_event_time)
        self._last_event_time = now
        # A takeover reaches the previous owner's pump only once the new owner's pump
        # opens its receiver (after the new owner's tick ends), so previous owners stay
        # under watch for one interval after their record was overwritten.
        for owner in self.ledger.touched:
            self._suspects[owner] = now + self.interval
        self.ledger.touched.clear()
        self._suspects = {o: until for o, until in self._suspects.items() if until >= now}
        stale = set(self._by_owner) if everyone else (self._stale | set(self._suspects))
        self._stale.clear()
        for owner in stale:
            instance = self._by_owner.get(owner)
            if instance is None:
                continue
            old_owned, old_dispatching = self._views.get(owner, (frozenset(), frozenset()))
            owned, dispatching = instance.owned, instance.dispatching
            if owned != old_owned:
                self._believers.subtract(old_owned)
                self._believers.update(owned)
            if dispatching != old_dispatching:
                self._dispatchers.subtract(old_dispatching)
                self._dispatchers.update(dispatching)
            self._views[owner] = (owned, dispatching)
        self._max_believers = max(self._max_believers, max(self._believers.values(), default=0))
        self._max_dispatchers = max(self._max_dispatchers, max(self._dispatchers.values(), default=0))
        self._current_overlaps = sum(1 for n in self._dispatchers.values() if n > 1)
        if self._watched is not None:
            _owned, dispatching = self._views.get(self._watched, (frozenset(), frozenset()))
            self._watched_stale = sum(1 for pid in dispatching if self.ledger.live_owner(pid, now) != self._watched)
        if self.is_balanced():
            if self._balanced_since is None:
                self._balanced_since = now
        else:
            self._balanced_since = None

    async def run_until(self, end: float, *, stop_when: Optional[Callable[[], bool]] = None) -> None:
        """Advance virtual time to ``end`` (or until ``stop_when()`` holds after an event)."""
        await self.scheduler.drain()
        next_sample = self._origin + math.ceil((self.scheduler.now - self._origin) / self.interval + 1e-9) * self.interval
        while True:
            upcoming = self.scheduler.next_time()
            if upcoming is None or upcoming > end:
                break
            while next_sample <= upcoming and next_sample <= end:
                self.scheduler.now = max(self.scheduler.now, next_sample)
                self._sample()
                next_sample += self.interval
            self.scheduler.pop()()
            await self.scheduler.drain()
            # Beliefs change only when a tick ends (or an instance stops) and the store
            # only on writes; observing after other events would find nothing new.
            if self._dirty or self._seen_version != self.ledger.version:
                self._observe()
            if stop_when is not None and stop_when():
                return
        while next_sample <= end:
            self.scheduler.now = max(self.scheduler.now, next_sample)
            self._sample()
            next_sample += self.interval
        self.scheduler.now = max(self.scheduler.now, end)
        self._observe()

    def _sample(self) -> None:
        self._observe(everyone=True)
        self.samples.append(Sample((self.scheduler.now - self._origin) / self.interval, self.counts()))

    # ---- phases

    def mark(self) -> Dict[str, Any]:
        """Start measuring a phase now; pass the result to :meth:`result`."""
        self._max_believers = 0
        self._max_dispatchers = 0
        self._overlap_seconds = 0.0
        self._last_event_time = self.scheduler.now
        return {"at": self.scheduler.now, "ledger": self.ledger.snapshot(), "ticks": self._instance_ticks}

    def result(self, mark: Dict[str, Any], *, balanced_at: Optional[float] = None,
               reowned_at: Optional[float] = None) -> PhaseResult:
        before = mark["ledger"]
        after = self.ledger.snapshot()
        start = mark["at"]
        return PhaseResult(
            ticks_to_balanced=None if balanced_at is None else self.ticks_between(start, balanced_at),
            balanced_at=balanced_at,
            moves=after["moves"] - before["moves"],
            steals=after["steals"] - before["steals"],
            failed_claims=after["failed_claims"] - before["failed_claims"],
            owner_changes=after["owner_changes"] - before["owner_changes"],
            requests=after["requests"] - before["requests"],
            instance_ticks=self._instance_ticks - mark["ticks"],
            duration=self.scheduler.now - start,
            max_believers=self._max_believers,
            max_dispatchers=self._max_dispatchers,
            overlap_seconds=self._overlap_seconds,
            reowned_at=reowned_at,
        )

    def ticks_between(self, start: float, end: float) -> int:
        """Tick rounds from ``start`` to ``end``: a change made by the k-th tick after
        ``start`` counts k (every instance ticks once per interval)."""
        if end < start:
            return 0
        return int(math.floor((end - start) / self.interval + 1e-9)) + 1

    async def run_until_balanced(self, max_ticks: float, *, settle_ticks: Optional[float] = None,
                                 mark: Optional[Dict[str, Any]] = None) -> PhaseResult:
        """Run until the assignment has been balanced for ``settle_ticks`` (default:
        expiry plus two ticks, so churn caused by expiries is seen), or ``max_ticks``.

        Ticks-to-balanced is measured to the start of the final balanced stretch.
        """
        mark = mark or self.mark()
        settle = settle_ticks if settle_ticks is not None else self.expiration / self.interval + 2
        deadline = mark["at"] + max_ticks * self.interval

        def settled() -> bool:
            return self._balanced_since is not None and self.scheduler.now - self._balanced_since >= settle * self.interval

        self._observe()
        while self.scheduler.now < deadline and not settled():
            await self.run_until(min(deadline, self.scheduler.now + self.interval), stop_when=settled)
        balanced_at = self._balanced_since
        return self.result(mark, balanced_at=balanced_at)

    async def run_until_reowned(self, orphans: Sequence[str], max_ticks: float) -> Optional[float]:
        """Run until every partition in ``orphans`` has a live owner among the alive
        instances; return that virtual time (None if it did not happen)."""
        alive = lambda: {i.owner_id for i in self.alive}  # noqa: E731

        def done() -> bool:
            names = alive()
            now = self.scheduler.now
            return all(self.ledger.live_owner(pid, now) in names for pid in orphans)

        deadline = self.scheduler.now + max_ticks * self.interval
        if done():
            return self.scheduler.now
        await self.run_until(deadline, stop_when=done)
        return self.scheduler.now if done() else None

    def record_expiry(self, partition_ids: Iterable[str]) -> float:
        """The virtual time at which the newest of these records expires."""
        return max((self.ledger.records[pid].modified + self.expiration for pid in partition_ids
                    if pid in self.ledger.records), default=self.scheduler.now)


@contextlib.asynccontextmanager
async def simulation(*args: Any, **kwargs: Any) -> Any:
    """A :class:`Simulation` whose instances are stopped (and the official module
    restored) on exit. Example::

        async with simulation("official", LoadBalancingStrategy.GREEDY, 32) as sim:
            ...
    """
    with official_module_patched():
        sim = Simulation(*args, **kwargs)
        try:
            yield sim
        finally:
            await sim.stop_run()
