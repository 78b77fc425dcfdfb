"""A simulation run: N instances of one implementation over one store, under one virtual
clock, with the measurements of each phase (:class:`PhaseResult`)."""
from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from eventprocessor.sources import InMemoryEventSource
from eventprocessor.testing import OwnershipLedger

from .deliveries import Deliveries, Traffic
from .instances import OfficialInstance, OursInstance, _Instance, _recording_processor, official_module_patched
from .instants import CONSUMER_GROUP, EPOCH, EVENTHUB, NAMESPACE, InstanceClock, Instants
from .stores import OfficialSimStore, SimulatedStore

__all__ = ["PhaseResult", "SCHEDULES", "Sample", "Simulation", "simulation"]

SCHEDULES = ("staggered", "lockstep", "jittered")



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
