"""A small cluster of real EventProcessors on virtual time, and what their handlers saw.

Used by the processor's fault tests and by the deterministic fault harness. Everything
runs on :class:`~eventprocessor.testing.VirtualTimeLoop`: the in-memory store's server
clock, the processors' clocks, the source's waits and the handlers' work all follow the
loop, so minutes of leases and outages take milliseconds and a run is a function of its
seed.
"""
from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

from eventprocessor.stores.memory import InMemoryCheckpointStore

from .._processor import EventProcessor
from ..sources.memory import InMemoryEventSource
from .loop import virtual_utc_clock
from .recorder import DeliveryRecorder, recording_handler
from .source import FaultySource
from .store import FaultyStore

__all__ = ["Cluster"]


class Cluster:
    """Processors over one in-memory store (behind a :class:`FaultyStore`) and one
    :class:`InMemoryEventSource`, on the running (virtual) loop. With ``source_faults``
    the processors read the source through a :class:`FaultySource` (``faulty_source``)."""

    def __init__(self, partitions: int, *, seed: int = 0, work: float = 0.0, source_faults: bool = False,
                 **processor_options: Any) -> None:
        self.rng = random.Random(seed)
        self.source = InMemoryEventSource(partitions, clock=virtual_utc_clock())
        self.faulty_source: FaultySource | None = None
        if source_faults:
            self.faulty_source = FaultySource(self.source, rng=random.Random(self.rng.random()))
        self.memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        self.store = FaultyStore(self.memory, rng=random.Random(self.rng.random()))
        self.ledger = DeliveryRecorder()
        self.handler = recording_handler(self.ledger, work=work, rng=random.Random(self.rng.random()))
        self.options = dict(processor_options)
        self.processors: list[EventProcessor] = []
        self.produced: list[tuple[str, int]] = []
        self.errors: list[Exception] = []

    def add(self, owner_id: str | None = None, *, store: FaultyStore | None = None,
            **overrides: Any) -> EventProcessor:
        """A new processor; by default on the shared faulty store, or on ``store`` (for
        faults that hit one processor's link to the store only). ``handler=`` overrides
        the recording handler (a factory or PartitionProcessor subclass)."""
        overrides = dict(overrides)
        handler = overrides.pop("handler", self.handler)
        options = {**self.options, **overrides}

        async def on_error(error, context):
            self.errors.append(error)

        source = self.faulty_source if self.faulty_source is not None else self.source
        processor = EventProcessor(source, store or self.store, handler,
                                   owner_id=owner_id or f"p{len(self.processors)}",
                                   rng=random.Random(self.rng.random()), error_handler=on_error, **options)
        self.processors.append(processor)
        return processor

    def link(self) -> FaultyStore:
        """A processor's own faulty link to the shared store."""
        return FaultyStore(self.memory, rng=random.Random(self.rng.random()))

    async def produce(self, count: int) -> None:
        """Send ``count`` events, round robin over the partitions."""
        for _ in range(count):
            pid = str(len(self.produced) % self.source.partition_count)
            event = await self.source.send(f"e{len(self.produced)}", partition_id=pid)
            self.produced.append((pid, event.sequence_number))

    async def produce_for(self, seconds: float, rate: float) -> None:
        """Send ``rate`` events per virtual second, round robin, for ``seconds``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            await self.produce(1)
            await asyncio.sleep(1.0 / rate)

    def owners(self) -> dict[str, list[str]]:
        """Partition -> the processors that may dispatch it right now."""
        owners: dict[str, list[str]] = defaultdict(list)
        for p in self.processors:
            for pid in p.owned_partitions:
                owners[pid].append(p.owner_id)
        return owners

    def live_pumps(self) -> dict[str, list[str]]:
        """Partition -> processors that hold it with a live pump."""
        pumps: dict[str, list[str]] = defaultdict(list)
        for p in self.processors:
            for pid in p.owned_partitions:
                pump = p.pump(pid)
                if pump is not None and pump.alive:
                    pumps[pid].append(p.owner_id)
        return pumps

    def settled(self, running: list[EventProcessor], produced_before: int | None = None) -> bool:
        """Every partition dispatched by exactly one running processor with a live pump,
        and every produced event processed; with ``produced_before``, only the first that
        many produced events (a producer still running always has some in flight, so
        "everything processed at this instant" is a race, not a recovery)."""
        pumps = self.live_pumps()
        names = {p.owner_id for p in running}
        every = all(len([o for o in pumps.get(str(i), []) if o in names]) == 1
                    for i in range(self.source.partition_count))
        return every and set(self.produced[:produced_before]) <= self.ledger.processed()

    async def wait_until(self, condition, *, timeout: float, step: float = 0.25) -> float | None:
        """Poll ``condition`` every ``step`` virtual seconds; return when it held (the loop
        time), or None after ``timeout``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() <= end:
            if condition():
                return loop.time()
            await asyncio.sleep(step)
        return None
