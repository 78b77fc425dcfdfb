"""The main job: several processors and a producer in one process, shown live.

``eventprocessor demo`` runs, over a MemoryEventSource and the in-memory store (or Blob
storage on a local Azurite with ``--store azurite``): convergence, a graceful scale-in,
a crash and its failover, then a summary that counts lost and duplicate events.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

from rich.console import Console
from rich.live import Live
from rich.table import Table

from .balancer import LoadBalancingStrategy
from .checkpoint_store import CheckpointStore
from .errors import OwnershipLostError
from .partition import PartitionProcessor
from .processor import EventProcessor
from .sources import MemoryEventSource

if TYPE_CHECKING:  # pragma: no cover
    from .emulator import Azurite

__all__ = ["DemoConfig", "DemoResult", "run_demo"]

logger = logging.getLogger(__name__)


@dataclass
class DemoConfig:
    partitions: int = 16
    processors: int = 4
    strategy: LoadBalancingStrategy = LoadBalancingStrategy.BALANCED
    interval: float = 0.5
    expiration: float = 4.0
    rate: float = 400.0
    store: str = "memory"
    timeout: float = 60.0


@dataclass
class DemoResult:
    produced: int = 0
    processed: int = 0
    deliveries: int = 0
    lost: int = 0
    duplicates: int = 0
    time_to_balance: Optional[float] = None
    ticks_to_balance: Optional[int] = None
    scale_in_seconds: Optional[float] = None
    failover_seconds: Optional[float] = None
    store_location: str = "in-memory"
    phases: List[str] = field(default_factory=list)


class _Ledger:
    """What the demo's handlers saw, shared by all processors."""

    def __init__(self) -> None:
        self.seen: Set[Tuple[str, int]] = set()
        self.deliveries = 0
        self.per_owner: Counter = Counter()


def _handler(ledger: _Ledger) -> type:
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


def _balanced(live: List[EventProcessor], partitions: int) -> bool:
    owned = [p.owned_partitions for p in live]
    counts = [len(o) for o in owned]
    union = set().union(*owned) if owned else set()
    return len(union) == partitions and sum(counts) == partitions and max(counts) - min(counts) <= 1


async def _open_store(config: DemoConfig, console: Console) -> Tuple[CheckpointStore, str, Optional["Azurite"]]:
    if config.store == "memory":
        from stores import InMemoryCheckpointStore

        return InMemoryCheckpointStore(), "in-memory store", None
    if config.store != "azurite":
        raise ValueError(f"unknown store {config.store!r}; use 'memory' or 'azurite'")
    from .emulator import Azurite, port_open, start_azurite
    from stores import BlobCheckpointStore

    if port_open(10000) and port_open(10002):
        emulator = Azurite(10000, 10001, 10002)
        console.print("[bold]Store:[/] using the Azurite already running at 127.0.0.1:10000 (blob)",
                      soft_wrap=True)
    else:
        emulator = start_azurite()
        pid = emulator.process.pid if emulator.process is not None else "?"
        console.print(f"[bold]Store:[/] no Azurite was running; started one (pid {pid}) "
                      f"at 127.0.0.1:{emulator.blob_port} (blob), 127.0.0.1:{emulator.table_port} (table); "
                      "it stops when the demo ends", soft_wrap=True)
    container = f"demo-{uuid.uuid4().hex[:12]}"
    store = BlobCheckpointStore.from_connection_string(emulator.connection_string, container)
    return store, f"blob {container} @ 127.0.0.1:{emulator.blob_port}", emulator


def _table(config: DemoConfig, processors: List[EventProcessor], alive: Dict[str, str], ledger: _Ledger,
           produced: int, phase: str) -> Table:
    ticks = max((p.ticks for p in processors), default=0)
    table = Table(title=f"eventprocessor demo — {phase}", caption=(
        f"tick {ticks} · produced {produced} · processed {len(ledger.seen)} · deliveries {ledger.deliveries}"))
    table.add_column("processor")
    table.add_column("state")
    table.add_column("owns", justify="right")
    table.add_column("partitions")
    table.add_column("events", justify="right")
    for p in processors:
        owned = sorted(p.owned_partitions, key=int)
        table.add_row(p.owner_id, alive[p.owner_id], str(len(owned)), " ".join(owned),
                      str(ledger.per_owner[p.owner_id]))
    return table


