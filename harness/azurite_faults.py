"""Store faults for real: the Blob store on Azurite, through a loopback TCP fault proxy
(:mod:`eventprocessor.emulators.fault_proxy`), in real time.

:func:`run_fault_scenario` runs real EventProcessors (each with its own store client)
on one in-process :class:`~eventprocessor.sources.InMemoryEventSource` with events
flowing, lets them settle, injects one fault between the processors and Azurite
(:func:`slow_store`, :func:`black_hole`, :func:`resets`, or your own), and measures
from what the handlers received (:class:`AzuriteRun`). :func:`restarted_empty` restarts
an Azurite of its own with nothing in it. Used by ``tests/test_faults_azurite.py``
(short lengths, generous bounds) and ``python -m benchmarks.faults --azurite`` (full
lengths). Needs the ``[blob]`` extra and Azurite (``npm ci``).

Example::

    run = await run_fault_scenario("black hole", black_hole(20.0), azurite, traffic=50.0)
    assert run.lost == 0 and run.recovered_after is not None and run.recovered_after <= run.bound
"""
from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from eventprocessor import EventProcessor, Timing
from eventprocessor.emulators.azurite import DEV_ACCOUNT_NAME, Azurite, start_azurite
from eventprocessor.emulators.fault_proxy import FaultProxy
from eventprocessor.sources.memory import InMemoryEventSource
from eventprocessor.testing.recorder import DeliveryRecorder, recording_handler

__all__ = ["AzuriteRun", "ProcessorGroup", "Inject", "run_fault_scenario", "slow_store", "black_hole", "resets",
           "restarted_empty", "PARTITIONS", "PROCESSORS"]

logger = logging.getLogger(__name__)

PARTITIONS = 8
PROCESSORS = 2
RATE = 40.0
OPTIONS: dict[str, Any] = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=12.0)


@dataclass
class AzuriteRun:
    """What one scenario measured."""

    name: str
    bound: float
    recovered_after: float | None
    produced: int
    lost: int
    duplicates: int
    overlap: float
    self_fenced: int
    errors: list[Exception]
    note: str = ""
    processed_before_fault: int = 0  # distinct events the handlers had processed when the fault began
    checkpointed_before_fault: int = 0  # events at or below the checkpoints listed just before the fault
    replayed_checkpointed: int = 0  # deliveries after the fault of events those checkpoints covered


