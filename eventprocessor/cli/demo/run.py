"""The demo's phases: processors start and converge, one stops gracefully, one crashes,
the producer stops and every event is accounted for."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from rich.console import Console
from rich.live import Live

from eventprocessor import EventProcessor, OwnershipLostError, PartitionProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.testing import FaultyStore

from ..user_errors import require
from .display import Silenced, logging_above, processors_table, say, silencing
from .feed import EmulatorFeed
from .model import DemoConfig, DemoResult, Ledger
from .store import open_store, status_command

__all__ = ["DemoConfig", "DemoResult", "Ledger", "check_prerequisites", "default_timing", "run_demo"]

# The demo's timing on each store (interval, expiration). In memory, a store call costs
# microseconds. On Azurite (one Node.js thread), the greedy start of four processors
# sends some 70 requests at once, and on this 2-core machine under load they took over
# a second: with the in-memory 4 s expiration the derived store_timeout is 0.33 s, and
# every start logged timeouts and back-offs. 12 s gives 1.33 s; a 2 s interval leaves
# room for the ticks of four processors sharing one event loop with the SDK's XML parsing.
DEMO_TIMING = {"memory": (0.5, 4.0), "blob": (2.0, 12.0), "table": (2.0, 12.0)}


def default_timing(store: str) -> tuple[float, float]:
    """The demo's default (interval, expiration) on ``store``."""
    return DEMO_TIMING.get(store, DEMO_TIMING["memory"])


def _handler(ledger: Ledger) -> type:
    class DemoHandler(PartitionProcessor):
        async def process_events(self, events, context):
            for event in events:
                ledger.seen.add((context.partition_id, event.sequence_number))
            ledger.deliveries += len(events)
            ledger.per_owner[context.owner_id] += len(events)
            try:
                await context.update_checkpoint()
            except OwnershipLostError:
                pass  # the next owner resumes from its own checkpoint

    return DemoHandler


async def _crash(processor: EventProcessor, link: FaultyStore) -> None:
    """Kill ``processor`` as SIGKILL would: its store link goes dead first (no release, no
    checkpoint reaches the store), its handlers are interrupted mid-batch, then its
    remaining tasks are cancelled (every store call they try fails at once)."""
    link.down = True
    for partition_id in list(processor.leases):
        pump = processor.pump(partition_id)
        if pump is not None:
            pump.cancel()
    await processor.stop(release=False)


def _balanced(live: list[EventProcessor], partitions: int) -> bool:
    owned = [p.owned_partitions for p in live]
    counts = [len(o) for o in owned]
    union = set().union(*owned) if owned else set()
    return len(union) == partitions and sum(counts) == partitions and max(counts) - min(counts) <= 1


def check_prerequisites(config: DemoConfig) -> None:
    """Everything the demo needs that is not there, said before anything starts
    (:class:`~eventprocessor.cli.user_errors.MissingRequirementError`, one line)."""
    if config.store not in DEMO_TIMING:
        raise ValueError(f"unknown store {config.store!r}; use one of {sorted(DEMO_TIMING)}")
    if config.source not in ("memory", "emulator"):
        raise ValueError(f"unknown source {config.source!r}; use 'memory' or 'emulator'")
    azure = config.store != "memory"
    extras = ([config.store] if azure else []) + (["eventhub"] if config.source == "emulator" else [])
    options = " ".join(option for option, wanted in ((f"--store {config.store}", azure),
                                                     ("--source emulator", config.source == "emulator")) if wanted)
    require(purpose=f"`eventprocessor demo {options}`", extras=extras)


async def run_demo(config: DemoConfig, console: Console | None = None) -> DemoResult:
    """Run the demo and return its summary. Everything it starts (Azurite, the emulator,
    clients) is stopped on every way out: an error, a timeout, Ctrl-C or cancellation.
    Example::

        result = asyncio.run(run_demo(DemoConfig(partitions=8, processors=3)))
        assert result.lost == 0
    """
    console = console or Console()
    check_prerequisites(config)
    async with AsyncExitStack() as stack:
        demo = _Demo(config, console)
        await demo.open(stack)
        return await demo.run(stack)