async def run_demo(config: DemoConfig, console: Optional[Console] = None) -> DemoResult:
    """Run the demo and return its summary. Example::

        result = asyncio.run(run_demo(DemoConfig(partitions=8, processors=3)))
        assert result.lost == 0
    """
    console = console or Console()
    result = DemoResult()
    store, result.store_location, emulator = await _open_store(config, console)
    source = MemoryEventSource(config.partitions, eventhub_name="demo-hub")
    ledger = _Ledger()
    handler = _handler(ledger)
    processors = [
        EventProcessor(source, store, handler, owner_id=f"processor-{i + 1}",
                       load_balancing_strategy=config.strategy, load_balancing_interval=config.interval,
                       partition_ownership_expiration_interval=config.expiration)
        for i in range(config.processors)
    ]
    alive = {p.owner_id: "running" for p in processors}
    produced: List[Tuple[str, int]] = []
    producing = asyncio.Event()
    producing.set()
    phase = "starting"
    interactive = console.is_terminal

    async def produce() -> None:
        period = 1.0 / config.rate if config.rate > 0 else 0.01
        while producing.is_set():
            event = await source.send(f"reading {len(produced)}", partition_key=f"device-{len(produced) % 97}")
            produced.append((source.partition_for_key(f"device-{len(produced) % 97}"), event.sequence_number))
            await asyncio.sleep(period)

    def say(message: str) -> None:
        result.phases.append(message)
        if interactive:
            console.log(message)
        else:
            console.print(message, soft_wrap=True)

    async def wait_until(condition, what: str) -> float:
        started = time.monotonic()
        last_status = started
        while not condition():
            if time.monotonic() - started > config.timeout:
                raise TimeoutError(f"demo: {what} did not happen within {config.timeout:.0f}s")
            await asyncio.sleep(0.05)
            if not interactive and time.monotonic() - last_status > 1.0:
                last_status = time.monotonic()
                owned = " ".join(f"{p.owner_id}={len(p.owned_partitions)}" for p in processors)
                console.print(f"  [{phase}] tick {max(p.ticks for p in processors)}: {owned}; "
                              f"processed {len(ledger.seen)}/{len(produced)}", soft_wrap=True)
        return time.monotonic() - started

    live: Optional[Live] = None
    if interactive:
        live = Live(_table(config, processors, alive, ledger, 0, phase), console=console, refresh_per_second=8)
        live.start()

    async def refresh() -> None:
        while True:
            if live is not None:
                live.update(_table(config, processors, alive, ledger, len(produced), phase))
            await asyncio.sleep(0.125)

    refresher = asyncio.create_task(refresh())
    producer = asyncio.create_task(produce())
    try:
        say(f"{config.processors} processors, {config.partitions} partitions, {config.strategy.value} strategy, "
            f"interval {config.interval}s, expiration {config.expiration}s, {result.store_location}")
        phase = "converging"
        for p in processors:
            await p.start()
        result.time_to_balance = await wait_until(lambda: _balanced(processors, config.partitions), "balance")
        result.ticks_to_balance = max(p.ticks for p in processors)
        say(f"balanced in {result.time_to_balance:.1f}s ({result.ticks_to_balance} ticks): "
            + ", ".join(f"{p.owner_id}={len(p.owned_partitions)}" for p in processors))
        await asyncio.sleep(config.interval * 2)
        running = list(processors)
        if len(running) >= 3:
            phase = "scale-in"
            leaving = running.pop(0)
            alive[leaving.owner_id] = "stopped"
            await leaving.stop()
            result.scale_in_seconds = await wait_until(lambda: _balanced(running, config.partitions), "scale-in")
            say(f"{leaving.owner_id} stopped gracefully (released); rebalanced in {result.scale_in_seconds:.1f}s")
        if len(running) >= 2:
            phase = "failover"
            crashed = running.pop(0)
            alive[crashed.owner_id] = "crashed"
            await crashed.stop(release=False)
            result.failover_seconds = await wait_until(lambda: _balanced(running, config.partitions), "failover")
            say(f"{crashed.owner_id} crashed (no release); its partitions were taken over after expiry in "
                f"{result.failover_seconds:.1f}s")
        phase = "draining"
        producing.clear()
        await producer
        await wait_until(lambda: set(produced) <= ledger.seen, "draining")
        phase = "done"
    finally:
        producing.clear()
        if not producer.done():
            producer.cancel()
        refresher.cancel()
        if live is not None:  # the final picture, while the survivors still own everything
            live.update(_table(config, processors, alive, ledger, len(produced), phase))
        for p in processors:
            if alive[p.owner_id] == "running":
                await p.stop()
        if live is not None:
            live.stop()
        await store.close()
        if emulator is not None:
            emulator.stop()
    result.produced = len(produced)
    result.processed = len(ledger.seen & set(produced))
    result.deliveries = ledger.deliveries
    result.lost = len(set(produced) - ledger.seen)
    result.duplicates = ledger.deliveries - len(ledger.seen)
    return result


def summary_table(result: DemoResult) -> Table:
    table = Table(title="summary", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("events produced", str(result.produced)),
        ("events processed", str(result.processed)),
        ("events lost", str(result.lost)),
        ("duplicates (redelivered after crash)", str(result.duplicates)),
        ("time to balance", f"{result.time_to_balance:.1f}s ({result.ticks_to_balance} ticks)"
         if result.time_to_balance is not None else "-"),
        ("scale-in rebalance", f"{result.scale_in_seconds:.1f}s" if result.scale_in_seconds is not None else "-"),
        ("crash failover", f"{result.failover_seconds:.1f}s" if result.failover_seconds is not None else "-"),
        ("store", result.store_location),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
