"""A discrete-event simulator that runs real load-balancing and dispatch code under
virtual time, and records what every handler was given.

Two kinds of instance run side by side over stores with the same semantics and the same
request accounting, reading one :class:`~eventprocessor.sources.InMemoryEventSource`:

* :class:`OursInstance` wraps this SDK's :class:`~eventprocessor.EventProcessor`: its
  renewer, lease keeper, member heartbeat and partition pumps run on their own on the
  virtual clock, and every balancing tick is one ``await processor.balance_once()``.
* :class:`OfficialInstance` wraps azure-eventhub's async ``OwnershipManager`` (the load
  balancer inside ``azure.eventhub.aio.EventProcessor``) and reproduces that processor's
  dispatch (``event_processor.py``): after each ``claim_ownership()`` it starts one
  receive task per newly claimed partition from the checkpoint ``get_checkpoints()``
  returned, with owner level 0 (what the official processor uses with a checkpoint
  store; equal owner levels disconnect the older receiver), cancels the tasks of
  partitions its claim no longer returned, and releases a partition when its task ends.
  Its handler checkpoints through the official ``PartitionContext`` (unfenced). The
  official code reads ``time.time()`` and ``random`` at module level, so while a
  simulation runs both names are replaced by per-instance shims (see
  :func:`official_module_patched`).

With :class:`Traffic`, a producer appends events to every partition at a steady rate and
both SDKs' handlers record each batch (:class:`Deliveries`): partition, owner, claim,
first and last sequence number, virtual start and end (a handler spends ``work``
seconds per batch, then checkpoints it). Duplicates, overlaps, pauses and the time to
resume after a crash are measured from those records, never derived from beliefs.

A simulation runs on :class:`eventprocessor.testing.VirtualTimeLoop`, the clock every
timed part of the SDK follows (the processors' leases, ticks and store deadlines, the
pumps, the source's waits, the in-memory store's server time): time only moves when every
coroutine is waiting, so a thousand ticks take seconds and a run is a deterministic
function of its seed. Store requests execute at the midpoint of their round trip, after
everything else of that instant (:class:`Instants`, even with zero latency); that is what
makes a *lockstep* tick real: every instance lists the same snapshot before any of them
writes. What the store saw is kept by an :class:`~eventprocessor.testing.OwnershipLedger`.

Example::

    async def main():
        async with simulation("ours", LoadBalancingStrategy.GREEDY, 32, traffic=Traffic()) as sim:
            sim.start_traffic()
            for _ in range(4):
                sim.add_instance()
            result = await sim.run_until_balanced(max_ticks=50)
            return result.ticks_to_balanced, result.duplicates

    print(run_virtual(main()))
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import itertools
import logging
import math
import random
import time as _real_time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import (
    Any,
    TypeVar,
)

from eventprocessor import CheckpointStore, CheckpointStoreError, EventPosition, OwnershipLostError
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores.records import Member, Ownership
from eventprocessor.testing import LedgerStore, OwnershipLedger, VirtualTimeLoop

_T = TypeVar("_T")

__all__ = [
    "EPOCH",
    "Instants",
    "InstanceClock",
    "SimulatedStore",
    "OfficialSimStore",
    "Traffic",
    "Batch",
    "Deliveries",
    "OursInstance",
    "OfficialInstance",
    "PhaseResult",
    "Simulation",
    "simulation",
    "official_module_patched",
    "minimal_moves",
]

logger = logging.getLogger(__name__)

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
EPOCH_SECONDS = EPOCH.timestamp()
NAMESPACE = "memory.local"
EVENTHUB = "hub"
CONSUMER_GROUP = "$default"
SCHEDULES = ("staggered", "lockstep", "jittered")


# --------------------------------------------------------------------------- time


class Instants:
    """Simulation time on the running :class:`~eventprocessor.testing.VirtualTimeLoop`:
    seconds since the simulation started (:attr:`now`), timers, and work that runs only
    once everything else of the current instant has run (the loop's idle callback).

    That last part is what sequences an instant the way a network does: a store request
    sent at ``t`` executes at ``t`` after every coroutine that had something to do at
    ``t`` got to it, so the processors of a lockstep tick all list the same snapshot
    before any of them writes. :attr:`observers` are called at the same point, after that
    work (the simulation watches its balance there).
    """

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        if not isinstance(loop, VirtualTimeLoop):
            raise RuntimeError("a Simulation runs on eventprocessor.testing.VirtualTimeLoop: start it with "
                               "eventprocessor.testing.run_virtual(...)")
        self.loop: VirtualTimeLoop = loop
        self.origin = loop.time()
        self.observers: list[Callable[[], None]] = []
        self._last: list[Callable[[], None]] = []
        self._groups: dict[float, list[Any]] = {}
        loop.add_idle_callback(self._idle)

    @property
    def now(self) -> float:
        return self.loop.time() - self.origin

    def call_at(self, when: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_at(self.origin + when, callback)

    async def sleep_until(self, when: float) -> None:
        future = self.loop.create_future()
        handle = self.call_at(max(when, self.now), lambda: future.done() or future.set_result(None))
        try:
            await future
        finally:
            handle.cancel()

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self.now + max(0.0, seconds))

    async def last(self) -> None:
        """Return once everything else of the current instant has run."""
        future = self.loop.create_future()
        self._last.append(lambda: future.done() or future.set_result(None))
        await future

    async def write_group(self, when: float, items: Sequence[Any], execute: Callable[[Any], Awaitable[Any]],
                          rng: random.Random) -> list[Any]:
        """Apply ``execute`` to each item at ``when`` (once the rest of that instant ran),
        interleaved at random with the items of every other batch that lands at the same
        instant; return the results in item order. Every item is applied even if the
        caller stopped waiting (a store applies what its clients abandoned)."""
        future = self.loop.create_future()
        key = max(when, self.now)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []

            async def apply() -> None:
                batches = self._groups.pop(key)
                order = [(b, i) for b, (batch_items, *_rest) in enumerate(batches) for i in range(len(batch_items))]
                rng.shuffle(order)
                failed: dict[int, BaseException] = {}
                for b, i in order:
                    batch_items, batch_execute, _future, results = batches[b]
                    try:
                        results[i] = await batch_execute(batch_items[i])  # in-memory: never suspends
                    except Exception as error:  # reported to that batch's caller
                        failed.setdefault(b, error)
                for b, (_items, _execute, batch_future, results) in enumerate(batches):
                    if not batch_future.done():
                        if b in failed:
                            batch_future.set_exception(failed[b])
                        else:
                            batch_future.set_result(results)

            def start() -> None:
                self.loop.create_task(apply())

            self.call_at(key, lambda: self._last.append(start))
        group.append((list(items), execute, future, [None] * len(items)))
        return await future

    def _idle(self) -> None:
        due, self._last = self._last, []
        for callback in due:
            callback()
        for observe in list(self.observers):
            observe()

    def close(self) -> None:
        self.loop.remove_idle_callback(self._idle)


class InstanceClock:
    """The :class:`~eventprocessor._runtime.clock.Clock` of an instance whose local clock is
    ``skew`` seconds ahead: the loop's time plus the skew (``time()`` is the wall clock
    the official balancer reads)."""

    def __init__(self, instants: Instants, skew: float = 0.0) -> None:
        self._instants = instants
        self.skew = skew

    def monotonic(self) -> float:
        return self._instants.loop.time() + self.skew

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch as this instance's local clock reads them."""
        return EPOCH_SECONDS + self._instants.now + self.skew

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return f"InstanceClock(now={self._instants.now}, skew={self.skew})"


