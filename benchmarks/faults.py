"""Faults: what production meets, each against its documented bound.

Every scenario runs real EventProcessors with events flowing, injects one fault, and
measures from what the handlers received: the time from the end of the fault until
every partition is dispatched by exactly one live pump and every event is processed
(recovery), events lost (must be 0), duplicate deliveries, and the longest time two
claims delivered one partition at once (overlap). Each row names the bound the docs'
timing model gives for it.

Two transports:

* **virtual**: the in-memory store behind :class:`~eventprocessor.testing.FaultyStore`
  on virtual time (the same code as in production; a minute of fault costs milliseconds);
* **azurite**: the Blob store on a real Azurite through a loopback TCP fault proxy
  (``eventprocessor/emulators/fault_proxy.py``), in real time with generous bounds (``--azurite``).

Run::

    python -m benchmarks.faults                 # virtual transport, seconds
    python -m benchmarks.faults --azurite       # also on Azurite, a few minutes
    python -m benchmarks.faults --azurite --record
    python -m benchmarks.faults --azurite --emulator --record   # with the source rows on the emulator

Source faults (``benchmarks/faults_source.py``) get their own table in the section:
virtual always, the Event Hubs emulator with ``--emulator``. The Azurite rows are the store
fault scenarios of :mod:`harness.azurite_faults` at full length.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from eventprocessor import EventProcessor, PartitionProcessor
from eventprocessor.testing import Cluster, FaultyStore, run_virtual

from .faults_source import Row, run_emulator_source_rows, run_virtual_source_rows
from .toolkit import program, services
from .toolkit.report import number, table

__all__ = ["main", "Row", "VIRTUAL_SCENARIOS", "run_azurite_rows", "run_virtual_rows"]

INTERVAL = 1.0
EXPIRATION = 12.0
PARTITIONS = 8
PROCESSORS = 2
RATE = 40.0  # events per second, round robin
WORK = 0.05  # virtual seconds a handler spends per batch


def _options(**extra: object) -> dict:
    return dict(load_balancing_interval=INTERVAL, partition_ownership_expiration_interval=EXPIRATION, **extra)


def _recovery_bound(timing) -> float:
    """docs/concepts/timing.md: E + 1 s + (ceil(P/N) + 2)·1.1·I + T."""
    return timing.expiration + 1.0 + (math.ceil(PARTITIONS / PROCESSORS) + 2) * 1.1 * timing.interval \
        + timing.store_timeout


Note = str | Callable[[], str]
"""What a scenario's injection says about it: text, or a function that says it once the
run is over (a count of what the processors noticed, which they do at their next tick)."""

Inject = Callable[[Cluster, list[EventProcessor]], Awaitable[Note]]


async def _run(fault: str, inject: Inject, *,
               bound: str | None = None, bound_of: Callable[[object], float] = _recovery_bound,
               **options: object) -> Row:
    cluster = Cluster(PARTITIONS, seed=5, work=WORK, **_options(**options))
    processors = [cluster.add(f"p{i}", store=cluster.link()) for i in range(PROCESSORS)]
    for p in processors:
        await p.start()
    producer = asyncio.ensure_future(cluster.produce_for(150, rate=RATE))
    await cluster.wait_until(lambda: cluster.settled(processors), timeout=60)
    await asyncio.sleep(30)  # some history (checkpoints) before the fault
    note = await inject(cluster, processors)
    loop = asyncio.get_running_loop()
    fault_over = loop.time()
    limit = bound_of(processors[0].timing)
    recovered = await cluster.wait_until(lambda: cluster.settled(processors), timeout=limit + 60, step=0.05)
    await producer
    await cluster.wait_until(lambda: set(cluster.produced) <= cluster.ledger.processed(), timeout=60)
    for p in processors:
        await p.stop()
    overlaps = cluster.ledger.overlaps()
    return Row(fault=fault, transport="virtual", bound=bound or "E + 1 s + (⌈P/N⌉+2)·1.1·I + T",
               bound_seconds=limit, recovered=None if recovered is None else recovered - fault_over,
               produced=len(cluster.produced), lost=len(set(cluster.produced) - cluster.ledger.processed()),
               duplicates=cluster.ledger.duplicates(), overlap=max((o for *_x, o in overlaps), default=0.0),
               note=note if isinstance(note, str) else note())


async def _store_fault(processors: list[EventProcessor], seconds: float, **fault: object) -> None:
    """Set ``fault`` (FaultyStore's knobs) on each processor's store link for ``seconds``, then clear it."""
    links = [_link(p) for p in processors]
    for link in links:
        for knob, value in fault.items():
            setattr(link, knob, value)
    await asyncio.sleep(seconds)
    for link in links:
        link.clear()


def _link(processor: EventProcessor) -> FaultyStore:
    link = processor.store_calls.inner
    assert isinstance(link, FaultyStore), "the scenarios run on Cluster.link() stores"
    return link


async def slow_store(cluster: Cluster, processors: list[EventProcessor]) -> str:
    await _store_fault(processors, 20, latency=1.5)
    return "every call +1.5 s for 20 s"


async def black_hole(cluster: Cluster, processors: list[EventProcessor]) -> str:
    await _store_fault(processors, 30, hang=True)
    fenced = sum(p.stats.self_fenced for p in processors)
    return f"no answer for 30 s; {fenced} leases self-fenced"


async def outage(cluster: Cluster, processors: list[EventProcessor]) -> str:
    await _store_fault(processors, 30, down=True)
    return "every call fails for 30 s"


async def partitioned(cluster: Cluster, processors: list[EventProcessor]) -> str:
    await _store_fault(processors[:1], 40, hang=True)  # one processor cannot reach the store
    return "one processor's link black-holed for 40 s; the other takes over"


async def lost_answers(cluster: Cluster, processors: list[EventProcessor]) -> str:
    await _store_fault(processors, 20, lost_answer_rate=0.5)
    return "half of all writes applied but unanswered for 20 s"


async def wiped(cluster: Cluster, processors: list[EventProcessor]) -> Note:
    cluster.memory.wipe()
    await asyncio.sleep(1)
    # Counted at the end: each processor reports the loss when its next tick lists the store.
    return lambda: ("store emptied (like Azurite restarted in memory); "
                    f"reported {sum(p.stats.store_data_lost for p in processors)} times")


async def crash(cluster: Cluster, processors: list[EventProcessor]) -> str:
    victim = processors.pop()
    await victim.stop(release=False)
    return "a processor dies without releasing (SIGKILL)"


VIRTUAL_SCENARIOS: list[tuple[str, Inject, dict[str, Any]]] = [
    ("slow store (every call +1.5 s, 20 s)", slow_store, {}),
    ("black-holed store (30 s)", black_hole, {}),
    ("store outage (30 s)", outage, {}),
    ("one processor cut off from the store (40 s)", partitioned, {}),
    ("lost answers (50 % of writes, 20 s)", lost_answers, {}),
    ("store wiped (data loss), default policy", wiped, {}),
    ("store wiped, refuse_checkpoint_rewind=True", wiped, {"refuse_checkpoint_rewind": True}),
    ("crash of one processor", crash, {}),
]


async def hung_handler_stop() -> Row:
    """stop() with a handler that never returns: bounded by shutdown_timeout + T."""

    class Hangs(PartitionProcessor):
        async def process_events(self, events, context):
            if context.partition_id == "0":
                await asyncio.Event().wait()

    cluster = Cluster(PARTITIONS, seed=1)
    p = EventProcessor(cluster.source, cluster.store, Hangs, owner_id="p", shutdown_timeout=5.0, **_options())
    await p.start()
    await cluster.wait_until(lambda: len(p.owned_partitions) == PARTITIONS, timeout=10)
    await cluster.produce(PARTITIONS)
    await asyncio.sleep(1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await p.stop()
    took = loop.time() - started
    bound = p.timing.shutdown_timeout + p.timing.store_timeout
    return Row(fault="stop() with a handler that never returns", transport="virtual",
               bound="shutdown_timeout + T", bound_seconds=bound, recovered=took, produced=PARTITIONS, lost=0,
               duplicates=0, overlap=0.0, note="time for stop() to return; the hung partition is left to expire")


def run_virtual_rows() -> list[Row]:
    rows = []
    for name, inject, options in VIRTUAL_SCENARIOS:
        rows.append(run_virtual(_run(name, inject, **options)))
    rows.append(run_virtual(hung_handler_stop()))
    return rows


def run_azurite_rows() -> list[Row]:
    """The store fault scenarios on a real Azurite, through a loopback TCP fault proxy, in
    real time (``--azurite``)."""
    from harness import azurite_faults as rig

    scenarios = [("slow store (every request +1.5 s, 20 s)", rig.slow_store(20.0)),
                 ("black-holed store (30 s)", rig.black_hole(30.0)),
                 ("connections reset (20 s)", rig.resets(20.0))]

    async def everything() -> list[rig.AzuriteRun]:
        with services.azurite() as azurite:
            runs = [await rig.run_fault_scenario(name, inject, azurite) for name, inject in scenarios]
        for processors in (1, rig.PROCESSORS):
            runs.append(await rig.restarted_empty(refuse=False, processors=processors))
            runs.append(await rig.restarted_empty(refuse=True, processors=processors))
        return runs

    return [Row(fault=run.name, transport="azurite", bound="E + 1 s + (⌈P/N⌉+2)·1.1·I + T + 5 s",
                bound_seconds=run.bound, recovered=run.recovered_after, produced=run.produced, lost=run.lost,
                duplicates=run.duplicates, overlap=run.overlap, note=run.note) for run in asyncio.run(everything())]


def _table(rows: list[Row], measured: dict[str, Callable[[Row], object]]) -> str:
    """The rows' common columns, with the ``measured`` ones (heading: cell) before the note."""
    columns = ["Fault", "Transport", "Bound", "Bound (s)", "Recovered after (s)", "Events", "Lost"]
    return table([*columns, *measured, "Note"],
                 [[r.fault, r.transport, r.bound, f"{r.bound_seconds:.1f}", number(r.recovered, missing="never"),
                   r.produced, r.lost, *(cell(r) for cell in measured.values()), r.note] for r in rows])


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the fault scenarios and print the table; ``--record`` writes it to RESULTS.md."""
    parser = program.parser("faults", __doc__, prog)
    parser.add_argument("--azurite", action="store_true",
                        help="Also run the scenarios on Azurite through the TCP fault proxy (real time).")
    parser.add_argument("--emulator", action="store_true",
                        help="Also run the source scenarios on the Event Hubs emulator through the TCP fault proxy "
                             "(real time).")

    def body(args: argparse.Namespace, run: program.Run) -> int:
        logging.basicConfig(level=logging.CRITICAL)
        rows = run_virtual_rows() + (run_azurite_rows() if args.azurite else [])
        source_rows = run_virtual_source_rows() + (run_emulator_source_rows() if args.emulator else [])
        settings = (f"{PROCESSORS} processors, {PARTITIONS} partitions, {RATE:.0f} events/s, interval {INTERVAL:g} s, "
                    f"expiration {EXPIRATION:g} s (lease, renewal age and store timeout derived: "
                    "docs/concepts/timing.md), "
                    "GREEDY, handlers checkpoint after every batch.")
        markdown = "\n".join([
            # Only the rows in real time (Azurite, the emulator) depend on how busy the machine was.
            "## Faults", "", run.header(flag_busy=args.azurite or args.emulator), "",
            f"Settings: {settings} Recovery is measured from the end of the fault until every partition is "
            "dispatched by exactly one live pump and every event produced so far is processed; events, lost and "
            "duplicates are counted from what the handlers received. Overlap is the longest time two claims were "
            "both inside a batch of one partition (a batch in hand when a takeover lands finishes).", "",
            _table(rows, {"Duplicates": lambda r: r.duplicates, "Overlap (s)": lambda r: f"{r.overlap:.2f}"}), "",
            "All within bound: " + ("yes" if all(r.within for r in rows) else
                                    "NO: " + ", ".join(r.fault for r in rows if not r.within)), "",
            "### Source faults", "",
            "Between the processors and the event source, processors reading from `earliest`: on virtual time "
            "through `eventprocessor.testing.FaultySource` (the settings above; the random schedules of these "
            "faults are `tests/test_source_fault_harness.py`), and with `--emulator` for real: the official "
            "`EventHubProducerClient` sends 200 events/s to the project's Event Hubs emulator, one processor reads "
            "4 partitions with `EventHubSource` through a loopback TCP fault proxy "
            "(`harness/source_faults.py`), "
            "handlers never checkpoint. Lost events, events delivered twice to one claim and batches handed to a "
            "claim that had ended are counted from what the handlers received (events produced: what the hub "
            "acknowledged and holds). Bounds: C = 10 s (a call into a black hole fails at `operation_timeout`), "
            "B = 5 s (the pump's reconnect backoff cap), the AMQP idle timeout (how soon a silent connection is "
            "found dead), plus catch-up.", "",
            _table(source_rows, {"Duplicates within a claim": lambda r: r.duplicates_within_claims,
                                 "Deliveries after a claim ended": lambda r: r.after_end}), "",
            "All within bound, nothing lost, replayed within a claim or handed to an ended claim: " + (
                "yes" if all(r.within for r in source_rows) else
                "NO: " + ", ".join(f"{r.fault} ({r.transport})" for r in source_rows if not r.within)),
        ])
        run.report(markdown)
        return 0 if all(r.within for r in rows) and all(r.within for r in source_rows) else 1

    return program.run("faults", parser, body, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
