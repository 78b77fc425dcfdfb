"""The main job: several processors and a producer in one process, shown live.

``eventprocessor demo`` runs, over a InMemoryEventSource and the in-memory store (or Blob
storage on a local Azurite with ``--store azurite``, and the real AMQP path with
``--source emulator``: ``EventHubSource`` on the local Event Hubs emulator, fed by the
official producer): convergence, a graceful scale-in, a crash and its failover, then a
summary that counts lost and duplicate events.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from eventprocessor import (
    CheckpointStore,
    EventProcessor,
    LoadBalancingStrategy,
    OwnershipLostError,
    PartitionProcessor,
)
from eventprocessor.errors import StoreTimeoutError
from eventprocessor.sources import EventSource, InMemoryEventSource
from eventprocessor.testing import FaultyStore

from .user_errors import CommandError, require, require_azurite

if TYPE_CHECKING:  # pragma: no cover
    from eventprocessor.emulators.azurite import Azurite

__all__ = ["DemoConfig", "DemoResult", "run_demo"]

logger = logging.getLogger(__name__)

# Azurite's default ports (blob, queue, table): an Azurite already running there is used.
AZURITE_PORTS = (10000, 10001, 10002)
STORE_PROBE_TIMEOUT = 15.0
# The demo's timing on each store (interval, expiration). In memory, a store call costs
# microseconds. On Azurite (one Node.js thread), the greedy start of four processors
# sends some 70 requests at once, and on this 2-core machine under load they took over
# a second: with the in-memory 4 s expiration the derived store_timeout is 0.33 s, and
# every start logged timeouts and back-offs. 12 s gives 1.33 s; a 2 s interval leaves
# room for the ticks of four processors sharing one event loop with the SDK's XML parsing.
DEMO_TIMING = {"memory": (0.5, 4.0), "azurite": (2.0, 12.0)}


def default_timing(store: str) -> tuple[float, float]:
    """The demo's default (interval, expiration) on ``store``."""
    return DEMO_TIMING.get(store, DEMO_TIMING["memory"])


# The demo's hub never grows, and on the emulator asking for its partition ids is an AMQP
# management round trip (a new connection, about 0.5 s of this process's one event loop):
# refreshed every few seconds, it alone would make ticks overrun the demo's 0.5 s interval.
EMULATOR_PARTITION_IDS_TTL = 3600.0


@dataclass
class DemoConfig:
    partitions: int = 16
    processors: int = 4
    strategy: LoadBalancingStrategy = LoadBalancingStrategy.GREEDY
    interval: float = 0.5
    expiration: float = 4.0
    rate: float = 400.0
    store: str = "memory"
    source: str = "memory"
    timeout: float = 60.0


@dataclass
class DemoResult:
    produced: int = 0
    processed: int = 0
    deliveries: int = 0
    lost: int = 0
    duplicates: int = 0
    time_to_balance: float | None = None
    ticks_to_balance: int | None = None
    scale_in_seconds: float | None = None
    failover_seconds: float | None = None
    store_location: str = "in-memory"
    source_location: str = "in-memory"
    phases: list[str] = field(default_factory=list)


class _Ledger:
    """What the demo's handlers saw, shared by all processors."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()
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
    if config.store not in ("memory", "azurite"):
        raise ValueError(f"unknown store {config.store!r}; use 'memory' or 'azurite'")
    if config.source not in ("memory", "emulator"):
        raise ValueError(f"unknown source {config.source!r}; use 'memory' or 'emulator'")
    extras = (["blob"] if config.store == "azurite" else []) + (["eventhub"] if config.source == "emulator" else [])
    options = " ".join(option for option, wanted in (("--store azurite", config.store == "azurite"),
                                                     ("--source emulator", config.source == "emulator")) if wanted)
    require(purpose=f"`eventprocessor demo {options}`", extras=extras)


async def _open_store(config: DemoConfig, console: Console,
                      stack: AsyncExitStack) -> tuple[CheckpointStore, str, Azurite | None]:
    """The demo's store; what it starts is stopped by ``stack``, on every exit path."""
    if config.store == "memory":
        from eventprocessor.stores import InMemoryCheckpointStore

        return InMemoryCheckpointStore(), "in-memory store", None
    purpose = "`eventprocessor demo --store azurite`"
    from eventprocessor.emulators.azurite import Azurite, port_open, start_azurite

    if port_open(AZURITE_PORTS[0]) and port_open(AZURITE_PORTS[2]):
        emulator = Azurite(*AZURITE_PORTS)
        started = False
    else:
        require_azurite(purpose)
        emulator = start_azurite()
        stack.callback(emulator.stop)
        started = True
    store, location = await _blob_store(emulator)
    stack.push_async_callback(store.close)
    if started:
        pid = emulator.process.pid if emulator.process is not None else "?"
        _say(console, f"Store: no Azurite was running; started one (pid {pid}) at 127.0.0.1:{emulator.blob_port} "
                      f"(blob), 127.0.0.1:{emulator.table_port} (table); it stops when the demo ends")
    else:
        _say(console, f"Store: using the Azurite already running at 127.0.0.1:{emulator.blob_port} (blob)")
    return store, location, emulator