# --------------------------------------------------------------------------- stores


class _Latency:
    def __init__(self, instants: Instants, latency: float, rng: random.Random) -> None:
        self.instants = instants
        self.latency = latency
        self._rng = rng

    def draw(self) -> float:
        # Uniform in [0, latency]: a tick sometimes takes a large share of the interval.
        return self._rng.uniform(0.0, self.latency) if self.latency > 0 else 0.0

    async def round_trip(self, execute: Callable[[], Any]) -> Any:
        """One request: it executes at the midpoint of its round trip, after everything
        else of that instant."""
        delay = self.draw()
        if delay:
            await self.instants.sleep(delay / 2)
        await self.instants.last()
        result = execute()
        if asyncio.iscoroutine(result):
            result = await result
        if delay:
            await self.instants.sleep(delay / 2)
        return result

    async def writes(self, items: Sequence[Any], execute: Callable[[Any], Awaitable[Any]]) -> list[Any]:
        """One round trip for a batch of writes sent concurrently.

        Batches of different instances that reach the store at the same instant are
        applied record by record in a random interleaving, as concurrent requests are
        over a network (one task per instant, not per record, so large runs stay fast).
        """
        delay = self.draw()
        results = await self.instants.write_group(self.instants.now + delay / 2, items, execute, self._rng)
        if delay:
            await self.instants.sleep(delay / 2)
        return results


class _Crashed(CheckpointStoreError):
    """The instance behind this store view crashed: it sends nothing any more."""


class SimulatedStore(LedgerStore):
    """One instance's view of this SDK's :class:`~stores.InMemoryCheckpointStore`, behind
    virtual latency, reporting to the simulation's
    :class:`~eventprocessor.testing.OwnershipLedger`.

    Every instance gets its own view (:meth:`for_instance`) over the same inner store,
    ledger and latency, so the ledger knows who wrote each record, and a crashed
    instance's view refuses every further request (a dead process sends nothing). Each
    request executes at the midpoint of its round trip; a batch claim is one round trip
    (a real store issues the writes concurrently) but is billed one request per record,
    like the inner store's ``request_counts``. Member records (heartbeats and their
    listing) cost requests too, and so does every checkpoint fence (the real processor
    fences each claim it wins, as on Blob and Table).
    """

    def __init__(self, inner: CheckpointStore, instants: Instants, ledger: OwnershipLedger,
                 latency: float = 0.0, rng: random.Random | None = None, *, writer: str = "") -> None:
        super().__init__(inner, ledger, writer=writer, now=lambda: instants.now)
        self._instants = instants
        self._latency = _Latency(instants, latency, rng or random.Random(0))
        self.dead = False

    def for_instance(self, owner_id: str) -> SimulatedStore:
        view = SimulatedStore(self.inner, self._instants, self.ledger, writer=owner_id)
        view._latency = self._latency
        return view

    def _check(self) -> None:
        if self.dead:
            raise _Crashed(f"{self.writer} crashed; it sends no more requests")

    async def forward(self, operation: str, call: Callable[[], Awaitable[_T]], units: int = 1) -> _T:
        self._check()
        return await self._latency.round_trip(lambda: LedgerStore.forward(self, operation, call, units))

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        self._check()
        results = await self._latency.writes(list(ownerships), self.claim_one)
        return [record for record in results if record is not None]

    async def write_member(self, member: Member) -> Member:
        self._check()
        return await self._latency.round_trip(lambda: LedgerStore.write_member(self, member))


@dataclass
class _OfficialRecords:
    ownership: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)