class ProcessorGroup:
    """Processors on one container (each with its own Blob store client), one source with
    a producer, and what their handlers saw (:attr:`ledger`)."""

    def __init__(self, connection_endpoint: str, account_key: str, container: str, processors: int = PROCESSORS,
                 **options: Any) -> None:
        from eventprocessor.stores import BlobCheckpointStore

        self.source = InMemoryEventSource(PARTITIONS)
        self.ledger = DeliveryRecorder()
        self.handler = recording_handler(self.ledger, work=0.01)
        self.errors: list[Exception] = []
        self.produced: list[tuple] = []
        self.produce_until: float | None = None  # a loop time that ends produce_for early (see stop_producing_in)
        self.stores = [BlobCheckpointStore(connection_endpoint, container, credential=account_key)
                       for _ in range(processors)]

        async def on_error(error: Exception, _context: object) -> None:
            self.errors.append(error)

        self.processors = [EventProcessor(self.source, store, self.handler, owner_id=f"p{i}", error_handler=on_error,
                                          **{**OPTIONS, **options}) for i, store in enumerate(self.stores)]

    async def produce_for(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < min(end, self.produce_until if self.produce_until is not None else end):
            pid = str(len(self.produced) % PARTITIONS)
            event = await self.source.send(f"e{len(self.produced)}", partition_id=pid)
            self.produced.append((pid, event.sequence_number))
            await asyncio.sleep(1 / RATE)

    def settled(self) -> bool:
        dispatching: dict[str, list[str]] = {}
        for p in self.processors:
            for pid in p.owned_partitions:
                pump = p.pump(pid)
                if pump is not None and pump.alive:
                    dispatching.setdefault(pid, []).append(p.owner_id)
        every = all(len(dispatching.get(str(i), [])) == 1 for i in range(PARTITIONS))
        return every and set(self.produced) <= self.ledger.processed()

    def stop_producing_in(self, seconds: float | None) -> None:
        """End :meth:`produce_for` ``seconds`` from now (if it would run longer); ``None``: leave it be."""
        if seconds is not None:
            self.produce_until = asyncio.get_running_loop().time() + seconds

    async def wait(self, condition: Callable[[], bool], timeout: float) -> float | None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            if condition():
                return loop.time()
            await asyncio.sleep(0.1)
        return None

    async def close(self) -> None:
        for p in self.processors:
            await p.stop()
        for store in self.stores:
            await store.close()


def _bound(timing: Timing) -> float:
    """The recovery bound of docs/concepts/timing.md, plus 5 s of slack for a shared machine and real I/O."""
    t = timing
    return t.expiration + 1.0 + (math.ceil(PARTITIONS / PROCESSORS) + 2) * 1.1 * t.interval + t.store_timeout + 5.0


Inject = Callable[[FaultProxy, "ProcessorGroup", Azurite], Awaitable[str]]


async def run_fault_scenario(name: str, inject: Inject, azurite: Azurite, *, traffic: float = 60.0,
                             after_recovery: float | None = None, **options: Any) -> AzuriteRun:
    """Run one scenario on ``azurite``: settle, ``inject`` the fault through the proxy,
    recover; everything bounded in time. ``traffic`` is how long the producer sends
    (seconds); ``after_recovery``, if given, ends it that many seconds after the group
    recovered instead (the tests: the events sent after recovery are still counted, without
    waiting out the rest of ``traffic``); ``options`` go to every
    :class:`~eventprocessor.EventProcessor`."""
    async with FaultProxy("127.0.0.1", azurite.blob_port) as proxy:
        endpoint = f"http://127.0.0.1:{proxy.port}/{DEV_ACCOUNT_NAME}"
        group = ProcessorGroup(endpoint, azurite.account_key, f"faults-{uuid.uuid4().hex[:12]}", **options)
        try:
            for p in group.processors:
                await p.start()
            producer = asyncio.ensure_future(group.produce_for(traffic))
            await group.wait(group.settled, timeout=30)
            await asyncio.sleep(3)
            note = await inject(proxy, group, azurite)
            proxy.pass_through()
            loop = asyncio.get_running_loop()
            fault_over = loop.time()
            bound = _bound(group.processors[0].timing)
            recovered = await group.wait(group.settled, timeout=bound + 30)
            group.stop_producing_in(after_recovery)
            await producer
            await group.wait(lambda: set(group.produced) <= group.ledger.processed(), timeout=30)
        finally:
            producer_task = locals().get("producer")
            if producer_task is not None and not producer_task.done():
                producer_task.cancel()
            await group.close()
        overlaps = group.ledger.overlaps()
        return AzuriteRun(name=name, bound=bound, recovered_after=None if recovered is None else recovered - fault_over,
                          produced=len(group.produced),
                          lost=len(set(group.produced) - group.ledger.processed()),
                          duplicates=group.ledger.duplicates(), overlap=max((o for *_x, o in overlaps), default=0.0),
                          self_fenced=sum(p.stats.self_fenced for p in group.processors), errors=group.errors,
                          note=note)


def slow_store(seconds: float) -> Inject:
    """Every request 1.5 s slower, for ``seconds``."""
    async def inject(proxy: FaultProxy, group: ProcessorGroup, azurite: Azurite) -> str:
        proxy.add_latency(1.5)
        await asyncio.sleep(seconds)
        return f"every request +1.5 s for {seconds:g} s"
    return inject


def black_hole(seconds: float) -> Inject:
    """No answer to anything, for ``seconds``."""
    async def inject(proxy: FaultProxy, group: ProcessorGroup, azurite: Azurite) -> str:
        proxy.black_hole()
        await asyncio.sleep(seconds)
        fenced = sum(p.stats.self_fenced for p in group.processors)
        return f"no answer for {seconds:g} s; {fenced} leases self-fenced"
    return inject


def resets(seconds: float) -> Inject:
    """Every connection reset, for ``seconds``."""
    async def inject(proxy: FaultProxy, group: ProcessorGroup, azurite: Azurite) -> str:
        proxy.reset()
        await asyncio.sleep(seconds)
        return f"every connection reset for {seconds:g} s"
    return inject


async def restarted_empty(*, refuse: bool, traffic: float = 40.0, processors: int = PROCESSORS,
                          after_recovery: float | None = None) -> AzuriteRun:
    """Azurite restarted with in-memory persistence: every container is gone. A separate
    Azurite (restarted on its own ports), never the shared one. ``after_recovery``: as
    for :func:`run_fault_scenario`."""
    azurite = start_azurite()
    try:
        group = ProcessorGroup(azurite.blob_endpoint, azurite.account_key, f"restart-{uuid.uuid4().hex[:12]}",
                       processors, refuse_checkpoint_rewind=refuse, load_balancing_strategy="greedy")
        for p in group.processors:
            await p.start()
        producer = asyncio.ensure_future(group.produce_for(traffic))
        await group.wait(group.settled, timeout=30)
        await asyncio.sleep(5)
        processed_before = len(group.ledger.processed())
        source = group.source
        listed = await group.stores[0].list_checkpoints(source.fully_qualified_namespace, source.eventhub_name,
                                                        "$default")
        checkpoints = {c.partition_id: c.sequence_number for c in listed}
        delivered_before = len(group.ledger.deliveries)
        ports = (azurite.blob_port, azurite.queue_port, azurite.table_port)
        await asyncio.to_thread(azurite.stop)
        azurite = await asyncio.to_thread(start_azurite, ports=ports)
        loop = asyncio.get_running_loop()
        fault_over = loop.time()
        bound = _bound(group.processors[0].timing)
        recovered = await group.wait(group.settled, timeout=bound + 30)
        group.stop_producing_in(after_recovery)
        await producer
        await group.wait(lambda: set(group.produced) <= group.ledger.processed(), timeout=30)
        await group.close()
        return AzuriteRun(name=f"Azurite restarted empty, {processors} processor(s)"
                               f"{', refuse_checkpoint_rewind' if refuse else ''}",
                          bound=bound, recovered_after=None if recovered is None else recovered - fault_over,
                          produced=len(group.produced), lost=len(set(group.produced) - group.ledger.processed()),
                          duplicates=group.ledger.duplicates(), overlap=0.0,
                          self_fenced=sum(p.stats.self_fenced for p in group.processors), errors=group.errors,
                          note=f"{sum(p.stats.store_data_lost for p in group.processors)} data-loss reports",
                          processed_before_fault=processed_before,
                          checkpointed_before_fault=sum(seq + 1 for seq in checkpoints.values()),
                          replayed_checkpointed=sum(
                              1 for d in group.ledger.deliveries[delivered_before:]
                              for seq in range(d.first, d.last + 1) if seq <= checkpoints.get(d.partition_id, -1)))
    finally:
        azurite.stop()
