"""Source faults, each against its bound: the rows of the "Faults" section about the
event source (``python -m benchmarks.faults``; ``--emulator`` adds the real transport),
and :class:`Row`, a row of either table of that section.

Two transports:

* **virtual**: real EventProcessors over :class:`~eventprocessor.testing.FaultySource`
  on virtual time (the scenarios of ``tests/test_source_fault_harness.py``, one fault
  at a time, at full length);
* **emulator**: ``EventHubSource`` reading the project's Event Hubs emulator through a
  loopback TCP fault proxy while the official producer sends
  (:mod:`harness.source_faults`), in real time.

Counted from what the handlers received: events lost, events delivered twice to one
claim, batches handed to a claim that had ended.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from eventprocessor import EventPosition
from eventprocessor.testing import Cluster, FaultySource, run_virtual

__all__ = ["Row", "run_virtual_source_rows", "run_emulator_source_rows"]

PARTITIONS = 8
PROCESSORS = 2
RATE = 40.0
WORK = 0.05
CALL_TIMEOUT = 10.0  # a call into the black hole fails after this (EventHubSource's operation_timeout)
PUMP_MAX_BACKOFF = 5.0  # the pump's reconnect backoff cap


@dataclass
class Row:
    """One fault against its bound: what recovery took (``recovered``: seconds from the end
    of the fault, None: never) and what the handlers received. Store faults count
    ``duplicates`` and ``overlap``; source faults ``duplicates_within_claims`` and
    ``after_end`` (batches handed to a claim that had ended)."""

    fault: str
    transport: str
    bound: str
    bound_seconds: float
    recovered: float | None
    produced: int
    lost: int
    note: str = ""
    duplicates: int = 0
    overlap: float = 0.0
    duplicates_within_claims: int = 0
    after_end: int = 0

    @property
    def within(self) -> bool:
        return (self.recovered is not None and self.recovered <= self.bound_seconds and self.lost == 0
                and self.duplicates_within_claims == 0 and self.after_end == 0)


VIRTUAL_BOUND = "C + B + 2 s"
VIRTUAL_BOUND_SECONDS = CALL_TIMEOUT + PUMP_MAX_BACKOFF + 2.0
"""A call into the black hole fails within C = 10 s (operation_timeout); a pump then waits
its backoff, at most B = 5 s, and reopens; 2 s to catch up (at most a few batches of
``WORK``). Every other fault ends sooner: its calls fail at once."""


Inject = Callable[[FaultySource], Awaitable[str]]


def _for(seconds: float, on: Callable[[FaultySource], None], off: Callable[[FaultySource], None],
         note: str) -> Inject:
    async def inject(source: FaultySource) -> str:
        on(source)
        await asyncio.sleep(seconds)
        off(source)
        return note
    return inject


def _resets(every: float, seconds: float) -> Inject:
    async def inject(source: FaultySource) -> str:
        from harness.source_faults import repeatedly

        count = await repeatedly(source.detach_all, every=every, seconds=seconds)
        return f"every link detached every {every:g} s for {seconds:g} s ({count} detaches)"
    return inject


def _throttle(seconds: float, retry_after: float) -> Inject:
    async def inject(source: FaultySource) -> str:
        source.throttle(seconds, retry_after=retry_after)
        await asyncio.sleep(seconds)
        return (f"server busy for {seconds:g} s, retry-after {retry_after:g} s; "
                f"{source.injected['ignored_retry_after']} calls came before their retry-after")
    return inject


def _setattr(name: str, value: object) -> Callable[[FaultySource], None]:
    return lambda source: setattr(source, name, value)


VIRTUAL_SCENARIOS: list[tuple] = [
    ("receive errors (30 % of receives, 20 s)", _for(20, _setattr("receive_error_rate", 0.3),
                                                     _setattr("receive_error_rate", 0.0), "")),
    ("connection resets (every link, every 2 s, 12 s)", _resets(2.0, 12.0)),
    ("stalled receives (+2 s each, 20 s)", _for(20, _setattr("stall", 2.0), _setattr("stall", 0.0), "")),
    ("black-holed source (20 s)", _for(20, lambda s: s.set_black_hole(True), lambda s: s.set_black_hole(False),
                                       "hung receives fail when it ends; hung opens after C")),
    ("server busy (20 s, retry-after 4 s)", _throttle(20.0, 4.0)),
    ("open_receiver fails (50 %, 20 s)", _for(20, _setattr("open_error_rate", 0.5),
                                              _setattr("open_error_rate", 0.0), "")),
    ("get_partition_ids fails (30 s)", _for(30, _setattr("ids_error_rate", 1.0),
                                            _setattr("ids_error_rate", 0.0), "")),
    ("a partition disappears (20 s)", _for(20, lambda s: s.remove("3"), lambda s: s.restore("3"),
                                           "listing stops naming it, its receiver fails with not-found")),
]


async def _virtual(fault: str, inject: Inject, checkpoint: bool) -> Row:
    cluster = Cluster(PARTITIONS, seed=5, work=WORK, source_faults=True, load_balancing_interval=1.0,
                      partition_ownership_expiration_interval=12.0, initial_event_position=EventPosition.earliest())
    source = cluster.faulty_source
    assert source is not None
    source.call_timeout = CALL_TIMEOUT
    if not checkpoint:
        from eventprocessor.testing import recording_handler

        cluster.handler = recording_handler(cluster.ledger, work=WORK, rng=random.Random(1), checkpoint=False)
    processors = [cluster.add(f"p{i}") for i in range(PROCESSORS)]
    for p in processors:
        await p.start()
    producer = asyncio.ensure_future(cluster.produce_for(120, rate=RATE))
    await cluster.wait_until(lambda: cluster.settled(processors), timeout=60)
    await asyncio.sleep(20)
    note = await inject(source)
    source.clear()
    loop = asyncio.get_running_loop()
    fault_over = loop.time()
    recovered = await cluster.wait_until(lambda: cluster.settled(processors), timeout=VIRTUAL_BOUND_SECONDS + 60,
                                         step=0.05)
    await producer
    await cluster.wait_until(lambda: set(cluster.produced) <= cluster.ledger.processed(), timeout=60)
    for p in processors:
        await p.stop()
    ledger = cluster.ledger
    return Row(fault=fault + ("" if checkpoint else ", no checkpoints"), transport="virtual",
                     bound=VIRTUAL_BOUND, bound_seconds=VIRTUAL_BOUND_SECONDS,
                     recovered=None if recovered is None else recovered - fault_over, produced=len(cluster.produced),
                     lost=len(set(cluster.produced) - ledger.processed()),
                     duplicates_within_claims=ledger.duplicates_within_claims(), after_end=len(ledger.after_end),
                     note=note)


def run_virtual_source_rows() -> list[Row]:
    rows = [run_virtual(_virtual(name, inject, True)) for name, inject in VIRTUAL_SCENARIOS]
    # Without checkpoints, a reconnect must resume after the last event its claim delivered,
    # not from the partition's start: this row shows that it does.
    rows.append(run_virtual(_virtual("connection resets (every link, every 2 s, 12 s)", _resets(2.0, 12.0), False)))
    return rows


def run_emulator_source_rows() -> list[Row]:
    """The real-transport rows: the emulator in its own process for the proxy faults; an
    in-process one (restartable, throttleable) for the others."""
    from eventprocessor.emulators.eventhubs.process import start_emulator_process
    from harness.source_faults import (
        Controls,
        LocalEmulator,
        black_hole,
        recovery_bound,
        resets,
        restart,
        run_source_fault,
        throttle,
    )

    bound_text = "idle timeout + C + B + 5 s"

    def row(name: str, run: Any) -> Row:
        return Row(fault=name, transport="emulator", bound=bound_text, bound_seconds=run.bound,
                         recovered=run.recovered_after, produced=run.produced, lost=run.lost,
                         duplicates_within_claims=run.duplicates_within_claims, after_end=run.after_end,
                         note=run.note)

    async def everything() -> list[Row]:
        rows = []
        with start_emulator_process(["--eventhub", "resets", "--eventhub", "hole", "--partitions", "4"]) as hub:
            run = await run_source_fault(hub.connection_string, "resets", resets(every=2.0, seconds=12.0),
                                         rate=200.0)
            rows.append(row("connection resets (every connection, every 2 s, 12 s), no checkpoints", run))
            run = await run_source_fault(hub.connection_string, "hole", black_hole(20.0), rate=200.0,
                                         idle_timeout=30.0, recovery_timeout=recovery_bound(30.0) + 20)
            rows.append(row("black-holed connections (20 s), default idle timeout 30 s", run))
        async with LocalEmulator(["restarted"], partitions=4) as emulator:
            run = await run_source_fault(emulator.connection_string, "restarted", restart(), rate=200.0,
                                         before=6.0, after=8.0, emulator=Controls.of(emulator, down=2.0))
            rows.append(row("emulator restarted on the same port (down 2 s, events kept)", run))
        async with LocalEmulator(["busy"], partitions=4) as emulator:
            run = await run_source_fault(emulator.connection_string, "busy", throttle(10.0, retry_after=4.0),
                                         rate=200.0, emulator=Controls.of(emulator))
            rows.append(row("server busy (10 s, retry-after 4 s)", run))
            rows[-1].note += f"; {emulator.throttled} receiver attaches refused"
        return rows

    return asyncio.run(everything())