class _Demo:
    """One run of the demo: its store, source, processors and producer, phase by phase."""

    def __init__(self, config: DemoConfig, console: Console) -> None:
        self.config = config
        self.console = console
        self.result = DemoResult()
        self.ledger = Ledger()
        self.feed: EmulatorFeed | None = None
        self.source: Any = None
        self.produced: list[tuple[str, int]] = []
        self.producing = asyncio.Event()
        self.phase = "starting"
        self.interactive = console.is_terminal
        self.silenced = Silenced()
        self.live: Live | None = None
        self.processors: list[EventProcessor] = []
        self.links: dict[str, FaultyStore] = {}
        self.alive: dict[str, str] = {}

    async def open(self, stack: AsyncExitStack) -> None:
        """The store, the source and the processors (not started); what it starts is
        stopped by ``stack``."""
        config = self.config
        store, self.result.store_location, emulator = await open_store(config, self.console, stack)
        if config.source == "emulator":
            self.feed = EmulatorFeed(config.partitions)
            self.result.source_location = await self.feed.start(stack)
            self.source = self.feed.source
        else:
            self.source = InMemoryEventSource(config.partitions, eventhub_name="demo-hub")
        watch = status_command(self.source, store, emulator, config,
                               self.feed.connection_string if self.feed is not None else None)
        say(self.console, f"Watch it from another terminal: {watch}" if watch else
            "To watch the demo with `eventprocessor status` from another terminal, run it with --store blob "
            "(the in-memory store lives in this process only)")
        handler = _handler(self.ledger)
        # Each processor reaches the store through a link of its own, so that a crash can
        # cut one processor off the way a killed process is: nothing more of it reaches the store.
        self.links = {f"processor-{i + 1}": FaultyStore(store) for i in range(config.processors)}
        self.processors = [
            EventProcessor(self.source, link, handler, owner_id=owner_id, load_balancing_strategy=config.strategy,
                           load_balancing_interval=config.interval,
                           partition_ownership_expiration_interval=config.expiration)
            for owner_id, link in self.links.items()]
        self.alive = {p.owner_id: "running" for p in self.processors}
        stack.enter_context(silencing(self.silenced))
        if self.interactive:
            self.live = Live(self._view(), console=self.console, refresh_per_second=8)
            self.live.start()
            stack.callback(self.live.stop)
            stack.enter_context(logging_above(self.live))

    async def run(self, stack: AsyncExitStack) -> DemoResult:
        self.producing.set()
        refresher = asyncio.create_task(self._refresh())
        producer = asyncio.create_task(self._produce())
        try:
            await self._phases(producer)
        finally:
            self.producing.clear()
            for task in (producer, refresher):
                task.cancel()
            await asyncio.gather(producer, refresher, return_exceptions=True)
            if self.live is not None:  # the final picture, while the survivors still own everything
                self.live.update(self._view())
            for p in self.processors:
                if self.alive[p.owner_id] == "running":
                    await p.stop()
        return self._summary()

    async def _phases(self, producer: asyncio.Task) -> None:
        config = self.config
        self._say(f"{config.processors} processors, {config.partitions} partitions, {config.strategy.value} "
                  f"strategy, interval {config.interval}s, expiration {config.expiration}s, "
                  f"{self.result.store_location}, source: {self.result.source_location}")
        running = await self._converge()
        if len(running) >= 3:
            await self._scale_in(running)
        if len(running) >= 2:
            await self._failover(running)
        self.phase = "draining"
        self.producing.clear()
        await producer
        if self.feed is not None:
            self.produced[:] = sorted(await self.feed.produced())
        self._say(f"the producer stopped after {len(self.produced)} events; waiting until every one is processed")
        await self._wait_until(lambda: set(self.produced) <= self.ledger.seen, "draining")
        self.phase = "done"
        self._say(f"all {len(self.produced)} events processed")

    async def _converge(self) -> list[EventProcessor]:
        self.phase = "converging"
        for p in self.processors:
            await p.start()
        result = self.result
        result.time_to_balance = await self._wait_until(
            lambda: _balanced(self.processors, self.config.partitions), "balance")
        result.ticks_to_balance = max(p.ticks for p in self.processors)
        self._say(f"balanced in {result.time_to_balance:.1f}s ({result.ticks_to_balance} ticks): "
                  f"{self._shares(self.processors)}")
        await asyncio.sleep(self.config.interval * 2)
        return list(self.processors)

    async def _scale_in(self, running: list[EventProcessor]) -> None:
        self.phase = "scale-in"
        leaving = running.pop(0)
        self._say(f"{leaving.owner_id} stops gracefully and releases its {len(leaving.owned_partitions)} partitions")
        self.alive[leaving.owner_id] = "stopped"
        await leaving.stop()
        self.result.scale_in_seconds = await self._wait_until(
            lambda: _balanced(running, self.config.partitions), "scale-in")
        self._say(f"rebalanced in {self.result.scale_in_seconds:.1f}s: {self._shares(running)}")

    async def _failover(self, running: list[EventProcessor]) -> None:
        self.phase = "failover"
        crashed = running.pop(0)
        self._say(f"{crashed.owner_id} crashed (no release, no checkpoint of its batches in flight); its "
                  f"{len(crashed.owned_partitions)} partitions wait for their ownership to expire "
                  f"({self.config.expiration}s)")
        self.alive[crashed.owner_id] = "crashed"
        self.silenced.owner_ids.add(crashed.owner_id)
        await _crash(crashed, self.links[crashed.owner_id])
        self.result.failover_seconds = await self._wait_until(
            lambda: _balanced(running, self.config.partitions), "failover")
        self._say(f"its partitions were taken over after expiry in {self.result.failover_seconds:.1f}s: "
                  f"{self._shares(running)}")

    async def _produce(self) -> None:
        config = self.config
        if self.feed is not None:
            # Batches every 50 ms at the requested rate; sequence numbers come from the hub.
            per_batch = max(1, int(config.rate / 20)) if config.rate > 0 else 50
            while self.producing.is_set():
                await self.feed.send(per_batch)
                await asyncio.sleep(0.05)
            return
        period = 1.0 / config.rate if config.rate > 0 else 0.01
        while self.producing.is_set():
            key = f"device-{len(self.produced) % 97}"
            event = await self.source.send(f"reading {len(self.produced)}", partition_key=key)
            self.produced.append((self.source.partition_for_key(key), event.sequence_number))
            await asyncio.sleep(period)

    def _sent(self) -> int:
        return self.feed.sent if self.feed is not None else len(self.produced)

    def _shares(self, among: list[EventProcessor]) -> str:
        def share(p: EventProcessor) -> str:
            return str(len(p.owned_partitions)) if self.alive[p.owner_id] == "running" else self.alive[p.owner_id]

        return " ".join(f"{p.owner_id}={share(p)}" for p in among)

    def _say(self, message: str) -> None:
        # The phase label goes first and is printed literally, so piped output reads in order.
        line = f"[{self.phase}] {message}"
        self.result.phases.append(line)
        if self.interactive:
            self.console.log(line, markup=False, highlight=False)
        else:
            say(self.console, line)

    async def _wait_until(self, condition: Callable[[], bool], what: str) -> float:
        started = time.monotonic()
        last_status = started
        while not condition():
            if time.monotonic() - started > self.config.timeout:
                raise TimeoutError(f"demo: {what} did not happen within {self.config.timeout:g}s")
            await asyncio.sleep(0.05)
            if not self.interactive and time.monotonic() - last_status > 1.0:
                last_status = time.monotonic()
                self._say(f"tick {max(p.ticks for p in self.processors)}: {self._shares(self.processors)}; "
                          f"processed {len(self.ledger.seen)}/{self._sent()}")
        return time.monotonic() - started

    def _view(self) -> Any:
        return processors_table(self.processors, self.alive, self.ledger, self._sent(), self.phase)

    async def _refresh(self) -> None:
        while True:
            if self.live is not None:
                self.live.update(self._view())
            await asyncio.sleep(0.125)

    def _summary(self) -> DemoResult:
        result, produced, seen = self.result, set(self.produced), self.ledger.seen
        result.produced = len(self.produced)
        result.processed = len(seen & produced)
        result.deliveries = self.ledger.deliveries
        result.lost = len(produced - seen)
        result.duplicates = self.ledger.deliveries - len(seen)
        return result