async def _blob_store(emulator: Azurite) -> tuple[CheckpointStore, str]:
    """A Blob store on ``emulator``, after a check shows that it can be used."""
    from eventprocessor.stores import BlobCheckpointStore

    container = f"demo-{uuid.uuid4().hex[:12]}"
    store = BlobCheckpointStore.from_connection_string(emulator.connection_string, container)
    try:
        await asyncio.wait_for(store.check(), STORE_PROBE_TIMEOUT)
    except Exception as error:
        await store.close()
        problem = " ".join(str(error).split()) or type(error).__name__
        where = f"127.0.0.1:{emulator.blob_port}"
        if emulator.started_here:
            raise CommandError(f"the Azurite started at {where} cannot be used ({problem}); run again with --debug "
                               "for details") from error
        if isinstance(error, (asyncio.TimeoutError, StoreTimeoutError)):
            raise CommandError(
                f"the service on {where} does not answer as Azurite Blob storage ({problem}): stop it, or free ports "
                f"{AZURITE_PORTS[0]}-{AZURITE_PORTS[2]} so that the demo starts its own Azurite") from error
        raise CommandError(
            f"the Azurite already running at {where} cannot be used: {problem}. Restart it as `eventprocessor "
            f"azurite` does, or stop it so that the demo starts its own") from error
    return store, f"blob {container} @ 127.0.0.1:{emulator.blob_port}"


def status_command(source: EventSource, store: CheckpointStore, emulator: Azurite | None,
                   config: DemoConfig, eventhub_connection_string: str | None = None) -> str | None:
    """The ``eventprocessor status`` command line that watches the demo's group from
    another terminal, or None for the in-memory store (it lives in this process only)."""
    if emulator is None:
        return None
    container = getattr(store, "container_name", None)
    # Azurite's well-known development key, not a secret; on its default ports, the short form.
    account = "UseDevelopmentStorage=true" if emulator.blob_port == AZURITE_PORTS[0] else (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={emulator.account_key};"
        f"BlobEndpoint={emulator.blob_endpoint}")
    words = [f"EVENTPROCESSOR_STORE_CONNECTION_STRING={shlex.quote(account)}"]
    if eventhub_connection_string:
        words.append(f"EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING={shlex.quote(eventhub_connection_string)}")
    words += ["eventprocessor", "status", "--namespace", shlex.quote(source.fully_qualified_namespace),
              "--eventhub", shlex.quote(source.eventhub_name), "--container", shlex.quote(str(container)),
              "--expiration", f"{config.expiration:g}", "--watch"]
    return " ".join(words)


class _Silenced(logging.Filter):
    """A crashed process says nothing more: the demo's crash drops the log records of
    the processors it killed (their dead store link would fail every call they try
    while they are torn down, which a killed process never reports)."""

    def __init__(self) -> None:
        super().__init__()
        self.owner_ids: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.owner_ids:
            return True
        if getattr(record, "eventprocessor.owner_id", None) in self.owner_ids:
            return False
        message = record.getMessage()
        return not any(f"processor {owner_id} " in message for owner_id in self.owner_ids)


@contextlib.contextmanager
def _silencing(silenced: _Silenced) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name == "eventprocessor" or name.startswith("eventprocessor.")]
    for each in loggers:
        each.addFilter(silenced)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(silenced)


@contextlib.contextmanager
def _logging_above(live: Live | None) -> Iterator[None]:
    """While ``live`` shows its table, log lines go through it (printed above the
    table) instead of straight to the terminal, where they would break the redraw and
    leave pieces of the table in the scrollback."""
    if live is None or sys.stderr is sys.__stderr__:  # Live redirects stderr only on a terminal
        yield
        return
    moved = [(handler, handler.stream) for handler in logging.getLogger().handlers
             if type(handler) is logging.StreamHandler and handler.stream in (sys.__stderr__, sys.__stdout__)]
    for handler, _stream in moved:
        handler.setStream(sys.stderr)
    try:
        yield
    finally:
        for handler, stream in moved:
            handler.setStream(stream)


def _say(console: Console, message: str) -> None:
    """One line, shown as written: no markup (a ``[failover]`` label stays), no wrapping."""
    console.print(message, markup=False, highlight=False, soft_wrap=True)


