"""The instances a simulation drives: this SDK's real ``EventProcessor``
(:class:`OursInstance`) and azure-eventhub's ``OwnershipManager`` dispatched as its
``EventProcessor`` dispatches (:class:`OfficialInstance`), with the official module's
``time`` and ``random`` pointed at the calling instance's virtual clock and RNG while a
simulation runs (:func:`official_module_patched`)."""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import random
import time as _real_time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from eventprocessor import CheckpointStoreError, EventPosition, OwnershipLostError
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores.records import partition_sort_key

from ..standin_client import StandInClient
from .deliveries import Deliveries
from .instants import CONSUMER_GROUP, EVENTHUB, NAMESPACE, InstanceClock
from .stores import OfficialSimStore, SimulatedStore

__all__ = ["OfficialInstance", "OursInstance", "official_module_patched"]


@dataclass
class _OfficialContext:
    clock: InstanceClock
    rng: random.Random


_CURRENT_OFFICIAL: contextvars.ContextVar[_OfficialContext] = contextvars.ContextVar("official_instance")


class _InstanceTime:
    """Stands in for the ``time`` module inside the official balancer: the calling
    instance's local (possibly skewed) virtual wall clock."""

    def time(self) -> float:
        return _CURRENT_OFFICIAL.get().clock.time()

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)


class _InstanceRandom:
    """Stands in for the ``random`` module inside the official balancer: the calling
    instance's seeded RNG."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_CURRENT_OFFICIAL.get().rng, name)


@contextlib.contextmanager
def official_module_patched() -> Iterator[Any]:
    """Point the official balancer's module-level ``time`` and ``random`` at stand-ins that
    read the calling instance's virtual clock and RNG; restore them afterwards."""
    from azure.eventhub.aio._eventprocessor import _ownership_manager as module

    saved = (module.time, module.random)
    module.time, module.random = _InstanceTime(), _InstanceRandom()  # type: ignore[assignment]
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
        self._manager = OwnershipManager(StandInClient(NAMESPACE, EVENTHUB, partition_ids),  # type: ignore[arg-type]
                                         CONSUMER_GROUP, owner_id, store, expiration, strategy, None)  # type: ignore[arg-type]
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
        for pid in sorted(partition_ids, key=partition_sort_key):
            if pid not in self._tasks or self._tasks[pid].done():
                # Created under this instance's context: its virtual time follows the task.
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