class OfficialSimStore:
    """The official ``CheckpointStore`` interface (dict records) with real store semantics.

    Like the Blob store the official SDK ships: ``last_modified_time`` is the *store's*
    time (float seconds), the etag changes on every write, a record without an etag is
    create-if-absent and a stale etag fails; checkpoints are written unconditionally.
    Records are copied in and out, because the official balancer mutates the dicts it is
    given (the official in-memory store hands out its live dicts, which would let one
    instance's plan rewrite another's view). One view per instance (:meth:`for_instance`),
    as for :class:`SimulatedStore`.
    """

    def __init__(self, instants: Instants, ledger: OwnershipLedger, latency: float = 0.0,
                 rng: random.Random | None = None, *, writer: str = "") -> None:
        self._records = _OfficialRecords()
        self._ledger = ledger
        self._instants = instants
        self._latency = _Latency(instants, latency, rng or random.Random(0))
        self.writer = writer
        self.dead = False

    def for_instance(self, owner_id: str) -> OfficialSimStore:
        view = OfficialSimStore(self._instants, self._ledger, writer=owner_id)
        view._records, view._latency = self._records, self._latency
        return view

    def _check(self) -> None:
        if self.dead:
            raise _Crashed(f"{self.writer} crashed; it sends no more requests")

    def server_time(self) -> float:
        return EPOCH_SECONDS + self._instants.now

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                             **kwargs: Any) -> list[dict[str, Any]]:
        self._check()

        def execute() -> list[dict[str, Any]]:
            self._ledger.count("list_ownership")
            return [dict(record) for record in self._records.ownership.values()]

        return await self._latency.round_trip(execute)

    async def claim_ownership(self, ownership_list: Iterable[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
        self._check()
        claims = [dict(claim) for claim in ownership_list]

        async def execute(claim: dict[str, Any]) -> dict[str, Any] | None:
            pid = claim["partition_id"]
            current = self._records.ownership.get(pid)
            etag = claim.get("etag")
            ok = (current is None and etag is None) or (current is not None and etag is not None
                                                          and etag == current["etag"])
            self._ledger.write(pid, claim.get("owner_id") or "", ok, self._instants.now, self.writer)
            if not ok:
                return None
            record = dict(claim, etag=str(uuid.uuid4()), last_modified_time=self.server_time())
            self._records.ownership[pid] = record
            return dict(record)

        results = await self._latency.writes(claims, execute)
        return [record for record in results if record is not None]

    async def update_checkpoint(self, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        self._check()

        def execute() -> None:
            self._ledger.count("update_checkpoint")
            self._records.checkpoints[checkpoint["partition_id"]] = dict(checkpoint)

        await self._latency.round_trip(execute)

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                               **kwargs: Any) -> list[dict[str, Any]]:
        self._check()

        def execute() -> list[dict[str, Any]]:
            self._ledger.count("list_checkpoints")
            return [dict(c) for c in self._records.checkpoints.values()]

        return await self._latency.round_trip(execute)


# --------------------------------------------------------------------------- deliveries


@dataclass(frozen=True)
class Traffic:
    """A steady producer: every ``step`` virtual seconds, ``events_per_second * step``
    events are appended to every partition, at ``phase`` x ``step`` past each step
    boundary (half-way by default, so that production never lands on the instants where
    lockstep ticks run: whether a steal finds a batch in flight is then up to the
    handlers' load, not to an alignment of two grids)."""

    events_per_second: float = 4.0
    step: float = 1.0
    phase: float = 0.5

    @property
    def per_step(self) -> int:
        return max(1, round(self.events_per_second * self.step))


@dataclass
class Batch:
    """One batch in one handler: which claim got which events, and when (virtual s)."""

    partition_id: str
    owner_id: str
    claim: int  # this SDK: the claim's epoch; official: a serial per receive task
    first: int
    last: int
    start: float
    end: float | None = None
    duplicates: int = 0  # events of this batch some handler had been given before

    @property
    def key(self) -> tuple[str, int]:
        return (self.owner_id, self.claim)


class Deliveries:
    """Every batch every handler received, and what that says.

    * duplicates: events handed to a handler that some handler had been given before;
    * overlap: partition-seconds during which batches of two different claims of one
      partition were both in their handlers, and the most claims at once;
    * pauses: the longest gap between consecutive batches of a partition;
    * resumption: a partition's first batch after an instant, by given owners.
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.batches: list[Batch] = []
        self._starts: list[float] = []
        self._times_delivered: dict[str, list[int]] = {}
        self._by_partition: dict[str, list[Batch]] = {}

    def begin(self, partition_id: str, owner_id: str, claim: int, first: int, last: int) -> Batch:
        seen = self._times_delivered.setdefault(partition_id, [])
        if len(seen) <= last:
            seen.extend([0] * (last + 1 - len(seen)))
        duplicates = 0
        for seq in range(first, last + 1):
            if seen[seq]:
                duplicates += 1
            seen[seq] += 1
        now = self._now()
        batch = Batch(partition_id, owner_id, claim, first, last, now, duplicates=duplicates)
        self.batches.append(batch)
        self._starts.append(now)
        self._by_partition.setdefault(partition_id, []).append(batch)
        return batch

    def end(self, batch: Batch) -> None:
        if batch.end is None:
            batch.end = self._now()

    def since(self, start: float) -> list[Batch]:
        return self.batches[bisect.bisect_left(self._starts, start):]

    def duplicates(self, start: float = 0.0) -> int:
        return sum(b.duplicates for b in self.since(start))

    def events(self, start: float = 0.0) -> int:
        return sum(b.last - b.first + 1 for b in self.since(start))

    def overlap(self, start: float, until: float) -> tuple[float, int]:
        """(partition-seconds with two or more claims delivering, most claims at once)
        between ``start`` and ``until``."""
        seconds = 0.0
        most = 0
        for batches in self._by_partition.values():
            points: list[tuple[float, int, tuple[str, int]]] = []
            for b in batches:
                end = until if b.end is None else min(b.end, until)
                begin = max(b.start, start)
                if end > begin:
                    points.append((begin, 1, b.key))
                    points.append((end, 0, b.key))
                elif start <= b.start <= until:
                    most = max(most, 1)  # an instantaneous batch: one deliverer
            if not points:
                continue
            # Ends sort before starts at one instant: touching batches do not overlap.
            points.sort(key=lambda p: (p[0], p[1]))
            open_claims: Counter = Counter()
            previous = points[0][0]
            for when, is_start, key in points:
                if len(open_claims) >= 2:
                    seconds += when - previous
                previous = when
                if is_start:
                    open_claims[key] += 1
                    most = max(most, len(open_claims))
                else:
                    open_claims[key] -= 1
                    if open_claims[key] <= 0:
                        del open_claims[key]
        return seconds, most

    def first_batch(self, partition_id: str, after: float, owners: set[str] | None = None) -> Batch | None:
        for b in self._by_partition.get(partition_id, ()):
            if b.start >= after and (owners is None or b.owner_id in owners):
                return b
        return None

    def longest_pauses(self, start: float, until: float) -> dict[str, float]:
        """Per partition, the longest time between the end of one batch and the start of
        the next (any claims), for batches starting between ``start`` and ``until``."""
        result: dict[str, float] = {}
        for pid, batches in self._by_partition.items():
            inside = [b for b in batches if start <= b.start <= until]
            longest = 0.0
            reach: float | None = None
            for b in inside:
                if reach is not None:
                    longest = max(longest, b.start - reach)
                end = b.end if b.end is not None else until
                reach = end if reach is None else max(reach, end)
            result[pid] = longest
        return result

    def undelivered(self, source: InMemoryEventSource, partition_ids: Iterable[str], enqueued_before: datetime) -> int:
        """Events enqueued before ``enqueued_before`` that no handler was ever given."""
        missing = 0
        for pid in partition_ids:
            seen = self._times_delivered.get(pid, [])
            for event in source.events(pid):
                if event.enqueued_time >= enqueued_before:
                    break
                if event.sequence_number >= len(seen) or not seen[event.sequence_number]:
                    missing += 1
        return missing


# --------------------------------------------------------------------------- official module patch


@dataclass
class _OfficialContext:
    clock: InstanceClock
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
    module.time, module.random = _TimeShim(), _RandomShim()  # type: ignore[assignment]
    try:
        yield module
    finally:
        module.time, module.random = saved


# --------------------------------------------------------------------------- instances


class _Instance:
    """What the simulation drives: ``join`` once, then ``tick`` every interval, until
    ``stop`` (graceful) or ``crash``."""

    owner_id: str
    dead: bool = False

    async def join(self) -> None:
        """Start: called once, before the first tick."""

    async def tick(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """Graceful shutdown: finish and release what it owns."""
        raise NotImplementedError

    async def crash(self) -> None:
        """Die now: handlers are interrupted, nothing more reaches the store. Must not
        wait on virtual time (leftover clean-up goes to :attr:`teardown`)."""
        raise NotImplementedError

    teardown: asyncio.Future[Any] | None = None


def _recording_processor(instance: OursInstance, deliveries: Deliveries, work: float) -> Any:
    """A PartitionProcessor class for one instance: it records each batch, spends
    ``work`` virtual seconds on it and checkpoints its last event."""
    from eventprocessor import PartitionProcessor

    class Recorder(PartitionProcessor):
        async def process_events(self, events: Any, context: Any) -> None:
            if not events or instance.dead:
                return
            batch = deliveries.begin(context.partition_id, context.owner_id, context.epoch,
                                     events[0].sequence_number, events[-1].sequence_number)
            try:
                await asyncio.sleep(work)
            finally:
                deliveries.end(batch)
            if instance.dead:
                return
            try:
                await context.update_checkpoint()
            except (OwnershipLostError, CheckpointStoreError):  # the claim ended meanwhile
                instance.checkpoint_failures += 1

        async def process_error(self, error: Exception, context: Any) -> None:
            # Stolen partitions' receivers are disconnected by design: count, don't log.
            instance.errors += 1

    return Recorder


class OursInstance(_Instance):
    """This SDK's real EventProcessor, ticked through ``balance_once``."""

    def __init__(self, processor: Any, store: SimulatedStore) -> None:
        self.processor = processor
        self.owner_id = processor.owner_id
        self.store = store
        self.dead = False
        self.errors = 0
        self.checkpoint_failures = 0
        self.teardown = None

    @property
    def owned(self) -> frozenset[str]:
        if self.dead:
            return frozenset()
        return frozenset(self.processor.owned_partitions)

    async def join(self) -> None:
        # As EventProcessor.start does: the renewer, lease keeper and member heartbeat
        # run on their own (on the loop's virtual clock); the balancing loop writes the
        # member record before its first tick. The simulation drives the ticks themselves.
        await self.processor.start(balancing=False)
        await self.processor.join()

    async def tick(self) -> None:
        await self.processor.balance_once()

    async def stop(self) -> None:
        await self.processor.stop()
        self.dead = True

    async def crash(self) -> None:
        self.dead = True
        self.store.dead = True
        for pid in list(self.processor.leases):
            pump = self.processor.pump(pid)
            if pump is not None:
                pump.cancel()
        # The tasks of a dead process just stop; stop(release=False) cancels them (its
        # store calls fail at once: the view is dead).
        self.teardown = asyncio.ensure_future(self.processor.stop(release=False))


class _StandInClient:
    """All the official OwnershipManager needs from an EventHubConsumerClient."""

    def __init__(self, partition_ids: Callable[[], list[str]]) -> None:
        self._address = SimpleNamespace(hostname=NAMESPACE)
        self.eventhub_name = EVENTHUB
        self._partition_ids = partition_ids

    async def get_partition_ids(self) -> list[str]:
        return list(self._partition_ids())


class OfficialInstance(_Instance):
    """azure-eventhub's OwnershipManager, driven and dispatched like its EventProcessor
    (``azure/eventhub/aio/_eventprocessor/event_processor.py``: ``start``,
    ``_create_tasks_for_claimed_ownership``, ``_cancel_tasks_for_partitions``,
    ``_receive``, ``_close_consumer``, ``stop``)."""

    def __init__(self, owner_id: str, store: OfficialSimStore, partition_ids: Callable[[], list[str]],
                 strategy: Any, expiration: float, clock: InstanceClock, rng: random.Random, *,
                 source: InMemoryEventSource | None = None, deliveries: Deliveries | None = None,
                 work: float = 0.0, max_batch_size: int = 300) -> None:
        from azure.eventhub.aio._eventprocessor._ownership_manager import OwnershipManager

        self.owner_id = owner_id
        self.clock = clock
        self.store = store
        self.dead = False
        self.teardown = None
        self.errors = 0
        self._context = _OfficialContext(clock=clock, rng=rng)
        # Duck-typed stand-ins: the client and store offer exactly what the manager calls.
        self._manager = OwnershipManager(_StandInClient(partition_ids), CONSUMER_GROUP, owner_id,  # type: ignore[arg-type]
                                         store, expiration, strategy, None)  # type: ignore[arg-type]
        self._source = source
        self._deliveries = deliveries
        self._work = work
        self._max_batch_size = max_batch_size
        self._owned: frozenset[str] = frozenset()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._consumers: dict[str, Any] = {}
        self._running = True
        self._claims = itertools.count(1)

    @property
    def owned(self) -> frozenset[str]:
        """The partition ids its last claim returned (what its loop dispatches)."""
        return self._owned

    async def tick(self) -> None:
        token = _CURRENT_OFFICIAL.set(self._context)
        try:
            claimed = await self._manager.claim_ownership()
            self._owned = frozenset(claimed)
            if claimed:
                existing = set(self._tasks)
                to_cancel = existing - set(claimed)
                newly_claimed = set(claimed) - existing
                if newly_claimed:
                    checkpoints = await self._manager.get_checkpoints()
                    self._create_tasks(newly_claimed, checkpoints)
            else:
                to_cancel = set(self._tasks)
            self._cancel(to_cancel)
        finally:
            _CURRENT_OFFICIAL.reset(token)

    def _create_tasks(self, partition_ids: Iterable[str], checkpoints: dict[str, dict[str, Any]]) -> None:
        if self._source is None:
            return
        for pid in sorted(partition_ids, key=_partition_order):
            if pid not in self._tasks or self._tasks[pid].done():
                # Created under this instance's context: its time shim follows the task.
                self._tasks[pid] = asyncio.get_running_loop().create_task(self._receive(pid, checkpoints.get(pid)))

    def _cancel(self, partition_ids: Iterable[str]) -> None:
        for pid in partition_ids:
            task = self._tasks.get(pid)
            if task:
                task.cancel()
                if pid not in self._consumers:  # cancelled before the consumer was created
                    del self._tasks[pid]

    async def _receive(self, partition_id: str, checkpoint: dict[str, Any] | None) -> None:
        from azure.eventhub.aio._eventprocessor.partition_context import PartitionContext

        assert self._source is not None
        claim = next(self._claims)
        offset = checkpoint.get("offset") if checkpoint else None
        # The benchmark starts both SDKs at the earliest event when there is no checkpoint.
        position = EventPosition.from_offset(offset) if offset else EventPosition.earliest()
        context = PartitionContext(NAMESPACE, EVENTHUB, CONSUMER_GROUP, partition_id, self.store)  # type: ignore[arg-type]
        try:
            self._consumers[partition_id] = await self._source.open_receiver(
                partition_id, consumer_group=CONSUMER_GROUP, starting_position=position, owner_level=0,
                prefetch=300)
            while self._running:
                try:
                    # The official consumer calls the handler from inside receive(), so a
                    # failing handler (or checkpoint) ends the partition like a lost link.
                    events = await self._consumers[partition_id].receive(self._max_batch_size, None)
                    await self._handle(context, claim, events)
                except asyncio.CancelledError:
                    raise
                except Exception:  # e.g. disconnected by a newer receiver: process_error, close
                    self.errors += 1
                    break
        finally:
            await asyncio.shield(self._close_consumer(partition_id))

    async def _handle(self, context: Any, claim: int, events: list[Any]) -> None:
        if not events or self._deliveries is None:
            return
        batch = self._deliveries.begin(context.partition_id, self.owner_id, claim,
                                       events[0].sequence_number, events[-1].sequence_number)
        try:
            await asyncio.sleep(self._work)
        finally:
            self._deliveries.end(batch)
        await context.update_checkpoint(events[-1])

    async def _close_consumer(self, partition_id: str) -> None:
        try:
            consumer = self._consumers.pop(partition_id, None)
            if consumer is not None:
                await consumer.close()
            if not self.dead:  # a dead process releases nothing
                await self._manager.release_ownership(partition_id)
        finally:
            self._tasks.pop(partition_id, None)

    async def stop(self) -> None:
        token = _CURRENT_OFFICIAL.set(self._context)
        try:
            self._running = False
            self._cancel(list(self._tasks))
            while self._tasks:
                await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
            self._owned = frozenset()
        finally:
            _CURRENT_OFFICIAL.reset(token)

    async def crash(self) -> None:
        self.dead = True
        self.store.dead = True
        self._running = False
        self._owned = frozenset()
        for task in list(self._tasks.values()):
            task.cancel()


def _partition_order(pid: str) -> tuple[int, Any]:
    return (0, int(pid)) if pid.isdigit() else (1, pid)


# --------------------------------------------------------------------------- minimal moves


def minimal_moves(before: dict[str, str | None], live: Sequence[str], partition_ids: Sequence[str]) -> int:
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
    counts: dict[str, int]


@dataclass
class PhaseResult:
    """Metrics of one phase of a scenario (from ``mark`` to the end of a run call).

    Ownership figures come from the store's ledger; ``duplicates``, ``overlap_seconds``,
    ``max_deliverers`` and ``events`` from what the handlers were given.
    """

    ticks_to_balanced: float | None
    balanced_at: float | None
    moves: int
    steals: int
    handoffs: int
    failed_claims: int
    owner_changes: int
    requests: Counter
    instance_ticks: int
    duration: float
    duplicates: int = 0
    overlap_seconds: float = 0.0  # partition-seconds with two or more claims delivering
    max_deliverers: int = 0  # the most claims delivering one partition at one instant
    events: int = 0  # events handed to handlers in the phase
    reowned_at: float | None = None

    @property
    def coordination_requests(self) -> int:
        """Requests of balancing and leases: all but checkpoint writes, whose cadence is
        the application's and the same for both SDKs here."""
        return sum(n for kind, n in self.requests.items() if kind != "update_checkpoint")


class Simulation:
    """N instances of one implementation over one store, under one virtual clock.

    ``implementation`` is ``"ours"`` or ``"official"``; ``strategy`` is this SDK's
    ``LoadBalancingStrategy`` (mapped to the official enum for the official one).
    ``schedule`` is ``"staggered"`` (each instance at its own random phase, then a full
    interval after each tick plus ``tick_jitter`` x interval of random extra wait),
    ``"lockstep"`` (all instances tick at the same instants and list the same snapshot
    before anyone writes) or ``"jittered"`` (random phases, and each SDK's own loop
    timing: this SDK waits ``interval x U(0.9, 1.1)`` from the start of a tick, the
    official loop ``interval x (1 + U(0, 0.2))`` after it). ``latency`` is the maximum
    store round trip in seconds (uniform draw). With ``traffic``, a producer appends
    events once :meth:`start_traffic` is called, and handlers spend ``work`` seconds per
    batch.
    ``processor_options`` go to every :class:`~eventprocessor.EventProcessor` (this
    SDK only); ``balance_tolerance`` is the spread of partition counts that counts as
    balanced (a ``balance_factor`` above 1 leaves a larger one on purpose).
    """

    def __init__(self, implementation: str, strategy: Any, partitions: int, *, interval: float = 10.0,
                 expiration: float = 60.0, schedule: str = "staggered", latency: float = 0.0,
                 tick_jitter: float = 0.0, seed: int = 0, traffic: Traffic | None = None, work: float = 0.05,
                 processor_options: dict[str, Any] | None = None, balance_tolerance: int = 1) -> None:
        if implementation not in ("ours", "official"):
            raise ValueError(f"unknown implementation {implementation!r}; expected 'ours' or 'official'")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")
        if partitions < 1 or interval <= 0 or expiration <= 0:
            raise ValueError("partitions, interval and expiration must be positive")
        self.implementation = implementation
        self.strategy = strategy
        self.interval = interval
        self.expiration = expiration
        self.schedule = schedule
        self.tick_jitter = tick_jitter
        self.seed = seed
        self.traffic = traffic
        self.work = work
        self.processor_options = dict(processor_options or {})
        self.balance_tolerance = balance_tolerance
        self._rng = random.Random(seed)
        self.instants = Instants()
        self.ledger = OwnershipLedger(expiration=expiration)
        self.deliveries = Deliveries(lambda: self.instants.now)
        self.partition_ids: list[str] = [str(i) for i in range(partitions)]
        self.instances: list[_Instance] = []
        self.alive: list[_Instance] = []
        self._drivers: dict[str, asyncio.Task] = {}
        self._producer: asyncio.Task | None = None
        self._instance_ticks = 0
        self._origin = 0.0
        self.samples: list[Sample] = []
        self._balanced_since: float | None = None
        self._dirty = True
        self._seen_version = -1
        self._waiters: list[Callable[[], None]] = []
        self.source = InMemoryEventSource(partitions, eventhub_name=EVENTHUB, fully_qualified_namespace=NAMESPACE,
                                        clock=self.server_time)
        if implementation == "ours":
            from eventprocessor.stores import InMemoryCheckpointStore

            inner = InMemoryCheckpointStore(clock=self.server_time)
            self.store: Any = SimulatedStore(inner, self.instants, self.ledger, latency,
                                             random.Random(self._rng.random()))
        else:
            self.store = OfficialSimStore(self.instants, self.ledger, latency, random.Random(self._rng.random()))
        self.instants.observers.append(self._on_instant)
        self._sampler = self.instants.call_at(self.interval, self._sample_due)

    @property
    def now(self) -> float:
        """Seconds of simulated time since this simulation started."""
        return self.instants.now

    @property
    def balanced_since(self) -> float | None:
        """Since when the assignment has been balanced (None: it is not)."""
        return self._balanced_since

    def server_time(self) -> datetime:
        """The store's and the source's wall clock: ``EPOCH`` plus :attr:`now`."""
        return EPOCH + timedelta(seconds=self.instants.now)

    # ---- membership and topology

    def _new_owner_id(self) -> str:
        return f"{self.implementation}-{len(self.instances):03d}"

    def add_instance(self, *, skew: float = 0.0, owner_id: str | None = None, **options: Any) -> _Instance:
        """Create an instance; it joins at once and starts ticking when the simulation runs.

        ``skew`` is how far its local clock is ahead of the store's, in seconds;
        ``options`` are extra :class:`~eventprocessor.EventProcessor` arguments (this SDK).
        """
        owner_id = owner_id or self._new_owner_id()
        clock = InstanceClock(self.instants, skew)
        rng = random.Random(self._rng.random())
        store = self.store.for_instance(owner_id)
        if self.implementation == "ours":
            from eventprocessor import EventProcessor

            settings = {"load_balancing_strategy": self.strategy, "load_balancing_interval": self.interval,
                        "partition_ownership_expiration_interval": self.expiration, **self.processor_options,
                        **options}
            holder: dict[str, Any] = {}
            # Without a skew the processor keeps its default clock: the loop's.
            processor = EventProcessor(self.source, store, lambda: holder["cls"](), consumer_group=CONSUMER_GROUP,
                                       owner_id=owner_id, clock=clock if skew else None, rng=rng, **settings)
            instance: _Instance = OursInstance(processor, store)
            holder["cls"] = _recording_processor(instance, self.deliveries, self.work)  # type: ignore[arg-type]
        else:
            from azure.eventhub import LoadBalancingStrategy as OfficialStrategy

            if options:
                raise ValueError(f"the official processor has no options {sorted(options)}")
            official = OfficialStrategy(self.strategy.value) if hasattr(self.strategy, "value") else self.strategy
            instance = OfficialInstance(owner_id, store, lambda: list(self.partition_ids), official,
                                        self.expiration, clock, rng, source=self.source,
                                        deliveries=self.deliveries, work=self.work)
        return self.join(instance)

    def join(self, instance: _Instance) -> _Instance:
        """Schedule ``instance`` (any object with ``owner_id``, ``join``, ``tick``, ``stop``
        and ``crash``) to join now and tick in this simulation from then on."""
        self.instances.append(instance)
        self.alive.append(instance)
        if self.schedule == "lockstep":
            k = math.floor((self.now - self._origin) / self.interval + 1e-9)
            first = self._origin + k * self.interval
            if first < self.now - 1e-9:
                first += self.interval
        else:
            first = self.now + self._rng.uniform(0.0, self.interval)
        self._drivers[instance.owner_id] = asyncio.get_running_loop().create_task(self._drive(instance, first))
        return instance

    def start_traffic(self) -> None:
        """Start the producer (``traffic``) now, at the next step boundary of virtual time.
        Idempotent."""
        if self.traffic is None:
            raise ValueError("this simulation has no traffic; pass traffic=Traffic(...)")
        if self._producer is None:
            self._producer = asyncio.get_running_loop().create_task(self._produce(self.traffic))

    async def _produce(self, traffic: Traffic) -> None:
        body = b"x"
        await self.instants.sleep_until(self._next_production(traffic))
        while True:
            for pid in self.partition_ids:
                for _ in range(traffic.per_step):
                    self.source.append(body, partition_id=pid)
            await self.instants.sleep(traffic.step)

    async def _drive(self, instance: _Instance, first: float) -> None:
        await instance.join()
        await self.instants.sleep_until(first)
        rng = random.Random(self._rng.random())
        while True:
            started = self.now
            await instance.tick()
            self._instance_ticks += 1
            self._dirty = True
            if self.schedule == "lockstep":
                await self.instants.sleep_until(started + self.interval)
            elif self.schedule == "jittered":
                if self.implementation == "ours":  # the processor's balancing loop (taker.py)
                    await self.instants.sleep_until(started + self.interval * rng.uniform(0.9, 1.1))
                else:  # azure-eventhub EventProcessor.start
                    await self.instants.sleep(self.interval + self.interval * rng.random() * 0.2)
            else:
                # Both processors' run loops sleep a full interval after a tick completes.
                await self.instants.sleep(self.interval + rng.uniform(0.0, self.tick_jitter * self.interval))

    async def _halt(self, instance: _Instance) -> None:
        task = self._drivers.pop(instance.owner_id)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.alive.remove(instance)

    async def crash(self, instance: _Instance) -> None:
        """Kill ``instance`` now: its handlers stop mid-batch, it releases nothing and
        sends nothing more; its records expire on their own."""
        await self._halt(instance)
        await instance.crash()
        await self.instants.last()
        self._observe()

    async def stop(self, *instances: _Instance) -> None:
        """Stop ``instances`` gracefully, all at once, while the others run on."""
        for instance in instances:
            await self._halt(instance)
        # Stopping finishes batches and releases ownership through the store, which takes
        # virtual time; the others run on meanwhile.
        await asyncio.gather(*(instance.stop() for instance in instances))
        self._observe()

    async def stop_run(self) -> None:
        """End the simulation: every live instance dies, the producer stops, nothing of it
        is left on the loop."""
        for instance in list(self.alive):
            await self._halt(instance)
            await instance.crash()
        for instance in self.instances:
            if instance.teardown is not None:
                await instance.teardown
        if self._producer is not None:
            self._producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._producer
        self._sampler.cancel()
        await self.instants.last()
        self.instants.close()
        await self.source.close()

    def add_partitions(self, count: int) -> None:
        self.partition_ids.extend(self.source.add_partitions(count))

    # ---- observation

    def owner_map(self) -> dict[str, str | None]:
        """Partition -> live owner, by the store's records right now."""
        now = self.now
        return {pid: self.ledger.live_owner(pid, now) for pid in self.partition_ids}

    def counts(self) -> dict[str, int]:
        return self.ledger.counts(self.partition_ids, [i.owner_id for i in self.alive], self.now)

    def is_balanced(self) -> bool:
        if not self.alive:
            return False
        alive = {i.owner_id for i in self.alive}
        now = self.now
        counts = {owner: 0 for owner in alive}
        for pid in self.partition_ids:
            owner = self.ledger.live_owner(pid, now)
            if owner not in alive:
                return False
            counts[owner] += 1
        return max(counts.values()) - min(counts.values()) <= self.balance_tolerance

    def _observe(self) -> None:
        """Track when the assignment became (and stayed) balanced."""
        self._dirty = False
        self._seen_version = self.ledger.version
        if self.is_balanced():
            if self._balanced_since is None:
                self._balanced_since = self.now
        else:
            self._balanced_since = None

    def _on_instant(self) -> None:
        # The balance changes only when a tick ends or the store is written (and with
        # time alone, which the samples catch at every tick boundary).
        if self._dirty or self._seen_version != self.ledger.version:
            self._observe()
        for check in list(self._waiters):
            check()

    def _sample_due(self) -> None:
        self._sample()
        self._sampler = self.instants.call_at(self.now + self.interval, self._sample_due)

    async def run_until(self, end: float, *, stop_when: Callable[[], bool] | None = None) -> None:
        """Let simulated time run to ``end`` (or until ``stop_when()`` holds once an instant
        is over)."""
        done = self.instants.loop.create_future()

        def check() -> None:
            if not done.done() and (self.now >= end - 1e-9 or (stop_when is not None and stop_when())):
                done.set_result(None)

        wake = self.instants.call_at(end, lambda: None)  # time gets there even if nothing else happens
        self._waiters.append(check)
        try:
            check()
            await done
        finally:
            self._waiters.remove(check)
            wake.cancel()
        self._observe()

    def _sample(self) -> None:
        self._observe()
        self.samples.append(Sample((self.now - self._origin) / self.interval, self.counts()))

    def _next_production(self, traffic: Traffic) -> float:
        offset = traffic.phase * traffic.step
        return math.ceil((self.now - offset) / traffic.step - 1e-9) * traffic.step + offset

    async def run_to_mid_batch(self) -> None:
        """With traffic: run to half a handler's work after the next production instant,
        when every owned partition is inside a batch (the worst moment for a crash or a
        stop, and the same moment for both SDKs)."""
        if self.traffic is None:
            return
        upcoming = self._next_production(self.traffic)
        if upcoming <= self.now + 1e-9:
            upcoming += self.traffic.step
        await self.run_until(upcoming + min(self.work, self.traffic.step) / 2)

    # ---- phases

    def mark(self) -> dict[str, Any]:
        """Start measuring a phase now; pass the result to :meth:`result`."""
        return {"at": self.now, "ledger": self.ledger.snapshot(), "ticks": self._instance_ticks}

    def result(self, mark: dict[str, Any], *, balanced_at: float | None = None,
               reowned_at: float | None = None) -> PhaseResult:
        before = mark["ledger"]
        after = self.ledger.snapshot()
        start = mark["at"]
        overlap, deliverers = self.deliveries.overlap(start, self.now)
        return PhaseResult(
            ticks_to_balanced=None if balanced_at is None else self.ticks_between(start, balanced_at),
            balanced_at=balanced_at,
            moves=after["moves"] - before["moves"],
            steals=after["steals"] - before["steals"],
            handoffs=after["handoffs"] - before["handoffs"],
            failed_claims=after["failed_claims"] - before["failed_claims"],
            owner_changes=after["owner_changes"] - before["owner_changes"],
            requests=after["requests"] - before["requests"],
            instance_ticks=self._instance_ticks - mark["ticks"],
            duration=self.now - start,
            duplicates=self.deliveries.duplicates(start),
            overlap_seconds=overlap,
            max_deliverers=deliverers,
            events=self.deliveries.events(start),
            reowned_at=reowned_at,
        )

    def undelivered(self, grace: float = 5.0) -> int:
        """Events enqueued more than ``grace`` seconds ago that no handler was given."""
        cutoff = EPOCH + timedelta(seconds=self.now - grace)
        return self.deliveries.undelivered(self.source, self.partition_ids, cutoff)

    def ticks_between(self, start: float, end: float) -> int:
        """Tick rounds from ``start`` to ``end``: a change made by the k-th tick after
        ``start`` counts k (every instance ticks once per interval)."""
        if end < start:
            return 0
        return int(math.floor((end - start) / self.interval + 1e-9)) + 1

    async def run_until_balanced(self, max_ticks: float, *, settle_ticks: float | None = None,
                                 mark: dict[str, Any] | None = None) -> PhaseResult:
        """Run until the assignment has been balanced for ``settle_ticks`` (default:
        expiry plus two ticks, so churn caused by expiries is seen), or ``max_ticks``.

        Ticks-to-balanced is measured to the start of the final balanced stretch.
        """
        mark = mark or self.mark()
        settle = settle_ticks if settle_ticks is not None else self.expiration / self.interval + 2
        deadline = mark["at"] + max_ticks * self.interval

        def settled() -> bool:
            return self._balanced_since is not None and self.now - self._balanced_since >= settle * self.interval

        self._observe()
        while self.now < deadline and not settled():
            await self.run_until(min(deadline, self.now + self.interval), stop_when=settled)
        balanced_at = self._balanced_since
        return self.result(mark, balanced_at=balanced_at)

    async def run_until_reowned(self, orphans: Sequence[str], max_ticks: float) -> float | None:
        """Run until every partition in ``orphans`` has a live owner among the alive
        instances; return that virtual time (None if it did not happen)."""
        def done() -> bool:
            names = {i.owner_id for i in self.alive}
            now = self.now
            return all(self.ledger.live_owner(pid, now) in names for pid in orphans)

        deadline = self.now + max_ticks * self.interval
        if done():
            return self.now
        await self.run_until(deadline, stop_when=done)
        return self.now if done() else None

    def resumed_at(self, orphans: Sequence[str], after: float) -> float | None:
        """When the last of ``orphans`` got its first batch from an alive instance after
        ``after`` (None if one never did)."""
        names = {i.owner_id for i in self.alive}
        latest = after
        for pid in orphans:
            batch = self.deliveries.first_batch(pid, after, names)
            if batch is None:
                return None
            latest = max(latest, batch.start)
        return latest

    def record_expiry(self, partition_ids: Iterable[str]) -> float:
        """The virtual time at which the newest of these records expires (a record lives
        as long as its owner's heartbeat when that heartbeat keeps its partitions)."""
        return max((self.ledger.alive_at(self.ledger.records[pid]) + self.expiration for pid in partition_ids
                    if pid in self.ledger.records), default=self.now)


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