class _EmulatorFeed:
    """The real AMQP path: the Event Hubs emulator in a process of its own, the official
    producer sending keyed batches, and an ``EventHubSource`` for the processors.

    The emulator gets its own process (and core) so that the demo's one event loop
    runs only the client side: at start the processors open one AMQP receiver per
    partition, and with the emulator's side of those connections on the same loop
    too, the ticks of the demo's 0.5 s interval overran."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.emulator: Any = None
        self.producer: Any = None
        self.source: Any = None
        self.sent = 0

    async def start(self, stack: AsyncExitStack) -> str:
        from azure.eventhub.aio import EventHubProducerClient

        from eventprocessor.emulators.eventhubs.process import EmulatorUnavailable, start_emulator_process
        from eventprocessor.sources.eventhub import EventHubSource

        stack.push_async_callback(self.close)
        try:
            # Started synchronously (about a second, before any processor runs), so that
            # nothing can cancel the demo between the start and the registration of its stop.
            self.emulator = start_emulator_process(["--eventhub", "demo-hub", "--partitions", str(self.partitions)])
        except EmulatorUnavailable as error:
            raise CommandError(f"the Event Hubs emulator did not start: {' '.join(str(error).split())}") from None
        stack.callback(self.emulator.stop)
        conn = self.emulator.connection_string
        self.producer = EventHubProducerClient.from_connection_string(conn, eventhub_name="demo-hub")
        self.source = EventHubSource.from_connection_string(conn, eventhub_name="demo-hub",
                                                            partition_ids_ttl=EMULATOR_PARTITION_IDS_TTL)
        # Asked once now, not by the four processors' first ticks at once.
        await self.source.get_partition_ids()
        return f"Event Hubs emulator at 127.0.0.1:{self.emulator.port} (AMQP, pid {self.emulator.pid})"

    @property
    def connection_string(self) -> str:
        return str(self.emulator.connection_string)

    async def send(self, count: int) -> None:
        from azure.eventhub import EventData

        key = f"device-{(self.sent // max(1, count)) % 97}"
        await self.producer.send_batch([EventData(f"reading {self.sent + i}") for i in range(count)],
                                       partition_key=key)
        self.sent += count

    async def produced(self) -> set[tuple[str, int]]:
        """Every (partition, sequence number) the hub holds, read from its properties."""
        result: set[tuple[str, int]] = set()
        for pid in await self.producer.get_partition_ids():
            last = (await self.producer.get_partition_properties(pid))["last_enqueued_sequence_number"]
            result.update((pid, seq) for seq in range(last + 1))
        return result

    async def close(self) -> None:
        """The clients; the emulator process is stopped by the exit stack."""
        if self.producer is not None:
            await self.producer.close()
        if self.source is not None:
            await self.source.close()


def _table(config: DemoConfig, processors: list[EventProcessor], alive: dict[str, str], ledger: _Ledger,
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
        return await _run(config, console, stack)


async def _run(config: DemoConfig, console: Console, stack: AsyncExitStack) -> DemoResult:
    result = DemoResult()
    store, result.store_location, emulator = await _open_store(config, console, stack)
    feed: _EmulatorFeed | None = None
    source: Any
    if config.source == "emulator":
        feed = _EmulatorFeed(config.partitions)
        result.source_location = await feed.start(stack)
        source = feed.source
    else:
        source = InMemoryEventSource(config.partitions, eventhub_name="demo-hub")
    watch = status_command(source, store, emulator, config, feed.connection_string if feed is not None else None)
    _say(console, f"Watch it from another terminal: {watch}" if watch else
         "To watch the demo with `eventprocessor status` from another terminal, run it with --store azurite "
         "(the in-memory store lives in this process only)")
    ledger = _Ledger()
    handler = _handler(ledger)
    # Each processor reaches the store through a link of its own, so that a crash can
    # cut one processor off the way a killed process is: nothing more of it reaches the store.
    links = {f"processor-{i + 1}": FaultyStore(store) for i in range(config.processors)}
    processors = [
        EventProcessor(source, link, handler, owner_id=owner_id,
                       load_balancing_strategy=config.strategy, load_balancing_interval=config.interval,
                       partition_ownership_expiration_interval=config.expiration)
        for owner_id, link in links.items()
    ]
    alive = {p.owner_id: "running" for p in processors}
    produced: list[tuple[str, int]] = []
    producing = asyncio.Event()
    producing.set()
    phase = "starting"
    interactive = console.is_terminal
    silenced = _Silenced()
    stack.enter_context(_silencing(silenced))

    async def produce() -> None:
        if feed is not None:
            # Batches every 50 ms at the requested rate; sequence numbers come from the hub.
            per_batch = max(1, int(config.rate / 20)) if config.rate > 0 else 50
            while producing.is_set():
                await feed.send(per_batch)
                await asyncio.sleep(0.05)
            return
        period = 1.0 / config.rate if config.rate > 0 else 0.01
        while producing.is_set():
            event = await source.send(f"reading {len(produced)}", partition_key=f"device-{len(produced) % 97}")
            produced.append((source.partition_for_key(f"device-{len(produced) % 97}"), event.sequence_number))
            await asyncio.sleep(period)

    def shares(among: list[EventProcessor]) -> str:
        def share(p: EventProcessor) -> str:
            return str(len(p.owned_partitions)) if alive[p.owner_id] == "running" else alive[p.owner_id]

        return " ".join(f"{p.owner_id}={share(p)}" for p in among)

    def say(message: str) -> None:
        # The phase label goes first and is printed literally, so piped output reads in order.
        line = f"[{phase}] {message}"
        result.phases.append(line)
        if interactive:
            console.log(line, markup=False, highlight=False)
        else:
            _say(console, line)

    async def wait_until(condition, what: str) -> float:
        started = time.monotonic()
        last_status = started
        while not condition():
            if time.monotonic() - started > config.timeout:
                raise TimeoutError(f"demo: {what} did not happen within {config.timeout:g}s")
            await asyncio.sleep(0.05)
            if not interactive and time.monotonic() - last_status > 1.0:
                last_status = time.monotonic()
                say(f"tick {max(p.ticks for p in processors)}: {shares(processors)}; "
                    f"processed {len(ledger.seen)}/{sent()}")
        return time.monotonic() - started

    def sent() -> int:
        return feed.sent if feed is not None else len(produced)

    live: Live | None = None
    if interactive:
        live = Live(_table(config, processors, alive, ledger, 0, phase), console=console, refresh_per_second=8)
        live.start()
        stack.callback(live.stop)
        stack.enter_context(_logging_above(live))

    async def refresh() -> None:
        while True:
            if live is not None:
                live.update(_table(config, processors, alive, ledger, sent(), phase))
            await asyncio.sleep(0.125)

    refresher = asyncio.create_task(refresh())
    producer = asyncio.create_task(produce())
    try:
        say(f"{config.processors} processors, {config.partitions} partitions, {config.strategy.value} strategy, "
            f"interval {config.interval}s, expiration {config.expiration}s, {result.store_location}, "
            f"source: {result.source_location}")
        phase = "converging"
        for p in processors:
            await p.start()
        result.time_to_balance = await wait_until(lambda: _balanced(processors, config.partitions), "balance")
        result.ticks_to_balance = max(p.ticks for p in processors)
        say(f"balanced in {result.time_to_balance:.1f}s ({result.ticks_to_balance} ticks): {shares(processors)}")
        await asyncio.sleep(config.interval * 2)
        running = list(processors)
        if len(running) >= 3:
            phase = "scale-in"
            leaving = running.pop(0)
            say(f"{leaving.owner_id} stops gracefully and releases its {len(leaving.owned_partitions)} partitions")
            alive[leaving.owner_id] = "stopped"
            await leaving.stop()
            result.scale_in_seconds = await wait_until(lambda: _balanced(running, config.partitions), "scale-in")
            say(f"rebalanced in {result.scale_in_seconds:.1f}s: {shares(running)}")
        if len(running) >= 2:
            phase = "failover"
            crashed = running.pop(0)
            say(f"{crashed.owner_id} crashed (no release, no checkpoint of its batches in flight); its "
                f"{len(crashed.owned_partitions)} partitions wait for their ownership to expire ({config.expiration}s)")
            alive[crashed.owner_id] = "crashed"
            silenced.owner_ids.add(crashed.owner_id)
            await _crash(crashed, links[crashed.owner_id])
            result.failover_seconds = await wait_until(lambda: _balanced(running, config.partitions), "failover")
            say(f"its partitions were taken over after expiry in {result.failover_seconds:.1f}s: {shares(running)}")
        phase = "draining"
        producing.clear()
        await producer
        if feed is not None:
            produced[:] = sorted(await feed.produced())
        say(f"the producer stopped after {len(produced)} events; waiting until every one is processed")
        await wait_until(lambda: set(produced) <= ledger.seen, "draining")
        phase = "done"
        say(f"all {len(produced)} events processed")
    finally:
        producing.clear()
        for task in (producer, refresher):
            task.cancel()
        await asyncio.gather(producer, refresher, return_exceptions=True)
        if live is not None:  # the final picture, while the survivors still own everything
            live.update(_table(config, processors, alive, ledger, sent(), phase))
        for p in processors:
            if alive[p.owner_id] == "running":
                await p.stop()
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
        ("source", result.source_location),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
